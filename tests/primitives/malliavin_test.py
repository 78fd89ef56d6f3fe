"""Malliavin primitives against closed forms (OU, GBM, BM, linear SDEs), float64 finite differences,
Clark-Ocone and the Cameron-Martin directional-derivative identity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import malliavin as M

K = 40
TS = jnp.linspace(0.0, 1.0, K + 1)
DT = 1.0 / K
# Tests check math, not speed: cheap XLA options for the one large vmapped compilation.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _ou(k=2.0, sig=0.7):
    return (lambda x, t: -k * x), (lambda x, t: sig + 0.0 * x)


def test_brownian_increments_shape_and_variance():
    dw = M.brownian_increments(jax.random.key(0), TS, 3, batch_shape=(2000,))
    assert dw.shape == (2000, K, 3)
    var = float(jnp.var(dw))
    # Sample variance of 240k N(0, dt) draws: relative sd sqrt(2 / 240k) ~ 2.9e-3.
    assert abs(var / DT - 1.0) < 0.015


def test_ou_first_variation_malliavin_derivative_closed_form_and_first_order_error():
    k, sig = 1.0, 0.7
    b, s = _ou(k, sig)
    errs = []
    for kk in (40, 20):
        ts = jnp.linspace(0.0, 1.0, kk + 1)
        dt = 1.0 / kk
        x, jac = M.malliavin_first_variation(b, s, jnp.array([0.3]), ts, jax.random.key(1))
        d = np.asarray(M.malliavin_derivative(jac, jax.vmap(s)(x[:-1], ts[:-1])))[..., 0, 0]  # [K+1, K]
        errs.append(abs(d[-1, 0] - sig * np.exp(-k)))  # D_0 x_1
        if kk == 40:
            np.testing.assert_allclose(np.asarray(jac[:, 0, 0]), (1 - k * dt) ** np.arange(kk + 1), rtol=1e-5)
            j, i = np.meshgrid(np.arange(kk + 1), np.arange(kk), indexing="ij")
            exact_discrete = np.where(i < j, sig * (1 - k * dt) ** np.maximum(j - i - 1, 0), 0.0)
            np.testing.assert_allclose(d, exact_discrete, rtol=1e-5, atol=1e-7)
            # Continuous closed form sig exp(-k (t - s)) to O(dt).
            cont = np.where(i < j, sig * np.exp(-k * (np.asarray(ts)[j] - np.asarray(ts)[i])), 0.0)
            assert np.max(np.abs(d - cont)) < 2 * sig * k * dt
    # (1 - k dt)^(1/dt - 1) = e^{-k} (1 + k (1 - k/2) dt + O(dt^2)): the error halves with the step.
    np.testing.assert_allclose(errs[1] / errs[0], 2.0, rtol=0.1)


def test_gbm_malliavin_derivative():
    mu, sig = 0.3, 0.5
    b = lambda x, t: mu * x  # noqa: E731
    s = lambda x, t: sig * x  # noqa: E731
    dw = M.brownian_increments(jax.random.key(3), TS, 1)
    x, jac = M.malliavin_first_variation(b, s, jnp.array([1.5]), TS, dw=dw)
    np.testing.assert_allclose(np.asarray(jac[:, 0, 0]), np.asarray(x[:, 0] / 1.5), rtol=1e-5)
    d = np.asarray(M.malliavin_derivative(jac, jax.vmap(s)(x[:-1], TS[:-1])))[..., 0, 0]
    xs, w = np.asarray(x[:, 0], np.float64), np.asarray(dw[:, 0], np.float64)
    j, i = np.meshgrid(np.arange(K + 1), np.arange(K), indexing="ij")
    # Exact on the grid: d x_j / d dW_i = sig x_j / (1 + mu dt + sig dW_i).
    exact = np.where(i < j, sig * xs[j] / (1 + mu * DT + sig * w[i]), 0.0)
    np.testing.assert_allclose(d, exact, rtol=1e-4, atol=1e-7)
    # Continuous D_s x_t = sig x_t, up to the one-step factor (|sig dW| ~ sqrt(dt)).
    mask = i < j
    rel = np.abs(d[mask] - sig * xs[j][mask]) / (sig * xs[j][mask])
    assert rel.max() < 2 * (sig * np.max(np.abs(w)) + mu * DT)


def test_brownian_motion_derivative_is_indicator():
    x, jac = M.malliavin_first_variation(lambda x, t: 0.0 * x, lambda x, t: 1.0 + 0.0 * x, jnp.zeros(1), TS,
                                         jax.random.key(4))
    d = np.asarray(M.malliavin_derivative(jac, jnp.ones((K, 1))))[..., 0, 0]
    j, i = np.meshgrid(np.arange(K + 1), np.arange(K), indexing="ij")
    np.testing.assert_array_equal(d, (i < j).astype(np.float32))


# A nonlinear 2-d SDE with general (n x m = 2 x 3) noise, mirrored in float64 numpy.
A_MIX = np.array([[0.4, -0.2, 0.1], [0.3, 0.5, -0.4]])


def _b(x, t, xp=jnp):
    return xp.stack([xp.sin(x[1]) - 0.5 * x[0], -x[0] * x[1] * 0.3 + xp.cos(t)])


def _s(x, t, xp=jnp):
    scale = 1.0 + 0.2 * xp.tanh(x)
    return scale[:, None] * xp.asarray(A_MIX)


def _np_euler(x0, dw, ts):
    x = np.array(x0, np.float64)
    out = [x.copy()]
    for k in range(len(ts) - 1):
        dt = ts[k + 1] - ts[k]
        x = x + _b(x, ts[k], np) * dt + _s(x, ts[k], np) @ dw[k]
        out.append(x.copy())
    return np.stack(out)


@pytest.fixture(scope="module")
def general_path():
    ts = jnp.linspace(0.0, 1.0, 21)
    dw = M.brownian_increments(jax.random.key(5), ts, 3)
    x0 = jnp.array([0.4, -0.3])
    x, jac = M.malliavin_first_variation(_b, _s, x0, ts, dw=dw)
    sigma = jax.vmap(_s)(x[:-1], ts[:-1])
    return ts, dw, x0, x, jac, sigma


def test_euler_matches_float64_and_first_variation_matches_finite_differences(general_path):
    ts, dw, x0, x, jac, _ = general_path
    tsn, dwn, x0n = np.asarray(ts, np.float64), np.asarray(dw, np.float64), np.asarray(x0, np.float64)
    np.testing.assert_allclose(np.asarray(x), _np_euler(x0n, dwn, tsn), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(M.euler_maruyama(_b, _s, x0, ts, dw=dw)), np.asarray(x), atol=1e-6)
    eps = 1e-6
    fd = np.stack([(_np_euler(x0n + eps * e, dwn, tsn) - _np_euler(x0n - eps * e, dwn, tsn)) / (2 * eps)
                   for e in np.eye(2)], axis=-1)  # [K+1, n, n]
    np.testing.assert_allclose(np.asarray(jac), fd, rtol=1e-3, atol=1e-5)


def test_malliavin_derivative_matches_noise_finite_differences(general_path):
    ts, dw, x0, x, jac, sigma = general_path
    d = np.asarray(M.malliavin_derivative(jac, sigma))  # [K+1, K, n, m]
    tsn, dwn, x0n = np.asarray(ts, np.float64), np.asarray(dw, np.float64), np.asarray(x0, np.float64)
    eps = 1e-6
    for i in (0, 7, 19):
        for comp in range(3):
            up, dn = dwn.copy(), dwn.copy()
            up[i, comp] += eps
            dn[i, comp] -= eps
            fd = (_np_euler(x0n, up, tsn) - _np_euler(x0n, dn, tsn)) / (2 * eps)  # [K+1, n]
            np.testing.assert_allclose(d[:, i, :, comp], fd, rtol=1e-3, atol=1e-5)


def test_linear_sde_first_variation_closed_form():
    a = np.array([[-0.5, 0.3], [0.1, -0.2]])
    bs = np.array([[[0.2, 0.0], [0.1, -0.1]], [[0.0, 0.3], [0.05, 0.1]]])  # B_k, k = 1..2
    drift = lambda x, t: jnp.asarray(a, jnp.float32) @ x  # noqa: E731
    diffusion = lambda x, t: jnp.einsum("kij,j->ik", jnp.asarray(bs, jnp.float32), x)  # noqa: E731  [n, m]
    dw = M.brownian_increments(jax.random.key(6), TS, 2)
    x0 = jnp.array([1.0, -2.0])
    x, jac = M.malliavin_first_variation(drift, diffusion, x0, TS, dw=dw)
    prod = np.eye(2)
    dwn = np.asarray(dw, np.float64)
    for k in range(K):
        prod = (np.eye(2) + a * DT + np.einsum("kij,k->ij", bs, dwn[k])) @ prod
    np.testing.assert_allclose(np.asarray(jac[-1]), prod, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(x[-1]), prod @ np.asarray(x0, np.float64), rtol=1e-4, atol=1e-5)


def test_adjoint_equals_weighted_malliavin_sum_recursion_and_autodiff(general_path):
    ts, dw, x0, x, jac, sigma = general_path
    g = jax.random.normal(jax.random.key(7), x.shape)
    p = M.malliavin_adjoint(jac, g)
    d = M.malliavin_derivative(jac, sigma)
    # sum_{j > i} D[j, i]^T g_j = sigma_i^T p_{i+1}
    lhs = jnp.einsum("jinm,jn->im", d, g)
    rhs = jnp.einsum("inm,in->im", sigma, p[1:])
    np.testing.assert_allclose(np.asarray(lhs), np.asarray(rhs), rtol=1e-4, atol=1e-5)
    # Backward recursion p_k = g_k + M_k^T p_{k+1}, M_k = J_{k+1} J_k^{-1}.
    mk = np.asarray(jac[1:], np.float64) @ np.linalg.inv(np.asarray(jac[:-1], np.float64))
    rec = [np.asarray(g[-1], np.float64)]
    for k in range(len(ts) - 2, -1, -1):
        rec.append(np.asarray(g[k], np.float64) + mk[k].T @ rec[-1])
    np.testing.assert_allclose(np.asarray(p), np.stack(rec[::-1]), rtol=1e-4, atol=1e-5)
    # Reverse-mode autodiff of sum_j <g_j, x_j> w.r.t. the increments gives sigma_i^T p_{i+1}.
    auto = jax.grad(lambda w: jnp.sum(g * M.euler_maruyama(_b, _s, x0, ts, dw=w)))(dw)
    np.testing.assert_allclose(np.asarray(auto), np.asarray(rhs), rtol=1e-4, atol=1e-5)


def test_cameron_martin_directional_derivative_identity(general_path):
    """dJ[h] = sum_k dt <G_k, h_k> equals the finite difference of J under W -> W + eps int h (same path)."""
    ts, dw, x0, x, jac, sigma = general_path
    dts = jnp.diff(ts)
    w = jnp.concatenate([jnp.zeros(1), dts])
    cost = lambda x: jnp.sum(jnp.sin(x)) + jnp.sum(x ** 2)  # noqa: E731
    h = jnp.stack([jnp.cos(3 * ts[:-1]), jnp.sin(2 * ts[:-1]), 1.0 + ts[:-1]], -1)  # [K, m]

    @jax.jit
    def value(eps):
        path = M.euler_maruyama(_b, _s, x0, ts, dw=dw + eps * h * dts[:, None])
        return jnp.sum(w * jax.vmap(cost)(path))

    p = M.malliavin_adjoint(jac, w[:, None] * jax.vmap(jax.grad(cost))(x))
    gmal = jnp.einsum("inm,in->im", sigma, p[1:])  # G_k [K, m]
    formula = float(jnp.sum(dts[:, None] * gmal * h))
    eps = 1e-2
    fd = (float(value(jnp.float32(eps))) - float(value(jnp.float32(-eps)))) / (2 * eps)
    assert abs(formula) > 1e-2
    np.testing.assert_allclose(formula, fd, rtol=1e-2)


def test_clark_ocone_conditional_expectation_of_w_squared():
    """G = W_T^2: D_s G = 2 W_T, and E[D_s G | F_s] = 2 W_s (Monte Carlo, 4 standard errors)."""
    i = 15  # condition on the first i increments (F_{t_i})
    prefix = M.brownian_increments(jax.random.key(9), TS, 1)[:i]
    tails = M.brownian_increments(jax.random.key(10), TS, 1, batch_shape=(1000,))[:, i:]
    dws = jnp.concatenate([jnp.broadcast_to(prefix, (1000, i, 1)), tails], 1)
    bm, ones = (lambda x, t: 0.0 * x), (lambda x, t: 1.0 + 0.0 * x)

    def dg(d):
        x, jac = M.malliavin_first_variation(bm, ones, jnp.zeros(1), TS, dw=d)
        dx = M.malliavin_derivative(jac, jnp.ones((K, 1)))[-1, i, 0, 0]  # D_{t_i} W_T
        return 2 * x[-1, 0] * dx

    vals = np.asarray(jax.jit(jax.vmap(dg)).lower(dws).compile(_FAST_COMPILE)(dws), np.float64)
    w_s = float(jnp.sum(prefix))
    se = vals.std(ddof=1) / np.sqrt(len(vals))
    assert abs(vals.mean() - 2 * w_s) < 4 * se


def test_deterministic_given_key_and_shape_errors():
    b, s = _ou()
    a = M.malliavin_first_variation(b, s, jnp.ones(1), TS, jax.random.key(11))
    c = M.malliavin_first_variation(b, s, jnp.ones(1), TS, jax.random.key(11))
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(c[0]))
    with pytest.raises(ValueError, match="dw"):
        M.malliavin_first_variation(b, s, jnp.ones(1), TS, dw=jnp.zeros((K + 1, 1)))
    with pytest.raises(ValueError, match="x0"):
        M.euler_maruyama(b, s, jnp.ones((1, 1)), TS, jax.random.key(0))
    with pytest.raises(ValueError, match="ts"):
        M.euler_maruyama(b, s, jnp.ones(1), jnp.zeros((1,)), jax.random.key(0))
    with pytest.raises(ValueError, match="either key or dw"):
        M.euler_maruyama(b, s, jnp.ones(1), TS)
    with pytest.raises(ValueError, match="diffusion"):
        M.euler_maruyama(b, lambda x, t: jnp.ones((3,)), jnp.ones(2), TS, jax.random.key(0))
    with pytest.raises(ValueError, match="g must"):
        M.malliavin_adjoint(a[1], jnp.ones((K, 1)))
    with pytest.raises(ValueError, match="sigma"):
        M.malliavin_derivative(a[1], jnp.ones((K + 1, 1)))
