"""Allocating variance to maximize the expected supremum of Gaussians (Paes Leme et al., arXiv:2502.18463).

Choose sigma >= 0 with sum sigma^2 = 1 to maximize F(sigma) = E[sum_j max_{i in S_j} X_i],
X_i ~ N(mu_i, sigma_i^2). The paper is theory (a PTAS for one set, an O(log n)-approximation for many
sets, structure theorems); this experiment checks each piece numerically at small scale:

* anchors: the quadrature against the spec's uniform-allocation tables (to 1e-6) and Monte Carlo,
  and the zero-mean single-set optimum for n = 4, 5, 6, 8, 12 (0.514688, 0.522878, 0.524033,
  0.524445, 0.524471: about four equal large variances, not uniform) by brute force and by the
  heuristic; the correlated n = 2 values (independent split 0.398942, anti-correlated 1/sqrt(pi));
* Algorithm 1 (additive PTAS, m = 1): OPT - ALG <= eps against the brute-force optimum on random
  mu >= 0 instances, with its runtime (number of enumerated allocations) in n and eps (OPT is the
  brute-force reference alone; it is tested against exhaustive enumeration and reaches the n = 6
  anchor 0.524033 since its polish starts include jittered and random asymmetric points);
* Algorithm 3 (greedy over variance levels 4^-k, m > 1, mu = 0): greedy >= (1 - 1/e) x the exhaustive
  best set at every level, and ALG / OPT_ref (heuristic + brute force) against the O(log n) guarantee;
* Fig. 1 analogue: per-set optimum OPT/m against p = k/n for the family of all k-subsets of n = 8
  (independent, positively and negatively correlated pairs; mu = 0 and 0.5): concave in p (Thm 1.5);
* Fig. 2 analogue: the participation ratio (sum sigma^2)^2 / sum sigma^4 of the optimum falls as p
  grows, for all k-subsets and random hypergraphs (each variable in each set with probability p), and
  the number of variables with variance >= p/4 is compared with 1/p (Thm 1.6).

OPT for many sets and for correlated structures comes from the heuristic (projected gradient ascent
with restarts and polishing, validated against brute force on small instances here).

Recipe:
    python -m experiments run gaussian_sup --preset smoke   # seconds, used by the tests
    python -m experiments run gaussian_sup --preset quick   # 2 CPU cores, a few minutes
    python -m experiments run gaussian_sup --preset paper   # larger n, more restarts and instances
    python -m experiments run gaussian_sup --preset smoke --ptas.eps 0.9 0.5   # one field of a config section

Config sections (`run gaussian_sup --help` lists every field): anchors, ptas, brute, greedy, families,
hypergraphs, heuristic.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath

from algorithms.optimization import gaussian_sup as vs
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments.checks import Check
from primitives import gaussian_sup as gs

# Spec section 1 (b): numerical anchors (zero means, one set).
NO_FLOOR = (0.0, .398942, .488603, .514688, .520094, .517335, .511075, .503319)
WITH_FLOOR = (.398942, .481566, .512772, .522878, .523108, .518505, .511547, .503514)
OPTIMUM = {4: 0.514688, 5: 0.522878, 6: 0.524033, 8: 0.524445, 12: 0.524471}
CORR_N2 = {"independent": 0.398942, "anti-correlated": 0.564190}
# Why the random-hypergraph concentration check can fail at this size (issue 33): Thm 1.6 (spec section 1 (b),
# "w.h.p. only Theta(1/p) variables receive variance Omega(p) (p = |S_j|/n)", p fixed as n, m -> inf) is an
# asymptotic count; the check compares participation ratios at the smallest and largest p on one instance
# per p with n = er_n (12 in quick), where 1/p is not small against n and one set already spreads over ~4.
_HYPER_CAUSE = ("Cause (concentration, random hypergraphs): scale limit - Thm 1.6 bounds the number of variables "
                "with variance Omega(p) by Theta(1/p) as n, m grow with p fixed; one instance per p at n = {n} "
                "cannot show that trend (it needs n >= 64, m about n^2, several instances).")


STRUCTURES = ("independent", "positive", "negative")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnchorsSection:
    """The spec's numerical anchors: zero-mean single-set optima and the Monte-Carlo cross-check
    (``--anchors.sizes 4 6``)."""

    sizes: tuple[int, ...] = (4, 5, 6, 8, 12)  # heuristic optimum, zero means, one set
    brute_sizes: tuple[int, ...] = (4, 5, 6)  # brute-force optimum
    tol: float = 1e-5  # allowed |ours - spec| for the optima (spec quotes 6 decimals)
    mc_samples: int = 200_000  # 0 skips the Monte-Carlo cross-check


@dataclasses.dataclass(frozen=True, kw_only=True)
class PtasSection:
    """Algorithm 1 (additive PTAS, one set) against brute force (``--ptas.eps 0.9 0.5``)."""

    sizes: tuple[int, ...] = (3, 4)
    eps: tuple[float, ...] = (0.9, 0.8, 0.7, 0.6)
    instances: int = 2  # random mu ~ U[0, mu_max]^n per n
    mu_max: float = 0.6
    heuristic_check_sets: int = 2  # random multi-set instances (n = 5) for the heuristic vs brute force


@dataclasses.dataclass(frozen=True, kw_only=True)
class BruteSection:
    """The brute-force reference optimum (``--brute.points 8000``)."""

    points: int = 4000
    polish: int = 6  # best grid points polished by SLSQP (plus the best of every support size)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GreedySection:
    """Algorithm 3 (greedy over variance levels, many sets) (``--greedy.instances 10``)."""

    n: int = 8
    instances: int = 4
    num_sets: int = 12
    set_prob: float = 0.35
    scaling_sizes: tuple[int, ...] = (16,)  # ALG / heuristic OPT on larger random hypergraphs


@dataclasses.dataclass(frozen=True, kw_only=True)
class FamiliesSection:
    """Fig. 1 / Fig. 2 analogues on all k-subsets of n variables (``--families.mus 0 0.5``)."""

    n: int = 8
    mus: tuple[float, ...] = (0.0,)
    structures: tuple[str, ...] = STRUCTURES
    concavity_tol: float = 1e-4  # second differences of OPT/m in p must be <= this


@dataclasses.dataclass(frozen=True, kw_only=True)
class HypergraphsSection:
    """Fig. 2 analogue on random hypergraphs, each variable in each set with probability p
    (``--hypergraphs.probs 0.125 1``)."""

    n: int = 12
    num_sets: int = 16
    probs: tuple[float, ...] = (0.125, 0.5, 1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeuristicSection:
    """The projected-gradient heuristic optimum (``--heuristic.restarts 16``); enabled=False: every reference
    optimum by brute force, correlated structures not allowed (tiny n only)."""

    enabled: bool = True
    restarts: int = 6
    steps: int = 80
    polish_steps: int = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """gaussian_sup settings, in sections overridden on the command line as ``--greedy.n 6``."""

    anchors: AnchorsSection = AnchorsSection()
    ptas: PtasSection = PtasSection()
    brute: BruteSection = BruteSection()
    greedy: GreedySection = GreedySection()
    families: FamiliesSection = FamiliesSection()
    hypergraphs: HypergraphsSection = HypergraphsSection()
    heuristic: HeuristicSection = HeuristicSection()
    seed: int = 0

    def __post_init__(self):
        err, fam, hyper = registry.ConfigError, self.families, self.hypergraphs
        bad = [s for s in fam.structures if s not in STRUCTURES]
        if bad or not fam.structures:
            raise err("families.structures", f"must be a non-empty subset of {STRUCTURES}; got {fam.structures}")
        if not self.heuristic.enabled and fam.structures != ("independent",):
            raise err("families.structures", f"must be ('independent',) when heuristic.enabled is False (the "
                                             f"correlated structures need the heuristic); got {fam.structures}")
        if fam.n < 3:
            raise err("families.n", f"must be >= 3 (second differences of OPT/m over k = 1..n); got {fam.n}")
        if len(hyper.probs) < 2 or not all(0 < q <= 1 for q in hyper.probs):
            raise err("hypergraphs.probs", f"must hold >= 2 probabilities in (0, 1] (the smallest p is compared "
                                           f"with the largest); got {hyper.probs}")
        if not 0 < self.greedy.set_prob <= 1:
            raise err("greedy.set_prob", f"must be in (0, 1]; got {self.greedy.set_prob}")


def _heuristic(c: Config, key, mu, sets=None, structure: str = "independent"):
    if not c.heuristic.enabled:
        if structure != "independent":
            raise ValueError(f"structure {structure!r} needs heuristic.enabled=True")
        return vs.brute_force_optimum(mu, sets, max_points=c.brute.points, num_polish=c.brute.polish)
    kw = {}
    if structure != "independent":
        groups, signs, g = vs.pair_blocks(mu.shape[0], negative=structure == "negative")
        kw = dict(groups=groups, signs=signs, num_groups=g)
    return vs.projected_gradient_ascent(key, mu, sets, num_restarts=c.heuristic.restarts, num_steps=c.heuristic.steps,
                                        polish_steps=c.heuristic.polish_steps, **kw)


def _random_sets(rng, num_sets: int, n: int, prob: float) -> np.ndarray:
    sets = rng.random((num_sets, n)) < prob
    sets[np.arange(num_sets), rng.integers(0, n, num_sets)] = True  # non-empty
    return sets


def _anchors(c: Config, key) -> dict:
    table_err = 0.0
    for k in range(1, 9):
        s = np.ones(k) / math.sqrt(k)
        table_err = max(table_err, abs(gs.expected_sum_of_max_f64(np.zeros(k), s) - NO_FLOOR[k - 1]),
                        abs(gs.expected_sum_of_max_f64(np.zeros(k + 1), np.r_[s, 0.0]) - WITH_FLOOR[k - 1]))
    rng = np.random.default_rng(c.seed)
    mu = rng.normal(size=6)
    sigma = np.abs(rng.normal(size=6)) * (rng.random(6) < 0.7)
    sets = _random_sets(rng, 4, 6, 0.5)
    exact = float(gs.expected_sum_of_max_f64(mu, sigma, sets))
    if c.anchors.mc_samples:
        est = gs.expected_max_mc(jax.random.fold_in(key, 1), mu, sigma, sets, num_samples=c.anchors.mc_samples)
        mc_mean, mc_se = float(est.mean), float(est.stderr)
    else:
        mc_mean, mc_se = exact, 1.0
    mc_z = (mc_mean - exact) / mc_se
    heur, brute = {}, {}
    for n in c.anchors.sizes:
        r = _heuristic(c, jax.random.fold_in(key, 100 + n), np.zeros(n))
        heur[n] = {"value": r.value, "variances": np.sort(r.sigma ** 2)[::-1].round(5).tolist()}
    for n in c.anchors.brute_sizes:
        b = vs.brute_force_optimum(np.zeros(n), max_points=c.brute.points, num_polish=c.brute.polish)
        brute[n] = {"value": b.value, "variances": np.sort(b.sigma ** 2)[::-1].round(5).tolist()}
    half = np.full(2, math.sqrt(0.5))
    corr = {"independent": float(gs.expected_max(np.zeros(2), half)),
            "anti-correlated": float(gs.expected_max(np.zeros(2), half, groups=np.array([0, 0]),
                                                     signs=np.array([1, -1]), num_groups=1))}
    if c.heuristic.enabled:
        r2 = _heuristic(c, jax.random.fold_in(key, 2), np.zeros(2), structure="negative")
        corr["anti-correlated heuristic optimum"] = r2.value
    opt_err = {n: abs(v["value"] - OPTIMUM[n]) for n, v in {**heur, **brute}.items() if n in OPTIMUM}
    opt_err_max = max([abs(heur[n]["value"] - OPTIMUM[n]) for n in heur if n in OPTIMUM]
                      + [abs(brute[n]["value"] - OPTIMUM[n]) for n in brute if n in OPTIMUM] + [0.0])
    corr_err = max(abs(corr[k] - v) for k, v in CORR_N2.items())
    return {"table_max_abs_error": table_err, "mc_z": mc_z, "mc_exact": exact, "mc_mean": mc_mean,
            "mc_stderr": mc_se, "heuristic_optimum": heur, "brute_force_optimum": brute,
            "optimum_max_abs_error": opt_err_max, "per_n_error": opt_err, "correlated_n2": corr,
            "correlated_max_abs_error": corr_err,
            "ok": table_err <= 1e-6 and abs(mc_z) < 4 and opt_err_max <= c.anchors.tol and corr_err <= 1e-5}


def _ptas(c: Config, key) -> dict:
    rng = np.random.default_rng(c.seed + 1)
    rows, heur_gaps = [], []
    for n in c.ptas.sizes:
        for inst in range(c.ptas.instances):
            mu = rng.uniform(0.0, c.ptas.mu_max, size=n)
            ref = vs.brute_force_optimum(mu, max_points=c.brute.points, num_polish=c.brute.polish)
            h = _heuristic(c, jax.random.fold_in(key, 1000 * n + inst), mu) if c.heuristic.enabled else ref
            heur_gaps.append(ref.value - h.value)
            # OPT is the brute-force reference alone: max(ref, heuristic) would hide a reference that
            # misses the optimum (as the symmetric-only polish starts did at n = 6); a heuristic above
            # the reference shows up as a negative shortfall (`heuristic_max_excess_over_brute`).
            opt = ref.value
            for eps in c.ptas.eps:
                t0 = time.perf_counter()
                res = vs.ptas_single_set(mu, eps)
                rows.append({"n": n, "instance": inst, "eps": eps, "opt": opt, "alg": res.value,
                             "gap": opt - res.value, "support": len(res.support),
                             "candidates": res.num_candidates, "seconds": time.perf_counter() - t0})
    for i in range(c.ptas.heuristic_check_sets):
        sets = _random_sets(rng, 3, 5, 0.5)
        mu = np.zeros(5) if i % 2 == 0 else rng.uniform(0.0, c.ptas.mu_max, 5)
        ref = vs.brute_force_optimum(mu, sets, max_points=c.brute.points, num_polish=c.brute.polish)
        h = _heuristic(c, jax.random.fold_in(key, 5000 + i), mu, sets) if c.heuristic.enabled else ref
        heur_gaps.append(ref.value - h.value)
    within = all(r["gap"] <= r["eps"] for r in rows)
    by_eps = {f"{e:g}": max(r["gap"] for r in rows if r["eps"] == e) for e in c.ptas.eps}
    cost = {f"n={n},eps={e:g}": max(r["candidates"] for r in rows if r["n"] == n and r["eps"] == e)
            for n in c.ptas.sizes for e in c.ptas.eps}
    return {"rows": rows, "within_eps": within, "max_gap_by_eps": by_eps, "candidates": cost,
            "heuristic_max_shortfall_vs_brute": float(max(heur_gaps)),
            "heuristic_max_excess_over_brute": float(max(0.0, -min(heur_gaps))),
            "num_instances": len(c.ptas.sizes) * c.ptas.instances}


def _greedy(c: Config, key) -> dict:
    rng = np.random.default_rng(c.seed + 2)
    n = c.greedy.n
    level_ratios, alg_ratios = [], []
    for inst in range(c.greedy.instances):
        sets = _random_sets(rng, c.greedy.num_sets, n, c.greedy.set_prob)
        res = vs.greedy_variance_levels(np.zeros(n), sets)
        for lv in res.levels:
            best, _ = vs.exhaustive_level(np.zeros(n), sets, lv.level, min(4 ** lv.level, n))
            level_ratios.append(lv.value / best)
        h = _heuristic(c, jax.random.fold_in(key, 7000 + inst), np.zeros(n), sets)
        alg_ratios.append(res.value / max(h.value, res.value))
    scaling = {}
    for m_n in c.greedy.scaling_sizes:
        sets = _random_sets(rng, 2 * m_n, m_n, 4.0 / m_n)
        t0 = time.perf_counter()
        res = vs.greedy_variance_levels(np.zeros(m_n), sets)
        t_alg = time.perf_counter() - t0
        h = _heuristic(c, jax.random.fold_in(key, 9000 + m_n), np.zeros(m_n), sets)
        scaling[m_n] = {"alg": res.value, "heuristic": h.value, "ratio": res.value / max(h.value, res.value),
                        "level": res.level, "alg_seconds": t_alg,
                        "bound": 1.0 / (2 * (math.floor(math.log2(m_n)) + 1))}
    bound = 1.0 / (2 * (math.floor(math.log2(n)) + 1))
    return {"min_level_ratio": float(min(level_ratios)), "level_ratios": level_ratios,
            "alg_over_opt": alg_ratios, "min_alg_over_opt": float(min(alg_ratios)), "log_bound": bound,
            "scaling": scaling,
            "ok": min(level_ratios) >= 1 - 1 / math.e - 1e-12 and min(alg_ratios) >= bound
            and all(v["ratio"] >= v["bound"] for v in scaling.values())}


def _families(c: Config, key) -> dict:
    n = c.families.n
    out = {}
    for mu0 in c.families.mus:
        for st in c.families.structures:
            per_set, pr = [], []
            for k in range(1, n + 1):
                sets = vs.all_k_subsets(n, k)
                r = _heuristic(c, jax.random.fold_in(key, 11000 + 100 * k + int(10 * mu0)), np.full(n, mu0), sets, st)
                per_set.append(r.value / sets.shape[0])
                pr.append(float(gs.participation_ratio(r.sigma)))
            d2 = np.diff(per_set, 2)
            out[f"mu={mu0:g},{st}"] = {"per_set_opt": per_set, "participation_ratio": pr,
                                       "max_second_difference": float(d2.max()),
                                       "concave": bool(d2.max() <= c.families.concavity_tol)}
    return out


def _random_hypergraphs(c: Config, key) -> dict:
    rng = np.random.default_rng(c.seed + 3)
    n = c.hypergraphs.n
    rows = []
    for p in c.hypergraphs.probs:
        sets = _random_sets(rng, c.hypergraphs.num_sets, n, p)
        r = _heuristic(c, jax.random.fold_in(key, 13000 + int(1000 * p)), np.zeros(n), sets)
        v = r.sigma ** 2
        rows.append({"p": p, "participation_ratio": float(gs.participation_ratio(r.sigma)),
                     "num_variance_ge_p_over_4": int(np.sum(v >= p / 4)), "one_over_p": 1 / p,
                     "value_per_set": r.value / c.hypergraphs.num_sets})
    return {"rows": rows}


CLAIM = ("the quadrature and optima match the spec's anchors, Algorithm 1 is within eps of OPT, Algorithm 3 meets "
         "its greedy and O(log n) bounds, the per-set optimum is concave in p and the optimum concentrates as p "
         "grows")


def _checks(c: Config, anchors: dict, ptas: dict, greedy: dict, fam: dict, hyper: dict) -> list[Check]:
    """The claim checks, with the thresholds fixed before the run (anchors and greedy split into their parts)."""
    greedy_bound = 1 - 1 / math.e
    indep = {k: v for k, v in fam.items() if k.endswith("independent")}
    # Concentration: participation ratio at p = 1 below the one at p = 2/n (k = 1 carries no signal).
    conc = {k: (v["participation_ratio"][1], v["participation_ratio"][-1]) for k, v in indep.items()}
    hr = hyper["rows"]
    alg_ratios = [greedy["min_alg_over_opt"]] + [v["ratio"] for v in greedy["scaling"].values()]
    alg_ok = (greedy["min_alg_over_opt"] >= greedy["log_bound"]
              and all(v["ratio"] >= v["bound"] for v in greedy["scaling"].values()))
    return [
        Check("quadrature vs the spec's uniform-allocation tables, max |err|", anchors["table_max_abs_error"],
              "tables (6 decimals)", "<= 1e-6", anchors["table_max_abs_error"] <= 1e-6),
        Check("quadrature vs Monte Carlo, z", anchors["mc_z"], "E[sum max] (exact)", "|z| < 4",
              abs(anchors["mc_z"]) < 4, note="Monte Carlo skipped" if not c.anchors.mc_samples else ""),
        Check("single-set optimum vs spec (heuristic and brute force), max |err|", anchors["optimum_max_abs_error"],
              ", ".join(f"n={n}: {v}" for n, v in OPTIMUM.items()), f"<= {c.anchors.tol:g}",
              anchors["optimum_max_abs_error"] <= c.anchors.tol),
        Check("n=2 correlated values, max |err|", anchors["correlated_max_abs_error"],
              "independent .398942, anti-correlated .564190", "<= 1e-5", anchors["correlated_max_abs_error"] <= 1e-5),
        Check("Algorithm 1 (PTAS): max OPT - ALG by eps",
              ", ".join(f"eps {e}: {g:.3f}" for e, g in ptas["max_gap_by_eps"].items()),
              "additive PTAS: OPT - ALG <= eps", "<= eps on every instance", ptas["within_eps"],
              note=f"{ptas['num_instances']} random mu >= 0 instances, n={','.join(map(str, c.ptas.sizes))}"),
        Check("Algorithm 3: greedy / exhaustive best set, min over levels", greedy["min_level_ratio"],
              "greedy >= (1 - 1/e) x the best set per level", f">= {greedy_bound:.3f}",
              greedy["min_level_ratio"] >= greedy_bound - 1e-12),
        Check("Algorithm 3: ALG / OPT, min", min(alg_ratios), "O(log n)-approximation",
              f">= 1/(2(log2 n + 1)) ({greedy['log_bound']:.3f} at n={c.greedy.n})", alg_ok),
        Check("per-set OPT/m concave in p (independent), max second difference",
              max(v["max_second_difference"] for v in indep.values()), "concave in p (Thm 1.5)",
              f"<= {c.families.concavity_tol:g}", all(v["concave"] for v in indep.values())),
        Check("concentration (k-subsets): participation ratio at p=1 vs p=2/n",
              "; ".join(f"{k}: {a:.2f}->{b:.2f}" for k, (a, b) in conc.items()),
              "only Theta(1/p) variables get variance Omega(p) (Thm 1.6)", "falls",
              all(last < first for first, last in conc.values())),
        Check("concentration (random hypergraphs): participation ratio, smallest vs largest p",
              f"{hr[0]['participation_ratio']:.2f}->{hr[-1]['participation_ratio']:.2f}",
              "only Theta(1/p) variables get variance Omega(p) (Thm 1.6)", "falls",
              hr[-1]["participation_ratio"] < hr[0]["participation_ratio"],
              note=f"n={c.hypergraphs.n}, p={hr[0]['p']:g} vs {hr[-1]['p']:g}, one instance per p"),
    ]


def _cause(checks: list[Check], c: Config) -> str:
    """Why the failing required checks failed (empty when all pass): the diagnosed cause class per check."""
    hyper = _HYPER_CAUSE.format(n=c.hypergraphs.n).removeprefix("Cause (concentration, random hypergraphs): ")
    return "; ".join(
        "concentration (random hypergraphs): " + hyper if ch.name.startswith("concentration (random hypergraphs)")
        else f"{ch.name}: not diagnosed (bug in our code, or a heuristic OPT that misses the optimum)"
        for ch in checks if ch.required and not ch.passed)


def _cause_class(checks: list[Check]) -> str | None:
    """"scale" when random-hypergraph concentration is the only failing required check (see `_cause`); None else."""
    failing = [ch.name for ch in checks if ch.required and not ch.passed]
    return ("scale" if failing and all(n.startswith("concentration (random hypergraphs)") for n in failing)
            else None)


def _short(x: float, digits: int) -> str:
    """A number in [0, 1) without its leading zero (".524033"), as the catalog writes it."""
    return f"{x:.{digits}f}".removeprefix("0")


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    a = metrics["anchors"]
    sizes = sorted(int(n) for n in {**a["heuristic_optimum"], **a["brute_force_optimum"]})
    span = f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 1 else "".join(map(str, sizes))
    out = [f"spec optima n={span} to {metrics['optimum_max_abs_error']:.0e}" if sizes
           else f"spec tables to {metrics['table_max_abs_error']:.0e}"]
    brute = a["brute_force_optimum"]
    if brute:
        n = max(brute, key=int)
        out[-1] += f" (brute force n={n}: {_short(brute[n]['value'], 6)})"
    gaps = metrics["ptas"]["max_gap_by_eps"]
    out.append(f"PTAS OPT-ALG <={_short(max(gaps.values()), 3)}"
               + (" (<= eps everywhere)" if metrics["ptas_within_eps"] else " (NOT <= eps everywhere)"))
    alg = min([metrics["greedy_min_alg_over_opt"]] + [v["ratio"] for v in metrics["greedy"]["scaling"].values()])
    out.append(f"greedy/exhaustive {metrics['greedy_min_level_ratio']:.2f}; ALG/OPT >={_short(alg, 2)}")
    if not metrics["concentrates_random_hypergraphs"]:
        hr = metrics["random_hypergraphs"]["rows"]
        cause = (metrics.get("cause") or "").split(": ", 1)[-1].split(" - ")[0]
        out.append(f"no random-hypergraph concentration (PR {hr[0]['participation_ratio']:.2f} at p="
                   f"{hr[0]['p']:g} -> {hr[-1]['participation_ratio']:.2f} at p={hr[-1]['p']:g}"
                   + (f"; cause: {cause})" if cause else ")"))
    return "; ".join(out)


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    key = jax.random.key(c.seed)
    timings = {}
    t0 = time.perf_counter()
    anchors = _anchors(c, jax.random.fold_in(key, 0))
    timings["anchors"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ptas = _ptas(c, jax.random.fold_in(key, 1))
    timings["ptas"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    greedy = _greedy(c, jax.random.fold_in(key, 2))
    timings["greedy"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fam = _families(c, jax.random.fold_in(key, 3))
    timings["families"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hyper = _random_hypergraphs(c, jax.random.fold_in(key, 4))
    timings["hypergraphs"] = time.perf_counter() - t0

    indep = {k: v for k, v in fam.items() if k.endswith("independent")}
    concave_indep = all(v["concave"] for v in indep.values())
    # Concentration: participation ratio at p = 1 below the one at p = 2/n (k = 1 carries no signal).
    conc = {k: (v["participation_ratio"][1], v["participation_ratio"][-1]) for k, v in indep.items()}
    concentrates = all(last < first for first, last in conc.values())
    hr = hyper["rows"]
    hyper_conc = hr[-1]["participation_ratio"] < hr[0]["participation_ratio"]
    checks = _checks(c, anchors, ptas, greedy, fam, hyper)

    plots = [_plot_ptas(ptas, workdir), _plot_greedy(greedy, workdir), _plot_families(fam, c, workdir),
             _plot_concentration(fam, hyper, c, workdir)]
    opt_txt = ", ".join(f"n={n}: {anchors['heuristic_optimum'][n]['value']:.6f}" + (
        f" (spec {OPTIMUM[n]:.6f})" if n in OPTIMUM else "") for n in c.anchors.sizes)
    brute_err = max([abs(v["value"] - OPTIMUM[n]) for n, v in anchors["brute_force_optimum"].items()
                     if n in OPTIMUM] + [0.0])
    fam_txt = "; ".join(f"{k}: OPT/m {v['per_set_opt'][1]:.3f}->{v['per_set_opt'][-1]:.3f}, max d2 "
                        f"{v['max_second_difference']:+.1e}, PR {v['participation_ratio'][1]:.2f}->"
                        f"{v['participation_ratio'][-1]:.2f}" for k, v in fam.items())
    context = (
        f"Quadrature vs spec tables max error {anchors['table_max_abs_error']:.1e}, vs Monte Carlo z="
        f"{anchors['mc_z']:+.2f}; " + (f"single-set optimum (heuristic) {opt_txt}; " if opt_txt else "")
        + f"brute-force optimum max |err| vs spec {brute_err:.1e}; "
        f"n=2 correlated: independent {anchors['correlated_n2']['independent']:.6f}, anti-correlated "
        f"{anchors['correlated_n2']['anti-correlated']:.6f} (spec .398942, .564190). "
        f"Algorithm 1 on {ptas['num_instances']} random mu>=0 instances (n={','.join(map(str, c.ptas.sizes))}): "
        f"max OPT-ALG by eps " + ", ".join(f"{e}: {g:.3f}" for e, g in ptas["max_gap_by_eps"].items())
        + f" ({'all' if ptas['within_eps'] else 'NOT all'} <= eps); heuristic shortfall vs brute force "
        f"{ptas['heuristic_max_shortfall_vs_brute']:.1e}. Algorithm 3 (n={c.greedy.n}, {c.greedy.instances} random "
        f"hypergraphs): greedy/exhaustive per level min {greedy['min_level_ratio']:.3f} (>= 1-1/e=0.632), "
        f"ALG/OPT min {greedy['min_alg_over_opt']:.3f}"
        + "".join(f", n={m}: {v['ratio']:.3f}" for m, v in greedy["scaling"].items())
        + f" (O(log n) bound 1/(2(log2 n+1)) = {greedy['log_bound']:.3f} at n={c.greedy.n}). "
        f"All k-subsets of n={c.families.n}: {fam_txt}. Random hypergraphs n={c.hypergraphs.n}: PR "
        + ", ".join(f"p={r['p']:g}: {r['participation_ratio']:.2f}" for r in hr) + "."
    )
    cause_class = _cause_class(checks)
    verdict, reproduced = checks_lib.verdict(checks, claim=CLAIM, context=context, cause=_cause(checks, c),
                                             cause_class=cause_class)
    metrics = {
        "table_max_abs_error": anchors["table_max_abs_error"],
        "mc_z": anchors["mc_z"],
        "optimum_max_abs_error": anchors["optimum_max_abs_error"],
        "ptas_within_eps": ptas["within_eps"],
        "heuristic_max_shortfall_vs_brute": ptas["heuristic_max_shortfall_vs_brute"],
        "heuristic_max_excess_over_brute": ptas["heuristic_max_excess_over_brute"],
        "greedy_min_level_ratio": greedy["min_level_ratio"],
        "greedy_min_alg_over_opt": greedy["min_alg_over_opt"],
        "concave_independent": concave_indep,
        "concentrates_k_subsets": concentrates,
        "concentrates_random_hypergraphs": hyper_conc,
        "cause": None if hyper_conc else _HYPER_CAUSE.format(n=c.hypergraphs.n),
        "anchors": anchors,
        "ptas": ptas,
        "greedy": greedy,
        "families": fam,
        "random_hypergraphs": hyper,
        "seconds": timings,
        "checks": [ch.as_dict() for ch in checks],
    }
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced,
            "cause": None if reproduced else cause_class, "plots": plots}


# ----------------------------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------------------------

def _plot_ptas(ptas, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.8))
    rows = ptas["rows"]
    eps = sorted({r["eps"] for r in rows})
    for n in sorted({r["n"] for r in rows}):
        sel = [r for r in rows if r["n"] == n]
        ax1.scatter([r["eps"] for r in sel], [r["gap"] for r in sel], s=14, label=f"n={n}")
        ax2.plot(eps, [max(r["candidates"] for r in sel if r["eps"] == e) for e in eps], marker="o", label=f"n={n}")
    ax1.plot(eps, eps, "k--", lw=1, label="eps (guarantee)")
    ax1.set(xlabel="eps", ylabel="OPT - ALG", title="Algorithm 1 (PTAS) vs brute force")
    ax1.legend(fontsize=7)
    ax2.set(xlabel="eps", ylabel="allocations evaluated", yscale="log", title="Algorithm 1 cost")
    ax2.legend(fontsize=7)
    return report.savefig(fig, workdir / "ptas.png")


def _plot_greedy(greedy, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.8))
    ax1.hist(greedy["level_ratios"], bins=20, color="tab:blue")
    ax1.axvline(1 - 1 / math.e, color="k", ls="--", label="1 - 1/e")
    ax1.set(xlabel="greedy / exhaustive (same level, same size)", ylabel="count", title="Algorithm 3 levels")
    ax1.legend(fontsize=7)
    ax2.scatter(np.arange(len(greedy["alg_over_opt"])), greedy["alg_over_opt"], label="n=8 instances")
    for i, (m, v) in enumerate(greedy["scaling"].items()):
        ax2.scatter([len(greedy["alg_over_opt"]) + i], [v["ratio"]], marker="s", label=f"n={m}")
    ax2.axhline(greedy["log_bound"], color="k", ls="--", label="1/(2(log2 n + 1)), n=8")
    ax2.set(ylim=(0, 1.05), xlabel="instance", ylabel="ALG / OPT_ref", title="Algorithm 3 vs heuristic optimum")
    ax2.legend(fontsize=7)
    return report.savefig(fig, workdir / "greedy.png")


def _plot_families(fam, c: Config, workdir: pathlib.Path) -> str:
    fig, axes = plotting.subplots(1, len(c.families.mus), figsize=(5 * len(c.families.mus), 3.8), squeeze=False)
    p = np.arange(1, c.families.n + 1) / c.families.n
    for ax, mu0 in zip(axes[0], c.families.mus):
        for st in c.families.structures:
            ax.plot(p, fam[f"mu={mu0:g},{st}"]["per_set_opt"], marker="o", label=st)
        ax.set(xlabel="p = k / n", ylabel="OPT / m", title=f"all k-subsets, n={c.families.n}, mu={mu0:g}")
        ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "per_set_optimum.png")


def _plot_concentration(fam, hyper, c: Config, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.8))
    p = np.arange(1, c.families.n + 1) / c.families.n
    for key, v in fam.items():
        ax1.plot(p[1:], v["participation_ratio"][1:], marker="o", label=key)
    ax1.set(xlabel="p = k / n", ylabel="participation ratio", title=f"optimum of all k-subsets, n={c.families.n}")
    ax1.legend(fontsize=6)
    rows = hyper["rows"]
    ax2.plot([r["p"] for r in rows], [r["participation_ratio"] for r in rows], marker="o", label="participation ratio")
    ax2.plot([r["p"] for r in rows], [r["num_variance_ge_p_over_4"] for r in rows], marker="s",
             label="# variance >= p/4")
    ax2.plot([r["p"] for r in rows], [r["one_over_p"] for r in rows], "k--", label="1/p")
    ax2.set(xlabel="p (membership probability)", yscale="log", title=f"random hypergraphs, n={c.hypergraphs.n}")
    ax2.legend(fontsize=7)
    return report.savefig(fig, workdir / "concentration.png")


EXPERIMENT = registry.Experiment(
    slug="gaussian_sup",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            anchors=AnchorsSection(sizes=(), brute_sizes=(4,), mc_samples=0),
            ptas=PtasSection(sizes=(3,), eps=(0.9, 0.7), instances=1, heuristic_check_sets=1),
            brute=BruteSection(points=500, polish=2),
            greedy=GreedySection(n=5, instances=1, num_sets=6, scaling_sizes=()),
            families=FamiliesSection(n=4, mus=(0.0,), structures=("independent",)),
            hypergraphs=HypergraphsSection(n=4, num_sets=6, probs=(0.25, 1.0)),
            heuristic=HeuristicSection(enabled=False)),
        "quick": lambda: Config(),
        "paper": lambda: Config(
            anchors=AnchorsSection(sizes=(4, 5, 6, 8, 12, 16)),
            ptas=PtasSection(sizes=(3, 4, 5, 6), instances=10, eps=(0.9, 0.8, 0.7, 0.6, 0.5), heuristic_check_sets=10),
            brute=BruteSection(points=30_000),
            greedy=GreedySection(instances=30, scaling_sizes=(16, 32, 64, 128)),
            families=FamiliesSection(mus=(0.0, 0.5)),
            hypergraphs=HypergraphsSection(n=32, num_sets=64, probs=(1 / 16, 0.125, 0.25, 0.5, 0.75, 1.0)),
            heuristic=HeuristicSection(restarts=32, steps=300, polish_steps=100)),
    },
    run=run,
)
