# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Agents, environments and their evaluation
#
# How to call the methods of issue 32's papers and read their results:
#
# - AI grading of calculus (`algorithms.agents.calculus_grading`): rubric-guided grading, score
#   aggregation (the paper's max-rule and alternatives) and the evaluation protocol (agreement,
#   quadratic weighted kappa, Krippendorff's alpha when the TA grades are noisy too);
# - EELMA (`algorithms.agents.eelma`): effective empowerment of an agent, exact by enumeration on a
#   small text environment, and estimated from logs with InfoNCE critics;
# - MAFE (`algorithms.fairness.mafe`): fair multi-agent environments in JAX, their PettingZoo
#   adapter, and F-MACEM;
# - MCP-Persona (`algorithms.agents.mcp_persona`): personal apps on SQLite behind a real MCP server,
#   tasks with checkable end states and typed tool errors, scripted agents of graded skill.
#
# Each section calls the method on tiny inputs, then reads the experiment's stored quick result.
# Set RUN_EXPERIMENTS=1 to rerun an experiment's quick preset here (minutes on a CPU).

# %%
# Setup. On Colab (or any fresh runtime) put a pip source of this library in REPO_URL: its
# repository's git URL ("https://github.com/OWNER/REPO.git"), a local path or a wheel; or set the
# ICML26_REPO_URL environment variable. The install pins the jax/jaxlib already installed (Colab's
# accelerator build): pip keeps them when they satisfy the library's range and fails, saying so,
# when they do not; it never replaces them. Elsewhere leave it empty (`make install` installs).
import os
import sys

REPO_URL = ""  # <- paste here, e.g. "https://github.com/OWNER/REPO.git"
REPO_URL = REPO_URL or os.environ.get("ICML26_REPO_URL", "")
if REPO_URL:
    import importlib.metadata
    import subprocess
    import tempfile

    pins = []
    for dist in ("jax", "jaxlib"):
        try:
            pins.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    with tempfile.NamedTemporaryFile("w", suffix="-constraints.txt", delete=False) as f:
        f.write("".join(pin + "\n" for pin in pins))
    git = "://" in REPO_URL and not REPO_URL.startswith("git+") and not REPO_URL.endswith((".whl", ".zip", ".gz"))
    source = "git+" + REPO_URL if git else REPO_URL
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", f.name, source],
                         capture_output=True, text=True)
    if pip.returncode:
        raise RuntimeError(f"pip could not install {source} keeping the installed {', '.join(pins) or 'packages'}; "
                           f"if it names jax, this runtime's jax is outside the library's range (pyproject.toml): "
                           f"pick another runtime or install a jax in range first.\n{pip.stdout[-2000:]}{pip.stderr[-3000:]}")
    print("installed", source, "keeping", ", ".join(pins) or "no preinstalled jax")
elif "google.colab" in sys.modules:
    import importlib.util

    if importlib.util.find_spec("primitives") is None:
        raise RuntimeError("Set REPO_URL at the top of this cell to this library's git URL, then run it again.")

# %% tags=["parameters"]
SMOKE = os.environ.get("SMOKE", "0") == "1"
RUN_EXPERIMENTS = os.environ.get("RUN_EXPERIMENTS", "0") == "1" and not SMOKE

# %%
import jax
import numpy as np

from experiments import report

print("JAX", jax.__version__, "on", jax.default_backend())

# %% [markdown]
# ## 1. Evaluating graders
#
# Two simulated TAs grade the same 200 answers out of 10 points; one is lenient. Agreement, quadratic
# weighted kappa and Krippendorff's alpha (raters may skip items: NaN) read their agreement.

# %%
from algorithms.agents import calculus_grading as cg

rng = np.random.default_rng(0)
truth = rng.integers(0, 11, 200).astype(float)
ta1 = np.clip(np.round(truth + rng.normal(0, 0.7, 200)), 0, 10)
ta2 = np.clip(np.round(truth + 1.0 + rng.normal(0, 1.2, 200)), 0, 10)  # lenient by one point
report_ta2 = cg.agreement_report(ta2, ta1, categories=np.arange(11), tolerance=1.0)
print({k: round(float(v), 3) for k, v in report_ta2.items() if isinstance(v, (float, int))})
print("QWK(TA2, TA1):", round(cg.quadratic_weighted_kappa(ta2, ta1, categories=np.arange(11)), 3))
ratings = np.stack([ta1, ta2])
ratings[1, ::3] = np.nan  # TA-2 graded two thirds of the items
print("Krippendorff's alpha (interval):", round(cg.krippendorff_alpha(ratings, metric="interval"), 3))

# %%
grading_result = report.show_result("calculus_grading", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 2. Empowerment of text agents
#
# The exact effective empowerment I(a_t; s_* | s_t) of an agent's policy, by enumeration, on the
# text gridworld: a competent (epsilon-greedy) agent against a random one and a stuck one.

# %%
from algorithms.agents import eelma
from experiments.tasks import text_envs

env = text_envs.gridworld()
for name, agent in [("planner eps=0.1", text_envs.epsilon_agent(env, 0.1)),
                    ("random", text_envs.epsilon_agent(env, 1.0)), ("stuck", text_envs.stuck_agent(env))]:
    exact = eelma.exact_effective_empowerment(**text_envs.augmented_chain(env, agent), gamma=0.9)
    print(f"{name:16s} exact empowerment {exact.empowerment / np.log(2):.3f} bits, "
          f"success {text_envs.exact_success(env, agent):.2f}")

# %%
eelma_result = report.show_result("eelma", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 3. MAFE: a fair loan environment through PettingZoo
#
# The JAX core is functional (`reset`/`step` with explicit keys and params); the adapter exposes it
# with PettingZoo's parallel API and passes PettingZoo's own API test.

# %%
from pettingzoo.test import parallel_api_test

from algorithms.fairness.mafe import LoanMAFE
from algorithms.fairness.mafe.pettingzoo_env import MAFEParallelEnv

pz = MAFEParallelEnv(LoanMAFE(num_individuals=200, horizon=5), lam=0.1)
observations, infos = pz.reset(seed=0)
print("agents:", pz.agents, "| observation sizes:", {a: o.shape for a, o in observations.items()})
for t in range(3):
    actions = {a: pz.action_space(a).sample() for a in pz.agents}
    observations, rewards, terminations, truncations, infos = pz.step(actions)
    print(f"stage {t}: rewards", {a: round(float(r), 3) for a, r in rewards.items()})
parallel_api_test(MAFEParallelEnv(LoanMAFE(num_individuals=100, horizon=4)), num_cycles=5)

# %%
mafe_result = report.show_result("mafe", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## MCP-Persona: personal apps behind a real MCP server
#
# Four apps (messaging, social feed, documents, calendar) keep their state in SQLite; a real Model
# Context Protocol server (the `mcp` SDK) exposes them as tools with JSON schemas, bound to one
# persona. A task is generated in a copy of the world with checkpoints on the final database state;
# an injected error (type mismatch, schema violation, boundary, semantic) makes the first natural call
# fail with a typed tool error. Agents connect as MCP clients (in-memory here; stdio in the tests).

# %%
import concurrent.futures
import pathlib
import tempfile

import anyio

from algorithms.agents.mcp_persona import agents as mcp_agents
from algorithms.agents.mcp_persona import db as mcp_db
from algorithms.agents.mcp_persona import harness as mcp_harness
from algorithms.agents.mcp_persona import tasks as mcp_tasks

tmp = pathlib.Path(tempfile.mkdtemp())
world = mcp_db.connect(tmp / "world.db")
people = mcp_tasks.generate_world(world, 0, num_users=16, num_personas=2)
mcp_db.copy_database(world, tmp / "task.db")
task_world = mcp_db.connect(tmp / "task.db")
task = mcp_tasks.generate_task(task_world, people[0], "cal_schedule", "boundary", seed=0)
print("task:", task.instruction)


async def run_agents():
    return [await mcp_harness.run_episode(task, task_world, mcp_agents.make_agent(skill), tmp / f"{skill}.db")
            for skill in ("literal", "syntactic", "expert")]


with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a notebook already runs an event loop
    episodes = pool.submit(anyio.run, run_agents).result()
for e in episodes:
    calls = ", ".join(f"{c.tool}{'' if c.ok else ' -> ' + c.payload.get('type', 'error')}" for c in e.calls)
    print(f"{e.agent:9s} checkpoints {sum(e.checkpoints)}/{len(e.checkpoints)} | {calls}")

# %%
mcp_result = report.show_result("mcp_persona", rerun=RUN_EXPERIMENTS)
