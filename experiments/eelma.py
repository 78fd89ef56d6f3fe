"""EELMA: estimated effective empowerment of scripted text agents against task success and the exact value.

Paper: Song, Gore, Kleiman-Weiner, "Estimating the Empowerment of Language Model Agents" (arXiv
2509.22504). Claim: effective empowerment, estimated from multi-turn text interactions with two InfoNCE
critics, is a goal-agnostic agent metric that rank-correlates with task performance (Spearman
0.94/0.83/0.87 on WebArena GitLab/Reddit/Shopping-Admin; spec: uncertain), and the estimator tracks the
exact empowerment on language games (state RMSE 0.056 bits on their gridworld).

Setting (offline, exact-checkable; `experiments.tasks.text_envs`): a two-room text gridworld and a
tool-use web shop (login with a correct or wrong password, search, open item, add to cart, checkout).
Per environment, agents of graded skill (the optimal planner mixed with random actions at epsilon in
{0, .1, .2, .35, .5, .7, .85, 1}, a "lazy" planner that idles half the time, and a stuck agent)
run episodes towards goals given in their instructions (not in the observations). For each agent:

* task success: the fraction of its logged episodes that reach the goal (and the exact probability);
* exact effective empowerment I(a_t; s_* | s_t) of its policy under the logging scheme, by enumeration
  (`algorithms.agents.eelma.exact_effective_empowerment` on the (goal, observation) chain);
* the EELMA estimate: texts embedded by a fixed hashed bag-of-n-grams encoder, one critic pair per
  agent trained on triples from its training episodes (all agents of an environment in one vmapped
  program), read out on triples from held-out episodes.

Checks fixed before the run (thresholds from the claim; the paper's numbers are WebArena's, ours are
toy environments): per environment Spearman(estimate, success) >= 0.8 with a 95% bootstrap interval
(agents resampled) whose lower end is > 0; and the estimate stays below the exact value within Monte
Carlo error (every agent: estimate <= exact + 3 SE). Diagnostics (not required): Spearman of the exact
empowerment with success (is the quantity itself predictive here, whatever the estimator), and RMSE
of the estimate against the exact value per agent and per state (paper: 0.056 bits state RMSE).

Recipe:
    python -m experiments run eelma --preset smoke     # seconds, used by the tests
    python -m experiments run eelma --preset quick     # a few minutes on 2 CPU cores
    python -m experiments run eelma --preset paper     # more episodes, steps and agents
    python -m experiments run eelma --preset smoke --train.num-steps 20   # one field of a config section

Config sections (`run eelma --help` lists every field): agents, data, model, train, eval; envs and seed are top-level.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from scipy import stats

from algorithms.agents import eelma
from experiments import _plotting as plotting
from experiments import registry, report
from experiments.checks import Check
from experiments.checks import verdict as verdict_from_checks
from experiments.tasks import text_envs as te

_CACHE_VERSION = 2
_LN2 = math.log(2.0)
_PAPER_SPEARMAN = "0.94 / 0.83 / 0.87 (WebArena GitLab / Reddit / Shopping-Admin; spec: uncertain)"
_ENVS = ("gridworld", "tool_shop")
# The read-out is a float32 difference of two log-sum-exp normalised scores of magnitude ~log K: an agent
# whose exact value is 0 (the stuck agent) reads out ~1e-6 with a zero standard error.
_ROUNDOFF_BITS = 1e-4


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentsSection:
    """The graded agents per environment: planner + random actions at each epsilon, lazy planners, a stuck agent."""

    epsilons: tuple[float, ...] = (0.0, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 1.0)
    lazy: tuple[float, ...] = (0.5,)
    stuck: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    """Logged episodes per agent and the (state, action, future) triples drawn from them (``--data.gamma 0.8``)."""

    gamma: float = 0.9
    train_episodes: int = 2000
    eval_episodes: int = 1000
    train_triples: int = 20_000
    eval_triples: int = 8192


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The hashed n-gram text encoder's width and the InfoNCE critics' sizes (``--model.hidden 64``)."""

    embed_dim: int = 256
    hidden: int = 128
    proj_dim: int = 64
    out_dim: int = 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """Adam training of the critics; `batch_size` is also the read-out's K (``--train.num-steps 500``)."""

    num_steps: int = 2000
    batch_size: int = 256
    learning_rate: float = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Per-state read-out and the rank-correlation check (``--eval.spearman-threshold 0.7``)."""

    min_state_samples: int = 30
    bootstrap: int = 2000
    spearman_threshold: float = 0.8


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """eelma settings, in sections overridden on the command line as ``--train.num-steps 500``."""

    envs: tuple[str, ...] = _ENVS
    agents: AgentsSection = AgentsSection()
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        err, ag, d = registry.ConfigError, self.agents, self.data
        bad = [e for e in self.envs if e not in _ENVS]
        if bad or not self.envs:
            raise err("envs", f"must be a non-empty subset of {_ENVS}, got {self.envs}")
        if not 0.0 <= d.gamma < 1.0:
            raise err("data.gamma", f"must lie in [0, 1), got {d.gamma}")
        n = len(ag.epsilons) + len(ag.lazy) + int(ag.stuck)
        if n < 3:
            raise err("agents.epsilons", f"(with agents.lazy and agents.stuck) must give at least 3 agents per "
                                         f"environment for a rank correlation; got {n}")
        if d.eval_triples < 2 * self.train.batch_size:
            raise err("data.eval_triples", f"must be >= 2 * train.batch_size = {2 * self.train.batch_size} "
                                           f"(standard errors), got {d.eval_triples}")


# The flat field names the config had before it was split into sections, in their old order: the
# environment's cache key holds them, so results cached before the split stay valid.
_FLAT_FIELDS = (
    ("envs", "envs"), ("epsilons", "agents.epsilons"), ("lazy", "agents.lazy"), ("stuck", "agents.stuck"),
    ("gamma", "data.gamma"), ("train_episodes", "data.train_episodes"), ("eval_episodes", "data.eval_episodes"),
    ("train_triples", "data.train_triples"), ("eval_triples", "data.eval_triples"),
    ("embed_dim", "model.embed_dim"), ("hidden", "model.hidden"), ("proj_dim", "model.proj_dim"),
    ("out_dim", "model.out_dim"), ("num_steps", "train.num_steps"), ("batch_size", "train.batch_size"),
    ("learning_rate", "train.learning_rate"), ("min_state_samples", "eval.min_state_samples"),
    ("bootstrap", "eval.bootstrap"), ("spearman_threshold", "eval.spearman_threshold"), ("seed", "seed"),
    ("progress", "progress"),
)


def _flat_fields(c: Config) -> dict:
    """The config as the pre-sections flat dict (``dataclasses.asdict`` of the old flat config)."""
    return registry.flat_fields(c, _FLAT_FIELDS)


def _make_env(name: str) -> te.TextEnv:
    return te.gridworld() if name == "gridworld" else te.tool_shop()


def spearman_with_ci(x, y, *, num_boot: int, seed: int, level: float = 0.95) -> tuple[float, float, float]:
    """Spearman's rho of paired values and a percentile bootstrap interval (pairs resampled).

    Resamples whose values are constant in x or y (undefined rho) are skipped.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = float(stats.spearmanr(x, y).statistic)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(num_boot):
        idx = rng.integers(0, x.size, x.size)
        if np.ptp(x[idx]) == 0 or np.ptp(y[idx]) == 0:
            continue
        boots.append(stats.spearmanr(x[idx], y[idx]).statistic)
    boots = np.asarray(boots, float)
    if boots.size == 0:
        return rho, float("nan"), float("nan")
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return rho, float(lo), float(hi)


def _cache_key(c: Config, env: str) -> str:
    fields = _flat_fields(c)
    for k in ("progress", "bootstrap", "spearman_threshold", "envs"):
        fields.pop(k)
    blob = json.dumps({"v": _CACHE_VERSION, "env": env, **fields}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _exact_per_action(exact: eelma.ExactEmpowerment) -> np.ndarray:
    """Exact state-action empowerment averaged over the states where each action is taken: `[m]` nats."""
    p_sa = exact.joint.sum(2)
    p_a = p_sa.sum(0)
    return np.where(p_a > 0, (p_sa * exact.per_state_action).sum(0) / np.where(p_a > 0, p_a, 1.0), 0.0)


def _pivotal(rows, actions: tuple[str, str], min_count: int) -> dict:
    """Count-weighted estimated and exact empowerment (bits) of two actions, pooled over agents taking both."""
    out = {}
    for text in actions:
        used = [a["per_action_bits"][text] for a in rows
                if min(a["per_action_bits"][t]["count"] for t in actions) >= min_count]
        w = np.array([u["count"] for u in used], float)
        out[text] = {"estimate": float(np.average([u["estimate"] for u in used], weights=w)) if used else float("nan"),
                     "exact": float(np.average([u["exact"] for u in used], weights=w)) if used else float("nan"),
                     "agents": len(used)}
    return out


def _tables(c: Config, env: te.TextEnv):
    """The hashed n-gram embeddings of the env's state and action texts ``([n, D], [m, D])``."""
    return (eelma.hash_embed(env.state_texts, dim=c.model.embed_dim, seed=c.seed),
            eelma.hash_embed(env.action_texts, dim=c.model.embed_dim, seed=c.seed + 1))


def _critic_step_loss(model, batch, *, state_table, action_table):
    """`eelma.eelma_loss` of one agent's batch of triple ids ``{"s", "a", "f"}`` over the env's tables."""
    return eelma.eelma_loss(model, state_table, action_table, batch["s"], batch["a"], batch["f"])


def train_step(c: Config):
    """One agent's critic step of `eelma.train_critics` as `_run_env` calls it, for ``python -m experiments aot
    eelma`` (`experiments.aot`): an `eelma.EmpowermentCritic` (the agents' critics are independent, vmapped
    together), `eelma.eelma_loss` over the env's embedding tables (the env of ``c.envs`` with the most state texts,
    the largest step), ``train.batch_size`` triple ids drawn in the step, Adam from `eelma.optimizer_config`."""
    import functools

    from experiments import aot

    env = max((_make_env(n) for n in c.envs), key=lambda e: len(e.state_texts))
    state_table, action_table = _tables(c, env)
    ids = np.zeros((c.train.batch_size,), np.int32)
    dims = {"state_dim": state_table.shape[1], "action_dim": action_table.shape[1], "hidden": c.model.hidden,
            "proj_dim": c.model.proj_dim, "out_dim": c.model.out_dim}
    return aot.TrainStep.from_batch(
        {"s": ids, "a": ids, "f": ids}, model=dims, model_fn=lambda rngs: eelma.EmpowermentCritic(**dims, rngs=rngs),
        loss_fn=functools.partial(_critic_step_loss, state_table=jnp.asarray(state_table),
                                  action_table=jnp.asarray(action_table)),
        optimizer=eelma.optimizer_config(c.train.learning_rate, c.train.num_steps))


def _run_env(c: Config, name: str, index: int, workdir: epath.Path) -> dict:
    cache = workdir / "cache" / f"{name}_{_cache_key(c, name)}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    env = _make_env(name)
    agents = te.graded_agents(env, c.agents.epsilons, c.agents.lazy, c.agents.stuck)
    key = jax.random.fold_in(jax.random.key(c.seed), index)
    state_table, action_table = _tables(c, env)

    rows, tr, ev = [], [], []
    for i, agent in enumerate(agents):
        base = 1000 * (c.seed * 16 + index) + 10 * i
        train_logs = te.simulate(env, agent, num_episodes=c.data.train_episodes, seed=base)
        eval_logs = te.simulate(env, agent, num_episodes=c.data.eval_episodes, seed=base + 1)
        k_tr, k_ev = jax.random.split(jax.random.fold_in(key, i))
        tr.append(eelma.triples_from_logs(k_tr, train_logs.states, train_logs.actions, train_logs.lengths,
                                          num_samples=c.data.train_triples, gamma=c.data.gamma))
        ev.append(eelma.triples_from_logs(k_ev, eval_logs.states, eval_logs.actions, eval_logs.lengths,
                                          num_samples=c.data.eval_triples, gamma=c.data.gamma))
        exact = eelma.exact_effective_empowerment(gamma=c.data.gamma, **te.augmented_chain(env, agent))
        success = np.concatenate([train_logs.success, eval_logs.success])
        rows.append({"agent": agent.name, "skill": agent.skill, "success": float(success.mean()),
                     "success_se": float(success.std(ddof=1) / math.sqrt(success.size)),
                     "exact_success": te.exact_success(env, agent), "exact": exact.empowerment,
                     "mean_length": float(np.concatenate([train_logs.lengths, eval_logs.lengths]).mean()),
                     "_per_state": exact.per_state, "_per_action": _exact_per_action(exact)})
    stack = [np.stack(x) for x in zip(*tr)]
    critics = eelma.train_critics(jax.random.fold_in(key, 10 ** 6), state_table, action_table, *stack,
                                  num_steps=c.train.num_steps, batch_size=c.train.batch_size,
                                  learning_rate=c.train.learning_rate,
                                  hidden=c.model.hidden, proj_dim=c.model.proj_dim, out_dim=c.model.out_dim,
                                  log_every=max(1, min(200, c.train.num_steps // 5)), progress=c.progress,
                                  desc=f"eelma {name}")
    ev_s, ev_a, ev_f = (np.stack(x) for x in zip(*ev))
    est = eelma.estimate_empowerment(critics, state_table, action_table, ev_s, ev_a, ev_f,
                                     batch_size=c.train.batch_size)
    used = est.per_sample.shape[1]
    for i, row in enumerate(rows):
        per_state_exact, per_action_exact = row.pop("_per_state"), row.pop("_per_action")
        a_ids = ev_a[i, :used]
        a_counts = np.bincount(a_ids, minlength=env.num_actions)
        a_sums = np.bincount(a_ids, weights=est.per_sample[i], minlength=env.num_actions)
        row["per_action_bits"] = {
            text: {"estimate": float(a_sums[k] / a_counts[k] / _LN2) if a_counts[k] else float("nan"),
                   "exact": float(per_action_exact[k] / _LN2), "count": int(a_counts[k])}
            for k, text in enumerate(env.action_texts)}
        s_ids = ev_s[i, :used]
        counts = np.bincount(s_ids, minlength=env.num_states)
        sums = np.bincount(s_ids, weights=est.per_sample[i], minlength=env.num_states)
        ok = counts >= c.eval.min_state_samples
        err = (sums[ok] / counts[ok] - per_state_exact[ok]) / _LN2
        row |= {"estimate": float(est.empowerment[i]), "estimate_se": float(est.se[i]),
                "infonce_sa": float(est.infonce_sa[i]), "infonce_s": float(est.infonce_s[i]),
                "raw_readout": float(est.raw[i]),
                "state_rmse_bits": float(np.sqrt(np.average(err ** 2, weights=counts[ok]))) if ok.any() else float("nan"),
                "states_scored": int(ok.sum())}
    out = {"env": name, "num_states": env.num_states, "num_actions": env.num_actions, "horizon": env.horizon,
           "agents": rows,
           "final_train_infonce_sa": critics.history[-1]["infonce_sa"].tolist(),
           "final_train_infonce_s": critics.history[-1]["infonce_s"].tolist(),
           "example_state_text": env.state_texts[0], "example_action_text": env.action_texts[0]}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column)."""
    per = metrics["per_env"]
    rho = " / ".join(f"{per[e]['spearman_estimate_success']:.2f}" for e in per)
    rmse = " / ".join(f"{per[e]['rmse_bits']:.3f}" for e in per)
    return f"Spearman(est., success) {rho} ({' / '.join(per)}); est. vs exact RMSE {rmse} bits"


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    results = {name: _run_env(c, name, i, workdir) for i, name in enumerate(c.envs)}

    checks, per_env, context = [], {}, []
    below_all, worst_excess = True, -float("inf")
    for i, (name, r) in enumerate(results.items()):
        rows = r["agents"]
        est = np.array([a["estimate"] for a in rows])
        se = np.array([a["estimate_se"] for a in rows])
        exact = np.array([a["exact"] for a in rows])
        succ = np.array([a["success"] for a in rows])
        rho, lo, hi = spearman_with_ci(est, succ, num_boot=c.eval.bootstrap, seed=c.seed + i)
        rho_x, lo_x, hi_x = spearman_with_ci(exact, succ, num_boot=c.eval.bootstrap, seed=c.seed + 100 + i)
        excess = (est - exact - 3.0 * se) / _LN2          # > 0: above the exact value by more than 3 SE
        below_all &= bool((excess <= _ROUNDOFF_BITS).all())
        worst_excess = max(worst_excess, float(excess.max()))
        rmse = float(np.sqrt(np.mean((est - exact) ** 2)) / _LN2)
        state_rmse = [a["state_rmse_bits"] for a in rows if np.isfinite(a["state_rmse_bits"])]
        state_rmse = float(np.mean(state_rmse)) if state_rmse else float("nan")
        per_env[name] = {"spearman_estimate_success": rho, "spearman_ci": [lo, hi],
                         "spearman_exact_success": rho_x, "spearman_exact_ci": [lo_x, hi_x],
                         "rmse_bits": rmse, "mean_state_rmse_bits": state_rmse,
                         "max_excess_over_exact_plus_3se_bits": float(excess.max()),
                         "mean_estimate_minus_exact_bits": float((est - exact).mean() / _LN2)}
        passed = bool(rho >= c.eval.spearman_threshold and lo > 0)
        checks.append(Check(f"{name}: Spearman(estimated empowerment, success) over {len(rows)} agents [95% CI]",
                            f"{rho:.3f} [{lo:.2f}, {hi:.2f}]", paper=_PAPER_SPEARMAN,
                            threshold=f">= {c.eval.spearman_threshold} and CI lower end > 0", passed=passed))
        checks.append(Check(f"{name}: Spearman(exact empowerment, success) [95% CI]",
                            f"{rho_x:.3f} [{lo_x:.2f}, {hi_x:.2f}]", paper="(not in the paper: diagnostic)",
                            threshold=f">= {c.eval.spearman_threshold}",
                            passed=bool(rho_x >= c.eval.spearman_threshold),
                            required=False, note="is the exact quantity itself predictive of success here"))
        checks.append(Check(f"{name}: RMSE of estimate vs exact per agent (bits); mean per-state RMSE",
                            f"{rmse:.3f}; {state_rmse:.3f}", paper="state RMSE 0.056 bits (gridworld), 0.158 (ToH)",
                            threshold="per-agent RMSE <= 0.1 bits", passed=bool(rmse <= 0.1), required=False))
        table = ", ".join(f"{a['agent']}: est {a['estimate'] / _LN2:.3f} / exact {a['exact'] / _LN2:.3f} bits, "
                          f"success {a['success']:.2f}" for a in rows)
        context.append(f"{name} ({r['num_states']} states, {r['num_actions']} actions, T={r['horizon']}): {table}")
    if "tool_shop" in results:
        good, bad = "login(password='hunter2')", "login(password='123456')"
        piv = _pivotal(results["tool_shop"]["agents"], (good, bad), c.eval.min_state_samples)
        per_env["tool_shop"]["pivotal_login_bits"] = piv
        ok = bool(piv[good]["estimate"] > piv[bad]["estimate"])
        checks.append(Check("tool_shop: state-action empowerment of a correct vs a wrong password (bits, est.; exact)",
                            f"{piv[good]['estimate']:+.3f} vs {piv[bad]['estimate']:+.3f}; exact "
                            f"{piv[good]['exact']:+.3f} vs {piv[bad]['exact']:+.3f}",
                            paper="valid password +0.210 vs invalid -0.152 bits (WebArena)",
                            threshold="correct > wrong", passed=ok, required=False,
                            note=f"pooled over the {piv[good]['agents']} agents that try both"))
    checks.append(Check("estimate below the exact empowerment within Monte Carlo error: max over agents of "
                        "(estimate - exact - 3 SE), bits", worst_excess, paper="InfoNCE bounds are lower bounds",
                        threshold=f"<= 0 for every agent (up to float32 round-off, {_ROUNDOFF_BITS:g} bits)", passed=below_all))

    plots = [_plot_vs_success(results, c, workdir), _plot_vs_exact(results, workdir)]
    verdict, reproduced = verdict_from_checks(
        checks, claim="estimated effective empowerment rank-correlates with task success across agents of graded "
                      "skill, and stays below the exact empowerment",
        context=(f"gamma={c.data.gamma}, {c.data.train_episodes}+{c.data.eval_episodes} episodes and "
                 f"{c.data.train_triples} training triples per agent, K={c.train.batch_size}, {c.train.num_steps} "
                 f"Adam steps, hashed n-gram text encoder "
                 f"(D={c.model.embed_dim}). " + "; ".join(context)),
        cause=_cause_text(per_env, c.eval.spearman_threshold, below_all),
        cause_class=_cause_class(per_env, c.eval.spearman_threshold, below_all))
    cause = None if reproduced else _cause_class(per_env, c.eval.spearman_threshold, below_all)
    metrics = {"per_env": per_env, "estimate_below_exact": below_all, "max_excess_over_exact_plus_3se_bits": worst_excess,
               "results": results, "checks": [ch.as_dict() for ch in checks]}
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots, "cause": cause}


def _rank_failures(per_env, threshold) -> tuple[list[str], list[str]]:
    """Environments whose estimate fails the rank check, and those of them where the exact value fails too."""
    fail = [n for n, v in per_env.items()
            if not (v["spearman_estimate_success"] >= threshold and v["spearman_ci"][0] > 0)]
    return fail, [n for n in fail if per_env[n]["spearman_exact_success"] < threshold]


def _cause_class(per_env, threshold, below_all) -> str:
    fail, exact_fail = _rank_failures(per_env, threshold)
    if fail and len(exact_fail) == len(fail) and below_all:
        return "spec"   # the exact quantity itself does not rank with success: not the estimator
    return "scale"


def _cause_text(per_env, threshold, below_all) -> str:
    fail, exact_fail = _rank_failures(per_env, threshold)
    parts = []
    if exact_fail:
        parts.append(f"in {', '.join(exact_fail)} the exact effective empowerment itself ranks poorly with success "
                     f"(Spearman {', '.join(format(per_env[n]['spearman_exact_success'], '.2f') for n in exact_fail)}), "
                     "so the estimator (which tracks the exact value) cannot: under our inferred environments and "
                     "agent population (goal-directed planners mixed with random actions) I(a; s_* | s) is bounded "
                     "by the action entropy and random agents keep it high, so the claim's direction is "
                     "environment-dependent")
    if [n for n in fail if n not in exact_fail]:
        parts.append("the estimate ranks worse than the exact value in "
                     + ", ".join(n for n in fail if n not in exact_fail) + " (estimator error at this scale)")
    if not below_all:
        parts.append("some estimate exceeds the exact value by more than 3 SE (the read-out is a difference of two "
                     "InfoNCE bounds, not itself a bound)")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------------------------


def _plot_vs_success(results, c: Config, workdir):
    k = len(results)
    fig, axes = plotting.subplots(1, k, figsize=(5.2 * k, 4.2), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        rows = r["agents"]
        succ = [a["success"] for a in rows]
        ax.errorbar(succ, [a["estimate"] / _LN2 for a in rows], yerr=[2 * a["estimate_se"] / _LN2 for a in rows],
                    fmt="o", color="k", capsize=2, label="EELMA estimate (+-2 SE)")
        ax.plot(succ, [a["exact"] / _LN2 for a in rows], "s", mfc="none", color="tab:red", label="exact")
        for a in rows:
            ax.annotate(a["agent"], (a["success"], a["estimate"] / _LN2), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
        ax.set(xlabel="task success rate", ylabel="effective empowerment (bits)",
               title=f"{name}, gamma={c.data.gamma}")
        plotting.legend(ax, fontsize=7)
    return report.savefig(fig, workdir / "empowerment_vs_success.png")


def _plot_vs_exact(results, workdir):
    fig, ax = plotting.subplots(figsize=(5, 4.5))
    hi = 0.0
    for (name, r), color in zip(results.items(), ("tab:blue", "tab:orange", "tab:green")):
        rows = r["agents"]
        x = [a["exact"] / _LN2 for a in rows]
        y = [a["estimate"] / _LN2 for a in rows]
        ax.errorbar(x, y, yerr=[2 * a["estimate_se"] / _LN2 for a in rows], fmt="o", color=color, capsize=2,
                    label=name)
        hi = max(hi, *x, *y)
    ax.plot([0, hi * 1.05], [0, hi * 1.05], "k--", lw=0.8, label="y = x")
    ax.set(xlabel="exact effective empowerment (bits)", ylabel="EELMA estimate (bits)", title="estimate vs exact")
    plotting.legend(ax, fontsize=7)
    return report.savefig(fig, workdir / "estimate_vs_exact.png")


EXPERIMENT = registry.Experiment(
    slug="eelma",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            agents=AgentsSection(epsilons=(0.0, 0.5, 1.0), lazy=()),
            data=DataSection(train_episodes=100, eval_episodes=60, train_triples=1000, eval_triples=256),
            model=ModelSection(embed_dim=64, hidden=32, proj_dim=16, out_dim=16),
            train=TrainSection(num_steps=40, batch_size=64), eval=EvalSection(bootstrap=100), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(
            agents=AgentsSection(epsilons=(0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
                                 lazy=(0.25, 0.5, 0.75)),
            data=DataSection(train_episodes=10_000, eval_episodes=4000, train_triples=100_000, eval_triples=32_768),
            model=ModelSection(hidden=256), train=TrainSection(num_steps=10_000), eval=EvalSection(bootstrap=10_000)),
    },
    run=run,
    train_step=train_step,
)
