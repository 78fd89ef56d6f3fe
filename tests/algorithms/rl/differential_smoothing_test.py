"""DS-GRPO advantages, the tabular toy's expected updates and the KL-regularized optimum."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from algorithms.rl import differential_smoothing as ds
from primitives import policy_losses


def _batch(seed=0, b=4, g=6):
    rng = np.random.default_rng(seed)
    rewards = (rng.random((b, g)) < 0.5).astype(np.float32)
    rewards[0] = 1.0  # an all-correct group
    logp = -rng.gamma(2.0, 2.0, (b, g)).astype(np.float32)
    return jnp.asarray(rewards), jnp.asarray(logp)


@pytest.mark.parametrize("level", ds.LEVELS)
def test_zero_gammas_equal_grpo_exactly(level):
    r, lp = _batch()
    a = ds.ds_advantages(r, lp, gamma_p=0.0, gamma_n=0.0, level=level)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(policy_losses.group_advantages(r)))


def test_ds_ranks_rarer_correct_higher_and_rarer_incorrect_lower():
    r = jnp.array([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    lp = jnp.array([[-1.0, -6.0, -1.0, -6.0, -3.0, -3.0]])
    for level in ds.LEVELS:
        a = np.asarray(ds.ds_advantages(r, lp, gamma_p=0.1, gamma_n=0.05, level=level))[0]
        grpo = np.asarray(policy_losses.group_advantages(r))[0]
        assert grpo[0] == grpo[1] and grpo[2] == grpo[3]
        assert a[1] > a[4] > a[0]  # correct: rarer is higher
        assert a[3] < a[5] < a[2]  # incorrect: rarer is lower
    a = np.asarray(ds.ds_advantages(r, lp, gamma_p=0.1, gamma_n=0.05))[0]
    np.testing.assert_allclose(a - np.asarray(policy_losses.group_advantages(r))[0],
                               [0.1, 0.6, -0.05, -0.3, 0.3, -0.15], rtol=1e-5)


def test_correct_threshold_splits_partial_credit():
    r = jnp.array([[0.5, 0.5]])
    lp = jnp.array([[-2.0, -2.0]])
    loose = ds.ds_advantages(r, lp, gamma_p=0.1, gamma_n=0.0, correct_threshold=0.5)
    strict = ds.ds_advantages(r, lp, gamma_p=0.1, gamma_n=0.0)
    np.testing.assert_allclose(np.asarray(loose), 0.2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(strict), 0.0, atol=1e-7)


def test_no_gradient_through_the_smoothing_term():
    """Computing the DS advantage from the *current* log-probs inside the loss gives
    exactly the gradient of the surrogate with the advantage frozen."""
    r, lp0 = _batch(seed=1, b=3, g=4)
    mask = jnp.ones((12, 1))

    def loss_inside(lp):
        a = ds.ds_advantages(r, lp.reshape(3, 4), gamma_p=0.3, gamma_n=0.2)
        return policy_losses.clipped_surrogate(lp, jax.lax.stop_gradient(lp), a.reshape(12), mask)[0]

    frozen = ds.ds_advantages(r, lp0, gamma_p=0.3, gamma_n=0.2).reshape(12)
    g_inside = jax.grad(loss_inside)(lp0.reshape(12, 1))
    g_frozen = jax.grad(lambda lp: policy_losses.masked_mean(-frozen[:, None] * lp, mask))(lp0.reshape(12, 1))
    np.testing.assert_allclose(np.asarray(g_inside), np.asarray(g_frozen), rtol=1e-6, atol=1e-8)
    # And through the reward-level form as well.
    g_reward = jax.grad(lambda lp: jnp.sum(ds.ds_advantages(r, lp, gamma_p=0.3, gamma_n=0.2, level="reward")))(lp0)
    assert float(jnp.abs(g_reward).max()) == 0.0


def test_ds_advantage_rejects_bad_arguments():
    r, lp = _batch()
    with pytest.raises(ValueError, match="level"):
        ds.ds_advantages(r, lp, gamma_p=0.1, gamma_n=0.1, level="token")
    with pytest.raises(ValueError, match="gamma"):
        ds.ds_advantages(r, lp, gamma_p=-0.1, gamma_n=0.1)
    with pytest.raises(ValueError, match="seq_logp_old"):
        ds.ds_advantages(r, lp[:, :2], gamma_p=0.1, gamma_n=0.1)


@pytest.mark.parametrize("normalize_std", [True, False])
def test_expected_weights_match_enumeration_of_groups(normalize_std):
    g, c = 4, 0.3
    w_plus, w_minus = ds.grpo_expected_weights(c, g, normalize_std=normalize_std)
    num = {True: 0.0, False: 0.0}
    den = {True: 0.0, False: 0.0}
    for pattern in itertools.product([0.0, 1.0], repeat=g):
        prob = np.prod([c if x else 1 - c for x in pattern])
        a = np.asarray(policy_losses.group_advantages(jnp.array([pattern]), normalize_std=normalize_std))[0]
        key = bool(pattern[0])
        num[key] += prob * a[0]
        den[key] += prob
    assert float(w_plus) == pytest.approx(num[True] / den[True], abs=1e-5)
    assert float(w_minus) == pytest.approx(num[False] / den[False], abs=1e-5)


@pytest.mark.parametrize("kwargs", [{}, {"gamma_p": 0.3, "gamma_n": 0.2}, {"entropy_coef": 0.5},
                                    {"entropy_coef": -0.5, "gamma_p": 0.1}])
def test_tabular_expected_gradient_equals_brute_force_over_all_groups(kwargs):
    """E over all M^G groups of grad of the sampled (DS-)GRPO surrogate (+ entropy term)."""
    m, g = 4, 3
    theta = jnp.array([0.3, -1.0, 1.2, 0.0])
    correct = jnp.array([True, False, True, False])
    rewards_of = np.asarray(correct, np.float32)
    gp, gn, ent = kwargs.get("gamma_p", 0.0), kwargs.get("gamma_n", 0.0), kwargs.get("entropy_coef", 0.0)
    p = np.asarray(jax.nn.softmax(theta))
    groups = np.array(list(itertools.product(range(m), repeat=g)))  # [M^G, G]: every possible group
    prob = jnp.asarray(np.prod(p[groups], axis=1))
    adv = ds.ds_advantages(jnp.asarray(rewards_of[groups]), jnp.asarray(np.log(p)[groups]), gamma_p=gp, gamma_n=gn)

    def expected_objective(th):
        lp = jax.nn.log_softmax(th)[jnp.asarray(groups)]
        return jnp.sum(prob * jnp.mean(adv * lp, axis=1))

    total = np.asarray(jax.grad(expected_objective)(theta), np.float64)
    total += ent * np.asarray(jax.grad(lambda th: policy_losses.entropy_from_logits(th))(theta))
    closed = np.asarray(ds.tabular_expected_gradient(theta, correct, group_size=g, **kwargs))
    np.testing.assert_allclose(closed, total, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def tabular_problem():
    rng = np.random.default_rng(4)
    m = 12
    log_base = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(0, 1.5, m), jnp.float32)))
    correct = np.zeros(m, bool)
    correct[[0, 3, 5, 8]] = True
    return jnp.asarray(log_base), jnp.asarray(correct)


def _solve_numerically(log_base, r, beta, steps=200, lr=None):
    """Mirror ascent (exponentiated gradient, float64) on E_pi[r] - beta KL(pi || pi_base).

    The gradient in pi is r - beta (log pi - log pi_base + 1); the mirror step adds
    lr times it to log pi and renormalizes. Only the objective is used, not its optimum.
    """
    log_base, r = np.asarray(log_base, np.float64), np.asarray(r, np.float64)
    lr = 0.5 / beta if lr is None else lr
    logp = np.full_like(log_base, -np.log(len(log_base)))
    for _ in range(steps):
        logp = logp + lr * (r - beta * (logp - log_base + 1.0))
        logp = logp - np.logaddexp.reduce(logp)
    return np.exp(logp)


@pytest.mark.parametrize("gamma_p, gamma_n, beta", [(0.2, 0.1, 0.5), (0.5, 0.5, 0.5), (0.0, 0.3, 1.0)])
def test_tabular_kl_regularized_optimum_matches_closed_form(tabular_problem, gamma_p, gamma_n, beta):
    log_base, correct = tabular_problem
    r = ds.ds_reward(correct.astype(jnp.float32), log_base, correct, gamma_p=gamma_p, gamma_n=gamma_n)
    closed = np.asarray(ds.kl_regularized_optimum(log_base, r, beta))
    numeric = np.asarray(_solve_numerically(log_base, r, beta))
    np.testing.assert_allclose(numeric, closed, atol=1e-5)
    if gamma_p == beta:  # uniform over the correct set
        c = np.asarray(correct)
        np.testing.assert_allclose(closed[c], closed[c].mean(), rtol=1e-5)


@pytest.mark.parametrize("entropy_coef", [0.5, -0.4])
def test_entropy_regularized_optimum_matches_mirror_ascent(tabular_problem, entropy_coef):
    """Closed form vs mirror ascent on E[r] + c H(pi) - beta KL(pi || pi_base) (bonus c > 0, penalty c < 0)."""
    log_base, correct = tabular_problem
    beta = 1.0
    r = correct.astype(jnp.float32)
    closed = np.asarray(ds.entropy_regularized_optimum(log_base, r, beta=beta, entropy_coef=entropy_coef))
    # Direct mirror ascent on the original objective: gradient in pi is r - c (log pi + 1) - beta (log pi - log base + 1).
    logp = np.full(len(r), -np.log(len(r)))
    lr = 0.5 / (beta + entropy_coef)
    for _ in range(300):
        logp = logp + lr * (np.asarray(r) - entropy_coef * logp - beta * (logp - np.asarray(log_base)))
        logp = logp - np.logaddexp.reduce(logp)
    np.testing.assert_allclose(np.exp(logp), closed, atol=1e-5)
    with pytest.raises(ValueError, match="beta"):
        ds.entropy_regularized_optimum(log_base, r, beta=1.0, entropy_coef=-1.0)


def test_tabular_optimum_improves_correctness_and_diversity_monotonically(tabular_problem):
    log_base, correct = tabular_problem
    beta = 1.0
    c = np.asarray(correct)

    def stats(gp, gn):
        r = ds.ds_reward(correct.astype(jnp.float32), log_base, correct, gamma_p=gp, gamma_n=gn)
        p = np.asarray(ds.kl_regularized_optimum(log_base, r, beta), np.float64)
        q = p[c] / p[c].sum()
        return p[c].sum(), -(q * np.log(q)).sum()

    grid = np.linspace(0.0, beta, 6)
    mass_gn = [stats(0.2, gn)[0] for gn in grid]
    mass_gp = [stats(gp, 0.2)[0] for gp in grid]
    ent_gp = [stats(gp, 0.2)[1] for gp in grid]
    assert all(b >= a - 1e-6 for a, b in zip(mass_gn, mass_gn[1:])) and mass_gn[-1] > mass_gn[0]
    assert all(b >= a - 1e-6 for a, b in zip(mass_gp, mass_gp[1:])) and mass_gp[-1] > mass_gp[0]
    assert all(b >= a - 1e-6 for a, b in zip(ent_gp, ent_gp[1:])) and ent_gp[-1] == pytest.approx(np.log(c.sum()))


def test_tabular_metrics_closed_forms():
    p = jnp.array([0.5, 0.25, 0.25])
    correct = jnp.array([True, True, False])
    m = ds.tabular_metrics(p, correct, ks=(1, 2))
    assert float(m.correct_mass) == pytest.approx(0.75)
    np.testing.assert_allclose(np.asarray(m.pass_at_k), [0.75, 1 - 0.25 ** 2], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m.distinct_correct), [0.75, (1 - 0.25) + (1 - 0.75 ** 2)], rtol=1e-6)
    q = np.array([2 / 3, 1 / 3])
    assert float(m.effective_correct) == pytest.approx(np.exp(-(q * np.log(q)).sum()), rel=1e-5)


def test_tabular_train_vanilla_sharpens_and_ds_keeps_more_correct_solutions(tabular_problem):
    log_base, correct = tabular_problem
    _, van = ds.tabular_train(log_base, correct, num_steps=200, learning_rate=1.0, group_size=8)
    _, dsr = ds.tabular_train(log_base, correct, num_steps=200, learning_rate=1.0, group_size=8, gamma_p=1.0)
    assert float(van.correct_mass[-1]) > 0.95 and float(dsr.correct_mass[-1]) > 0.95
    assert float(dsr.effective_correct[-1]) > float(van.effective_correct[-1]) + 0.5
    assert van.correct_mass.shape == (201,)
