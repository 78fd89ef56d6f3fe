"""A PettingZoo `ParallelEnv` adapter over a functional MAFE environment (numpy in and out).

Spec: /work/shared/papers/specs/vision_weights_envs.md section 7 (b) ("a thin adapter exposes a
PettingZoo-ParallelEnv-like dict interface for MARL libraries; the JAX core stays functional"). The adapter holds
the only mutable state (current JAX state and PRNG key); each agent's reward is its scalarised
``w_R . c_R + eta . c_rate - lam w_F . c_F`` of the stage, and the per-agent components are returned in ``infos``.
All agents are truncated together at the horizon T (MAFE episodes have a fixed number of stages).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium
import jax
import numpy as np
from pettingzoo import ParallelEnv

from algorithms.fairness.mafe import core

__all__ = ["MAFEParallelEnv"]


class MAFEParallelEnv(ParallelEnv):
    """PettingZoo parallel API for a `core.FairEnv`.

    Args:
      env: the functional environment. params: its EnvParams (default: ``env.default_params()``).
      weights: scalarisation weights (default: ``env.default_weights()``). lam: fairness weight in the rewards.
      seed: default seed when ``reset`` gets none.
    """

    metadata = {"render_modes": [], "name": "mafe_v0", "is_parallelizable": True}

    def __init__(self, env: core.FairEnv, params: Any = None, *, weights: core.Weights | None = None,
                 lam: float = 0.0, seed: int = 0):
        if not isinstance(env, core.FairEnv):
            raise TypeError(f"env must be a FairEnv, got {type(env).__name__}")
        self.env = env
        self.params = env.default_params() if params is None else params
        self.weights = env.default_weights() if weights is None else weights
        core._check_weights(env, self.weights)
        self.lam = float(lam)
        self.possible_agents = list(env.agents)
        self.agents = []
        self.render_mode = None
        self._seed = int(seed)
        self._key = jax.random.key(self._seed)
        self._state = None
        self._step = jax.jit(env.step)
        self._reset = jax.jit(env.reset)
        self._obs_dims = env.obs_dims()
        self._act_dims = env.action_dims()

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> gymnasium.spaces.Box:
        self._check_agent(agent)
        return gymnasium.spaces.Box(0.0, 1.0, (self._obs_dims[agent],), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> gymnasium.spaces.Box:
        self._check_agent(agent)
        return gymnasium.spaces.Box(0.0, 1.0, (self._act_dims[agent],), np.float32)

    def _check_agent(self, agent):
        if agent not in self.possible_agents:
            raise ValueError(f"agent must be one of {self.possible_agents}, got {agent!r}")

    def _np_obs(self, obs):
        return {a: np.clip(np.asarray(obs[a], np.float32), 0.0, 1.0) for a in self.possible_agents}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._key = jax.random.key(int(seed))
        self._key, k = jax.random.split(self._key)
        self._state, obs = self._reset(k, self.params)
        self.agents = list(self.possible_agents)
        return self._np_obs(obs), {a: {} for a in self.agents}

    def step(self, actions: dict):
        if self._state is None or not self.agents:
            raise RuntimeError("step called before reset or after the episode ended; call reset()")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"actions must contain every live agent {self.agents}, missing {missing}")
        acts = {}
        for a in self.possible_agents:
            x = np.asarray(actions[a], np.float32)
            if x.shape != (self._act_dims[a],):
                raise ValueError(f"actions[{a!r}] must have shape ({self._act_dims[a]},), got {x.shape}")
            acts[a] = x
        self._key, k = jax.random.split(self._key)
        self._state, obs, comps, done = self._step(k, self._state, acts, self.params)
        s = core.scalarise(comps, self.weights)
        rewards = {a: float(s[a]["reward"] + s[a]["rate"] - self.lam * s[a]["fair"]) for a in self.agents}
        done = bool(done)
        infos = {a: {kind: np.asarray(comps[a][kind]) for kind in core.COMPONENT_KINDS} for a in self.agents}
        terminations = {a: False for a in self.agents}
        truncations = {a: done for a in self.agents}
        obs_np = self._np_obs(obs)
        out_obs = {a: obs_np[a] for a in self.agents}
        if done:
            self.agents = []
        return out_obs, rewards, terminations, truncations, infos

    def render(self):
        return None

    def close(self):
        pass
