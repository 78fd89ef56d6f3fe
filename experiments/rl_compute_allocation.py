"""Experiment `rl_compute_allocation`: the iso-compute frontier n*(C) on a GRPO bandit surrogate.

Paper: Cheng, Xie, Qu, Setlur, ..., Kumar, "IsoCompute Playbook: compute-optimal sampling allocation
for on-policy LLM RL" (arXiv:2603.12151). Method and protocol: `algorithms.rl.compute_allocation`.

Protocol (the paper's, at toy scale): a budget of C rollouts is split as C = n * B_p * M (n rollouts
per problem, B_p problems per batch, M update steps). For every C in a grid and every (n, B_p) with
M = C / (n B_p) >= `min_steps`, GRPO (Adam, std-normalised group advantages, Monte-Carlo sampled
answers) trains the policy and the best mean correct mass over the run is recorded, averaged over
seeds; n*(C) is the argmax over n (best B_p), and a saturating curve
log2 n*(C) = a + (b - a) sigmoid(k (log2 C - c0)) is fitted to it.

The policy is the spec's "multi-problem softmax bandit" surrogate (an LLM run is far beyond two CPU
cores): P problems, each a softmax over K answers with one correct, logits sharing D parameters
across problems (cross-problem interference). Two splits: easy (base correct mass 0.1-0.6; gains
come from sharpening) and hard (base mass 0.002-0.02: with small n most groups have no success
and give no gradient; gains need coverage). Scores: mean correct mass (pass@1) on both, and the
fraction of problems with correct mass >= 0.5 (coverage) on the hard split.

Verdict: reproduced if, on both splits, n*(C) rises with C (Spearman rho > 0 and the largest budget's
n* above the smallest's) and saturates (the fitted upper plateau 2^b is reached inside the budget
range, i.e. c0 + 2 / k <= log2 C_max, or n* stops changing over the last budgets). How much B_p
matters at n* is reported (score spread over B_p relative to the spread over n).

    python -m experiments run rl_compute_allocation --preset smoke   # seconds, used by the tests
    python -m experiments run rl_compute_allocation --preset quick   # 2 CPU cores, a few minutes
    python -m experiments run rl_compute_allocation --preset paper   # larger bandit, wider grid, more seeds
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402
import tqdm  # noqa: E402

from algorithms.rl import compute_allocation as ca  # noqa: E402
from experiments import registry, report  # noqa: E402

SPLITS = {"easy": (0.1, 0.6), "hard": (0.002, 0.02)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """Settings of the rl_compute_allocation experiment.

    Attributes:
      num_problems_total: P problems per split.
      num_answers: K answers per problem.
      dim: D shared parameters.
      log2_budgets: log2 C of the budgets.
      n_grid: rollouts per problem n.
      bp_grid: problems per batch B_p (<= P).
      min_steps: drop configurations with M below this.
      seeds: independent runs averaged per configuration.
      learning_rate: Adam step size.
      seed: bandit and training seed.
      progress: tqdm bars.
    """

    num_problems_total: int = 128
    num_answers: int = 32
    dim: int = 32
    log2_budgets: tuple[int, ...] = (10, 11, 12, 13, 14, 15, 16)
    n_grid: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    bp_grid: tuple[int, ...] = (4, 16, 64)
    min_steps: int = 4
    seeds: int = 4
    learning_rate: float = 0.05
    seed: int = 0
    progress: bool = True


def _validate(c: Config) -> None:
    if c.num_problems_total < 1 or c.num_answers < 2 or c.dim < 1 or c.seeds < 1 or c.min_steps < 1:
        raise ValueError(f"need num_problems_total, dim, seeds, min_steps >= 1 and num_answers >= 2; got {c}")
    if max(c.bp_grid) > c.num_problems_total:
        raise ValueError(f"bp_grid must be <= num_problems_total={c.num_problems_total}; got {c.bp_grid}")
    if len(c.log2_budgets) < 4:
        raise ValueError(f"log2_budgets needs >= 4 budgets for the saturating fit; got {c.log2_budgets}")


def _bandit(c: Config, split: str) -> ca.Bandit:
    lo, hi = SPLITS[split]
    rng = np.random.default_rng([c.seed, list(SPLITS).index(split)])
    masses = np.exp(rng.uniform(np.log(lo), np.log(hi), c.num_problems_total))
    key = jax.random.fold_in(jax.random.key(c.seed), list(SPLITS).index(split))
    return ca.make_bandit(key, masses, num_answers=c.num_answers, dim=c.dim)


@functools.partial(jax.jit, static_argnames=("n", "num_problems", "lr"))
def _train_seeds(keys, bandit, steps, *, n, num_problems, lr):
    """GRPO on the bandit for every seed key; one compile per (n, B_p) serves all budgets and splits."""
    return jax.vmap(lambda k: ca.train_bandit(k, bandit, n=n, num_problems=num_problems, steps=steps, lr=lr))(keys)


def _sweep(c: Config, bandit: ca.Bandit, split: str) -> list[dict]:
    cfgs = ca.iso_compute_configs([2**b for b in c.log2_budgets], c.n_grid, c.bp_grid, min_steps=c.min_steps)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(c.seed), 100 + list(SPLITS).index(split)), c.seeds)
    rows = []
    for cfg in tqdm.tqdm(cfgs, desc=f"rl_compute_allocation {split}", disable=not c.progress):
        out = _train_seeds(keys, bandit, cfg.steps, n=cfg.n, num_problems=cfg.num_problems, lr=c.learning_rate)
        best_p = np.asarray(out["best_p"])  # [S, P] at each seed's best step
        rows.append(dict(budget=cfg.budget, n=cfg.n, num_problems=cfg.num_problems, steps=cfg.steps,
                         score=float(np.mean(out["best"])), score_se=float(np.std(out["best"]) / np.sqrt(c.seeds)),
                         coverage=float(np.mean(best_p >= 0.5))))
    return rows


def _analyse(rows: list[dict]) -> dict:
    budgets = sorted({r["budget"] for r in rows})
    best_by_n = {}  # (C, n) -> best over B_p
    for r in rows:
        k = (r["budget"], r["n"])
        if k not in best_by_n or r["score"] > best_by_n[k]["score"]:
            best_by_n[k] = r
    front = ca.frontier(list(best_by_n.values()))
    log2_c = np.log2(budgets)
    log2_n = np.log2([front[C]["n"] for C in budgets])
    fit = ca.fit_saturating(log2_c, log2_n)
    rho = float(scipy.stats.spearmanr(log2_c, log2_n).statistic) if np.ptp(log2_n) > 0 else 0.0
    rises = bool(rho > 0 and log2_n[-1] > log2_n[0])
    plateau_inside = fit.c0 + 2.0 / fit.k <= log2_c[-1]
    flat_tail = bool(len(log2_n) >= 3 and log2_n[-1] == log2_n[-2])
    saturates = bool(plateau_inside or flat_tail)
    # B_p's effect at n*: spread of the score over B_p vs spread over n (at the best B_p), per budget
    bp_spread, n_spread = [], []
    for C in budgets:
        at_n = [r["score"] for r in rows if r["budget"] == C and r["n"] == front[C]["n"]]
        over_n = [v["score"] for (b, _), v in best_by_n.items() if b == C]
        if len(at_n) > 1 and len(over_n) > 1:
            bp_spread.append(max(at_n) - min(at_n))
            n_spread.append(max(over_n) - min(over_n))
    return {
        "frontier": {str(C): {k: front[C][k] for k in ("n", "num_problems", "steps", "score", "coverage")}
                     for C in budgets},
        "n_star": [int(front[C]["n"]) for C in budgets],
        "budgets": budgets,
        "fit": fit._asdict(),
        "spearman": rho,
        "rises": rises,
        "saturates": saturates,
        "bp_spread_over_n_spread": float(np.mean(bp_spread) / max(np.mean(n_spread), 1e-12)) if n_spread else None,
        "best_by_n": [{"budget": C, "n": n, "score": v["score"], "coverage": v["coverage"]}
                      for (C, n), v in sorted(best_by_n.items())],
    }


def run(c: Config, workdir: pathlib.Path) -> dict:
    _validate(c)
    workdir = pathlib.Path(workdir)
    results = {}
    for split in SPLITS:
        bandit = _bandit(c, split)
        rows = _sweep(c, bandit, split)
        base = ca.correct_mass(bandit, np.zeros(c.dim, np.float32))
        results[split] = dict(_analyse(rows), rows=rows, base_pass1=float(np.mean(base)))
    reproduced = all(r["rises"] and r["saturates"] for r in results.values())

    def txt(split):
        r = results[split]
        ns = ", ".join(f"2^{int(np.log2(C))}: {n}" for C, n in zip(r["budgets"], r["n_star"]))
        f = r["fit"]
        return (f"{split} (base pass@1 {r['base_pass1']:.3f}): n*(C) {ns}; Spearman {r['spearman']:+.2f}; fitted "
                f"plateau n = 2^{f['b']:.1f} reached at C = 2^{f['c0'] + 2 / f['k']:.1f}; best pass@1 at the largest "
                f"budget {r['frontier'][str(r['budgets'][-1])]['score']:.3f} (coverage "
                f"{r['frontier'][str(r['budgets'][-1])]['coverage']:.2f})"
                + (f"; B_p spread / n spread {r['bp_spread_over_n_spread']:.2f}"
                   if r["bp_spread_over_n_spread"] is not None else ""))

    verdict = (
        "Paper: the compute-optimal rollouts per problem n*(C) rise with the sampling budget and then saturate, on "
        "easy and hard problems, while problems per batch matter little. Ours (softmax-bandit surrogate of GRPO, "
        f"{c.num_problems_total} problems x {c.num_answers} answers, {c.dim} shared parameters, {c.seeds} seeds): "
        + "; ".join(txt(s) for s in SPLITS) + ". "
        + ("Reproduced: n* rises and saturates on both splits." if reproduced else
           "Not fully reproduced: " + ", ".join(f"{s}: {'rises' if r['rises'] else 'does not rise'}, "
                                                f"{'saturates' if r['saturates'] else 'does not saturate'}"
                                                for s, r in results.items()) + ".")
    )
    metrics = {s: {k: v for k, v in r.items() if k != "rows"} for s, r in results.items()}
    metrics["rows"] = {s: r["rows"] for s, r in results.items()}
    plots = [_plot(results, workdir)]
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots}


def _plot(results: dict, workdir: pathlib.Path) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, split in zip(axes[:2], SPLITS):
        r = results[split]
        cmap = plt.get_cmap("viridis")
        for i, C in enumerate(r["budgets"]):
            pts = [(b["n"], b["score"]) for b in r["best_by_n"] if b["budget"] == C]
            ns, sc = zip(*pts)
            ax.plot(ns, sc, "o-", ms=3, color=cmap(i / max(1, len(r["budgets"]) - 1)), label=f"C=2^{int(np.log2(C))}")
            n_star = r["frontier"][str(C)]["n"]
            ax.plot([n_star], [r["frontier"][str(C)]["score"]], "k*", ms=8)
        ax.set(xscale="log", xlabel="rollouts per problem n", ylabel="best pass@1 (best B_p)", title=f"{split} split")
        ax.legend(fontsize=6)
    for split in SPLITS:
        r = results[split]
        x = np.log2(r["budgets"])
        axes[2].plot(x, np.log2(r["n_star"]), "o", label=f"{split} n*")
        xx = np.linspace(x.min(), x.max(), 100)
        f = r["fit"]
        axes[2].plot(xx, ca.saturating_curve(xx, f["a"], f["b"], f["k"], f["c0"]), "-", lw=1)
    axes[2].set(xlabel="log2 budget C (rollouts)", ylabel="log2 n*(C)", title="compute-optimal n and saturating fit")
    axes[2].legend(fontsize=8)
    return report.savefig(fig, workdir / "frontier.png")


EXPERIMENT = registry.Experiment(
    slug="rl_compute_allocation",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(num_problems_total=16, num_answers=8, dim=8, log2_budgets=(8, 9, 10, 11),
                                n_grid=(1, 4, 16), bp_grid=(4,), seeds=2, progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(num_problems_total=1024, dim=64, log2_budgets=tuple(range(10, 21)),
                                n_grid=tuple(2**i for i in range(10)), bp_grid=(8, 32, 128, 512), seeds=16),
    },
    run=run,
)
