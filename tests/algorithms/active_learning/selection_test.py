"""Selection rules of `algorithms.active_learning.selection` (spec vision_weights_envs.md 6(e)).

References: brute force (k-center greedy by plain loops and the optimal k-center radius over all subsets, the
threshold accuracy as an explicit sum), hand-computed tiny lines, Monte Carlo inclusion frequencies with a
binomial tolerance from the trial count.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from algorithms.active_learning import fm_priors, selection

K = 3


def _pool(n=40, seed=0, labeled=8):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    p = rng.dirichlet(np.ones(K), n)
    x = rng.normal(size=(n, 4))
    lab = np.zeros(n, bool)
    lab[rng.choice(n, labeled, replace=False)] = True
    return y, p, x, lab


def _rules():
    def direct(p, q, x, y, lab, b, rng):
        return selection.direct_select(p, np.where(lab, y, 0), lab, b, oracle=lambda i: y[i], rng=rng,
                                       parallel_annotators=2, min_budget_per_class=2).indices

    def fm(p, q, x, y, lab, b, rng):
        return fm_priors.co_decision_select(p, q, np.where(lab, y, 0), lab, b, oracle=lambda i: y[i], rng=rng,
                                            config=fm_priors.FMPriorConfig(parallel_annotators=2,
                                                                           min_budget_per_class=2)).indices

    return {
        "random": lambda p, q, x, y, lab, b, rng: selection.random_select(lab, b, rng=rng),
        "margin": lambda p, q, x, y, lab, b, rng: selection.margin_select(p, lab, b, rng=rng),
        "entropy": lambda p, q, x, y, lab, b, rng: selection.entropy_select(p, lab, b, rng=rng),
        "coreset": lambda p, q, x, y, lab, b, rng: selection.k_center_greedy(x, lab, b, rng=rng),
        "direct": direct,
        "fm_co_decision": fm,
    }


RULES = _rules()


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("budget", [0, 1, 7, 19, 32, 50])
def test_picks_exactly_budget_of_unlabeled(name, budget):
    y, p, x, lab = _pool()
    q = np.random.default_rng(5).dirichlet(np.ones(K), y.size)
    idx = np.asarray(RULES[name](p, q, x, y, lab, budget, np.random.default_rng(1)))
    assert idx.size == min(budget, int((~lab).sum()))
    assert np.unique(idx).size == idx.size, "a point was picked twice"
    assert not lab[idx].any(), "a labeled point was re-picked"


@pytest.mark.parametrize("name,budget,n,labeled", [("random", 2, 8, 3), ("margin", 2, 8, 3), ("entropy", 2, 8, 3),
                                                   ("coreset", 2, 8, 3), ("direct", 2, 8, 3),
                                                   ("direct", 6, 14, 4), ("fm_co_decision", 6, 14, 4)])
def test_constant_scores_reduce_to_random(name, budget, n, labeled):
    """With constant probabilities / identical features every unlabeled item is picked with probability
    budget / n_unlabeled (Monte Carlo over trials; 4.5 sigma binomial tolerance per item)."""
    trials = 600
    p = np.full((n, K), 1.0 / K)
    x = np.zeros((n, 4))
    y = np.zeros(n, np.int64)  # every annotation is the same: items stay exchangeable
    lab = np.zeros(n, bool)
    lab[:labeled] = True
    rng = np.random.default_rng(123)
    counts = np.zeros(n)
    for _ in range(trials):
        counts[np.asarray(RULES[name](p, p, x, y, lab, budget, rng))] += 1
    pi = budget / (n - labeled)
    sd = math.sqrt(trials * pi * (1 - pi))
    assert np.all(counts[:labeled] == 0)
    assert np.all(np.abs(counts[labeled:] - trials * pi) <= 4.5 * sd), (counts, trials * pi)


def test_margin_and_entropy_pick_most_uncertain():
    p = np.array([[0.9, 0.05, 0.05], [0.4, 0.35, 0.25], [0.34, 0.33, 0.33], [0.6, 0.3, 0.1]])
    lab = np.zeros(4, bool)
    rng = np.random.default_rng(0)
    assert selection.margin_select(p, lab, 2, rng=rng).tolist() == [2, 1]
    assert selection.entropy_select(p, lab, 2, rng=rng).tolist() == [2, 1]
    ent = -(p * np.log(p)).sum(1)
    np.testing.assert_allclose(selection.entropy_scores(p), ent, rtol=1e-12)
    np.testing.assert_allclose(selection.margin_scores(p), [-0.85, -0.05, -0.01, -0.3], atol=1e-12)


def _greedy_brute(x, labeled, budget):
    centers = [i for i in range(len(x)) if labeled[i]]
    picks = []
    for _ in range(budget):
        best, best_d = None, -1.0
        for i in range(len(x)):
            if i in centers:
                continue
            d = min(math.dist(x[i], x[c]) for c in centers) if centers else math.inf
            if d > best_d:
                best, best_d = i, d
        centers.append(best)
        picks.append(best)
    return picks


def _radius(x, centers):
    return max(min(math.dist(x[i], x[c]) for c in centers) for i in range(len(x)))


@pytest.mark.parametrize("seed", range(4))
def test_k_center_greedy_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8, 2))
    lab = np.zeros(8, bool)
    lab[rng.integers(8)] = True
    budget = 3
    got = selection.k_center_greedy(x, lab, budget, rng=rng).tolist()
    assert got == _greedy_brute(x.tolist(), lab, budget)
    # Gonzalez: the greedy covering radius is within 2x of the optimal one (brute force over all subsets).
    fixed = np.flatnonzero(lab).tolist()
    free = [i for i in range(8) if not lab[i]]
    opt = min(_radius(x, fixed + list(s)) for s in itertools.combinations(free, budget))
    assert _radius(x, fixed + got) <= 2 * opt + 1e-12


def test_threshold_accuracy_hand_case_and_brute_force():
    w = np.array([1, 1, -1, 1, -1, -1])
    np.testing.assert_array_equal(selection.threshold_accuracy(w), [0, 2, 4, 2, 4, 2, 0])
    assert selection.best_threshold(w) == 2
    rng = np.random.default_rng(0)
    for _ in range(20):
        w = rng.choice([-1.0, 0.0, 1.0], size=rng.integers(1, 12))
        brute = [sum(wi * (1 if i < j else -1) for i, wi in enumerate(w)) for j in range(len(w) + 1)]
        np.testing.assert_allclose(selection.threshold_accuracy(w), brute)


def test_best_threshold_on_separable_line_is_the_true_cut():
    w = np.array([1, 1, 0, 1, 0, -1, 0, -1, -1])  # +1 up to position 3, -1 from position 5
    assert selection.best_threshold(w) in (4, 5)
    acc = selection.threshold_accuracy(w)
    assert acc[4] == acc[5] == acc.max() == 6 and selection.best_threshold(w) == 4


def test_uncertainty_interval_hand_case():
    w = np.array([1, 0, 1, -1, 0, 1, 0, -1, -1])
    assert selection.uncertainty_interval(w) == (2, 7)
    assert selection.uncertainty_interval(np.zeros(5)) == (0, 4)


def test_version_space_interval_only_shrinks_and_one_batch_when_b1_equals_b2():
    rng = np.random.default_rng(0)
    n = 60
    truth = np.where(np.arange(n) < 23, 1.0, -1.0)
    w = np.zeros(n)
    lab = np.zeros(n, bool)
    for i in (0, 1, n - 2, n - 1):
        w[i], lab[i] = truth[i], True
    lo, hi = selection.uncertainty_interval(w)
    trace = []
    q = selection.version_space_reduction(w, lab, lo, hi, batch=3, budget=15, rng=rng, trace=trace,
                                          label_fn=lambda pos: truth[pos])
    # 5 batches of 3 at most; it stops early once the interval holds no unlabeled item.
    assert len(q) <= 15 and len(set(q)) == len(q) and 1 <= len(trace) <= 5 and len(q) > 3 * (len(trace) - 1)
    assert not np.any(np.isin(q, [0, 1, n - 2, n - 1]))
    bounds = [(lo, hi)] + trace
    assert all(a[0] <= b[0] and a[1] >= b[1] for a, b in zip(bounds, bounds[1:])), bounds
    assert trace[-1][0] <= 23 <= trace[-1][1] + 1  # the true cut stays inside (no noise)
    w2, lab2, trace2 = np.zeros(n), np.zeros(n, bool), []
    q2 = selection.version_space_reduction(w2, lab2, 0, n - 1, batch=4, budget=4, rng=rng, trace=trace2,
                                           label_fn=lambda pos: truth[pos])
    assert len(q2) == 4 and len(trace2) == 1


def test_phase2_alternates_left_and_right_of_the_cut():
    lab = np.zeros(12, bool)
    lab[[0, 5, 6, 11]] = True
    w = np.zeros(12)
    w[[0, 5]], w[[6, 11]] = 1.0, -1.0
    cut = selection.best_threshold(w)
    assert cut == 6
    assert selection.query_around_threshold(lab, cut, 5).tolist() == [4, 7, 3, 8, 2]
    # Past the left end it keeps going right.
    lab = np.zeros(5, bool)
    assert selection.query_around_threshold(lab, 1, 5).tolist() == [0, 1, 2, 3, 4]


def test_direct_zero_noise_phase2_picks_next_to_the_cut():
    """Two classes, no noise, a budget too small for phase 1: each class line gets one label, the item next to
    its best cut (class 0: ordered by P[:, 0] descending; class 1 the reverse)."""
    n = 12
    p0 = np.linspace(0.95, 0.05, n)
    p = np.stack([p0, 1 - p0], 1)
    y = (np.arange(n) >= 6).astype(np.int64)
    lab = np.zeros(n, bool)
    lab[[0, 1, 10, 11]] = True
    r = selection.direct_select(p, y, lab, 2, oracle=lambda i: y[i], rng=np.random.default_rng(0))
    assert r.phase1 == 0
    # class 0 line = 0..11, best cut 2 -> left 1 is labeled, right 2 is picked; class 1 line = 11..0, cut 2 ->
    # position 2 of the reversed line is item 9.
    assert sorted(r.indices.tolist()) == [2, 9]


def test_largest_remainder_sums_and_is_monotone():
    rng = np.random.default_rng(0)
    for _ in range(50):
        wt = rng.random(rng.integers(1, 9))
        b = int(rng.integers(0, 40))
        a = selection.largest_remainder(b, wt)
        assert a.sum() == b
        assert np.all(np.abs(a - b * wt / wt.sum()) < 1 + 1e-9)
        o = np.argsort(wt)
        assert np.all(np.diff(a[o]) >= 0)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: selection.random_select(np.zeros(4), 1, rng=np.random.default_rng(0)), ValueError,
     r"labeled must be a 1-D boolean mask.*dtype float64"),
    (lambda: selection.random_select(np.zeros(4, bool), -1, rng=np.random.default_rng(0)), ValueError,
     r"budget must be a non-negative integer, got -1"),
    (lambda: selection.margin_select(np.ones((4, 1)), np.zeros(4, bool), 1, rng=np.random.default_rng(0)),
     ValueError, r"probs must have shape \(n, K\) with K >= 2.*\(4, 1\)"),
    (lambda: selection.k_center_greedy(np.full((3, 2), np.nan), np.zeros(3, bool), 1, rng=np.random.default_rng(0)),
     ValueError, r"features must be a finite \(n, d\) array"),
    (lambda: selection.direct_select(np.full((4, 2), 0.5), np.zeros(4, np.int64), np.zeros(4, bool), 1,
                                     oracle=lambda i: i, rng=np.random.default_rng(0)), ValueError,
     r"labeled must mark at least one"),
    (lambda: selection.direct_select(np.full((4, 2), 0.5), np.zeros(4, np.int64), np.ones(4, bool), 1,
                                     oracle=lambda i: i, rng=np.random.default_rng(0), class_rank=[0, 0]),
     ValueError, r"class_rank must be a permutation of range\(2\), got \[0, 0\]"),
    (lambda: selection.top_score_select(np.zeros(3), np.zeros(3, bool), 1, rng=0), TypeError,
     r"rng must be a numpy.random.Generator, got int"),
    (lambda: selection.largest_remainder(3, [0.0, 0.0]), ValueError, r"weights must be .* positive sum"),
])
def test_bad_input_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
