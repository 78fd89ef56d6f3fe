"""Benchmarking as a Stackelberg game: strategic post-training and tune-before-test (TbT).

The benchmark designer picks a TbT level `delta` (every submission is fine-tuned with `delta` units of
task data); then `n` providers with capabilities theta_1 > ... > theta_n choose post-training efforts
`e_i >= 0`, are scored s_i = v(theta_i, delta + e_i), rewarded by rank (ties go to the higher
capability) and pay c(e_i). This module computes best responses, pure Nash equilibria and the
stabilizing TbT level (the paper's Thm. 4.6 and Props. 5.3 and 5.6).

Public functions:
  * score curves and costs: `ExpSaturating`, `ExpCapability`, `GeneralizedLogit` (its offset `e0` is
    exposed: the paper's parameterization is reconstructed), `fit_generalized_logit`; `LinearCost`,
    `PowerCost`, `FlatThenQuadratic` (a flat stretch that breaks uniqueness); `check_assumptions`;
  * grid game (efforts on a grid, tabulated scores, exact ranks): `effort_grid`, `make_game`,
    `profile_scores`, `profile_ranks`, `profile_utilities`, `ranking`, `quality_order`,
    `best_response` / `best_responses` (`method="threshold"`: <= n candidates by binary search;
    `"grid"`: the brute force), `is_pure_nash`, `best_response_dynamics`, `analyze_trajectory`,
    `find_pure_equilibria`, `grid_overtake_thresholds`, `predicted_equilibria`;
  * continuous game: `overtake_effort`, `overtake_effort_matrix`, `just_overtake_efforts` (bisection),
    `deviation_gains` (exact supremum gain of unilateral deviations), `zero_profile_is_pne`,
    `stabilizing_tbt_level`.

Numerics: float32 JAX (no global x64); profiles are integer grid indices of shape (n,).

Dimension legend:
  n  providers (players)          G  effort-grid points          T  dynamics steps
  P  profiles in a batch          m  target scores per provider

Spec: `../shared/papers/specs/statistics_theory.md`, section 8.

References:
  Chen, Zhang, Hardt, "Leaderboard Incentives: Model Rankings under Strategic Post-Training",
  arXiv:2603.08371, 2026.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "ExpSaturating",
    "ExpCapability",
    "GeneralizedLogit",
    "LinearCost",
    "PowerCost",
    "FlatThenQuadratic",
    "LeaderboardGame",
    "BestResponse",
    "DynamicsSummary",
    "AssumptionReport",
    "effort_grid",
    "make_game",
    "profile_scores",
    "profile_ranks",
    "profile_utilities",
    "ranking",
    "quality_order",
    "best_response",
    "best_responses",
    "is_pure_nash",
    "best_response_dynamics",
    "analyze_trajectory",
    "find_pure_equilibria",
    "grid_overtake_thresholds",
    "predicted_equilibria",
    "overtake_effort",
    "overtake_effort_matrix",
    "just_overtake_efforts",
    "deviation_gains",
    "zero_profile_is_pne",
    "stabilizing_tbt_level",
    "check_assumptions",
    "fit_generalized_logit",
]

Curves = Callable[[jax.Array], jax.Array]
Cost = Callable[[jax.Array], jax.Array]


def _lead(p: Any, x: jax.Array) -> jax.Array:
    """Reshapes a per-provider parameter (scalar or (n,)) to broadcast against x of shape (n, ...)."""
    p = jnp.asarray(p, dtype=jnp.result_type(float))
    if p.ndim == 0:
        return p
    if p.ndim != 1 or p.shape[0] != x.shape[0]:
        raise ValueError(f"a per-provider parameter must be a scalar or have shape (n,) = ({x.shape[0]},) "
                         f"matching the leading axis of the effort array {x.shape}; got shape {p.shape}")
    return p.reshape(p.shape + (1,) * (x.ndim - 1))


def _as_effort(x: Any) -> jax.Array:
    x = jnp.asarray(x, dtype=jnp.result_type(float))
    if x.ndim == 0:
        raise ValueError(f"curves take a total-effort array of shape (n, ...) with providers on the leading "
                         f"axis; got a scalar {x}")
    return x


# ----------------------------------------------------------------------------------------------------
# Score families (C1-C3) and costs (Assumption 4.1)
# ----------------------------------------------------------------------------------------------------


class ExpSaturating(NamedTuple):
    """Additive saturating score v(theta, x) = theta + A (1 - exp(-x)).

    The spec's main instance. The just-overtake effort has the closed form
    e_req = -log(exp(-delta) - (theta_{r-1} - theta_r) / A) - delta (or +inf when the argument is <= 0),
    so for any capability gap, enough TbT makes catching up impossible.

    Attributes:
      theta: (n,) latent capabilities.
      amplitude: A > 0, scalar or (n,): the most a provider can gain by effort.
    """

    theta: Any
    amplitude: Any = 1.0

    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_effort(x)
        return _lead(self.theta, x) + _lead(self.amplitude, x) * (1.0 - jnp.exp(-x))


class ExpCapability(NamedTuple):
    """Capability and effort add inside a saturating map: v(theta, x) = 1 - exp(-(theta + x)).

    The third-party reproduction's witness family: common TbT cancels out of every score comparison
    (theta_i + delta + e_i), yet the gaps in v shrink with delta, so a fixed reward gap is eventually
    unattainable by effort.

    Attributes:
      theta: (n,) latent capabilities.
    """

    theta: Any

    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_effort(x)
        return 1.0 - jnp.exp(-(_lead(self.theta, x) + x))


class GeneralizedLogit(NamedTuple):
    """Generalized logit scaling law v(x) = L + (U - L) sigmoid(alpha + beta log(e0 + x)).

    The paper's scaling family (Prop. 5.6, Fig. 1) with per-provider parameters; the exact place of the
    log offset is reconstructed, hence `e0` (default 1: log(1 + x)). With common (L, U, beta) and
    alpha increasing in capability the family satisfies C1-C3 and catch-up is feasible at every TbT
    level, with e_req(delta) ~ (exp((alpha_{r-1} - alpha_r) / beta) - 1) (e0 + delta) for large delta.

    Attributes:
      lower: L, scalar or (n,), the score with no effort in the limit alpha -> -inf.
      upper: U > L, scalar or (n,), the saturation level.
      alpha: scalar or (n,), the capability intercept.
      beta: beta > 0, scalar or (n,), the scaling exponent in log effort.
      e0: e0 > 0, scalar or (n,), the offset of log effort.
    """

    lower: Any
    upper: Any
    alpha: Any
    beta: Any
    e0: Any = 1.0

    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_effort(x)
        lo, up = _lead(self.lower, x), _lead(self.upper, x)
        z = _lead(self.alpha, x) + _lead(self.beta, x) * jnp.log(_lead(self.e0, x) + x)
        return lo + (up - lo) * jax.nn.sigmoid(z)


class LinearCost(NamedTuple):
    """c(e) = kappa e (strictly increasing, convex, c(0) = 0)."""

    kappa: Any = 1.0

    def __call__(self, e: jax.Array) -> jax.Array:
        return self.kappa * jnp.asarray(e, dtype=jnp.result_type(float))


class PowerCost(NamedTuple):
    """c(e) = kappa e^power with power >= 1 (strictly increasing on e > 0, convex)."""

    kappa: Any = 1.0
    power: Any = 2.0

    def __call__(self, e: jax.Array) -> jax.Array:
        return self.kappa * jnp.asarray(e, dtype=jnp.result_type(float)) ** self.power


class FlatThenQuadratic(NamedTuple):
    """c(e) = scale max(e - knot, 0)^2: allowed by Assumption 4.1 but flat on [0, knot].

    The third-party counterexample cost: with it, inverted-ranking equilibria and non-unique equilibria
    exist, so the implementation's assumption checker rejects it when `strict_cost=True`.
    """

    knot: Any = 1.0
    scale: Any = 1.0

    def __call__(self, e: jax.Array) -> jax.Array:
        e = jnp.asarray(e, dtype=jnp.result_type(float))
        return self.scale * jnp.maximum(e - self.knot, 0.0) ** 2


# ----------------------------------------------------------------------------------------------------
# The grid game
# ----------------------------------------------------------------------------------------------------


class LeaderboardGame(NamedTuple):
    """A leaderboard game with efforts restricted to a grid, at one TbT level.

    Attributes:
      scores: (n, G) score of provider i at grid effort g: v_i(delta + efforts[g]).
      costs: (G,) c(efforts[g]).
      rewards: (n,) reward by rank, non-increasing (rank 0 is the top).
      priority: (n,) int32 tie-break priority, a permutation of 0..n-1: equal scores are won by the
        higher priority, which is the higher latent capability (`quality`).
      efforts: (G,) the effort grid, efforts[0] = 0, strictly increasing.
      delta: () the TbT level the scores were tabulated at.
    """

    scores: jax.Array
    costs: jax.Array
    rewards: jax.Array
    priority: jax.Array
    efforts: jax.Array
    delta: jax.Array


class BestResponse(NamedTuple):
    """A provider's exact best response on the grid.

    Attributes:
      action: () int32 grid index of the smallest-effort maximizer.
      utility: () its utility (the maximum over the grid).
      gain: () utility - current utility (>= 0; 0 iff the current action is a best response).
    """

    action: jax.Array
    utility: jax.Array
    gain: jax.Array


class DynamicsSummary(NamedTuple):
    """What best-response dynamics did (from `analyze_trajectory`).

    Attributes:
      converged: a full round changed nothing, so the last profile is a PNE.
      fixed_point: (n,) int grid profile it converged to, or None.
      cycle_start: round index at which the recurring cycle is first entered, -1 if none was seen.
      cycle_length: length of the cycle in rounds (1 for a fixed point, 0 if no repetition was seen).
      num_rounds: rounds simulated.
    """

    converged: bool
    fixed_point: np.ndarray | None
    cycle_start: int
    cycle_length: int
    num_rounds: int


class AssumptionReport(NamedTuple):
    """Result of `check_assumptions`.

    Attributes:
      ok: every check passed.
      checks: name -> passed, for C1, C2 (monotone, concave), C3, the cost conditions and the rewards.
      failures: human-readable descriptions of the failed checks.
    """

    ok: bool
    checks: dict
    failures: tuple


def effort_grid(max_effort: float, num_points: int) -> jax.Array:
    """A uniform effort grid 0 = e_0 < ... < e_{G-1} = max_effort.

    Efforts whose cost exceeds R_1 - R_n are strictly dominated by zero effort (their utility is below
    R_n), so truncating the grid at c^{-1}(R_1 - R_n) leaves the set of equilibria unchanged.

    Args:
      max_effort: the largest effort, > 0.
      num_points: G >= 2.

    Returns:
      (G,) float32 grid.
    """
    if not (max_effort > 0 and math.isfinite(max_effort)):
        raise ValueError(f"max_effort must be a positive finite number; got {max_effort}")
    if num_points < 2:
        raise ValueError(f"num_points must be >= 2; got {num_points}")
    return jnp.linspace(0.0, max_effort, num_points)


def _priority(quality: np.ndarray) -> np.ndarray:
    """Permutation 0..n-1: higher quality -> higher priority; equal quality -> lower index wins."""
    n = quality.shape[0]
    order = np.lexsort((-np.arange(n), quality))  # ascending quality, ties: higher index first
    prio = np.empty(n, np.int32)
    prio[order] = np.arange(n, dtype=np.int32)
    return prio


def _zero_quality(curves: Curves, n: int) -> np.ndarray:
    return np.asarray(curves(jnp.zeros((n,))), np.float64)


def _check_rewards(rewards: Any) -> jax.Array:
    r = np.asarray(rewards, np.float64)
    if r.ndim != 1 or r.shape[0] < 2:
        raise ValueError(f"rewards must have shape (n,) with n >= 2 providers; got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"rewards must be finite; got {r}")
    if np.any(np.diff(r) > 0):
        raise ValueError(f"rewards must be non-increasing in rank (R_1 >= ... >= R_n); got {r}")
    return jnp.asarray(r, jnp.result_type(float))


def _check_quality(quality: Any, curves: Curves, n: int) -> np.ndarray:
    if quality is None:
        return _zero_quality(curves, n)
    q = np.asarray(quality, np.float64)
    if q.shape != (n,):
        raise ValueError(f"quality must have shape (n,) = ({n},); got {q.shape}")
    return q


def make_game(curves: Curves, cost: Cost, rewards: Any, efforts: Any, *, delta: float = 0.0,
              quality: Any = None) -> LeaderboardGame:
    """Tabulates the leaderboard game on an effort grid at TbT level `delta`.

    Args:
      curves: maps total effort x of shape (n, ...) to scores of the same shape (provider i's curve on
        row i), e.g. `ExpSaturating(theta)`.
      cost: elementwise cost c(e) (Assumption 4.1).
      rewards: (n,) reward by rank, non-increasing.
      efforts: (G,) effort grid, efforts[0] == 0, strictly increasing.
      delta: TbT level >= 0 (0 is the standard protocol).
      quality: (n,) latent capabilities used for tie-breaking and the quality ranking; default: the
        score at zero total effort v_i(0), which orders providers like theta under C1.

    Returns:
      The `LeaderboardGame`.
    """
    rewards = _check_rewards(rewards)
    n = rewards.shape[0]
    e = np.asarray(efforts, np.float64)
    if e.ndim != 1 or e.shape[0] < 1:
        raise ValueError(f"efforts must have shape (G,) with G >= 1; got {e.shape}")
    if e[0] != 0.0:
        raise ValueError(f"efforts[0] must be 0 (zero effort is always available); got {e[0]}")
    if np.any(np.diff(e) <= 0):
        raise ValueError("efforts must be strictly increasing")
    if not (delta >= 0 and math.isfinite(delta)):
        raise ValueError(f"delta (the TbT level) must be finite and >= 0; got {delta}")
    q = _check_quality(quality, curves, n)
    ej = jnp.asarray(efforts, jnp.result_type(float))
    scores = curves(jnp.broadcast_to(delta + ej, (n, e.shape[0])))
    if scores.shape != (n, e.shape[0]):
        raise ValueError(f"curves must return shape (n, G) = ({n}, {e.shape[0]}) for a (n, G) effort array; "
                         f"got {scores.shape}")
    costs = jnp.broadcast_to(jnp.asarray(cost(ej), jnp.result_type(float)), ej.shape)
    if not bool(jnp.all(jnp.isfinite(scores))):
        raise ValueError("curves returned non-finite scores on the grid")
    if not bool(jnp.all(jnp.isfinite(costs))):
        raise ValueError("cost returned non-finite values on the grid")
    return LeaderboardGame(scores=scores, costs=costs, rewards=rewards, priority=jnp.asarray(_priority(q)),
                           efforts=ej, delta=jnp.asarray(delta, jnp.result_type(float)))


def _check_profile(game: LeaderboardGame, profile: Any) -> jax.Array:
    profile = jnp.asarray(profile)
    n = game.scores.shape[0]
    if profile.shape[-1:] != (n,):
        raise ValueError(f"profile must have shape (..., n) = (..., {n}) grid indices; got {profile.shape}")
    if not jnp.issubdtype(profile.dtype, jnp.integer):
        raise ValueError(f"profile must hold integer grid indices; got dtype {profile.dtype}")
    return profile.astype(jnp.int32)


def _beats(s_a, p_a, s_b, p_b):
    """a ranks above b: strictly higher score, or equal score and higher priority."""
    return (s_a > s_b) | ((s_a == s_b) & (p_a > p_b))


def _scores_at(game: LeaderboardGame, profile: jax.Array) -> jax.Array:
    return game.scores[jnp.arange(game.scores.shape[0]), profile]


def _ranks(game: LeaderboardGame, profile: jax.Array) -> jax.Array:
    s = _scores_at(game, profile)
    p = game.priority
    beats = _beats(s[:, None], p[:, None], s[None, :], p[None, :])  # [j, i]: j ranks above i
    return jnp.sum(beats, axis=0).astype(jnp.int32)


def _utilities(game: LeaderboardGame, profile: jax.Array) -> jax.Array:
    return game.rewards[_ranks(game, profile)] - game.costs[profile]


def profile_scores(game: LeaderboardGame, profile: Any) -> jax.Array:
    """(n,) scores s_i = v_i(delta + efforts[profile_i]) of an (n,) grid profile."""
    return _scores_at(game, _check_profile(game, profile))


def profile_ranks(game: LeaderboardGame, profile: Any) -> jax.Array:
    """(n,) int32 rank of each provider (0 = top) with capability tie-breaking."""
    return _ranks(game, _check_profile(game, profile))


def profile_utilities(game: LeaderboardGame, profile: Any) -> jax.Array:
    """(n,) utilities R_{rank_i} - c(e_i) of an (n,) grid profile."""
    return _utilities(game, _check_profile(game, profile))


def ranking(game: LeaderboardGame, profile: Any) -> jax.Array:
    """(n,) provider indices from the top of the leaderboard to the bottom."""
    return jnp.argsort(profile_ranks(game, profile))


def quality_order(game: LeaderboardGame) -> jax.Array:
    """(n,) provider indices by latent capability, best first (the ranking TbT should produce)."""
    return jnp.argsort(-game.priority)


def _candidates(game: LeaderboardGame, profile: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The <= n grid efforts at which provider i's best response can lie, and their utilities.

    Provider i's score row is non-decreasing in its effort, so it overtakes opponent j from the first
    grid index t_j on (binary search; `side` encodes strict vs. tie-winning overtaking) and its rank is
    constant between consecutive thresholds, where the cheapest point is the threshold itself. The
    candidates are effort 0 (in slot i) and t_j for j != i; G means "never".
    """
    n, g = game.scores.shape
    s = _scores_at(game, profile)
    row = game.scores[i]
    left = jnp.searchsorted(row, s, side="left")  # first index with row >= s_j: wins ties
    right = jnp.searchsorted(row, s, side="right")  # first index with row > s_j: strict
    t = jnp.where(game.priority[i] > game.priority, left, right).astype(jnp.int32)
    others = jnp.arange(n) != i
    cand = jnp.where(others, t, 0)
    beaten = jnp.sum((cand[None, :] <= cand[:, None]) & others[None, :], axis=1)
    rank = (n - 1) - beaten
    valid = cand < g
    util = jnp.where(valid, game.rewards[rank] - game.costs[jnp.minimum(cand, g - 1)], -jnp.inf)
    return cand, util


def _best_response_threshold(game, profile, i):
    g = game.scores.shape[1]
    cand, util = _candidates(game, profile, i)
    best_u = jnp.max(util)
    action = jnp.min(jnp.where(util == best_u, cand, g)).astype(jnp.int32)
    return action, best_u


def _best_response_grid(game, profile, i):
    n, _ = game.scores.shape
    s = _scores_at(game, profile)
    row = game.scores[i]
    others = jnp.arange(n) != i
    i_beats = _beats(row[:, None], game.priority[i], s[None, :], game.priority[None, :]) & others[None, :]
    rank = (n - 1) - jnp.sum(i_beats, axis=1)
    util = game.rewards[rank] - game.costs
    action = jnp.argmax(util).astype(jnp.int32)  # first maximizer = smallest effort
    return action, util[action]


_METHODS = ("threshold", "grid")


def _check_method(method: str) -> None:
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}")


def _best_response_impl(game, profile, i, method):
    fn = _best_response_threshold if method == "threshold" else _best_response_grid
    action, best_u = fn(game, profile, i)
    cur = _utilities(game, profile)[i]
    return BestResponse(action=action, utility=best_u, gain=best_u - cur)


def best_response(game: LeaderboardGame, profile: Any, player: int, *, method: str = "threshold") -> BestResponse:
    """Exact best response of one provider on the effort grid.

    Args:
      game: the grid game.
      profile: (n,) int grid indices of the current efforts (the player's own entry is ignored except
        for `gain`).
      player: index of the responding provider.
      method: "threshold" (O(n log G): candidates at just-overtake thresholds; requires scores
        non-decreasing in effort, C2) or "grid" (O(n G) brute force over every grid point).

    Returns:
      `BestResponse` with the smallest-effort maximizer, its utility and the gain over the current
      action.

    Examples:
      >>> g = make_game(ExpSaturating(jnp.array([1.0, 0.5])), LinearCost(), jnp.array([1.0, 0.0]),
      ...               effort_grid(1.0, 101))
      >>> int(best_response(g, jnp.array([0, 0]), 1).action)  # just overtakes: 1 - e^{-e} > 0.5
      70
    """
    _check_method(method)
    profile = _check_profile(game, profile)
    n = game.scores.shape[0]
    if not 0 <= int(player) < n:
        raise ValueError(f"player must be in [0, {n}); got {player}")
    return _best_response_impl(game, profile, jnp.asarray(player, jnp.int32), method)


def _best_responses_impl(game, profile, method):
    n = game.scores.shape[0]
    return jax.vmap(lambda i: _best_response_impl(game, profile, i, method))(jnp.arange(n))


def best_responses(game: LeaderboardGame, profile: Any, *, method: str = "threshold") -> BestResponse:
    """Every provider's exact best response to `profile` (fields of shape (n,)); see `best_response`."""
    _check_method(method)
    return _best_responses_jit(game, _check_profile(game, profile), method=method)


_best_responses_jit = jax.jit(_best_responses_impl, static_argnames="method")


def _is_pne_impl(game, profile, atol, method):
    return jnp.all(_best_responses_impl(game, profile, method).gain <= atol)


def is_pure_nash(game: LeaderboardGame, profile: Any, *, atol: float = 0.0, method: str = "threshold") -> jax.Array:
    """Whether an (n,) grid profile is a pure Nash equilibrium of the grid game.

    Exact: no provider has a strictly profitable unilateral deviation to any grid effort (gain > atol;
    the utilities of the current and the deviating actions are computed by the same operations, so
    atol = 0 is meaningful). Accepts a batch of profiles (P, n).
    """
    _check_method(method)
    profile = _check_profile(game, profile)
    if profile.ndim == 1:
        return _is_pne_jit(game, profile, atol, method=method)
    return jax.vmap(lambda p: _is_pne_jit(game, p, atol, method=method))(profile.reshape(-1, profile.shape[-1])
                                                                         ).reshape(profile.shape[:-1])


_is_pne_jit = jax.jit(_is_pne_impl, static_argnames="method")


def _dynamics_impl(game, init, num_rounds, order, method):
    n = game.scores.shape[0]
    if order == "sequential":
        def step(profile, t):
            i = t % n
            br = _best_response_impl(game, profile, i, method)
            new = profile.at[i].set(jnp.where(br.gain > 0, br.action, profile[i]))
            return new, new
        steps = jnp.arange(num_rounds * n)
    else:
        def step(profile, t):
            br = _best_responses_impl(game, profile, method)
            new = jnp.where(br.gain > 0, br.action, profile)
            return new, new
        steps = jnp.arange(num_rounds)
    _, traj = lax.scan(step, init, steps)
    return jnp.concatenate([init[None], traj], axis=0)


_dynamics_jit = jax.jit(_dynamics_impl, static_argnames=("num_rounds", "order", "method"))


def best_response_dynamics(game: LeaderboardGame, init_profile: Any, *, num_rounds: int,
                           order: str = "sequential", method: str = "threshold") -> jax.Array:
    """Best-response dynamics on the grid game.

    A provider moves only if it has a strictly profitable deviation (gain > 0), and then to its
    smallest-effort best response, so a PNE is a fixed point and indifference never causes drift.

    Args:
      game: the grid game.
      init_profile: (n,) int starting grid profile.
      num_rounds: rounds to simulate; a round is one update per provider.
      order: "sequential" (providers 0, 1, ..., n-1 update in turn, each seeing the latest profile) or
        "simultaneous" (everyone best-responds to the previous profile).
      method: best-response method, see `best_response`.

    Returns:
      (T + 1, n) int32 trajectory including the start; T = num_rounds * n for "sequential" and
      num_rounds for "simultaneous". Summarize with `analyze_trajectory`.
    """
    _check_method(method)
    if order not in ("sequential", "simultaneous"):
        raise ValueError(f"order must be 'sequential' or 'simultaneous'; got {order!r}")
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1; got {num_rounds}")
    init = _check_profile(game, init_profile)
    if init.ndim != 1:
        raise ValueError(f"init_profile must have shape (n,); got {init.shape}")
    return _dynamics_jit(game, init, num_rounds=int(num_rounds), order=order, method=method)


def analyze_trajectory(trajectory: Any, *, num_players: int, order: str = "sequential") -> DynamicsSummary:
    """Detects convergence or a cycle in a best-response trajectory.

    The state compared is the profile at round boundaries (for sequential dynamics the updating
    provider is then the same, so a repeated state means the dynamics repeat forever).

    Args:
      trajectory: (T + 1, n) from `best_response_dynamics`.
      num_players: n.
      order: the order the trajectory was produced with.

    Returns:
      `DynamicsSummary`; `converged` iff two consecutive round-boundary states coincide.
    """
    traj = np.asarray(trajectory)
    if traj.ndim != 2 or traj.shape[1] != num_players:
        raise ValueError(f"trajectory must have shape (T + 1, n) with n = {num_players}; got {traj.shape}")
    stride = num_players if order == "sequential" else 1
    states = traj[::stride]
    seen: dict[bytes, int] = {}
    for r, state in enumerate(states):
        key = state.tobytes()
        if key in seen:
            start = seen[key]
            length = r - start
            converged = length == 1
            return DynamicsSummary(converged=converged, fixed_point=state.copy() if converged else None,
                                   cycle_start=start, cycle_length=length, num_rounds=len(states) - 1)
        seen[key] = r
    return DynamicsSummary(converged=False, fixed_point=None, cycle_start=-1, cycle_length=0,
                           num_rounds=len(states) - 1)


def _decode(idx: jax.Array, g: int, k: int) -> jax.Array:
    """(P,) flat indices -> (P, k) base-g digits (most significant first)."""
    pows = g ** jnp.arange(k - 1, -1, -1, dtype=jnp.int32)
    return (idx[:, None] // pows[None, :]) % g


@jax.jit
def _full_chunk(game, idx):
    n, g = game.scores.shape
    profiles = _decode(idx, g, n).astype(jnp.int32)
    return jax.vmap(lambda p: _is_pne_impl(game, p, 0.0, "threshold"))(profiles), profiles


@jax.jit
def _pruned_chunk(game, idx):
    """Player 0's maximizers for each opponent profile, then the full PNE test of those profiles."""
    n, g = game.scores.shape
    rest = _decode(idx, g, n - 1).astype(jnp.int32)
    profiles0 = jnp.concatenate([jnp.zeros_like(rest[:, :1]), rest], axis=1)  # (P, n)

    def expand(p):
        cand, util = _candidates(game, p, jnp.asarray(0, jnp.int32))
        first = jnp.argmax(cand[:, None] == cand[None, :], axis=1) == jnp.arange(n)  # drop duplicates
        keep = (util == jnp.max(util)) & (cand < g) & first
        profs = jnp.broadcast_to(p, (n, n)).at[:, 0].set(jnp.minimum(cand, g - 1))
        ok = jax.vmap(lambda q: _is_pne_impl(game, q, 0.0, "threshold"))(profs) & keep
        return ok, profs

    ok, profs = jax.vmap(expand)(profiles0)
    return ok.reshape(-1), profs.reshape(-1, n)


def find_pure_equilibria(game: LeaderboardGame, *, method: str = "auto", chunk_size: int = 1 << 14,
                         max_profiles: int = 1 << 28, progress: bool = False) -> np.ndarray:
    """Exhaustive search for all pure Nash equilibria of the grid game.

    Args:
      game: the grid game.
      method: "full" checks all G^n profiles; "pruned" enumerates the G^(n-1) opponent profiles of
        provider 0 and only its grid best responses (with a strictly increasing grid cost these are
        exactly the maximizing threshold candidates, so no equilibrium is missed); "auto" picks
        "pruned" when the grid cost is strictly increasing, else "full".
      chunk_size: profiles checked per compiled call.
      max_profiles: refuse enumerations larger than this.
      progress: show a tqdm bar.

    Returns:
      (k, n) int array of every PNE (grid indices), sorted lexicographically; k = 0 if none exists.
    """
    n, g = game.scores.shape
    if method not in ("auto", "full", "pruned"):
        raise ValueError(f"method must be 'auto', 'full' or 'pruned'; got {method!r}")
    strict = bool(jnp.all(jnp.diff(game.costs) > 0))
    if method == "auto":
        method = "pruned" if strict else "full"
    if method == "pruned" and not strict:
        raise ValueError("method='pruned' needs a strictly increasing cost on the grid (flat stretches create "
                         "best responses off the thresholds); use method='full'")
    digits = n if method == "full" else n - 1
    total = g ** digits
    if total > max_profiles:
        raise ValueError(f"exhaustive search over {g}^{digits} = {total} profiles exceeds max_profiles = "
                         f"{max_profiles}; use a coarser grid")
    if total >= 2 ** 31:
        raise ValueError(f"{total} profiles overflow int32 indexing; use a coarser grid")
    chunk = int(min(chunk_size, total))
    fn = _full_chunk if method == "full" else _pruned_chunk
    found = []
    starts = range(0, total, chunk)
    if progress:
        from tqdm.auto import tqdm
        starts = tqdm(starts, desc=f"PNE search ({method})", leave=False)
    for start in starts:
        idx = jnp.minimum(jnp.arange(start, start + chunk, dtype=jnp.int32), total - 1)
        ok, profs = fn(game, idx)
        ok, profs = np.asarray(ok), np.asarray(profs)
        if ok.any():
            found.append(profs[ok])
    if not found:
        return np.zeros((0, n), np.int32)
    out = np.unique(np.concatenate(found, axis=0), axis=0)
    return out.astype(np.int32)


@jax.jit
def _grid_thresholds(game):
    n = game.scores.shape[0]
    zero = jnp.zeros((n,), jnp.int32)
    cand = jax.vmap(lambda i: _candidates(game, zero, i)[0])(jnp.arange(n))
    return jnp.where(jnp.eye(n, dtype=bool), 0, cand)


def grid_overtake_thresholds(game: LeaderboardGame) -> jax.Array:
    """(n, n) int32: T[i, j] = first grid index at which provider i ranks above provider j's zero-effort
    score (G if never; 0 on the diagonal and where i is already ahead)."""
    return _grid_thresholds(game)


def predicted_equilibria(game: LeaderboardGame) -> np.ndarray:
    """The PNE set the theory predicts for the grid game (Thm. 4.6 with Prop. 4.3).

    Every PNE has all efforts zero, and the all-zero profile is one iff no provider can profitably
    overtake anyone ranked above it at zero effort: c(efforts[T[i, j]]) >= R_{rank_j} - R_{rank_i} for
    every pair with j above i, where T are the grid just-overtake thresholds. Computed from the
    pairwise thresholds only (not from the best-response code), to be compared with
    `find_pure_equilibria`.

    Returns:
      (1, n) zeros if the all-zero profile is stable, else (0, n).
    """
    n, g = game.scores.shape
    t = np.asarray(grid_overtake_thresholds(game))
    zero = np.zeros((n,), np.int32)
    rank = np.asarray(profile_ranks(game, zero))
    rewards = np.asarray(game.rewards, np.float64)
    costs = np.asarray(game.costs, np.float64)
    stable = True
    for i in range(n):
        for j in range(n):
            if rank[j] < rank[i] and t[i, j] < g:
                if costs[t[i, j]] < rewards[rank[j]] - rewards[rank[i]]:
                    stable = False
    return zero[None] if stable else np.zeros((0, n), np.int32)


# ----------------------------------------------------------------------------------------------------
# The continuous game
# ----------------------------------------------------------------------------------------------------


def overtake_effort(curves: Curves, target_scores: Any, *, delta: Any = 0.0, ties_win: Any = False,
                    max_effort: float = 1e9, num_iters: int = 100) -> jax.Array:
    """Smallest extra effort at which each provider's score passes target scores, by bisection.

    e(i, k) = inf{e >= 0 : v_i(delta + e) > target[i, k]} (">=" where `ties_win`), for curves
    non-decreasing in effort (C2).

    Args:
      curves: the providers' score curves.
      target_scores: (n, m) scores to pass, provider on the leading axis.
      delta: TbT level (scalar; may be traced).
      ties_win: bool, broadcastable to (n, m): whether an equal score suffices (the provider wins ties).
      max_effort: search bracket [0, max_effort]; unreachable targets give +inf.
      num_iters: bisection halvings (100 reaches float resolution from a 1e9 bracket).

    Returns:
      (n, m) efforts; 0 where the target is already passed at zero extra effort, +inf where even
      `max_effort` does not pass it.
    """
    target = jnp.asarray(target_scores, jnp.result_type(float))
    if target.ndim != 2:
        raise ValueError(f"target_scores must have shape (n, m); got {target.shape}")
    weak = jnp.broadcast_to(jnp.asarray(ties_win, bool), target.shape)

    def passed(e):
        s = curves(delta + e)
        return (s > target) | (weak & (s >= target))

    lo = jnp.zeros_like(target)
    hi = jnp.full_like(target, max_effort)

    def body(_, carry):
        lo, hi = carry
        mid = 0.5 * (lo + hi)
        ok = passed(mid)
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    lo, hi = lax.fori_loop(0, num_iters, body, (lo, hi))
    at_zero = passed(jnp.zeros_like(target))
    reachable = passed(jnp.full_like(target, max_effort))
    return jnp.where(at_zero, 0.0, jnp.where(reachable, hi, jnp.inf))


def _quality_priority(curves: Curves, n: int, quality: Any) -> jax.Array:
    """Traceable version of `_priority` (works under jit / loops, where quality may be a tracer)."""
    q = curves(jnp.zeros((n,))) if quality is None else jnp.asarray(quality, jnp.result_type(float))
    if q.shape != (n,):
        raise ValueError(f"quality must have shape (n,) = ({n},); got {q.shape}")
    order = jnp.lexsort((-jnp.arange(n), q))
    return jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))


def _n_from(curves: Curves, quality: Any, rewards: Any = None) -> int:
    if rewards is not None:
        return int(np.asarray(rewards).shape[0])
    if quality is not None:
        return int(np.asarray(quality).shape[0])
    for field in ("theta", "alpha", "lower"):
        p = getattr(curves, field, None)
        if p is not None and np.ndim(p) == 1:
            return int(np.shape(p)[0])
    raise ValueError("cannot infer the number of providers n: pass `quality` of shape (n,)")


def overtake_effort_matrix(curves: Curves, *, delta: Any = 0.0, quality: Any = None, efforts: Any = None,
                           max_effort: float = 1e9, num_iters: int = 100) -> jax.Array:
    """(n, n) E[i, j]: extra effort provider i needs to rank above provider j, who keeps its effort.

    Args:
      curves: the providers' score curves.
      delta: TbT level.
      quality: (n,) capabilities for tie-breaking (default: zero-effort scores). Needed to infer n
        for custom curves.
      efforts: (n,) current efforts (default zeros); E is measured from effort 0 of provider i against
        provider j's score at efforts[j].
      max_effort, num_iters: see `overtake_effort`.

    Returns:
      (n, n) efforts, 0 on the diagonal and where i already ranks above j at zero effort.
    """
    n = _n_from(curves, quality)
    prio = _quality_priority(curves, n, quality)
    e = jnp.zeros((n,)) if efforts is None else jnp.asarray(efforts, jnp.result_type(float))
    if e.shape != (n,):
        raise ValueError(f"efforts must have shape (n,) = ({n},); got {e.shape}")
    s = curves(delta + e)
    target = jnp.broadcast_to(s[None, :], (n, n))
    weak = prio[:, None] > prio[None, :]
    out = overtake_effort(curves, target, delta=delta, ties_win=weak, max_effort=max_effort, num_iters=num_iters)
    return jnp.where(jnp.eye(n, dtype=bool), 0.0, out)


def just_overtake_efforts(curves: Curves, *, delta: Any = 0.0, quality: Any = None, max_effort: float = 1e9,
                          num_iters: int = 100) -> jax.Array:
    """Thm. 4.6's just-overtake efforts e_req_r(delta), r = 2..n, in capability order.

    e_req_r(delta) = inf{e >= 0 : v_r(delta + e) > v_{r-1}(delta)}: the extra effort the rank-r model
    needs to pass the rank-(r-1) model when nobody else exerts effort.

    Returns:
      (n - 1,) efforts; entry r - 2 belongs to the r-th best provider (+inf when it cannot catch up).
    """
    n = _n_from(curves, quality)
    prio = _quality_priority(curves, n, quality)
    order = jnp.argsort(-prio)  # best first
    e = overtake_effort_matrix(curves, delta=delta, quality=quality, max_effort=max_effort, num_iters=num_iters)
    return e[order[1:], order[:-1]]


def deviation_gains(curves: Curves, cost: Cost, rewards: Any, efforts: Any, *, delta: Any = 0.0,
                    quality: Any = None, max_effort: float = 1e9, num_iters: int = 100) -> jax.Array:
    """Supremum gain of each provider's unilateral deviations in the continuous game.

    Provider i's rank only changes where it passes an opponent's current score (threshold E[i, j] from
    `overtake_effort`), and between thresholds the cost is non-decreasing, so the supremum of its
    utility over all e >= 0 is the best of R_{rank just above E[i, j]} - c(E[i, j]) over j and
    R_{rank at 0} - c(0). For strict overtaking this supremum is approached but not attained; a
    profile is a PNE iff every supremum gain is <= 0.

    Args:
      curves, cost: the score curves and the cost.
      rewards: (n,) non-increasing rewards by rank.
      efforts: (n,) the continuous effort profile.
      delta: TbT level.
      quality: (n,) capabilities for tie-breaking (default: zero-effort scores).
      max_effort, num_iters: see `overtake_effort`.

    Returns:
      (n,) sup_e u_i(e, e_-i) - u_i(e_i, e_-i).
    """
    rewards = _check_rewards(rewards)
    n = rewards.shape[0]
    prio = _quality_priority(curves, n, quality)
    e = jnp.asarray(efforts, jnp.result_type(float))
    if e.shape != (n,):
        raise ValueError(f"efforts must have shape (n,) = ({n},); got {e.shape}")
    s = curves(delta + e)
    beats = _beats(s[:, None], prio[:, None], s[None, :], prio[None, :])
    u_cur = rewards[jnp.sum(beats, axis=0)] - cost(e)
    target = jnp.broadcast_to(s[None, :], (n, n))
    weak = prio[:, None] > prio[None, :]
    thr = overtake_effort(curves, target, delta=delta, ties_win=weak, max_effort=max_effort, num_iters=num_iters)
    eye = jnp.eye(n, dtype=bool)
    cand = jnp.where(eye, 0.0, thr)  # (n, n): candidate c of provider i is cand[i, c]
    beaten = jnp.sum((thr[:, None, :] <= cand[:, :, None]) & ~eye[:, None, :], axis=2)  # (n, c)
    rank = (n - 1) - beaten
    finite = jnp.isfinite(cand)
    val = jnp.where(finite, rewards[rank] - cost(jnp.where(finite, cand, 0.0)), -jnp.inf)
    return jnp.max(val, axis=1) - u_cur


def zero_profile_is_pne(curves: Curves, cost: Cost, rewards: Any, *, delta: Any = 0.0, quality: Any = None,
                        atol: float = 0.0, max_effort: float = 1e9, num_iters: int = 100) -> jax.Array:
    """Whether all-zero effort is a PNE of the continuous game at TbT level `delta`.

    Equivalent to c(E[i, j]) >= R_{rank_j} - R_{rank_i} for every pair (Thm. 4.6's just-overtake
    condition, all pairs); by Thm. 4.6 it is then the unique PNE and it ranks by capability.
    """
    n = _check_rewards(rewards).shape[0]
    gains = deviation_gains(curves, cost, rewards, jnp.zeros((n,)), delta=delta, quality=quality,
                            max_effort=max_effort, num_iters=num_iters)
    return jnp.all(gains <= atol)


def stabilizing_tbt_level(curves: Curves, cost: Cost, rewards: Any, *, quality: Any = None,
                          max_delta: float = 1e6, num_iters: int = 60, max_effort: float = 1e9,
                          effort_iters: int = 100) -> float:
    """The smallest TbT level delta* at which all-zero effort is a PNE (bisection over delta).

    Relies on Prop. 5.3 (stability is monotone in delta); check it on a sweep if the curves are not
    from a family where it is known to hold.

    Returns:
      delta* (0.0 if the standard protocol is already stable, +inf if `max_delta` is not enough).
    """
    n = _check_rewards(rewards).shape[0]
    quality = jnp.asarray(_check_quality(quality, curves, n), jnp.result_type(float))

    def stable(d):
        return zero_profile_is_pne(curves, cost, rewards, delta=d, quality=quality, max_effort=max_effort,
                                   num_iters=effort_iters)

    if bool(stable(0.0)):
        return 0.0
    if not bool(stable(max_delta)):
        return math.inf

    def body(_, carry):
        lo, hi = carry
        mid = 0.5 * (lo + hi)
        ok = stable(mid)
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    _, hi = lax.fori_loop(0, num_iters, body, (jnp.asarray(0.0), jnp.asarray(float(max_delta))))
    return float(hi)


# ----------------------------------------------------------------------------------------------------
# Assumptions and scaling-law fits
# ----------------------------------------------------------------------------------------------------


def check_assumptions(curves: Curves, cost: Cost, rewards: Any, efforts: Any, *, quality: Any = None,
                      strict_cost: bool = True, atol: float = 1e-6, num_targets: int = 64) -> AssumptionReport:
    """Numerical check of C1-C3 and Assumption 4.1 on a total-effort grid.

    Checks: C1 scores strictly increasing in capability at every grid effort; C2 scores non-decreasing
    and concave in effort (slopes between grid points non-increasing); C3 the effort advantage
    E_lo(s) - E_hi(s) of each capability-adjacent pair (E the effort to reach score s) non-decreasing
    over targets attainable by both; cost c(0) = 0, non-decreasing, convex and, with `strict_cost`,
    strictly increasing (the third-party counterexamples use a flat stretch); rewards non-increasing.
    Saturation (boundedness as effort -> inf) cannot be checked on a finite grid and is not.

    Args:
      curves, cost, rewards: the game.
      efforts: (G,) total-effort grid (delta + e) to check on, efforts[0] >= 0, increasing.
      quality: (n,) capabilities (default: zero-effort scores).
      strict_cost: require c strictly increasing.
      atol: tolerance of the inequalities (float32 evaluations).
      num_targets: target scores for the C3 check.

    Returns:
      `AssumptionReport`.
    """
    r = np.asarray(rewards, np.float64)
    n = r.shape[0]
    x = np.asarray(efforts, np.float64)
    if x.ndim != 1 or x.shape[0] < 3:
        raise ValueError(f"efforts must have shape (G,) with G >= 3; got {x.shape}")
    q = _check_quality(quality, curves, n)
    order = np.argsort(-q, kind="stable")
    xs = jnp.asarray(x, jnp.result_type(float))
    s = np.asarray(curves(jnp.broadcast_to(xs, (n, x.shape[0]))), np.float64)
    checks: dict[str, bool] = {}
    fails = []

    def record(name: str, ok: bool, msg: str):
        checks[name] = bool(ok)
        if not ok:
            fails.append(msg)

    so = s[order]
    record("C1_increasing_in_capability", np.all(so[:-1] - so[1:] > 0),
           "C1: scores are not strictly increasing in capability at every effort")
    ds = np.diff(s, axis=1)
    record("C2_nondecreasing_in_effort", np.all(ds >= -atol), "C2: a score curve decreases in effort")
    slopes = ds / np.diff(x)[None, :]
    record("C2_concave_in_effort", np.all(np.diff(slopes, axis=1) <= atol * (1 + np.abs(slopes[:, 1:]))),
           "C2: a score curve is not concave in effort")
    c3 = True
    for hi_i, lo_i in zip(order[:-1], order[1:]):
        s_lo, s_top = s[lo_i, 0], min(s[lo_i, -1], s[hi_i, -1])
        if s_top <= s_lo:
            continue
        targets = np.linspace(s_lo, s_top, num_targets)
        tgt = jnp.asarray(np.stack([targets] * n), jnp.result_type(float))
        e_reach = np.asarray(overtake_effort(curves, tgt, delta=0.0, ties_win=True, max_effort=float(x[-1])))
        adv = e_reach[lo_i] - e_reach[hi_i]
        scale = 1.0 + np.abs(adv[1:])
        if np.any(np.diff(adv) < -1e-3 * scale):
            c3 = False
    record("C3_advantage_nondecreasing", c3, "C3: the stronger model's effort advantage decreases in the target")
    c = np.asarray(cost(xs), np.float64)
    record("cost_zero_at_zero", abs(float(np.asarray(cost(jnp.zeros(())), np.float64))) <= atol,
           "Assumption 4.1: c(0) != 0")
    dc = np.diff(c)
    record("cost_nondecreasing", np.all(dc >= -atol), "Assumption 4.1: cost decreases")
    cslopes = dc / np.diff(x)
    record("cost_convex", np.all(np.diff(cslopes) >= -atol * (1 + np.abs(cslopes[1:]))),
           "Assumption 4.1: cost is not convex")
    if strict_cost:
        record("cost_strictly_increasing", np.all(dc > 0),
               "strict cost: c is flat somewhere; equilibria may be non-unique or inverted")
    record("rewards_nonincreasing", np.all(np.diff(r) <= 0), "rewards increase with rank")
    return AssumptionReport(ok=not fails, checks=checks, failures=tuple(fails))


class _LogitRaw(NamedTuple):
    lower: jax.Array
    upper: jax.Array
    alpha: jax.Array
    beta: jax.Array


def _unpack(raw: _LogitRaw, lower_fixed, n):
    lo = jax.nn.sigmoid(raw.lower) if lower_fixed is None else lower_fixed
    lo = jnp.broadcast_to(lo, (n,))
    up = lo + (1.0 - lo) * jax.nn.sigmoid(jnp.broadcast_to(raw.upper, (n,)))
    return lo, up, raw.alpha, jnp.broadcast_to(jax.nn.softplus(raw.beta), (n,))


def fit_generalized_logit(steps: Any, accuracy: Any, *, lower: float | None = None, e0: float = 1.0,
                          share_upper: bool = False, share_beta: bool = False,
                          num_steps: int = 500) -> GeneralizedLogit:
    """Least-squares fit of one generalized logit curve per model (L-BFGS, optax).

    Scores are accuracies in (0, 1); the fit keeps 0 < L < U <= 1 and beta > 0 by reparameterization.
    Extrapolating a fit far beyond the measured steps (as e_req at a large TbT level does) is
    sensitive to the poorly identified saturation level U; sharing U and beta across models is the
    "common bounds" restriction under which catch-up stays feasible.

    Args:
      steps: (m,) post-training steps (total effort) of the measurements, >= 0.
      accuracy: (n, m) measured accuracy of each model at each step.
      lower: fix L (e.g. chance accuracy) instead of fitting it per model.
      e0: log offset of the family.
      share_upper: fit one U for all models.
      share_beta: fit one beta for all models.
      num_steps: L-BFGS iterations.

    Returns:
      `GeneralizedLogit` with (n,) fitted parameters.
    """
    import optax

    x = jnp.asarray(steps, jnp.result_type(float))
    y = jnp.asarray(accuracy, jnp.result_type(float))
    if x.ndim != 1 or y.ndim != 2 or y.shape[1] != x.shape[0]:
        raise ValueError(f"steps must have shape (m,) and accuracy (n, m); got {x.shape} and {y.shape}")
    if bool(jnp.any(x < 0)):
        raise ValueError("steps must be >= 0")
    if bool(jnp.any((y <= 0) | (y >= 1))):
        raise ValueError("accuracy must lie strictly inside (0, 1)")
    n = y.shape[0]
    lower_fixed = None if lower is None else jnp.asarray(lower, jnp.result_type(float))
    if lower is not None and not bool(jnp.all(y[:, 0] > lower_fixed)):
        raise ValueError(f"lower = {lower} must be below every model's first accuracy {y[:, 0]}")
    lo0 = jnp.full((n,), 0.5 * float(jnp.min(y))) if lower is None else jnp.broadcast_to(lower_fixed, (n,))
    frac0 = jnp.clip((y[:, 0] - lo0) / (1.0 - lo0), 1e-3, 0.999)
    raw0 = _LogitRaw(lower=jnp.log(lo0 / (1 - lo0)) if lower is None else jnp.zeros((n,)),
                     upper=jnp.zeros((1,) if share_upper else (n,)) + 2.0,
                     alpha=jnp.log(frac0 / (1 - frac0)),
                     beta=jnp.full((1,) if share_beta else (n,), float(np.log(np.expm1(0.3)))))

    def loss(raw):
        lo, up, a, b = _unpack(raw, lower_fixed, n)
        pred = GeneralizedLogit(lo, up, a, b, e0)(jnp.broadcast_to(x, y.shape))
        return jnp.mean((pred - y) ** 2)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    @jax.jit
    def run(raw):
        def step(carry, _):
            raw, state = carry
            value, grad = value_and_grad(raw, state=state)
            updates, state = opt.update(grad, state, raw, value=value, grad=grad, value_fn=loss)
            return (optax.apply_updates(raw, updates), state), value
        (raw, _), _ = lax.scan(step, (raw, opt.init(raw)), None, length=num_steps)
        return raw

    lo, up, a, b = _unpack(run(raw0), lower_fixed, n)
    return GeneralizedLogit(lower=lo, upper=up, alpha=a, beta=b, e0=e0)
