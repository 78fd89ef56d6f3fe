"""Drift-diffusion response times under external signals: closed-form FPT approximation, timing, watch time.

Paper: "Approximating Drift-Diffusion Models for User Decisions under Nudging and External Information"
(ICML 2026; arXiv id not known). Only the abstract was available; the closed form is the tangent-line
(high-threshold) approximation reconstructed in the spec (`primitives.drift_diffusion`).

Three studies (spec section 7 (d)):

1. Accuracy: sup_t |F_hat(t) - F(t)| and int |f_hat - f| of the closed form against the Volterra
   integral equation (float64 ground truth, its own discretisation error reported from n vs n/2 points)
   over thresholds a = 1 ... 256, for drift shapes whose times scale with a (step up/down, pulse, decay,
   transient bump, sinusoid). Also the spec's numerical anchors (step 0.5 -> 1.0 at a/2, a = 3 and 8).

   The statement tested is the spec's section 7: the paper derives a closed form "valid when a is large"
   (7(a)), the tangent-line approximation being "asymptotically exact as a -> inf" (7(b)). On a finite
   grid of a its observable consequence is an error that eventually decreases: for every shape and both
   error measures, the error has its peak below the largest a and does not rise again past that peak
   (beyond the resolution: the integral equation's own discretisation error, n vs n/2 points, plus the
   float32 closed form's rounding, int |f_hat_32 - f_hat_64|, which is the floor of the step shapes'
   density error, about 3e-7, at a >= 64), and the error at the largest a is below the peak by more
   than that resolution (`high_threshold_trend`). Issue 33: the earlier rule (error at
   a = 16 below a = 1 for every shape) sat on the sinusoid's hump (its period equals a, so its sup error
   is 0.026 / 0.018 / 0.030 / 0.019 / 0.014 at a = 1 / 4 / 16 / 64 / 256): it asked for a decrease at a
   fixed moderate a, which the asymptotic statement does not say.
2. Optimal timing: tau* maximising the closed-form P(T <= H) (grid + autodiff refinement) against the
   Monte-Carlo optimum (bridge-corrected Euler, common random numbers over a tau grid); regret = the
   response probability lost by using tau*_approx, absolute and relative to the range over tau.
3. Watch-time environment: heterogeneous users, logged signals, censoring at the video length; per-user
   maximum likelihood with the closed form (signals in the drift) against a constant-drift inverse
   Gaussian fit, scored on held-out sessions (NLL, CRPS, MAE of the median, Brier/ECE of T <= H), with
   the true parameters (under the closed form) as an oracle row.

Recipe:
    python -m experiments run ddm_signals --preset smoke   # seconds, used by the tests
    python -m experiments run ddm_signals --preset quick   # 2 CPU cores, about 2-3 minutes
    python -m experiments run ddm_signals --preset paper   # larger grids, more paths and users
    python -m experiments run ddm_signals --preset smoke --timing.paths 4000   # one field of a config section

Config sections (`run ddm_signals --help` lists every field): accuracy, timing, watch_time (flags
`--watch-time.*`); seed, studies and progress stay top-level.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from algorithms.optimization import drift_diffusion as ddo
from experiments import _plotting as plotting
from experiments import registry, report
from experiments.checks import Check
from experiments.checks import verdict as verdict_from_checks
from primitives import drift_diffusion as dd

SHAPES = ("step_up", "step_down", "pulse", "decay", "transient", "sinusoid")
STUDIES = ("accuracy", "timing", "watch_time")

# The spec's Monte-Carlo table (Euler dt = 2e-3 + bridge, 20k paths; step 0.5 -> 1.0 at tau = a / 2, sigma = 1).
SPEC_ANCHORS = {
    3.0: {"t": (1.5, 3.0, 4.5, 6.0, 9.0), "mc": (.0548, .4219, .7342, .8853, .9801),
          "approx": (.0552, .4262, .7348, .8887, .9850)},
    8.0: {"t": (4.0, 8.0, 12.0, 16.0, 24.0), "mc": (.0018, .2867, .7700, .9535, .9989),
          "approx": (.0022, .2877, .7703, .9529, .9990)},
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class AccuracySection:
    """Study 1: the closed form against the integral equation (``--accuracy.thresholds 1 4 16``)."""

    thresholds: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0, 256.0)  # >= 2, strictly increasing
    shapes: tuple[str, ...] = SHAPES
    volterra_points: int = 3000
    anchors: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimingSection:
    """Study 2: optimal signal timing (a, kernel width and H scale together: width = widths * a, H = horizons *
    a / mu0) (``--timing.paths 50000``)."""

    thresholds: tuple[float, ...] = (4.0, 16.0)
    kernels: tuple[str, ...] = ("decay", "transient")
    widths: tuple[float, ...] = (0.25, 1.25)  # kernel width / a; at a = 4 the spec's kappa = 1, 5
    horizons: tuple[float, ...] = (1.0, 2.0)  # H in units of a / mu0
    mu0: float = 0.5
    displacement: float = 0.25  # beta * width, in units of a
    grid: int = 41
    paths: int = 20_000
    dt: float = 0.005  # Euler step, in units of a
    max_rel_regret: float = 0.1  # reproduced if the median relative regret at the largest a is below


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchTimeSection:
    """Study 3: the watch-time environment and the per-user fits (``--watch-time.num-users 200``)."""

    num_users: int = 60
    train_sessions: int = 40
    test_sessions: int = 20
    max_signals: int = 3
    video_length: float = 20.0
    kernel: str = "decay"
    width: float = 3.0
    dt: float = 0.01
    lapse: float = 0.02
    fit_iters: int = 600
    event_horizon: float = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """ddm_signals settings, in sections overridden on the command line as ``--timing.grid 21``."""

    seed: int = 0
    # Which studies run (smoke skips the watch-time fit, whose compilation alone exceeds its budget).
    studies: tuple[str, ...] = ("accuracy", "timing", "watch_time")
    accuracy: AccuracySection = AccuracySection()
    timing: TimingSection = TimingSection()
    watch_time: WatchTimeSection = WatchTimeSection()
    progress: bool = True

    def __post_init__(self):
        err, acc = registry.ConfigError, self.accuracy
        unknown = [s for s in self.studies if s not in STUDIES]
        if unknown or not self.studies:
            raise err("studies", f"must be a non-empty subset of {STUDIES}; got {self.studies}")
        bad = [s for s in acc.shapes if s not in SHAPES]
        if bad:
            raise err("accuracy.shapes", f"must be drawn from {SHAPES}; got unknown {bad}")
        if len(acc.thresholds) < 2 or any(x >= y for x, y in zip(acc.thresholds, acc.thresholds[1:])):
            raise err("accuracy.thresholds", f"needs >= 2 strictly increasing values; got {acc.thresholds}")
        bad = [k for k in self.timing.kernels if k not in dd.KERNELS]
        if bad or not self.timing.kernels:
            raise err("timing.kernels", f"must be a non-empty subset of {dd.KERNELS}; got {self.timing.kernels}")
        if self.timing.grid < 2:
            raise err("timing.grid", f"must be >= 2 (candidate signal times on [0, H]); got {self.timing.grid}")
        if self.watch_time.kernel not in dd.KERNELS:
            raise err("watch_time.kernel", f"must be one of {dd.KERNELS}; got {self.watch_time.kernel!r}")


# ----------------------------------------------------------------------------------------------------
# 1. Accuracy.
# ----------------------------------------------------------------------------------------------------


def _shape_spec(shape: str, a: float) -> dict:
    """Drift shapes with time scale a (so a -> inf is the high-threshold limit); sigma = 1."""
    if shape == "step_up":
        return dict(mu0=0.5, tau=a / 2, beta=0.5, kind="step", width=1.0)
    if shape == "step_down":
        return dict(mu0=1.0, tau=a / 2, beta=-0.5, kind="step", width=1.0)
    if shape == "pulse":
        return dict(mu0=0.5, tau=a / 2, beta=1.0, kind="pulse", width=a / 2)
    if shape == "decay":
        return dict(mu0=0.5, tau=a / 4, beta=1.0, kind="decay", width=a / 2)
    if shape == "transient":
        return dict(mu0=0.5, tau=a / 4, beta=0.5, kind="transient", width=a / 2)
    if shape == "sinusoid":
        return dict(mu0=0.5, amp=0.25, period=a)
    raise ValueError(f"unknown drift shape {shape!r}; choose from {SHAPES}")


def _drift_on_grid(shape: str, a: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    spec = _shape_spec(shape, a)
    if shape == "sinusoid":
        w = 2 * np.pi / spec["period"]
        mu = spec["mu0"] + spec["amp"] * np.sin(w * t)
        cum = spec["mu0"] * t + spec["amp"] / w * (1 - np.cos(w * t))
        return mu, cum
    with jax.enable_x64(True):
        mu, cum = dd.signal_drift(jnp.asarray(t), spec["mu0"], jnp.array([spec["tau"]]), spec["beta"],
                                  kind=spec["kind"], width=spec["width"])
        return np.asarray(mu), np.asarray(cum)


_tangent_cdf = jax.jit(dd.signal_tangent_cdf, static_argnames=("kind", "num_nodes", "num_panels", "num_graded"))


def _approx_cdf_on_grid(shape: str, a: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(F_hat, f_hat) on the grid: quadrature broken at the jumps for kernels, trapezoid for the sinusoid."""
    mu, cum = _drift_on_grid(shape, a, t)
    f = np.asarray(dd.tangent_pdf(jnp.asarray(t, jnp.float32), a, 1.0, jnp.asarray(cum, jnp.float32),
                                  jnp.asarray(mu, jnp.float32)), np.float64)
    if shape == "sinusoid":
        return np.concatenate([[0.0], np.cumsum(0.5 * (f[1:] + f[:-1]) * np.diff(t))]), f
    spec = _shape_spec(shape, a)
    cdf = _tangent_cdf(jnp.asarray(t, jnp.float32), a, 1.0, spec["mu0"], jnp.array([spec["tau"]], jnp.float32),
                       spec["beta"], kind=spec["kind"], width=spec["width"])
    return np.asarray(cdf, np.float64), f


def _volterra_cdf(shape: str, a: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, cum = _drift_on_grid(shape, a, t)
    g = dd.volterra_fpt_density(t, a, 1.0, cum, mu)
    return np.concatenate([[0.0], np.cumsum(0.5 * (g[1:] + g[:-1]) * np.diff(t))]), g


def _tangent_pdf64(a: float, t: np.ndarray, mu: np.ndarray, cum: np.ndarray) -> np.ndarray:
    """The tangent-line density (spec 7(b), sigma = 1) in float64 numpy, clipped at 0 like `dd.tangent_pdf`."""
    ts = np.where(t > 0, t, 1.0)
    pref = a - cum + t * mu
    f = pref / np.sqrt(2 * np.pi * ts ** 3) * np.exp(-(a - cum) ** 2 / (2 * ts))
    return np.where((t > 0) & (pref > 0), f, 0.0)


def accuracy_study(c: Config, bar) -> dict:
    rows = {}
    for shape in c.accuracy.shapes:
        rows[shape] = {"a": [], "sup_cdf_error": [], "l1_density_error": [], "reference_error": [],
                       "reference_l1_error": [], "closed_form_l1_error": [], "approx_mass": [], "true_mass": [],
                       "clipped_true_mass": []}
        for a in c.accuracy.thresholds:
            t_max = 6.0 * a + 24.0
            n = c.accuracy.volterra_points
            t = np.linspace(0.0, t_max, n + 1)
            F, g = _volterra_cdf(shape, a, t)
            F_half, g_half = _volterra_cdf(shape, a, t[::2])
            F_hat, f_hat = _approx_cdf_on_grid(shape, a, t)
            mu, cum = _drift_on_grid(shape, a, t)
            pref = a - cum + t * mu
            r = rows[shape]
            r["a"].append(a)
            r["sup_cdf_error"].append(float(np.max(np.abs(F_hat - F))))
            r["l1_density_error"].append(float(np.sum(0.5 * (np.abs(f_hat - g)[1:] + np.abs(f_hat - g)[:-1])
                                                      * np.diff(t))))
            r["reference_error"].append(float(np.max(np.abs(F[::2] - F_half))))
            dg = np.abs(g[::2] - g_half)  # the density's discretisation error, on the coarse grid
            r["reference_l1_error"].append(float(np.sum(0.5 * (dg[1:] + dg[:-1]) * np.diff(t[::2]))))
            # The closed form's own float32 rounding (against the same formula in float64), its resolution.
            df = np.abs(f_hat - _tangent_pdf64(a, t, mu, cum))
            r["closed_form_l1_error"].append(float(np.sum(0.5 * (df[1:] + df[:-1]) * np.diff(t))))
            r["approx_mass"].append(float(F_hat[-1]))
            r["true_mass"].append(float(F[-1]))
            clipped = (pref < 0).astype(float) * g  # true density where the closed form is clipped to 0
            r["clipped_true_mass"].append(float(np.sum(0.5 * (clipped[1:] + clipped[:-1]) * np.diff(t))))
            bar.update(1)
    return rows


def high_threshold_trend(errors, resolution) -> dict:
    """Whether an error sequence over increasing thresholds a decreases past its peak (the high-threshold limit).

    With e_k the error and r_k the reference's own error (its resolution) at the k-th threshold, and k* the
    index of the largest e_k, the sequence passes when (i) k* is not the last threshold, (ii) no step after
    the peak rises by more than the two references' resolution, e_{k+1} <= e_k + r_k + r_{k+1} for k >= k*,
    and (iii) the error at the largest a is below the peak by more than that resolution,
    e_last < e_{k*} - r_{k*} - r_last. Steps before the peak are free (a hump at moderate a is allowed by
    an asymptotic statement).

    Args:
      errors: e, shape (K,) with K >= 2, over increasing thresholds.
      resolution: r >= 0, shape (K,): the reference's error at the same thresholds.

    Returns:
      ``{"passed", "peak_index", "rises" (indices k + 1 of the rising steps after the peak),
      "drop" (e_{k*} - e_last)}``.

    Raises:
      ValueError: if the shapes differ, K < 2, or a value is negative or not finite.
    """
    e, r = np.asarray(errors, np.float64), np.asarray(resolution, np.float64)
    if e.ndim != 1 or e.shape[0] < 2 or r.shape != e.shape:
        raise ValueError(f"errors and resolution must be 1-D of the same length >= 2; got shapes {e.shape}, {r.shape}")
    if not (np.all(np.isfinite(e)) and np.all(np.isfinite(r)) and np.all(e >= 0) and np.all(r >= 0)):
        raise ValueError(f"errors and resolution must be finite and >= 0; got {e.tolist()}, {r.tolist()}")
    peak, last = int(np.argmax(e)), e.shape[0] - 1
    rises = [k + 1 for k in range(peak, last) if e[k + 1] > e[k] + r[k] + r[k + 1]]
    drop = float(e[peak] - e[last])
    passed = peak < last and not rises and drop > r[peak] + r[last]
    return {"passed": bool(passed), "peak_index": peak, "rises": rises, "drop": drop}


def anchor_study() -> dict:
    out = {}
    for a, spec in SPEC_ANCHORS.items():
        ts = np.asarray(spec["t"])
        approx = np.asarray(dd.signal_tangent_cdf(jnp.asarray(ts, jnp.float32), a, 1.0, 0.5, jnp.array([a / 2]), 0.5,
                                                  kind="step"), np.float64)
        t = np.linspace(0.0, 6 * a + 24, 4001)
        F, _ = _volterra_cdf("step_up", a, t)
        exact = np.interp(ts, t, F)
        mc_se = np.sqrt(np.asarray(spec["mc"]) * (1 - np.asarray(spec["mc"])) / 20_000)
        out[str(a)] = {"t": ts.tolist(), "ours_approx": approx.tolist(), "volterra": exact.tolist(),
                       "spec_approx": list(spec["approx"]), "spec_mc": list(spec["mc"]),
                       "max_abs_vs_spec_approx": float(np.max(np.abs(approx - np.asarray(spec["approx"])))),
                       "max_z_volterra_vs_spec_mc": float(np.max(np.abs(exact - np.asarray(spec["mc"])) /
                                                                 np.maximum(mc_se, 1e-4)))}
    return out


# ----------------------------------------------------------------------------------------------------
# 2. Optimal timing.
# ----------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("kind",))
def _approx_curve(cand, params, horizon, width, *, kind):
    return jax.vmap(lambda x: ddo.response_probability(x, params, horizon, kind=kind, width=width))(cand)


def timing_study(c: Config, key, bar) -> list[dict]:
    tc = c.timing
    rows = []
    for a in tc.thresholds:
        for kind in tc.kernels:
            for w_rel in tc.widths:
                for h_rel in tc.horizons:
                    width = w_rel * a
                    horizon = h_rel * a / tc.mu0
                    beta = tc.displacement * a / width
                    params = ddo.DDMParams(a=jnp.float32(a), mu0=jnp.float32(tc.mu0), beta=jnp.float32(beta),
                                           sigma=jnp.float32(1.0))
                    res = ddo.optimal_signal_times(params, horizon, kind=kind, width=width,
                                                   grid_size=max(4 * tc.grid, 101))
                    tau_approx = float(res.tau[0])
                    grid = np.linspace(0.0, horizon, tc.grid)
                    cand = jnp.asarray(np.concatenate([grid, [tau_approx]]), jnp.float32)[:, None]
                    key, sub = jax.random.split(key)
                    prob, se = (np.asarray(x, np.float64) for x in ddo.mc_response_probability(
                        sub, cand, params, horizon, kind=kind, width=width, dt=tc.dt * a,
                        num_paths=tc.paths))
                    approx_curve = np.asarray(_approx_curve(cand, params, jnp.float32(horizon), jnp.float32(width),
                                                            kind=kind), np.float64)
                    i_best = int(np.argmax(prob[:-1]))
                    span = float(prob[:-1].max() - prob[:-1].min())
                    regret = float(max(prob[i_best] - prob[-1], 0.0))
                    rows.append({
                        "a": a, "kernel": kind, "width": width, "horizon": horizon, "beta": beta,
                        "tau_approx": tau_approx, "tau_mc": float(grid[i_best]),
                        "p_mc_best": float(prob[i_best]), "p_mc_at_tau_approx": float(prob[-1]),
                        "p_approx_at_tau_approx": float(res.value), "se": float(se[-1]),
                        "regret": regret, "tau_range_gain": span, "rel_regret": regret / max(span, 1e-12),
                        "max_abs_approx_minus_mc": float(np.max(np.abs(approx_curve[:-1] - prob[:-1]))),
                        "grid": grid.tolist(), "mc_curve": prob[:-1].tolist(), "mc_se": se[:-1].tolist(),
                        "approx_curve": approx_curve[:-1].tolist(),
                    })
                    bar.update(1)
    return rows


# ----------------------------------------------------------------------------------------------------
# 3. Watch-time environment.
# ----------------------------------------------------------------------------------------------------


def watch_time_study(c: Config, key, bar) -> dict:
    w = c.watch_time
    k_users, k_sess = jax.random.split(key)
    users = ddo.sample_users(k_users, w.num_users)
    sessions = ddo.simulate_sessions(k_sess, users, num_sessions=w.train_sessions + w.test_sessions,
                                     max_signals=w.max_signals, video_length=w.video_length, kind=w.kernel,
                                     width=w.width, dt=w.dt)
    train, test = ddo.split_sessions(sessions, w.train_sessions)
    bar.update(1)
    kw = dict(kind=w.kernel, width=w.width)
    fitted, scores, history = {}, {}, {}
    for model in ddo.MODELS:
        params, hist = ddo.fit_users(train, model=model, lapse=w.lapse, num_iters=w.fit_iters, **kw)
        fitted[model] = params
        history[model] = np.asarray(hist).tolist()
        scores[model] = ddo.evaluate_predictions(params, test, model=model, event_horizon=w.event_horizon,
                                                 lapse=w.lapse, **kw)
        bar.update(1)
    oracle = ddo.DDMParams(a=users.a / users.sigma, mu0=users.mu0 / users.sigma, beta=users.beta / users.sigma,
                           sigma=jnp.ones_like(users.a))
    scores["oracle"] = ddo.evaluate_predictions(oracle, test, model="tangent", event_horizon=w.event_horizon,
                                                lapse=w.lapse, **kw)
    bar.update(1)
    rec = {}
    for name in ("a", "mu0", "beta"):
        x, y = np.asarray(getattr(fitted["tangent"], name)), np.asarray(getattr(oracle, name))
        rec[f"corr_{name}"] = float(np.corrcoef(x, y)[0, 1]) if x.size > 1 else math.nan
    # Calibration curve data for the plot.
    calib = {}
    for model, params in (("tangent", fitted["tangent"]), ("constant", fitted["constant"]), ("oracle", oracle)):
        p = np.asarray(ddo.event_probability(params, test, w.event_horizon, model="constant" if model == "constant"
                                             else "tangent", **kw)).ravel()
        obs = np.asarray((test.time <= w.event_horizon) & ~test.censored).ravel()
        idx = np.minimum((p * 10).astype(int), 9)
        calib[model] = [(float(p[idx == b].mean()), float(obs[idx == b].mean()), int((idx == b).sum()))
                        for b in range(10) if (idx == b).any()]
    return {"scores": scores, "recovery": rec, "censored_fraction": float(np.mean(np.asarray(sessions.censored))),
            "mean_watch_time": float(np.mean(np.asarray(sessions.time))), "fit_history": history,
            "calibration": calib}


# ----------------------------------------------------------------------------------------------------
# Run, verdict, plots.
# ----------------------------------------------------------------------------------------------------


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    out = []
    acc = metrics.get("accuracy") or {}
    if acc:
        a = next(iter(acc.values()))["a"]
        out.append(f"CDF error vs Volterra a={a[0]:g}->{a[-1]:g}: " + ", ".join(
            f"{sh} {r['sup_cdf_error'][0]:.2g}->{r['sup_cdf_error'][-1]:.2g}" for sh, r in acc.items()))
    if "timing_median_rel_regret_max_a" in metrics:
        a_max = max(r["a"] for r in metrics["timing"])
        out.append(f"timing regret {metrics['timing_median_rel_regret_max_a']:.0%} at a={a_max:g}")
    if "nll_tangent" in metrics:
        out.append(f"watch-time NLL {metrics['nll_tangent']:.3f} vs {metrics['nll_constant']:.3f} constant drift")
    return "; ".join(out)


def _cause(c: Config, accuracy: dict, metrics: dict, env: dict | None) -> tuple[str | None, str]:
    """The cause class (a key of `experiments.checks.CAUSES`) and its evidence, from the failing studies.

    Accuracy: the error still at its peak at the largest a is a scale limit (the grid of a ends on the hump);
    an error that rises again past its peak contradicts the asymptotic statement for the reconstructed closed
    form (spec). Timing: a regret shrinking with a (or one a only) is a scale limit, else spec. Watch time:
    a scale limit when the closed form with the true parameters (oracle) beats the constant drift, else spec.
    The first failing study names the class; the text lists every failing study.
    """
    found = []
    if accuracy and not metrics.get("accuracy_ok", True):
        for measure in ("sup_cdf_error", "l1_density_error"):
            for sh, v in metrics[f"accuracy_trend_{measure}"].items():
                if v["passed"]:
                    continue
                errs = "/".join(f"{x:.2g}" for x in accuracy[sh][measure])
                at_end = v["peak_index"] == len(accuracy[sh]["a"]) - 1
                found.append(("scale" if at_end and not v["rises"] else "spec",
                              f"{sh} {measure} {errs} over a={accuracy[sh]['a']} "
                              + ("peaks at the largest a" if at_end else f"rises past its peak at steps {v['rises']}")))
    if "timing_ok" in metrics and not metrics["timing_ok"]:
        lo, hi = metrics["timing_median_rel_regret_min_a"], metrics["timing_median_rel_regret_max_a"]
        one_a = len(set(c.timing.thresholds)) == 1  # no trend over a to tell a scale limit from the spec's
        found.append(("scale" if hi < lo or one_a else "spec",
                      f"median relative timing regret {lo:.0%} at a={min(c.timing.thresholds):g} -> {hi:.0%} at "
                      f"a={max(c.timing.thresholds):g}"
                      + (f" (one threshold, {c.timing.paths} paths)" if one_a else "")))
    if env is not None and not metrics.get("env_ok", True):
        o, k = metrics["nll_oracle"], metrics["nll_constant"]
        found.append(("scale" if o < k else "spec",
                      f"watch-time NLL fitted {metrics['nll_tangent']:.3f}, oracle {o:.3f}, constant drift {k:.3f} "
                      f"({c.watch_time.num_users} users x {c.watch_time.train_sessions} sessions)"))
    if not found:
        return None, ""
    return found[0][0], "; ".join(f"{text} ({cls})" for cls, text in found)


def run(c: Config, workdir: pathlib.Path) -> dict:
    key = jax.random.key(c.seed)
    k_timing, k_env = jax.random.split(key)
    n_timing = len(c.timing.thresholds) * len(c.timing.kernels) * len(c.timing.widths) * len(c.timing.horizons)
    total = (len(c.accuracy.shapes) * len(c.accuracy.thresholds) * ("accuracy" in c.studies)
             + n_timing * ("timing" in c.studies) + 4 * ("watch_time" in c.studies))
    with tqdm(total=total, desc="ddm_signals", disable=not c.progress) as bar:
        accuracy = accuracy_study(c, bar) if "accuracy" in c.studies else {}
        anchors = anchor_study() if c.accuracy.anchors and "accuracy" in c.studies else {}
        timing = timing_study(c, k_timing, bar) if "timing" in c.studies else []
        env = watch_time_study(c, k_env, bar) if "watch_time" in c.studies else None

    checks, parts = [], []
    metrics = {"accuracy": accuracy, "anchors": anchors, "timing": timing, "watch_time": env}
    if accuracy:
        # Spec 7(a)/(b): the closed form is "valid when a is large", "asymptotically exact as a -> inf":
        # past its peak over the a grid the error falls, for every shape and both measures.
        a_lo, a_hi = c.accuracy.thresholds[0], c.accuracy.thresholds[-1]
        # Resolution: the integral equation's n vs n/2 error plus the closed form's float32 rounding.
        for measure, ref_key, label in (("sup_cdf_error", "reference_error", "sup|F_hat-F|"),
                                        ("l1_density_error", "reference_l1_error", "int|f_hat-f|")):
            trend = {sh: high_threshold_trend(r[measure], np.add(r[ref_key], r["closed_form_l1_error"]))
                     for sh, r in accuracy.items()}
            failing = [sh for sh, v in trend.items() if not v["passed"]]
            txt = ", ".join(
                f"{sh} " + "/".join(f"{x:.2g}" for x in r[measure]) + f" (peak a={r['a'][trend[sh]['peak_index']]:g})"
                for sh, r in accuracy.items())
            checks.append(Check(
                f"closed-form FPT error vs the integral equation, {label} over a={a_lo:g}..{a_hi:g}", measured=txt,
                paper="closed form valid when a is large, asymptotically exact as a -> inf (spec 7(a), 7(b))",
                threshold="for every shape: peak below the largest a, no rise past the peak and the largest a's "
                          "error below the peak (both beyond the integral equation's n vs n/2 error plus the "
                          "closed form's float32 rounding)",
                passed=not failing,
                note="decreases past its peak for every shape" if not failing else f"does NOT for {failing}"))
            metrics[f"accuracy_trend_{measure}"] = trend
        acc_checks = checks[-2:]
        if anchors:
            dev = max(v["max_abs_vs_spec_approx"] for v in anchors.values())
            parts.append(f"The spec's approximation anchors are matched to {dev:.1e}.")
        metrics["accuracy_ok"] = all(ch.passed for ch in acc_checks)
    if timing:
        a_max, a_min = max(c.timing.thresholds), min(c.timing.thresholds)
        rel_max = [r["rel_regret"] for r in timing if r["a"] == a_max]
        rel_min = [r["rel_regret"] for r in timing if r["a"] == a_min]
        abs_max = [r["regret"] for r in timing if r["a"] == a_max]
        median_rel_max, median_rel_min = float(np.median(rel_max)), float(np.median(rel_min))
        wrong_type = [r for r in timing if (r["tau_mc"] == 0.0) != (r["tau_approx"] < 1e-6)]
        checks.append(Check(
            f"timing: median regret of tau*_approx relative to the timing gain at a={a_max:g}", median_rel_max,
            paper="closed-form optimal timing near the Monte-Carlo optimum",
            threshold=f"<= {c.timing.max_rel_regret:g}", passed=median_rel_max <= c.timing.max_rel_regret,
            note=f"{median_rel_min:.0%} at a={a_min:g}; max absolute regret {max(abs_max):.4f}"))
        parts.append(
            f"Timing: {len(wrong_type)}/{len(timing)} configs put tau*_approx at the wrong kind of optimum (boundary "
            f"tau=0 vs interior; for non-negative kernels the exact optimum is tau=0 by pathwise dominance).")
        metrics.update(timing_ok=checks[-1].passed, timing_median_rel_regret_max_a=median_rel_max,
                       timing_median_rel_regret_min_a=median_rel_min, timing_wrong_type=len(wrong_type))
    if env is not None:
        s = env["scores"]
        checks += [
            Check("watch time: held-out NLL, signals in the drift (closed form)", s["tangent"]["nll"],
                  paper="signals in the drift fit watch time better than a constant drift",
                  threshold=f"< constant-drift NLL {s['constant']['nll']:.3f}",
                  passed=s["tangent"]["nll"] < s["constant"]["nll"], note=f"oracle {s['oracle']['nll']:.3f}"),
            Check("watch time: held-out CRPS, signals in the drift (closed form)", s["tangent"]["crps"],
                  paper="signals in the drift fit watch time better than a constant drift",
                  threshold=f"< constant-drift CRPS {s['constant']['crps']:.3f}",
                  passed=s["tangent"]["crps"] < s["constant"]["crps"]),
        ]
        parts.append(f"Watch time Brier {s['tangent']['brier']:.4f} (signals in the drift) vs "
                     f"{s['constant']['brier']:.4f} (constant drift).")
        metrics.update(env_ok=checks[-1].passed and checks[-2].passed, nll_tangent=s["tangent"]["nll"],
                       nll_constant=s["constant"]["nll"], nll_oracle=s["oracle"]["nll"],
                       crps_tangent=s["tangent"]["crps"], crps_constant=s["constant"]["crps"])
    skipped = [x for x in STUDIES if x not in c.studies]
    claim = "the tangent-line closed form approximates the FPT law, its optimal timing and watch time"
    cause_class, cause = _cause(c, accuracy, metrics, env)
    verdict, reproduced = verdict_from_checks(checks, claim=claim, context=" ".join(parts), cause=cause,
                                              cause_class=cause_class)
    if skipped:  # a partial run decides nothing: replace the head
        head = f"{'Reproduced' if reproduced else 'Not reproduced'}: {claim}."
        outcome = "no check failed" if reproduced else "some check failed"
        verdict = f"Partial run (skipped {skipped}); {outcome}." + verdict.removeprefix(head)
        reproduced = None
    metrics["checks"] = [ch.as_dict() for ch in checks]
    plots = []
    if accuracy:
        plots.append(_plot_accuracy(accuracy, workdir))
    if timing:
        plots.append(_plot_timing(timing, workdir))
    if env is not None:
        plots.append(_plot_watch_time(env, workdir))
    if anchors:
        plots.append(_plot_anchors(anchors, workdir))
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots,
            "cause": None if reproduced or reproduced is None else cause_class}


def _plot_accuracy(accuracy, workdir):
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.6))
    for shape, r in accuracy.items():
        (line,) = ax1.loglog(r["a"], r["sup_cdf_error"], "o-", label=shape)
        ax1.loglog(r["a"], np.maximum(r["reference_error"], 1e-12), ":", color=line.get_color(), alpha=0.6)
        ax2.loglog(r["a"], r["l1_density_error"], "o-", label=shape, color=line.get_color())
        ax2.loglog(r["a"], np.maximum(r["reference_l1_error"], 1e-12), ":", color=line.get_color(), alpha=0.6)
    ax1.set(xlabel="threshold a (times scale with a)", ylabel="sup |F_hat - F_volterra|",
            title="closed form vs integral equation\n(dotted: integral-equation n vs n/2)")
    ax2.set(xlabel="threshold a", ylabel="int |f_hat - f|", title="density L1 error\n(dotted: n vs n/2)")
    ax1.legend(fontsize=7)
    return report.savefig(fig, workdir / "accuracy.png")


def _plot_anchors(anchors, workdir):
    fig, axes = plotting.subplots(1, len(anchors), figsize=(4.5 * len(anchors), 3.4))
    for ax, (a, v) in zip(np.atleast_1d(axes), anchors.items()):
        ax.plot(v["t"], v["volterra"], "k-", label="integral equation")
        ax.plot(v["t"], v["ours_approx"], "o--", label="closed form (ours)")
        ax.plot(v["t"], v["spec_mc"], "x", label="spec MC (20k paths)")
        ax.set(xlabel="t", ylabel="P(T <= t)", title=f"step 0.5 -> 1.0 at a/2, a = {a}")
        ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "anchors.png")


def _plot_timing(timing, workdir):
    n = len(timing)
    cols = min(4, n)
    rows = int(math.ceil(n / cols))
    fig, axes = plotting.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    for ax, r in zip(axes.ravel(), timing):
        g, mc, se = np.asarray(r["grid"]), np.asarray(r["mc_curve"]), np.asarray(r["mc_se"])
        ax.fill_between(g, mc - 2 * se, mc + 2 * se, color="C0", alpha=0.3)
        ax.plot(g, mc, "C0-", label="Monte Carlo")
        ax.plot(g, r["approx_curve"], "C1--", label="closed form")
        ax.axvline(r["tau_mc"], color="C0", lw=0.8)
        ax.axvline(r["tau_approx"], color="C1", lw=0.8, ls="--")
        ax.set_title(f"{r['kernel']} a={r['a']:g} w={r['width']:g} H={r['horizon']:g}\n"
                     f"rel. regret {r['rel_regret']:.0%}", fontsize=8)
        ax.set_xlabel("signal time tau", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    axes[0, 0].set_ylabel("P(T <= H)")
    axes[0, 0].legend(fontsize=7)
    return report.savefig(fig, workdir / "timing.png")


def _plot_watch_time(env, workdir):
    s = env["scores"]
    models = ["tangent", "constant", "oracle"]
    fig, axes = plotting.subplots(1, 5, figsize=(15, 3.2))
    for ax, metric in zip(axes[:4], ["nll", "crps", "mae_median", "brier"]):
        vals = [s[m][metric] for m in models]
        ax.bar(models, vals, color=["C1", "C0", "0.6"])
        lo = min(vals)
        ax.set_ylim(lo - 0.1 * abs(lo) - 1e-9, max(vals) + 0.02 * abs(max(vals)) + 1e-9)
        ax.set_title(f"held-out {metric}", fontsize=9)
        ax.tick_params(labelsize=7)
    ax = axes[4]
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    for m, col in zip(models, ["C1", "C0", "0.6"]):
        pts = [p for p in env["calibration"][m] if p[2] >= 10]  # bins with at least 10 sessions
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=col, label=m, ms=3)
    ax.set(xlabel="predicted P(T <= H)", ylabel="observed", title="calibration")
    ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "watch_time.png")


EXPERIMENT = registry.Experiment(
    slug="ddm_signals",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            studies=("accuracy", "timing"),
            accuracy=AccuracySection(thresholds=(2.0, 8.0), shapes=("step_up", "decay"), volterra_points=400,
                                     anchors=False),
            timing=TimingSection(thresholds=(4.0,), kernels=("transient",), widths=(0.25,), horizons=(1.0,), grid=9,
                                 paths=1000, dt=0.01),
            watch_time=WatchTimeSection(num_users=6, train_sessions=8, test_sessions=4, fit_iters=10, dt=0.05),
            progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(
            accuracy=AccuracySection(thresholds=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0),
                                     volterra_points=6000),
            timing=TimingSection(thresholds=(4.0, 16.0, 64.0), kernels=("pulse", "decay", "transient"), grid=101,
                                 paths=50_000, dt=0.0025),
            watch_time=WatchTimeSection(num_users=1000, train_sessions=100, test_sessions=50, fit_iters=1000)),
    },
    run=run,
)
