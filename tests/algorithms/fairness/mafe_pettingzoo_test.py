"""The PettingZoo ParallelEnv adapter of MAFE passes PettingZoo's own API test and returns the scalarised components."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from algorithms.fairness.mafe import core
from algorithms.fairness.mafe.education import EducationMAFE
from algorithms.fairness.mafe.healthcare import HealthcareMAFE
from algorithms.fairness.mafe.loan import LoanMAFE
from algorithms.fairness.mafe.pettingzoo_env import MAFEParallelEnv


@pytest.mark.parametrize("env", [LoanMAFE(num_individuals=30, num_bins=3, horizon=4),
                                 HealthcareMAFE(num_individuals=30, num_bins=2, horizon=3),
                                 EducationMAFE(num_individuals=30, num_bins=2, horizon=3)],
                         ids=["loan", "health", "education"])
def test_parallel_api_test_passes(env):
    parallel_api_test(MAFEParallelEnv(env, lam=0.5), num_cycles=20)


def test_dict_api_all_agents_each_step_done_at_horizon_and_rewards_scalarised():
    env = LoanMAFE(num_individuals=40, num_bins=3, horizon=3)
    pz = MAFEParallelEnv(env, lam=2.0)
    obs, infos = pz.reset(seed=1)
    assert set(obs) == set(infos) == {"bank", "agency"}
    w = env.default_weights()
    for t in range(3):
        acts = {a: pz.action_space(a).sample() for a in pz.agents}
        obs, rew, term, trunc, info = pz.step(acts)
        assert set(obs) == set(rew) == set(term) == set(trunc) == {"bank", "agency"}
        for a in ("bank", "agency"):
            assert pz.observation_space(a).contains(obs[a])
            c = info[a]
            want = (np.dot(w[a]["reward"], c["reward"]) + np.dot(w[a]["rate"], c["rate"])
                    - 2.0 * np.dot(w[a]["fair"], c["fair"]))
            np.testing.assert_allclose(rew[a], want, rtol=1e-5, atol=1e-5)
        assert all(trunc.values()) == (t == 2) and not any(term.values())
    assert pz.agents == []
    with pytest.raises(RuntimeError, match="reset"):
        pz.step({"bank": np.zeros(7), "agency": np.zeros(7)})
    # same seed => same trajectory (the adapter's randomness is its JAX key)
    o1, _ = pz.reset(seed=5)
    o2, _ = pz.reset(seed=5)
    for a in o1:
        np.testing.assert_array_equal(o1[a], o2[a])


def test_adapter_bad_input_names_the_argument():
    env = LoanMAFE(num_individuals=20, num_bins=2, horizon=2)
    pz = MAFEParallelEnv(env)
    pz.reset(seed=0)
    with pytest.raises(ValueError, match="missing"):
        pz.step({"bank": np.zeros(5)})
    with pytest.raises(ValueError, match=r"actions\['agency'\] must have shape \(5,\)"):
        pz.step({"bank": np.zeros(5), "agency": np.zeros(3)})
    with pytest.raises(ValueError, match="agent must be one of"):
        pz.action_space("nobody")
    with pytest.raises(TypeError, match="env must be a FairEnv"):
        MAFEParallelEnv(object())
    w = env.default_weights()
    w["agency"] = {**w["agency"], "reward": np.ones(5)}
    with pytest.raises(ValueError, match=r"weights\['agency'\]\['reward'\]"):
        MAFEParallelEnv(env, weights=w)
    assert core.COMPONENT_KINDS == ("reward", "fair", "rate")
