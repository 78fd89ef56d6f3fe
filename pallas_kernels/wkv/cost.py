"""FLOPs / bytes model of Bi-WKV (for pl.CostEstimate and benchmark reports)."""

from __future__ import annotations

from pallas_kernels._common import Cost

# Per (token, sequence), counted from `primitives.linear_attention`: `wkv_update` 9 FLOPs + 2 exp, run once
# per direction; `wkv_combine` 16 FLOPs + 3 exp; the kernel's left-context store (max, divide, add) 3 FLOPs +
# 1 log.
_FLOPS_PER_ELEMENT = 2 * 9 + 16 + 3
_TRANSCENDENTALS_PER_ELEMENT = 2 * 2 + 3 + 1


def bi_wkv_cost(*, batch: int, seq_len: int, channels: int, itemsize: int = 4, out_itemsize: int = 4) -> Cost:
    """Linear-time Bi-WKV over `batch` x `channels` sequences of `seq_len` tokens.

    Bytes: k and v read once, the output and the kernel's float32 left-context log-normalizer written once,
    w and u read once per sequence. This is the TPU kernel's HBM traffic (its blocks stay in VMEM between the
    two passes); the Triton shell re-reads k, v and the left context from global memory in its second pass
    (about 2 * itemsize + 8 more bytes per element, mostly L2 hits).
    """
    n = batch * seq_len * channels
    return Cost(flops=float(_FLOPS_PER_ELEMENT * n),
                bytes_accessed=float(n * (2 * itemsize + out_itemsize + 4) + 2 * batch * channels * 4),
                transcendentals=float(_TRANSCENDENTALS_PER_ELEMENT * n))


def bi_wkv_quadratic_cost(*, batch: int, seq_len: int, channels: int, itemsize: int = 4) -> Cost:
    """The O(t^2 c) softmax form (`bi_wkv_reference`): per (query, key, channel) the logit (2), the max (1),
    exp (1 transcendental), the normalizer sum (1) and the weighted sum of v (2); bytes as one pass over k, v
    and the output (what a fused kernel would move; XLA also materializes [t, t, c] intermediates)."""
    pairs = batch * seq_len * seq_len * channels
    return Cost(flops=float(6 * pairs), bytes_accessed=float(3 * batch * seq_len * channels * itemsize),
                transcendentals=float(pairs))
