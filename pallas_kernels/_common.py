"""Per-tile math and the cost record shared by every kernel package.

`_backend` decides *where* a kernel runs (implementation, interpret, compiler params, lowering);
this module holds what the kernel bodies and cost models have in common, written once:

  * `Cost`: FLOPs / bytes / transcendentals of one call (each package's `cost.py` returns one;
    used for `pl.CostEstimate` and for roofline reports).
  * `MASK_VALUE`: the finite start of a running max.
  * `online_softmax_step`: one tile of the online softmax (flash attention, split-K decode, quantized
    decode, sparse decode and verification all call it).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, Union

import jax
import jax.numpy as jnp

__all__ = ["Cost", "MASK_VALUE", "online_softmax_step"]

# Finite stand-in for -inf as the running max: exp(m_old - m_new) stays 1, not NaN,
# while every key seen so far is masked.
MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True)
class Cost:
    flops: float
    bytes_accessed: float
    transcendentals: float

    def projected_seconds(self, *, peak_flops: float, bandwidth: float) -> float:
        """Roofline time: max(FLOPs / peak, bytes / bandwidth)."""
        return max(self.flops / peak_flops, self.bytes_accessed / bandwidth)


Tile = Union[jax.Array, Sequence[jax.Array]]


def online_softmax_step(q: Tile, k: Tile, v: Tile, valid, m, l, acc: Tile, *, tokens_last: bool = False):
    """One tile of the online softmax (the per-tile math every attention kernel shares).

    Args:
      q: [g, d] float32 scaled queries, or a sequence of channel sub-slices [g, d_i] (then `k` is the
        matching sequence [bk, d_i] and the logits are the sum of the sub-slice products; used by
        kernels that dequantize a tile in sub-slices and never concatenate inside the kernel).
      k: [bk, d] keys of the tile (or the sequence of sub-slices matching `q`).
      v: [bk, dv] values of the tile, or a sequence of channel sub-slices [bk, dv_j] (then `acc` is the
        matching sequence [g, dv_j] and each is updated with its own sub-slice).
      valid: [g, bk] bool, which keys each row may see.
      m, l: [g, 1] running max and normalizer; acc: [g, dv] running output (or its sub-slices).
      tokens_last: `k` and `v` (or their sub-slices) come as [d, bk] and [dv, bk], tokens on the last
        axis (a cache read lane-dense by token); the same math with the contractions on that axis.

    Returns:
      Updated (m, l, acc), with `acc` in the form it came in.
    """
    split_k = isinstance(k, (tuple, list))
    qs, ks = (q, k) if split_k else ((q,), (k,))
    s = None
    for qi, ki in zip(qs, ks):
        if tokens_last:
            part = jax.lax.dot_general(qi, ki.astype(jnp.float32), (((1,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32)
        else:
            part = jnp.dot(qi, ki.astype(jnp.float32).T, preferred_element_type=jnp.float32)
        s = part if s is None else s + part
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - m_new)
    alpha = jnp.exp(m - m_new)
    l_new = alpha * l + jnp.sum(p, axis=-1, keepdims=True)

    def update(a, vj):
        if tokens_last:
            return alpha * a + jax.lax.dot_general(p, vj.astype(jnp.float32), (((1,), (1,)), ((), ())),
                                                   preferred_element_type=jnp.float32)
        return alpha * a + jnp.dot(p, vj.astype(jnp.float32), preferred_element_type=jnp.float32)

    if isinstance(acc, (tuple, list)):
        return m_new, l_new, tuple(update(a, vj) for a, vj in zip(acc, v))
    return m_new, l_new, update(acc, v)
