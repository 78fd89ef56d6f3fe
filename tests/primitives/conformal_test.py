"""Tests of primitives.conformal: the exact conformal quantile, its finite-sample guarantee, CQR, APS/RAPS,
and the interval-stability reductions, each against an independent reference (exact rational arithmetic,
numpy float64, brute-force loops, Monte Carlo with tolerances from the number of trials)."""

from fractions import Fraction
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import conformal as cp


def _mc_tol(p, trials, z=3.0):
    return z * math.sqrt(p * (1 - p) / trials)


# ----------------------------------------------------------------------------------------------
# The conformal quantile.


def test_rank_matches_exact_rational_arithmetic():
    for n in (1, 2, 5, 8, 9, 10, 19, 99, 100, 799, 800, 1000):
        for a in ("0.01", "0.05", "0.1", "0.15", "0.2", "0.25", "0.3", "0.5", "0.9", "1", "0"):
            exact = math.ceil((n + 1) * (1 - Fraction(a)))
            assert int(cp.conformal_rank(n, float(a))) == exact, (n, a)


def test_rank_traced_matches_concrete():
    alphas = jnp.array([0.01, 0.05, 0.1, 0.2, 0.3, 0.5])
    traced = jax.jit(lambda a: cp.conformal_rank(799, a))(alphas)
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(cp.conformal_rank(799, np.asarray(alphas))))


def test_quantile_index_edge_cases():
    s = jnp.array([3.0, 1.0, 4.0, 1.5, 9.0, 2.0, 6.0, 5.0, 3.5])   # n = 9
    assert float(cp.conformal_quantile(s, 0.1)) == 9.0               # ceil(10 * .9) = 9 -> the maximum
    assert float(cp.conformal_quantile(s[:8], 0.1)) == np.inf        # n = 8 < 1/alpha - 1 = 9
    assert float(cp.conformal_quantile(s, 1.0)) == -np.inf           # k = 0: the empty set
    # n < 1/alpha - 1 <=> infinite radius (no index error), on both sides of each boundary
    # (alpha = .3: 2|3, .2: 3|4, .1: 8|9, .05: 18|19).
    alphas = np.array([0.05, 0.1, 0.2, 0.3])
    for n in (1, 2, 3, 4, 8, 9, 18, 19):
        q = np.asarray(cp.conformal_quantile(jnp.arange(n, dtype=jnp.float32), alphas))
        np.testing.assert_array_equal(q == np.inf, n < 1 / alphas - 1 - 1e-9, err_msg=str(n))
        finite = q != np.inf
        np.testing.assert_array_equal(q[finite], (cp.conformal_rank(n, alphas) - 1)[finite])  # k-th smallest


def test_quantile_matches_numpy_float64_both_readings():
    rng = np.random.default_rng(0)
    s = rng.standard_normal(137)
    alphas = np.array([0.02, 0.1, 0.33, 0.5, 0.9])
    n = s.size
    ks = np.array([math.ceil((n + 1) * (1 - Fraction(str(a)))) for a in alphas])
    exact = np.sort(s)[ks - 1]
    perc = np.percentile(s, 100 * ks / n)  # the paper code's reading (linear interpolation)
    got_exact = np.asarray(cp.conformal_quantile(jnp.asarray(s, jnp.float32), alphas))
    got_perc = np.asarray(cp.conformal_quantile(jnp.asarray(s, jnp.float32), alphas, method="percentile"))
    np.testing.assert_allclose(got_exact, exact, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_perc, perc, rtol=1e-5, atol=1e-5)
    assert np.all(got_perc >= got_exact - 1e-6)


def test_quantile_argument_errors():
    with pytest.raises(ValueError, match="alpha"):
        cp.conformal_quantile(jnp.ones(5), 1.5)
    with pytest.raises(ValueError, match="method"):
        cp.conformal_quantile(jnp.ones(5), 0.1, method="nearest")
    with pytest.raises(ValueError, match="scores"):
        cp.conformal_quantile(jnp.ones((5, 2)), 0.1)
    with pytest.raises(ValueError, match="alpha"):
        cp.split_conformal_interval(jnp.ones(5), jnp.ones(5), jnp.ones(3), alpha=jnp.array([0.1, 0.2]))


@pytest.mark.parametrize("n,alpha", [(10, 0.1), (40, 0.2)])
def test_split_conformal_finite_sample_coverage_monte_carlo(n, alpha):
    """Fresh exchangeable calibration + test draw per trial: coverage = k/(n+1) >= 1 - alpha exactly.

    Data come from numpy's generator (heavy-tailed t(3) noise, a misspecified predictor)."""
    trials = 20_000
    k = math.ceil((n + 1) * (1 - Fraction(str(alpha))))
    target = k / (n + 1)
    assert target >= 1 - alpha
    rng = np.random.default_rng(n)
    x = rng.standard_normal((trials, n + 1))
    y = jnp.asarray(2.0 * x + rng.standard_t(3.0, (trials, n + 1)), jnp.float32)
    pred = jnp.asarray(1.5 * x, jnp.float32)                 # misspecified: validity does not care

    def trial(pred, y):
        lo, hi = cp.split_conformal_interval(pred[:n], y[:n], pred[n:], alpha=alpha)
        return cp.interval_covers(lo, hi, y[n:])[0]

    cov = float(jnp.mean(jax.jit(jax.vmap(trial))(pred, y)))
    tol = _mc_tol(target, trials)
    assert abs(cov - target) <= tol, (cov, target, tol)
    assert cov >= 1 - alpha - _mc_tol(1 - alpha, trials)


def test_too_small_calibration_gives_full_coverage():
    lo, hi = cp.split_conformal_interval(jnp.zeros(5), jnp.ones(5), jnp.zeros(3), alpha=0.1)
    assert np.all(np.isinf(np.asarray(lo))) and np.all(np.isinf(np.asarray(hi)))
    assert np.all(np.asarray(cp.interval_covers(lo, hi, jnp.array([1e30, -1e30, 0.0]))))
    assert np.all(np.isinf(np.asarray(cp.interval_length(lo, hi))))


# ----------------------------------------------------------------------------------------------
# CQR.


def test_cqr_scores_and_interval_match_numpy():
    rng = np.random.default_rng(1)
    lo, hi, y = rng.normal(-1, 0.3, 50), rng.normal(1, 0.3, 50), rng.normal(0, 1.2, 50)
    s = np.maximum(lo - y, y - hi)
    np.testing.assert_allclose(np.asarray(cp.cqr_scores(lo, hi, y)), s, rtol=1e-6, atol=1e-6)
    k = math.ceil(51 * 0.9)
    q = np.sort(s)[k - 1]
    tl, th = rng.normal(-1, 0.1, 7), rng.normal(1, 0.1, 7)
    got_lo, got_hi = cp.cqr_interval(lo, hi, y, tl, th, alpha=0.1)
    np.testing.assert_allclose(np.asarray(got_lo), tl - q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_hi), th + q, rtol=1e-5, atol=1e-6)


def test_cqr_coverage_monte_carlo():
    n, alpha, trials = 29, 0.1, 20_000
    target = math.ceil((n + 1) * (1 - alpha)) / (n + 1)

    rng = np.random.default_rng(5)
    x = rng.uniform(size=(trials, n + 1))
    y = jnp.asarray(x + (0.2 + x) * rng.standard_normal((trials, n + 1)), jnp.float32)   # heteroscedastic
    x = jnp.asarray(x, jnp.float32)

    def trial(x, y):
        lo_p, hi_p = x - 0.5, x + 0.5                          # a poor constant-width band
        lo, hi = cp.cqr_interval(lo_p[:n], hi_p[:n], y[:n], lo_p[n:], hi_p[n:], alpha=alpha)
        return cp.interval_covers(lo, hi, y[n:])[0]

    cov = float(jnp.mean(jax.jit(jax.vmap(trial))(x, y)))
    assert abs(cov - target) <= _mc_tol(target, trials), (cov, target)


def test_interval_length_empty_and_point():
    assert float(cp.interval_length(jnp.array(2.0), jnp.array(1.0))) == 0.0
    assert float(cp.interval_length(jnp.array(1.0), jnp.array(1.0))) == 0.0
    assert float(cp.interval_length(jnp.array(jnp.inf), jnp.array(-jnp.inf))) == 0.0


# ----------------------------------------------------------------------------------------------
# APS / RAPS.


def _brute_raps(probs, u, lam, k_reg):
    m, k = probs.shape
    out = np.zeros((m, k))
    for i in range(m):
        order = sorted(range(k), key=lambda j: (-probs[i, j], j))
        for rank, j in enumerate(order, start=1):
            above = sum(probs[i, order[r]] for r in range(rank - 1))
            out[i, j] = above + u[i] * probs[i, j] + lam * max(rank - k_reg, 0)
    return out


def test_raps_label_scores_match_brute_force():
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.ones(6), size=12)
    probs[0] = [0.25, 0.25, 0.2, 0.1, 0.1, 0.1]                  # ties broken by label index
    u = rng.uniform(size=12)
    for lam, k_reg in ((0.0, 0), (0.1, 2), (0.5, 0)):
        got = np.asarray(cp.raps_label_scores(jnp.asarray(probs, jnp.float32), jnp.asarray(u), lam=lam, k_reg=k_reg))
        np.testing.assert_allclose(got, _brute_raps(probs, u, lam, k_reg), atol=1e-6)


def _synthetic_classifier(rng, shape, k=8):
    """Softmax of N(0, 4) logits; labels drawn from softmax(0.6 logits): an overconfident model (numpy)."""
    logits = 2.0 * rng.standard_normal(shape + (k,))
    labels = np.argmax(0.6 * logits + rng.gumbel(size=logits.shape), axis=-1)   # Gumbel-max sampling
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return jnp.asarray(probs / probs.sum(-1, keepdims=True), jnp.float32), jnp.asarray(labels, jnp.int32)


RAPS_CASES = ((0.05, 1, True), (0.0, 0, False))   # randomized RAPS, non-randomized APS (lam = 0)


def test_aps_raps_coverage_monte_carlo():
    n, alpha, trials = 19, 0.1, 10_000
    target = math.ceil((n + 1) * (1 - alpha)) / (n + 1)
    probs, labels = _synthetic_classifier(np.random.default_rng(7), (trials, n + 1))
    keys = jax.random.split(jax.random.PRNGKey(7), trials)

    def trial(probs, labels, key):
        kc, kt = jax.random.split(key)
        out = []
        for lam, k_reg, randomized in RAPS_CASES:
            s = cp.raps_scores(probs[:n], labels[:n], kc, lam=lam, k_reg=k_reg, randomized=randomized)
            q = cp.conformal_quantile(s, alpha)
            sets = cp.raps_sets(probs[n:], q, kt, lam=lam, k_reg=k_reg, randomized=randomized)
            out.append((cp.set_covers(sets, labels[n:])[0], cp.set_size(sets)[0]))
        return out

    results = jax.jit(jax.vmap(trial))(probs, labels, keys)
    tol = _mc_tol(target, trials)
    for (lam, k_reg, randomized), (cov, size) in zip(RAPS_CASES, results):
        cov = float(jnp.mean(cov))
        # The true label's score is continuous (randomized or not) and exchangeable with the calibration
        # scores, so coverage is exactly k / (n + 1) >= 1 - alpha.
        assert abs(cov - target) <= tol, (lam, k_reg, randomized, cov, target)
        assert 1.0 <= float(jnp.mean(size)) < 8.0


def test_raps_sets_monotone_in_level_and_zero_set_option():
    probs, _ = _synthetic_classifier(np.random.default_rng(3), (200,))
    key = jax.random.PRNGKey(4)
    small = cp.raps_sets(probs, 0.3, key, lam=0.01, k_reg=1)
    large = cp.raps_sets(probs, 0.9, key, lam=0.01, k_reg=1)
    assert np.all(np.asarray(large) >= np.asarray(small))
    empty = cp.aps_sets(probs, -1.0, key)
    assert float(jnp.sum(empty)) == 0.0
    top = cp.aps_sets(probs, -1.0, key, allow_zero_sets=False)
    np.testing.assert_array_equal(np.asarray(jnp.argmax(top, 1)), np.asarray(jnp.argmax(probs, 1)))
    assert np.all(np.asarray(cp.set_size(top)) == 1.0)
    with pytest.raises(ValueError, match="key"):
        cp.raps_sets(probs, 0.5, None, randomized=True)
    with pytest.raises(ValueError, match="probs"):
        cp.raps_sets(probs[0], 0.5, key)


# ----------------------------------------------------------------------------------------------
# Interval stability.


def test_interval_stability_reductions_match_numpy():
    rng = np.random.default_rng(3)
    sizes = rng.exponential(size=(50, 13))
    r = sizes.shape[0]
    var0, var1 = np.var(sizes, axis=0), np.var(sizes, axis=0, ddof=1)
    np.testing.assert_allclose(float(cp.interval_stability(sizes, ddof=1)), var1.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(cp.interval_stability(sizes, reduction="std")), np.sqrt(var0).mean(), rtol=1e-5)
    np.testing.assert_allclose(float(cp.interval_stability(sizes, reduction="sem", ddof=1)),
                               (np.sqrt(var1) / np.sqrt(r)).mean(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(cp.interval_stability(sizes, per_point=True)), var0, rtol=1e-5)


def test_interval_stability_exactly_zero_for_constant_sizes():
    const = jnp.tile(jnp.array([[0.1, 3.7, 1e7, jnp.inf, 0.0]]), (40, 1)) * 1.0
    for reduction in cp.STABILITY_REDUCTIONS:
        assert float(cp.interval_stability(const, reduction=reduction)) == 0.0
    mixed = jnp.array([[1.0], [jnp.inf]])
    assert float(cp.interval_stability(mixed)) == np.inf
    with pytest.raises(ValueError, match="reduction"):
        cp.interval_stability(const, reduction="mad")
    with pytest.raises(ValueError, match="sizes"):
        cp.interval_stability(jnp.ones(4))


def test_rerun_sizes_vmaps_over_keys():
    sizes = cp.rerun_sizes(lambda k: jax.random.bernoulli(k, 0.5, (6,)).astype(jnp.float32),
                           jax.random.PRNGKey(0), num_runs=2000)
    assert sizes.shape == (2000, 6)
    # Bernoulli(1/2) sizes: variance 1/4 per point; 12k draws -> SE of the mean variance ~ 1e-3.
    assert abs(float(cp.interval_stability(sizes)) - 0.25) < 0.01
