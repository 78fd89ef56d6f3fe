"""FLOPs / bytes model of attention prefill (forward and the two backward kernels)."""

from __future__ import annotations

from pallas_kernels._common import Cost

PARTS = ("forward", "dq", "dkv", "backward")


def flash_cost(*, batch: int, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
               itemsize: int, causal: bool, part: str = "forward") -> Cost:
    """Cost of one part of attention over `pairs` = t * s (query, key) pairs (halved when causal).

    forward: FLOPs 4 * b * h * pairs * d (two matmuls), one exp per pair; bytes: q, k, v read once, out
      written once.
    dq: 6 * b * h * pairs * d (logits, dP, dS K), one exp per pair; reads q, dO, k, v (and the float32
      per-row lse, delta), writes dq.
    dkv: 8 * b * h * pairs * d (logits, dP, dS^T Q, P^T dO), one exp per pair; reads q, dO, k, v, lse,
      delta, writes dk, dv.
    backward: dq + dkv.
    """
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}; got {part!r}")
    if part == "backward":
        parts = [flash_cost(batch=batch, q_len=q_len, kv_len=kv_len, num_heads=num_heads, num_kv_heads=num_kv_heads,
                            head_dim=head_dim, itemsize=itemsize, causal=causal, part=p) for p in ("dq", "dkv")]
        return Cost(flops=sum(c.flops for c in parts), bytes_accessed=sum(c.bytes_accessed for c in parts),
                    transcendentals=sum(c.transcendentals for c in parts))
    pairs = q_len * kv_len * (0.5 if causal else 1.0)
    matmuls = {"forward": 2, "dq": 3, "dkv": 4}[part]
    flops = 2.0 * matmuls * batch * num_heads * pairs * head_dim
    q_side = batch * q_len * num_heads
    kv_side = batch * kv_len * num_kv_heads
    if part == "forward":
        bytes_ = itemsize * head_dim * (2 * q_side + 2 * kv_side)
    elif part == "dq":
        bytes_ = itemsize * head_dim * (3 * q_side + 2 * kv_side) + 8 * q_side
    else:
        bytes_ = itemsize * head_dim * (2 * q_side + 4 * kv_side) + 8 * q_side
    return Cost(flops=flops, bytes_accessed=bytes_, transcendentals=float(batch * num_heads * pairs))
