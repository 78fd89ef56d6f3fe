"""rl_compute_allocation experiment: the one-standard-error sets of n per budget and their lower end."""

import numpy as np
import pytest

from experiments import rl_compute_allocation as exp


def _brute_force_sets(table):
    """Independent reference: per budget, sort all n by score and keep those not below best - se(best)."""
    out = {}
    for C in sorted({C for C, _ in table}):
        rows = sorted(((v["score"], n, v["score_se"]) for (b, n), v in table.items() if b == C), reverse=True)
        best_score, _, best_se = rows[0]
        out[C] = sorted(n for s, n, _ in rows if best_score - s <= best_se)
    return out


def test_one_se_sets_match_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        table = {(C, n): {"score": float(rng.uniform(0.3, 0.35)), "score_se": float(rng.uniform(0, 0.01))}
                 for C in (2**10, 2**11, 2**12) for n in (2, 4, 8, 16)}
        assert exp.one_se_sets(table) == _brute_force_sets(table)


def test_one_se_sets_hand_case():
    table = {(8, 2): {"score": 0.50, "score_se": 0.02}, (8, 4): {"score": 0.49, "score_se": 0.05},
             (8, 8): {"score": 0.47, "score_se": 0.01},
             (16, 2): {"score": 0.40, "score_se": 0.01}, (16, 4): {"score": 0.60, "score_se": 0.01},
             (16, 8): {"score": 0.595, "score_se": 0.03}}
    # the band is the best n's own SE: 0.50 - 0.02 keeps n=4 (0.49), drops n=8 (0.47)
    assert exp.one_se_sets(table) == {8: [2, 4], 16: [4, 8]}


def _rows(scores, se):
    """Sweep rows with one B_p: scores[C][n]."""
    return [dict(budget=C, n=n, num_problems=4, steps=C // (4 * n), score=s, score_se=se, coverage=0.0)
            for C, by_n in scores.items() for n, s in by_n.items()]


def test_analyse_lower_end_rises_while_the_argmax_flips():
    # Flat tops: the argmax flips between tied n (2 and 4) but the 1-SE set's lower end rises 2 -> 4 -> 8.
    scores = {2**10: {2: .300, 4: .301, 8: .28, 16: .25}, 2**11: {2: .320, 4: .319, 8: .31, 16: .30},
              2**12: {2: .33, 4: .345, 8: .344, 16: .34}, 2**13: {2: .33, 4: .351, 8: .355, 16: .35},
              2**14: {2: .33, 4: .34, 8: .36, 16: .359}}
    r = exp._analyse(_rows(scores, se=0.002))
    assert r["n_star"] == [4, 2, 4, 8, 8]
    assert r["one_se_sets"] == {"1024": [2, 4], "2048": [2, 4], "4096": [4, 8], "8192": [8], "16384": [8, 16]}
    assert r["n_lo"] == [2, 2, 4, 8, 8]
    assert r["rises_lo"] and r["spearman_lo"] > 0 and r["saturates_lo"]  # unchanged over the last two budgets
    # one seed (no SE): no 1-SE sets, the argmax analysis still runs
    r1 = exp._analyse(_rows(scores, se=float("nan")))
    assert "n_lo" not in r1 and r1["n_star"] == [4, 2, 4, 8, 8]
