"""Tests of algorithms.agents.calculus_grading against independent references.

QWK against scikit-learn and a pairwise closed form; Krippendorff's alpha against Krippendorff's (2011)
worked example and a brute-force pairable-values definition; ICC against Shrout & Fleiss (1979);
Grubbs error variances against the three-rater closed form and Monte Carlo; the t interval against
scipy's one-sample t test; the term algebra against finite differences; aggregation on hand cases.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import cohen_kappa_score

from algorithms.agents import calculus_grading as cg

# ------------------------------------------------------------------------------------ agreement


@pytest.mark.parametrize("seed", range(5))
def test_qwk_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 11, size=60)
    b = np.clip(a + rng.integers(-3, 4, size=60), 0, 10)
    grid = np.arange(11)
    ours = cg.quadratic_weighted_kappa(a, b, categories=grid)
    ref = cohen_kappa_score(a, b, weights="quadratic", labels=grid)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
    # Default categories: the observed values, as scikit-learn's default labels.
    np.testing.assert_allclose(cg.quadratic_weighted_kappa(a, b), cohen_kappa_score(a, b, weights="quadratic"),
                               rtol=1e-12, atol=1e-12)


def test_qwk_brute_force_pairwise_closed_form():
    # For an evenly spaced grid, QWK = 1 - mean_i (a_i - b_i)^2 / mean_{i,j} (a_i - b_j)^2.
    for a, b in [([0, 1, 2], [0, 2, 2]), ([3, 1, 0, 2], [2, 1, 1, 3]), ([0, 0, 1, 5], [1, 0, 4, 5])]:
        a, b = np.array(a, float), np.array(b, float)
        brute = 1 - np.mean((a - b) ** 2) / np.mean((a[:, None] - b[None, :]) ** 2)
        grid = np.arange(0, 6)
        np.testing.assert_allclose(cg.quadratic_weighted_kappa(a, b, categories=grid), brute, rtol=1e-12)


def test_perfect_grader_kappa_and_agreement_one_and_symmetry():
    a = np.array([0, 3, 5, 10, 10, 7])
    assert cg.quadratic_weighted_kappa(a, a, categories=np.arange(11)) == 1.0
    assert cg.exact_agreement(a, a) == 1.0 and cg.within_agreement(a, a, 0) == 1.0
    assert cg.quadratic_weighted_kappa([4, 4, 4], [4, 4, 4]) == 1.0  # constant and identical
    b = np.array([1, 3, 4, 10, 8, 7])
    assert cg.quadratic_weighted_kappa(a, b) == pytest.approx(cg.quadratic_weighted_kappa(b, a))
    rep = cg.agreement_report(a, a, categories=np.arange(11), groups=["p", "q"] * 3)
    assert rep["exact"] == rep["within"] == rep["qwk"] == 1.0 and rep["mae"] == rep["bias"] == 0.0
    assert set(rep["per_group"]) == {"p", "q"}


def test_qwk_independent_ratings_near_zero():
    rng = np.random.default_rng(0)
    n = 20000
    a, b = rng.integers(0, 11, n), rng.integers(0, 11, n)
    # Under independence kappa has mean ~0 and sd ~ 1/sqrt(n); 5 sd tolerance.
    assert abs(cg.quadratic_weighted_kappa(a, b, categories=np.arange(11))) < 5 / math.sqrt(n)


def test_within_agreement_monotone_and_exact_at_zero():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 11, 200)
    b = np.clip(a + rng.integers(-4, 5, 200), 0, 10)
    vals = [cg.within_agreement(a, b, k) for k in range(6)]
    assert vals[0] == cg.exact_agreement(a, b)
    assert all(x <= y for x, y in zip(vals, vals[1:]))
    assert cg.within_agreement([0, 2], [1, 0], 1) == 0.5


def test_bias_estimate_matches_scipy_t_interval_and_bonferroni():
    rng = np.random.default_rng(2)
    pred, ref = rng.normal(0.3, 1.0, 50), np.zeros(50)
    est = cg.bias_estimate(pred, ref, confidence=0.9)
    ci = stats.ttest_1samp(pred, 0.0).confidence_interval(0.9)
    np.testing.assert_allclose([est.lo, est.hi], [ci.low, ci.high], rtol=1e-10)
    est5 = cg.bias_estimate(pred, ref, confidence=0.9, num_comparisons=5)
    ci5 = stats.ttest_1samp(pred, 0.0).confidence_interval(1 - 0.1 / 5)
    np.testing.assert_allclose([est5.lo, est5.hi], [ci5.low, ci5.high], rtol=1e-10)
    assert est5.covers(est.mean) and est5.hi - est5.lo > est.hi - est.lo


# ---------------------------------------------------------------------------------- aggregation


def test_aggregation_rules_hand_cases():
    s = np.array([[1, 5, 2], [3, 5, 0], [2, 4, 0]], float)
    np.testing.assert_array_equal(cg.aggregate_scores(s, "max"), [3, 5, 2])
    np.testing.assert_array_equal(cg.aggregate_scores(s, "min"), [1, 4, 0])
    np.testing.assert_allclose(cg.aggregate_scores(s, "mean"), [2, 14 / 3, 2 / 3])
    np.testing.assert_array_equal(cg.aggregate_scores(s, "median"), [2, 5, 0])
    np.testing.assert_array_equal(cg.aggregate_scores(s, "mode"), [1, 5, 0])  # all-distinct ties -> lowest
    np.testing.assert_array_equal(cg.aggregate_scores(s, "first"), [1, 5, 2])
    rng = np.random.default_rng(3)
    r = rng.integers(0, 11, (4, 30)).astype(float)
    assert np.all(cg.aggregate_scores(r, "max") >= cg.aggregate_scores(r, "mean"))
    assert np.all(cg.aggregate_scores(r, "mean") >= cg.aggregate_scores(r, "min"))


# ---------------------------------------------------------------------------------- reliability

NAN = np.nan
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability": 4 coders x 12 units, missing data.
KRIPP = np.array([[1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
                  [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
                  [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
                  [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN]])


def _alpha_brute(r, delta):
    units = [[v for v in r[:, u] if not np.isnan(v)] for u in range(r.shape[1])]
    units = [u for u in units if len(u) >= 2]
    values = [v for u in units for v in u]
    n = len(values)
    d_o = sum(sum(delta(a, b) for i, a in enumerate(u) for j, b in enumerate(u) if i != j) / (len(u) - 1)
              for u in units) / n
    d_e = sum(delta(a, b) for i, a in enumerate(values) for j, b in enumerate(values) if i != j) / (n * (n - 1))
    return 1 - d_o / d_e


def test_krippendorff_alpha_published_example():
    assert cg.krippendorff_alpha(KRIPP, metric="nominal") == pytest.approx(0.743, abs=5e-4)
    assert cg.krippendorff_alpha(KRIPP, metric="interval") == pytest.approx(0.849, abs=5e-4)


@pytest.mark.parametrize("seed", range(3))
def test_krippendorff_alpha_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 5, (4, 9)).astype(float)
    r[rng.random(r.shape) < 0.25] = np.nan
    np.testing.assert_allclose(cg.krippendorff_alpha(r, metric="interval"), _alpha_brute(r, lambda a, b: (a - b) ** 2),
                               rtol=1e-10)
    np.testing.assert_allclose(cg.krippendorff_alpha(r, metric="nominal"),
                               _alpha_brute(r, lambda a, b: float(a != b)), rtol=1e-10)


def test_icc_shrout_fleiss_table():
    x = np.array([[9, 2, 5, 8], [6, 1, 3, 2], [8, 4, 6, 8], [7, 1, 2, 6], [10, 5, 6, 9], [6, 2, 4, 7]], float)
    assert cg.icc(x, kind="ICC(1,1)") == pytest.approx(0.17, abs=0.005)
    assert cg.icc(x, kind="ICC(2,1)") == pytest.approx(0.29, abs=0.005)
    assert cg.icc(x, kind="ICC(3,1)") == pytest.approx(0.71, abs=0.006)


def test_error_variances_three_rater_closed_form_and_monte_carlo():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 40))
    v = lambda i, j: np.var(x[i] - x[j], ddof=1)  # noqa: E731
    np.testing.assert_allclose(cg.error_variances(x)[0], (v(0, 1) + v(0, 2) - v(1, 2)) / 2, rtol=1e-10)
    n, sds = 20000, np.array([0.5, 1.0, 1.5, 2.0])
    t = rng.normal(5, 2, n)
    ratings = t[None] + np.array([0.0, 1.0, -1.0, 0.5])[:, None] + sds[:, None] * rng.standard_normal((4, n))
    est = cg.error_variances(ratings)
    # The estimate's sd is about sqrt(2/n) * (total variance of the differences) < 0.1 here.
    np.testing.assert_allclose(est, sds ** 2, atol=0.12)


# ------------------------------------------------------------------------------------ graders


def test_noisy_grader_exact_distribution_and_monte_carlo():
    g = cg.NoisyGrader(0.7, 0.8, lambda item: 0.0)
    t = np.array([0.0, 4.0, 9.0, 10.0])
    p = g.score_distribution(t, 10)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    rng = np.random.default_rng(5)
    m = 40000
    draws = g.sample(np.repeat(t[None], m, 0), 10, rng)  # (m, 4)
    se = draws.std(0) / math.sqrt(m)
    np.testing.assert_allclose((draws - t).mean(0), g.expected_bias(t, 10), atol=float(5 * se.max()) + 1e-3)
    np.testing.assert_allclose(np.abs(draws - t).mean(0), g.expected_mae(t, 10), atol=0.02)
    # The deterministic limit.
    np.testing.assert_array_equal(cg.NoisyGrader(0.6, 0.0, lambda i: 0).score_distribution([9.0], 10).argmax(-1), [10])


def _item(answer, rubric):
    return cg.GradingItem("i0", "Differentiate 3*x^2.", "f' = 6*x", tuple(rubric), answer, "p0")


RUBRIC = (
    cg.RubricLine("power", 3, "f' = 6*x", ("f'",), lambda s: s["f'"] == cg.parse_expression("6*x")),
    cg.RubricLine("shown", 1, "u written", ("u",), lambda s: True),
)


def test_rubric_grader_checks_policies_and_deferral():
    rng = np.random.default_rng(0)
    g = cg.RubricGrader()
    good = g(_item("u = 3*x^2\nf' = x*2*3", RUBRIC), rng=rng)
    assert good.total == 4.0 and good.lost_lines == () and not good.deferred
    wrong = g(_item("u = 3*x^2\nf' = 3*x", RUBRIC), rng=rng)
    assert wrong.awards == (0.0, 1.0) and wrong.lost_lines == ("power",) and "f' = 3*x" in wrong.feedback[0]
    garbled = _item("u = 3*x^2\nf' = 6?x", RUBRIC)
    assert cg.RubricGrader(policy="charitable")(garbled, rng=rng).total == 4.0
    strict = cg.RubricGrader(policy="strict")(garbled, rng=rng)
    assert strict.total == 1.0 and strict.deferred and strict.confidence == 0.5
    missing = g(_item("u = 3*x^2", RUBRIC), rng=rng)
    assert missing.total == 1.0 and not missing.deferred
    always_flip = cg.RubricGrader(flip_rate=1.0)(_item("u = 3*x^2\nf' = 6*x", RUBRIC), rng=rng)
    assert always_flip.total == 0.0


def test_make_grade_and_json_schema():
    grade = cg.make_grade(RUBRIC, [3, 0.5])
    assert grade.total == 3.5 and grade.lost_lines == ("shown",)
    with pytest.raises(ValueError, match=r"award for rubric line 'power' must lie in \[0, 3\], got 4"):
        cg.make_grade(RUBRIC, [4, 1])
    reply = json.dumps({"awards": {"power": {"awarded": 3, "justification": "f' = 6x"}, "shown": {"awarded": 1}},
                        "defer": False})
    assert cg.parse_grader_json(reply, RUBRIC).total == 4.0
    too_much = json.dumps({"awards": {"power": {"awarded": 5}, "shown": {"awarded": 1}}})
    with pytest.raises(ValueError, match="rubric line 'power'"):
        cg.parse_grader_json(too_much, RUBRIC)
    with pytest.raises(ValueError, match=r"unknown \['extra'\]"):
        cg.parse_grader_json(json.dumps({"awards": {"power": 1, "shown": 1, "extra": 0}}), RUBRIC)
    with pytest.raises(ValueError, match="must be JSON"):
        cg.parse_grader_json("not json", RUBRIC)
    prompt = cg.rubric_prompt(_item("f' = 6*x", RUBRIC))
    assert "power (3 pt)" in prompt and "Differentiate 3*x^2." in prompt and "JSON" in prompt


def test_protocol_reports():
    lines = cg.rubric_line_report([[3, 0], [0, 1]], [[3, 1], [3, 1]], [["a", "b"], ["a", "b"]])
    assert lines["a"] == {"n": 2, "agreement": 0.5, "over_award": 0.0, "under_award": 0.5, "true_loss_rate": 0.0}
    assert lines["b"]["under_award"] == 0.5
    np.testing.assert_array_equal(cg.feedback_correct([("a",), ()], [("a",), ("b",)]), [True, False])
    curve = cg.deferral_curve([True, False, True, True], [1.0, 0.2, 0.5, 1.0], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(curve["retained"], [1.0, 0.75, 0.5])
    np.testing.assert_allclose(curve["accuracy"], [0.75, 1.0, 1.0])
    truth = np.array([0, 5, 10, 7, 3], float)
    ev = cg.evaluate_graders({"good": truth, "off": truth + 1, "bad": truth[::-1]}, truth)
    assert ev["ranking"] == ["good", "off", "bad"] and ev["graders"]["off"]["bias"] == 1.0


# ---------------------------------------------------------------------------------- the algebra


def _num(e: cg.Expr, x: float) -> float:
    f = {"": lambda u: 1.0, "sin": math.sin, "cos": math.cos, "exp": math.exp}
    return sum(float(t.coef) * x ** t.power * f[t.func](float(t.inner_coef) * x ** t.inner_power) for t in e.terms)


@pytest.mark.parametrize("text", ["3*x^2*sin(2*x) + x", "5*exp(3*x^2) - 2/3*x^4", "-x^3*cos(x) + 7"])
def test_derivative_against_finite_differences(text):
    e = cg.parse_expression(text)
    d = cg.derivative(e)
    for x in (0.3, 0.8, 1.1):
        h = 1e-5
        fd = (_num(e, x + h) - _num(e, x - h)) / (2 * h)
        assert _num(d, x) == pytest.approx(fd, rel=1e-6, abs=1e-6)
    assert cg.parse_expression(cg.format_expression(e)) == e


def test_antiderivative_and_evaluate():
    e = cg.parse_expression("4*x^3 + 3*cos(2*x) - exp(5*x)")
    assert cg.derivative(cg.antiderivative(e)) == e
    assert cg.antiderivative(e).has_constant
    p = cg.parse_expression("3*x^2 + 1")
    assert cg.evaluate(cg.antiderivative(p), 2) == Fraction(10)


def test_equivalent_forms_parse_equal_and_syntax_errors():
    forms = ["6*x^2", "2*3*x^2", "x^2*6", "12/2*x^2", "x^2*18/3"]
    assert len({cg.parse_expression(f) for f in forms}) == 1
    assert cg.parse_expression("x + 2*x") == cg.parse_expression("3*x")
    assert cg.parse_expression("sin(2*x) - 4*x") == cg.parse_expression("-4*x + sin(2*x)")
    for bad in ["x3", "3*sin2*x", "6?x", "sin(2*x", "3/0*x", "- C"]:
        with pytest.raises(cg.ExpressionSyntaxError):
            cg.parse_expression(bad)


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, pattern", [
    (lambda: cg.quadratic_weighted_kappa([1, 2], [1, 2, 3]), r"a and b must be 1-d of equal length, got shapes \(2,\) and \(3,\)"),
    (lambda: cg.quadratic_weighted_kappa([1, 12], [1, 2], categories=np.arange(11)), r"a holds values outside categories: \[12.0\]"),
    (lambda: cg.quadratic_weighted_kappa([1, 2], [1, 2], categories=[2, 1]), "categories must be a non-empty increasing"),
    (lambda: cg.within_agreement([1], [1], -1), "tolerance must be finite and >= 0, got -1"),
    (lambda: cg.aggregate_scores([[1.0, 2.0]], "vote"), "rule must be one of"),
    (lambda: cg.aggregate_scores([1.0, 2.0], "max"), r"scores must have shape \(runs, items\)"),
    (lambda: cg.krippendorff_alpha([1, 2, 3]), r"ratings must have shape \(raters, units\), got shape \(3,\)"),
    (lambda: cg.krippendorff_alpha([[1, 2]], metric="ratio"), "metric must be 'interval' or 'nominal', got 'ratio'"),
    (lambda: cg.icc([[1, 2], [2, np.nan]]), "ratings must be complete"),
    (lambda: cg.error_variances(np.ones((2, 5))), r"raters >= 3"),
    (lambda: cg.bias_estimate([1, 2], [1, 2], confidence=1.5), r"confidence must lie in \(0, 1\), got 1.5"),
    (lambda: cg.RubricGrader(policy="lenient"), "policy must be 'charitable' or 'strict', got 'lenient'"),
    (lambda: cg.NoisyGrader(0.0, -1.0, lambda i: 0), "noise_sd finite and >= 0"),
    (lambda: cg.make_grade(RUBRIC, [1]), r"awards must have one entry per rubric line \(2\), got 1"),
    (lambda: cg.parse_expression(3), "text must be a str, got int"),
])
def test_bad_input_names_the_argument(call, pattern):
    with pytest.raises((ValueError, TypeError), match=pattern):
        call()
