"""Leaderboard incentives: no equilibrium under the standard protocol, a unique one under tune-before-test.

Reproduces the theory of Chen, Zhang and Hardt (arXiv 2603.08371) with
`algorithms.optimization.benchmark_game`, on the spec's instance: three providers with capabilities
theta = (1.0, 0.8, 0.6), scores v = theta + A (1 - exp(-(delta + e))), cost c(e) = kappa e^p (strictly
increasing), rewards (2R, R, 0).

  A. Standard protocol (delta = 0): the exhaustive search over every grid profile finds no pure Nash
     equilibrium (PNE), best-response dynamics cycle from every start (every state on the cycle is
     verified not to be a PNE), as Thm. 4.6 predicts when c(e_req_r) < R_{r-1} - R_r.
  B. Tune-before-test: the stabilizing level delta* (bisection, Prop. 5.3); a sweep over delta
     compares the exhaustive grid search with the theory's prediction (grid and continuous); above
     delta* the all-zero profile is the unique PNE, it ranks by capability, and best-response dynamics
     converge to it from random starts.
  C. Prop. 5.6: delta* against the reward gap for the generalized logit family (monotone alpha,
     common bounds) on log-log axes; the measured slope is compared with the asymptote 1/p derived
     from e_req(delta) ~ rho (1 + delta); plus the third-party counterexample
     v = 1 - 1/(2 + e + theta) that never stabilizes.
  D. A synthetic version of Fig. 1: per-model generalized-logit accuracy curves (made-up Qwen2.5-like
     parameters: the paper's Winogrande measurements are not public), noisy checkpoints, least-squares
     fits, and the minimum adjacent catch-up effort at TbT = 3000 steps, beside the paper's 384,668.
  E. The flat-cost caveat: with c(e) = max(e - 1, 0)^2 (allowed by Assumption 4.1) the exhaustive
     search finds non-zero-effort and inverted-ranking equilibria; the strict-cost checker rejects it.

Recipe:
    python -m experiments run benchmark_game --preset smoke   # seconds, used by the tests
    python -m experiments run benchmark_game --preset quick   # 2 CPU cores, about a minute
    python -m experiments run benchmark_game --preset paper   # finer grids, more starts and gaps
    python -m experiments run benchmark_game --preset smoke --search.grid-points 21   # one field of a section

Config sections (`run benchmark_game --help` lists every field): game, search (the equilibrium searches and
dynamics of A and B), tbt (B), scaling (C), fig1 (D), flat (E).

Expected (quick): no PNE and cycling at delta = 0; a unique capability-ordered PNE for delta >= delta*
(about 1.15 for the default instance) with the exhaustive search agreeing with the theory at every
sweep point.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from algorithms.optimization import benchmark_game as bg
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments.checks import Check


@dataclasses.dataclass(frozen=True, kw_only=True)
class GameConfig:
    """The game (on the command line ``--game.cost-power 2``): v = theta + A (1 - exp(-x)),
    c(e) = cost_scale * e^cost_power, rewards (2R, R, 0)-style: R_k = reward_unit * (n - 1 - k)."""

    thetas: tuple[float, ...] = (1.0, 0.8, 0.6)
    amplitude: float = 1.0
    reward_unit: float = 1.0
    cost_scale: float = 1.0
    cost_power: float = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """The equilibrium searches and best-response dynamics of parts A (standard protocol) and B (TbT)
    (``--search.grid-points 101``)."""

    full_grid_points: int = 61  # full G^n enumeration
    grid_points: int = 301  # pruned exhaustive search, dynamics
    dynamics_rounds: int = 400
    num_starts: int = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class TbTConfig:
    """B. The tune-before-test sweep over delta (``--tbt.num-deltas 11``)."""

    num_deltas: int = 31
    delta_max: float = 3.0
    margin: float = 1.25  # dynamics and full search at delta = margin * delta*


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """C. Threshold scaling: two providers, generalized logit with monotone alpha, common lower / upper / beta
    (``--scaling.num-gaps 6``)."""

    alpha: tuple[float, ...] = (0.5, 0.0)
    beta: float = 0.5
    lower: float = 0.5
    upper: float = 1.0
    cost_powers: tuple[float, ...] = (1.0, 2.0)
    gap_min: float = 10.0
    gap_max: float = 1e4
    num_gaps: int = 10
    max_delta: float = 1e7


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fig1Config:
    """D. Synthetic Fig. 1: illustrative parameters, not the paper's data (``--fig1.fit-iters 100``)."""

    models: tuple[str, ...] = ("0.5B", "1.5B", "3B", "7B", "14B")
    zero_shot: tuple[float, ...] = (0.56, 0.65, 0.70, 0.76, 0.81)
    chance: float = 0.5
    upper: float = 0.95
    beta: float = 0.25
    max_steps: float = 3000.0
    checkpoints: int = 31
    eval_size: int = 1267  # Winogrande dev-set size
    tbt_level: float = 3000.0
    num_tbt: int = 31
    fit_iters: int = 300


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlatCostConfig:
    """E. The flat-cost caveat: two providers, v = 1 - exp(-(theta + x)) (``--flat.grid-points 21``)."""

    thetas: tuple[float, ...] = (1.0, 0.5)
    rewards: tuple[float, ...] = (0.1, 0.0)
    grid_points: int = 41


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """benchmark_game settings (every field can be overridden on the command line; sections as
    ``--search.grid-points 101``)."""

    game: GameConfig = GameConfig()
    search: SearchConfig = SearchConfig()  # A (and B's searches)
    tbt: TbTConfig = TbTConfig()  # B
    scaling: ScalingConfig = ScalingConfig()  # C
    fig1: Fig1Config = Fig1Config()  # D
    flat: FlatCostConfig = FlatCostConfig()  # E
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        if len(self.game.thetas) < 2:
            raise registry.ConfigError("game.thetas", f"must name at least two providers; got {self.game.thetas}")


PAPER_FIG1_STEPS = 384_668  # minimum adjacent catch-up effort at TbT = 3000 steps (Fig. 1, Sec. 5.1)


def _rewards(c: Config) -> np.ndarray:
    n = len(c.game.thetas)
    return c.game.reward_unit * np.arange(n - 1, -1, -1, dtype=np.float64)


def _cost(c: Config):
    g = c.game
    return bg.LinearCost(g.cost_scale) if g.cost_power == 1.0 else bg.PowerCost(g.cost_scale, g.cost_power)


def _max_useful_effort(c: Config, rewards: np.ndarray) -> float:
    """c^{-1}(R_1 - R_n): larger efforts are strictly dominated by zero effort."""
    return float(((rewards[0] - rewards[-1]) / c.game.cost_scale) ** (1.0 / c.game.cost_power))


def _random_profiles(key, num: int, n: int, g: int) -> np.ndarray:
    return np.asarray(jax.random.randint(key, (num, n), 0, g), np.int32)


def _starts(c: Config, key, n: int) -> np.ndarray:
    """[num_starts, n] grid-index profiles where best-response dynamics start: all-zero, then random ones."""
    return np.concatenate([np.zeros((1, n), np.int32),
                           _random_profiles(key, c.search.num_starts - 1, n, c.search.grid_points)])


def _dynamics_stats(game, starts: np.ndarray, rounds: int) -> dict:
    n = game.scores.shape[0]
    summaries, cycle_states_ok, finals = [], True, []
    for s in starts:
        traj = bg.best_response_dynamics(game, jnp.asarray(s), num_rounds=rounds)
        summ = bg.analyze_trajectory(traj, num_players=n)
        summaries.append(summ)
        if not summ.converged and summ.cycle_length > 0:
            states = np.asarray(traj)[::n][summ.cycle_start:summ.cycle_start + summ.cycle_length]
            cycle_states_ok &= not bool(np.any(np.asarray(bg.is_pure_nash(game, jnp.asarray(states)))))
        finals.append(summ.fixed_point)
    converged = [s.converged for s in summaries]
    lengths = [s.cycle_length for s in summaries if not s.converged and s.cycle_length > 0]
    return {"num_starts": len(starts), "num_converged": int(sum(converged)),
            "num_cycling": len(lengths), "cycle_lengths": lengths,
            "cycle_states_not_pne": bool(cycle_states_ok), "fixed_points": finals,
            "rounds_to_converge": [s.cycle_start for s in summaries if s.converged]}


def _part_a(c: Config, curves, cost, rewards, e_max, key) -> tuple[dict, dict]:
    n = len(c.game.thetas)
    gaps = rewards[:-1] - rewards[1:]
    e_req = np.asarray(bg.just_overtake_efforts(curves, delta=0.0), np.float64)
    c_req = np.asarray(cost(jnp.asarray(e_req)), np.float64)
    thm46_no_pne = bool(np.any(c_req < gaps))
    game_full = bg.make_game(curves, cost, rewards, bg.effort_grid(e_max, c.search.full_grid_points))
    game = bg.make_game(curves, cost, rewards, bg.effort_grid(e_max, c.search.grid_points))
    eq_full = bg.find_pure_equilibria(game_full, method="full", progress=c.progress)
    eq_pruned = bg.find_pure_equilibria(game, method="pruned", progress=c.progress)
    starts = _starts(c, key, n)
    dyn = _dynamics_stats(game, starts, c.search.dynamics_rounds)
    traj = np.asarray(bg.best_response_dynamics(game, jnp.zeros(n, jnp.int32), num_rounds=c.search.dynamics_rounds))
    metrics = {
        "e_req_delta0": e_req.tolist(), "cost_e_req_delta0": c_req.tolist(), "reward_gaps": gaps.tolist(),
        "thm46_predicts_no_pne": thm46_no_pne,
        "continuous_zero_is_pne": bool(bg.zero_profile_is_pne(curves, cost, rewards, delta=0.0)),
        "full_grid_points": c.search.full_grid_points, "full_profiles_checked": c.search.full_grid_points ** n,
        "num_pne_full": int(eq_full.shape[0]), "num_pne_pruned": int(eq_pruned.shape[0]),
        "num_pne_predicted_grid": int(bg.predicted_equilibria(game).shape[0]),
        "dynamics": {k: v for k, v in dyn.items() if k != "fixed_points"},
    }
    return metrics, {"game": game, "traj": traj}


def _part_b(c: Config, curves, cost, rewards, e_max, key, delta_star: float) -> tuple[dict, dict]:
    n = len(c.game.thetas)
    gaps = rewards[:-1] - rewards[1:]
    deltas = np.linspace(0.0, c.tbt.delta_max, c.tbt.num_deltas)
    rows = []
    it = deltas
    if c.progress:
        from tqdm.auto import tqdm
        it = tqdm(deltas, desc="TbT sweep")
    quality = np.argsort(-np.asarray(c.game.thetas), kind="stable")
    for d in it:
        game = bg.make_game(curves, cost, rewards, bg.effort_grid(e_max, c.search.grid_points), delta=float(d))
        eq = bg.find_pure_equilibria(game, method="pruned")
        pred = bg.predicted_equilibria(game)
        cont = bool(bg.zero_profile_is_pne(curves, cost, rewards, delta=float(d)))
        e_req = np.asarray(bg.just_overtake_efforts(curves, delta=float(d)), np.float64)
        c_req = np.asarray(cost(jnp.asarray(e_req)), np.float64)
        zero_unique = eq.shape[0] == 1 and not eq.any()
        ranks_ok = bool(zero_unique and np.array_equal(np.asarray(bg.ranking(game, jnp.asarray(eq[0]))), quality))
        rows.append({"delta": float(d), "num_pne": int(eq.shape[0]), "zero_unique": bool(zero_unique),
                     "zero_unique_ranks_by_quality": ranks_ok,
                     "grid_theory_agrees": bool(eq.shape == pred.shape and np.all(eq == pred)),
                     "continuous_stable": cont, "cost_e_req": c_req.tolist()})
    stable_grid = [r["num_pne"] > 0 for r in rows]
    stable_cont = [r["continuous_stable"] for r in rows]
    monotone = lambda xs: all(b >= a for a, b in zip(xs, xs[1:]))
    mismatch = [r["delta"] for r in rows if (r["num_pne"] > 0) != r["continuous_stable"]]
    # Above delta*: full enumeration, uniqueness, ranking, dynamics.
    d_tbt = c.tbt.margin * delta_star if math.isfinite(delta_star) else c.tbt.delta_max
    game_full = bg.make_game(curves, cost, rewards, bg.effort_grid(e_max, c.search.full_grid_points), delta=d_tbt)
    eq_full = bg.find_pure_equilibria(game_full, method="full", progress=c.progress)
    game = bg.make_game(curves, cost, rewards, bg.effort_grid(e_max, c.search.grid_points), delta=d_tbt)
    starts = _starts(c, key, n)
    dyn = _dynamics_stats(game, starts, c.search.dynamics_rounds)
    finals_ranked = [fp is not None and not fp.any()
                     and np.array_equal(np.asarray(bg.ranking(game, jnp.asarray(fp))), quality)
                     for fp in dyn["fixed_points"]]
    traj = np.asarray(bg.best_response_dynamics(game, jnp.asarray(starts[1]),
                                                num_rounds=min(c.search.dynamics_rounds, 20)))
    metrics = {
        "delta_star": delta_star, "tbt_delta": d_tbt, "sweep": rows,
        "sweep_grid_theory_agreement": sum(r["grid_theory_agrees"] for r in rows) / len(rows),
        "sweep_continuous_theory_agreement": 1.0 - len(mismatch) / len(rows),
        "sweep_continuous_mismatch_deltas": mismatch,
        "sweep_stability_monotone_grid": monotone(stable_grid),
        "sweep_stability_monotone_continuous": monotone(stable_cont),
        "sweep_unique_whenever_stable": all(r["zero_unique"] for r in rows if r["num_pne"] > 0),
        "sweep_quality_order_whenever_stable": all(r["zero_unique_ranks_by_quality"] for r in rows if r["num_pne"] > 0),
        "sweep_none_below_delta_star": all(r["num_pne"] == 0 for r in rows if r["delta"] < delta_star - 0.02 * max(delta_star, 1e-9)),
        "tbt_num_pne_full": int(eq_full.shape[0]),
        "tbt_pne_full_is_zero": bool(eq_full.shape[0] == 1 and not eq_full.any()),
        "tbt_dynamics": {k: v for k, v in dyn.items() if k != "fixed_points"},
        "tbt_dynamics_all_reach_quality_order": bool(all(finals_ranked)),
    }
    return metrics, {"deltas": deltas, "rows": rows, "gaps": gaps, "tbt_traj": traj, "tbt_game": game}


def _part_c(c: Config) -> tuple[dict, dict]:
    alpha = jnp.asarray(c.scaling.alpha)
    curves = bg.GeneralizedLogit(c.scaling.lower, c.scaling.upper, alpha, c.scaling.beta)
    gaps = np.geomspace(c.scaling.gap_min, c.scaling.gap_max, c.scaling.num_gaps)
    rho = math.exp((c.scaling.alpha[0] - c.scaling.alpha[1]) / c.scaling.beta) - 1.0
    out, curves_out = {}, {}
    for p in c.scaling.cost_powers:
        cost = bg.LinearCost(1.0) if p == 1.0 else bg.PowerCost(1.0, p)
        ds = np.array([bg.stabilizing_tbt_level(curves, cost, jnp.asarray([lam, 0.0]), max_delta=c.scaling.max_delta)
                       for lam in gaps])
        ok = np.isfinite(ds) & (ds > 0)
        half = ok & (gaps >= np.sqrt(gaps[0] * gaps[-1]))
        slope = float(np.polyfit(np.log(gaps[half]), np.log(ds[half]), 1)[0]) if half.sum() >= 2 else math.nan
        asym = (gaps / 1.0) ** (1.0 / p) / rho - 1.0  # delta* from e_req ~ rho (1 + delta)
        out[f"p={p:g}"] = {"delta_star": ds.tolist(), "loglog_slope_upper_half": slope,
                           "asymptotic_slope": 1.0 / p, "asymptotic_delta_star": asym.tolist()}
        curves_out[p] = ds
    # Third-party counterexample: v = 1 - 1/(2 + x + theta) in generalized-logit form, theta = (1, 0).
    th = np.array([1.0, 0.0])
    cex = bg.GeneralizedLogit(jnp.asarray(th / (1 + th)), 1.0, jnp.asarray(-np.log1p(th)), 1.0, 1.0)
    cex_delta = bg.stabilizing_tbt_level(cex, bg.LinearCost(1.0), jnp.asarray([2.0, 0.0]),
                                         max_delta=c.scaling.max_delta)
    cex_ereq = [float(bg.just_overtake_efforts(cex, delta=d)[0]) for d in (0.0, 10.0, 1000.0)]
    metrics = {"gaps": gaps.tolist(), "rho": rho, "by_cost_power": out,
               "counterexample_delta_star": cex_delta, "counterexample_e_req_at_0_10_1000": cex_ereq}
    return metrics, {"gaps": gaps, "curves": curves_out, "rho": rho}


def _part_d(c: Config, key) -> tuple[dict, dict]:
    acc0 = np.asarray(c.fig1.zero_shot, np.float64)
    frac = (acc0 - c.fig1.chance) / (c.fig1.upper - c.fig1.chance)
    alpha = np.log(frac / (1 - frac))  # v(0) = acc0 with log(1 + 0) = 0
    true = bg.GeneralizedLogit(c.fig1.chance, c.fig1.upper, jnp.asarray(alpha), c.fig1.beta)
    m = len(acc0)
    steps = np.linspace(0.0, c.fig1.max_steps, c.fig1.checkpoints)
    clean = np.asarray(true(jnp.broadcast_to(jnp.asarray(steps), (m, steps.shape[0]))), np.float64)
    counts = np.asarray(jax.random.binomial(key, c.fig1.eval_size, jnp.asarray(clean)), np.float64)
    obs = np.clip(counts / c.fig1.eval_size, 1e-3, 1 - 1e-3)
    fits = {"per_model": bg.fit_generalized_logit(steps, obs, lower=c.fig1.chance, num_steps=c.fig1.fit_iters),
            "shared_U_beta": bg.fit_generalized_logit(steps, obs, lower=c.fig1.chance, share_upper=True,
                                                     share_beta=True, num_steps=c.fig1.fit_iters)}
    tbt = np.linspace(0.0, c.fig1.tbt_level, c.fig1.num_tbt)
    quality = jnp.asarray(acc0)

    def min_catchup(curves):
        return np.array([float(jnp.min(bg.just_overtake_efforts(curves, delta=float(d), quality=quality))) for d in tbt])

    series = {"true": min_catchup(true)}
    metrics = {"models": list(c.fig1.models), "true_min_catchup_at_tbt": float(series["true"][-1])}
    for name, fit in fits.items():
        series[name] = min_catchup(fit)
        pred = np.asarray(fit(jnp.broadcast_to(jnp.asarray(steps), obs.shape)), np.float64)
        metrics[f"{name}_rmse"] = float(np.sqrt(np.mean((pred - obs) ** 2)))
        metrics[f"{name}_min_catchup_at_tbt"] = float(series[name][-1])
        metrics[f"{name}_upper"] = np.asarray(fit.upper).tolist()
        metrics[f"{name}_beta"] = np.asarray(fit.beta).tolist()
    metrics["paper_min_catchup_at_tbt"] = PAPER_FIG1_STEPS
    metrics["tbt_level"] = c.fig1.tbt_level
    return metrics, {"steps": steps, "obs": obs, "true": true, "fits": fits, "tbt": tbt, "series": series}


def _part_e(c: Config) -> dict:
    th = jnp.asarray(c.flat.thetas)
    curves = bg.ExpCapability(th)
    rewards = jnp.asarray(c.flat.rewards)
    grid = bg.effort_grid(2.0, c.flat.grid_points)
    out = {}
    for name, cost in (("flat_then_quadratic", bg.FlatThenQuadratic(1.0)), ("linear", bg.LinearCost(1.0))):
        game = bg.make_game(curves, cost, rewards, grid)
        eq = bg.find_pure_equilibria(game, method="full")
        quality = np.argsort(-np.asarray(c.flat.thetas), kind="stable")
        inverted = sum(not np.array_equal(np.asarray(bg.ranking(game, jnp.asarray(p))), quality) for p in eq)
        rep = bg.check_assumptions(curves, cost, rewards, grid, strict_cost=True)
        out[name] = {"num_pne": int(eq.shape[0]), "num_nonzero_pne": int(np.sum(eq.any(axis=1))),
                     "num_inverted_pne": int(inverted), "strict_checker_ok": rep.ok,
                     "matches_theory": bool(eq.shape == bg.predicted_equilibria(game).shape
                                            and np.all(eq == bg.predicted_equilibria(game)))}
    return out


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    a, b = metrics["standard"], metrics["tbt"]
    dyn_a, dyn_b = a["dynamics"], b["tbt_dynamics"]
    eq = ("unique zero-effort equilibrium" if b["tbt_pne_full_is_zero"]
          else f"{b['tbt_num_pne_full']} equilibria")
    order = " in quality order" if b["tbt_pne_full_is_zero"] and b["sweep_quality_order_whenever_stable"] else ""
    return (f"standard: {a['num_pne_full']} pure equilibria in {a['full_profiles_checked']:,} grid profiles, "
            f"best responses cycle {dyn_a['num_cycling']}/{dyn_a['num_starts']}; TbT (delta {b['tbt_delta']:.2f} > "
            f"delta* {b['delta_star']:.2f}): {eq}{order}, {dyn_b['num_converged']}/{dyn_b['num_starts']} converge")


def run(c: Config, workdir: pathlib.Path) -> dict:
    t0 = time.time()
    key_a, key_b, key_d = jax.random.split(jax.random.key(c.seed), 3)
    curves = bg.ExpSaturating(jnp.asarray(c.game.thetas), c.game.amplitude)
    cost = _cost(c)
    rewards = _rewards(c)
    e_max = _max_useful_effort(c, rewards)
    assumptions = bg.check_assumptions(curves, cost, rewards, bg.effort_grid(e_max + c.tbt.delta_max, 201))
    delta_star = bg.stabilizing_tbt_level(curves, cost, rewards, max_delta=max(10 * c.tbt.delta_max, 100.0))
    a, a_plot = _part_a(c, curves, cost, rewards, e_max, key_a)
    b, b_plot = _part_b(c, curves, cost, rewards, e_max, key_b, delta_star)
    cm, c_plot = _part_c(c)
    d, d_plot = _part_d(c, key_d)
    e = _part_e(c)

    dyn_a, dyn_b = a["dynamics"], b["tbt_dynamics"]
    lens = dyn_a["cycle_lengths"]
    grid_cause = f"scale limit (the {c.search.grid_points}-point effort grid discretizes the continuous game)"
    std_checks = [
        Check(f"standard protocol (delta=0): PNE among all {a['full_profiles_checked']:,} profiles of the "
              f"{c.search.full_grid_points}-point grid", a["num_pne_full"], "no PNE (Thm. 4.6)", "== 0",
              a["num_pne_full"] == 0),
        Check(f"standard protocol (delta=0): PNE found by the pruned search on the {c.search.grid_points}-point grid",
              a["num_pne_pruned"], "no PNE (Thm. 4.6)", "== 0", a["num_pne_pruned"] == 0),
        Check("Thm. 4.6 condition: min over ranks of c(e_req_r) - (R_{r-1} - R_r)",
              float(min(np.asarray(a["cost_e_req_delta0"]) - np.asarray(a["reward_gaps"]))),
              "c(e_req_r) < R_{r-1} - R_r for some r", "< 0", a["thm46_predicts_no_pne"]),
        Check("standard protocol: best-response starts that converge", dyn_a["num_converged"],
              "best responses cycle", f"== 0 of {dyn_a['num_starts']}", dyn_a["num_converged"] == 0),
        Check("standard protocol: every state on a best-response cycle is not a PNE", dyn_a["cycle_states_not_pne"],
              "cycling, no equilibrium", "True", dyn_a["cycle_states_not_pne"]),
    ]
    tbt_checks = [
        Check("tune-before-test: stabilizing level delta*", delta_star, "finite (Prop. 5.3)", "finite",
              math.isfinite(delta_star)),
        Check(f"tune-before-test at delta={b['tbt_delta']:.2f}: PNE among all {c.search.full_grid_points}-point grid "
              "profiles", b["tbt_num_pne_full"], "unique, zero effort", "exactly 1, the all-zero profile",
              b["tbt_pne_full_is_zero"]),
        Check("TbT sweep: the PNE is unique and zero-effort whenever one exists", b["sweep_unique_whenever_stable"],
              "unique zero-effort PNE", "True", b["sweep_unique_whenever_stable"]),
        Check("TbT sweep: the PNE ranks by quality whenever one exists", b["sweep_quality_order_whenever_stable"],
              "ranking by capability", "True", b["sweep_quality_order_whenever_stable"]),
        Check("TbT sweep: stability is monotone in delta (grid search)", b["sweep_stability_monotone_grid"],
              "stable for every delta >= delta*", "True", b["sweep_stability_monotone_grid"]),
        Check(f"TbT sweep: share of the {c.tbt.num_deltas} levels where the exhaustive search equals the grid theory",
              b["sweep_grid_theory_agreement"], "the theory's equilibria", "== 1",
              b["sweep_grid_theory_agreement"] == 1.0),
        Check(f"tune-before-test at delta={b['tbt_delta']:.2f}: best-response dynamics reach the quality-ordered "
              "zero profile", f"{dyn_b['num_converged']}/{dyn_b['num_starts']} converge",
              "convergence to the unique PNE", "every start", b["tbt_dynamics_all_reach_quality_order"]),
        Check("TbT sweep: no PNE below delta*", b["sweep_none_below_delta_star"], "unstable below delta*", "True",
              b["sweep_none_below_delta_star"]),
    ]
    slopes = {k: v["loglog_slope_upper_half"] for k, v in cm["by_cost_power"].items()}
    scaling_checks = [
        Check(f"Prop. 5.6: log-log slope of delta* vs reward gap ({k}, upper half of gaps)", s,
              f"polynomial, asymptote 1/p = {cm['by_cost_power'][k]['asymptotic_slope']:.2f}",
              f"|slope - {cm['by_cost_power'][k]['asymptotic_slope']:.2f}| < 0.15",
              math.isfinite(s) and abs(s - cm["by_cost_power"][k]["asymptotic_slope"]) < 0.15)
        for k, s in slopes.items()]
    std_ok = all(bool(ch.passed) for ch in std_checks)
    tbt_ok = all(bool(ch.passed) for ch in tbt_checks)
    scaling_ok = all(bool(ch.passed) for ch in scaling_checks)
    checks = std_checks + tbt_checks + scaling_checks
    causes = {ch.name: grid_cause for ch in std_checks + tbt_checks}
    causes[std_checks[2].name] = "doubtful spec part (the spec's instance does not meet Thm. 4.6's condition)"
    causes[tbt_checks[0].name] = "doubtful spec part (the spec's instance has no stabilizing level)"
    causes[tbt_checks[5].name] = "bug in our code (the exhaustive search and the grid theory must agree exactly)"
    for ch in scaling_checks:
        causes[ch.name] = f"scale limit (reward gaps up to {c.scaling.gap_max:g} may not reach the asymptote)"
    cause = "; ".join(f"{ch.name}: {causes[ch.name]}" for ch in checks if ch.required and not ch.passed)
    context = (
        f"Standard protocol (delta=0): best responses cycle from {dyn_a['num_cycling']}/{dyn_a['num_starts']} starts "
        f"(cycle {min(lens) if lens else 0}-{max(lens) if lens else 0} rounds), since "
        f"c(e_req)={min(a['cost_e_req_delta0']):.3f} < reward gap {min(a['reward_gaps']):g}. "
        f"Tune-before-test: delta*={delta_star:.3f}. "
        f"Synthetic Fig. 1 (made-up curves; paper {PAPER_FIG1_STEPS:,}): min catch-up at "
        f"TbT {c.fig1.tbt_level:g} is {d['true_min_catchup_at_tbt']:,.0f} steps (true curves), "
        f"{d['shared_U_beta_min_catchup_at_tbt']:,.0f} (shared-U fit), {d['per_model_min_catchup_at_tbt']:,.0f} "
        f"(per-model fit)."
    )
    verdict, reproduced = checks_lib.verdict(
        checks, claim="no pure equilibrium under the standard protocol (best responses cycle); tune-before-test "
        "above delta* gives a unique zero-effort equilibrium ranked by capability; delta* grows polynomially "
        "in the reward gap", context=context, cause=cause)
    plots = [_plot_standard(a_plot, c), _plot_tbt(b, b_plot, c), _plot_scaling(c_plot, c), _plot_fig1(d_plot, c)]
    metrics = {"assumptions_ok": assumptions.ok, "assumption_checks": assumptions.checks,
               "standard": a, "tbt": b, "scaling": cm, "fig1_synthetic": d, "flat_cost": e,
               "claims": {"standard_no_pne_and_cycling": bool(std_ok), "tbt_unique_quality_ordered": bool(tbt_ok),
                          "threshold_polynomial": bool(scaling_ok)},
               "checks": [ch.as_dict() for ch in checks],
               "wall_s": time.time() - t0}
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots}


def _plot_standard(p, c: Config) -> str:
    game, traj = p["game"], p["traj"]
    n = traj.shape[1]
    steps = min(traj.shape[0], 3 * 100 * n)
    eff = np.asarray(game.efforts)[traj[:steps]]
    scores = np.asarray(game.scores)[np.arange(n)[None, :], traj[:steps]]
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.4))
    for i in range(n):
        ax1.plot(eff[:, i], label=f"theta={c.game.thetas[i]:g}")
        ax2.plot(scores[:, i], label=f"theta={c.game.thetas[i]:g}")
    ax1.set(xlabel="best-response step", ylabel="effort e_i", title="delta = 0: best responses cycle")
    ax2.set(xlabel="best-response step", ylabel="score v(theta_i, e_i)", title="leaderboard scores")
    ax1.legend(fontsize=8)
    return report.savefig(fig, pathlib.Path(p.get("workdir", ".")) / "standard_cycle.png") if False else \
        _save(fig, "standard_cycle.png")


_WORKDIR: list[pathlib.Path] = []


def _save(fig, name: str) -> str:
    return report.savefig(fig, _WORKDIR[-1] / name)


def _plot_tbt(b, p, c: Config) -> str:
    deltas, rows, gaps = p["deltas"], p["rows"], p["gaps"]
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.4))
    c_req = np.array([r["cost_e_req"] for r in rows])
    for r in range(c_req.shape[1]):
        y = np.where(np.isfinite(c_req[:, r]), c_req[:, r], np.nan)
        ax1.plot(deltas, y, label=f"c(e_req), rank {r + 2} passing {r + 1}")
        ax1.axhline(gaps[r], ls=":", color=f"C{r}")
    ax1.axvline(b["delta_star"], color="k", ls="--", label=f"delta* = {b['delta_star']:.3f}")
    ax1.set(xlabel="TbT level delta", ylabel="cost of just overtaking", title="catch-up cost vs reward gap (dotted)",
            ylim=(0, 1.5 * max(gaps)))
    ax1.legend(fontsize=7)
    ax2.step(deltas, [r["num_pne"] for r in rows], where="mid", label="exhaustive grid search")
    ax2.plot(deltas, [1 if r["continuous_stable"] else 0 for r in rows], "o", ms=3, mfc="none",
             label="theory (continuous): all-zero is the PNE")
    ax2.axvline(b["delta_star"], color="k", ls="--")
    ax2.set(xlabel="TbT level delta", ylabel="number of pure equilibria", title="PNE count vs TbT", yticks=[0, 1])
    ax2.legend(fontsize=7)
    return _save(fig, "tbt_sweep.png")


def _plot_scaling(p, c: Config) -> str:
    fig, ax = plotting.subplots(figsize=(5, 3.4))
    for k, (pw, ds) in enumerate(p["curves"].items()):
        ax.loglog(p["gaps"], np.where(ds > 0, ds, np.nan), "o-", color=f"C{k}", label=f"c(e) = e^{pw:g}")
        ax.loglog(p["gaps"], np.maximum(p["gaps"] ** (1 / pw) / p["rho"] - 1, np.nan), ":", color=f"C{k}",
                  label=f"asymptote slope 1/{pw:g}")
    ax.set(xlabel="reward gap lambda", ylabel="stabilizing TbT level delta*", title="Prop. 5.6: polynomial threshold")
    ax.legend(fontsize=7)
    return _save(fig, "threshold_scaling.png")


def _plot_fig1(p, c: Config) -> str:
    steps, obs = p["steps"], p["obs"]
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.4))
    xs = np.linspace(0, steps[-1], 200)
    m = obs.shape[0]
    true_y = np.asarray(p["true"](jnp.broadcast_to(jnp.asarray(xs), (m, xs.shape[0]))))
    fit_y = np.asarray(p["fits"]["per_model"](jnp.broadcast_to(jnp.asarray(xs), (m, xs.shape[0]))))
    for i in range(m):
        ax1.plot(steps, obs[i], ".", color=f"C{i}", ms=3)
        ax1.plot(xs, true_y[i], "-", color=f"C{i}", lw=0.8, label=c.fig1.models[i])
        ax1.plot(xs, fit_y[i], "--", color=f"C{i}", lw=0.8)
    ax1.set(xlabel="post-training steps", ylabel="accuracy", title="synthetic curves (-), per-model fits (--)")
    ax1.legend(fontsize=7)
    for name, ys in p["series"].items():
        ax2.semilogy(p["tbt"], np.where(np.isfinite(ys), ys, np.nan), label=name)
    ax2.plot([p["tbt"][-1]], [PAPER_FIG1_STEPS], "r*", ms=9, label="paper (Winogrande, real data)")
    ax2.set(xlabel="TbT steps", ylabel="min adjacent catch-up effort", title="catch-up effort vs TbT level")
    ax2.legend(fontsize=7)
    return _save(fig, "fig1_synthetic.png")


def _run(c: Config, workdir: pathlib.Path) -> dict:
    _WORKDIR.append(epath.Path(workdir))
    try:
        return run(c, workdir)
    finally:
        _WORKDIR.pop()


EXPERIMENT = registry.Experiment(
    slug="benchmark_game",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(search=SearchConfig(full_grid_points=13, grid_points=41, dynamics_rounds=60,
                                                    num_starts=3),
                                tbt=TbTConfig(num_deltas=3), scaling=ScalingConfig(num_gaps=3),
                                fig1=Fig1Config(checkpoints=11, num_tbt=2, fit_iters=40),
                                flat=FlatCostConfig(grid_points=11), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(search=SearchConfig(full_grid_points=101, grid_points=1001, dynamics_rounds=1200,
                                                    num_starts=64),
                                tbt=TbTConfig(num_deltas=61), scaling=ScalingConfig(num_gaps=16),
                                fig1=Fig1Config(fit_iters=1000), flat=FlatCostConfig(grid_points=81)),
    },
    run=_run,
)
