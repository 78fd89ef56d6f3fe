"""Split-K flash-decoding kernel body (shared by TPU, Triton and the interpreter).

Grid: (batch, num_splits). Program (i, j) reads the query heads of sequence i
(all key/value heads, each with its padded group of query heads) and the
j-th contiguous split of its KV cache, loops over `block_k`-key tiles with an
online softmax in float32, and writes the *unnormalized* partial output plus
the running max m and sum l per query row. Tiles past the sequence length are
skipped by the loop bound; the last partial tile is masked with `jnp.where`
(never a multiply: padding may hold NaN in the interpreter).

Layouts inside the kernel:
  q_ref   [k, gp, d]        query heads grouped by KV head (gp = padded group)
  k_ref   [split, k, d]     this split of the cache, all KV heads ([k, split, d] for a
                            head-major "bksd" cache; v_ref likewise)
  o_ref   [k, gp, d]  f32   unnormalized partial output
  m_ref, l_ref [k, gp, 1]   per-row statistics ([..., 1] keeps TPU block rules)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Finite stand-in for -inf as the running max: exp(m_old - m_new) stays 1, not NaN,
# while every key seen so far is masked.
MASK_VALUE = -1e30


def online_softmax_step(q, k, v, valid, m, l, acc):
    """One tile of the online softmax (the per-tile math every attention kernel shares).

    Args:
      q: [g, d] float32 scaled queries.
      k, v: [bk, d] keys and values of the tile.
      valid: [g, bk] bool, which keys each row may see.
      m, l: [g, 1] running max and normalizer; acc: [g, d] running output.

    Returns:
      Updated (m, l, acc).
    """
    s = jnp.dot(q, k.astype(jnp.float32).T, preferred_element_type=jnp.float32)
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - m_new)
    alpha = jnp.exp(m - m_new)
    l_new = alpha * l + jnp.sum(p, axis=-1, keepdims=True)
    acc_new = alpha * acc + jnp.dot(p, v.astype(jnp.float32), preferred_element_type=jnp.float32)
    return m_new, l_new, acc_new


def decode_kernel(len_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, block_k: int, split_len: int,
                  scale: float, kv_layout: str = "bskd"):
    i = pl.program_id(0)
    j = pl.program_id(1)
    length = len_ref[i]
    start = j * split_len
    num_tiles = split_len // block_k
    # lax.div (truncating) on a non-negative value: jnp's floor division lowers
    # through sign(), which Mosaic TPU cannot lower without a device.
    remaining = jnp.maximum(length - start, 0)
    live_tiles = jnp.minimum(jax.lax.div(remaining + block_k - 1, block_k), num_tiles)
    num_kv_heads, gp, d = q_ref.shape

    for h in range(num_kv_heads):  # static: each KV head with its query-head group
        q = q_ref[h].astype(jnp.float32) * scale

        def body(t, carry, h=h, q=q):
            m, l, acc = carry
            offset = pl.multiple_of(t * block_k, block_k)
            if kv_layout == "bskd":
                k = k_ref[pl.ds(offset, block_k), h, :]
                v = v_ref[pl.ds(offset, block_k), h, :]
            else:
                k = k_ref[h, pl.ds(offset, block_k), :]
                v = v_ref[h, pl.ds(offset, block_k), :]
            key_pos = start + offset + jax.lax.broadcasted_iota(jnp.int32, (gp, block_k), 1)
            row_pos = start + offset + jax.lax.broadcasted_iota(jnp.int32, (block_k, d), 0)
            v = jnp.where(row_pos < length, v.astype(jnp.float32), 0.0)
            return online_softmax_step(q, k, v, key_pos < length, m, l, acc)

        init = (jnp.full((gp, 1), MASK_VALUE, jnp.float32), jnp.zeros((gp, 1), jnp.float32),
                jnp.zeros((gp, d), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, live_tiles, body, init)
        o_ref[h] = acc
        m_ref[h] = m
        l_ref[h] = l
