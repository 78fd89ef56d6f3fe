"""SySRs: best-model identification that exploits model similarity (Lyu et al., arXiv:2606.07726).

A synthetic benchmark (K models x N binary prompts; latent prompt difficulty, model ability, and a noise
scale s setting how alike the models are: latent correlation 1 / (1 + s^2), s = inf independent) is
generated once per noise scale from the same random draws, so each model's expected accuracy is the
same at every s. On it, every method answers at every budget (2%..50% of the K x N grid) in 1000
runs: SySRs, Successive Rejects (SR), the naive shared-prompt and the independent uniform baselines,
UCB-E and shared-prompt UCB-E with a in {0.1, 1, 10, 100}. Reported:

* error probability against budget for every method, its average over budgets, and the confidence
  budget CB(tau) (the smallest budget from which accuracy stays >= tau);
* the SySRs-over-SR saving at every noise scale: it should grow with similarity (small s) and vanish
  for independent models (s = inf, a paired test over runs);
* empirical log error against the hardness-normalised budget (n - K) / (logbar(K) H) with SR's H_2
  and SySRs' paired H_SySRs, and the predicted speed-up (H_2 / H_SySRs) against the observed one (SR's
  budget over SySRs' budget to reach 10% error).

By default each model solves exactly round(acc N) prompts (its lowest latents), so the pool means,
the gaps and SR's difficulty are identical at every noise scale and only the similarity changes.

SR and SySRs use the finite-pool budget reallocation of the official code (an extension of the
paper's Algorithm 1; ``methods.reallocate=False`` keeps budgets where the plain schedule fits only).

Recipe:
    python -m experiments run sysr --preset smoke     # seconds, used by the tests
    python -m experiments run sysr --preset quick     # 2 CPU cores, a few minutes
    python -m experiments run sysr --preset paper     # larger pool, 1% budget steps, UCB-E everywhere
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import time
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath
import tqdm

from algorithms.statistics import best_arm
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments.checks import Check, Study

INF = math.inf
_CACHE_VERSION = 2  # bump when the algorithms' random streams change (invalidates cached runs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchSection:
    """The synthetic K x N benchmark, one per noise scale (``--bench.noise-scales 0.5 inf``)."""

    num_models: int = 20
    num_prompts: int = 1000
    noise_scales: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, INF)
    main_noise_scale: float = 0.5  # the benchmark on which the full comparison is plotted
    best_accuracy: float = 0.75
    worst_accuracy: float = 0.45
    exact_pool_means: bool = True  # each model solves exactly round(acc N) prompts: gaps fixed across s


@dataclasses.dataclass(frozen=True, kw_only=True)
class BudgetSection:
    """Budgets, as fractions of the K x N grid: min, min + step, ..., max (``--budget.step 0.01``)."""

    min: float = 0.02
    max: float = 0.50
    step: float = 0.02


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodsSection:
    """The methods' runs and settings (``--methods.num-runs 200``)."""

    num_runs: int = 1000
    explorations: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)
    ucb_noise_scales: tuple[float, ...] = (0.5,)  # benchmarks on which UCB-E baselines also run
    reallocate: bool = True
    run_batch_size: int = 0  # 0: all runs in one compiled call


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Confidence budgets and the observed speed-up (``--eval.taus 0.8 0.9``)."""

    taus: tuple[float, ...] = (0.7, 0.8, 0.9, 0.95, 1.0)
    speedup_error: float = 0.1  # observed speed-up: SR's budget over SySRs' budget to reach this error


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """sysr settings, in sections overridden on the command line as ``--methods.num-runs 200``."""

    bench: BenchSection = BenchSection()
    budget: BudgetSection = BudgetSection()
    methods: MethodsSection = MethodsSection()
    eval: EvalSection = EvalSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        _validate(self)


def _validate(c: Config) -> None:
    err, b = registry.ConfigError, c.budget
    if c.bench.main_noise_scale not in c.bench.noise_scales:
        raise err("bench.main_noise_scale", f"must be one of bench.noise_scales={c.bench.noise_scales}; got "
                  f"{c.bench.main_noise_scale}")
    missing = [s for s in c.methods.ucb_noise_scales if s not in c.bench.noise_scales]
    if missing:
        raise err("methods.ucb_noise_scales", f"must be a subset of bench.noise_scales={c.bench.noise_scales}, "
                  f"got extra {missing}")
    if not 0.0 < b.min <= b.max <= 1.0:
        raise err("budget.min", f"and budget.max need 0 < budget.min <= budget.max <= 1; got {b.min}, {b.max}")
    if b.step <= 0.0:
        raise err("budget.step", f"must be > 0; got {b.step}")


def _methods(c: Config, with_ucb: bool) -> list[tuple[str, str, float]]:
    out = [("SySRs", "sysr", 1.0), ("SR", "sr", 1.0), ("Naive (shared uniform)", "naive", 1.0),
           ("Uniform", "uniform", 1.0)]
    if with_ucb:
        out += [(f"UCB-E (a={a:g})", "ucbe", a) for a in c.methods.explorations]
        out += [(f"Smart-UCB-E (a={a:g})", "smart_ucbe", a) for a in c.methods.explorations]
    return out


def _grid(c: Config) -> tuple[np.ndarray, tuple[int, ...]]:
    fr = np.round(np.arange(c.budget.min, c.budget.max + 1e-9, c.budget.step), 6)
    budgets = best_arm.budgets_from_fractions(fr, c.bench.num_models, c.bench.num_prompts)
    keep, seen = [], set()
    for i, b in enumerate(budgets):  # one entry per distinct budget
        if b not in seen:
            seen.add(b)
            keep.append(i)
    budgets = tuple(budgets[i] for i in keep)
    if not c.methods.reallocate:
        cap = best_arm.max_budget_without_reallocation(c.bench.num_models, c.bench.num_prompts)
        keep = [i for i, b in enumerate(budgets) if b <= cap]
        budgets = tuple(budgets[i] for i in keep)
    fr = np.array(budgets, np.float64) / (c.bench.num_models * c.bench.num_prompts)
    return fr, budgets


def _cache_key(c: Config, s: float, method: str, a: float) -> str:
    # The flat field names of the config before it was nested, so cached runs still match.
    bench, budget, methods = c.bench, c.budget, c.methods
    fields = {"num_models": bench.num_models, "num_prompts": bench.num_prompts, "best_accuracy": bench.best_accuracy,
              "worst_accuracy": bench.worst_accuracy, "exact_pool_means": bench.exact_pool_means,
              "budget_min": budget.min, "budget_max": budget.max, "budget_step": budget.step,
              "num_runs": methods.num_runs, "reallocate": methods.reallocate, "speedup_error": c.eval.speedup_error,
              "seed": c.seed}
    blob = json.dumps({"v": _CACHE_VERSION, "c": fields, "s": str(s), "m": method, "a": a}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _errors(c: Config, scores, s: float, method: str, a: float, budgets, workdir: pathlib.Path) -> np.ndarray:
    """[b, r] error indicators of `method` (cached in the workdir so a rerun resumes)."""
    cache = workdir / "cache" / f"{method}_{_cache_key(c, s, method, a)}.npy"
    if cache.exists():
        return np.load(cache)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(c.seed), 1),
                             best_arm.METHODS.index(method) * 1000 + int(round(10 * math.log10(a))) + 50)
    selected = best_arm.simulate(method, key, scores, budgets, num_runs=c.methods.num_runs,
                                 reallocate=c.methods.reallocate,
                                 exploration=a, run_batch_size=c.methods.run_batch_size or None)
    err = best_arm.error_indicator(selected, scores).astype(np.uint8)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, err)
    return err


def _paired(err_a: np.ndarray, err_b: np.ndarray) -> tuple[float, float]:
    """Mean over budgets and runs of a - b, and its standard error over (independent) runs."""
    d = err_a.mean(axis=0) - err_b.mean(axis=0)  # per-run average over budgets
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan")


def _budget_at(budgets, err, level: float) -> float:
    """The budget at which the error curve first falls to `level` (linear interpolation); nan if never."""
    b, e = np.asarray(budgets, np.float64), np.asarray(err, np.float64)
    below = np.nonzero(e <= level)[0]
    if below.size == 0:
        return float("nan")
    i = int(below[0])
    if i == 0:
        return float(b[0])
    t = (e[i - 1] - level) / (e[i - 1] - e[i])
    return float(b[i - 1] + t * (b[i] - b[i - 1]))


def _label_s(s: float) -> str:
    return "inf" if math.isinf(s) else f"{s:g}"


def sweep(c: Config, fr: np.ndarray, budgets: tuple[int, ...], workdir: pathlib.Path) -> tuple[dict, dict]:
    """Every method at every budget on the benchmark of every noise scale: per-scale errors, curves,
    confidence budgets, paired SR - SySRs differences and hardness; and seconds per method."""
    k_arms = c.bench.num_models
    bench_key = jax.random.fold_in(jax.random.key(c.seed), 0)  # same draws at every noise scale
    tasks = [(s, m) for s in c.bench.noise_scales for m in _methods(c, s in c.methods.ucb_noise_scales)]
    bar = tqdm.tqdm(total=len(tasks), desc="sysr", disable=not c.progress)
    per_scale, timings = {}, {}
    for s in c.bench.noise_scales:
        bench = best_arm.synthetic_benchmark(bench_key, num_models=k_arms, num_prompts=c.bench.num_prompts,
                                             noise_scale=s,
                                             best_accuracy=c.bench.best_accuracy, worst_accuracy=c.bench.worst_accuracy,
                                             exact_pool_means=c.bench.exact_pool_means)
        scores = np.asarray(bench.scores)
        means = np.sort(scores.mean(axis=1))[::-1]
        h_sr, h_sy = best_arm.hardness_sr(scores), best_arm.hardness_sysr(scores)
        errs = {}
        for label, method, a in _methods(c, s in c.methods.ucb_noise_scales):
            t0 = time.time()
            errs[label] = _errors(c, scores, s, method, a, budgets, workdir)
            timings.setdefault(label, 0.0)
            timings[label] += time.time() - t0
            bar.update(1)
        curves = {lab: e.mean(axis=1) for lab, e in errs.items()}
        mean_err = {lab: float(e.mean()) for lab, e in errs.items()}
        cb = {lab: {f"{t:g}": best_arm.confidence_budget(fr, 1.0 - curves[lab], t) for t in c.eval.taus}
              for lab in errs}
        diff, se = _paired(errs["SR"], errs["SySRs"])
        level = c.eval.speedup_error
        n_sr, n_sy = _budget_at(budgets, curves["SR"], level), _budget_at(budgets, curves["SySRs"], level)
        lb = best_arm.logbar(k_arms)
        per_scale[s] = {
            "errs": errs, "curves": curves, "mean_error": mean_err, "confidence_budget": cb,
            "sr_minus_sysr": diff, "sr_minus_sysr_se": se,
            "saving": diff / mean_err["SR"] if mean_err["SR"] > 0 else 0.0,
            "top_means": means[:3].tolist(), "hardness_sr": h_sr, "hardness_sysr": h_sy,
            "predicted_speedup": h_sr / h_sy, "observed_speedup": n_sr / n_sy,
            "x_sr": (np.array(budgets) - k_arms) / (lb * h_sr), "x_sysr": (np.array(budgets) - k_arms) / (lb * h_sy),
            "bound_sysr": best_arm.error_bound(np.array(budgets), k_arms, h_sy),
        }
    bar.close()
    return per_scale, timings


def comparison_study(c: Config, per_scale: dict, fr: np.ndarray, workdir: pathlib.Path) -> Study:
    """SySRs against every baseline on the UCB benchmark(s): average error over budgets (no baseline
    significantly below SySRs: paired z > -2) and worst-case confidence budget CB(tau) (the lowest)."""
    finite = [s for s in c.bench.noise_scales if not math.isinf(s)]
    ucb_scales = list(c.methods.ucb_noise_scales)
    labels = list(per_scale[ucb_scales[0]]["errs"]) if ucb_scales else ["SySRs", "SR", "Naive (shared uniform)",
                                                                         "Uniform"]
    comp_scales = ucb_scales or finite
    avg_err = {lab: float(np.mean([per_scale[s]["mean_error"][lab] for s in comp_scales])) for lab in labels}
    z_vs = {}
    for lab in labels:
        if lab == "SySRs":
            continue
        d = [_paired(per_scale[s]["errs"][lab], per_scale[s]["errs"]["SySRs"]) for s in comp_scales]
        diff = float(np.mean([x[0] for x in d]))
        se = float(math.sqrt(sum(x[1] ** 2 for x in d)) / len(d))
        z_vs[lab] = diff / se if se > 0 else (math.inf if diff > 0 else 0.0)
    best_other = min((lab for lab in labels if lab != "SySRs"), key=lambda lab: avg_err[lab])
    lowest_avg = all(z > -2.0 for z in z_vs.values())  # no baseline significantly below SySRs
    strictly_lowest = avg_err["SySRs"] <= avg_err[best_other]
    tau_cb = 0.95 if 0.95 in c.eval.taus else c.eval.taus[-1]
    worst_cb = {lab: max(per_scale[s]["confidence_budget"][lab][f"{tau_cb:g}"] for s in comp_scales) for lab in labels}
    lowest_cb = all(worst_cb["SySRs"] <= v for lab, v in worst_cb.items())
    worst_cb_by_tau = {f"{t:g}": {lab: max(per_scale[s]["confidence_budget"][lab][f"{t:g}"] for s in comp_scales)
                                  for lab in labels} for t in c.eval.taus}

    def fmt_cb(v):
        return "not reached" if math.isinf(v) else f"{v:.0%}"

    best_other_cb = min(v for lab, v in worst_cb.items() if lab != "SySRs")
    scales = ",".join(map(_label_s, comp_scales))
    checks = [
        Check(f"average error, min paired z of a baseline minus SySRs (s={scales})", min(z_vs.values()),
              "SySRs has the lowest error at every budget", "> -2 for every baseline", lowest_avg),
        Check(f"worst-case confidence budget CB({tau_cb:.0%}) of SySRs (s={scales})", fmt_cb(worst_cb["SySRs"]),
              "SySRs reaches a given accuracy with the smallest budget",
              f"<= every baseline (best other {fmt_cb(best_other_cb)})", lowest_cb),
        Check(f"average error of SySRs (s={scales})", avg_err["SySRs"], "the lowest",
              f"<= best other, {best_other} {avg_err[best_other]:.3f}", strictly_lowest, required=False,
              note=f"SR {avg_err['SR']:.3f}"),
    ]
    context = ("Confidence budgets at the other tau, SySRs vs best other: "
               + "; ".join(f"CB({float(t):.0%}) {fmt_cb(d['SySRs'])} vs "
                           f"{fmt_cb(min(v for lab, v in d.items() if lab != 'SySRs'))}"
                           for t, d in worst_cb_by_tau.items() if float(t) != tau_cb))
    metrics = {
        "average_error": avg_err,
        "paired_z_baseline_minus_sysr": z_vs,
        "worst_case_confidence_budget": {lab: (None if math.isinf(v) else v) for lab, v in worst_cb.items()},
        "confidence_budget_tau": tau_cb,
        "worst_case_confidence_budget_by_tau": {t: {lab: (None if math.isinf(v) else v) for lab, v in d.items()}
                                                for t, d in worst_cb_by_tau.items()},
        "sysr_lowest_average_error": strictly_lowest,
        "sysr_not_beaten_significantly": lowest_avg,
        "sysr_lowest_worst_case_cb": lowest_cb,
    }
    return Study(checks, context, metrics, [_plot_main(per_scale[c.bench.main_noise_scale], fr, c, workdir)])


def similarity_study(c: Config, per_scale: dict, fr: np.ndarray, workdir: pathlib.Path) -> Study:
    """The SySRs-over-SR saving against similarity: significant at the most similar scale (paired z > 3),
    non-increasing in s within 2 standard errors, and vanishing for independent models (|z| < 3 at s = inf);
    observed against hardness-predicted speed-ups."""
    finite = [s for s in c.bench.noise_scales if not math.isinf(s)]
    savings = [per_scale[s]["saving"] for s in sorted(finite)]
    slack = [2.0 * per_scale[s]["sr_minus_sysr_se"] / max(per_scale[s]["mean_error"]["SR"], 1e-9)
             for s in sorted(finite)]
    z_small = (per_scale[min(finite)]["sr_minus_sysr"] / per_scale[min(finite)]["sr_minus_sysr_se"]
               if finite and per_scale[min(finite)]["sr_minus_sysr_se"] > 0 else 0.0)
    significant = bool(finite) and z_small > 3.0
    monotone = all(savings[i] >= savings[i + 1] - slack[i] - slack[i + 1] for i in range(len(savings) - 1))
    gap_grows = significant and monotone
    indep = per_scale.get(INF)
    indep_z = indep["sr_minus_sysr"] / indep["sr_minus_sysr_se"] if indep and indep["sr_minus_sysr_se"] > 0 else 0.0
    vanishes = indep is None or abs(indep_z) < 3.0

    gap_txt = ", ".join(f"s={_label_s(s)}: {per_scale[s]['saving']:+.0%}" for s in c.bench.noise_scales)
    speed_txt = ", ".join(f"s={_label_s(s)}: {per_scale[s]['observed_speedup']:.2f}x" for s in c.bench.noise_scales)
    pred_txt = ", ".join(f"{per_scale[s]['predicted_speedup']:.2f}x" for s in c.bench.noise_scales)
    checks = [
        Check("gap grows with similarity: paired z of SR - SySRs error at the most similar s",
              z_small, "SySRs beats SR when models are alike", "> 3",
              significant, note=f"s={_label_s(min(finite))}" if finite else "no finite noise scale"),
        Check("gap grows with similarity: error saved vs SR, by s", gap_txt, "the saving grows with similarity",
              "non-increasing in s within 2 SE", monotone),
        Check("gap vanishes for independent models: paired z at s=inf",
              indep_z if indep is not None else "no s=inf benchmark", "no gain for independent models",
              "|z| < 3", vanishes),
    ]
    context = (f"Budget to reach {c.eval.speedup_error:.0%} error, SR/SySRs: {speed_txt} "
               f"(H_2/H_SySRs predicts {pred_txt})")
    metrics = {"gap_grows_with_similarity": gap_grows, "independent_paired_z": indep_z,
               "gap_vanishes_independent": vanishes}
    plots = [_plot_similarity(per_scale, fr, c, workdir), _plot_hardness(per_scale, c, workdir)]
    return Study(checks, context, metrics, plots)


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    def r(x):
        return f"{x:.3f}".removeprefix("0")

    def fmt(v):
        return "not reached" if v is None else f"{v:.0%}"

    err = metrics["average_error"]
    others = {lab: v for lab, v in err.items() if lab != "SySRs"}
    best = min(others, key=others.get)
    per = metrics["per_noise_scale"]
    comp = [s for s, v in per.items() if set(err) <= set(v["mean_error"])]
    out = (f"avg error SySRs {r(err['SySRs'])} vs SR {r(err['SR'])}"
           + (f", best other {best} {r(others[best])}" if best != "SR" else "")
           + (f" (s={comp[0]})" if len(comp) == 1 else ""))
    sav = [v["saving_vs_sr"] for v in per.values()]
    out += (f"; saves {sav[0]:.0%}->{sav[-1]:.0%} of SR's error from s={next(iter(per))} to s={list(per)[-1]}")
    cb = metrics["worst_case_confidence_budget"]
    best_cb = [v for lab, v in cb.items() if lab != "SySRs" and v is not None]
    out += (f"; worst-case CB({metrics['confidence_budget_tau']:.0%}) SySRs {fmt(cb['SySRs'])} vs best other "
            f"{fmt(min(best_cb) if best_cb else None)}")
    return out


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    fr, budgets = _grid(c)
    per_scale, timings = sweep(c, fr, budgets, workdir)
    comparison = comparison_study(c, per_scale, fr, workdir)
    similarity = similarity_study(c, per_scale, fr, workdir)
    checks = similarity.checks + comparison.checks
    verdict, reproduced = checks_lib.verdict(
        checks, claim="SySRs identifies the best model with fewer evaluations than Successive Rejects when the "
        "models are alike (the saving grows with similarity and vanishes for independent models), and has the "
        "lowest error and confidence budget among the baselines",
        context=(f"K={c.bench.num_models} models, N={c.bench.num_prompts} prompts, budgets {fr[0]:.0%}-{fr[-1]:.0%} of the grid, "
                 f"{c.methods.num_runs} runs. {comparison.context}. {similarity.context}"))
    metrics = {
        "budget_fractions": fr.tolist(),
        "budgets": list(budgets),
        **comparison.metrics,
        **similarity.metrics,
        "seconds_per_method": timings,
        "per_noise_scale": {
            _label_s(s): {
                "top_pool_means": v["top_means"],
                "mean_error": v["mean_error"],
                "error_curves": {lab: cur.tolist() for lab, cur in v["curves"].items()},
                "confidence_budget": {lab: {t: (None if math.isinf(x) else x) for t, x in d.items()}
                                      for lab, d in v["confidence_budget"].items()},
                "sr_minus_sysr_mean_error": v["sr_minus_sysr"],
                "sr_minus_sysr_se": v["sr_minus_sysr_se"],
                "saving_vs_sr": v["saving"],
                "hardness_sr": v["hardness_sr"],
                "hardness_sysr": v["hardness_sysr"],
                "predicted_speedup_H2_over_HSySRs": v["predicted_speedup"],
                "predicted_gain_vs_independent_HSySRs_inf_over_s": (
                    per_scale[INF]["hardness_sysr"] / v["hardness_sysr"] if INF in per_scale else None),
                "observed_speedup_budget_ratio_at_speedup_error": v["observed_speedup"],
                "min_bound_sysr": float(np.min(v["bound_sysr"])),
            } for s, v in per_scale.items()},
        "checks": [ch.as_dict() for ch in checks],
    }
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced,
            "plots": comparison.plots + similarity.plots}


# ----------------------------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------------------------

def _plot_main(main, fr, c: Config, workdir: pathlib.Path) -> str:
    fig, ax = plotting.subplots(figsize=(7.5, 4.2))
    for lab, cur in main["curves"].items():
        style = {"SySRs": dict(color="k", lw=2.2), "SR": dict(color="tab:red", lw=1.8)}.get(lab, dict(lw=1, alpha=0.8))
        ls = "--" if lab.startswith("Smart") else ("-." if lab.startswith("UCB") else "-")
        ax.plot(100 * fr, cur, ls=ls, label=lab, **style)
    ax.set(xlabel="budget (% of the model x prompt grid)", ylabel="P(error)",
           title=f"error vs budget, s={_label_s(c.bench.main_noise_scale)} ({c.methods.num_runs} runs)")
    ax.legend(fontsize=7, ncol=2)
    return report.savefig(fig, workdir / "error_vs_budget.png")


def _plot_similarity(per_scale, fr, c: Config, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.8))
    colors = plotting.colormap("viridis")(np.linspace(0, 0.9, len(per_scale)))
    for col, (s, v) in zip(colors, per_scale.items()):
        ax1.plot(100 * fr, v["curves"]["SySRs"], color=col, lw=2, label=f"SySRs s={_label_s(s)}")
        ax1.plot(100 * fr, v["curves"]["SR"], color=col, lw=1, ls="--")
    ax1.set(xlabel="budget (% of grid)", ylabel="P(error)", title="SySRs (solid) vs SR (dashed)")
    ax1.legend(fontsize=7)
    xs = np.arange(len(per_scale))
    sav = [v["saving"] for v in per_scale.values()]
    err = [2 * v["sr_minus_sysr_se"] / max(v["mean_error"]["SR"], 1e-9) for v in per_scale.values()]
    ax2.bar(xs, sav, yerr=err, color=colors)
    ax2.set_xticks(xs, [_label_s(s) for s in per_scale])
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set(xlabel="noise scale s (inf = independent models)", ylabel="(err_SR - err_SySRs) / err_SR",
            title="average error saved by synchronization")
    return report.savefig(fig, workdir / "gap_vs_similarity.png")


def _plot_hardness(per_scale, c: Config, workdir: pathlib.Path) -> str:
    fig, ax = plotting.subplots(figsize=(7, 4.2))
    colors = plotting.colormap("viridis")(np.linspace(0, 0.9, len(per_scale)))
    floor = 0.5 / c.methods.num_runs
    xmax = 0.0
    for col, (s, v) in zip(colors, per_scale.items()):
        ax.plot(v["x_sysr"], np.maximum(v["curves"]["SySRs"], floor), color=col, lw=2, label=f"SySRs s={_label_s(s)}")
        ax.plot(v["x_sr"], np.maximum(v["curves"]["SR"], floor), color=col, lw=1, ls="--")
        xmax = max(xmax, float(np.max(v["x_sysr"])), float(np.max(v["x_sr"])))
    x = np.linspace(0, xmax, 50)
    k = c.bench.num_models
    ax.plot(x, np.minimum(1.0, k * (k - 1) / 2 * np.exp(-x)), color="gray", ls=":", label="bound K(K-1)/2 e^-x")
    ax.set(yscale="log", xlabel="(n - K) / (logbar(K) H)   [H = H_SySRs solid, H_2 dashed]",
           ylabel="P(error) (floored at 0.5/runs)", title="empirical error vs hardness-normalised budget")
    ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "error_vs_hardness.png")


EXPERIMENT = registry.Experiment(
    slug="sysr",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            bench=BenchSection(num_models=6, num_prompts=120, noise_scales=(0.5, INF), main_noise_scale=0.5),
            budget=BudgetSection(min=0.05, max=0.5, step=0.15),
            methods=MethodsSection(num_runs=100, explorations=(1.0,), ucb_noise_scales=(0.5,)), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(
            bench=BenchSection(num_models=50, num_prompts=3000), budget=BudgetSection(min=0.01, max=1.0, step=0.01),
            methods=MethodsSection(ucb_noise_scales=(0.25, 0.5, 1.0, 2.0, INF))),
    },
    run=run,
)
