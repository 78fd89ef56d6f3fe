"""The Fair Dec-POMDP abstraction of MAFE: component functions, group reductions, scalarisation, rollouts.

A Fair Dec-POMDP is ``(N, S, {A_n}, {O_n}, T, gamma, {c_n^(R)}, {c_n^(F)})``: N heterogeneous agents act on a
population, each agent n has reward component functions ``c_n^(R)`` and fairness component functions ``c_n^(F)``
(vectors of observables, e.g. approvals per group and disparities), and a reward or penalty is a configurable
linear scalarisation ``w_n . c_n`` (spec: /work/shared/papers/specs/vision_weights_envs.md, section 7 (b)).
Besides "reward" and "fair" every environment also returns "rate" components (per-group rates), the
"rate-based terms" of the F-MACEM objective (spec 7 (g) 2, [INFER]).

Every environment (`FairEnv`) is a pure functional JAX object:

    params = env.default_params()                       # EnvParams: dynamics, interventions
    state, obs = env.reset(key, params)                 # obs: dict agent -> (obs_dim,) float32 in [0, 1]
    state, obs, comps, done = env.step(key, state, actions, params)
    comps == {agent: {"reward": (m_R,), "fair": (m_F,), "rate": (m_r,)}}

``step`` splits into ``draw_noise(key, state, params)`` (all randomness, uniforms/normals of shape (M,)) and
``transition(state, actions, params, noise)`` (pure arithmetic), so the vectorised step can be compared with
a plain numpy loop on the same draws, and a "deterministic" (mean-field) mode replaces each Bernoulli event
by its probability. Static sizes (population M, score bins B, horizon T) live on the env object; everything
continuous lives in the params pytree, so rollouts can be vmapped over keys, parameters and policies.

Which parts are inferred: the formal tuple and the component-function design are from the paper's
abstract and secondary summaries [READ]; the rate components, the observation contents and everything in
the three domain modules are our own instantiations [INFER].

References: Lazri, Nakra, Brugere, Dervovic, Polychroniadou, Huang, Dachman-Soled, Wu, "MAFE: Enabling Equitable
Algorithm Design in Multi-Agent Multi-Stage Decision-Making Systems", arXiv 2502.18534.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FairEnv", "Policy", "Weights", "group_sum", "group_bin_sum", "group_mean", "safe_rate", "abs_gap",
           "ratio_gap", "capped_by_priority", "scalarise", "rollout", "episode_objective", "unit_weights",
           "check_actions"]

NUM_GROUPS = 2
COMPONENT_KINDS = ("reward", "fair", "rate")


# --------------------------------------------------------------------------------------------- group reductions
def group_sum(x: jax.Array, group: jax.Array, num_groups: int = NUM_GROUPS) -> jax.Array:
    """Per-group sums of ``x``: ``out[g] = sum_{i: group_i = g} x_i``.

    Args:
      x: (M,) values (indicators, probabilities or amounts).
      group: (M,) int group ids in ``[0, num_groups)``.

    Returns:
      (num_groups,) sums (a `jax.ops.segment_sum`).
    """
    return jax.ops.segment_sum(x, group, num_segments=num_groups)


def group_bin_sum(x: jax.Array, group: jax.Array, bins: jax.Array, num_bins: int,
                  num_groups: int = NUM_GROUPS) -> jax.Array:
    """Per-(group, bin) sums: (num_groups, num_bins), ``out[g, b] = sum_{i: group_i=g, bin_i=b} x_i``."""
    flat = jax.ops.segment_sum(x, group * num_bins + bins, num_segments=num_groups * num_bins)
    return flat.reshape(num_groups, num_bins)


def safe_rate(num: jax.Array, den: jax.Array) -> jax.Array:
    """``num / den`` with 0 where ``den == 0`` (a group with no members has rate 0)."""
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def group_mean(x: jax.Array, group: jax.Array, num_groups: int = NUM_GROUPS) -> jax.Array:
    """(num_groups,) mean of ``x`` within each group (0 for an empty group)."""
    return safe_rate(group_sum(x, group, num_groups), group_sum(jnp.ones_like(x), group, num_groups))


def abs_gap(r: jax.Array) -> jax.Array:
    """Disparity ``|r_0 - r_1|`` of a per-group quantity r: (2,) (demographic-parity style gap)."""
    return jnp.abs(r[0] - r[1])


def ratio_gap(r: jax.Array, eps: float = 1e-9) -> jax.Array:
    """Ratio-form disparity ``1 - min(r) / max(r)`` in [0, 1] (0 when equal; 0 when both are 0)."""
    hi = jnp.max(r)
    return jnp.where(hi > eps, 1.0 - jnp.min(r) / jnp.maximum(hi, eps), 0.0)


def capped_by_priority(want: jax.Array, priority: jax.Array, capacity: jax.Array,
                       deterministic: jax.Array) -> jax.Array:
    """Serves at most ``capacity`` of the requests ``want`` (a capacity constraint, e.g. beds or seats).

    Stochastic mode (``want`` in {0, 1}): the requests with the smallest ``priority`` (uniform draws, so a
    random order) are served, exactly ``min(capacity, sum(want))`` of them (``capacity`` is floored).
    Deterministic (mean-field) mode (``want`` in [0, 1]): every request is scaled by
    ``min(1, capacity / sum(want))``.

    Args:
      want: (M,) requests. priority: (M,) uniforms. capacity: () number of slots. deterministic: () flag.

    Returns:
      (M,) served, ``served <= want`` and ``sum(served) <= capacity``.
    """
    key = jnp.where(want > 0.5, priority, 2.0 + priority)
    rank = jnp.argsort(jnp.argsort(key))
    served_stoch = jnp.where((want > 0.5) & (rank < jnp.floor(capacity)), 1.0, 0.0)
    total = jnp.sum(want)
    served_det = want * jnp.minimum(1.0, capacity / jnp.maximum(total, 1e-12))
    return jnp.where(deterministic > 0.5, served_det, served_stoch)


def bernoulli_or_mean(u: jax.Array, p: jax.Array, deterministic: jax.Array) -> jax.Array:
    """An event of probability p: the indicator ``u < p`` (stochastic) or ``p`` itself (mean-field mode)."""
    return jnp.where(deterministic > 0.5, p, (u < p).astype(p.dtype))


def score_bins(x: jax.Array, lo: float, hi: float, num_bins: int) -> jax.Array:
    """Equal-width bin index in ``[0, num_bins)`` of values x on ``[lo, hi]`` (clipped at the ends)."""
    b = jnp.floor((x - lo) / (hi - lo) * num_bins).astype(jnp.int32)
    return jnp.clip(b, 0, num_bins - 1)


# ------------------------------------------------------------------------------------------------- environments
class FairEnv(abc.ABC):
    """A Fair Dec-POMDP over a population with a binary protected attribute (see the module docstring).

    Subclasses set ``agents`` (ordered names), ``component_names`` ({agent: {"reward"|"fair"|"rate": names}})
    and the static sizes ``num_individuals`` (M) and ``horizon`` (T), and implement `default_params`,
    `default_weights`, `init_state`, `draw_noise`, `transition`, `observe`, `action_dims`, `obs_dims` and `summary`.
    Actions are dicts agent -> float array of shape ``(action_dims[agent],)`` in [0, 1].
    """

    agents: tuple[str, ...] = ()
    component_names: Mapping[str, Mapping[str, tuple[str, ...]]] = {}
    num_individuals: int
    horizon: int

    @abc.abstractmethod
    def default_params(self, **overrides) -> Any:
        """The EnvParams pytree with the spec's defaults, fields replaced by ``overrides``."""

    @abc.abstractmethod
    def init_state(self, key: jax.Array, params: Any) -> Any:
        """The initial population and agent state."""

    @abc.abstractmethod
    def draw_noise(self, key: jax.Array, state: Any, params: Any) -> dict:
        """All the randomness of one step (dict of (M,) arrays)."""

    @abc.abstractmethod
    def transition(self, state: Any, actions: Mapping[str, jax.Array], params: Any, noise: Mapping) -> tuple:
        """``(next_state, comps)``: the pure, deterministic part of a step given the noise."""

    @abc.abstractmethod
    def observe(self, state: Any, params: Any) -> dict:
        """Per-agent observations (partial views), dict agent -> (obs_dim,) float32 in [0, 1]."""

    @abc.abstractmethod
    def action_dims(self) -> dict:
        """agent -> length of its action vector."""

    @abc.abstractmethod
    def obs_dims(self) -> dict:
        """agent -> length of its observation vector."""

    @abc.abstractmethod
    def default_weights(self) -> dict:
        """The scalarisation weights {agent: {"reward": w_R, "fair": w_F, "rate": eta}} used by default."""

    @abc.abstractmethod
    def summary(self, state: Any) -> dict:
        """Group-level diagnostics of a state (e.g. mean score per group), dict of (2,) arrays."""

    def reset(self, key: jax.Array, params: Any) -> tuple[Any, dict]:
        """``(state, obs)`` of a fresh episode (pure in ``key``)."""
        state = self.init_state(key, params)
        return state, self.observe(state, params)

    def step(self, key: jax.Array, state: Any, actions: Mapping[str, jax.Array], params: Any):
        """One stage: ``(next_state, obs, comps, done)``; ``done`` is True once ``t == horizon``."""
        noise = self.draw_noise(key, state, params)
        nxt, comps = self.transition(state, actions, params, noise)
        return nxt, self.observe(nxt, params), comps, nxt.t >= self.horizon


def check_actions(env: FairEnv, actions: Mapping[str, Any]) -> None:
    """Raises ValueError naming ``actions`` when agents or shapes do not match ``env.action_dims()``."""
    dims = env.action_dims()
    if set(actions) != set(dims):
        raise ValueError(f"actions must have one entry per agent {sorted(dims)}, got {sorted(actions)}")
    for a, d in dims.items():
        shape = tuple(np.shape(actions[a]))
        if shape != (d,):
            raise ValueError(f"actions[{a!r}] must have shape ({d},), got {shape}")


def _check_population(name: str, m: int, horizon: int, num_bins: int | None = None) -> None:
    if int(m) < 2:
        raise ValueError(f"num_individuals of {name} must be >= 2, got {m}")
    if int(horizon) < 1:
        raise ValueError(f"horizon of {name} must be >= 1, got {horizon}")
    if num_bins is not None and int(num_bins) < 1:
        raise ValueError(f"num_bins of {name} must be >= 1, got {num_bins}")


# --------------------------------------------------------------------------------------------- scalarisation
Weights = Mapping[str, Mapping[str, Any]]  # agent -> {"reward": w_R, "fair": w_F, "rate": eta}


def unit_weights(env: FairEnv) -> dict:
    """Unit weights on every reward and fairness component, zero rate weights (for tests; the envs' own
    ``default_weights()`` pick the meaningful components)."""
    out = {}
    for a in env.agents:
        names = env.component_names[a]
        out[a] = {k: np.ones(len(names[k]), np.float32) if k != "rate" else np.zeros(len(names[k]), np.float32)
                  for k in COMPONENT_KINDS}
    return out


def _check_weights(env: FairEnv, weights: Weights) -> None:
    if set(weights) != set(env.agents):
        raise ValueError(f"weights must have one entry per agent {list(env.agents)}, got {sorted(weights)}")
    for a in env.agents:
        for k in COMPONENT_KINDS:
            n = len(env.component_names[a][k])
            shape = tuple(np.shape(weights[a][k]))
            if shape != (n,):
                raise ValueError(f"weights[{a!r}][{k!r}] must have shape ({n},) ({env.component_names[a][k]}), "
                                 f"got {shape}")


def scalarise(comps: Mapping[str, Mapping[str, jax.Array]], weights: Weights) -> dict:
    """Per-agent reward ``w_R . c_R`` and fairness penalty ``w_F . c_F`` (and rate term ``eta . c_rate``).

    Args:
      comps: {agent: {"reward": (..., m_R), "fair": (..., m_F), "rate": (..., m_r)}} (leading axes allowed).
      weights: {agent: {"reward": (m_R,), "fair": (m_F,), "rate": (m_r,)}}.

    Returns:
      {agent: {"reward": (...,), "fair": (...,), "rate": (...,)}} the dot products.
    """
    return {a: {k: jnp.einsum("...m,m->...", comps[a][k], jnp.asarray(weights[a][k], comps[a][k].dtype))
                for k in COMPONENT_KINDS} for a in weights}


# ------------------------------------------------------------------------------------------------- policies
class Policy(NamedTuple):
    """A low-dimensional parametric joint policy (the F-MACEM search space).

    Attributes:
      dims: {agent: length of its parameter vector theta_n}; the flat theta is their concatenation in
        ``env.agents`` order.
      apply: ``apply(thetas: {agent: (d_n,)}, obs: {agent: (o_n,)}, t: int array) -> actions``.
      init: {agent: (d_n,) initial mean of the search distribution}.
    """

    dims: Mapping[str, int]
    apply: Callable[[Mapping[str, jax.Array], Mapping[str, jax.Array], jax.Array], dict]
    init: Mapping[str, Any]

    def split(self, theta: jax.Array, agents: tuple[str, ...]) -> dict:
        """Flat (D,) theta -> {agent: (d_n,)} in ``agents`` order."""
        out, i = {}, 0
        for a in agents:
            out[a] = theta[..., i:i + self.dims[a]]
            i += self.dims[a]
        return out

    def flat_init(self, agents: tuple[str, ...]) -> np.ndarray:
        return np.concatenate([np.asarray(self.init[a], np.float32) for a in agents])


# ------------------------------------------------------------------------------------------------- rollouts
def rollout(env: FairEnv, key: jax.Array, params: Any, policy: Policy, theta: jax.Array) -> dict:
    """One episode of T stages with `jax.lax.scan` (pure; vmap it over keys, thetas or params).

    Args:
      env: the environment. key: PRNG key. params: its EnvParams.
      policy: the joint policy; theta: flat (D,) parameters.

    Returns:
      {"comps": {agent: {kind: (T, m)}}, "summary": {name: (T + 1, 2)} (stage 0 = initial state)}.
    """
    d = sum(int(policy.dims[a]) for a in env.agents)
    if tuple(jnp.shape(theta)) != (d,):
        raise ValueError(f"theta must have shape ({d},) (policy dims {dict(policy.dims)}), got {jnp.shape(theta)}")
    k0, ks = jax.random.split(key)
    state, obs = env.reset(k0, params)
    thetas = policy.split(theta, env.agents)

    def body(carry, k):
        st, ob = carry
        actions = policy.apply(thetas, ob, st.t)
        st2, ob2, comps, _ = env.step(k, st, actions, params)
        return (st2, ob2), (comps, env.summary(st2))

    _, (comps, summ) = jax.lax.scan(body, (state, obs), jax.random.split(ks, env.horizon))
    s0 = env.summary(state)
    summ = {k: jnp.concatenate([s0[k][None], v], axis=0) for k, v in summ.items()}
    return {"comps": comps, "summary": summ}


def episode_objective(comps: Mapping[str, Mapping[str, jax.Array]], weights: Weights, *, lam: float | jax.Array,
                      gamma: float, agents: tuple[str, ...] | None = None) -> dict:
    """The F-MACEM episode objective from per-stage components (spec 7 (b)).

    ``J = sum_n sum_t gamma^t w_n^R . c_R,n(t) + sum_n eta_n . mean_t c_rate,n(t)
          - lam sum_n sum_t gamma^t w_n^F . c_F,n(t)``, the sums over ``agents`` (all by default).

    Args:
      comps: {agent: {kind: (T, m)}} from `rollout`. weights: see `scalarise`. lam: fairness weight.
      gamma: discount in (0, 1]. agents: subset of agents whose terms count (independent variant).

    Returns:
      {"J": (), "return": (), "penalty": (), "rate": ()}: J and its three parts (return = discounted
      reward sum, penalty = discounted fairness sum before multiplying by lam).
    """
    agents = tuple(weights) if agents is None else tuple(agents)
    s = scalarise({a: comps[a] for a in agents}, {a: weights[a] for a in agents})
    t = next(iter(s.values()))["reward"].shape[-1]
    disc = jnp.asarray(gamma, jnp.float32) ** jnp.arange(t, dtype=jnp.float32)
    ret = sum(jnp.sum(disc * s[a]["reward"], -1) for a in agents)
    pen = sum(jnp.sum(disc * s[a]["fair"], -1) for a in agents)
    rate = sum(jnp.mean(s[a]["rate"], -1) for a in agents)
    return {"J": ret + rate - lam * pen, "return": ret, "penalty": pen, "rate": rate}
