"""Normal-mixture boundary and martingale against closed forms, float64 quadrature and Monte Carlo."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, optimize, special, stats

from primitives import confidence_sequences as cs

ALPHA = 0.05
N_PATHS = 10_000


def _slack(p, n, k=3.0):
    return k * math.sqrt(p * (1 - p) / n)


def test_two_sided_boundary_matches_closed_form_and_increases():
    v = np.array([0.0, 0.5, 1.0, 10.0, 123.0, 1e4, 1e6])
    for rho, alpha in [(1.0, 0.05), (0.3, 0.01), (50.0, 0.2)]:
        ours = np.asarray(cs.normal_mixture_boundary(jnp.asarray(v), rho, alpha), np.float64)
        ref = np.sqrt((v + rho) * np.log((v + rho) / (rho * alpha ** 2)))
        np.testing.assert_allclose(ours, ref, rtol=2e-6)
        assert np.all(np.diff(ours) > 0)


@pytest.mark.parametrize("two_sided", [True, False])
def test_martingale_equals_one_over_alpha_on_the_boundary(two_sided):
    v = jnp.array([0.0, 1.0, 10.0, 300.0, 5e4])
    for rho, alpha in [(1.0, 0.05), (7.0, 1e-3)]:
        b = cs.normal_mixture_boundary(v, rho, alpha, two_sided)
        log_l = cs.mixture_martingale(b, v, rho, two_sided=two_sided, log=True)
        np.testing.assert_allclose(np.asarray(log_l), math.log(1 / alpha), atol=2e-4)


def test_one_sided_boundary_against_quadrature_root():
    """Independent: the half-normal mixture integral by scipy quadrature, its root by brentq (float64)."""
    rho, alpha = 2.0, 0.05

    def mixture(s, v):  # int_0^inf exp(l s - l^2 v / 2) 2 N(l; 0, 1/rho) dl
        f = lambda lam: 2 * math.sqrt(rho / (2 * math.pi)) * math.exp(lam * s - 0.5 * lam * lam * (v + rho))
        return integrate.quad(f, 0, np.inf, limit=200)[0]

    for v in [0.0, 3.0, 40.0]:
        root = optimize.brentq(lambda s: math.log(mixture(s, v)) - math.log(1 / alpha), 0.0, 30.0, xtol=1e-10)
        ours = float(cs.normal_mixture_boundary(jnp.asarray(v), rho, alpha, two_sided=False))
        assert ours == pytest.approx(root, rel=1e-5)
        # The one-sided boundary lies between the two-sided ones at alpha and 2 alpha.
        assert float(cs.normal_mixture_boundary(jnp.asarray(v), rho, 2 * alpha)) <= ours + 1e-5
        assert ours <= float(cs.normal_mixture_boundary(jnp.asarray(v), rho, alpha)) + 1e-5


@pytest.mark.parametrize("two_sided", [True, False])
def test_mixture_martingale_has_unit_mean_by_quadrature(two_sided):
    """E[L(S, V)] = 1 for S ~ N(0, V): float64 quadrature of our (float32) L against the normal density."""
    for v, rho in [(1.0, 1.0), (25.0, 0.5), (400.0, 30.0)]:
        sd = math.sqrt(v)
        width = 14 * math.sqrt(v * (v + rho) / rho)  # the integrand is a Gaussian with this variance
        s = np.linspace(-width, width, 100_001)
        log_l = np.asarray(cs.mixture_martingale(jnp.asarray(s), jnp.asarray(v), rho, two_sided=two_sided, log=True),
                           np.float64)
        mean = integrate.simpson(np.exp(log_l + stats.norm.logpdf(s, scale=sd)), x=s)
        assert mean == pytest.approx(1.0, abs=2e-4)


def test_mixture_martingale_unit_mean_monte_carlo():
    v, rho = 9.0, 12.0  # rho > v: L has a finite variance, so a 4-SE tolerance is meaningful
    s = math.sqrt(v) * jax.random.normal(jax.random.key(3, impl="rbg"), (200_000,))
    l = np.asarray(cs.mixture_martingale(s, jnp.asarray(v), rho), np.float64)
    assert abs(l.mean() - 1) <= 4 * l.std() / math.sqrt(l.size)


@jax.jit
def _gaussian_walk_tests(key):
    """Gaussian random walks with known unit variance (the exact case): crossing rates and stopped L."""
    z = jax.random.normal(key, (N_PATHS, 300))
    v = jnp.ones_like(z)
    out = {}
    for name, kw in {"m1_rho1": dict(burn_in=1, rho=1.0), "m100_default": dict(burn_in=100),
                     "m100_scale1": dict(burn_in=100, rho_scale=1.0)}.items():
        for two in (True, False):
            r = cs.sequential_mixture_test(z, v, alpha=ALPHA, two_sided=two, **kw)
            # Stopped martingale L_{tau ^ T} (optional stopping: mean exactly 1).
            idx = jnp.minimum(r.stop_time, z.shape[-1]) - 1
            log_stopped = jnp.take_along_axis(
                cs.mixture_martingale(r.s, r.v, r.rho[:, None], two_sided=two, log=True), idx[:, None], axis=1)[:, 0]
            out[(name, two)] = (r.rejected, jnp.exp(log_stopped))
    return out


@pytest.fixture(scope="module")
def walks():
    key = jax.random.key(0, impl="rbg")  # one draw; "rbg" compiles much faster than threefry on CPU
    return {k: tuple(np.asarray(a, np.float64) for a in v) for k, v in _gaussian_walk_tests(key).items()}


@pytest.mark.parametrize("name", ["m1_rho1", "m100_default", "m100_scale1"])
@pytest.mark.parametrize("two_sided", [True, False])
def test_ville_crossing_probability_at_most_alpha(walks, name, two_sided):
    rejected, _ = walks[(name, two_sided)]
    assert rejected.mean() <= ALPHA + _slack(ALPHA, N_PATHS)
    assert rejected.mean() > 0.002  # the boundary is not vacuous


@pytest.mark.parametrize("name", ["m1_rho1", "m100_scale1"])
@pytest.mark.parametrize("two_sided", [True, False])
def test_optional_stopping_mean_one(walks, name, two_sided):
    """E[L_{tau ^ T}] = 1 for the stopped mixture martingale (optional stopping; with the burn-in,
    rho = V_m is deterministic here because the variance is known)."""
    _, stopped = walks[(name, two_sided)]
    assert abs(stopped.mean() - 1) <= 4 * stopped.std() / math.sqrt(stopped.size)


def test_optimal_rho_ratio_matches_lambert_w_and_minimizes_boundary():
    for alpha in [0.2, 0.05, 1e-3, 1e-6]:
        ours = float(cs.optimal_rho_ratio(alpha))
        ref = 1.0 / (-special.lambertw(-alpha ** 2 / math.e, k=-1).real - 1.0)
        assert ours == pytest.approx(ref, rel=1e-5)
        v_star = 250.0
        rho = float(cs.optimal_rho(v_star, alpha))
        b = lambda r: math.sqrt((v_star + r) * math.log((v_star + r) / (r * alpha ** 2)))
        res = optimize.minimize_scalar(lambda lr: b(math.exp(lr)), bounds=(-10, 10), method="bounded")
        assert rho == pytest.approx(math.exp(res.x), rel=1e-3)


def test_stopping_time_against_brute_force():
    rng = np.random.default_rng(0)
    crossed = rng.random((50, 30)) < 0.05
    for m in [1, 7, 30]:
        rej, tau = cs.stopping_time(jnp.asarray(crossed), burn_in=m)
        for i in range(50):
            hits = [t + 1 for t in range(30) if crossed[i, t] and t + 1 >= m]
            assert bool(rej[i]) == bool(hits)
            assert int(tau[i]) == (hits[0] if hits else 31)


def test_online_update_equals_batch_test():
    z = jnp.asarray(0.4 + np.random.default_rng(5).normal(size=(16, 120)) * (1 + np.arange(16)[:, None] / 8),
                    jnp.float32)
    v = z * z
    for kw in [dict(burn_in=30, rho=2.0), dict(burn_in=50, rho_scale=0.5, two_sided=False)]:
        batch = cs.sequential_mixture_test(z, v, alpha=0.01, **kw)

        def step(state, inc):
            return cs.mixture_test_update(state, inc[0], inc[1], alpha=0.01, **kw), None

        final, _ = jax.lax.scan(step, cs.mixture_test_init((16,)), (z.T, v.T))
        np.testing.assert_array_equal(np.asarray(final.rejected), np.asarray(batch.rejected))
        expected_tau = np.where(np.asarray(batch.rejected), np.asarray(batch.stop_time), 0)
        np.testing.assert_array_equal(np.asarray(final.stop_time), expected_tau)
        np.testing.assert_allclose(np.asarray(final.rho), np.asarray(batch.rho), rtol=1e-5)


def test_online_update_observed_mask_counts_per_element():
    update = jax.jit(lambda st, obs: cs.mixture_test_update(st, jnp.ones(2), jnp.ones(2), burn_in=2, observed=obs))
    state = cs.mixture_test_init((2,))
    for i in range(5):
        state = update(state, jnp.array([True, i % 2 == 0]))
    np.testing.assert_array_equal(np.asarray(state.count), [5, 3])
    np.testing.assert_allclose(np.asarray(state.s), [5.0, 3.0])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="alpha"):
        cs.normal_mixture_boundary(jnp.ones(3), 1.0, 1.5)
    with pytest.raises(ValueError, match="rho"):
        cs.mixture_martingale(jnp.ones(3), jnp.ones(3), 0.0)
    with pytest.raises(ValueError, match="burn_in"):
        cs.sequential_mixture_test(jnp.ones(5), jnp.ones(5), burn_in=6)
    with pytest.raises(ValueError, match="v_increments"):
        cs.sequential_mixture_test(jnp.ones(5), jnp.ones(4))
    with pytest.raises(ValueError, match="at most one"):
        cs.sequential_mixture_test(jnp.ones(5), jnp.ones(5), rho=1.0, rho_scale=1.0)
    with pytest.raises(ValueError, match="burn_in"):
        cs.stopping_time(jnp.ones(4, bool), burn_in=0)
