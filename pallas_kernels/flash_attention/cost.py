"""FLOPs / bytes model of attention prefill."""

from __future__ import annotations

from pallas_kernels._common import Cost


def flash_cost(*, batch: int, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
               itemsize: int, causal: bool) -> Cost:
    """Forward FLOPs 4 * b * h * t * s * d (halved when causal); bytes: q, k, v read once, out written once."""
    pairs = q_len * kv_len * (0.5 if causal else 1.0)
    flops = 4.0 * batch * num_heads * pairs * head_dim
    bytes_ = itemsize * batch * head_dim * (2 * q_len * num_heads + 2 * kv_len * num_kv_heads)
    return Cost(flops=flops, bytes_accessed=bytes_, transcendentals=float(batch * num_heads * pairs))
