"""Linear attention of Vision-RWKV: the bidirectional WKV (Bi-WKV) and the quad-directional Q-Shift.

Dimension legend (used in shapes below):
  b  batch (any number of leading dims)     t  tokens (t = H * W patches, row-major)
  c  channels                               H, W  the patch grid of Q-Shift

Bi-WKV (spec: `papers/specs/vision_weights_envs.md`, section 2, "Background A"; Vision-RWKV eq. for
Bi-WKV and its CUDA kernel `bi_wkv_kernel.cu`). Per batch row and channel, with decay ``w`` and bonus
``u`` (one value per channel, used raw, never exponentiated; Vision-RWKV passes ``spatial_decay / T``
and ``spatial_first / T``),

    y_t = [ sum_{j != t} exp(-(|t - j| - 1) w + k_j) v_j + exp(u + k_t) v_t ]
          / [ sum_{j != t} exp(-(|t - j| - 1) w + k_j)     + exp(u + k_t) ],

i.e. a softmax over all t tokens with logits ``k_j - (|t - j| - 1) w`` for ``j != t`` and ``u + k_t``
for ``j == t``. Immediate neighbours are never decayed (exponent 0); ``w < 0`` up-weights far tokens.

  * `bi_wkv_reference`: the O(t^2 c) softmax form (the definition of correctness; memory [b, t, t, c]).
  * `bi_wkv`: the O(t c) form. Left context ``A_t = sum_{j<t} exp(k_j - (t-1-j) w) v_j`` obeys
    ``A_{t+1} = e^{-w} A_t + e^{k_t} v_t`` (same for the normalizer ``B`` without ``v``), the right
    context ``C, D`` the mirrored recurrence, and ``y_t = (A_t + C_t + e^{u+k_t} v_t) / (B_t + D_t +
    e^{u+k_t})``. Every running sum is kept as ``(m, a, b)`` with ``A = a e^m`` and ``m`` the largest
    logit seen so far (a running max, as in the CUDA kernel), so nothing overflows for any finite
    ``k`` and ``w``: ``b >= 1`` whenever the context is non-empty. ``method="scan"`` runs one
    `lax.scan` advancing both directions per step (t sequential steps, least work: the CPU default);
    ``method="associative"`` runs `lax.associative_scan` over segment summaries ``(length, m, a, b)``
    (log depth, about twice the work: for accelerators).
    Both are differentiable by autodiff; the running max enters as a constant (`lax.stop_gradient`),
    which is exact because the represented sums do not depend on which ``m`` is used.
  * `wkv_update` and `wkv_combine` are the per-token math, written once and shared with the Pallas
    kernel (`pallas_kernels.wkv`).

Deviation from the CUDA kernel (documented, deliberate): the CUDA adds EPS = 1e-6 to its max-shifted
denominator; here the softmax is exact (the denominator is >= 1 after the shift, so the difference is
<= 1e-6 relative).

Q-Shift (`q_shift`, spec "Q-Shift"; official `q_shift` of Vision-RWKV with ``gamma = 1/4``): on the H x W
grid with zero padding, channel group 0 ``[0, g)`` takes the token on the left (``out[h, w] = x[h, w-s]``),
group 1 ``[g, 2g)`` the token on the right, group 2 ``[2g, 3g)`` the token above (``x[h-s, w]``),
group 3 ``[3g, 4g)`` the token below, and channels ``[4g, c)`` are passed through, with
``g = int(c * gamma)``.

Nothing here is inferred: both operators are read from the official code (see the spec's [READ] tags).

References:
  Duan et al., "Vision-RWKV: Efficient and Scalable Visual Perception with RWKV-Like Architectures",
  arXiv:2403.02308, 2024.
  Peng et al., "RWKV: Reinventing RNNs for the Transformer Era", arXiv:2305.13048, 2023.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["bi_wkv_reference", "bi_wkv", "wkv_update", "wkv_combine", "q_shift", "METHODS", "MASK_VALUE"]

METHODS = ("scan", "associative")

# Finite stand-in for -inf as the running max of an empty context: exp(MASK_VALUE - m) is exactly 0 for
# any reasonable m, and MASK_VALUE - w stays finite (no inf - inf = NaN).
MASK_VALUE = -1e30


def _check_wkv_args(w, u, k, v) -> None:
    k_shape, v_shape = jnp.shape(k), jnp.shape(v)
    if len(k_shape) < 2:
        raise ValueError(f"k must have shape [..., t, c] (at least 2 dims); got shape {k_shape}")
    if k_shape != v_shape:
        raise ValueError(f"k and v must have the same shape [..., t, c]; got k {k_shape} and v {v_shape}")
    if k_shape[-2] < 1:
        raise ValueError(f"k must have at least one token (t >= 1); got shape {k_shape}")
    c = k_shape[-1]
    for name, x in (("w", w), ("u", u)):
        if jnp.shape(x) != (c,):
            raise ValueError(f"{name} must have shape [c] = ({c},) (one value per channel of k); got shape "
                             f"{jnp.shape(x)}")
    for name, x in (("w", w), ("u", u), ("k", k), ("v", v)):
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            raise TypeError(f"{name} must be a floating array; got dtype {jnp.result_type(x)}")


def _compute_dtype(*xs):
    dt = jnp.result_type(*xs)
    return jnp.float64 if dt == jnp.float64 else jnp.float32


def bi_wkv_reference(w: jax.Array, u: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Bi-WKV by its O(t^2) softmax form (the oracle; memory [b, t, t, c]).

    Args:
      w: [c] decay (already divided by t as Vision-RWKV does; may be negative).
      u: [c] bonus of the token itself (already divided by t).
      k: [..., t, c] keys.
      v: [..., t, c] values.

    Returns:
      [..., t, c] in the dtype of v: softmax over tokens j of the logits ``k_j - (|t-j|-1) w`` (j != t) and
      ``u + k_t`` (j == t), applied to v. Computed in float32 (float64 for float64 inputs).

    Examples:
      >>> import jax.numpy as jnp
      >>> y = bi_wkv_reference(jnp.zeros(1), jnp.zeros(1), jnp.zeros((3, 1)), jnp.arange(3.0)[:, None])
      >>> [round(float(a), 4) for a in y[:, 0]]   # w = u = 0, equal keys: the plain mean of v everywhere
      [1.0, 1.0, 1.0]
    """
    _check_wkv_args(w, u, k, v)
    dt = _compute_dtype(w, u, k, v)
    w, u, k32, v32 = (jnp.asarray(x, dt) for x in (w, u, k, v))
    t = k.shape[-2]
    idx = jnp.arange(t)
    dist = jnp.abs(idx[:, None] - idx[None, :]).astype(dt)  # [tq, tk]
    logits = k32[..., None, :, :] - (dist - 1.0)[..., None] * w  # [..., tq, tk, c]
    self_logit = (u + k32)[..., :, None, :]  # [..., t, 1, c]
    eye = jnp.eye(t, dtype=bool)[..., None]
    logits = jnp.where(eye, self_logit, logits)
    p = jax.nn.softmax(logits, axis=-2)
    return jnp.einsum("...qkc,...kc->...qc", p, v32).astype(v.dtype)


def wkv_update(state, k_t, v_t, w):
    """One token into a running directional sum (the per-token math shared with the Pallas kernel).

    Args:
      state: (m, a, b), each [..., c]: the context sum ``A = a e^m`` (of ``e^{logit} v``) and normalizer
        ``B = b e^m``, ``m`` the largest logit in the context (MASK_VALUE and a = b = 0 when empty).
      k_t, v_t: [..., c] the token's key and value; w: [..., c] (broadcastable) decay.

    Returns:
      The context one token further: every old logit decays by w, the new token enters with logit k_t,
      i.e. ``A' = e^{-w} A + e^{k_t} v_t``; ``m' = max(m - w, k_t)`` so ``b' >= 1``.
    """
    m, a, b = state
    m_new = jax.lax.stop_gradient(jnp.maximum(m - w, k_t))
    old = jnp.exp(m - w - m_new)
    new = jnp.exp(k_t - m_new)
    return m_new, old * a + new * v_t, old * b + new


def wkv_combine(left, right, u, k_t, v_t, *, return_lse: bool = False):
    """Output of one token from its left and right contexts (each (m, a, b)) and its own bonus term.

    ``y = (A + C + e^{u+k} v) / (B + D + e^{u+k})`` with all three terms rescaled by their common max, so
    the denominator is >= 1 (the largest term contributes exactly its b >= 1, or 1 for the self term).
    With ``return_lse``, also the token's total log-normalizer ``log(B + D + e^{u+k})`` (the Pallas
    kernel's residual for its backward).
    """
    (ml, al, bl), (mr, ar, br) = left, right
    ms = u + k_t
    top = jax.lax.stop_gradient(jnp.maximum(jnp.maximum(ml, mr), ms))
    el, er, es = jnp.exp(ml - top), jnp.exp(mr - top), jnp.exp(ms - top)
    den = el * bl + er * br + es
    y = (el * al + er * ar + es * v_t) / den
    return (y, top + jnp.log(den)) if return_lse else y


def _empty_state(shape, dt):
    return jnp.full(shape, MASK_VALUE, dt), jnp.zeros(shape, dt), jnp.zeros(shape, dt)


def _contexts_scan(w, k, v):
    """Exclusive left and right contexts by one lax.scan over time-major k, v [t, n, c]: step i advances the
    left context over token i and the right context over token t-1-i (half the sequential steps of two scans).
    Returns (left, right), each (m, a, b) [t, n, c]: the context of each token, the token itself excluded."""

    def step(state, kv):
        left, right = state
        k_f, v_f, k_b, v_b = kv
        return (wkv_update(left, k_f, v_f, w), wkv_update(right, k_b, v_b, w)), state

    empty = _empty_state(k.shape[1:], k.dtype)
    _, (left, right) = jax.lax.scan(step, (empty, empty), (k, v, k[::-1], v[::-1]))
    return left, tuple(x[::-1] for x in right)


def _contexts_associative(w, k, v, *, reverse: bool):
    """Exclusive directional contexts by lax.associative_scan over time-major k, v [t, n, c].

    Element of the scan: a segment summary (n, m, a, b): ``n`` tokens long, holding ``A = a e^m`` relative
    to its last token (logit of token j is ``k_j - (last - j) w``). Appending segment 2 after segment 1
    decays segment 1 by ``n_2 w``: m = max(m1 - n2 w, m2) etc. Associative, and exact in log space.
    """

    def combine(s1, s2):  # s1 earlier, s2 later (along the scan direction)
        n1, m1, a1, b1 = s1
        n2, m2, a2, b2 = s2
        m1d = m1 - n2 * w
        m = jax.lax.stop_gradient(jnp.maximum(m1d, m2))
        e1, e2 = jnp.exp(m1d - m), jnp.exp(m2 - m)
        return n1 + n2, m, e1 * a1 + e2 * a2, e1 * b1 + e2 * b2

    ones = jnp.ones_like(k)
    # Inclusive summaries of tokens up to j (logits relative to j); the exclusive context of token t is the
    # inclusive one of t-1 (t+1 when reversed) as it is: the nearest neighbour is never decayed.
    _, m, a, b = jax.lax.associative_scan(combine, (ones, k, v * ones, ones), reverse=reverse, axis=0)
    m0, a0, b0 = _empty_state((1,) + k.shape[1:], k.dtype)
    if reverse:
        return (jnp.concatenate([m[1:], m0]), jnp.concatenate([a[1:], a0]), jnp.concatenate([b[1:], b0]))
    return (jnp.concatenate([m0, m[:-1]]), jnp.concatenate([a0, a[:-1]]), jnp.concatenate([b0, b[:-1]]))


def bi_wkv(w: jax.Array, u: jax.Array, k: jax.Array, v: jax.Array, *, method: str = "scan") -> jax.Array:
    """Bi-WKV in O(t c) time: forward and backward recurrences with running-max stabilization.

    Equal to `bi_wkv_reference` (see the module docstring for the recurrences) and finite for any finite
    inputs, including decays and keys for which the naive ``exp`` form overflows.

    Args:
      w: [c] decay (already divided by t; may be negative).
      u: [c] bonus of the token itself (already divided by t).
      k: [..., t, c] keys.
      v: [..., t, c] values.
      method: "scan" (one sequential lax.scan carrying both directions; the CPU default) or
        "associative" (lax.associative_scan, log depth, about 2x the work: for accelerators).

    Returns:
      [..., t, c] in the dtype of v (computed in float32, float64 for float64 inputs).

    Examples:
      >>> import jax.numpy as jnp
      >>> k = jnp.array([[0.0], [1.0], [2.0]]); v = jnp.array([[1.0], [2.0], [3.0]])
      >>> w, u = jnp.array([0.5]), jnp.array([-0.3])
      >>> bool(jnp.allclose(bi_wkv(w, u, k, v), bi_wkv_reference(w, u, k, v), atol=1e-6))
      True
    """
    _check_wkv_args(w, u, k, v)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    dt = _compute_dtype(w, u, k, v)
    lead, (t, c) = k.shape[:-2], k.shape[-2:]
    w, u = jnp.asarray(w, dt), jnp.asarray(u, dt)
    # time-major [t, n, c] so the scans run over the leading axis
    kt, vt = (jnp.moveaxis(jnp.asarray(x, dt).reshape((-1, t, c)), 1, 0) for x in (k, v))
    if method == "scan":
        left, right = _contexts_scan(w, kt, vt)
    else:
        left = _contexts_associative(w, kt, vt, reverse=False)
        right = _contexts_associative(w, kt, vt, reverse=True)
    y = wkv_combine(left, right, u, kt, vt)
    return jnp.moveaxis(y, 0, 1).reshape(lead + (t, c)).astype(v.dtype)


def q_shift(x: jax.Array, *, height: int, width: int, shift: int = 1, gamma: float = 0.25) -> jax.Array:
    """Quad-directional token shift of Vision-RWKV on an H x W patch grid, zero padded.

    Args:
      x: [..., t, c] tokens in row-major grid order, t = height * width.
      height, width: the patch grid.
      shift: pixels to shift by (>= 1; Vision-RWKV's ``shift_pixel``).
      gamma: fraction of channels per direction, in (0, 1/4]; g = int(c * gamma) channels each.

    Returns:
      [..., t, c]: channels [0, g) hold the left neighbour ``x[h, w-shift]``, [g, 2g) the right neighbour
      ``x[h, w+shift]``, [2g, 3g) the one above ``x[h-shift, w]``, [3g, 4g) the one below
      ``x[h+shift, w]`` (zeros off the grid), channels [4g, c) are x unchanged.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.arange(1.0, 5.0)[:, None] * jnp.ones((1, 4))   # 2 x 2 grid, token i holds i + 1
      >>> q_shift(x, height=2, width=2)[:, :4].tolist()
      [[0.0, 2.0, 0.0, 3.0], [1.0, 0.0, 0.0, 4.0], [0.0, 4.0, 1.0, 0.0], [3.0, 0.0, 2.0, 0.0]]
    """
    shape = jnp.shape(x)
    if len(shape) < 2:
        raise ValueError(f"x must have shape [..., t, c]; got shape {shape}")
    for name, val in (("height", height), ("width", width), ("shift", shift)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int; got {name}={val!r}")
    if shape[-2] != height * width:
        raise ValueError(f"x must have t = height * width = {height} * {width} = {height * width} tokens; got "
                         f"shape {shape}")
    if not 0.0 < gamma <= 0.25:
        raise ValueError(f"gamma must lie in (0, 1/4]; got gamma={gamma}")
    c = shape[-1]
    g = int(c * gamma)
    grid = x.reshape(shape[:-2] + (height, width, c))
    pad = [(0, 0)] * (grid.ndim - 3)
    s = shift

    def shifted(part, dh, dw):  # out[h, w] = part[h - dh, w - dw], zero off the grid
        p = jnp.pad(part, pad + [(s, s), (s, s), (0, 0)])
        return p[..., s - dh:s - dh + height, s - dw:s - dw + width, :]

    out = jnp.concatenate([
        shifted(grid[..., 0:g], 0, s),           # from the left
        shifted(grid[..., g:2 * g], 0, -s),      # from the right
        shifted(grid[..., 2 * g:3 * g], s, 0),   # from above
        shifted(grid[..., 3 * g:4 * g], -s, 0),  # from below
        grid[..., 4 * g:],
    ], axis=-1)
    return out.reshape(shape)
