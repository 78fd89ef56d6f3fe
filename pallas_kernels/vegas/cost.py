"""FLOPs / bytes model of the Vegas kernels (for pl.CostEstimate and benchmark reports).

Dimension legend: `b` batch, `t` verification tokens, `h` query heads, `kh` KV heads, `S` cache
capacity, `d` head dim, `R` kept score rows, `K` index-list length, `W` = max_recent.
"""

from __future__ import annotations

from pallas_kernels._common import Cost

__all__ = ["verify_cost", "sparse_decode_cost"]


def verify_cost(*, batch: int, q_len: int, num_heads: int, num_kv_heads: int, kv_len: int, head_dim: int,
                score_rows: int, kv_itemsize: int, q_itemsize: int = 4) -> Cost:
    """Verification attention of `q_len` tokens over `kv_len` cache keys, with `score_rows` raw score rows.

    FLOPs: q.k and p.v for every query row, 2 * 2 * (b h t) S d, plus the score-row matmul
    2 * (b h R) S d (the kernel recomputes those rows' logits unscaled, without the softmax). The
    count is dense over S (no causal saving: the queries sit at the end of the cache).
    Bytes: K and V once (each KV head is read once for all its query heads and tokens), the queries
    and the score-row queries, the output, the float32 lse [b, h, t] and the float32 score rows
    [b, h, R, S].
    """
    b, t, h, kh, s, d, r = batch, q_len, num_heads, num_kv_heads, kv_len, head_dim, score_rows
    flops = 4.0 * b * h * t * s * d + 2.0 * b * h * r * s * d
    kv = 2.0 * b * s * kh * d * kv_itemsize
    q_out = (2.0 * t + r) * b * h * d * q_itemsize
    stats = 4.0 * b * h * t + 4.0 * b * h * r * s
    return Cost(flops=flops, bytes_accessed=kv + q_out + stats, transcendentals=float(b * h * t * s))


def sparse_decode_cost(*, batch: int, num_heads: int, num_kv_heads: int, head_dim: int, num_indices: int,
                       max_recent: int, kv_itemsize: int, q_itemsize: int = 4) -> Cost:
    """One query per sequence over K listed keys plus a W-key recent window (K + W attended rows).

    FLOPs: 2 * 2 * b h (K + W) d. Bytes: the K + W gathered K and V rows of every KV head (never
    the S-row cache), the int32 indices and their validity, q and the output. This is also what the
    Pallas kernel itself reads from the compact buffer; the XLA gather that builds the buffer first
    reads those rows from the cache and writes them once more (see `api.py`).
    """
    b, h, kh, d, n = batch, num_heads, num_kv_heads, head_dim, num_indices + max_recent
    flops = 4.0 * b * h * n * d
    kv = 2.0 * b * n * kh * d * kv_itemsize
    meta = 5.0 * b * num_indices  # int32 index + bool validity per listed key
    qo = 2.0 * b * h * d * q_itemsize
    return Cost(flops=flops, bytes_accessed=kv + meta + qo, transcendentals=float(b * h * n))
