"""Tests of the ddm_signals experiment's high-threshold check (issue 33): the trend rule, the density L1
error against an independent float64 computation, and the cause class."""

import numpy as np
import pytest

from experiments import ddm_signals as ds
from primitives import drift_diffusion as dd


class _Bar:
    def update(self, n):
        pass


def _brute_trend(e, r):
    """The rule of `high_threshold_trend` written out over every pair of thresholds after the peak."""
    k = int(np.argmax(e))
    last = len(e) - 1
    if k == last:
        return False
    for i in range(k, last):
        if e[i + 1] > e[i] + r[i] + r[i + 1]:
            return False
    return e[k] - e[last] > r[k] + r[last]


@pytest.mark.parametrize("errors, resolution, expected", [
    # The sinusoid's hump (issue 33): rises to a = 16, falls after: passes.
    ([0.026, 0.018, 0.030, 0.019, 0.014], [2e-4, 1e-5, 1e-5, 2e-5, 8e-5], True),
    # Still rising at the largest a: fails.
    ([0.01, 0.02, 0.03], [0.0, 0.0, 0.0], False),
    # Falls, then rises again past the peak by more than the resolution: fails.
    ([0.1, 0.05, 0.02, 0.04], [1e-4] * 4, False),
    # Falls to the reference's resolution, where a tiny "rise" is noise: passes.
    ([2e-2, 3e-3, 2.2e-6, 2.4e-7, 3.5e-7], [2e-4, 1.5e-5, 7e-6, 1.6e-5, 5e-5], True),
    # A drop smaller than the two resolutions is not a resolved decrease: fails.
    ([1e-4, 0.5e-4], [4e-5, 4e-5], False),
    ([0.2, 0.1], [0.0, 0.0], True),
])
def test_high_threshold_trend_cases(errors, resolution, expected):
    out = ds.high_threshold_trend(errors, resolution)
    assert out["passed"] is expected
    assert out["passed"] == _brute_trend(errors, resolution)
    assert out["peak_index"] == int(np.argmax(errors))


def test_high_threshold_trend_random_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(2, 7))
        e = rng.exponential(size=k) * 10.0 ** rng.integers(-4, 0)
        r = rng.exponential(size=k) * 10.0 ** rng.integers(-6, -2)
        assert ds.high_threshold_trend(e, r)["passed"] == _brute_trend(e, r)


@pytest.mark.parametrize("errors, resolution", [([0.1], [0.0]), ([0.1, 0.2], [0.0]), ([0.1, -0.2], [0.0, 0.0]),
                                                ([0.1, np.nan], [0.0, 0.0])])
def test_high_threshold_trend_rejects_bad_input(errors, resolution):
    with pytest.raises(ValueError, match="errors and resolution"):
        ds.high_threshold_trend(errors, resolution)


def test_density_l1_error_matches_float64_reference():
    """The sinusoid's int|f_hat - f| against the tangent formula written here in float64 numpy."""
    a, n = 4.0, 400
    c = ds.Config(accuracy=ds.AccuracySection(thresholds=(a, 2 * a), shapes=("sinusoid",), volterra_points=n),
                  progress=False)
    rows = ds.accuracy_study(c, _Bar())["sinusoid"]
    t = np.linspace(0.0, 6 * a + 24, n + 1)
    mu0, amp, w = 0.5, 0.25, 2 * np.pi / a
    mu = mu0 + amp * np.sin(w * t)
    cum = mu0 * t + amp / w * (1 - np.cos(w * t))
    ts = np.where(t > 0, t, 1.0)
    f_hat = np.where(t > 0, np.maximum(a - cum + t * mu, 0.0) / np.sqrt(2 * np.pi * ts ** 3)
                     * np.exp(-(a - cum) ** 2 / (2 * ts)), 0.0)
    g = dd.volterra_fpt_density(t, a, 1.0, cum, mu)
    l1 = np.trapezoid(np.abs(f_hat - g), t)
    np.testing.assert_allclose(rows["l1_density_error"][0], l1, rtol=1e-4, atol=1e-6)
    # The closed form's float32 rounding bounds the gap to the float64 error (triangle inequality) and is small.
    fp = rows["closed_form_l1_error"][0]
    assert 0.0 < fp < 1e-5
    assert abs(rows["l1_density_error"][0] - l1) <= fp * (1 + 1e-6) + 1e-12
    # The CDF of the sinusoid is the trapezoid of the density, so sup|F_hat - F| <= int|f_hat - f|.
    for sup, l1_k in zip(rows["sup_cdf_error"], rows["l1_density_error"]):
        assert sup <= l1_k + 1e-9
    g_half = dd.volterra_fpt_density(t[::2], a, 1.0, cum[::2], mu[::2])
    np.testing.assert_allclose(rows["reference_l1_error"][0], np.trapezoid(np.abs(g[::2] - g_half), t[::2]),
                               rtol=1e-9)


def test_cause_classes():
    c = ds.Config()
    acc = {"sinusoid": {"a": [1.0, 4.0, 16.0], "sup_cdf_error": [0.01, 0.02, 0.03],
                        "l1_density_error": [0.2, 0.1, 0.05]}}
    trend_sup = {"sinusoid": ds.high_threshold_trend([0.01, 0.02, 0.03], [0, 0, 0])}
    trend_l1 = {"sinusoid": ds.high_threshold_trend([0.2, 0.1, 0.05], [0, 0, 0])}
    metrics = {"accuracy_ok": False, "accuracy_trend_sup_cdf_error": trend_sup,
               "accuracy_trend_l1_density_error": trend_l1}
    cls, text = ds._cause(c, acc, metrics, None)
    assert cls == "scale" and "peaks at the largest a" in text
    acc["sinusoid"]["sup_cdf_error"] = [0.03, 0.01, 0.02]
    metrics["accuracy_trend_sup_cdf_error"] = {"sinusoid": ds.high_threshold_trend([0.03, 0.01, 0.02], [0, 0, 0])}
    cls, text = ds._cause(c, acc, metrics, None)
    assert cls == "spec" and "rises past its peak" in text
    metrics = {"timing_ok": False, "timing_median_rel_regret_min_a": 0.3, "timing_median_rel_regret_max_a": 0.2}
    assert ds._cause(c, {}, metrics, None)[0] == "scale"
    assert ds._cause(c, {}, {"accuracy_ok": True}, None) == (None, "")


def test_run_rejects_unsorted_thresholds(tmp_path):
    with pytest.raises(ValueError, match="accuracy.thresholds"):
        ds.run(ds.Config(accuracy=ds.AccuracySection(thresholds=(4.0, 2.0)), progress=False), tmp_path)
