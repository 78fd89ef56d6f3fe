"""Leaderboard game: grid best responses and equilibria against an independent numpy brute force,
cycling under the standard protocol, convergence to the quality order under tune-before-test."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.optimization import benchmark_game as bg

THETA = np.array([0.30, 0.20, 0.05])  # provider 0 is the strongest
REWARDS = np.array([2.0, 1.0, 0.0])
KAPPA = 1.0


def _scores(delta, efforts):
    """v_i(delta + e) = theta_i + (1 - exp(-(delta + e))), float64, [n, G]."""
    return THETA[:, None] + (1.0 - np.exp(-(delta + np.asarray(efforts, np.float64))[None, :]))


def _utilities(profile, scores, efforts):
    """Rank by score, ties won by the higher capability (lower index here); u = R[rank] - c(e)."""
    n = len(profile)
    s = np.array([scores[i, profile[i]] for i in range(n)])
    u = np.empty(n)
    for i in range(n):
        beaten_by = sum(1 for j in range(n) if j != i and (s[j] > s[i] or (s[j] == s[i] and j < i)))
        u[i] = REWARDS[beaten_by] - KAPPA * efforts[profile[i]]
    return u


def _brute_force_pne(scores, efforts):
    n, g = scores.shape
    found = []
    for prof in itertools.product(range(g), repeat=n):
        u = _utilities(prof, scores, efforts)
        stable = all(
            _utilities(prof[:i] + (a,) + prof[i + 1:], scores, efforts)[i] <= u[i] + 1e-9
            for i in range(n) for a in range(g))
        if stable:
            found.append(prof)
    return np.array(found, dtype=np.int32).reshape(-1, n)


def _game(delta, num_points=6, max_effort=2.0):
    efforts = bg.effort_grid(max_effort, num_points)
    curves = bg.ExpSaturating(jnp.asarray(THETA, jnp.float32), 1.0)
    return bg.make_game(curves, bg.LinearCost(KAPPA), jnp.asarray(REWARDS, jnp.float32), efforts, delta=delta), \
        np.asarray(efforts, np.float64)


def test_best_responses_match_brute_force():
    game, efforts = _game(0.3)
    scores = _scores(0.3, efforts)
    rng = np.random.default_rng(0)
    for _ in range(15):
        prof = tuple(int(x) for x in rng.integers(0, len(efforts), 3))
        for i in range(3):
            utils = [_utilities(prof[:i] + (a,) + prof[i + 1:], scores, efforts)[i] for a in range(len(efforts))]
            best = max(utils)
            br = bg.best_response(game, jnp.asarray(prof), i)
            assert float(br.utility) == pytest.approx(best, abs=1e-5)
            assert int(br.action) == int(np.flatnonzero(np.isclose(utils, best, atol=1e-5))[0])
            grid = bg.best_response(game, jnp.asarray(prof), i, method="grid")
            assert int(grid.action) == int(br.action)


@pytest.mark.parametrize("delta", [0.0, 0.5, 2.0])
def test_exhaustive_equilibria_match_brute_force(delta):
    game, efforts = _game(delta)
    want = _brute_force_pne(_scores(delta, efforts), efforts)
    got = bg.find_pure_equilibria(game, method="full")
    np.testing.assert_array_equal(np.asarray(got), want)


def test_standard_protocol_has_no_equilibrium_and_best_responses_cycle():
    game, _ = _game(0.0, num_points=41)
    assert bg.find_pure_equilibria(game, method="pruned").shape[0] == 0
    # Theorem 4.6's condition holds: catching up is cheaper than the reward gap.
    e_req = np.asarray(bg.just_overtake_efforts(bg.ExpSaturating(jnp.asarray(THETA, jnp.float32), 1.0)))
    assert np.all(KAPPA * e_req < REWARDS[:-1] - REWARDS[1:])
    traj = bg.best_response_dynamics(game, jnp.zeros(3, jnp.int32), num_rounds=60)
    summary = bg.analyze_trajectory(traj, num_players=3)
    assert not summary.converged and summary.cycle_length > 1


def test_tune_before_test_converges_to_the_quality_order():
    curves = bg.ExpSaturating(jnp.asarray(THETA, jnp.float32), 1.0)
    delta_star = float(bg.stabilizing_tbt_level(curves, bg.LinearCost(KAPPA), jnp.asarray(REWARDS, jnp.float32)))
    # Closed form for ExpSaturating: e_req = -log(exp(-delta) - gap/A) - delta; zero is stable when
    # every gap's catch-up cost reaches its reward gap: exp(-delta) (1 - e^-1) ... solve numerically here.
    def stable(delta):
        gaps = THETA[:-1] - THETA[1:]
        arg = np.exp(-delta) - gaps
        e_req = np.where(arg > 0, -np.log(np.where(arg > 0, arg, 1.0)) - delta, np.inf)
        return np.all(KAPPA * e_req >= REWARDS[:-1] - REWARDS[1:])
    lo, hi = 0.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if stable(mid) else (mid, hi)
    assert delta_star == pytest.approx(hi, rel=1e-3)

    game, _ = _game(1.2 * delta_star, num_points=41)
    eq = bg.find_pure_equilibria(game, method="pruned")
    assert eq.shape == (1, 3) and not eq.any()
    np.testing.assert_array_equal(bg.ranking(game, jnp.asarray(eq[0])), [0, 1, 2])
    rng = np.random.default_rng(1)
    for start in rng.integers(0, 41, (4, 3)):
        traj = bg.best_response_dynamics(game, jnp.asarray(start, jnp.int32), num_rounds=60)
        summary = bg.analyze_trajectory(traj, num_players=3)
        assert summary.converged and not np.asarray(summary.fixed_point).any()


def test_just_overtake_effort_closed_form():
    curves = bg.ExpSaturating(jnp.asarray(THETA, jnp.float32), 1.0)
    for delta in (0.0, 0.7):
        got = np.asarray(bg.just_overtake_efforts(curves, delta=delta), np.float64)
        gaps = THETA[:-1] - THETA[1:]
        want = -np.log(np.exp(-delta) - gaps) - delta
        np.testing.assert_allclose(got, want, rtol=1e-4)
