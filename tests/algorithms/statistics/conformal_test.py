"""Tests of algorithms.statistics.conformal: the Prejudicial Trick keeps coverage (Thm. 3.3), equals the base
method bitwise at p = 1, has interval stability p(1-p)E[L^2] (Prop. 4.2) while deterministic methods have 0,
the closed-form success (Example 3) and failure (Example 4) cases, and the length criteria (Lemma 3.6,
Thms. 3.7 and 3.10). References are closed forms (scipy float64) and Monte Carlo with tolerances from the
number of trials."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from algorithms.statistics import conformal as C
from primitives import conformal as cp


def _se(p, trials):
    return math.sqrt(p * (1 - p) / trials)


# ----------------------------------------------------------------------------------------------
# Levels.


def test_pt_alpha_prime_formula_and_errors():
    for alpha in (0.05, 0.1, 0.2):
        for p in (0.96, 0.97, 0.99):
            assert C.pt_alpha_prime(alpha, p) == pytest.approx(1 - (1 - alpha) / p, abs=1e-15)
            assert p * (1 - C.pt_alpha_prime(alpha, p)) == pytest.approx(1 - alpha, abs=1e-15)
    assert C.pt_alpha_prime(0.1, 1.0) == 0.1          # exactly, so that p = 1 is the base method
    for bad in (0.9, 0.5, 1.01):
        with pytest.raises(ValueError, match="p must"):
            C.pt_alpha_prime(0.1, bad)
    with pytest.raises(ValueError, match="alpha"):
        C.pt_alpha_prime(1.2, 0.99)


def test_relaxed_levels_average_to_alpha():
    lo, hi = C.relaxed_pt_levels(0.1, 0.96, 0.99)
    assert lo == 0.99 and (1 - 0.96) * lo + 0.96 * hi == pytest.approx(0.1, abs=1e-15)
    with pytest.raises(ValueError, match="alpha_low"):
        C.relaxed_pt_levels(0.1, 0.5, 0.99)   # (1 - p) alpha_low > alpha
    with pytest.raises(ValueError, match="alpha_low"):
        C.relaxed_pt_levels(0.1, 0.96, 0.05)


# ----------------------------------------------------------------------------------------------
# Coverage (Thm. 3.3).


N_CAL, N_TRIALS = 199, 20_000


def _scores_problem(rng, shape):
    """Exchangeable regression data with a misspecified predictor x (bimodal residuals), from numpy."""
    x = rng.standard_normal(shape)
    y = x + 4.0 * rng.choice([-1.0, 1.0], shape) + rng.standard_normal(shape)
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)   # predictor: x


@pytest.fixture(scope="module")
def coverage_trials():
    """20k trials, each a fresh calibration set and one test point: marginal coverage of VCP, PT, relaxed PT."""
    alpha, p = 0.1, 0.95
    xs, ys = _scores_problem(np.random.default_rng(0), (N_TRIALS, N_CAL + 1))

    def trial(x, y, key):
        kpt, krel = jax.random.split(key)
        lo, hi = cp.split_conformal_interval(x[:N_CAL], y[:N_CAL], x[N_CAL:], alpha=alpha)
        base = cp.interval_covers(lo, hi, y[N_CAL:])[0]
        pt = C.pt_split_conformal(x[:N_CAL], y[:N_CAL], x[N_CAL:], kpt, alpha=alpha, p=p)
        rel = C.pt_split_conformal(x[:N_CAL], y[:N_CAL], x[N_CAL:], krel, alpha=alpha, p=p, alpha_low=0.99)
        return base, cp.interval_covers(*pt.sets, y[N_CAL:])[0], cp.interval_covers(*rel.sets, y[N_CAL:])[0]

    out = jax.jit(jax.vmap(trial))(xs, ys, jax.random.split(jax.random.PRNGKey(0), N_TRIALS))
    return alpha, p, [np.asarray(o, np.float64) for o in out]


def test_pt_coverage_equals_base_within_3_standard_errors(coverage_trials):
    alpha, p, (base, pt, rel) = coverage_trials
    se = math.sqrt(base.var() / N_TRIALS + pt.var() / N_TRIALS)
    assert abs(pt.mean() - base.mean()) <= 3 * se, (pt.mean(), base.mean(), se)
    # Each against its exact finite-sample value: k/(n+1) for VCP and p k'/(n+1) for PT.
    k = math.ceil((N_CAL + 1) * (1 - alpha) - 1e-9)
    k_prime = math.ceil((N_CAL + 1) * (1 - C.pt_alpha_prime(alpha, p)) - 1e-9)
    assert abs(base.mean() - k / (N_CAL + 1)) <= 3 * _se(k / (N_CAL + 1), N_TRIALS)
    assert abs(pt.mean() - p * k_prime / (N_CAL + 1)) <= 3 * _se(1 - alpha, N_TRIALS)
    # Relaxed trick: (1 - p) k_low/(n+1) + p k_high/(n+1), with (1 - p) alpha_low + p alpha_high = alpha.
    a_low, a_high = C.relaxed_pt_levels(alpha, p, 0.99)
    k_low, k_high = (math.ceil((N_CAL + 1) * (1 - a) - 1e-9) for a in (a_low, a_high))
    exact_rel = ((1 - p) * k_low + p * k_high) / (N_CAL + 1)
    assert abs(exact_rel - (1 - alpha)) <= 1 / (N_CAL + 1)
    assert abs(rel.mean() - exact_rel) <= 3 * _se(exact_rel, N_TRIALS), (rel.mean(), exact_rel)


def test_pt_coverage_conditional_on_calibration_closed_form():
    """Fixed calibration set: PT coverage over 20k test points is p F(q_alpha') with F known in closed form."""
    alpha, p, n, m = 0.1, 0.96, 400, 20_000
    rng = np.random.default_rng(1)
    cal_y = jnp.asarray(rng.standard_normal(n), jnp.float32)   # predictor 0, scores |N(0,1)|: F(r) = 2 Phi(r) - 1
    test_y = jnp.asarray(rng.standard_normal(m), jnp.float32)
    res = C.pt_split_conformal(jnp.zeros(n), cal_y, jnp.zeros(m), jax.random.PRNGKey(1), alpha=alpha, p=p)
    q_prime = float(cp.conformal_quantile(jnp.abs(cal_y), C.pt_alpha_prime(alpha, p)))
    expected = p * (2 * stats.norm.cdf(q_prime) - 1)
    cov = float(jnp.mean(cp.interval_covers(*res.sets, test_y)))
    assert abs(cov - expected) <= 3 * _se(expected, m), (cov, expected)
    assert abs(float(jnp.mean(res.accepted)) - p) <= 3 * _se(p, m)


def _classifier(rng, shape, k):
    """Softmax of N(0, 4) logits; labels from softmax(0.5 logits) by Gumbel-max (numpy): overconfident."""
    logits = 2.0 * rng.standard_normal(shape + (k,))
    labels = np.argmax(0.5 * logits + rng.gumbel(size=logits.shape), axis=-1)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return jnp.asarray(probs / probs.sum(-1, keepdims=True), jnp.float32), jnp.asarray(labels, jnp.int32)


def test_pt_raps_coverage_equals_raps():
    n, alpha, p, trials, k = 19, 0.1, 0.95, 20_000, 6
    probs, labels = _classifier(np.random.default_rng(2), (trials, n + 1), k)

    def trial(probs, labels, key):
        kc, kt, kpt = jax.random.split(key, 3)
        s = cp.raps_scores(probs[:n], labels[:n], kc, lam=0.02, k_reg=1)
        base = cp.raps_sets(probs[n:], cp.conformal_quantile(s, alpha), kt, lam=0.02, k_reg=1)
        pt = C.pt_raps(s, probs[n:], kpt, alpha=alpha, p=p, lam=0.02, k_reg=1, allow_zero_sets=True)
        return cp.set_covers(base, labels[n:])[0], cp.set_covers(pt.sets, labels[n:])[0]

    base, pt = (np.asarray(a, np.float64) for a in jax.jit(jax.vmap(trial))(
        probs, labels, jax.random.split(jax.random.PRNGKey(2), trials)))
    se = math.sqrt(base.var() / trials + pt.var() / trials)
    assert abs(pt.mean() - base.mean()) <= 3 * se, (pt.mean(), base.mean())
    # Both against their exact values: k/(n+1) and p k'/(n+1) (continuous randomized scores).
    k_rank = math.ceil((n + 1) * (1 - alpha) - 1e-9)
    k_prime = math.ceil((n + 1) * (1 - C.pt_alpha_prime(alpha, p)) - 1e-9)
    assert abs(base.mean() - k_rank / (n + 1)) <= 3 * _se(k_rank / (n + 1), trials)
    assert abs(pt.mean() - p * k_prime / (n + 1)) <= 3 * _se(p * k_prime / (n + 1), trials)


# ----------------------------------------------------------------------------------------------
# p = 1 and randomness hygiene.


def test_p_equal_one_is_bitwise_the_base_method():
    x, y = _scores_problem(np.random.default_rng(3), (300,))
    key = jax.random.PRNGKey(4)
    vcp = cp.split_conformal_interval(x[:200], y[:200], x[200:], alpha=0.1)
    pt = C.pt_split_conformal(x[:200], y[:200], x[200:], key, alpha=0.1, p=1.0)
    for a, b in zip(vcp, pt.sets):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(cp.interval_covers(*vcp, y[200:])),
                                  np.asarray(cp.interval_covers(*pt.sets, y[200:])))
    probs, labels = _classifier(np.random.default_rng(4), (300,), 5)
    s = cp.raps_scores(probs[:200], labels[:200], key, lam=0.1, k_reg=1)
    _, k_base = jax.random.split(key)
    raps = cp.raps_sets(probs[200:], cp.conformal_quantile(s, 0.1), k_base, lam=0.1, k_reg=1, allow_zero_sets=False)
    ptr = C.pt_raps(s, probs[200:], key, alpha=0.1, p=1.0, lam=0.1, k_reg=1)
    np.testing.assert_array_equal(np.asarray(raps), np.asarray(ptr.sets))


def test_same_key_same_sets_different_key_different_sets():
    x, y = _scores_problem(np.random.default_rng(5), (300,))
    run = lambda k: C.pt_split_conformal(x[:200], y[:200], x[200:], k, alpha=0.1, p=0.95)
    a, b, c = run(jax.random.PRNGKey(6)), run(jax.random.PRNGKey(6)), run(jax.random.PRNGKey(7))
    np.testing.assert_array_equal(np.asarray(a.sets[0]), np.asarray(b.sets[0]))
    np.testing.assert_array_equal(np.asarray(a.accepted), np.asarray(b.accepted))
    assert not np.array_equal(np.asarray(a.accepted), np.asarray(c.accepted))
    # Typed keys work as well.
    d = run(jax.random.key(6))
    assert d.accepted.shape == (100,)


# ----------------------------------------------------------------------------------------------
# Interval stability (Prop. 4.2).


def test_interval_stability_pt_matches_closed_form_and_deterministic_is_zero():
    alpha, p, n, m, runs = 0.2, 0.9, 300, 50, 2000
    x, y = _scores_problem(np.random.default_rng(8), (n + m,))
    cal_x, cal_y, test_x = x[:n], y[:n], x[n:]
    # CQR base with x-dependent band widths, so E[L^2] averages over inputs.
    width = 1.0 + jnp.abs(x)
    lo_c, hi_c, lo_t, hi_t = cal_x - width[:n], cal_x + width[:n], test_x - width[n:], test_x + width[n:]
    L = cp.interval_length
    methods = {   # name -> (size function of the run's key, number of re-runs)
        "pt_vcp": (lambda k: L(*C.pt_split_conformal(cal_x, cal_y, test_x, k, alpha=alpha, p=p).sets), runs),
        "pt_cqr": (lambda k: L(*C.pt_cqr(lo_c, hi_c, cal_y, lo_t, hi_t, k, alpha=alpha, p=p).sets), runs),
        "vcp": (lambda k: L(*cp.split_conformal_interval(cal_x, cal_y, test_x, alpha=alpha)), 20),
        "cqr": (lambda k: L(*cp.cqr_interval(lo_c, hi_c, cal_y, lo_t, hi_t, alpha=alpha)), 20),
    }
    sizes = jax.jit(lambda k: {nm: cp.rerun_sizes(fn, k, num_runs=r) for nm, (fn, r) in methods.items()})(
        jax.random.PRNGKey(10))
    a_prime = C.pt_alpha_prime(alpha, p)
    base_at_a_prime = {"pt_vcp": L(*cp.split_conformal_interval(cal_x, cal_y, test_x, alpha=a_prime)),
                       "pt_cqr": L(*cp.cqr_interval(lo_c, hi_c, cal_y, lo_t, hi_t, alpha=a_prime))}
    for name, base_len in base_at_a_prime.items():         # Prop. 4.2: p (1 - p) E_X[L(X, q/p)^2]
        expected = C.pt_interval_stability(base_len, p)
        assert expected > 0
        got = float(cp.interval_stability(sizes[name]))
        assert abs(got - expected) <= 0.05 * expected, (name, got, expected)
    for name in ("vcp", "cqr"):   # (classification: the experiment's stability study)
        for reduction in cp.STABILITY_REDUCTIONS:
            assert float(cp.interval_stability(sizes[name], reduction=reduction)) == 0.0, name


# ----------------------------------------------------------------------------------------------
# Length theory: closed-form success (Example 3) and failure (Example 4), and the criteria.


P_GRID = np.linspace(0.0, 1.0, 41)[1:-1]


def test_example3_success_closed_form_and_monte_carlo():
    for alpha in (0.05, 0.1, 0.2, 0.3):
        q = 1 - alpha
        ps = q + (1 - q) * P_GRID
        np.testing.assert_allclose(C.sqrt_score_length(q), 2 * np.sqrt(q))
        pt_len = C.pt_expected_length(C.sqrt_score_length, alpha, ps)
        np.testing.assert_allclose(pt_len, 2 * np.sqrt(ps * q), rtol=1e-12)
        assert np.all(pt_len < 2 * np.sqrt(q))
    # Monte Carlo: scores S = sqrt(U) have P(S <= r) = r^2.
    alpha, p, n, m = 0.1, 0.95, 20_000, 20_000
    rng = np.random.default_rng(9)
    cal_y = jnp.asarray(rng.choice([-1.0, 1.0], n) * np.sqrt(rng.uniform(size=n)), jnp.float32)
    res = C.pt_split_conformal(jnp.zeros(n), cal_y, jnp.zeros(m), jax.random.PRNGKey(9), alpha=alpha, p=p)
    mc_pt = float(jnp.mean(cp.interval_length(*res.sets)))
    mc_vcp = float(jnp.mean(cp.interval_length(*cp.split_conformal_interval(jnp.zeros(n), cal_y, jnp.zeros(m),
                                                                            alpha=alpha))))
    analytic = 2 * math.sqrt(p * (1 - alpha))
    assert abs(mc_pt - analytic) <= 0.01 * analytic, (mc_pt, analytic)
    assert abs(mc_vcp - 2 * math.sqrt(1 - alpha)) <= 0.01 * 2 * math.sqrt(1 - alpha)
    assert mc_pt < mc_vcp


def test_example4_failure_gaussian_closed_form_and_monte_carlo():
    for alpha in np.linspace(0.01, 0.5, 25):
        ps = (1 - alpha) + alpha * P_GRID
        a_prime = 1 - (1 - alpha) / ps
        pt_len = 2 * ps * stats.norm.ppf(1 - a_prime / 2)                       # written out from the paper
        assert np.all(pt_len > 2 * stats.norm.ppf(1 - alpha / 2)), alpha
        np.testing.assert_allclose(C.pt_expected_length(C.folded_normal_length, float(alpha), ps), pt_len, rtol=1e-10)
    alpha, p, n, m = 0.1, 0.95, 20_000, 20_000
    cal_y = jnp.asarray(np.random.default_rng(10).standard_normal(n), jnp.float32)
    res = C.pt_split_conformal(jnp.zeros(n), cal_y, jnp.zeros(m), jax.random.PRNGKey(10), alpha=alpha, p=p)
    vcp = cp.split_conformal_interval(jnp.zeros(n), cal_y, jnp.zeros(m), alpha=alpha)
    assert float(jnp.mean(cp.interval_length(*res.sets))) > float(jnp.mean(cp.interval_length(*vcp)))


def _curves():
    return {
        "sqrt": C.sqrt_score_length,
        "gauss": C.folded_normal_length,
        **{f"mix{mu}": functools.partial(C.folded_normal_length, mu=float(mu)) for mu in (2, 5, 10)},
        "power0.5": lambda u: np.asarray(u, np.float64) ** 0.5,
        "power2": lambda u: np.asarray(u, np.float64) ** 2,
    }


def test_lemma_and_secant_criteria_agree_and_first_order_is_sufficient():
    for alpha in (0.05, 0.2):
        q = 1 - alpha
        ps = q + (1 - q) * np.linspace(0, 1, 202)[1:-1]
        us = q / ps
        for name, G in _curves().items():
            lemma = C.pt_improves_length(G, alpha, p_grid=ps)
            secant = C.secant_criterion(G, alpha, u_grid=us)
            assert lemma.holds == secant.holds, (name, alpha, lemma, secant)
            first = C.first_order_criterion(G, alpha)
            fine = C.pt_improves_length(G, alpha, p_grid=1 - np.geomspace(1e-6, alpha * 0.999, 200))
            if first.holds:                      # Thm. 3.7: then some p < 1 is shorter
                assert fine.holds, (name, alpha)
            if secant.holds:                     # Thm. 3.10: p = q/u is shorter
                assert C.pt_expected_length(G, alpha, secant.p) < G(q)
    # Concave G (Cor. 3.8) always passes; the Gaussian (convex) never does; the mixture crosses over in mu.
    assert C.first_order_criterion(C.sqrt_score_length, 0.1).holds
    assert not C.first_order_criterion(C.folded_normal_length, 0.1).holds
    assert not C.pt_improves_length(C.folded_normal_length, 0.1).holds
    assert C.pt_improves_length(functools.partial(C.folded_normal_length, mu=10.0), 0.1).holds


def test_first_order_finite_difference_matches_analytic_derivative():
    fd = C.first_order_criterion(C.sqrt_score_length, 0.2)
    an = C.first_order_criterion(C.sqrt_score_length, 0.2, dG=lambda u: 1 / np.sqrt(u))
    assert fd.slope == pytest.approx(an.slope, rel=1e-6) and fd.holds == an.holds


def test_subgroup_coverage_gap_remark_3_5():
    """Fixed calibration, two subgroups: PT minus VCP coverage on each equals Remark 3.5's formula (MC, 3 SE).

    Group A has unit noise, group B sd 3; the calibration fold mixes them, so VCP over-covers A and
    under-covers B. f_g(level) = 2 (1 - Phi(q_hat(level) / sd_g)) uses the realized finite-n radius
    q_hat (the exact ceil((n + 1)(1 - level))-th calibration score), so the expected coverage on each
    group is exact given the calibration set; what is left is Monte Carlo over the test labels and PT's U.
    """
    alpha, p, n, m = 0.1, 0.95, 2000, 40_000
    rng = np.random.default_rng(11)
    sd = np.array([1.0, 3.0])
    cal_y = sd[rng.integers(0, 2, n)] * rng.standard_normal(n)
    g_test = rng.integers(0, 2, m)
    test_y = jnp.asarray(sd[g_test] * rng.standard_normal(m), jnp.float32)
    cal_y = jnp.asarray(cal_y, jnp.float32)
    res = C.pt_split_conformal(jnp.zeros(n), cal_y, jnp.zeros(m), jax.random.PRNGKey(11), alpha=alpha, p=p)
    d = np.asarray(cp.interval_covers(*res.sets, test_y), np.float64) - np.asarray(
        cp.interval_covers(*cp.split_conformal_interval(jnp.zeros(n), cal_y, jnp.zeros(m), alpha=alpha), test_y),
        np.float64)
    a_prime = C.pt_alpha_prime(alpha, p)
    q = {lv: float(cp.conformal_quantile(jnp.abs(cal_y), lv)) for lv in (alpha, a_prime)}
    gaps = []
    for g in (0, 1):
        f_g = lambda level: 2.0 * stats.norm.sf(q[level] / sd[g])
        gap = C.pt_subgroup_coverage_gap(f_g, alpha, p)
        # The formula is PT's coverage p (1 - f(alpha')) minus the base's 1 - f(alpha).
        assert gap == pytest.approx(p * (1 - f_g(a_prime)) - (1 - f_g(alpha)), abs=1e-12)
        dg = d[g_test == g]
        se = dg.std(ddof=1) / math.sqrt(dg.size)
        assert abs(dg.mean() - gap) <= 3 * se, (g, dg.mean(), gap, se)
        gaps.append(gap)
    # Marginal coverage is kept, but not on subgroups: the over-covered group loses, the other gains.
    assert gaps[0] < -0.04 and gaps[1] > 0.01, gaps


# ----------------------------------------------------------------------------------------------
# Experiment helpers.


def test_fit_linear_matches_numpy_lstsq():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(80, 3)), rng.normal(size=80)
    ref = np.linalg.lstsq(np.column_stack([x, np.ones(80)]), y, rcond=None)[0]
    np.testing.assert_allclose(np.asarray(C.fit_linear(x, y)), ref, atol=1e-4)
    coef = C.fit_linear_quantiles(x, y + x[:, 0], (0.1, 0.9), steps=300)
    pred = np.asarray(C.predict_linear(coef, jnp.asarray(x, jnp.float32)))
    frac_below = (y + x[:, 0] <= pred).mean(axis=1)
    assert abs(frac_below[0] - 0.1) < 0.06 and abs(frac_below[1] - 0.9) < 0.06
