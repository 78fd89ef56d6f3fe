"""differential_smoothing experiment: the dominance statistic (Theorem 3.4's form), seed means, verdict."""

import itertools
import statistics

import numpy as np
import pytest

from experiments import differential_smoothing as exp


def _arm(p1, pk, se1, sek):
    return {"pass_at_k": {1: p1, 32: pk}, "pass_at_k_se": {1: se1, 32: sek}}


def _brute_force_cover(arms, ds, base, tolerance):
    """Independent reference: one array comparison over all (baseline, DS, metric) triples."""
    m = np.array([[[arms[d]["pass_at_k"][k] for k in (1, 32)] for d in ds]])  # [1, D, 2]
    sd = np.array([[[arms[d]["pass_at_k_se"][k] for k in (1, 32)] for d in ds]])
    mb = np.array([[[arms[b]["pass_at_k"][k] for k in (1, 32)]] for b in base])  # [B, 1, 2]
    sb = np.array([[[arms[b]["pass_at_k_se"][k] for k in (1, 32)]] for b in base])
    tol = np.sqrt(sd**2 + sb**2) if tolerance else 0.0
    ok = (m >= mb - tol).all(-1)  # [B, D]
    return {b: [d for d, hit in zip(ds, row) if hit] for b, row in zip(base, ok)}


@pytest.mark.parametrize("tolerance", [True, False])
def test_dominance_matches_brute_force(tolerance):
    rng = np.random.default_rng(0)
    for trial in range(20):
        ds = [f"ds{i}" for i in range(3)]
        base = ["grpo", "bonus", "penalty"]
        arms = {n: _arm(*rng.uniform(0.3, 0.5, 1), *rng.uniform(0.8, 0.9, 1), *rng.uniform(0, 0.02, 2))
                for n in ds + base}
        got = exp.dominance(arms, ds, base, ks=(1, 32), tolerance=tolerance)
        want = _brute_force_cover(arms, ds, base, tolerance)
        assert got["covered_by"] == want
        assert got["covered_share"] == pytest.approx(np.mean([bool(v) for v in want.values()]))


def test_dominance_hand_cases():
    # The issue's case: entropy bonus trades 4 points of pass@1 for pass@32; the old per-metric "best of
    # family" rule failed DS on pass@32, dominance asks for one DS arm at least as good on both.
    arms = {"ds a": _arm(0.418, 0.822, 0.005, 0.005), "ds b": _arm(0.40, 0.885, 0.005, 0.005),
            "grpo": _arm(0.401, 0.840, 0.005, 0.005), "entropy_bonus 0.1": _arm(0.376, 0.878, 0.005, 0.005)}
    d = exp.dominance(arms, ["ds a", "ds b"], ["grpo", "entropy_bonus 0.1"])
    assert d["covered_by"] == {"grpo": ["ds b"], "entropy_bonus 0.1": ["ds b"]} and d["covered_share"] == 1.0
    # Within one SE of the difference (0.01 * sqrt 2 = 0.0141) counts; beyond it does not.
    arms = {"ds": _arm(0.40, 0.850, 0.01, 0.01), "near": _arm(0.41, 0.86, 0.01, 0.01),
            "far": _arm(0.40, 0.866, 0.01, 0.01)}
    d = exp.dominance(arms, ["ds"], ["near", "far"])
    assert d["covered_by"] == {"near": ["ds"], "far": []} and d["covered_share"] == 0.5
    assert exp.dominance(arms, ["ds"], ["near"], tolerance=False)["covered_share"] == 0.0
    with pytest.raises(ValueError, match="DS and baseline"):
        exp.dominance(arms, [], ["near"])


def test_mean_eval_is_the_seed_mean_and_standard_error():
    evals = [{"pass_at_k": {1: a, 32: b}, "distinct_correct": c, "distinct_share": 0.1, "solved_problems": 0.5}
             for a, b, c in [(0.3, 0.8, 3.0), (0.35, 0.9, 4.0), (0.4, 0.85, 3.5)]]
    m = exp._mean_eval(evals)
    assert m["pass_at_k"][1] == pytest.approx(0.35) and m["distinct_correct"] == pytest.approx(3.5)
    assert m["pass_at_k_se"][1] == pytest.approx(statistics.stdev([0.3, 0.35, 0.4]) / 3**0.5)
    assert m["pass_at_k_se"][32] == pytest.approx(statistics.stdev([0.8, 0.9, 0.85]) / 3**0.5)
    assert m["seeds"] == 3


def _tab():
    dyn = {"grpo": {"family": "grpo", "final_correct_mass": 0.99, "final_distinct": 1.0},
           "ds p1 n0": {"family": "ds", "final_correct_mass": 0.99, "final_distinct": 10.0},
           "ent+0.1": {"family": "entropy_bonus", "final_correct_mass": 0.97, "final_distinct": 5.0},
           "ent-0.1": {"family": "entropy_penalty", "final_correct_mass": 0.99, "final_distinct": 1.0}}
    return {"dynamics": dyn, "base_correct_mass": 0.3, "base_distinct": 4.0, "dyn_dominated_share": 1.0,
            "opt_dominated_share": 1.0}


@pytest.mark.parametrize("bonus_pk, reproduced", [(0.86, True), (0.93, False)])
def test_verdict_uses_dominance_and_names_its_cause(bonus_pk, reproduced):
    ev = {n: dict(_arm(p1, pk, 0.01, 0.01), distinct_correct=3.0)
          for n, p1, pk in [("sft", 0.26, 0.95), ("grpo", 0.40, 0.84), ("ds p1 n0.5", 0.41, 0.86),
                            ("entropy_bonus 0.1", 0.37, bonus_pk)]}
    cd = {"evals": ev, "num_test_problems": 64, "mean_solutions_per_test_problem": 5.0}
    text, ok, checks, cause_class = exp._verdict(_tab(), cd, exp.Config())
    assert ok is reproduced
    dom = next(ch for ch in checks if ch.name.startswith("CountDown: share"))
    assert dom.required and dom.measured == (1.0 if reproduced else 0.5)
    if reproduced:
        assert cause_class is None
    else:
        assert cause_class == "scale" and "no DS arm covers entropy_bonus 0.1" in text
