"""Tests of the scalarisation, the F-MACEM objective and the cross-entropy method of MAFE (spec 7 (e))."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.fairness.mafe import core, fmacem
from algorithms.fairness.mafe.education import EducationMAFE, education_policy
from algorithms.fairness.mafe.healthcare import HealthcareMAFE, health_policy
from algorithms.fairness.mafe.loan import LoanMAFE, loan_policy

ENVS = {
    "loan": lambda m=40, t=6: LoanMAFE(num_individuals=m, num_bins=4, horizon=t),
    "health": lambda m=40, t=6: HealthcareMAFE(num_individuals=m, num_bins=3, horizon=t),
    "education": lambda m=40, t=6: EducationMAFE(num_individuals=m, num_bins=3, horizon=t),
}


# ------------------------------------------------------------------------------------------ scalarisation
def test_scalarisation_and_lambda_zero_objective_is_plain_return():
    env = LoanMAFE(num_individuals=50, num_bins=3, horizon=5)
    p = env.default_params()
    pol = loan_policy(env)
    rng = np.random.default_rng(1)
    theta = jnp.asarray(rng.normal(size=sum(pol.dims.values())), jnp.float32)
    r = core.rollout(env, jax.random.key(0), p, pol, theta)
    w = {a: {k: rng.normal(size=len(env.component_names[a][k])).astype(np.float32) for k in core.COMPONENT_KINDS}
         for a in env.agents}
    s = core.scalarise(r["comps"], w)
    for a in env.agents:
        for k in core.COMPONENT_KINDS:
            np.testing.assert_allclose(s[a][k], np.asarray(r["comps"][a][k], np.float64) @ w[a][k].astype(np.float64),
                                       rtol=1e-4, atol=1e-3)
    w["bank"]["rate"][:] = 0
    w["agency"]["rate"][:] = 0
    gamma = 0.9
    plain = sum(sum(gamma ** t * float(s[a]["reward"][t]) for t in range(5)) for a in env.agents)
    obj = core.episode_objective(r["comps"], w, lam=0.0, gamma=gamma)
    np.testing.assert_allclose(float(obj["J"]), plain, rtol=1e-4, atol=1e-3)
    obj2 = core.episode_objective(r["comps"], w, lam=2.0, gamma=gamma)
    np.testing.assert_allclose(float(obj2["J"]), plain - 2.0 * float(obj2["penalty"]), rtol=1e-4, atol=1e-3)
    # the F-MACEM objective at lam = 0 is the mean plain return over its episodes
    f = fmacem.make_objective(env, p, pol, w, lam=0.0, gamma=gamma, num_episodes=2)
    key = jax.random.key(7)
    val = f(theta[None], key)
    ks = jax.random.split(key, 2)
    want = np.mean([float(core.episode_objective(core.rollout(env, k, p, pol, theta)["comps"], w, lam=0.0,
                                                 gamma=gamma)["return"]) for k in ks])
    np.testing.assert_allclose(float(val[0]), want, rtol=1e-4, atol=1e-3)


# ------------------------------------------------------------------------------------------------------ CEM
def test_cem_quadratic_toy_converges():
    target = jnp.array([1.5, -2.0, 0.5])
    res = fmacem.cem(lambda th, k: -jnp.sum((th - target) ** 2, -1), jax.random.key(0), jnp.zeros(3), 2.0,
                     iterations=30)
    np.testing.assert_allclose(res.mean, target, atol=0.05)
    assert res.num_elite == 8 and res.std.max() < 0.1
    assert res.history["elite_mean"][-1] > res.history["elite_mean"][0]


def test_cem_update_elite_fraction():
    rng = np.random.default_rng(0)
    thetas, vals = rng.normal(size=(37, 4)).astype(np.float32), rng.normal(size=37).astype(np.float32)
    ne = fmacem.num_elite(37, 0.125)
    assert ne == math.ceil(0.125 * 37) == 5 and fmacem.num_elite(64, 0.125) == 8
    mu, sig, idx = fmacem.cem_update(jnp.zeros(4), jnp.ones(4), thetas, vals, n_elite=ne, alpha=0.7, noise=0.05)
    top = np.argsort(-vals)[:ne]
    assert set(np.asarray(idx).tolist()) == set(top.tolist())
    np.testing.assert_allclose(mu, 0.7 * thetas[top].mean(0), atol=1e-5)
    np.testing.assert_allclose(sig, 0.3 + 0.7 * thetas[top].std(0) + 0.05, atol=1e-5)


@pytest.mark.parametrize("name", list(ENVS))
def test_fmacem_cooperative_and_independent_improve(name):
    env = ENVS[name](m=40, t=5)
    pol = {"loan": loan_policy, "health": health_policy, "education": education_policy}[name](env)
    p, w = env.default_params(), env.default_weights()
    coop = fmacem.fmacem(env, p, pol, w, jax.random.key(0), lam=0.5, num_candidates=12, iterations=4,
                         num_episodes=2)
    assert coop.theta.shape == (sum(pol.dims.values()),)
    h = coop.history[0]["elite_mean"]
    assert h.shape == (4,) and np.all(np.isfinite(h))
    assert np.all(h >= coop.history[0]["mean"] - 1e-5)  # the elite are the top candidates
    ind = fmacem.independent_fmacem(env, p, pol, w, jax.random.key(0), lam=0.5, num_candidates=12, iterations=2,
                                    rounds=2, num_episodes=2)
    assert ind.theta.shape == coop.theta.shape and len(ind.history) == 4


def test_bank_only_policy_has_no_agency_parameters():
    env = LoanMAFE(num_individuals=30, num_bins=3, horizon=4)
    pol = loan_policy(env, fixed_agency="uniform")
    assert pol.dims == {"bank": 4, "agency": 0}
    res = fmacem.independent_fmacem(env, env.default_params(), pol, env.default_weights(), jax.random.key(0),
                                    lam=0.0, num_candidates=8, iterations=1, rounds=1, num_episodes=1)
    assert res.theta.shape == (4,) and len(res.history) == 1
    acts = pol.apply(pol.split(jnp.zeros(4), env.agents), None, 0)
    np.testing.assert_allclose(acts["agency"], [1, 1, 1, 1, 1, 1, 0])


def test_rollout_checks_theta_shape():
    env = LoanMAFE(num_individuals=10, num_bins=2, horizon=2)
    with pytest.raises(ValueError, match=r"theta must have shape \(8,\)"):
        core.rollout(env, jax.random.key(0), env.default_params(), loan_policy(env), jnp.zeros(5))
