"""Text environments and scripted agents for EELMA: dynamics, planner optimality, rollouts, exact values."""

import collections
import math

import jax
import numpy as np
import pytest

from algorithms.agents import eelma
from experiments.tasks import text_envs as te


def _bfs(env: te.TextEnv, goal: int) -> np.ndarray:
    """Shortest number of steps to the goal in a deterministic env (reverse BFS)."""
    det = env.transition.argmax(-1)
    dist = np.full(env.num_states, np.inf)
    dist[env.success[goal]] = 0
    queue = collections.deque(np.nonzero(env.success[goal])[0])
    while queue:
        v = queue.popleft()
        for s in range(env.num_states):
            if not np.isfinite(dist[s]) and (det[s] == v).any() and not env.terminal[goal, s]:
                dist[s] = dist[v] + 1
                queue.append(s)
    return dist


def test_gridworld_dynamics_and_texts():
    env = te.gridworld()
    assert env.num_states == 21 and env.num_actions == 5 and env.num_goals == 4
    assert len(set(env.state_texts)) == 21
    s = env.state_texts.index("You are at row 0, column 0 of a 5 by 5 grid. Walls to the north, west.")
    det = env.transition.argmax(-1)
    assert det[s, env.action_texts.index("move north")] == s                  # bumping a wall stays
    east = det[s, env.action_texts.index("move east")]
    assert env.state_texts[east].startswith("You are at row 0, column 1") and "east" in env.state_texts[east]
    assert (det[:, env.noop] == np.arange(21)).all()
    slippery = te.gridworld(slip=0.2)
    np.testing.assert_allclose(slippery.transition.sum(-1), 1.0)
    assert slippery.transition[s, 0, s] == pytest.approx(0.8 + 0.2 * 2 / 4)   # north and west bump: stay


def test_planner_is_optimal_on_the_gridworld():
    env = te.gridworld()
    q = te.optimal_q(env)
    for g in range(env.num_goals):
        d = _bfs(env, g)
        live = ~env.terminal[g]
        np.testing.assert_allclose(q[g].min(-1)[live], d[live])
    planner = te.planner_agent(env)
    assert te.exact_success(env, planner) == pytest.approx(1.0)
    np.testing.assert_allclose(planner.policy.sum(-1), 1.0)


def test_tool_shop_needs_login_and_planner_takes_the_expected_steps():
    env = te.tool_shop(login_success=0.9)
    det = env.transition.argmax(-1)
    home = env.state_texts.index("Screen: shop home page. Cart: empty. Signed in: no.")
    act = {t: i for i, t in enumerate(env.action_texts)}

    def go(s, *names):
        for name in names:
            s = det[s, act[name]]
        return s

    no_login = go(home, "search('home goods')", "open_item(2)", "add_to_cart()", "view_cart()", "checkout()")
    assert env.state_texts[no_login] == "Screen: shopping cart. Cart: the red kettle. Signed in: no."
    bought = go(home, "login(password='hunter2')", "search('home goods')", "open_item(2)", "add_to_cart()",
                "view_cart()", "checkout()")
    assert env.state_texts[bought].startswith("Screen: order confirmed, you bought the red kettle.")
    assert env.success[1, bought] and not env.success[0, bought] and env.terminal[:, bought].all()
    assert go(home, "login(password='123456')") == home                        # wrong password: no change
    assert env.transition[home, act["login(password='hunter2')"], home] == pytest.approx(0.1)
    # Optimal: login (geometric, mean 1/0.9 tries) + search, open, add, view, checkout.
    q = te.optimal_q(env)
    assert q[0, home].min() == pytest.approx(5 + 1 / 0.9, rel=1e-9)
    ex = eelma.exact_effective_empowerment(gamma=0.9, **te.augmented_chain(env, te.planner_agent(env)))
    assert ex.expected_length == pytest.approx(5 + 1 / 0.9 - 0.1 ** 9, abs=1e-3)


@pytest.mark.parametrize("make", [te.gridworld, te.tool_shop])
def test_rollouts_follow_the_dynamics_and_match_the_exact_success(make):
    env = make()
    agent = te.epsilon_agent(env, 0.5)
    logs = te.simulate(env, agent, num_episodes=3000, seed=1)
    E, T = logs.actions.shape
    assert T == env.horizon and logs.states.shape == (E, T + 1)
    for e in range(200):
        L = logs.lengths[e]
        s, a = logs.states[e, :L + 1], logs.actions[e, :L]
        assert (env.transition[s[:-1], a, s[1:]] > 0).all()
        assert (agent.policy[logs.goals[e], s[:-1], a] > 0).all()
        assert not env.terminal[logs.goals[e], s[:-1]].any()                # episodes stop at terminals
        assert L == T or env.terminal[logs.goals[e], s[-1]]
        assert logs.success[e] == env.success[logs.goals[e], s[-1]]
        assert (logs.actions[e, L:] == -1).all()
    p = te.exact_success(env, agent)
    assert abs(logs.success.mean() - p) <= 4 * math.sqrt(p * (1 - p) / E) + 1e-9


def test_exact_empowerment_of_the_augmented_chain_matches_simulation():
    env = te.gridworld()
    agent = te.epsilon_agent(env, 0.35)
    gamma = 0.8
    ex = eelma.exact_effective_empowerment(gamma=gamma, **te.augmented_chain(env, agent))
    logs = te.simulate(env, agent, num_episodes=30_000, seed=2)
    n = 300_000
    s, a, f = eelma.triples_from_logs(jax.random.key(0), logs.states, logs.actions, logs.lengths,
                                      num_samples=n, gamma=gamma)
    joint = np.zeros((env.num_states, env.num_actions, env.num_states))
    np.add.at(joint, (s, a, f), 1.0)
    plug_in, _, _ = eelma.conditional_mi(joint / n)
    cells = (joint > 0).sum()
    assert abs(plug_in - ex.empowerment) < 0.01 + cells / (2 * n)           # plug-in bias ~ cells / 2N
    assert ex.expected_length == pytest.approx(logs.lengths.mean(), abs=4 * logs.lengths.std() / math.sqrt(30_000))


def test_graded_agents_order_success_and_the_stuck_agent_has_no_empowerment():
    for env in (te.gridworld(), te.tool_shop()):
        agents = te.graded_agents(env, epsilons=(0.0, 0.3, 0.7, 1.0), lazy=(0.5,))
        assert [a.name for a in agents] == ["eps=0", "eps=0.3", "eps=0.7", "eps=1", "lazy=0.5", "stuck"]
        succ = [te.exact_success(env, a) for a in agents[:4]]
        assert succ == sorted(succ, reverse=True) and succ[0] == pytest.approx(1.0, abs=1e-6)
        assert te.exact_success(env, agents[-1]) == 0.0
        stuck = eelma.exact_effective_empowerment(gamma=0.9, **te.augmented_chain(env, agents[-1]))
        assert stuck.empowerment == pytest.approx(0.0, abs=1e-12)
        for a in agents:
            np.testing.assert_allclose(a.policy.sum(-1), 1.0)


@pytest.mark.parametrize("call,match", [
    (lambda: te.gridworld(["..", "."]), "layout"),
    (lambda: te.gridworld([".#", ".."], goals=[(0, 1)]), "goal"),
    (lambda: te.gridworld(slip=1.5), "slip"),
    (lambda: te.tool_shop(0), "num_items"),
    (lambda: te.tool_shop(login_success=0.0), "login_success"),
    (lambda: te.epsilon_agent(te.gridworld(), 1.5), "epsilon"),
    (lambda: te.lazy_agent(te.gridworld(), -0.1), "p_noop"),
    (lambda: te.simulate(te.gridworld(), te.stuck_agent(te.gridworld()), num_episodes=0), "num_episodes"),
    (lambda: te.simulate(te.gridworld(), te.stuck_agent(te.tool_shop()), num_episodes=3), "policy"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
