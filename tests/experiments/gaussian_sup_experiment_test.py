"""gaussian_sup experiment: the claim checks decide exactly as the verdict's former hand-written rule (anchors,
PTAS, greedy bounds, concavity, both concentration tests), on synthetic study outputs at and around every
threshold; the cause names the failing check; the headline reads a stored result's metrics."""

import math

import numpy as np
import pytest

from experiments import checks as checks_lib
from experiments import gaussian_sup as exp

C = exp.Config(greedy=exp.GreedySection(n=8, scaling_sizes=(16,)), hypergraphs=exp.HypergraphsSection(n=12))
E = 1 - 1 / math.e


def _studies(table=1e-7, mc_z=0.5, opt=1e-6, corr=1e-6, ptas_gap=0.05, level=1.0, alg=0.9, scale=0.9,
             d2=-1e-3, pr_k=(4.0, 3.0), pr_hyper=(5.0, 4.0)):
    anchors = {"table_max_abs_error": table, "mc_z": mc_z, "optimum_max_abs_error": opt,
               "correlated_max_abs_error": corr}
    ptas = {"rows": [{"eps": 0.5, "gap": ptas_gap}, {"eps": 0.9, "gap": 0.0}], "within_eps": ptas_gap <= 0.5,
            "max_gap_by_eps": {"0.5": ptas_gap, "0.9": 0.0}, "num_instances": 2}
    bound = 1 / (2 * (math.floor(math.log2(C.greedy.n)) + 1))
    greedy = {"min_level_ratio": level, "min_alg_over_opt": alg, "log_bound": bound,
              "scaling": {16: {"ratio": scale, "bound": 1 / (2 * 5)}}}
    fam = {"mu=0,independent": {"participation_ratio": [8.0, pr_k[0], 5.0, pr_k[1]], "max_second_difference": d2,
                                "concave": d2 <= C.families.concavity_tol, "per_set_opt": [0.2, 0.3, 0.4, 0.5]}}
    hyper = {"rows": [{"p": 0.125, "participation_ratio": pr_hyper[0]}, {"p": 1.0, "participation_ratio": pr_hyper[1]}]}
    return anchors, ptas, greedy, fam, hyper


def _old_rule(anchors, ptas, greedy, fam, hyper):
    """The verdict's rule before the checks (experiments/gaussian_sup.py at f85adb4), written out independently."""
    anchors_ok = (anchors["table_max_abs_error"] <= 1e-6 and abs(anchors["mc_z"]) < 4
                  and anchors["optimum_max_abs_error"] <= C.anchors.tol and anchors["correlated_max_abs_error"] <= 1e-5)
    greedy_ok = (greedy["min_level_ratio"] >= E - 1e-12 and greedy["min_alg_over_opt"] >= greedy["log_bound"]
                 and all(v["ratio"] >= v["bound"] for v in greedy["scaling"].values()))
    indep = [v for k, v in fam.items() if k.endswith("independent")]
    concentrates = all(v["participation_ratio"][-1] < v["participation_ratio"][1] for v in indep)
    hr = hyper["rows"]
    return bool(anchors_ok and ptas["within_eps"] and greedy_ok and all(v["concave"] for v in indep)
                and concentrates and hr[-1]["participation_ratio"] < hr[0]["participation_ratio"])


# Each field at a passing value, exactly at its threshold, and just beyond it.
EDGES = {"table": (1e-7, 1e-6, 1.01e-6), "mc_z": (0.5, -3.99, 4.0), "opt": (1e-6, 1e-5, 1.01e-5),
         "corr": (1e-6, 1e-5, 1.01e-5), "ptas_gap": (0.05, 0.5, 0.51), "level": (1.0, E, E - 1e-6),
         "alg": (0.9, 1 / 8, 0.12), "scale": (0.9, 0.1, 0.099), "d2": (-1e-3, 1e-4, 1.1e-4),
         "pr_k": ((4.0, 3.0), (4.0, 3.999), (4.0, 4.0)), "pr_hyper": ((5.0, 4.0), (4.0, 3.99), (4.0, 4.0))}


@pytest.mark.parametrize("field", sorted(EDGES))
def test_checks_decide_as_the_former_rule_at_each_threshold(field):
    for value in EDGES[field]:
        studies = _studies(**{field: value})
        checks = exp._checks(C, *studies)
        _, reproduced = checks_lib.verdict(checks)
        assert reproduced == _old_rule(*studies), (field, value)
        assert all(ch.required for ch in checks)


def test_checks_decide_as_the_former_rule_on_random_combinations():
    rng = np.random.default_rng(0)
    names = sorted(EDGES)
    for _ in range(300):
        kw = {f: EDGES[f][rng.integers(3)] if rng.random() < 0.3 else EDGES[f][0] for f in names}
        studies = _studies(**kw)
        assert checks_lib.verdict(exp._checks(C, *studies))[1] == _old_rule(*studies), kw


def test_cause_names_the_scale_limit_only_for_the_hypergraph_check():
    checks = exp._checks(C, *_studies(pr_hyper=(4.0, 4.0)))
    text, ok = checks_lib.verdict(checks, cause=exp._cause(checks, C))
    assert not ok and "Cause: concentration (random hypergraphs): scale limit" in text and "n = 12" in text
    assert "not diagnosed" not in text
    checks = exp._checks(C, *_studies(level=0.5))
    assert exp._cause(checks, C).startswith("Algorithm 3: greedy / exhaustive best set") and "not diagnosed" in \
        exp._cause(checks, C)
    assert exp._cause(exp._checks(C, *_studies()), C) == ""


def test_headline_reads_metrics_only():
    anchors, ptas, greedy, fam, hyper = _studies(pr_hyper=(3.72, 4.09))
    anchors.update(heuristic_optimum={"4": {"value": 0.514688}, "12": {"value": 0.524471}},
                   brute_force_optimum={"6": {"value": 0.524033}})
    metrics = {"anchors": anchors, "optimum_max_abs_error": 3.4e-7, "table_max_abs_error": 4.9e-7, "ptas": ptas,
               "ptas_within_eps": True, "greedy": greedy, "greedy_min_alg_over_opt": 0.951,
               "greedy_min_level_ratio": 1.0, "concentrates_random_hypergraphs": False, "random_hypergraphs": hyper,
               "cause": exp._HYPER_CAUSE.format(n=12)}
    text = exp.headline(metrics)
    assert text == ("spec optima n=4..12 to 3e-07 (brute force n=6: .524033); PTAS OPT-ALG <=.050 (<= eps "
                    "everywhere); greedy/exhaustive 1.00; ALG/OPT >=.90; no random-hypergraph concentration "
                    "(PR 3.72 at p=0.125 -> 4.09 at p=1; cause: scale limit)")
    assert "reproduced" not in text.lower() and len(text) <= 300
