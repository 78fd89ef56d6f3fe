"""FLOPs / bytes model of the QVG kernels (for pl.CostEstimate and benchmark reports)."""

from __future__ import annotations

from pallas_kernels._common import Cost


def assign_cost(*, groups: int, points: int, centroids: int, dim: int, itemsize: int = 4) -> Cost:
    """Distances by one matmul (2 s k d per group) plus the argmin; reads points and centroids once."""
    flops = groups * (2.0 * points * centroids * dim + 4.0 * points * centroids)
    return Cost(flops=flops, bytes_accessed=groups * ((points + centroids) * dim * itemsize + 4 * points),
                transcendentals=0.0)


def qvg_attention_cost(*, batch: int, query_rows: int, kv_heads: int, span: int, dim: int, stored_bytes: float,
                       k_stages: int, v_stages: int, centroids: int, q_itemsize: int = 4, splits: int = 1) -> Cost:
    """Attention of `query_rows` rows per KV head over a QVG span of `span` tokens cut into `splits` parts.

    FLOPs per (batch, KV head): q.k and p.v (4 R s d), the one-hot centroid matmuls for keys and
    values (2 R s k per stage each), q C^T and (p onehot) C (2 R k d per stage each, once per split)
    and residual dequantization (~8 per cached element of K and V). Bytes: the stored span
    (`stored_bytes`: labels, centroids, codes, scales of K and V) read once per KV head, plus q and the
    output; with several splits also each split's float32 partial (o, m, l), written and read back by
    the merge.
    """
    r, s, k, d = query_rows, span, centroids, dim
    per_head = 4.0 * r * s * d + (k_stages + v_stages) * (2.0 * r * s * k + 2.0 * splits * r * k * d) + 8.0 * s * d
    partials = 0.0 if splits == 1 else 2.0 * splits * r * (d + 2) * 4
    return Cost(flops=batch * kv_heads * per_head,
                bytes_accessed=stored_bytes + batch * kv_heads * (2.0 * r * d * q_itemsize + partials),
                transcendentals=float(batch * kv_heads * r * s))
