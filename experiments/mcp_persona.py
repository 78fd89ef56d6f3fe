"""MCP-Persona: scripted agents of graded skill on personal apps behind a real MCP server with SQLite state.

Paper: Wang et al., "Benchmarking LLM Agents on Real-World Personal Applications via Environment
Simulation" (arXiv 2606.02470; spec ``papers/specs/rl_alignment_agents.md`` section 12; issue 32 item
2). The paper builds simulated, state-faithful personal MCP servers, personalised context, fuzzified
tasks with final-state checkpoints, and reports Acc / SR-0.8 / Exec-Acc of LLM agents (all < 50% Acc;
per-model Exec-Acc ranks the models exactly as Acc does).

Setting (offline; `algorithms.agents.mcp_persona`): four apps (messaging, social feed, documents,
calendar) in one SQLite database per world, served by an MCP server built with the ``mcp`` SDK;
``world_seeds`` random worlds, each with personas holding private state; every template (two per
app) x every error injection it supports (none, type mismatch, boundary, schema violation, semantic
conflict) x persona x task seed. Each task runs on its own copy of the world. The subjects are the
scripted agents of `algorithms.agents.mcp_persona.agents` (guesser < literal < syntactic < expert,
plus the oracle), each connected as an MCP client over the SDK's in-memory transport; a subset of
tasks is re-run over stdio (a server subprocess per episode) to check the transport changes nothing.

Checks fixed before the run:
* required: the oracle reaches every checkpoint (Acc = SR-0.8 = 1: every generated task is solvable
  and the checkers agree with the plan; the paper human-verifies its 173 tasks);
* required: Acc strictly increases with scripted skill, guesser < literal < syntactic < expert,
  each step by more than 2 standard errors of the paired per-task difference (the benchmark
  separates graded tool-use skill, as the paper's table separates models);
* required: the stdio episodes reproduce the in-memory ones exactly (checkpoints and call logs);
* not required: Spearman(Exec-Acc, Acc) over the four non-oracle agents >= 0.8 (in the paper's
  table Exec-Acc ranks the six models exactly as Acc does, rho = 1.0);
* not required: for the agent that repairs from error messages but does not reason about state
  (syntactic), semantic-conflict tasks are the hardest error type. The spec reports no per-error-type
  numbers; this ordering is inferred, and with scripted agents it follows from their design.

* required, and failed by construction: the paper's headline (LLM agents stay below 50% Acc) is
  recorded as a check that is not measured, because no LLM agent runs here: the small LM of the
  library is not used as a tool caller (no instruction-following model at this scale). The verdict is
  therefore "not reproduced (scale)" even when every harness check passes.

Recipe:
    python -m experiments run mcp_persona --preset smoke
    python -m experiments run mcp_persona --preset quick
    python -m experiments run mcp_persona --preset paper
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import tempfile
from typing import Any, Mapping

import anyio
import numpy as np
import tqdm
from etils import epath
from scipy import stats

from algorithms.agents.mcp_persona import agents as ag
from algorithms.agents.mcp_persona import db as dbm
from algorithms.agents.mcp_persona import harness as hs
from algorithms.agents.mcp_persona import server as sv
from algorithms.agents.mcp_persona import tasks as tk
from experiments import _plotting as plotting
from experiments import registry, report
from experiments.checks import Check
from experiments.checks import verdict as verdict_from_checks

_GRADED = ("guesser", "literal", "syntactic", "expert")
_PAPER_TABLE = {  # model: (Acc, Exec-Acc), spec section 12 (c)
    "Claude-Sonnet-4.5": (38.66, 41.50), "GPT-5": (36.99, 41.45), "Claude-Opus-4.1": (34.52, 36.77),
    "o4-mini": (30.70, 34.73), "o3": (29.79, 30.27), "GPT-4o": (25.56, 20.02)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """mcp_persona settings."""

    world_seeds: tuple[int, ...] = (0, 1)
    num_users: int = 16
    num_personas: int = 4
    task_seeds: tuple[int, ...] = (0, 1)
    templates: tuple[str, ...] = tuple(tk.TEMPLATES)
    skills: tuple[str, ...] = ag.SKILLS
    stdio_tasks: int = 12  # tasks re-run over stdio (expert agent)
    progress: bool = True


def _validate(c: Config) -> None:
    if not c.world_seeds or not c.task_seeds:
        raise ValueError(f"world_seeds and task_seeds must be non-empty, got {c.world_seeds}, {c.task_seeds}")
    bad = [t for t in c.templates if t not in tk.TEMPLATES]
    if bad:
        raise ValueError(f"templates must be a subset of {sorted(tk.TEMPLATES)}, got unknown {bad}")
    if set(c.skills) != set(ag.SKILLS):
        raise ValueError(f"skills must be all of {ag.SKILLS} (the checks compare them), got {c.skills}")
    if c.stdio_tasks < 1:
        raise ValueError(f"stdio_tasks must be >= 1, got {c.stdio_tasks}")


def _log_signature(e: hs.Episode) -> tuple:
    return (e.checkpoints, tuple((c.tool, tuple(sorted(map(str, c.arguments.items()))), c.ok,
                                  c.payload.get("code") if not c.ok else None) for c in e.calls))


def _run_all(c: Config, tmp: pathlib.Path) -> tuple[list[hs.Episode], list[tuple[hs.Episode, hs.Episode]]]:
    tasks_: list[tuple[tk.Task, Any]] = []
    for ws in c.world_seeds:
        base = dbm.connect(tmp / f"world{ws}.db")
        ps = tk.generate_world(base, ws, num_users=c.num_users, num_personas=c.num_personas)
        counter = itertools.count()

        def make(ws=ws, base=base, counter=counter):
            p = tmp / f"w{ws}_task{next(counter)}.db"
            dbm.copy_database(base, p)
            return dbm.connect(p)

        tasks_ += tk.generate_tasks(make, ps, seeds=c.task_seeds, templates=c.templates)
    episodes: list[hs.Episode] = []
    pairs: list[tuple[hs.Episode, hs.Episode]] = []
    stride = max(1, len(tasks_) // c.stdio_tasks)
    stdio_idx = set(range(0, len(tasks_), stride)[: c.stdio_tasks])
    bar = tqdm.tqdm(total=len(tasks_) * len(c.skills) + len(stdio_idx), desc="mcp_persona", disable=not c.progress)

    async def go():
        for i, (task, conn) in enumerate(tasks_):
            for skill in c.skills:
                e = await hs.run_episode(task, conn, ag.make_agent(skill), tmp / "episode.db")
                episodes.append(e)
                bar.update(1)
                if skill == "expert" and i in stdio_idx:
                    e2 = await hs.run_episode(task, conn, ag.make_agent(skill), tmp / "episode_stdio.db",
                                              transport="stdio")
                    pairs.append((e, e2))
                    bar.update(1)

    anyio.run(go)
    bar.close()
    return episodes, pairs


def headline(metrics: Mapping[str, Any]) -> str:
    """The README catalog's "ours" cell."""
    acc = metrics["acc_by_agent"]
    return (f"scripted agents on {metrics['num_tasks']} MCP/SQLite tasks: Acc "
            + "/".join(f"{acc[s]:.2f}".removeprefix("0") for s in (*_GRADED, "oracle"))
            + " (guesser/literal/syntactic/expert/oracle); no LLM agent run")


def run(c: Config, workdir: pathlib.Path) -> dict:
    _validate(c)
    workdir = epath.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mcp_persona_") as tmp:
        episodes, pairs = _run_all(c, pathlib.Path(tmp))

    by_agent = {s: [e for e in episodes if e.agent == s] for s in c.skills}
    m_agent = {s: hs.metrics(v) for s, v in by_agent.items()}
    per_app = {s: hs.group_metrics(v, "app") for s, v in by_agent.items()}
    per_type = {s: hs.group_metrics(v, "injected") for s, v in by_agent.items()}
    per_template = {s: hs.group_metrics(v, "template") for s, v in by_agent.items()}
    n_tasks = len(by_agent["oracle"])

    # Paired per-task differences between consecutive skills.
    steps = []
    for lo, hi in zip(_GRADED[:-1], _GRADED[1:]):
        d = np.array([b.score - a.score for a, b in zip(by_agent[lo], by_agent[hi])])
        assert all(a.task_id == b.task_id for a, b in zip(by_agent[lo], by_agent[hi]))
        se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("inf")
        steps.append({"from": lo, "to": hi, "mean_diff": float(d.mean()), "se": se,
                      "passed": bool(d.mean() > 2 * se)})
    ordered = all(s["passed"] for s in steps)
    oracle_ok = m_agent["oracle"]["acc"] == 1.0 and m_agent["oracle"]["sr"] == 1.0
    same = [_log_signature(a) == _log_signature(b) for a, b in pairs]
    transport_ok = bool(same) and all(same)
    rho = float(stats.spearmanr([m_agent[s]["exec_acc"] for s in _GRADED], [m_agent[s]["acc"] for s in _GRADED])[0])
    paper_rho = float(stats.spearmanr([v[1] for v in _PAPER_TABLE.values()], [v[0] for v in _PAPER_TABLE.values()])[0])
    syn = per_type["syntactic"]
    other_types = [t for t in sv.ERROR_TYPES if t != "semantic" and t in syn]
    semantic_hardest = "semantic" in syn and all(syn["semantic"]["acc"] < syn[t]["acc"] for t in other_types)

    plots = [_plot_apps(per_app, c, workdir), _plot_types(per_type, c, workdir)]
    acc_txt = ", ".join(f"{s} {m_agent[s]['acc']:.3f} (SR-0.8 {m_agent[s]['sr']:.3f}, Exec-Acc "
                        f"{m_agent[s]['exec_acc']:.3f})" for s in c.skills)
    step_txt = "; ".join(f"{s['from']}->{s['to']} {s['mean_diff']:+.3f} (SE {s['se']:.3f})" for s in steps)
    type_txt = "; ".join(f"{s}: " + ", ".join(f"{t} {per_type[s][t]['acc']:.2f}" for t in ("none", *sv.ERROR_TYPES)
                                              if t in per_type[s]) for s in _GRADED)
    app_txt = "; ".join(f"{s}: " + ", ".join(f"{a} {per_app[s][a]['acc']:.2f}" for a in sv.APPS if a in per_app[s])
                        for s in _GRADED)
    checks = [
        Check("oracle Acc and SR-0.8 (every task solvable, checkers consistent)",
              f"{m_agent['oracle']['acc']:.3f} / {m_agent['oracle']['sr']:.3f}",
              paper="173 human-verified tasks", threshold="Acc == 1 and SR-0.8 == 1", passed=oracle_ok),
        Check("Acc ordered by scripted skill (paired per-task steps)", step_txt,
              paper="benchmark separates agents (Acc 25.6-38.7% across six LLMs)",
              threshold="each step guesser<literal<syntactic<expert > 2 SE", passed=ordered),
        Check(f"stdio episodes identical to in-memory ({len(pairs)} tasks, expert)", f"{sum(same)}/{len(same)}",
              paper="agents talk to the simulators as MCP clients", threshold="all identical", passed=transport_ok),
        Check("Spearman(Exec-Acc, Acc) over the four graded agents", rho,
              paper=f"rho = {paper_rho:.2f} over the paper's six models", threshold=">= 0.8", passed=rho >= 0.8,
              required=False),
        Check("semantic conflicts hardest for the error-reading agent without state reasoning (syntactic)",
              ", ".join(f"{t} {syn[t]['acc']:.2f}" for t in (*other_types, "semantic") if t in syn),
              paper="no per-error-type numbers (inferred ordering)", threshold="semantic < every other type",
              passed=semantic_hardest, required=False,
              note="follows from the scripted skills' design"),
        # The paper's headline is about LLM agents; none runs here, so the claim stays untested
        # (a failed required check, never a pass): the checks above validate the harness only.
        Check("the paper's headline: LLM agents stay below 50% Acc", "not measured (no LLM agent subject)",
              paper="all six LLMs < 50% Acc, best 38.66%", threshold="an LLM agent measured below 50%",
              passed=False, note="subjects are scripted agents; the library's small LM is no tool caller"),
    ]
    harness_ok = oracle_ok and transport_ok and ordered
    if harness_ok:
        cause_class = "scale"
        cause = ("the harness checks pass, but the paper's claim is about LLM agents and none is run at CPU "
                 "scale (scripted agents of graded skill are the subjects)")
    elif oracle_ok and transport_ok:  # only the skill ordering failed: too few tasks for the paired SE
        cause_class = "scale"
        cause = (f"a skill step is not above 2 paired SE with {n_tasks} tasks ("
                 + "; ".join(f"{s['from']}->{s['to']}" for s in steps if not s["passed"]) + ")")
    else:
        cause_class = "bug"
        cause = ("the oracle misses checkpoints (a task or checker defect)" if not oracle_ok else
                 "stdio and in-memory episodes differ (a transport-dependent server)")
    verdict, reproduced = verdict_from_checks(
        checks, claim="LLM agents struggle with personalized tool use on a benchmark whose MCP/SQLite harness "
                      "yields solvable, checkable personal-app tasks and separates agents of graded skill",
        context=(f"{n_tasks} tasks ({len(c.world_seeds)} worlds x {c.num_personas} personas x "
                 f"{len(c.task_seeds)} seeds x {sum(len(tk.INJECTIONS[t]) for t in c.templates)} "
                 f"template/injection pairs), real MCP server (mcp SDK) over the in-memory transport, SQLite state. "
                 f"Per agent: {acc_txt}. Acc per error type: {type_txt}. Acc per app: {app_txt}. The paper's "
                 "LLM numbers (all < 50% Acc, best 38.66%) are not comparable: our subjects are scripted agents"),
        cause=cause, cause_class=cause_class)
    metrics = {
        "num_tasks": n_tasks,
        "acc_by_agent": {s: m_agent[s]["acc"] for s in c.skills},
        "by_agent": m_agent,
        "by_agent_app": per_app,
        "by_agent_error_type": per_type,
        "by_agent_template": per_template,
        "skill_steps": steps,
        "stdio_identical": f"{sum(same)}/{len(same)}",
        "spearman_exec_acc_vs_acc": rho,
        "paper_spearman_exec_acc_vs_acc": paper_rho,
        "paper_table": {k: {"acc": v[0], "exec_acc": v[1]} for k, v in _PAPER_TABLE.items()},
        "checks": [ch.as_dict() for ch in checks],
    }
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots,
            "cause": None if reproduced else cause_class}


def _plot_apps(per_app, c: Config, workdir):
    fig, ax = plotting.subplots(figsize=(7.5, 4))
    apps = list(sv.APPS)
    width = 0.8 / len(c.skills)
    for i, s in enumerate(c.skills):
        vals = [per_app[s].get(a, {}).get("acc", float("nan")) for a in apps]
        ax.bar(np.arange(len(apps)) + (i - (len(c.skills) - 1) / 2) * width, vals, width, label=s)
    ax.set_xticks(range(len(apps)), apps)
    ax.set(ylabel="Acc (mean checkpoint fraction)", ylim=(0, 1.05), title="MCP-Persona: Acc per app x agent")
    plotting.legend(ax, fontsize=7, ncol=len(c.skills), loc="upper center", bbox_to_anchor=(0.5, -0.1))
    return report.savefig(fig, workdir / "acc_per_app.png")


def _plot_types(per_type, c: Config, workdir):
    fig, ax = plotting.subplots(figsize=(7.5, 4))
    kinds = ["none", *sv.ERROR_TYPES]
    width = 0.8 / len(c.skills)
    for i, s in enumerate(c.skills):
        vals = [per_type[s].get(k, {}).get("acc", float("nan")) for k in kinds]
        ax.bar(np.arange(len(kinds)) + (i - (len(c.skills) - 1) / 2) * width, vals, width, label=s)
    ax.set_xticks(range(len(kinds)), [k.replace("_", " ") for k in kinds])
    ax.set(ylabel="Acc", ylim=(0, 1.05), title="Acc per injected error type x agent")
    plotting.legend(ax, fontsize=7, ncol=len(c.skills), loc="upper center", bbox_to_anchor=(0.5, -0.1))
    return report.savefig(fig, workdir / "acc_per_error_type.png")


EXPERIMENT = registry.Experiment(
    slug="mcp_persona",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(world_seeds=(0,), num_users=10, num_personas=1, task_seeds=(0,), stdio_tasks=1,
                                progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(world_seeds=(0, 1, 2, 3, 4), task_seeds=(0, 1, 2), stdio_tasks=40),
    },
    run=run,
)
