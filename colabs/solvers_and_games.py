# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Solvers, online algorithms and games (issue 7)
#
# How to call the issue-7 methods that have landed so far and read their results:
#
# 1. **Learning-augmented online covering** (`algorithms.optimization.online_covering`): classical online
#    algorithms as black boxes, wrapped so that a prediction of the requests turns a competitive ratio
#    rho(k) into rho(eta) in the prediction error.
# 2. **Leaderboard incentives** (`algorithms.optimization.benchmark_game`): the benchmark Stackelberg
#    game; no pure equilibrium under the standard protocol, a unique quality-ordered one under
#    tune-before-test.
#
# The full reproductions are `python -m experiments run online_covering` and `... run benchmark_game`.

# %%
import os
import sys

REPO_URL = os.environ.get("ICML26_REPO_URL", "")
if "google.colab" in sys.modules and REPO_URL:
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO_URL}"], check=True)

# %% tags=["parameters"]
SMOKE = os.environ.get("SMOKE", "0") == "1"
NUM_REQUESTS = 15 if SMOKE else 40
GRID_POINTS = 21 if SMOKE else 101

# %%
import jax.numpy as jnp
import numpy as np

from algorithms.optimization import benchmark_game as bg
from algorithms.optimization import online_covering as oc

# %% [markdown]
# ## 1. Online set cover with predictions
#
# A scenario holds a problem instance and the pool of possible requests. `run_online` is the plain
# online algorithm (no prediction), `run_trust` buys the offline optimum of the prediction up front,
# `run_lazy` buys each predicted request's share only when it arrives, and `run_robust` switches between
# lazy and plain online so it is never worse than 6x the better of the two. Costs are compared with the
# exact offline optimum (a MILP).

# %%
rng = np.random.default_rng(0)
scenario = oc.set_cover_scenario(rng)
requests = oc.sample_requests(np.random.default_rng(1), scenario, NUM_REQUESTS)
opt = scenario.problem.optimum(requests)
for p_miss, num_false in [(0.0, 0), (0.3, 5), (0.6, 20)]:
    predicted = oc.perturb_prediction(np.random.default_rng(2), requests, pool=scenario.candidates,
                                      p_miss=p_miss, num_false=num_false)
    eta = oc.prediction_error(requests, predicted)
    ratios = {name: fn(scenario.problem, requests, predicted, seed=0).cost / opt
              for name, fn in [("trust", oc.run_trust), ("lazy", oc.run_lazy), ("robust", oc.run_robust)]}
    online = oc.run_online(scenario.problem, requests, seed=0).cost / opt
    print(f"eta={eta.eta:3d}  online {online:.2f}  " + "  ".join(f"{k} {v:.2f}" for k, v in ratios.items()))

# %% [markdown]
# ## 2. The leaderboard game
#
# Three providers with latent capabilities theta, scores theta + (1 - exp(-(delta + effort))), linear
# effort cost, rewards by rank. At delta = 0 (today's practice) catching up is cheaper than the reward
# gap, so no pure Nash equilibrium exists and best responses cycle; with enough tune-before-test
# (delta above `stabilizing_tbt_level`) zero effort is the unique equilibrium and ranks by capability.

# %%
curves = bg.ExpSaturating(jnp.array([0.30, 0.20, 0.05]), 1.0)
cost, rewards = bg.LinearCost(1.0), jnp.array([2.0, 1.0, 0.0])
delta_star = float(bg.stabilizing_tbt_level(curves, cost, rewards))
for delta in (0.0, 1.2 * delta_star):
    game = bg.make_game(curves, cost, rewards, bg.effort_grid(2.0, GRID_POINTS), delta=delta)
    eq = bg.find_pure_equilibria(game, method="pruned")
    traj = bg.best_response_dynamics(game, jnp.zeros(3, jnp.int32), num_rounds=60)
    summary = bg.analyze_trajectory(traj, num_players=3)
    print(f"delta={delta:.2f}: {eq.shape[0]} pure equilibria; dynamics converged={summary.converged}, "
          f"cycle length={summary.cycle_length}")
print(f"stabilizing tune-before-test level delta* = {delta_star:.3f}")
