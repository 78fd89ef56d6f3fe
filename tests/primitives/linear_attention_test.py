"""Bi-WKV (quadratic and linear-time forms) and Q-Shift against float64 numpy references written from the
definition, gradients, numerical stability where the naive exponential form overflows, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import linear_attention as la

# jitted once per shape: op-by-op dispatch of the scans would dominate the test time
bi_wkv = jax.jit(la.bi_wkv, static_argnames=("method",))
bi_wkv_reference = jax.jit(la.bi_wkv_reference)


def np_bi_wkv(w, u, k, v):
    """Float64 numpy Bi-WKV from the definition, in log space (logsumexp per token): [b, t, c]."""
    w, u, k, v = (np.asarray(x, np.float64) for x in (w, u, k, v))
    _, t, _ = k.shape
    out = np.zeros_like(v)
    for ti in range(t):
        j = np.arange(t)
        logits = k - ((np.abs(ti - j) - 1.0)[None, :, None] * w)  # [b, t, c]
        logits[:, ti] = u + k[:, ti]
        m = logits.max(axis=1, keepdims=True)
        p = np.exp(logits - m)
        out[:, ti] = (p * v).sum(1) / p.sum(1)
    return out


def naive_exp_bi_wkv(w, u, k, v):
    """The textbook float32 formula without any max subtraction (what overflows)."""
    t = k.shape[-2]
    idx = jnp.arange(t)
    dist = jnp.abs(idx[:, None] - idx[None, :]).astype(jnp.float32)
    e = jnp.exp(k[:, None, :, :] - (dist - 1.0)[None, :, :, None] * w)
    e = jnp.where(jnp.eye(t, dtype=bool)[None, :, :, None], jnp.exp(u + k)[:, :, None, :], e)
    return jnp.einsum("bqkc,bkc->bqc", e, v) / jnp.sum(e, axis=2)


def _problem(b, t, c, seed, k_scale=2.0, w_scale=1.0):
    r = np.random.default_rng(seed)
    f = lambda *s, sc=1.0: jnp.asarray(r.standard_normal(s) * sc, jnp.float32)
    return f(c, sc=w_scale), f(c), f(b, t, c, sc=k_scale), f(b, t, c)


def test_quadratic_reference_matches_float64_numpy():
    w, u, k, v = _problem(2, 7, 3, 0)
    np.testing.assert_allclose(bi_wkv_reference(w, u, k, v), np_bi_wkv(w, u, k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", la.METHODS)
@pytest.mark.parametrize("b, t, c", [(2, 17, 6), (1, 1, 4), (3, 2, 5)])
def test_linear_time_equals_quadratic_forward(method, b, t, c):
    w, u, k, v = _problem(b, t, c, t)
    got = bi_wkv(w, u, k, v, method=method)
    np.testing.assert_allclose(got, bi_wkv_reference(w, u, k, v), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, np_bi_wkv(w, u, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", la.METHODS)
def test_linear_time_equals_quadratic_backward(method):
    w, u, k, v = _problem(2, 11, 4, 3)
    probe = jnp.asarray(np.random.default_rng(9).standard_normal((2, 11, 4)), jnp.float32)

    def loss(fn):
        return lambda *a: jnp.sum(probe * fn(*a))

    got = jax.jit(jax.grad(loss(lambda *a: la.bi_wkv(*a, method=method)), argnums=(0, 1, 2, 3)))(w, u, k, v)
    want = jax.jit(jax.grad(loss(la.bi_wkv_reference), argnums=(0, 1, 2, 3)))(w, u, k, v)
    for name, g, h in zip("wukv", got, want):
        np.testing.assert_allclose(g, h, rtol=2e-5, atol=2e-5, err_msg=name)


def test_leading_dims_and_dtype():
    w, u, k, v = _problem(6, 5, 3, 1)
    k4, v4 = k.reshape(2, 3, 5, 3), v.astype(jnp.bfloat16).reshape(2, 3, 5, 3)
    got = bi_wkv(w, u, k4, v4)
    assert got.shape == (2, 3, 5, 3) and got.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.reshape(6, 5, 3).astype(jnp.float32),
                               bi_wkv_reference(w, u, k, v4.reshape(6, 5, 3)).astype(jnp.float32), atol=1e-2)


@pytest.mark.parametrize("method", la.METHODS)
def test_stable_where_the_naive_form_overflows(method):
    # Keys up to ~100 and decays of +-30 per token: exp overflows float32 in the naive form.
    r = np.random.default_rng(4)
    t, c = 9, 4
    w = jnp.asarray([30.0, -30.0, 0.5, -12.0], jnp.float32)
    u = jnp.asarray([5.0, -40.0, 60.0, 0.0], jnp.float32)
    k = jnp.asarray(r.uniform(-100, 100, (2, t, c)), jnp.float32)
    v = jnp.asarray(r.standard_normal((2, t, c)), jnp.float32)
    naive = np.asarray(naive_exp_bi_wkv(w, u, k, v))
    assert not np.all(np.isfinite(naive))
    got = bi_wkv(w, u, k, v, method=method)
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(got, np_bi_wkv(w, u, k, v), rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(la.bi_wkv(*a, method=method))), argnums=(0, 1, 2, 3)))(
        w, u, k, v)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


def test_limits_the_definition_implies():
    w, u, k, v = _problem(2, 8, 3, 5)
    # Bidirectional: reversing the tokens reverses the output.
    np.testing.assert_allclose(bi_wkv(w, u, k[:, ::-1], v[:, ::-1]), bi_wkv(w, u, k, v)[:, ::-1], atol=1e-6)
    # A huge bonus: each token attends to itself only.
    np.testing.assert_allclose(bi_wkv(w, jnp.full_like(u, 1e4), k, v), v, atol=1e-6)
    # A huge decay: only the immediate neighbours (never decayed) and the token itself remain.
    y = bi_wkv(jnp.full_like(w, 1e4), u, k, v)
    kd, vd, ud = (np.asarray(x, np.float64) for x in (k, v, u))
    for ti in range(8):
        js = [j for j in (ti - 1, ti, ti + 1) if 0 <= j < 8]
        logits = np.stack([ud + kd[:, ti] if j == ti else kd[:, j] for j in js])
        p = np.exp(logits - logits.max(0))
        np.testing.assert_allclose(y[:, ti], (p * vd[:, js].transpose(1, 0, 2)).sum(0) / p.sum(0), atol=1e-5)
    # w = u = 0: a position-free softmax(k)-weighted mean of v, the same for every token.
    y0 = bi_wkv(jnp.zeros_like(w), jnp.zeros_like(u), k, v)
    p = np.exp(kd - kd.max(1, keepdims=True))
    np.testing.assert_allclose(y0, np.broadcast_to(((p * np.asarray(v)).sum(1) / p.sum(1))[:, None], y0.shape),
                               atol=1e-5)
    # One token: the output is v.
    np.testing.assert_allclose(bi_wkv(w, u, k[:, :1], v[:, :1]), v[:, :1], atol=1e-6)


def np_q_shift(x, h, w, shift=1, gamma=0.25):
    """Loops over the grid, straight from the official q_shift (zero padding)."""
    x = np.asarray(x)
    b, t, c = x.shape
    g = int(c * gamma)
    grid = x.reshape(b, h, w, c)
    out = np.zeros_like(grid)
    for i in range(h):
        for j in range(w):
            if j - shift >= 0:
                out[:, i, j, 0:g] = grid[:, i, j - shift, 0:g]
            if j + shift < w:
                out[:, i, j, g:2 * g] = grid[:, i, j + shift, g:2 * g]
            if i - shift >= 0:
                out[:, i, j, 2 * g:3 * g] = grid[:, i - shift, j, 2 * g:3 * g]
            if i + shift < h:
                out[:, i, j, 3 * g:4 * g] = grid[:, i + shift, j, 3 * g:4 * g]
            out[:, i, j, 4 * g:] = grid[:, i, j, 4 * g:]
    return out.reshape(b, t, c)


def test_q_shift_by_hand_on_a_2x3_grid():
    # token (i, j) holds 10 i + j + 1 in all 4 channels; one channel per direction.
    x = (10 * np.arange(2)[:, None] + np.arange(3)[None, :] + 1).reshape(6, 1) * np.ones((1, 4))
    got = np.asarray(la.q_shift(jnp.asarray(x, jnp.float32), height=2, width=3))
    want = np.array([  # [from left, from right, from above, from below]
        [0, 2, 0, 11], [1, 3, 0, 12], [2, 0, 0, 13],
        [0, 12, 1, 0], [11, 13, 2, 0], [12, 0, 3, 0]], np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("h, w, c, shift, gamma", [(3, 4, 8, 1, 0.25), (4, 3, 10, 2, 0.25), (3, 4, 16, 1, 0.125)])
def test_q_shift_matches_the_loop_version(h, w, c, shift, gamma):
    x = np.random.default_rng(h * w + c).standard_normal((2, h * w, c)).astype(np.float32)
    got = la.q_shift(jnp.asarray(x), height=h, width=w, shift=shift, gamma=gamma)
    np.testing.assert_array_equal(got, np_q_shift(x, h, w, shift, gamma))
    if gamma < 0.25:  # channels past 4g pass through unchanged
        np.testing.assert_array_equal(np.asarray(got)[..., 4 * int(c * gamma):], x[..., 4 * int(c * gamma):])


@pytest.mark.parametrize("call, err, match", [
    (lambda: la.bi_wkv(jnp.ones(3), jnp.ones(3), jnp.ones((2, 5, 3)), jnp.ones((2, 4, 3))), ValueError,
     r"k and v must have the same shape"),
    (lambda: la.bi_wkv(jnp.ones(4), jnp.ones(3), jnp.ones((2, 5, 3)), jnp.ones((2, 5, 3))), ValueError,
     r"w must have shape \[c\] = \(3,\)"),
    (lambda: la.bi_wkv(jnp.ones(3), jnp.ones((1, 3)), jnp.ones((2, 5, 3)), jnp.ones((2, 5, 3))), ValueError,
     r"u must have shape"),
    (lambda: la.bi_wkv(jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3)), ValueError, r"k must have shape"),
    (lambda: la.bi_wkv(jnp.ones(3), jnp.ones(3), jnp.ones((2, 0, 3)), jnp.ones((2, 0, 3))), ValueError,
     r"at least one token"),
    (lambda: la.bi_wkv(jnp.ones(3), jnp.ones(3), jnp.ones((1, 2, 3), int), jnp.ones((1, 2, 3))), TypeError,
     r"k must be a floating array"),
    (lambda: la.bi_wkv(jnp.ones(3), jnp.ones(3), jnp.ones((1, 2, 3)), jnp.ones((1, 2, 3)), method="fft"),
     ValueError, r"method must be one of"),
    (lambda: la.bi_wkv_reference(jnp.ones(2), jnp.ones(3), jnp.ones((1, 2, 3)), jnp.ones((1, 2, 3))), ValueError,
     r"w must have shape"),
    (lambda: la.q_shift(jnp.ones((1, 6, 4)), height=2, width=2), ValueError, r"t = height \* width = 2 \* 2 = 4"),
    (lambda: la.q_shift(jnp.ones((1, 4, 4)), height=2, width=2, gamma=0.5), ValueError, r"gamma must lie"),
    (lambda: la.q_shift(jnp.ones((1, 4, 4)), height=2, width=2, shift=0), ValueError, r"shift must be a positive"),
    (lambda: la.q_shift(jnp.ones(4), height=2, width=2), ValueError, r"x must have shape"),
])
def test_bad_input_is_named(call, err, match):
    with pytest.raises(err, match=match):
        call()
