"""FLOPs / bytes model of decode attention (used for pl.CostEstimate and benchmark reports)."""

from __future__ import annotations

from pallas_kernels._common import Cost


def decode_cost(*, batch: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                kv_itemsize: int, q_itemsize: int = 4) -> Cost:
    """One query token per sequence attending over `kv_len` cached keys.

    FLOPs: q.k and p.v, 2 * 2 * b * h * s * d. Bytes: K and V once (the kernel
    reads each KV head once for its whole query-head group), plus q and out.
    """
    flops = 4.0 * batch * num_heads * kv_len * head_dim
    kv = 2.0 * batch * kv_len * num_kv_heads * head_dim * kv_itemsize
    qo = 2.0 * batch * num_heads * head_dim * q_itemsize
    return Cost(flops=flops, bytes_accessed=kv + qo, transcendentals=float(batch * num_heads * kv_len))
