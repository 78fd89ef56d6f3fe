"""FM-prior co-decision (spec vision_weights_envs.md 6(b), 6(e)): the limiting cases (alpha = 1 is DIRECT on P,
alpha = 0 uses only Q), pooling against its closed form, the imbalance-aware budget split, noise flags, cold start."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.active_learning import fm_priors, selection

N, K = 60, 4


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, N)
    p = rng.dirichlet(np.ones(K), N)
    q = rng.dirichlet(np.ones(K) * 0.5, N)
    lab = np.zeros(N, bool)
    lab[rng.choice(N, 10, replace=False)] = True
    return y, p, q, lab


def _co(p, q, y, lab, budget, seed, **cfg):
    return fm_priors.co_decision_select(p, q, np.where(lab, y, 0), lab, budget, oracle=lambda i: y[i],
                                        rng=np.random.default_rng(seed),
                                        config=fm_priors.FMPriorConfig(parallel_annotators=2,
                                                                       min_budget_per_class=2, **cfg))


@pytest.mark.parametrize("budget", [6, 20])
def test_alpha_one_is_direct_on_p(budget):
    y, p, q, lab = _setup()
    got = _co(p, q, y, lab, budget, seed=3, alpha=1.0, beta=0.0, rank_by="labeled")
    ref = selection.direct_select(p, np.where(lab, y, 0), lab, budget, oracle=lambda i: y[i],
                                  rng=np.random.default_rng(3), parallel_annotators=2, min_budget_per_class=2)
    assert got.indices.tolist() == ref.indices.tolist() and got.phase1 == ref.phase1
    # ... and then Q does not matter.
    other_q = np.random.default_rng(9).dirichlet(np.ones(K), N)
    assert _co(p, other_q, y, lab, budget, seed=3, alpha=1.0, beta=0.0, rank_by="labeled").indices.tolist() \
        == got.indices.tolist()


@pytest.mark.parametrize("budget", [6, 20])
def test_alpha_zero_uses_only_q(budget):
    y, p, q, lab = _setup(1)
    a = _co(p, q, y, lab, budget, seed=4, alpha=0.0)
    other_p = np.random.default_rng(11).dirichlet(np.ones(K), N)
    b = _co(other_p, q, y, lab, budget, seed=4, alpha=0.0)
    assert a.indices.tolist() == b.indices.tolist()
    # while at alpha = 0.5 the small model changes the pick
    c = _co(p, q, y, lab, budget, seed=4, alpha=0.5)
    d = _co(other_p, q, y, lab, budget, seed=4, alpha=0.5)
    assert c.indices.tolist() != d.indices.tolist()


def test_pool_log_linear_closed_form_and_limits():
    _, p, q, _ = _setup()
    g = np.sqrt(p * q)
    np.testing.assert_allclose(fm_priors.pool_log_linear(p, q, 0.5), g / g.sum(1, keepdims=True), rtol=1e-10)
    a = 0.3
    r = p ** a * q ** (1 - a)
    np.testing.assert_allclose(fm_priors.pool_log_linear(p, q, a), r / r.sum(1, keepdims=True), rtol=1e-10)
    np.testing.assert_allclose(fm_priors.pool_log_linear(p, q, 1.0), p, rtol=1e-12)
    np.testing.assert_allclose(fm_priors.pool_log_linear(p, q, 0.0), q, rtol=1e-12)
    z = fm_priors.pool_log_linear(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), 0.5)
    assert np.all(np.isfinite(z))


def test_trust_weight_schedule():
    assert fm_priors.trust_weight(0, 40) == 0.0
    assert fm_priors.trust_weight(40, 40) == 0.5
    vals = [fm_priors.trust_weight(n, 40) for n in range(0, 400, 20)]
    assert all(a < b for a, b in zip(vals, vals[1:])) and vals[-1] < 1


def test_class_budgets_sum_and_monotone_in_inverse_prior():
    rng = np.random.default_rng(0)
    for _ in range(40):
        pi = rng.dirichlet(np.ones(6))
        b = int(rng.integers(0, 60))
        beta = float(rng.choice([0.0, 0.5, 1.0]))
        a = fm_priors.class_budgets(pi, b, beta=beta)
        assert a.sum() == b
        if beta > 0:  # a larger 1 / pi never gets fewer labels (beta = 0: all weights tie)
            bigger = (1 / pi)[:, None] > (1 / pi)[None, :]
            assert np.all(a[:, None] >= a[None, :], where=bigger), (pi, a)
        share = b * pi ** -beta / np.sum(pi ** -beta)
        assert np.all(np.abs(a - share) < 1 + 1e-9)
    np.testing.assert_array_equal(fm_priors.class_budgets([0.7, 0.2, 0.1], 9, beta=0.0), [3, 3, 3])
    # beta = 1: shares 1/0.7 : 1/0.2 : 1/0.1 of 9 = 0.74 : 2.59 : 5.18 -> [1, 3, 5] after largest remainder
    np.testing.assert_array_equal(fm_priors.class_budgets([0.7, 0.2, 0.1], 9, beta=1.0), [1, 3, 5])


def test_priors_rank_and_suspected_noise():
    q = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.95, 0.05]])
    np.testing.assert_allclose(fm_priors.estimate_class_priors(q), [0.6625, 0.3375])
    assert fm_priors.prior_class_rank([0.1, 0.6, 0.3]).tolist() == [1, 2, 0]
    p = np.array([[0.85, 0.15], [0.9, 0.1], [0.1, 0.9], [0.95, 0.05]])
    labels = np.array([1, 1, 1, 0])
    # item 0: both confident on class 0, label 1 -> flagged; item 1: FM not confident; item 2, 3: agree with label
    assert fm_priors.suspected_noise(p, q, labels, tau=0.8).tolist() == [True, False, False, False]
    w = fm_priors.training_weights(np.array([True, True, False, True]), np.array([True, False, True, False]),
                                   omega=0.2)
    np.testing.assert_allclose(w, [0.2, 1.0, 0.0, 1.0])


def test_cold_start_is_balanced_over_fm_classes():
    rng = np.random.default_rng(0)
    n = 90
    pred = np.repeat([0, 1, 2], [60, 20, 10])
    q = np.full((n, K), 0.05)
    q[np.arange(n), pred] = 0.85
    x = rng.normal(size=(n, 3))
    picks = fm_priors.cold_start_select(x, q, np.zeros(n, bool), 9, rng=rng)
    assert picks.size == 9 and np.unique(picks).size == 9
    np.testing.assert_array_equal(np.bincount(pred[picks], minlength=3), [3, 3, 3])
    # a class with too few items passes its share on
    picks = fm_priors.cold_start_select(x[:62], q[:62], np.zeros(62, bool), 9, rng=rng)
    assert picks.size == 9 and np.bincount(pred[:62][picks], minlength=2)[1] == 2


@pytest.mark.parametrize("call,match", [
    (lambda: fm_priors.FMPriorConfig(alpha=1.5), r"alpha must lie in \[0, 1\] or be None, got 1.5"),
    (lambda: fm_priors.FMPriorConfig(rank_by="size"), r"rank_by must be 'prior' or 'labeled', got 'size'"),
    (lambda: fm_priors.class_budgets([0.5, 0.5], 4, beta=-1.0), r"beta must be a finite value >= 0, got -1.0"),
    (lambda: fm_priors.pool_log_linear(np.full((2, 3), 1 / 3), np.full((3, 3), 1 / 3), 0.5),
     r"p and q must have the same shape, got \(2, 3\) and \(3, 3\)"),
    (lambda: fm_priors.trust_weight(3, 0.0), r"n0 must be > 0, got 0.0"),
    (lambda: fm_priors.cold_start_select(np.zeros((3, 2)), np.full((4, 2), 0.5), np.zeros(3, bool), 1,
                                         rng=np.random.default_rng(0)), r"q must have 3 rows"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
