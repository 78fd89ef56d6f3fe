"""MAFE: fairness-performance-coordination trade-offs in multi-agent multi-stage fair environments.

Paper: Lazri et al., "MAFE: Enabling Equitable Algorithm Design in Multi-Agent Multi-Stage Decision-Making
Systems" (arXiv 2502.18534). Its claim is qualitative (no numbers): the environments expose trade-offs among
fairness, task performance and coordination that single-decision fairness methods miss, and support the design
of equitable multi-agent algorithms (F-MACEM). The domain dynamics of the paper were not available; the three
simulators of `algorithms.fairness.mafe` are our own instantiations [INFER], so every number here is about
them, not about the paper's environments.

Demonstrations on the loan MAFE (spec 7 (d)), each with a check whose threshold is fixed before the run:
  (1) static fairness is not enough: the profit-only bank policy (F-MACEM, lam = 0, group-blind thresholds, no
      agency) widens the mean-score gap over the T stages: gap(T) - gap(0) > max(5 points, 3 SE).
  (2) a Pareto front: cooperative F-MACEM with growing lam lowers the fairness penalty (penalty at the largest
      lam below the lam = 0 value by > 3 SE) at a cost in return (return at the largest lam below lam = 0's).
  (3) coordination benefit: the cooperative front (bank and agency optimised jointly for the shared J) weakly
      dominates the bank-only front (bank optimised, agency spreading its budget uniformly): at every lam
      J_coop - J_bank >= -2 SE (paired over the evaluation episodes), and the mean gain over lam > 0 exceeds
      2 SE. The independent variant (each agent its own J_n, alternating) is reported beside it; J_coop >
      J_indep at the largest lam is a non-required check.
  (4) delayed impact: a demographic-parity policy fixed at t = 0 (group 1's thresholds lowered until its
      approval rate equals group 0's on one initial population, then kept) is fair at one step (|mean over
      evaluation episodes of the approval-rate difference| at stage 1 <= 0.03, required) but whether it raises the long-run score gap above the profit-only
      policy's depends on the regime; checked (not required) in the default regime and a harsh-default regime.
The healthcare and education MAFEs get a short cooperative F-MACEM run at two lam values each (penalty
at the larger lam lower: non-required checks).

Recipe:
    python -m experiments run mafe --preset smoke     # seconds (loan + education), used by the tests
    python -m experiments run mafe --preset quick     # ~3 minutes on 2 CPU cores
    python -m experiments run mafe --preset paper     # spec scale (M 2000, T 50, 64 x 4 x 30, 2 CEM seeds)
    python -m experiments run mafe --preset smoke --cem.iterations 3   # one field of a config section

Config sections (`run mafe --help` lists every field): loan, cem, eval, other; seed is top-level.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
import tqdm

from algorithms.fairness.mafe import core, fmacem
from algorithms.fairness.mafe.education import EducationMAFE, education_policy
from algorithms.fairness.mafe.healthcare import HealthcareMAFE, health_policy
from algorithms.fairness.mafe.loan import LoanMAFE, loan_policy
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments._cache import cached
from experiments.checks import Check

_CACHE_VERSION = 1
CLAIM = ("multi-agent fair environments expose fairness-performance-coordination trade-offs and delayed "
         "effects that single-decision fairness misses")
VARIANTS = ("coop", "bank_only", "independent")
_LABEL = {"coop": "cooperative F-MACEM (bank + agency)", "bank_only": "bank-only (agency uniform)",
          "independent": "independent F-MACEM (alternating)"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoanSection:
    """The loan MAFE and its Pareto grid of fairness weights (``--loan.lambdas 0 0.1``)."""

    num_individuals: int = 2000
    horizon: int = 50
    num_bins: int = 6
    lambdas: tuple[float, ...] = (0.0, 0.01, 0.03, 0.1, 0.3)
    harsh_loss: float = 80.0  # the harsh-default regime of the delayed-impact demonstration


@dataclasses.dataclass(frozen=True, kw_only=True)
class CemSection:
    """F-MACEM's cross-entropy search (``--cem.iterations 10``); `gamma` also discounts the evaluation."""

    num_candidates: int = 64
    elite_frac: float = 0.125
    alpha: float = 0.7
    iterations: int = 30
    num_episodes: int = 4
    gamma: float = 0.99
    seeds: int = 2
    independent_rounds: int = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Evaluation of every fitted policy (``--eval.episodes 16``)."""

    episodes: int = 32


_OTHER_DOMAINS = ("healthcare", "education")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OtherSection:
    """The short healthcare and education runs at two lam values each (``--other.domains education``)."""

    domains: tuple[str, ...] = _OTHER_DOMAINS
    individuals: int = 1000
    horizon: int = 30
    iterations: int = 15
    health_lambdas: tuple[float, float] = (0.0, 1.0)
    education_lambdas: tuple[float, float] = (0.0, 3.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """mafe settings, in sections overridden on the command line as ``--cem.iterations 10``."""

    loan: LoanSection = LoanSection()
    cem: CemSection = CemSection()
    eval: EvalSection = EvalSection()
    other: OtherSection = OtherSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        _validate(self)


def _validate(c: Config) -> None:
    err, lams = registry.ConfigError, c.loan.lambdas
    if not lams or lams[0] != 0.0 or any(b <= a for a, b in zip(lams, lams[1:])):
        raise err("loan.lambdas", f"must be increasing and start at 0.0, got {lams}")
    if c.cem.seeds < 1:
        raise err("cem.seeds", f"must be >= 1, got {c.cem.seeds}")
    if c.eval.episodes < 2:
        raise err("eval.episodes", f"must be >= 2, got {c.eval.episodes}")
    bad = [d for d in c.other.domains if d not in _OTHER_DOMAINS]
    if bad:
        raise err("other.domains", f"must be drawn from {_OTHER_DOMAINS}, got unknown {bad}")


# The flat field names the config had before it was split into sections, in their old order: every cache key
# holds them, so results cached before the split stay valid.
_FLAT_FIELDS = (
    ("num_individuals", "loan.num_individuals"), ("horizon", "loan.horizon"), ("num_bins", "loan.num_bins"),
    ("lambdas", "loan.lambdas"), ("num_candidates", "cem.num_candidates"), ("elite_frac", "cem.elite_frac"),
    ("alpha", "cem.alpha"), ("iterations", "cem.iterations"), ("num_episodes", "cem.num_episodes"),
    ("gamma", "cem.gamma"), ("cem_seeds", "cem.seeds"), ("independent_rounds", "cem.independent_rounds"),
    ("eval_episodes", "eval.episodes"), ("harsh_loss", "loan.harsh_loss"), ("other_domains", "other.domains"),
    ("other_individuals", "other.individuals"), ("other_horizon", "other.horizon"),
    ("other_iterations", "other.iterations"), ("health_lambdas", "other.health_lambdas"),
    ("education_lambdas", "other.education_lambdas"), ("seed", "seed"), ("progress", "progress"),
)


def _cache_fields(c: Config, skip: tuple[str, ...] = ("progress",)) -> dict:
    """The config part of a cache key: the pre-sections flat fields by their old names, but those in `skip`."""
    return registry.flat_fields(c, _FLAT_FIELDS, skip=skip)


def _cached(workdir, key: dict, fn):
    """`experiments._cache.cached` with this module's cache version in the key."""
    return cached(workdir, {"v": _CACHE_VERSION, **key}, fn)


def _cem_kwargs(c: Config, iterations: int | None = None) -> dict:
    return dict(gamma=c.cem.gamma, num_episodes=c.cem.num_episodes, num_candidates=c.cem.num_candidates,
                elite_frac=c.cem.elite_frac, alpha=c.cem.alpha, iterations=iterations or c.cem.iterations)


def _eval(env, params, policy, theta, weights, lam, c: Config, key) -> dict:
    """Per-episode J / return / penalty, per-stage summaries and fairness components (JSON-able lists)."""
    ev = fmacem.evaluate(env, params, policy, theta, weights, key, lam=lam, gamma=c.cem.gamma,
                         num_episodes=c.eval.episodes)
    out = {k: ev[k].tolist() for k in ("J", "return", "penalty")}
    out["summary"] = {k: v.tolist() for k, v in ev["summary"].items()}
    out["fair"] = {a: ev["comps"][a]["fair"].tolist() for a in env.agents}
    out["rate"] = {a: ev["comps"][a]["rate"].tolist() for a in env.agents}
    out["reward0"] = {a: ev["comps"][a]["reward"][..., 0].tolist() for a in env.agents}
    out["theta"] = np.asarray(theta).tolist()
    return out


def _direct_policy(env) -> core.Policy:
    """A stationary policy whose parameters are the actions themselves (theta = concatenated actions)."""
    dims = env.action_dims()
    return core.Policy(dims=dims, apply=lambda th, obs, t: {a: th[a] for a in dims},
                       init={a: jnp.full((d,), 0.5) for a, d in dims.items()})


def _dp_bank_action(env: LoanMAFE, params, probs: np.ndarray, rate: float, key) -> np.ndarray:
    """Demographic parity at t = 0: group 0 keeps the profit-only per-bin approval probabilities ``probs``;
    group 1 approves its bins from the top down (the marginal bin partially) until its approval rate on the
    initial population equals group 0's. Returns the (2B + 1,) bank action, then kept for all stages."""
    st = env.init_state(key, params)
    bins = np.asarray(jnp.clip(jnp.floor((env.observed_score(st, params) - 300.0) / 550.0 * env.num_bins),
                               0, env.num_bins - 1)).astype(int)
    g = np.asarray(st.group)
    n0 = np.bincount(bins[g == 0], minlength=env.num_bins).astype(float)
    n1 = np.bincount(bins[g == 1], minlength=env.num_bins).astype(float)
    target = float(probs @ n0 / max(n0.sum(), 1)) * n1.sum()
    row1 = np.zeros(env.num_bins)
    left = target
    for b in range(env.num_bins - 1, -1, -1):
        if n1[b] <= 0:
            row1[b] = 1.0 if left > 0 else 0.0
            continue
        row1[b] = float(np.clip(left / n1[b], 0.0, 1.0))
        left -= row1[b] * n1[b]
    return np.concatenate([probs, row1, [rate]]).astype(np.float32)


def _mse(x) -> tuple[float, float]:
    x = np.asarray(x, float)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0


# ------------------------------------------------------------------------------------------------ loan study
def _loan_runs(c: Config, workdir, bar) -> dict:
    env = LoanMAFE(num_individuals=c.loan.num_individuals, num_bins=c.loan.num_bins, horizon=c.loan.horizon)
    params = env.default_params()
    w = env.default_weights()
    base = _cache_fields(c, skip=("progress", "other_domains"))
    eval_key = jax.random.key(c.seed + 10_000)
    aware = loan_policy(env, group_aware=True)
    pols = {"coop": aware, "bank_only": loan_policy(env, group_aware=True, fixed_agency="uniform"),
            "independent": aware}
    runs: dict = {v: {} for v in VARIANTS}
    for lam in c.loan.lambdas:
        for v in VARIANTS:
            per_seed = []
            for s in range(c.cem.seeds):
                def unit(v=v, s=s, lam=lam):
                    key = jax.random.key(c.seed * 1000 + s)
                    fn = fmacem.independent_fmacem if v == "independent" else fmacem.fmacem
                    extra = {"rounds": c.cem.independent_rounds} if v == "independent" else {}
                    res = fn(env, params, pols[v], w, key, lam=lam, **_cem_kwargs(c), **extra)
                    return _eval(env, params, pols[v], res.theta, w, lam, c, eval_key)
                per_seed.append(_cached(workdir, {"cfg": base, "loan": v, "lam": lam, "seed": s}, unit))
                bar.update(1)
            runs[v][lam] = per_seed

    # (1) profit-only, group-blind, no agency.
    blind = loan_policy(env, group_aware=False, fixed_agency="none")

    def profit_unit():
        res = fmacem.fmacem(env, params, blind, w, jax.random.key(c.seed * 1000 + 77), lam=0.0,
                            agents=("bank",), **_cem_kwargs(c))
        return _eval(env, params, blind, res.theta, w, 0.0, c, eval_key)

    profit = _cached(workdir, {"cfg": base, "loan": "profit_only"}, profit_unit)
    bar.update(1)

    # (4) DP at t = 0 from the profit-only thresholds, in the default and the harsh regime.
    theta = np.asarray(profit["theta"], np.float32)
    probs = 1.0 / (1.0 + np.exp(-theta[:c.loan.num_bins]))
    rate = float(1.0 / (1.0 + np.exp(-theta[c.loan.num_bins])))
    none_agency = np.zeros(2 * c.loan.num_bins + 1, np.float32)
    none_agency[-1] = 1.0
    direct = _direct_policy(env)
    delayed = {}
    for regime, over in (("default", {}), ("harsh", {"loss": c.loan.harsh_loss})):
        p_reg = env.default_params(**over)
        dp = _dp_bank_action(env, p_reg, probs, rate, jax.random.key(c.seed + 5))
        prof_act = np.concatenate([probs, probs, [rate]]).astype(np.float32)

        def dl_unit(p_reg=p_reg, dp=dp, prof_act=prof_act):
            return {"dp": _eval(env, p_reg, direct, np.concatenate([dp, none_agency]), w, 0.0, c, eval_key),
                    "profit": _eval(env, p_reg, direct, np.concatenate([prof_act, none_agency]), w, 0.0, c,
                                    eval_key),
                    "dp_action": dp.tolist()}
        delayed[regime] = _cached(workdir, {"cfg": base, "loan": "delayed", "regime": regime}, dl_unit)
        bar.update(1)
    return {"runs": runs, "profit": profit, "delayed": delayed}


def _pooled(per_seed: list[dict], key: str) -> np.ndarray:
    return np.concatenate([np.asarray(r[key], float) for r in per_seed])


def _gap_traj(ev: dict) -> np.ndarray:
    """(episodes, T + 1) mean-score gap group 0 - group 1 in points."""
    ms = np.asarray(ev["summary"]["mean_score"], float)
    return ms[..., 0] - ms[..., 1]


def _loan_study(c: Config, res: dict, workdir) -> checks_lib.Study:
    runs, lams = res["runs"], list(c.loan.lambdas)
    front = {v: {k: [_mse(_pooled(runs[v][lam], k)) for lam in lams] for k in ("J", "return", "penalty")}
             for v in VARIANTS}
    checks = []
    # (1)
    gp = _gap_traj(res["profit"])
    d1m, d1se = _mse(gp[:, -1] - gp[:, 0])
    thr1 = max(5.0, 3 * d1se)
    checks.append(Check("(1) profit-only group-blind bank: mean-score gap change over T stages (points)", d1m,
                        "static fairness is not enough (gap widens)", f"> max(5, 3 SE) = {thr1:.1f}", d1m > thr1,
                        note=f"gap {gp[:, 0].mean():.1f} -> {gp[:, -1].mean():.1f} points"))
    # (2)
    pen0, penL = front["coop"]["penalty"][0], front["coop"]["penalty"][-1]
    ret0, retL = front["coop"]["return"][0], front["coop"]["return"][-1]
    thr2 = pen0[0] - 3 * np.hypot(pen0[1], penL[1])
    checks.append(Check(f"(2) cooperative F-MACEM penalty at lam={lams[-1]:g} (lam=0: {pen0[0]:.2f})", penL[0],
                        "increasing lam traces a fairness-performance front",
                        f"< {thr2:.2f} (lam=0 minus 3 SE) and return {retL[0]:.2f} < {ret0[0]:.2f}",
                        bool(penL[0] < thr2 and retL[0] < ret0[0])))
    pens = [m for m, _ in front["coop"]["penalty"]]
    rho = float(np.corrcoef(np.arange(len(pens)), np.argsort(np.argsort(pens)))[0, 1]) if len(pens) > 2 else -1.0
    checks.append(Check("(2) Spearman correlation of lam with the cooperative penalty", rho, "monotone front",
                        "<= -0.8", rho <= -0.8, required=False))
    # (3) paired differences over the evaluation episodes (same keys), pooled over CEM seeds.
    diffs = [_pooled(runs["coop"][lam], "J") - _pooled(runs["bank_only"][lam], "J") for lam in lams]
    dstats = [_mse(d) for d in diffs]
    worst = min(m + 2 * se for m, se in dstats)
    checks.append(Check("(3) min over lam of (J_coop - J_bank-only) + 2 SE", worst,
                        "coordination: cooperative front dominates the bank-only front", ">= 0 (weak dominance "
                        "at every lam)", worst >= 0.0,
                        note=", ".join(f"lam={lam:g}: {m:+.2f}+-{se:.2f}" for lam, (m, se) in zip(lams, dstats))))
    pos = np.mean(np.stack(diffs[1:]), axis=0) if len(lams) > 1 else diffs[0]
    gm, gse = _mse(pos)
    checks.append(Check("(3) mean over lam > 0 of J_coop - J_bank-only", gm, "coordination benefit",
                        f"> 2 SE = {2 * gse:.3f}", gm > 2 * gse))
    di = _mse(_pooled(runs["coop"][lams[-1]], "J") - _pooled(runs["independent"][lams[-1]], "J"))
    checks.append(Check(f"(3) J_coop - J_independent at lam={lams[-1]:g}", di[0],
                        "coordinated beats independent agents", f"> 2 SE = {2 * di[1]:.3f}", di[0] > 2 * di[1],
                        required=False))
    # (4)
    dl = {}
    for regime, r in res["delayed"].items():
        g_dp, g_pr = _gap_traj(r["dp"]), _gap_traj(r["profit"])
        rates1 = np.asarray(r["dp"]["rate"]["bank"], float)[:, 0, :2]  # (episodes, group) at stage 1
        appr_gap1 = float(abs(np.mean(rates1[:, 0] - rates1[:, 1])))
        dd = _mse(g_dp[:, -1] - g_pr[:, -1])
        ms_dp = np.asarray(r["dp"]["summary"]["mean_score"], float)[..., 1]
        ms_pr = np.asarray(r["profit"]["summary"]["mean_score"], float)[..., 1]
        dl[regime] = {"approval_gap_stage1": appr_gap1, "gap_T_dp": float(g_dp[:, -1].mean()),
                      "gap_T_profit": float(g_pr[:, -1].mean()), "gap_diff": dd[0], "gap_diff_se": dd[1],
                      "g1_T_dp": float(ms_dp[:, -1].mean()), "g1_T_profit": float(ms_pr[:, -1].mean()),
                      "g1_0": float(ms_dp[:, 0].mean())}
        if regime == "default":
            checks.append(Check("(4) DP-at-t0 policy: |mean approval-rate gap| at stage 1", appr_gap1,
                                "fair at one step", "<= 0.03", appr_gap1 <= 0.03))
        checks.append(Check(f"(4) {regime} regime: score gap at T, DP-at-t0 minus profit-only (points)", dd[0],
                            "a static DP constraint can raise the long-run gap (delayed impact)",
                            f"> 2 SE = {2 * dd[1]:.2f}", dd[0] > 2 * dd[1], required=False,
                            note=f"group-1 mean at T: DP {dl[regime]['g1_T_dp']:.0f} vs profit-only "
                                 f"{dl[regime]['g1_T_profit']:.0f} (t=0: {dl[regime]['g1_0']:.0f})"))
    metrics = {"loan/front": {v: {k: [m for m, _ in front[v][k]] for k in front[v]} for v in VARIANTS},
               "loan/front_se": {v: {k: [s for _, s in front[v][k]] for k in front[v]} for v in VARIANTS},
               "loan/lambdas": lams,
               "loan/profit_only_gap_0": float(gp[:, 0].mean()), "loan/profit_only_gap_T": float(gp[:, -1].mean()),
               "loan/coop_minus_bank_J": [m for m, _ in dstats], "loan/coop_minus_bank_J_se": [s for _, s in dstats],
               "loan/coop_minus_independent_J_max_lam": di[0], "loan/delayed_impact": dl}
    context = (f"Loan MAFE (M={c.loan.num_individuals}, T={c.loan.horizon}, {c.loan.num_bins} bins), F-MACEM "
               f"{c.cem.num_candidates} candidates x {c.cem.num_episodes} episodes x {c.cem.iterations} iterations, "
               f"{c.cem.seeds} CEM seed(s), "
               f"{c.eval.episodes} evaluation episodes: profit-only gap {gp[:, 0].mean():.0f} -> "
               f"{gp[:, -1].mean():.0f} points; cooperative front return {ret0[0]:.2f} -> {retL[0]:.2f}, penalty "
               f"{pen0[0]:.1f} -> {penL[0]:.1f} over lam 0 -> {lams[-1]:g}; J_coop - J_bank-only "
               + ", ".join(f"{m:+.2f}" for m, _ in dstats)
               + f"; J_coop - J_indep at lam={lams[-1]:g} {di[0]:+.2f}; DP at t0 (approval gap at stage 1 "
               f"{dl['default']['approval_gap_stage1']:.3f}): score gap at T {dl['default']['gap_T_dp']:.0f} vs "
               f"profit-only {dl['default']['gap_T_profit']:.0f} (default), {dl['harsh']['gap_T_dp']:.0f} vs "
               f"{dl['harsh']['gap_T_profit']:.0f} (loss {c.loan.harsh_loss:g})")
    plots = [_plot_fronts(front, lams, workdir), _plot_trajectories(res, c, workdir)]
    return checks_lib.Study(checks=checks, context=context, metrics=metrics, plots=plots)


# ------------------------------------------------------------------------------------------- other domains
def _other_study(c: Config, workdir, bar) -> checks_lib.Study:
    base = _cache_fields(c)
    checks, metrics, parts, traj = [], {}, [], {}
    for dom in c.other.domains:
        if dom == "healthcare":
            env, pol, lams = (HealthcareMAFE(num_individuals=c.other.individuals, horizon=c.other.horizon),
                              None, c.other.health_lambdas)
            pol = health_policy(env)
        else:
            env = EducationMAFE(num_individuals=c.other.individuals, horizon=c.other.horizon)
            pol, lams = education_policy(env), c.other.education_lambdas
        params, w = env.default_params(), env.default_weights()
        evs = []
        for lam in lams:
            def unit(lam=lam, env=env, pol=pol, params=params, w=w):
                res = fmacem.fmacem(env, params, pol, w, jax.random.key(c.seed + 31), lam=lam,
                                    **_cem_kwargs(c, c.other.iterations))
                return _eval(env, params, pol, res.theta, w, lam, c, jax.random.key(c.seed + 20_000))
            evs.append(_cached(workdir, {"cfg": base, "domain": dom, "lam": lam}, unit))
            bar.update(1)
        r0, r1 = _mse(evs[0]["return"])[0], _mse(evs[1]["return"])[0]
        (p0, q0), (p1, q1) = _mse(evs[0]["penalty"]), _mse(evs[1]["penalty"])
        thr = p0 - 3 * np.hypot(q0, q1)
        checks.append(Check(f"{dom}: cooperative F-MACEM penalty at lam={lams[1]:g} (lam=0: {p0:.2f})", p1,
                            "fairness-performance trade-off", f"< {thr:.2f} (lam=0 minus 3 SE)", p1 < thr,
                            required=False, note=f"return {r0:.2f} -> {r1:.2f}"))
        metrics[f"{dom}/return"] = [r0, r1]
        metrics[f"{dom}/penalty"] = [p0, p1]
        metrics[f"{dom}/lambdas"] = list(lams)
        parts.append(f"{dom}: return {r0:.2f} -> {r1:.2f}, penalty {p0:.2f} -> {p1:.2f} (lam 0 -> {lams[1]:g})")
        traj[dom] = (evs, lams, env.agents)
    plots = [_plot_other(traj, workdir)] if traj else []
    return checks_lib.Study(checks=checks, context="; ".join(parts), metrics=metrics, plots=plots)


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column)."""
    m = metrics
    lams = m["loan/lambdas"]
    d = m["loan/coop_minus_bank_J"]
    dl = m["loan/delayed_impact"]["default"]
    return (f"loan: profit-only gap {m['loan/profit_only_gap_0']:.0f}->{m['loan/profit_only_gap_T']:.0f} pts; "
            f"coop penalty {m['loan/front']['coop']['penalty'][0]:.1f}->{m['loan/front']['coop']['penalty'][-1]:.1f} "
            f"(lam 0->{lams[-1]:g}); J coop-bank-only {min(d):+.2f}..{max(d):+.2f}; DP@t0 gap at T "
            f"{dl['gap_T_dp']:.0f} vs {dl['gap_T_profit']:.0f}")


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    total = len(c.loan.lambdas) * len(VARIANTS) * c.cem.seeds + 3 + 2 * len(c.other.domains)
    bar = tqdm.tqdm(total=total, desc="mafe", disable=not c.progress)
    loan = _loan_study(c, _loan_runs(c, workdir, bar), workdir)
    other = _other_study(c, workdir, bar)
    bar.close()
    checks = loan.checks + other.checks
    failed = [ch for ch in checks if ch.required and not ch.passed]
    cause_class = None
    cause = ""
    if failed:
        cause_class = "scale" if any(ch.name.startswith("(3)") or ch.name.startswith("(2)") for ch in failed) \
            else "spec"
        cause = ("the failing demonstration(s) " + "; ".join(ch.name for ch in failed) + " depend on our inferred "
                 "loan dynamics and on the F-MACEM budget (CEM noise at this scale)")
    verdict, reproduced = checks_lib.verdict(checks, claim=CLAIM, context=loan.context + ". " + other.context,
                                             cause=cause, cause_class=cause_class)
    metrics = {**loan.metrics, **other.metrics, "checks": [ch.as_dict() for ch in checks]}
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced,
            "cause": None if reproduced else cause_class, "plots": loan.plots + other.plots}


# ------------------------------------------------------------------------------------------------- plots
_COL = {"coop": "tab:green", "bank_only": "tab:red", "independent": "tab:blue"}


def _plot_fronts(front, lams, workdir) -> str:
    fig, ax = plotting.subplots(figsize=(5.6, 4.2))
    for v in VARIANTS:
        r = np.array(front[v]["return"])
        p = np.array(front[v]["penalty"])
        ax.errorbar(p[:, 0], r[:, 0], xerr=p[:, 1], yerr=r[:, 1], color=_COL[v], marker="o", ms=4, capsize=2,
                    label=_LABEL[v])
        for lam, x, y in zip(lams, p[:, 0], r[:, 0]):
            ax.annotate(f"{lam:g}", (x, y), fontsize=6, color=_COL[v], xytext=(3, 3), textcoords="offset points")
    ax.set(xlabel="discounted fairness penalty (lower is fairer)", ylabel="discounted return (profit + welfare)",
           title="loan MAFE: Pareto fronts over lambda")
    plotting.legend(ax, fontsize=7)
    return report.savefig(fig, epath.Path(workdir) / "loan_pareto_fronts.png")


def _plot_trajectories(res, c: Config, workdir) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10.5, 3.8))
    t = np.arange(c.loan.horizon + 1)
    lam = c.loan.lambdas[-1]

    def band(ax, ev, label, col, ls="-"):
        g = ev if isinstance(ev, np.ndarray) else _gap_traj(ev)
        m, se = g.mean(0), g.std(0, ddof=1) / np.sqrt(g.shape[0])
        ax.plot(t, m, color=col, ls=ls, label=label)
        ax.fill_between(t, m - 2 * se, m + 2 * se, color=col, alpha=0.2)

    band(ax1, res["profit"], "profit-only (group-blind, no agency)", "k")
    band(ax1, np.concatenate([_gap_traj(r) for r in res["runs"]["coop"][lam]]), f"cooperative, lam={lam:g}",
         _COL["coop"])
    band(ax1, np.concatenate([_gap_traj(r) for r in res["runs"]["bank_only"][lam]]), f"bank-only, lam={lam:g}",
         _COL["bank_only"])
    band(ax1, np.concatenate([_gap_traj(r) for r in res["runs"]["independent"][lam]]),
         f"independent, lam={lam:g}", _COL["independent"])
    ax1.set(xlabel="stage t", ylabel="mean-score gap, group 0 - group 1 (points)", title="disparity over stages")
    plotting.legend(ax1, fontsize=7)
    for regime, ls in (("default", "-"), ("harsh", "--")):
        r = res["delayed"][regime]
        band(ax2, r["profit"], f"profit-only ({regime})", "k", ls)
        band(ax2, r["dp"], f"DP fixed at t=0 ({regime})", "tab:purple", ls)
    ax2.set(xlabel="stage t", ylabel="mean-score gap (points)",
            title=f"delayed impact (harsh: default loss {c.loan.harsh_loss:g})")
    plotting.legend(ax2, fontsize=7)
    return report.savefig(fig, epath.Path(workdir) / "loan_disparity_trajectories.png")


def _plot_other(traj, workdir) -> str:
    fig, axes = plotting.subplots(1, len(traj), figsize=(5.0 * len(traj), 3.6), squeeze=False)
    for ax, (dom, (evs, lams, agents)) in zip(axes.ravel(), traj.items()):
        for ev, lam, col in zip(evs, lams, ("k", "tab:green")):
            for a, ls in zip(agents, ("-", "--")):
                f = np.asarray(ev["fair"][a], float)[..., 0]  # (episodes, T) first fairness component
                ax.plot(np.arange(1, f.shape[1] + 1), f.mean(0), color=col, ls=ls,
                        label=f"{a}: gap, lam={lam:g}")
        ax.set(xlabel="stage t", ylabel="rate gap (first fairness component)", title=f"{dom} MAFE")
        plotting.legend(ax, fontsize=7)
    return report.savefig(fig, epath.Path(workdir) / "other_domains_disparity.png")


EXPERIMENT = registry.Experiment(
    slug="mafe",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            loan=LoanSection(num_individuals=100, horizon=6, num_bins=3, lambdas=(0.0, 0.3)),
            cem=CemSection(num_candidates=8, iterations=2, num_episodes=1, seeds=1, independent_rounds=1),
            eval=EvalSection(episodes=3),
            other=OtherSection(domains=("education",), individuals=60, horizon=4, iterations=1), progress=False),
        # quick keeps M = 1000: at M = 500 (tried for the issue-26 time budget, 110 s instead of 194 s) the
        # required DP-at-t0 check (4) fails (stage-1 approval gap 0.033 > 0.03 vs 0.009): the DP thresholds are
        # fitted on one initial population, whose sampling error grows as M shrinks.
        "quick": lambda: Config(
            loan=LoanSection(num_individuals=1000, horizon=50, lambdas=(0.0, 0.01, 0.03, 0.1, 0.3)),
            cem=CemSection(iterations=20, seeds=1), eval=EvalSection(episodes=32), other=OtherSection(iterations=12)),
        "paper": lambda: Config(),
    },
    run=run,
)
