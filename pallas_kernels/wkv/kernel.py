"""Bi-WKV kernel body (shared by Mosaic TPU, Triton and the interpreter).

Layout (built by `api.py`): every (batch row, channel) pair is one independent sequence; sequences are laid
out as [rows, lanes] tiles, time-major: k, v blocks are [t, rows, lanes], w and u blocks [rows, lanes]. One
program (grid axis: tiles of sequences) scans its tile over all tokens twice, in chunks of `block_t` tokens
(a `fori_loop` over chunks whose body is unrolled over the chunk's tokens; the ragged tail is a static loop):

  1. forward pass: the running left context (m, a, b) (`primitives.linear_attention.wkv_update`); before
     token t enters, the kernel stores the left context of t as a normalized mean ``a / b`` (into the output
     block) and a log-normalizer ``m + log b`` (into the `lse` block), MASK_VALUE when empty;
  2. backward pass: the running right context; each token's output is `wkv_combine` of its stored left
     context, the right context and its own bonus term, written over the stored mean, and its total
     log-normalizer Z over the stored left one (a residual of the backward kernel).

The backward kernel (`bi_wkv_backward_kernel`, the custom VJP's backward) has the same shape: with the
cotangent g, the output y and each token's total log-normalizer Z (which the forward writes over its
left-context lse in its second pass), the weight of key j in token t's output is p_tj = e^{l_tj - Z_t}, and

  dv_j = sum_t p_tj g_t,   dk_j = v_j dv_j - sum_t p_tj g_t y_t,   du = sum_j p_jj g_j (v_j - y_j),
  dw = -sum_j sum_{t != j} (|t - j| - 1) p_tj g_t (v_j - y_t).

Over t != j these are decayed directional sums of the query-side terms e^{-Z_t} g_t and e^{-Z_t} g_t y_t
(logit -Z_t in place of k_t), and for dw the same sums weighted by the distance, which advance as
D' = e^{-w} (D + S). A forward pass over the tokens writes each key's left-context parts of dv and of the
y-weighted sum into dv and dk; the backward pass adds the right context and the token's own term and
forms dk; dw and du accumulate in registers and are written once per program.

Per token this is [rows, lanes] element-wise math only (no matmul, no cross-lane reduction), loaded and
stored by a dynamic index on the leading (time) axis, which both backends support. The tokens past
`seq_len` (padding to a power of two for Triton) are never read. Triton has no scratch memory, so the left
context goes through the output blocks (each thread rereads only what it wrote: same shape, same layout).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primitives.linear_attention import MASK_VALUE, wkv_combine, wkv_update


def _time_loops(seq_len: int, block_t: int, forward, forward_state, backward, backward_state):
    """Runs `forward` over tokens 0..seq_len-1 from `forward_state`, then `backward` over seq_len-1..0 from
    `backward_state`, in `fori_loop` chunks of `block_t` unrolled tokens (the ragged tail statically).
    Returns the two final states."""
    n_chunks = seq_len // block_t

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

    state = jax.lax.fori_loop(0, n_chunks, forward_chunk, forward_state)
    for t in range(n_chunks * block_t, seq_len):
        state = forward(t, state)
    first = state
    state = backward_state
    for t in reversed(range(n_chunks * block_t, seq_len)):
        state = backward(t, state)
    return first, jax.lax.fori_loop(0, n_chunks, backward_chunk, state)


def bi_wkv_kernel(w_ref, u_ref, k_ref, v_ref, o_ref, lse_ref, *, seq_len: int, block_t: int):
    """w_ref, u_ref [R, L]; k_ref, v_ref [tp, R, L] -> o_ref [tp, R, L] float32 (Bi-WKV), lse_ref [tp, R, L]
    float32 (each token's total log-normalizer Z, a residual of the backward; the first pass keeps its left
    context's there)."""
    w = w_ref[...].astype(jnp.float32)
    u = u_ref[...].astype(jnp.float32)
    ones = jnp.ones(w.shape, jnp.float32)
    empty = (jnp.full(w.shape, MASK_VALUE, jnp.float32), jnp.zeros(w.shape, jnp.float32),
             jnp.zeros(w.shape, jnp.float32))

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
        o_ref[t], lse_ref[t] = wkv_combine((lse_ref[t], o_ref[t], ones), state, u, k_t, v_t, return_lse=True)
        return wkv_update(state, k_t, v_t, w)

    _time_loops(seq_len, block_t, forward, empty, backward, empty)


def bi_wkv_backward_kernel(w_ref, u_ref, k_ref, v_ref, g_ref, y_ref, z_ref, dk_ref, dv_ref, dw_ref, du_ref, *,
                           seq_len: int, block_t: int):
    """w_ref, u_ref [R, L]; k_ref, v_ref, g_ref (the output's cotangent) [tp, R, L]; y_ref, z_ref [tp, R, L]
    float32 (the forward's output and log-normalizers) -> dk_ref, dv_ref [tp, R, L] float32, dw_ref, du_ref
    [R, L] float32 (summed over the sequence's tokens). See the module docstring for the sums.

    The running context state is (m, s1, s2, d1, d2): S1 = s1 e^m = sum of e^{-(dist) w - Z_t} g_t over the
    context, S2 the same of g_t y_t, D1, D2 those sums weighted by the distance, m their largest exponent
    (MASK_VALUE when empty), so that e^{k_j + m} <= 1 (it is the largest weight p_tj of the context).
    """
    w = w_ref[...].astype(jnp.float32)
    u = u_ref[...].astype(jnp.float32)
    zero = jnp.zeros(w.shape, jnp.float32)
    empty = (jnp.full(w.shape, MASK_VALUE, jnp.float32), zero, zero, zero, zero)

    def load(t):
        g_t = g_ref[t].astype(jnp.float32)
        return k_ref[t].astype(jnp.float32), v_ref[t].astype(jnp.float32), g_t, y_ref[t], z_ref[t]

    def advance(ctx, z_t, g_t, gy_t):  # the context one token further: decay by w, token t enters at -Z_t
        m, s1, s2, d1, d2 = ctx
        m_new = jnp.maximum(m - w, -z_t)
        old = jnp.exp(m - w - m_new)
        new = jnp.exp(-z_t - m_new)
        return m_new, old * s1 + new * g_t, old * s2 + new * gy_t, old * (d1 + s1), old * (d2 + s2)

    def context_terms(ctx, k_t, v_t):  # this context's parts of dv_t, of sum_t p g y, and of dw
        m, s1, s2, d1, d2 = ctx
        e = jnp.exp(k_t + m)
        return e * s1, e * s2, -e * (v_t * d1 - d2)

    def forward(t, carry):
        ctx, dw = carry
        k_t, v_t, g_t, y_t, z_t = load(t)
        dv_l, q_l, dw_l = context_terms(ctx, k_t, v_t)
        dv_ref[t] = dv_l
        dk_ref[t] = q_l
        return advance(ctx, z_t, g_t, g_t * y_t), dw + dw_l

    def backward(t, carry):
        ctx, dw, du = carry
        k_t, v_t, g_t, y_t, z_t = load(t)
        dv_r, q_r, dw_r = context_terms(ctx, k_t, v_t)
        p_self_g = jnp.exp(u + k_t - z_t) * g_t
        dv = dv_ref[t] + dv_r + p_self_g
        dv_ref[t] = dv
        dk_ref[t] = v_t * dv - (dk_ref[t] + q_r + p_self_g * y_t)
        return advance(ctx, z_t, g_t, g_t * y_t), dw + dw_r, du + p_self_g * (v_t - y_t)

    (_, dw_left), (_, dw_right, du) = _time_loops(seq_len, block_t, forward, (empty, zero), backward,
                                                  (empty, zero, zero))
    dw_ref[...] = dw_left + dw_right
    du_ref[...] = du
