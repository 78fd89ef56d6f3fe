"""DPO / margin-DPO / IPO / SimPO against closed forms (float64 numpy), finite differences and their limits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import preference_losses as pl

RNG = np.random.default_rng(0)
PW, PL, RW, RL = (RNG.normal(-5.0, 2.0, 7) for _ in range(4))
LW, LL = RNG.integers(1, 9, 7).astype(np.float64), RNG.integers(1, 9, 7).astype(np.float64)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _h():
    return (PW - RW) - (PL - RL)


def test_dpo_closed_form():
    np.testing.assert_allclose(pl.dpo_loss(PW, PL, RW, RL, beta=0.3), _softplus(-0.3 * _h()), rtol=1e-5, atol=1e-6)
    # Hand case: h = (-1 - -2) - (-3 - -1) = 3, beta 0.5 -> log(1 + e^{-1.5}).
    got = pl.dpo_loss(jnp.array([-1.0]), jnp.array([-3.0]), jnp.array([-2.0]), jnp.array([-1.0]), beta=0.5)
    np.testing.assert_allclose(got, [np.log1p(np.exp(-1.5))], rtol=1e-6)
    np.testing.assert_allclose(pl.dpo_loss(PW, PL, RW, RL, beta=0.3, reduction="mean"),
                               _softplus(-0.3 * _h()).mean(), rtol=1e-5)


def test_margin_dpo_limits_and_per_pair_hyperparameters():
    np.testing.assert_array_equal(pl.margin_dpo_loss(PW, PL, RW, RL, beta=0.2, margin=0.0),
                                  pl.dpo_loss(PW, PL, RW, RL, beta=0.2))
    margin = RNG.normal(0, 1, 7)
    beta = RNG.uniform(0.05, 1.0, 7)
    np.testing.assert_allclose(pl.margin_dpo_loss(PW, PL, RW, RL, beta=beta, margin=margin),
                               _softplus(-(beta * _h() - margin)), rtol=1e-5, atol=1e-6)
    # A larger margin always costs more; the loss of a satisfied pair goes to 0.
    lo = pl.margin_dpo_loss(PW, PL, RW, RL, beta=0.2, margin=-1.0)
    hi = pl.margin_dpo_loss(PW, PL, RW, RL, beta=0.2, margin=1.0)
    assert np.all(np.asarray(hi) > np.asarray(lo))


def test_ipo_closed_form_and_minimizer():
    tau = 0.25
    np.testing.assert_allclose(pl.ipo_loss(PW, PL, RW, RL, tau=tau), (_h() - 2.0) ** 2, rtol=1e-5, atol=1e-5)
    # The minimizer is h = 1 / (2 tau): zero loss and zero gradient there.
    pw = jnp.array([2.0])
    z = jnp.zeros(1)
    assert float(pl.ipo_loss(pw, z, z, z, tau=tau)[0]) == 0.0
    g = jax.grad(lambda x: pl.ipo_loss(x, z, z, z, tau=tau).sum())(pw)
    assert float(g[0]) == 0.0


def test_simpo_closed_form_and_dpo_limit():
    got = pl.simpo_loss(PW, PL, LW, LL, beta=2.0, gamma=0.4)
    np.testing.assert_allclose(got, _softplus(-(2.0 * (PW / LW - PL / LL) - 0.4)), rtol=1e-5, atol=1e-6)
    # gamma = 0, equal lengths L: DPO with beta / L and equal (here zero) reference log-probs.
    L = np.full(7, 4.0)
    z = np.zeros(7)
    np.testing.assert_allclose(pl.simpo_loss(PW, PL, L, L, beta=2.0, gamma=0.0),
                               pl.dpo_loss(PW, PL, z, z, beta=2.0 / 4.0), rtol=1e-6)
    # Length normalization: doubling a response and its log-prob changes nothing.
    np.testing.assert_allclose(pl.simpo_loss(2 * PW, PL, 2 * LW, LL), pl.simpo_loss(PW, PL, LW, LL), rtol=1e-6)


LOSSES = {
    "dpo": lambda a, b, c, d: pl.dpo_loss(a, b, c, d, beta=0.7),
    "margin_dpo": lambda a, b, c, d: pl.margin_dpo_loss(a, b, c, d, beta=jnp.linspace(0.1, 1.0, 7),
                                                         margin=jnp.linspace(-1.0, 2.0, 7)),
    "ipo": lambda a, b, c, d: pl.ipo_loss(a, b, c, d, tau=0.3),
    "simpo": lambda a, b, c, d: pl.simpo_loss(a, b, jnp.asarray(LW), jnp.asarray(LL), beta=2.5, gamma=0.3),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradient_matches_finite_differences_float64(name):
    fn = LOSSES[name]
    with jax.enable_x64(True):
        args = [jnp.asarray(x, jnp.float64) for x in (PW, PL, RW, RL)]
        weights = jnp.asarray(RNG.normal(size=7), jnp.float64)  # a random direction in the output space

        def total(*a):
            return (fn(*a) * weights).sum()

        grads = jax.grad(total, argnums=(0, 1, 2, 3))(*args)
        eps = 1e-6
        for k in range(4):
            fd = np.zeros(7)
            for i in range(7):
                up = [a.at[i].add(eps) if j == k else a for j, a in enumerate(args)]
                dn = [a.at[i].add(-eps) if j == k else a for j, a in enumerate(args)]
                fd[i] = (float(total(*up)) - float(total(*dn))) / (2 * eps)
            assert grads[k].dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(grads[k]), fd, rtol=1e-6, atol=1e-8, err_msg=f"{name} arg {k}")


def test_dpo_gradient_closed_form():
    # d/d logpi(y_w) of -log sigmoid(beta h) = -beta sigmoid(-beta h); opposite sign for y_l and the reference.
    with jax.enable_x64(True):
        args = [jnp.asarray(x, jnp.float64) for x in (PW, PL, RW, RL)]
        g = jax.grad(lambda *a: pl.dpo_loss(*a, beta=0.7).sum(), argnums=(0, 1, 2, 3))(*args)
        s = 0.7 / (1 + np.exp(0.7 * _h()))
        for got, sign in zip(g, (-1, 1, 1, -1)):
            np.testing.assert_allclose(np.asarray(got), sign * s, rtol=1e-10)


def test_extreme_gaps_stay_finite():
    big = jnp.array([1e4, -1e4])
    z = jnp.zeros(2)
    for loss in (pl.dpo_loss(big, z, z, z), pl.margin_dpo_loss(big, z, z, z, margin=3.0),
                 pl.simpo_loss(big, z, jnp.ones(2), jnp.ones(2))):
        assert np.all(np.isfinite(np.asarray(loss)))
    np.testing.assert_allclose(pl.dpo_loss(big, z, z, z, beta=1.0), [0.0, 1e4], rtol=1e-6)
    g = jax.grad(lambda x: pl.dpo_loss(x, z, z, z).sum())(big)
    assert np.all(np.isfinite(np.asarray(g)))


def test_implicit_reward_accuracy_and_empty():
    acc = pl.implicit_reward_accuracy(PW, PL, RW, RL)
    np.testing.assert_allclose(float(acc), float((_h() > 0).mean()))
    e = jnp.zeros(0)
    assert float(pl.dpo_loss(e, e, e, e, reduction="mean")) == 0.0
    assert pl.dpo_loss(e, e, e, e).shape == (0,)


BAD = [
    (lambda: pl.dpo_loss(jnp.zeros(3), jnp.zeros(2), jnp.zeros(3), jnp.zeros(3)), r"policy_rejected_logp must have n=3"),
    (lambda: pl.dpo_loss(jnp.zeros((2, 3)), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2)),
     r"policy_chosen_logp must be \[n\]"),
    (lambda: pl.dpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), beta=0.0), r"beta must be > 0"),
    (lambda: pl.dpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), beta=float("nan")),
     r"beta must be finite"),
    (lambda: pl.dpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), reduction="sum"),
     r"reduction must be one of \('none', 'mean'\); got 'sum'"),
    (lambda: pl.margin_dpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), margin=jnp.zeros(3)),
     r"margin must be a scalar or \[n\]=\(2,\)"),
    (lambda: pl.margin_dpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), margin=float("inf")),
     r"margin must be finite"),
    (lambda: pl.ipo_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), tau=-1.0), r"tau must be > 0"),
    (lambda: pl.simpo_loss(jnp.zeros(2), jnp.zeros(2), jnp.array([1, 0]), jnp.ones(2)),
     r"chosen_lengths must be > 0"),
]


@pytest.mark.parametrize("call,match", BAD)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
