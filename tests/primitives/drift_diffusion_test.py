"""Tests for primitives/drift_diffusion.py against closed forms, scipy float64 quadrature and Monte Carlo.

Kept small on purpose (the whole file runs in a few seconds on one core): batched calls, one module-level
Monte-Carlo fixture, float64 numpy references.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import log_ndtr, ndtr

from primitives import drift_diffusion as dd

# ----------------------------------------------------------------------------------------------------
# Independent float64 references.
# ----------------------------------------------------------------------------------------------------


def ig_pdf64(t, a, mu, sigma=1.0):
    return a / (sigma * np.sqrt(2 * np.pi * t**3)) * np.exp(-(a - mu * t) ** 2 / (2 * sigma**2 * t))


def ig_cdf64(t, a, mu, sigma=1.0):
    s = sigma * np.sqrt(t)
    return ndtr((mu * t - a) / s) + np.exp(2 * mu * a / sigma**2 + log_ndtr((-mu * t - a) / s))


def step_drift_exact_cdf(t, a, mu0, mu1, tau, sigma=1.0):
    """P(T <= t) for drift mu0 on [0, tau), mu1 after: killed-Gaussian density at tau (method of images),
    then the inverse-Gaussian CDF from each starting point (scipy quad, float64)."""
    if t <= tau:
        return ig_cdf64(t, a, mu0, sigma)
    v = sigma**2 * tau

    def alive_density(x):
        return (np.exp(-(x - mu0 * tau) ** 2 / (2 * v))
                - np.exp(2 * mu0 * a / sigma**2 - (x - 2 * a - mu0 * tau) ** 2 / (2 * v))) / np.sqrt(2 * np.pi * v)

    later, _ = integrate.quad(lambda x: alive_density(x) * ig_cdf64(t - tau, a - x, mu1, sigma),
                              mu0 * tau - 12 * np.sqrt(v), a, limit=200, epsabs=1e-12)
    return ig_cdf64(tau, a, mu0, sigma) + later


def _cdf_from_density(g, t):
    return np.concatenate([[0.0], np.cumsum(0.5 * (g[1:] + g[:-1]) * np.diff(t))])


def _step_grid(t, tau, mu0=0.5, beta=0.5):
    mu = np.where(t >= tau, mu0 + beta, mu0)
    cum = mu0 * t + beta * np.maximum(t - tau, 0.0)
    return mu, cum


def _kernel_np(u, kind, width):
    """Independent numpy (g, G) of the four kernels."""
    up = np.maximum(u, 0.0)
    on = u >= 0
    if kind == "step":
        return on * 1.0, up
    if kind == "pulse":
        return (on & (u < width)) * 1.0, np.minimum(up, width)
    if kind == "decay":
        return on * np.exp(-up / width), width * (1 - np.exp(-up / width))
    return on * (1 - up / width) * np.exp(1 - up / width), up * np.exp(1 - up / width)


# ----------------------------------------------------------------------------------------------------
# Kernels.
# ----------------------------------------------------------------------------------------------------


def test_kernels_and_their_integrals():
    width = 1.7
    u = np.array([-0.5, 0.3, 1.7, 2.5, 6.0])
    for kind in dd.KERNELS:
        g_np, _ = _kernel_np(u, kind, width)
        np.testing.assert_allclose(dd.signal_kernel(jnp.asarray(u), kind=kind, width=width), g_np, atol=1e-6)
        # G = int_0^u g, by scipy quadrature of the numpy kernel.
        want = [integrate.quad(lambda x: _kernel_np(np.array(x), kind, width)[0], 0.0, x,
                               points=[width] if width < x else None)[0] if x > 0 else 0.0 for x in u]
        np.testing.assert_allclose(dd.signal_kernel_integral(jnp.asarray(u), kind=kind, width=width), want,
                                   atol=2e-5, err_msg=kind)


def test_signal_drift_shapes_and_values():
    t = jnp.linspace(0.0, 10.0, 11)
    tau = jnp.array([[2.0, 5.0], [1.0, 9.0], [0.0, 0.0]])
    mu, cum = dd.signal_drift(t, jnp.array([0.5, 1.0, 0.0]), tau, jnp.array([1.0, -1.0]), kind="step")
    assert mu.shape == cum.shape == (3, 11)
    np.testing.assert_allclose(mu[0], 0.5 + (t >= 2) - (t >= 5), atol=1e-6)
    np.testing.assert_allclose(cum[0], 0.5 * t + np.maximum(t - 2, 0) - np.maximum(t - 5, 0), atol=1e-5)
    np.testing.assert_allclose(mu[2], 0.0, atol=1e-6)  # opposite signals at the same time cancel


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="kind must be one of"):
        dd.signal_kernel(jnp.zeros(3), kind="box")
    with pytest.raises(ValueError, match="width must be > 0.*width=0.0"):
        dd.signal_kernel(jnp.zeros(3), kind="decay", width=0.0)
    with pytest.raises(ValueError, match=r"tau must have at least 1 dim.*shape \(\)"):
        dd.signal_drift(jnp.zeros(3), 0.5, jnp.float32(1.0), 1.0, kind="step")
    with pytest.raises(ValueError, match="start at 0"):
        dd.volterra_fpt_density(np.linspace(1, 2, 10), 1.0, 1.0, np.zeros(10), np.zeros(10))
    with pytest.raises(ValueError, match="uniformly"):
        dd.volterra_fpt_density(np.array([0.0, 1.0, 3.0]), 1.0, 1.0, np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match=r"cum_drift must have shape \(\.\.\., 10\).*\(9,\)"):
        dd.volterra_fpt_density(np.linspace(0, 1, 10), 1.0, 1.0, np.zeros(9), np.zeros(10))
    with pytest.raises(ValueError, match="a and sigma must be > 0"):
        dd.volterra_fpt_density(np.linspace(0, 1, 10), -1.0, 1.0, np.zeros(10), np.zeros(10))
    with pytest.raises(ValueError, match=r"cum_drift must have shape \(\.\.\., 5\)"):
        dd.simulate_first_passage(jax.random.key(0), jnp.linspace(0, 1, 5), jnp.zeros(4), 1.0, 1.0, num_paths=3)
    with pytest.raises(ValueError, match="num_paths must be >= 1; got 0"):
        dd.simulate_first_passage(jax.random.key(0), jnp.linspace(0, 1, 5), jnp.zeros(5), 1.0, 1.0, num_paths=0)
    with pytest.raises(ValueError, match="num_nodes"):
        dd.signal_tangent_cdf(1.0, 1.0, 1.0, 0.5, jnp.zeros(1), 0.0, kind="step", num_nodes=0)


# ----------------------------------------------------------------------------------------------------
# Constant drift: inverse Gaussian.
# ----------------------------------------------------------------------------------------------------


def test_ig_pdf_cdf_match_scipy():
    t = np.array([0.05, 0.3, 1.0, 2.5, 7.0])
    a, mu, sigma = 1.5, 0.8, 1.2
    mean, shape = a / mu, a**2 / sigma**2
    want_pdf = stats.invgauss.pdf(t, mean / shape, scale=shape)
    want_cdf = stats.invgauss.cdf(t, mean / shape, scale=shape)
    np.testing.assert_allclose(dd.ig_pdf(jnp.asarray(t), a, mu, sigma), want_pdf, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(dd.ig_cdf(jnp.asarray(t), a, mu, sigma), want_cdf, rtol=2e-5, atol=1e-7)
    assert float(dd.ig_pdf(jnp.float32(0.0), a, mu, sigma)) == 0.0
    assert float(dd.ig_cdf(jnp.float32(-1.0), a, mu, 1.0)) == 0.0


def test_ig_cdf_is_integral_of_density_and_defective_for_negative_drift():
    a, sigma = 1.3, 0.9
    ts = np.array([0.5, 2.0, 10.0])
    with jax.enable_x64(True):
        for mu in (-0.7, 0.0, 0.4, 3.0):
            want = [integrate.quad(ig_pdf64, 0.0, t, args=(a, mu, sigma), limit=200, epsabs=1e-13)[0] for t in ts]
            np.testing.assert_allclose(dd.ig_cdf(jnp.asarray(ts), a, mu, sigma), want, atol=1e-10, err_msg=str(mu))
            mass = float(dd.ig_mass(a, mu, sigma))
            assert mass == pytest.approx(min(1.0, np.exp(2 * mu * a / sigma**2)), rel=1e-12)
            if mu != 0.0:  # mu = 0 converges like t^{-1/2}
                assert float(dd.ig_cdf(jnp.float64(1e5), a, mu, sigma)) == pytest.approx(mass, abs=1e-8)
    assert mass == 1.0 and float(dd.ig_mass(a, -0.7, sigma)) < 0.2  # the negative drift law is defective


def test_ig_cdf_no_overflow_for_large_drift_times_threshold():
    cdf = dd.ig_cdf(jnp.array([1.0, 10.0, 30.0]), 40.0, 4.0, 1.0)  # 2 mu a / sigma^2 = 320 overflows exp in f32
    assert np.all(np.isfinite(cdf))
    np.testing.assert_allclose(cdf, ig_cdf64(np.array([1.0, 10.0, 30.0]), 40.0, 4.0), atol=1e-6)


# ----------------------------------------------------------------------------------------------------
# Tangent approximation.
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a,mu,sigma", [(3.0, -0.4, 0.7), (8.0, 2.5, 1.3)])
def test_tangent_equals_inverse_gaussian_for_constant_drift(a, mu, sigma):
    with jax.enable_x64(True):
        t = jnp.linspace(0.01, 20.0, 300, dtype=jnp.float64)
        f_hat = dd.tangent_pdf(t, a, sigma, mu * t, jnp.full_like(t, mu))
        # Independent float64 numpy density (valid for either sign of mu; for mu < 0 it is defective).
        np.testing.assert_allclose(f_hat, ig_pdf64(np.asarray(t), a, mu, sigma), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(f_hat, dd.ig_pdf(t, a, mu, sigma), rtol=1e-12, atol=1e-300)
        # Same through the signal interface with a zero-amplitude signal of every kind.
        for kind in ("pulse", "transient"):
            f_sig = dd.signal_tangent_pdf(t, a, sigma, mu, jnp.array([3.0]), 0.0, kind=kind, width=2.0)
            np.testing.assert_allclose(f_sig, f_hat, rtol=1e-12, atol=1e-300)


def test_quadrature_cdf_matches_closed_form_and_total_mass():
    """Small thresholds (mass near 0), heavy tails (mu = 0) and defective laws all integrate to ig_cdf."""
    a = np.array([1.0, 0.5, 2.0, 1.0, 16.0, 2.0, 2.0])
    mu = np.array([1.0, 2.0, -0.3, 0.0, 0.5, 0.6, -0.25])
    horizon = np.array([20.0, 50.0, 200.0, 1000.0, 100.0, 2000.0, 2000.0])
    got = dd.signal_tangent_cdf(jnp.asarray(horizon), jnp.asarray(a), 1.0, jnp.asarray(mu),
                                jnp.asarray(horizon / 3)[:, None], 0.0, kind="decay", width=1.0)
    np.testing.assert_allclose(got, ig_cdf64(horizon, a, mu), atol=2e-6)
    # Total mass: 1 for mu > 0, exp(2 mu a / sigma^2) for mu < 0.
    np.testing.assert_allclose(got[-2:], [1.0, np.exp(2 * -0.25 * 2.0)], atol=1e-5)


def test_tangent_mass_for_time_varying_drift():
    # Drift that only increases (step up): mass 1 up to the approximation error, small at high threshold.
    got = float(dd.signal_tangent_cdf(1000.0, 16.0, 1.0, 0.5, jnp.array([8.0]), 0.5, kind="step"))
    assert got == pytest.approx(1.0, abs=1e-3)
    # A drift that rises and falls back (decay) has a mass defect (prefactor shrinks after the peak); it
    # vanishes as the threshold grows with the time scale.
    mass = jax.vmap(lambda a: dd.signal_tangent_cdf(40.0 * a, a, 1.0, 0.5, (a / 2)[None], 1.0, kind="decay",
                                                    width=a / 4))(jnp.array([4.0, 16.0, 64.0]))
    defect = np.abs(1.0 - np.asarray(mass))
    assert defect[0] > defect[1] > defect[2] and defect[0] > 1e-2, defect


def test_density_nonnegative_and_clipped_where_prefactor_negative():
    # Strong drift drop at tau = 6: after it a - M(t) + t mu(t) = a - 0.9 tau < 0 (a = 2).
    t = jnp.linspace(0.01, 30.0, 300)
    mu, cum = dd.signal_drift(t, 1.0, jnp.array([6.0]), -0.9, kind="step")
    pref = dd.tangent_prefactor(t, 2.0, cum, mu)
    f = dd.tangent_pdf(t, 2.0, 1.0, cum, mu)
    assert np.any(pref < 0) and np.any(pref > 0)
    assert np.all(f >= 0)
    logf = dd.tangent_log_pdf(t, 2.0, 1.0, cum, mu)
    assert np.all(f[pref <= 0] == 0) and np.all(np.isneginf(logf[pref <= 0]))
    assert np.all(np.isfinite(logf[pref > 0]))
    g = jax.jit(jax.grad(lambda x: jnp.sum(dd.tangent_pdf(t, x, 1.0, cum, mu))))(2.0)
    assert np.isfinite(g)  # clipping must not poison gradients


def test_spec_anchor_values():
    """The spec's table (step 0.5 -> 1.0 at a/2): our closed form reproduces its approximation column."""
    ts = jnp.array([[1.5, 3, 4.5, 6, 9], [4, 8, 12, 16, 24]])
    a = jnp.array([[3.0], [8.0]])
    want = [[.0552, .4262, .7348, .8887, .9850], [.0022, .2877, .7703, .9529, .9990]]
    got = dd.signal_tangent_cdf(ts, a, 1.0, 0.5, (a / 2)[..., None], 0.5, kind="step")
    np.testing.assert_allclose(got, want, atol=6e-5)


def test_time_rescaling_invariance():
    a, sigma, c = 2.0, 0.8, 3.0
    t = np.linspace(0.0, 20.0, 401)
    mu, cum = _step_grid(t, 2.0, mu0=0.4, beta=0.6)
    with jax.enable_x64(True):
        f1 = dd.tangent_pdf(jnp.asarray(t), a, sigma, jnp.asarray(cum), jnp.asarray(mu))
        f2 = dd.tangent_pdf(jnp.asarray(t), c * a, c * sigma, jnp.asarray(c * cum), jnp.asarray(c * mu))
        np.testing.assert_allclose(f1, f2, rtol=1e-12)
    g1 = dd.volterra_fpt_density(t, a, sigma, cum, mu)
    g2 = dd.volterra_fpt_density(t, c * a, c * sigma, c * cum, c * mu)
    np.testing.assert_allclose(g1, g2, rtol=1e-10, atol=1e-14)


# ----------------------------------------------------------------------------------------------------
# Volterra integral equation (ground truth).
# ----------------------------------------------------------------------------------------------------


def test_volterra_matches_inverse_gaussian():
    t = np.linspace(0.0, 12.0, 1001)
    a = np.array([1.0, 2.0, 3.0])
    mu = np.array([1.0, -0.3, 0.5])
    sigma = np.array([1.0, 1.0, 1.5])
    g = dd.volterra_fpt_density(t, a, sigma, mu[:, None] * t, np.broadcast_to(mu[:, None], (3, t.size)))
    want = np.concatenate([np.zeros((3, 1)), ig_pdf64(t[1:], a[:, None], mu[:, None], sigma[:, None])], axis=1)
    assert np.max(np.abs(g - want)) < 1e-3
    assert np.max(np.abs(g - want)) < 1e-10  # in fact float64-exact: the kernel vanishes for a linear boundary
    for i in range(3):  # batched solve == one at a time
        np.testing.assert_allclose(g[i], dd.volterra_fpt_density(t, a[i], sigma[i], mu[i] * t, np.full_like(t, mu[i])),
                                   rtol=1e-12, atol=1e-300)


def test_volterra_matches_exact_step_drift_solution():
    """A kinked boundary (drift jump), where the kernel does not vanish: against method of images + IG."""
    for a in (3.0, 8.0):
        t = np.linspace(0.0, 6 * a, 1001)
        mu, cum = _step_grid(t, a / 2)
        F = _cdf_from_density(dd.volterra_fpt_density(t, a, 1.0, cum, mu), t)
        check = np.arange(100, 1001, 100)
        exact = np.array([step_drift_exact_cdf(t[i], a, 0.5, 1.0, a / 2) for i in check])
        assert np.max(np.abs(F[check] - exact)) < 1e-3


def test_approximation_error_decreases_with_threshold():
    """sup |F_hat - F_volterra| for the step-up drift (0.5 -> 1.0 at a/2) shrinks monotonically in a."""
    thresholds = np.array([2.0, 4.0, 8.0, 16.0])
    ts = np.linspace(0.0, 1.0, 1501)[None, :] * (6 * thresholds[:, None] + 24)
    F_hat = np.asarray(dd.signal_tangent_cdf(jnp.asarray(ts, jnp.float32), jnp.asarray(thresholds)[:, None], 1.0, 0.5,
                                             jnp.asarray(thresholds / 2)[:, None, None], 0.5, kind="step"), np.float64)
    errors = []
    for i, a in enumerate(thresholds):
        mu, cum = _step_grid(ts[i], a / 2)
        F = _cdf_from_density(dd.volterra_fpt_density(ts[i], a, 1.0, cum, mu), ts[i])
        errors.append(np.max(np.abs(F_hat[i] - F)))
    assert all(x > y for x, y in zip(errors[:-1], errors[1:])), errors
    assert errors[0] > 1e-3  # the approximation is visibly inexact at small a: the test can discriminate


# ----------------------------------------------------------------------------------------------------
# Monte Carlo with the Brownian-bridge correction.
# ----------------------------------------------------------------------------------------------------

_T = np.linspace(0.0, 8.0, 161)  # dt = 0.05
_CHECK = np.array([1.0, 2.0, 3.0, 5.0, 8.0])
# Batch: constant drift 0.8 (a = 2), negative drift -0.3 (a = 1, defective), step 0.5 -> 1.0 at 1.5 (a = 3;
# a grid point, so the drift is constant on every Euler step).
_A = np.array([2.0, 1.0, 3.0])
_CUM = np.stack([0.8 * _T, -0.3 * _T, _step_grid(_T, 1.5)[1]])


@pytest.fixture(scope="module")
def mc():
    fn = jax.jit(lambda key, bridge: dd.simulate_first_passage(key, jnp.asarray(_T), jnp.asarray(_CUM, jnp.float32),
                                                               jnp.asarray(_A), 1.0, num_paths=10_000, bridge=bridge),
                 static_argnums=1)
    exact = np.stack([ig_cdf64(_CHECK, 2.0, 0.8), ig_cdf64(_CHECK, 1.0, -0.3),
                      [step_drift_exact_cdf(x, 3.0, 0.5, 1.0, 1.5) for x in _CHECK]])
    return fn(jax.random.key(0), True), fn(jax.random.key(0), False), exact


def test_bridge_mc_matches_closed_forms_within_3_se(mc):
    sample, _, exact = mc
    assert sample.hit_time.shape == (3, 10_000)
    cdf, se = dd.empirical_cdf(sample.hit_time, jnp.asarray(_CHECK))
    z = np.abs(np.asarray(cdf) - exact) / np.asarray(se)
    assert np.all(z < 3), z
    # Rao-Blackwellised survival: also within 3 standard errors, with a smaller one.
    surv = np.asarray(sample.survival, np.float64)
    se_rb = surv.std(axis=-1) / np.sqrt(surv.shape[-1])
    assert np.all(np.abs((1 - surv.mean(axis=-1)) - exact[:, -1]) < 3 * se_rb)
    assert np.all(se_rb < np.asarray(se)[:, -1])


def test_mc_without_bridge_is_biased_late(mc):
    _, sample, exact = mc
    cdf, se = dd.empirical_cdf(sample.hit_time, jnp.asarray(_CHECK))
    late = _CHECK == 3.0  # a fair share of the mass crossed, much still to cross
    bias = (exact - np.asarray(cdf))[:, late]
    assert np.all(bias > 3 * np.asarray(se)[:, late]), bias  # misses crossings between grid points


def test_empirical_cdf():
    hits = jnp.array([[0.5, 1.0, jnp.inf, 2.0]])
    cdf, se = dd.empirical_cdf(hits, jnp.array([0.0, 1.0, 5.0]))
    np.testing.assert_allclose(cdf, [[0.0, 0.5, 0.75]])
    np.testing.assert_allclose(se, [[0.0, 0.25, np.sqrt(0.75 * 0.25 / 4)]], rtol=1e-6)


# ----------------------------------------------------------------------------------------------------
# Timing gradients through the quadrature.
# ----------------------------------------------------------------------------------------------------


def _fhat64_scipy(horizon, a, mu0, tau, beta, kind, width):
    """int_0^H of the tangent density written out in numpy, by scipy's adaptive quadrature (float64)."""
    def f(t):
        g, G = _kernel_np(t - tau, kind, width)
        mu, cum = mu0 + beta * g, mu0 * t + beta * G
        pref = a - cum + t * mu
        return max(pref, 0.0) / np.sqrt(2 * np.pi * t**3) * np.exp(-(a - cum) ** 2 / (2 * t)) if t > 0 else 0.0

    pts = [p for p in ([tau, tau + width] if kind == "pulse" else [tau]) if 0 < p < horizon]
    return integrate.quad(f, 0.0, horizon, points=pts or None, limit=500, epsabs=1e-13, epsrel=1e-12)[0]


@pytest.mark.parametrize("kind", ["decay"])  # the pulse (two moving jumps) is tested in algorithms/
def test_autodiff_timing_gradient_matches_finite_differences(kind):
    a, mu0, beta, horizon, width = 4.0, 0.5, 0.8, 8.0, 2.0
    with jax.enable_x64(True):
        def F(tau):
            return dd.signal_tangent_cdf(horizon, a, 1.0, mu0, tau[..., None], beta, kind=kind, width=width)

        taus = jnp.array([1.0, 5.1], jnp.float64)
        grad = np.asarray(jax.jit(jax.vmap(jax.grad(F)))(taus))
        h = 1e-5
        fd_self = np.asarray(F(taus + h) - F(taus - h)) / (2 * h)
        np.testing.assert_allclose(grad, fd_self, rtol=1e-4, atol=1e-9)
        # Independent: central differences of scipy's adaptive quadrature of the same density; this
        # includes the jump terms f(tau-) - f(tau+) that fixed quadrature nodes would miss.
        h = 1e-4
        fd_scipy = [(_fhat64_scipy(horizon, a, mu0, x + h, beta, kind, width)
                     - _fhat64_scipy(horizon, a, mu0, x - h, beta, kind, width)) / (2 * h) for x in np.asarray(taus)]
        np.testing.assert_allclose(grad, fd_scipy, rtol=1e-4, atol=1e-8)
        assert np.all(np.abs(grad) > 1e-3)  # a non-trivial derivative
