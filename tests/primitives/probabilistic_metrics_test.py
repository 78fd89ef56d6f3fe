"""Probabilistic forecast scores against closed forms, numpy brute force and Monte Carlo."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from primitives import probabilistic_metrics as pm

RNG = np.random.default_rng(0)


def _crps_numeric(y, mu, sigma):
    """int (Phi((z - mu) / sigma) - 1{y <= z})^2 dz by quadrature, float64."""
    f_lo = lambda z: stats.norm.cdf(z, mu, sigma) ** 2
    f_hi = lambda z: (1.0 - stats.norm.cdf(z, mu, sigma)) ** 2
    lo = integrate.quad(f_lo, -np.inf, y, epsabs=1e-12, epsrel=1e-12)[0]
    hi = integrate.quad(f_hi, y, np.inf, epsabs=1e-12, epsrel=1e-12)[0]
    return lo + hi


def _crps_brute(x, y, fair=False):
    """mean_k |x_k - y| - sum_{k,l} |x_k - x_l| / (2 K^2) (or 2 K (K - 1)), by an explicit double loop."""
    k = len(x)
    a = np.mean(np.abs(np.asarray(x, np.float64) - y))
    pair = sum(abs(float(xi) - float(xj)) for xi in x for xj in x)
    return a - pair / (2 * (k * (k - 1) if fair else k * k))


def _qice_brute(samples, y, num_bins, merge=False):
    """The NsDiff / PPM evaluation code: np.percentile edges, membership = #edges strictly below y."""
    levels = np.arange(num_bins + 1) * (100 / num_bins)
    q = np.percentile(samples, levels, axis=0)  # [B + 1, n]
    member = (y[None] - q > 0).sum(0)
    counts = np.array([(member == v).sum() for v in range(num_bins + 2)], np.float64)
    if merge:
        counts[1] += counts[0]
        counts[-2] += counts[-1]
    return np.abs(1.0 / num_bins - counts[1:-1] / y.size).mean()


@pytest.mark.parametrize("y,mu,sigma", [(0.0, 0.0, 1.0), (1.3, -0.4, 0.7), (-2.0, 1.0, 2.5), (5.0, 0.0, 0.5)])
def test_crps_gaussian_matches_its_defining_integral(y, mu, sigma):
    got = float(pm.crps_gaussian(y, mu, sigma))
    np.testing.assert_allclose(got, _crps_numeric(y, mu, sigma), rtol=2e-5, atol=1e-6)


def test_crps_gaussian_standard_normal_at_zero_and_broadcasting():
    np.testing.assert_allclose(float(pm.crps_gaussian(0.0, 0.0, 1.0)), (math.sqrt(2) - 1) / math.sqrt(math.pi),
                               rtol=1e-6)
    y = jnp.linspace(-2, 2, 5)[:, None]
    out = pm.crps_gaussian(y, jnp.zeros((1, 3)), jnp.array([0.5, 1.0, 2.0]))
    assert out.shape == (5, 3)
    # scale equivariance: CRPS(a y; a mu, a sigma) = a CRPS(y; mu, sigma)
    np.testing.assert_allclose(pm.crps_gaussian(3 * y, 0.0, 3.0), 3 * pm.crps_gaussian(y, 0.0, 1.0), rtol=1e-5)


@pytest.mark.parametrize("fair", [False, True])
def test_crps_ensemble_matches_numpy_double_sum(fair):
    x = RNG.normal(size=(7, 4, 3)).astype(np.float32)  # K = 7 along axis 0
    y = RNG.normal(size=(4, 3)).astype(np.float32)
    got = np.asarray(pm.crps_ensemble(x, y, axis=0, fair=fair))
    want = np.array([[_crps_brute(x[:, i, j], y[i, j], fair) for j in range(3)] for i in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the ensemble axis can be anywhere
    got_last = np.asarray(pm.crps_ensemble(np.moveaxis(x, 0, -1), y, axis=-1, fair=fair))
    np.testing.assert_allclose(got_last, got, rtol=1e-6, atol=1e-7)


def test_crps_ensemble_point_mass_is_absolute_error():
    y = jnp.array([-1.0, 0.0, 2.5])
    x = jnp.broadcast_to(jnp.array([0.5, 0.5, 0.5]), (5, 3))  # five identical members
    np.testing.assert_allclose(pm.crps_ensemble(x, y), jnp.abs(0.5 - y), rtol=1e-6)


def test_crps_ensemble_of_gaussian_quantiles_converges_to_closed_form():
    # K equally spaced N(mu, sigma) quantiles: the ensemble CRPS tends to the closed form as K grows
    k = 4000
    u = (np.arange(k) + 0.5) / k
    for y, mu, sigma in [(0.0, 0.0, 1.0), (1.0, 0.3, 0.8)]:
        x = stats.norm.ppf(u, mu, sigma).astype(np.float32)
        got = float(pm.crps_ensemble(x, y))
        np.testing.assert_allclose(got, float(pm.crps_gaussian(y, mu, sigma)), atol=2e-3)
    np.testing.assert_allclose(float(pm.crps_ensemble(stats.norm.ppf(u).astype(np.float32), 0.0)), 0.2337, atol=1e-3)


def test_fair_crps_is_unbiased_for_the_gaussian_closed_form():
    # fair ensemble CRPS of K = 5 draws, averaged over R replicas, equals the closed form within 4 s.e.
    r, k, y = 20000, 5, 0.7
    x = np.random.default_rng(1).normal(size=(r, k)).astype(np.float32)
    vals = np.asarray(pm.crps_ensemble(x, jnp.full((r,), y), axis=1, fair=True), np.float64)
    se = vals.std() / math.sqrt(r)
    assert abs(vals.mean() - float(pm.crps_gaussian(y, 0.0, 1.0))) < 4 * se
    # the plain (K^2) estimator is biased upward by E|X - X'| / (2K) = (2 / sqrt(pi)) / (2K)
    plain = np.asarray(pm.crps_ensemble(x, jnp.full((r,), y), axis=1), np.float64)
    np.testing.assert_allclose(plain.mean() - vals.mean(), (2 / math.sqrt(math.pi)) / (2 * k), rtol=0.03)


def test_pit_ensemble_midpoint_random_ties_and_uniformity():
    x = jnp.array([0.0, 1.0, 1.0, 2.0])
    np.testing.assert_allclose(float(pm.pit_ensemble(x, 1.0)), (1 + 0.5 * 3) / 5)
    # random tie split: (1 + U 3) / 5 lies in [0.2, 0.8]
    u = pm.pit_ensemble(jnp.broadcast_to(x[:, None], (4, 500)), jnp.ones(500), key=jax.random.key(0, impl="rbg"))
    assert float(u.min()) >= 0.2 and float(u.max()) <= 0.8
    # calibrated ensembles (y from the same law as the K members): the rank of y is uniform on 0..K
    n, k = 3000, 9
    z = np.random.default_rng(2).normal(size=(k + 1, n)).astype(np.float32)
    ranks = np.rint(np.asarray(pm.pit_ensemble(z[:k], z[k])) * (k + 1) - 0.5).astype(int)
    assert stats.chisquare(np.bincount(ranks, minlength=k + 1)).pvalue > 1e-3
    # Gaussian PIT of its own draws is uniform too
    assert stats.kstest(np.asarray(pm.pit_gaussian(2.0 * z[0] + 1.0, 1.0, 2.0)), "uniform").pvalue > 1e-3
    # and a too-wide forecast piles PIT values in the middle
    assert stats.kstest(np.asarray(pm.pit_gaussian(z[0], 0.0, 3.0)), "uniform").pvalue < 1e-6


def test_pit_calibration_error_matches_brute_force():
    u = RNG.beta(2.0, 5.0, size=1000)
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    np.testing.assert_allclose(float(pm.pit_calibration_error(u, num_bins=10)),
                               np.abs(counts / 1000 - 0.1).mean(), atol=1e-6)


def test_interval_coverage_nominal_for_calibrated_forecasts():
    n, k, alpha = 5000, 100, 0.1
    z = np.random.default_rng(4).normal(size=(k, n)).astype(np.float32)
    y = np.random.default_rng(5).normal(size=n).astype(np.float32)
    cov = float(jnp.mean(pm.interval_coverage(z, y, alpha=alpha)))
    # (1 - alpha) up to the ensemble-quantile error (~1/K) and 4 binomial standard errors
    assert abs(cov - (1 - alpha)) < 4 * math.sqrt(alpha * (1 - alpha) / n) + 2.0 / k
    gcov = float(jnp.mean(pm.gaussian_interval_coverage(y, 0.0, 1.0, alpha=alpha)))
    assert abs(gcov - (1 - alpha)) < 4 * math.sqrt(alpha * (1 - alpha) / n)
    wrong = float(jnp.mean(pm.gaussian_interval_coverage(y, 0.0, 0.5, alpha=alpha)))
    assert abs(wrong - (2 * stats.norm.cdf(0.5 * 1.6449) - 1)) < 0.03  # too narrow: 2 Phi(0.82) - 1 = 0.59


@pytest.mark.parametrize("outside", ["discard", "merge"])
def test_qice_matches_the_reference_evaluation_code(outside):
    samples = RNG.normal(size=(50, 300)).astype(np.float32)  # K = 50 members, 300 targets
    y = (RNG.normal(size=300) * 1.3 + 0.2).astype(np.float32)
    got = float(pm.qice(samples, y, num_bins=10, outside=outside))
    np.testing.assert_allclose(got, _qice_brute(samples, y, 10, merge=outside == "merge"), atol=1e-6)


def test_qice_small_when_calibrated_large_when_shifted():
    k, n = 100, 20000
    x = np.random.default_rng(6).normal(size=(k, n)).astype(np.float32)
    y = np.random.default_rng(7).normal(size=n).astype(np.float32)
    good = float(pm.qice(x, y))
    # 2 / (K + 1) of the targets fall outside the ensemble range and are discarded: a floor of ~0.002
    assert good < 0.01
    assert float(pm.qice(x + 1.0, y)) > 0.05


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="sigma must be > 0"):
        pm.crps_gaussian(0.0, 0.0, jnp.array([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"y of shape \(3,\) does not broadcast"):
        pm.crps_ensemble(jnp.zeros((5, 4)), jnp.zeros(3))
    with pytest.raises(ValueError, match="fair=True needs >= 2 ensemble members, got 1"):
        pm.crps_ensemble(jnp.zeros((1, 4)), jnp.zeros(4), fair=True)
    with pytest.raises(ValueError, match="samples must have an ensemble axis"):
        pm.crps_ensemble(jnp.float32(1.0), 0.0)
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\), got 1.5"):
        pm.interval_coverage(jnp.zeros((5, 4)), jnp.zeros(4), alpha=1.5)
    with pytest.raises(ValueError, match="num_bins must be >= 1, got 0"):
        pm.qice(jnp.zeros((5, 4)), jnp.zeros(4), num_bins=0)
    with pytest.raises(ValueError, match="outside must be 'discard' or 'merge', got 'drop'"):
        pm.qice(jnp.zeros((5, 4)), jnp.zeros(4), outside="drop")
