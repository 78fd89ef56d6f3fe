"""IsoCompute protocol pieces and the GRPO bandit surrogate (algorithms.rl.compute_allocation)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.rl import compute_allocation as ca
from primitives.policy_losses import group_advantages


@pytest.mark.parametrize("exact", [True, False])
def test_budget_accounting(exact):
    budgets, ns, bps = [100, 256, 1000], [1, 2, 3, 8, 64], [1, 4, 7]
    cfgs = ca.iso_compute_configs(budgets, ns, bps, exact=exact)
    assert cfgs
    for c in cfgs:
        per_step = c.n * c.num_problems
        assert c.rollouts <= c.budget and c.rollouts > c.budget - per_step
        if exact:
            assert c.rollouts == c.budget
    # every admissible triple is emitted exactly once
    want = {(C, n, b) for C, n, b in itertools.product(budgets, ns, bps)
            if C // (n * b) >= 1 and (not exact or C % (n * b) == 0)}
    assert {(c.budget, c.n, c.num_problems) for c in cfgs} == want


def test_fixed_batch_pairs_multiply_to_the_batch():
    pairs = ca.fixed_batch_pairs(96, [1, 2, 5, 8, 32, 96, 128])
    assert pairs == [(96, 1), (48, 2), (12, 8), (3, 32), (1, 96)]
    assert all(bp * n == 96 for bp, n in pairs)
    with pytest.raises(ValueError, match="batch_size"):
        ca.fixed_batch_pairs(0, [1])


def test_frontier_is_the_argmax_per_budget():
    rng = np.random.default_rng(0)
    rows = [dict(budget=C, n=n, score=float(rng.random())) for C in (8, 16) for n in (1, 2, 4)]
    f = ca.frontier(rows)
    for C in (8, 16):
        assert f[C]["score"] == max(r["score"] for r in rows if r["budget"] == C)


def test_equal_rewards_give_zero_advantages_and_the_non_degenerate_probability():
    assert np.all(np.asarray(group_advantages(jnp.ones((3, 5)))) == 0)
    assert np.all(np.asarray(group_advantages(jnp.zeros((3, 5)))) == 0)
    p = np.array([0.01, 0.1, 0.5, 0.9])
    probs = np.stack([ca.non_degenerate_prob(n, p) for n in range(1, 17)])
    assert np.all(np.diff(probs, axis=0) > 0)  # increasing in n for 0 < p < 1
    assert np.all(probs[0] == 0)  # n = 1: never a learning signal
    # Monte Carlo: 20k groups of n = 4 at p = 0.1; tolerance 5 standard errors
    r = np.random.default_rng(1).random((20000, 4)) < 0.1
    mc = np.mean(r.any(1) & ~r.all(1))
    want = ca.non_degenerate_prob(4, 0.1)
    assert abs(mc - want) < 5 * np.sqrt(want * (1 - want) / 20000)


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_advantage_weight_matches_enumeration(n, normalize_std):
    # E[A_1 | r_1 = 1] - E[A_1 | r_1 = 0], enumerating all 2^n reward vectors
    p, eps = 0.3, 1e-6
    f = {0: 0.0, 1: 0.0}
    for r in itertools.product([0.0, 1.0], repeat=n):
        r = np.array(r)
        prob_rest = np.prod(np.where(r[1:] == 1, p, 1 - p))
        m = r.mean()
        sd = np.sqrt(m * (1 - m))
        a1 = (r[0] - m) / (sd + eps) if normalize_std else r[0] - m
        f[int(r[0])] += prob_rest * a1
    got = float(ca.advantage_weight(n, p, normalize_std=normalize_std))
    np.testing.assert_allclose(got, f[1] - f[0], rtol=1e-4, atol=1e-6)


def test_exact_gradient_is_the_expectation_of_the_monte_carlo_gradient():
    bandit = ca.make_bandit(jax.random.key(0), np.array([0.2, 0.5, 0.7]), num_answers=6, dim=4)
    theta = jnp.array([0.1, -0.2, 0.3, 0.0])
    keys = jax.random.split(jax.random.key(1), 4000)
    g = jax.vmap(lambda k: ca.mc_gradient(k, bandit, theta, 4))(keys)
    mean, se = np.asarray(g.mean(0)), np.asarray(g.std(0)) / np.sqrt(len(keys))
    exact = np.asarray(ca.exact_gradient(bandit, theta, 4))
    assert np.all(np.abs(mean - exact) < 5 * se + 1e-6), (mean, exact, se)


def test_make_bandit_sets_the_base_correct_mass():
    m = np.array([0.01, 0.3, 0.95])
    b = ca.make_bandit(jax.random.key(2), m, num_answers=8, dim=3)
    np.testing.assert_allclose(np.asarray(ca.correct_mass(b, jnp.zeros(3))), m, rtol=1e-5)
    with pytest.raises(ValueError, match="base_correct_mass"):
        ca.make_bandit(jax.random.key(2), np.array([0.0, 0.5]))


def test_saturating_fit_recovers_known_parameters():
    x = np.linspace(8, 20, 25)
    true = (1.0, 8.0, 0.9, 13.0)
    y = ca.saturating_curve(x, *true) + 0.01 * np.random.default_rng(3).standard_normal(x.size)
    fit = ca.fit_saturating(x, y)
    np.testing.assert_allclose([fit.a, fit.b, fit.k, fit.c0], true, rtol=0.05)
    with pytest.raises(ValueError, match=">= 4 points"):
        ca.fit_saturating(x[:3], y[:3])


def test_bandit_n1_gets_no_signal_and_n8_learns():
    bandit = ca.make_bandit(jax.random.key(4), np.full(16, 0.2), num_answers=8, dim=8)
    budget, bp = 4096, 8
    r1 = ca.train_bandit(jax.random.key(5), bandit, n=1, num_problems=bp, steps=budget // bp)
    r8 = ca.train_bandit(jax.random.key(5), bandit, n=8, num_problems=bp, steps=budget // (8 * bp))
    assert float(r1["best"]) <= float(r8["best"])
    np.testing.assert_allclose(np.asarray(r1["final_p"]), 0.2, rtol=1e-5)  # all-equal groups: zero gradient
    assert float(r8["best"]) > 0.3
    with pytest.raises(ValueError, match="num_problems"):
        ca.train_bandit(jax.random.key(5), bandit, n=2, num_problems=17, steps=1)


def test_per_problem_exact_gradient_matches_a_float64_closed_form():
    # theta [P, D]: row p's gradient is (1/P) (f1 - f0)(p_p) p_p phi_p^T (e_c - pi_p), in float64 numpy.
    bandit = ca.make_bandit(jax.random.key(6), np.array([0.1, 0.4, 0.8]), num_answers=5, dim=3)
    theta = np.random.default_rng(7).normal(0, 0.3, (3, 3)).astype(np.float32)
    got = np.asarray(ca.exact_gradient(bandit, jnp.asarray(theta), 4))
    base, phi, correct = (np.asarray(x, np.float64) for x in bandit)
    want = np.zeros((3, 3))
    for p in range(3):
        logits = base[p] + phi[p] @ theta[p].astype(np.float64)
        pi = np.exp(logits - logits.max()); pi /= pi.sum()
        c = int(correct[p])
        w = float(ca.advantage_weight(4, pi[c]))
        want[p] = w * pi[c] * phi[p].T @ (np.eye(5)[c] - pi) / 3
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    # per-problem correct masses equal the shared-theta masses of one-problem bandits
    for p in range(3):
        one = ca._sub(bandit, jnp.array([p]))
        np.testing.assert_allclose(float(ca.correct_mass(bandit, jnp.asarray(theta))[p]),
                                   float(ca.correct_mass(one, jnp.asarray(theta[p]))[0]), rtol=1e-5)


def test_per_problem_parameters_leave_a_never_solved_problem_unchanged():
    # Problem 0 has correct mass 1e-7: its groups of 4 never hold a success, so with its own parameters
    # it never moves (zero-variance groups give no gradient), while shared parameters move it with the rest.
    masses = np.array([1e-7, 0.3, 0.3, 0.3])
    bandit = ca.make_bandit(jax.random.key(8), masses, num_answers=8, dim=4)
    own = ca.train_bandit(jax.random.key(9), bandit, n=4, num_problems=4, steps=64, per_problem=True)
    shared = ca.train_bandit(jax.random.key(9), bandit, n=4, num_problems=4, steps=64)
    assert own["theta"].shape == (4, 4) and shared["theta"].shape == (4,)
    np.testing.assert_array_equal(np.asarray(own["theta"][0]), 0.0)
    assert float(own["final_p"][0]) == pytest.approx(1e-7, rel=1e-3)
    assert abs(float(shared["final_p"][0]) - 1e-7) > 1e-9
    assert float(np.mean(own["final_p"][1:])) > 0.3  # the solvable problems learn
