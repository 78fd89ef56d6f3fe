"""Bi-WKV kernel body (shared by Mosaic TPU, Triton and the interpreter).

Layout (built by `api.py`): every (batch row, channel) pair is one independent sequence; sequences are laid
out as [rows, lanes] tiles, time-major: k, v blocks are [t, rows, lanes], w and u blocks [rows, lanes]. One
program (grid axis: tiles of sequences) scans its tile over all tokens twice, in chunks of `block_t` tokens
(a `fori_loop` over chunks whose body is unrolled over the chunk's tokens; the ragged tail is a static loop):

  1. forward pass: the running left context (m, a, b) (`primitives.linear_attention.wkv_update`); before
     token t enters, the kernel stores the left context of t as a normalized mean ``a / b`` (into the output
     block) and a log-normalizer ``m + log b`` (into the `lse` block), MASK_VALUE when empty;
  2. backward pass: the running right context; each token's output is `wkv_combine` of its stored left
     context, the right context and its own bonus term, written over the stored mean.

Per token this is [rows, lanes] element-wise math only (no matmul, no cross-lane reduction), loaded and
stored by a dynamic index on the leading (time) axis, which both backends support. The tokens past
`seq_len` (padding to a power of two for Triton) are never read. Triton has no scratch memory, so the left
context goes through the output blocks (each thread rereads only what it wrote: same shape, same layout).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primitives.linear_attention import MASK_VALUE, wkv_combine, wkv_update


def bi_wkv_kernel(w_ref, u_ref, k_ref, v_ref, o_ref, lse_ref, *, seq_len: int, block_t: int):
    """w_ref, u_ref [R, L]; k_ref, v_ref [tp, R, L] -> o_ref [tp, R, L] float32 (Bi-WKV), lse_ref [tp, R, L]
    float32 (log-normalizer of each token's left context; an intermediate)."""
    w = w_ref[...].astype(jnp.float32)
    u = u_ref[...].astype(jnp.float32)
    ones = jnp.ones(w.shape, jnp.float32)
    empty = (jnp.full(w.shape, MASK_VALUE, jnp.float32), jnp.zeros(w.shape, jnp.float32),
             jnp.zeros(w.shape, jnp.float32))
    n_chunks, tail = divmod(seq_len, block_t)

    def load(t):
        return k_ref[t].astype(jnp.float32), v_ref[t].astype(jnp.float32)

    def forward(t, state):
        m, a, b = state
        b1 = jnp.maximum(b, 1.0)  # b >= 1 whenever the context is non-empty; b = 0 (and a = 0) when empty
        o_ref[t] = a / b1
        lse_ref[t] = m + jnp.log(b1)
        k_t, v_t = load(t)
        return wkv_update(state, k_t, v_t, w)

    def backward(t, state):
        k_t, v_t = load(t)
        o_ref[t] = wkv_combine((lse_ref[t], o_ref[t], ones), state, u, k_t, v_t)
        return wkv_update(state, k_t, v_t, w)

    def forward_chunk(c, state):
        base = c * block_t
        for i in range(block_t):
            state = forward(base + i, state)
        return state

    def backward_chunk(c, state):
        base = (n_chunks - 1 - c) * block_t
        for i in reversed(range(block_t)):
            state = backward(base + i, state)
        return state

    state = jax.lax.fori_loop(0, n_chunks, forward_chunk, empty)
    for t in range(n_chunks * block_t, seq_len):
        state = forward(t, state)
    state = empty
    for t in reversed(range(n_chunks * block_t, seq_len)):
        state = backward(t, state)
    jax.lax.fori_loop(0, n_chunks, backward_chunk, state)
