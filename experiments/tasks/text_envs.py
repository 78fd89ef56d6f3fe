"""Small text environments with exact dynamics, and scripted agents of graded skill (EELMA, spec 11 (d)).

Two goal-conditioned environments whose states and actions are rendered as text, small enough that
the exact effective empowerment of a policy and its exact success probability are computed by
enumeration:

* `gridworld`: an N x N grid of two rooms joined by a door (layout configurable), actions "move
  north/south/east/west" and "wait", optional slip probability; the observation text gives the
  position and the adjacent walls. A goal is a cell ("Go to the corner at row 0, column 4.").
* `tool_shop`: a tool-use web shop: ``login(password=...)`` (correct or wrong password; the correct
  one succeeds with probability ``login_success``), ``search``, ``open_item(i)``, ``add_to_cart``,
  ``view_cart``, ``checkout`` (needs the cart screen, a non-empty cart and a signed-in user),
  ``go_home``. The observation text is the screen, the cart and the sign-in status; a goal is the item
  to buy; a checkout ends the episode (success iff the goal item was bought).

The goal is part of the agent's instruction, not of the observation (the critic sees only observed
texts, as an LM agent's logged observations do not repeat its task) [INFER]. Episodes end at the
goal's terminal states or at the horizon.

Agents (`Agent`, a policy `[G, n, m]` over (goal, observation)): the optimal planner (value iteration
on expected steps to success, uniform over tied optimal actions), epsilon-mixtures of it with uniform
random actions (`epsilon_agent`), mixtures with the no-op action (`lazy_agent`) and an agent that only
ever takes the no-op (`stuck_agent`).

Everything is numpy and deterministic given the seed.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

__all__ = ["TextEnv", "Agent", "Logs", "gridworld", "tool_shop", "optimal_q", "planner_agent", "epsilon_agent",
           "lazy_agent", "stuck_agent", "graded_agents", "simulate", "exact_success", "augmented_chain"]

_MOVES = (("north", -1, 0), ("south", 1, 0), ("east", 0, 1), ("west", 0, -1))


@dataclasses.dataclass(frozen=True, eq=False)
class TextEnv:
    """A finite goal-conditioned environment rendered as text.

    Attributes:
      name: short name.
      state_texts: `n` observation texts (distinct).
      action_texts: `m` action texts (distinct).
      transition: `[n, m, n]` float64, rows summing to 1.
      initial: `[G, n]` law of the first state given the goal (no mass on that goal's terminals).
      goal_texts: `G` instructions.
      success: `[G, n]` bool, states where goal g is achieved.
      terminal: `[G, n]` bool, states that end an episode with goal g (includes ``success``).
      horizon: time limit T (actions per episode).
      noop: index of the no-op action.
    """

    name: str
    state_texts: tuple[str, ...]
    action_texts: tuple[str, ...]
    transition: np.ndarray
    initial: np.ndarray
    goal_texts: tuple[str, ...]
    success: np.ndarray
    terminal: np.ndarray
    horizon: int
    noop: int

    def __post_init__(self):
        n, m, g = len(self.state_texts), len(self.action_texts), len(self.goal_texts)
        if len(set(self.state_texts)) != n or len(set(self.action_texts)) != m:
            raise ValueError("state_texts and action_texts must be distinct strings")
        if self.transition.shape != (n, m, n) or not np.allclose(self.transition.sum(-1), 1.0):
            raise ValueError(f"transition must be [{n}, {m}, {n}] with rows summing to 1, got {self.transition.shape}")
        for name, x in (("initial", self.initial), ("success", self.success), ("terminal", self.terminal)):
            if x.shape != (g, n):
                raise ValueError(f"{name} must be [G, n] = [{g}, {n}], got {x.shape}")
        if not np.allclose(self.initial.sum(-1), 1.0) or (self.initial[self.terminal] > 0).any():
            raise ValueError("initial rows must be distributions with no mass on the goal's terminal states")
        if (self.success & ~self.terminal).any():
            raise ValueError("every success state must be terminal")
        if self.horizon < 1 or not 0 <= self.noop < m:
            raise ValueError(f"need horizon >= 1 and noop in [0, {m}), got {self.horizon}, {self.noop}")

    @property
    def num_states(self) -> int:
        return len(self.state_texts)

    @property
    def num_actions(self) -> int:
        return len(self.action_texts)

    @property
    def num_goals(self) -> int:
        return len(self.goal_texts)


@dataclasses.dataclass(frozen=True, eq=False)
class Agent:
    """A scripted agent: ``policy[g, s, a]`` = P(action a | goal g, observation s)."""

    name: str
    policy: np.ndarray
    skill: float = float("nan")   # the grading parameter (e.g. 1 - epsilon), for plots only


class Logs(NamedTuple):
    """Logged episodes: ``states [E, T + 1]``, ``actions [E, T]`` (ids; -1 past the end), ``lengths [E]``
    (actions taken), ``goals [E]``, ``success [E]`` bool."""

    states: np.ndarray
    actions: np.ndarray
    lengths: np.ndarray
    goals: np.ndarray
    success: np.ndarray


# ----------------------------------------------------------------------------------------------
# Environments.
# ----------------------------------------------------------------------------------------------

_DEFAULT_LAYOUT = ("..#..",
                   "..#..",
                   ".....",
                   "..#..",
                   "..#..")


def gridworld(layout: Sequence[str] = _DEFAULT_LAYOUT, *, goals: Sequence[tuple[int, int]] | None = None,
              horizon: int = 12, slip: float = 0.0) -> TextEnv:
    """A text gridworld: ``layout`` rows of '.' (free) and '#' (wall); the state is a free cell.

    Args:
      layout: equal-length strings.
      goals: goal cells (row, col); default the free corners.
      horizon: time limit T.
      slip: probability that a move goes in a uniformly random direction instead (0 = deterministic).

    Raises:
      ValueError: on a ragged layout, a goal on a wall or a slip outside [0, 1].
    """
    rows, cols = len(layout), len(layout[0]) if layout else 0
    if rows == 0 or any(len(r) != cols for r in layout) or any(ch not in ".#" for r in layout for ch in r):
        raise ValueError(f"layout must be equal-length rows of '.' and '#', got {list(layout)}")
    if not 0.0 <= slip <= 1.0:
        raise ValueError(f"slip must lie in [0, 1], got {slip}")
    cells = [(r, c) for r in range(rows) for c in range(cols) if layout[r][c] == "."]
    index = {cell: i for i, cell in enumerate(cells)}
    if goals is None:
        goals = [rc for rc in ((0, 0), (0, cols - 1), (rows - 1, 0), (rows - 1, cols - 1)) if rc in index]
    for g in goals:
        if g not in index:
            raise ValueError(f"goal {g} is not a free cell of the layout")

    def free(r, c):
        return 0 <= r < rows and 0 <= c < cols and layout[r][c] == "."

    n, m = len(cells), len(_MOVES) + 1
    det = np.zeros((n, m), int)
    texts = []
    for i, (r, c) in enumerate(cells):
        for a, (_, dr, dc) in enumerate(_MOVES):
            det[i, a] = index[(r + dr, c + dc)] if free(r + dr, c + dc) else i
        det[i, len(_MOVES)] = i
        blocked = [name for name, dr, dc in _MOVES if not free(r + dr, c + dc)]
        texts.append(f"You are at row {r}, column {c} of a {rows} by {cols} grid. "
                     + (f"Walls to the {', '.join(blocked)}." if blocked else "No walls around you."))
    P = np.zeros((n, m, n))
    for i in range(n):
        for a in range(m):
            P[i, a, det[i, a]] += 1.0 - (slip if a < len(_MOVES) else 0.0)
            if a < len(_MOVES) and slip > 0:
                for b in range(len(_MOVES)):
                    P[i, a, det[i, b]] += slip / len(_MOVES)
    G = len(goals)
    success = np.zeros((G, n), bool)
    for k, g in enumerate(goals):
        success[k, index[g]] = True
    initial = (~success).astype(np.float64)
    initial /= initial.sum(-1, keepdims=True)
    return TextEnv(name="gridworld", state_texts=tuple(texts),
                   action_texts=tuple(f"move {name}" for name, _, _ in _MOVES) + ("wait",),
                   transition=P, initial=initial,
                   goal_texts=tuple(f"Go to row {r}, column {c}." for r, c in goals),
                   success=success, terminal=success.copy(), horizon=horizon, noop=len(_MOVES))


_ITEMS = ("blue mug", "red kettle", "green lamp", "yellow scarf")


def tool_shop(num_items: int = 3, *, horizon: int = 14, login_success: float = 0.9) -> TextEnv:
    """A tool-use web shop (see the module docstring); goal k = buy item k.

    States: screen (home, results, item i, cart, receipt) x cart (empty or item i) x signed in. The
    receipt is reached by a successful checkout and ends the episode for every goal.

    Raises:
      ValueError: if ``num_items`` is outside [1, 4] or ``login_success`` outside (0, 1].
    """
    if not 1 <= num_items <= len(_ITEMS):
        raise ValueError(f"num_items must be in [1, {len(_ITEMS)}], got {num_items}")
    if not 0.0 < login_success <= 1.0:
        raise ValueError(f"login_success must lie in (0, 1], got {login_success}")
    items = _ITEMS[:num_items]
    screens = ["home", "results"] + [f"item{i}" for i in range(num_items)] + ["cart", "receipt"]
    states = [(sc, cart, li) for sc in screens for cart in range(num_items + 1) for li in (0, 1)
              if not (sc == "receipt" and cart == 0)]
    index = {s: i for i, s in enumerate(states)}
    actions = (["login(password='hunter2')", "login(password='123456')", "search('home goods')"]
               + [f"open_item({i + 1})" for i in range(num_items)]
               + ["add_to_cart()", "view_cart()", "checkout()", "go_home()"])
    a_login, a_wrong, a_search = 0, 1, 2
    a_open = list(range(3, 3 + num_items))
    a_add, a_cart, a_checkout, a_home = (3 + num_items + k for k in range(4))

    def text(sc, cart, li):
        if sc == "home":
            page = "Screen: shop home page."
        elif sc == "results":
            page = "Screen: search results: " + "; ".join(f"{i + 1}. {it}" for i, it in enumerate(items)) + "."
        elif sc.startswith("item"):
            page = f"Screen: product page of the {items[int(sc[4:])]}."
        elif sc == "cart":
            page = "Screen: shopping cart."
        else:
            page = f"Screen: order confirmed, you bought the {items[cart - 1]}."
        return (f"{page} Cart: {'empty' if cart == 0 else 'the ' + items[cart - 1]}. "
                f"Signed in: {'yes' if li else 'no'}.")

    n, m = len(states), len(actions)
    P = np.zeros((n, m, n))
    for i, (sc, cart, li) in enumerate(states):
        for a in range(m):
            if sc == "receipt":
                P[i, a, i] = 1.0
                continue
            if a == a_login and not li:
                P[i, a, index[(sc, cart, 1)]] += login_success
                P[i, a, i] += 1.0 - login_success
                continue
            nxt = (sc, cart, li)
            if a == a_search:
                nxt = ("results", cart, li)
            elif a in a_open and sc == "results":
                nxt = (f"item{a_open.index(a)}", cart, li)
            elif a == a_add and sc.startswith("item"):
                nxt = (sc, int(sc[4:]) + 1, li)
            elif a == a_cart:
                nxt = ("cart", cart, li)
            elif a == a_checkout and sc == "cart" and cart > 0 and li:
                nxt = ("receipt", cart, li)
            elif a == a_home:
                nxt = ("home", cart, li)
            P[i, a, index[nxt]] += 1.0
    receipt = np.array([s[0] == "receipt" for s in states])
    success = np.array([[s[0] == "receipt" and s[1] == k + 1 for s in states] for k in range(num_items)])
    terminal = np.broadcast_to(receipt, success.shape).copy()
    initial = np.zeros((num_items, n))
    initial[:, index[("home", 0, 0)]] = 1.0
    return TextEnv(name="tool_shop", state_texts=tuple(text(*s) for s in states), action_texts=tuple(actions),
                   transition=P, initial=initial, goal_texts=tuple(f"Buy the {it}." for it in items),
                   success=success, terminal=terminal, horizon=horizon, noop=a_home)


# ----------------------------------------------------------------------------------------------
# Agents.
# ----------------------------------------------------------------------------------------------


def optimal_q(env: TextEnv, *, fail_cost: float | None = None, iters: int | None = None) -> np.ndarray:
    """Expected steps to success `[G, n, m]` by value iteration (failure terminals cost ``fail_cost``).

    ``V(s) = 0`` on success, ``fail_cost`` (default ``4 * (n + horizon)``) on other terminals, else
    ``min_a Q(s, a)`` with ``Q(s, a) = 1 + sum_s' P(s' | s, a) V(s')``; states that cannot reach the
    goal saturate at ``fail_cost``.
    """
    n, G = env.num_states, env.num_goals
    cost = 4.0 * (n + env.horizon) if fail_cost is None else fail_cost
    iters = 4 * n + 50 if iters is None else iters
    V = np.where(env.success, 0.0, cost)
    for _ in range(iters):
        Q = 1.0 + np.einsum("sax,gx->gsa", env.transition, V)
        V_new = np.where(env.success, 0.0, np.where(env.terminal, cost, np.minimum(Q.min(-1), cost)))
        if np.abs(V_new - V).max() <= 1e-12:
            break
        V = V_new
    return 1.0 + np.einsum("sax,gx->gsa", env.transition, V)


def planner_agent(env: TextEnv, *, tol: float = 1e-9) -> Agent:
    """The optimal planner: uniform over the actions within ``tol`` of the minimal expected steps."""
    Q = optimal_q(env)
    best = Q <= Q.min(-1, keepdims=True) + tol
    return Agent("planner", best / best.sum(-1, keepdims=True), skill=1.0)


def _check_prob(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {p}")


def epsilon_agent(env: TextEnv, epsilon: float) -> Agent:
    """Takes the planner's action with probability ``1 - epsilon``, else a uniformly random action."""
    _check_prob("epsilon", epsilon)
    uniform = np.full((env.num_goals, env.num_states, env.num_actions), 1.0 / env.num_actions)
    return Agent(f"eps={epsilon:g}", (1 - epsilon) * planner_agent(env).policy + epsilon * uniform,
                 skill=1.0 - epsilon)


def lazy_agent(env: TextEnv, p_noop: float) -> Agent:
    """Takes the planner's action with probability ``1 - p_noop``, else the no-op action."""
    _check_prob("p_noop", p_noop)
    noop = np.zeros((env.num_goals, env.num_states, env.num_actions))
    noop[..., env.noop] = 1.0
    return Agent(f"lazy={p_noop:g}", (1 - p_noop) * planner_agent(env).policy + p_noop * noop, skill=1.0 - p_noop)


def stuck_agent(env: TextEnv) -> Agent:
    """Always takes the no-op action (an agent stuck in a loop)."""
    return dataclasses.replace(lazy_agent(env, 1.0), name="stuck")


def graded_agents(env: TextEnv, epsilons: Sequence[float] = (0.0, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 1.0),
                  lazy: Sequence[float] = (0.5,), stuck: bool = True) -> list[Agent]:
    """Agents of graded skill: epsilon-mixtures, lazy mixtures and (optionally) the stuck agent."""
    out = [epsilon_agent(env, e) for e in epsilons] + [lazy_agent(env, p) for p in lazy]
    return out + ([stuck_agent(env)] if stuck else [])


# ----------------------------------------------------------------------------------------------
# Rollouts and exact quantities.
# ----------------------------------------------------------------------------------------------


def _sample_rows(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    u = rng.random(probs.shape[0])[:, None]
    return np.minimum((np.cumsum(probs, -1) < u).sum(-1), probs.shape[-1] - 1)


def simulate(env: TextEnv, agent: Agent, *, num_episodes: int, seed: int = 0) -> Logs:
    """Rolls ``num_episodes`` episodes out (goal uniform, then ``initial[goal]``), vectorised.

    Raises:
      ValueError: if ``num_episodes < 1`` or the agent's policy has the wrong shape.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    shape = (env.num_goals, env.num_states, env.num_actions)
    if agent.policy.shape != shape or not np.allclose(agent.policy.sum(-1), 1.0):
        raise ValueError(f"agent.policy must be {shape} with rows summing to 1, got {agent.policy.shape}")
    rng = np.random.default_rng(seed)
    T, E = env.horizon, num_episodes
    goals = rng.integers(0, env.num_goals, E)
    states = np.full((E, T + 1), -1, np.int64)
    actions = np.full((E, T), -1, np.int64)
    states[:, 0] = _sample_rows(rng, env.initial[goals])
    lengths = np.zeros(E, np.int64)
    alive = np.ones(E, bool)
    for t in range(T):
        idx = np.nonzero(alive)[0]
        if idx.size == 0:
            break
        s = states[idx, t]
        a = _sample_rows(rng, agent.policy[goals[idx], s])
        actions[idx, t] = a
        states[idx, t + 1] = _sample_rows(rng, env.transition[s, a])
        lengths[idx] += 1
        alive[idx] = ~env.terminal[goals[idx], states[idx, t + 1]]
    last = states[np.arange(E), lengths]
    return Logs(states, actions, lengths, goals, env.success[goals, last])


def augmented_chain(env: TextEnv, agent: Agent) -> dict:
    """The (goal, observation) chain of an agent, as keyword arguments of
    `algorithms.agents.eelma.exact_effective_empowerment` (the goal is latent: ``observation`` drops it).

    Augmented state ``x = g * n + s``; goals are uniform.
    """
    G, n, m = env.num_goals, env.num_states, env.num_actions
    P = np.zeros((G * n, m, G * n))
    for g in range(G):
        P[g * n:(g + 1) * n, :, g * n:(g + 1) * n] = env.transition
    return dict(transition=P, policy=agent.policy.reshape(G * n, m), initial=env.initial.reshape(-1) / G,
                observation=np.tile(np.arange(n), G), terminal=env.terminal.reshape(-1), horizon=env.horizon)


def exact_success(env: TextEnv, agent: Agent) -> float:
    """Exact probability that an episode reaches its goal within the horizon (goal uniform)."""
    G = env.num_goals
    total = 0.0
    for g in range(G):
        P_pi = np.einsum("sa,sax->sx", agent.policy[g], env.transition)
        P_pi[env.terminal[g]] = np.eye(env.num_states)[env.terminal[g]]
        d = env.initial[g].copy()
        for _ in range(env.horizon):
            d = d @ P_pi
        total += d[env.success[g]].sum() / G
    return float(total)
