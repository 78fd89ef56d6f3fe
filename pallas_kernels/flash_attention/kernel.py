"""Flash-attention forward kernel body (one body for TPU, Triton and the interpreter).

Grid: (batch, query heads, query blocks). Program (b, h, i) holds `block_q`
queries of head h and the whole key/value sequence of its KV head (GQA through
the index map), loops over `block_k`-key tiles with the shared online-softmax
step, skips tiles entirely above the causal diagonal by the loop bound, and
writes the normalized output and the logsumexp (as [block_q, 1], TPU's block
rule for per-row statistics).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import MASK_VALUE, online_softmax_step


def flash_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, block_q: int, block_k: int, scale: float, causal: bool,
                 q_len: int, kv_len: int):
    i = pl.program_id(2)
    d = q_ref.shape[-1]
    q = q_ref[...].astype(jnp.float32) * scale
    # Queries sit at the end of the key sequence: query r has position r + kv_len - q_len.
    q_first = i * block_q + (kv_len - q_len)
    num_tiles = k_ref.shape[0] // block_k
    if causal:
        last_key = q_first + block_q - 1
        num_tiles = jnp.minimum(jax.lax.div(jnp.maximum(last_key, 0) + block_k, block_k), num_tiles)

    def body(t, carry):
        m, l, acc = carry
        offset = pl.multiple_of(t * block_k, block_k)
        k = k_ref[pl.ds(offset, block_k), :]
        v = v_ref[pl.ds(offset, block_k), :]
        key_pos = offset + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        valid = key_pos < kv_len
        if causal:
            q_pos = q_first + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
            valid = jnp.logical_and(valid, key_pos <= q_pos)
        row_pos = offset + jax.lax.broadcasted_iota(jnp.int32, (block_k, d), 0)
        v = jnp.where(row_pos < kv_len, v.astype(jnp.float32), 0.0)
        return online_softmax_step(q, k, v, valid, m, l, acc)

    init = (jnp.full((block_q, 1), MASK_VALUE, jnp.float32), jnp.zeros((block_q, 1), jnp.float32),
            jnp.zeros((block_q, d), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, num_tiles, body, init)
    seen = l > 0
    safe_l = jnp.where(seen, l, 1.0)
    o_ref[...] = jnp.where(seen, acc / safe_l, 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(safe_l), -jnp.inf)
