"""Policy-gradient primitives against numpy / closed forms / brute force."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import policy_losses


def test_group_advantages_zero_sum_shift_invariant_and_numpy():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(5, 8)).astype(np.float32)
    a = np.asarray(policy_losses.group_advantages(r))
    np.testing.assert_allclose(a.sum(-1), 0.0, atol=1e-5)
    expected = (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(policy_losses.group_advantages(r + 3.7)), a, atol=1e-4)
    centred = np.asarray(policy_losses.group_advantages(r, normalize_std=False))
    np.testing.assert_allclose(centred, r - r.mean(-1, keepdims=True), atol=1e-6)


def test_group_with_equal_rewards_has_zero_advantage():
    r = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    a = np.asarray(policy_losses.group_advantages(r))
    assert np.all(a[:2] == 0.0)
    assert a[2, 0] > 0 > a[2, 1]


def test_group_advantages_rejects_bad_shape():
    with pytest.raises(ValueError, match="rewards"):
        policy_losses.group_advantages(jnp.ones(4))


def test_token_logprobs_and_sequence_logprob():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 4, 6)).astype(np.float32)
    tokens = rng.integers(0, 6, (3, 4))
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    lp = np.asarray(policy_losses.token_logprobs(jnp.asarray(logits), jnp.asarray(tokens), temperature=0.5))
    z = logits / 0.5
    ref = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ref = np.take_along_axis(ref, tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(lp, ref, rtol=1e-5, atol=1e-5)
    s = np.asarray(policy_losses.sequence_logprob(jnp.asarray(lp), jnp.asarray(mask), reduction="sum"))
    m = np.asarray(policy_losses.sequence_logprob(jnp.asarray(lp), jnp.asarray(mask), reduction="mean"))
    np.testing.assert_allclose(s, (lp * mask).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(m, (lp * mask).sum(-1) / mask.sum(-1), rtol=1e-5)


def test_entropy_from_logits_matches_numpy_and_handles_masked_tokens():
    logits = np.array([[0.0, 1.0, 2.0], [0.0, -np.inf, 0.0]], np.float32)
    h = np.asarray(policy_losses.entropy_from_logits(jnp.asarray(logits)))
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    np.testing.assert_allclose(h, [-(p * np.log(p)).sum(), np.log(2)], rtol=1e-6)


def test_masked_mean_reductions():
    x = jnp.array([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], jnp.float32)
    assert float(policy_losses.masked_mean(x, mask, reduction="token_mean")) == pytest.approx(16.0 / 4)
    assert float(policy_losses.masked_mean(x, mask, reduction="sequence_mean")) == pytest.approx((2.0 + 10.0) / 2)
    with pytest.raises(ValueError, match="reduction"):
        policy_losses.masked_mean(x, mask, reduction="sum")


@pytest.mark.parametrize("reduction", policy_losses.REDUCTIONS)
def test_clipped_surrogate_at_ratio_one_is_plain_policy_gradient(reduction):
    rng = np.random.default_rng(2)
    logp = jnp.asarray(rng.normal(size=(4, 5)) - 2.0, jnp.float32)
    adv = jnp.asarray(rng.normal(size=(4,)), jnp.float32)
    mask = jnp.asarray(rng.random((4, 5)) < 0.7, jnp.float32).at[:, 0].set(1.0)
    loss, metrics = policy_losses.clipped_surrogate(logp, logp, adv, mask, reduction=reduction)
    assert float(loss) == pytest.approx(float(policy_losses.masked_mean(-adv[:, None] * jnp.ones_like(logp), mask,
                                                                        reduction=reduction)), abs=1e-6)
    assert float(metrics["clip_fraction"]) == 0.0
    g = jax.grad(lambda lp: policy_losses.clipped_surrogate(lp, logp, adv, mask, reduction=reduction)[0])(logp)
    g_pg = jax.grad(lambda lp: policy_losses.masked_mean(-adv[:, None] * lp, mask, reduction=reduction))(logp)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_pg), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "log_ratio, adv, zero_grad",
    [(np.log(1.5), 1.0, True), (np.log(1.5), -1.0, False), (np.log(0.5), -1.0, True), (np.log(0.5), 1.0, False),
     (np.log(1.1), 1.0, False), (np.log(0.9), -1.0, False)],
)
def test_clipped_surrogate_gradient_vanishes_outside_clip_range_in_the_pushed_direction(log_ratio, adv, zero_grad):
    old = jnp.full((1, 1), -1.0)
    mask = jnp.ones((1, 1))
    grad = jax.grad(lambda lp: policy_losses.clipped_surrogate(lp, old, jnp.array([adv]), mask, clip_eps=0.2)[0])(
        old + log_ratio)
    if zero_grad:
        assert float(grad[0, 0]) == 0.0
    else:  # unclipped: d/dlogp of -ratio * A = -ratio * A
        assert float(grad[0, 0]) == pytest.approx(-np.exp(log_ratio) * adv, rel=1e-5)


def test_clipped_surrogate_validates_shapes():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="advantages"):
        policy_losses.clipped_surrogate(x, x, jnp.zeros(3), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="logp"):
        policy_losses.clipped_surrogate(x, jnp.zeros((2, 4)), jnp.zeros(2), jnp.ones((2, 3)))


def test_k3_kl_is_nonnegative_and_unbiased_for_categorical():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(5))
    q = rng.dirichlet(np.ones(5))
    exact = float((p * np.log(p / q)).sum())
    n = 200_000
    samples = rng.choice(5, size=n, p=p)
    est = np.asarray(policy_losses.k3_kl(jnp.asarray(np.log(p)[samples]), jnp.asarray(np.log(q)[samples])))
    assert est.min() >= -1e-6
    # Tolerance: 5 standard errors of the Monte Carlo mean.
    assert abs(est.mean() - exact) < 5 * est.std() / np.sqrt(n)
    assert float(policy_losses.k3_kl(jnp.asarray(-0.3), jnp.asarray(-0.3))) == 0.0


@pytest.mark.parametrize("n, c, k", [(10, 3, 1), (10, 3, 4), (64, 5, 32), (20, 1, 20), (7, 0, 3), (7, 7, 3)])
def test_pass_at_k_matches_binomial_formula(n, c, k):
    exact = 1.0 - (math.comb(n - c, k) / math.comb(n, k) if n - c >= k else 0.0)
    assert float(policy_losses.pass_at_k(n, c, k)) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_edge_cases_and_monotone():
    assert float(policy_losses.pass_at_k(16, 0, 8)) == 0.0
    assert float(policy_losses.pass_at_k(16, 16, 8)) == 1.0
    assert float(policy_losses.pass_at_k(16, 10, 8)) == 1.0  # n - c = 6 < k = 8
    assert float(policy_losses.pass_at_k(16, 5, 1)) == pytest.approx(5 / 16)
    vals = [float(policy_losses.pass_at_k(64, 3, k)) for k in range(1, 65)]
    assert all(b >= a for a, b in zip(vals, vals[1:]))
    out = policy_losses.pass_at_k(np.array([10, 10]), np.array([0, 10]), 2)
    assert out.tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="k"):
        policy_losses.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="num_correct"):
        policy_losses.pass_at_k(4, 5, 1)


def test_count_distinct_correct():
    assert policy_losses.count_distinct_correct(["a", "b", "a", "c", "d"], [1, 1, 1, 0, 1]) == 3
    assert policy_losses.count_distinct_correct([], []) == 0
    with pytest.raises(ValueError, match="length"):
        policy_losses.count_distinct_correct(["a"], [True, False])
