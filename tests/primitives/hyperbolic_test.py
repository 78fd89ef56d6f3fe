"""Lorentz-model primitives against float64 numpy references and the model's identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import hyperbolic as hyp

C = 0.1


def _np_expmap0(u, c):
    """float64 numpy exp_o (spec eq. 13-14)."""
    n = np.linalg.norm(u, axis=-1, keepdims=True)
    sc = np.sqrt(c)
    return np.concatenate([np.cosh(sc * n) / sc, np.sinh(sc * n) / (sc * n) * u], -1)


def _np_dist(x, y, c):
    inner = -x[..., 0] * y[..., 0] + np.sum(x[..., 1:] * y[..., 1:], -1)
    return np.arccosh(np.maximum(-c * inner, 1.0)) / np.sqrt(c)


def _points(seed, n, d, c, scale=1.0, dtype=np.float32):
    u = np.random.default_rng(seed).normal(size=(n, d)) * scale
    return u, hyp.expmap0(jnp.asarray(u, dtype), curvature=c)


@pytest.mark.parametrize("c", [0.1, 1.0, 2.5])
def test_expmap0_on_hyperboloid_and_matches_numpy(c):
    u, p = _points(0, 64, 5, c, scale=1.5)
    inner = np.asarray(hyp.minkowski_inner(p, p), np.float64)
    # float32 cancellation: the error of <p, p>_L scales with p_0^2 + |p_s|^2 times the epsilon
    scale = np.sum(np.asarray(p, np.float64) ** 2, -1)
    assert np.all(np.abs(inner + 1.0 / c) <= 8 * np.finfo(np.float32).eps * scale), np.abs(inner + 1 / c) / scale
    assert bool(jnp.all(p[:, 0] > 0))
    np.testing.assert_allclose(p, _np_expmap0(u, c), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(hyp.expmap0(jnp.zeros(5), curvature=c), hyp.origin(5, curvature=c), atol=0)


@pytest.mark.parametrize("c", [0.1, 1.0])
def test_distance_metric_axioms(c):
    _, x = _points(1, 200, 4, c)
    _, y = _points(2, 200, 4, c)
    _, z = _points(3, 200, 4, c)
    dxy, dyx = hyp.distance(x, y, curvature=c), hyp.distance(y, x, curvature=c)
    np.testing.assert_allclose(dxy, dyx, rtol=1e-6)
    np.testing.assert_array_equal(hyp.distance(x, x, curvature=c), 0.0)
    dxz, dzy = hyp.distance(x, z, curvature=c), hyp.distance(z, y, curvature=c)
    assert bool(jnp.all(dxy <= dxz + dzy + 1e-5))
    assert bool(jnp.all(dxy > 0))
    xn, yn = np.asarray(x, np.float64), np.asarray(y, np.float64)
    np.testing.assert_allclose(dxy, _np_dist(xn, yn, c), rtol=1e-4, atol=1e-4)


def test_distance_from_origin_is_tangent_norm_and_euclidean_limit():
    u, p = _points(4, 50, 3, C, scale=2.0)
    o = hyp.origin(3, curvature=C)
    np.testing.assert_allclose(hyp.distance(o, p, curvature=C), np.linalg.norm(u, axis=-1), rtol=1e-4)
    # small norms and small curvature: d(exp u, exp v) ~ |u - v|
    u, v = (np.random.default_rng(s).normal(size=(50, 3)) * 1e-2 for s in (5, 6))
    c = 1e-3
    d = hyp.distance(hyp.expmap0(jnp.asarray(u), curvature=c), hyp.expmap0(jnp.asarray(v), curvature=c), curvature=c)
    np.testing.assert_allclose(d, np.linalg.norm(u - v, axis=-1), rtol=1e-3)


def test_exp_log_inverse_float64():
    with jax.enable_x64(True):
        rng = np.random.default_rng(7)
        for c in (0.1, 1.0):
            u = rng.normal(size=(40, 6)) * np.array([[1e-9], [1e-3], [0.5], [3.0]] * 10)
            p = hyp.expmap0(jnp.asarray(u), curvature=c)
            assert p.dtype == jnp.float64
            np.testing.assert_allclose(hyp.logmap0(p, curvature=c), u, rtol=1e-10, atol=1e-14)
            np.testing.assert_allclose(p, _np_expmap0(u, c), rtol=1e-12)
            # at a point: log_x(exp_x(v)) = v for tangent v; exp_x(log_x(y)) = y
            x = hyp.expmap0(jnp.asarray(rng.normal(size=(40, 6)) * 0.5), curvature=c)
            v = hyp.project_tangent(x, jnp.asarray(rng.normal(size=(40, 7)) * 0.3), curvature=c)
            np.testing.assert_allclose(hyp.minkowski_inner(x, v), 0.0, atol=1e-10)
            y = hyp.expmap(x, v, curvature=c)
            np.testing.assert_allclose(hyp.minkowski_inner(y, y), -1.0 / c, rtol=1e-10)
            np.testing.assert_allclose(hyp.logmap(x, y, curvature=c), v, rtol=1e-8, atol=1e-10)
            # |log_x(y)|_L = d(x, y)
            lv = hyp.logmap(x, y, curvature=c)
            np.testing.assert_allclose(np.sqrt(hyp.minkowski_inner(lv, lv)), hyp.distance(x, y, curvature=c),
                                       rtol=1e-8)
            # exp at the origin equals expmap0 of the spatial part
            o = jnp.broadcast_to(hyp.origin(6, curvature=c, dtype=jnp.float64), (40, 7))
            w = jnp.concatenate([jnp.zeros((40, 1)), jnp.asarray(u)], -1)
            np.testing.assert_allclose(hyp.expmap(o, w, curvature=c), p, rtol=1e-12, atol=1e-15)
            # zero tangent vector: exp_x(0) = x, log_x(x) = 0
            np.testing.assert_allclose(hyp.expmap(x, jnp.zeros_like(x), curvature=c), x, rtol=1e-14)
            np.testing.assert_allclose(hyp.logmap(x, x, curvature=c), 0.0, atol=1e-7)


def test_project_and_parallel_transport():
    with jax.enable_x64(True):
        rng = np.random.default_rng(8)
        c = 0.7
        raw = jnp.asarray(rng.normal(size=(30, 5)))
        p = hyp.project(raw, curvature=c)
        np.testing.assert_allclose(hyp.minkowski_inner(p, p), -1 / c, rtol=1e-12)
        np.testing.assert_array_equal(p[:, 1:], raw[:, 1:])
        x = hyp.expmap0(jnp.asarray(rng.normal(size=(30, 4))), curvature=c)
        y = hyp.expmap0(jnp.asarray(rng.normal(size=(30, 4))), curvature=c)
        v = hyp.project_tangent(x, jnp.asarray(rng.normal(size=(30, 5))), curvature=c)
        w = hyp.project_tangent(x, jnp.asarray(rng.normal(size=(30, 5))), curvature=c)
        pv, pw = (hyp.parallel_transport(x, y, a, curvature=c) for a in (v, w))
        np.testing.assert_allclose(hyp.minkowski_inner(y, pv), 0.0, atol=1e-10)
        np.testing.assert_allclose(hyp.minkowski_inner(pv, pw), hyp.minkowski_inner(v, w), rtol=1e-9, atol=1e-10)
        # transporting log_x(y) gives -log_y(x)
        np.testing.assert_allclose(hyp.parallel_transport(x, y, hyp.logmap(x, y, curvature=c), curvature=c),
                                   -hyp.logmap(y, x, curvature=c), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gradients_finite_near_origin_and_diagonal(dtype):
    with jax.enable_x64(dtype == jnp.float64):
        def loss(u, v):
            return hyp.squared_distance(hyp.expmap0(u, curvature=C), hyp.expmap0(v, curvature=C), curvature=C)

        for scale in (0.0, 1e-8, 1e-4, 1e-2):
            u = jnp.full((3,), scale, dtype)
            g = jax.grad(loss, argnums=(0, 1))(u, u)
            assert all(bool(jnp.all(jnp.isfinite(t))) for t in g), (scale, g)
            gd = jax.grad(lambda a, b: hyp.distance(hyp.expmap0(a, curvature=C), hyp.expmap0(b, curvature=C),
                                                    curvature=C))(u, u)
            assert bool(jnp.all(jnp.isfinite(gd)))
            np.testing.assert_allclose(jax.grad(lambda a: hyp.logmap0(hyp.expmap0(a, curvature=C),
                                                                      curvature=C).sum())(u), 1.0, rtol=1e-4)
        # d^2 near the diagonal: gradient matches the Euclidean-limit 2(u - v) for small tangent vectors
        u = jnp.asarray([1e-3, -2e-3, 5e-4], dtype)
        v = jnp.asarray([2e-3, -1e-3, 0.0], dtype)
        np.testing.assert_allclose(jax.grad(loss)(u, v), 2 * (u - v), rtol=1e-2, atol=1e-6)


def test_squared_distance_series_matches_arccosh():
    with jax.enable_x64(True):
        for z in (1e-6, 5e-5, 9.9e-5, 1.01e-4, 1e-2):
            a = 1.0 + z
            # two points at distance arccosh(a)/sqrt(c) from each other (along one axis)
            t = np.arccosh(a) / np.sqrt(C)
            p = hyp.expmap0(jnp.asarray([[0.0, 0.0], [t, 0.0]]), curvature=C)
            np.testing.assert_allclose(hyp.squared_distance(p[0], p[1], curvature=C), t ** 2, rtol=1e-8)


def test_anchor_loss_matches_reference_and_mask():
    rng = np.random.default_rng(9)
    s, t = rng.normal(size=(2, 2, 3, 8)), rng.normal(size=(2, 2, 3, 8))

    def ref(h):
        h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
        return _np_expmap0(h, C)

    d2 = _np_dist(ref(s), ref(t), C) ** 2
    np.testing.assert_allclose(hyp.anchor_loss(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32),
                                               curvature=C), d2.mean(), rtol=1e-4)
    mask = np.array([[1, 0, 1], [0, 0, 1]], np.float32)
    want = np.mean([(d2[l] * mask).sum() / mask.sum() for l in range(2)])
    np.testing.assert_allclose(hyp.anchor_loss(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32),
                                               curvature=C, mask=mask), want, rtol=1e-4)
    assert float(hyp.anchor_loss(jnp.asarray(s), jnp.asarray(s), curvature=C)) == 0.0


def test_bad_input():
    with pytest.raises(ValueError, match="curvature"):
        hyp.expmap0(jnp.ones(3), curvature=-1.0)
    with pytest.raises(ValueError, match="curvature"):
        hyp.distance(jnp.ones(3), jnp.ones(3), curvature=float("nan"))
    with pytest.raises(TypeError, match="u must be a floating"):
        hyp.expmap0(jnp.ones(3, jnp.int32), curvature=1.0)
    with pytest.raises(ValueError, match="x and y must share"):
        hyp.minkowski_inner(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match=r"x must be \[..., d\+1\]"):
        hyp.logmap0(jnp.ones(1), curvature=1.0)
    with pytest.raises(ValueError, match="student and teacher"):
        hyp.anchor_loss(jnp.ones((2, 3, 4)), jnp.ones((2, 3, 4)), curvature=0.1)
    with pytest.raises(ValueError, match="dim must be"):
        hyp.origin(0, curvature=1.0)
