"""GAAVI: asymptotic anytime-valid tests for the conditional mean function (Cho, Dwivedi, Kallus, arXiv:2602.08096).

The paper's claims (abstract): a test of the global null mu(x) = E[Y | X = x] = 0 (and of treatment
contrasts) that keeps (asymptotic) type-I error <= alpha under continuous monitoring, has power one, a
sample complexity matching Gaussian location testing, is well powered where discretized or
linear-projection tests are not, and inverts into function-valued confidence sequences. The paper's
exact statistic is not public; the library implements the spec's reconstruction
(`algorithms.statistics.anytime_valid`): a predictable weighted residual martingale (weights from an
online ridge regression on random Fourier features, refitted after every block) with the
normal-mixture boundary and a burn-in m (rho = r(alpha) V_m). This experiment checks, on simulated
streams X ~ U[-1, 1]^d, Y = mu(X) + sigma(X) eps, sigma(x) = 0.5 + |x_1|:

1. **Null calibration under continuous monitoring.** mu = 0, eps Gaussian, t_3, centred exponential or
   Rademacher (all unit variance), d = 1 and d = 5; the test looks after every sample up to T. Reported:
   P(reject by T) for burn-ins m in `burn_ins` against the naive fixed-n z-test of the same statistic
   peeked at after every sample (and its single-look rate at each n, which stays at alpha), plus the
   linear-projection and discretized baselines; type-I error over time is plotted.
2. **Power and stopping time.** mu = A s(x_1) / ||s / sigma|| with shapes quadratic (x^2 - 1/3, zero
   linear projection), linear, a sparse bump and an oscillation sin(4 pi x) (zero mean in every
   cell of the discretized baseline), at signal strengths I = E[mu^2 / sigma^2] in `power.signals`. Methods:
   GAAVI (learned weights), oracle weights mu / sigma^2, linear projection, discretized (Bonferroni
   over cells). Rejection rate by T and over time, mean (censored) stopping time. "Power one" is a
   T -> infinity statement, so GAAVI's rejection rate against t up to `power.curve_horizon` (4000,
   1000 streams per shape, top signal) is reported too (not checked).
3. **Sample complexity.** Oracle weights with known variance: E[tau] I / (2 log(1/alpha)) for alpha in
   `oracle.alphas` (-> 1 as alpha -> 0 is the Gaussian-location optimality), with rho tuned at the
   burn-in (default) and at the planned sample size 2 log(1/alpha) / I.
4. **Simulated randomized trial (contrast).** A ~ Bernoulli(1/2), mu_0(x) = 1 + x + x^2, CATE
   tau(x) = delta sin(pi x) (average effect 0): GAAVI on AIPW pseudo-outcomes (predictable ridge
   outcome models) against the average-effect test (constant weight) and the linear projection.
5. **Confidence sequences.** Time-uniform coverage (simultaneously over grid points and t >= m) of the
   kernel-localized mean band, for a linear and a nonlinear mu (the target is the box-kernel local
   average, computed by quadrature).

Recipe:
    python -m experiments run anytime_cmf --preset smoke    # seconds (tests)
    python -m experiments run anytime_cmf --preset quick    # 10k null streams in the main setting, T = 1000; minutes
    python -m experiments run anytime_cmf --preset paper    # 10k null streams everywhere, T = 5000 (accelerator)
    python -m experiments run anytime_cmf --preset smoke --power.streams 16   # one field of a config section

Config sections (`run anytime_cmf --help` lists every field): learner (the weight learner), null (1), power
(2), oracle (3), trial (4), cs (5); the monitoring settings (alpha, horizon, burn-ins) stay at the top.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import pathlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
import tqdm

from algorithms.statistics import anytime_valid as av
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments.checks import Check, Study
from primitives import confidence_sequences as cs

NOISES = ("gaussian", "t3", "exp", "rademacher")
SHAPES = ("quadratic", "linear", "bump", "oscillating")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """The weight learner: ridge on random Fourier features (on the command line ``--learner.rff-features 16``)."""

    rff_features: int = 32
    rff_lengthscale: float = 0.2
    ridge_l2: float = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class NullConfig:
    """1. Null calibration (``--null.streams 2000``)."""

    streams: int = 10_000  # the main setting (Gaussian noise, d = 1)
    streams_other: int = 1000  # every other noise and dimension
    noises: tuple[str, ...] = NOISES
    dims: tuple[int, ...] = (1, 5)  # d = 1 with every noise; the others with Gaussian noise


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerConfig:
    """2. Power (``--power.streams 100``).

    Power against T: "power one" is a T -> infinity statement, so GAAVI's rejection rate by t is also reported
    up to `curve_horizon` (top signal, every shape, GAAVI alone) on `curve_streams` streams. Reported beside the
    check, not checked; 0 = off (the smoke preset). About 15 s on 2 CPU cores.
    """

    streams: int = 300
    shapes: tuple[str, ...] = SHAPES
    signals: tuple[float, ...] = (0.02, 0.04, 0.08)  # I = E[mu^2 / sigma^2]
    bins_per_dim: int = 4  # discretized baseline (d = 1)
    curve_streams: int = 1000
    curve_horizon: int = 4000


@dataclasses.dataclass(frozen=True, kw_only=True)
class OracleConfig:
    """3. Sample complexity with oracle weights (``--oracle.streams 200``)."""

    streams: int = 500
    alphas: tuple[float, ...] = (0.05, 1e-2, 1e-3)
    signal: float = 0.02
    horizon: int = 4000
    burn_in: int = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """4. The simulated randomized trial (``--trial.deltas 0 1``; an empty tuple skips the study)."""

    streams: int = 300
    deltas: tuple[float, ...] = (0.0, 0.5, 1.0)
    rff_features: int = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class CSConfig:
    """5. Confidence sequences (``--cs.streams 200``)."""

    streams: int = 500
    grid: tuple[float, ...] = (-0.6, -0.2, 0.2, 0.6)
    bandwidth: float = 0.2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """anytime_cmf settings (every field can be overridden on the command line; sections as
    ``--power.streams 100``)."""

    alpha: float = 0.05
    horizon: int = 1000  # T: samples per stream (continuous monitoring up to T)
    block_size: int = 25  # the weight learner is refitted after every block
    burn_ins: tuple[int, ...] = (50, 200, 500)
    main_burn_in: int = 200  # the burn-in of the power study and the baselines
    peek_start: int = 10  # the naive z-test looks after every sample from here on
    learner: LearnerConfig = LearnerConfig()
    null: NullConfig = NullConfig()  # 1.
    power: PowerConfig = PowerConfig()  # 2.
    oracle: OracleConfig = OracleConfig()  # 3.
    trial: TrialConfig = TrialConfig()  # 4.
    cs: CSConfig = CSConfig()  # 5.
    batch_size: int = 250  # streams per compiled call
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        _validate(self)


def _validate(c: Config) -> None:
    """Raises `registry.ConfigError` (a ValueError) naming the field's path for a config no study can run."""
    if not 0 < c.alpha < 1:
        raise registry.ConfigError("alpha", f"must be in (0, 1); got {c.alpha}")
    if c.horizon % c.block_size or c.oracle.horizon % c.block_size:
        raise registry.ConfigError("block_size", f"must divide horizon={c.horizon} and "
                                   f"oracle.horizon={c.oracle.horizon}; got {c.block_size}")
    for name, values in (("burn_ins", c.burn_ins), ("main_burn_in", (c.main_burn_in,)),
                         ("peek_start", (c.peek_start,))):
        bad = [m for m in values if not 1 <= m <= c.horizon]
        if bad:
            raise registry.ConfigError(name, f"must be in [1, horizon={c.horizon}]; got {bad}")
    if c.main_burn_in not in c.burn_ins:
        raise registry.ConfigError("main_burn_in", f"must be one of burn_ins={c.burn_ins}; got {c.main_burn_in}")
    if c.power.curve_streams < 0:
        raise registry.ConfigError("power.curve_streams", f"must be >= 0 (0 = off); got {c.power.curve_streams}")
    if c.power.curve_streams and (c.power.curve_horizon % c.block_size or c.power.curve_horizon < c.main_burn_in):
        raise registry.ConfigError("power.curve_horizon", f"must be a multiple of block_size={c.block_size} and "
                                   f">= main_burn_in={c.main_burn_in} when power.curve_streams > 0; got "
                                   f"{c.power.curve_horizon}")
    for name, vals, allowed in (("null.noises", c.null.noises, NOISES), ("power.shapes", c.power.shapes, SHAPES)):
        extra = [v for v in vals if v not in allowed]
        if extra:
            raise registry.ConfigError(name, f"must be drawn from {allowed}; got {extra}")


# ----------------------------------------------------------------------------------------------
# Data.
# ----------------------------------------------------------------------------------------------


def _shape(name: str, x1, xp=jnp):
    """The unnormalized alternative shape s(x_1) (`xp`: jnp, or np for float64 quadrature)."""
    if name == "quadratic":
        return x1 * x1 - 1.0 / 3.0
    if name == "linear":
        return x1
    if name == "bump":
        return xp.exp(-0.5 * ((x1 - 0.5) / 0.1) ** 2)
    if name == "oscillating":
        return xp.sin(4.0 * math.pi * x1)
    raise ValueError(f"unknown shape {name!r}; choose from {SHAPES}")


def _sigma(x1):
    return 0.5 + jnp.abs(x1)


@functools.lru_cache(maxsize=None)
def _shape_norm(name: str) -> float:
    """sqrt(E[s(X)^2 / sigma(X)^2]) for X_1 ~ U[-1, 1] (fine-grid quadrature, float64)."""
    x = np.linspace(-1.0, 1.0, 200_001)
    val = np.trapezoid((_shape(name, x, np) / (0.5 + np.abs(x))) ** 2, x) / 2.0
    return math.sqrt(val)


def _unit_shape(idx, x1):
    """s_idx(x_1) / ||s_idx / sigma|| for a traced shape index into SHAPES (one compiled program for all)."""
    vals = jnp.stack([_shape(n, x1) / _shape_norm(n) for n in SHAPES])
    return vals[idx]


# Randomness: every compiled study draws one block of uniforms per batch of streams with a single call
# (the "rbg" generator), and turns it into covariates and noise by inverse CDFs. One call site per
# program keeps XLA compile times low (each threefry call site costs about a second to compile on CPU).


def _uniforms(key, n: int, k: int, t: int):
    """[n, k, t] uniforms in (0, 1) for n streams (one generator call)."""
    return jax.random.uniform(key, (n, k, t), minval=1e-7, maxval=1.0 - 1e-7)


def _gauss(u):
    return jax.scipy.special.ndtri(u)


NOISE_ROWS = 4  # uniform rows consumed by `_noise`


def _noise(u, idx):
    """Unit-variance, mean-zero noise NOISES[idx] (traced index) from u [4, t]: Gaussian, t_3, centred Exp(1),
    Rademacher."""
    g = _gauss(u[0])
    chi2_3 = jnp.sum(_gauss(u[1:4]) ** 2, axis=0)
    vals = jnp.stack([g, g / jnp.sqrt(chi2_3 / 3.0) / math.sqrt(3.0), -jnp.log(u[1]) - 1.0,
                      jnp.where(u[2] < 0.5, -1.0, 1.0)])
    return vals[idx]


def _covariates(u):
    """[d, t] uniforms -> [t, d] covariates on [-1, 1]^d."""
    return (2.0 * u - 1.0).T


def _root(seed: int, stream: int):
    return jax.random.fold_in(jax.random.key(seed, impl="rbg"), stream)


def _masked_ridge(c: Config, d: int, mask, num_features: int | None = None) -> av.SequentialRegressor:
    """Ridge on [1, x, RFF(x)] * mask: mask = 1 is the GAAVI learner, [1, 1_d, 0] the linear projection,
    [1, 0, 0] a running mean (zeroed features get coefficient 0 exactly), so one compiled scan runs all."""
    feats = av.random_fourier_features(jax.random.fold_in(jax.random.key(c.seed), 99), d,
                                       num_features or c.learner.rff_features, lengthscale=c.learner.rff_lengthscale)
    return av.ridge_regressor(lambda x: feats(x) * mask, dim=d, l2=c.learner.ridge_l2)


def _masks(d: int, p: int, kinds) -> jax.Array:
    rows = {"full": np.ones(p), "linear": np.r_[np.ones(1 + d), np.zeros(p - 1 - d)],
            "intercept": np.r_[1.0, np.zeros(p - 1)]}
    return jnp.asarray(np.stack([rows[k] for k in kinds]), jnp.float32)


def _batched(fn, key, n: int, batch_size: int):
    """fn(batch_key, n=batch) over ceil(n / batch_size) batches, concatenated on the stream axis."""
    outs = []
    for b, i in enumerate(range(0, n, batch_size)):
        outs.append(jax.device_get(fn(jax.random.fold_in(key, b), n=min(batch_size, n - i))))
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *outs)


# ----------------------------------------------------------------------------------------------
# 1 + 2. Null calibration and power: one compiled simulator per dimension d.
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("c", "d", "n"))
def _simulate(key, amp, shape_idx, noise_idx, *, c: Config, d: int, n: int):
    """Streams with mu = amp * unit shape (amp = 0: the null), noise NOISES[noise_idx]; stop times of
    GAAVI (every burn-in), the peeked z-test, the linear-projection, discretized and oracle-weight tests."""
    p = 1 + d + c.learner.rff_features
    masks = _masks(d, p, ("full", "linear"))
    oracle = av.fixed_regressor(lambda x: _unit_shape(shape_idx, x[:, 0]) / _sigma(x[:, 0]) ** 2)
    unit = av.fixed_regressor(lambda x: jnp.ones(x.shape[0]))
    q = av._z_quantile(c.alpha, True)

    def one(u):
        x = _covariates(u[:d])
        y = amp * _unit_shape(shape_idx, x[:, 0]) + _sigma(x[:, 0]) * _noise(u[d:], noise_idx)
        trace = lambda m: av.weighted_residual_martingale(x, y, regressor=_masked_ridge(c, d, m),
                                                          block_size=c.block_size)
        tr_all = jax.vmap(trace)(masks)  # [2, t]: GAAVI and the linear projection in one scan
        z, vz = tr_all.z[0], tr_all.v_realized[0]
        out = {}
        for m in c.burn_ins:
            out[f"gaavi_m{m}"] = cs.sequential_mixture_test(z, vz, alpha=c.alpha, burn_in=m).stop_time
        s, v = jnp.cumsum(z), jnp.cumsum(vz)
        out["peek"] = av.peeking_z_test(s, v, alpha=c.alpha, burn_in=c.peek_start).stop_time
        out["single_look"] = jnp.abs(s) >= q * jnp.sqrt(jnp.maximum(v, 1e-30))  # [t]: the z-test used once at t
        out["linear"] = cs.sequential_mixture_test(tr_all.z[1], tr_all.v_realized[1], alpha=c.alpha,
                                                   burn_in=c.main_burn_in).stop_time
        bins = c.power.bins_per_dim if d == 1 else 2
        out["discretized"] = av.discretized_test(x, y, bins_per_dim=bins, alpha=c.alpha,
                                                 burn_in=c.main_burn_in).stop_time
        to = av.weighted_residual_martingale(x, y, regressor=oracle, variance_regressor=unit, block_size=c.block_size)
        out["oracle"] = cs.sequential_mixture_test(to.z, to.v_realized, alpha=c.alpha,
                                                   burn_in=c.main_burn_in).stop_time
        return out

    return jax.vmap(one)(_uniforms(key, n, d + NOISE_ROWS, c.horizon))


@functools.partial(jax.jit, static_argnames=("c", "n"))
def _gaavi_long(key, amp, shape_idx, *, c: Config, n: int):
    """GAAVI alone (burn-in `main_burn_in`, Gaussian noise, d = 1) on streams of `power.curve_horizon`
    samples with mu = amp * unit shape: stop times [n] (the power-against-T report)."""
    mask = _masks(1, 2 + c.learner.rff_features, ("full",))[0]

    def one(u):
        x = _covariates(u[:1])
        y = amp * _unit_shape(shape_idx, x[:, 0]) + _sigma(x[:, 0]) * _gauss(u[1])
        tr = av.weighted_residual_martingale(x, y, regressor=_masked_ridge(c, 1, mask), block_size=c.block_size)
        return cs.sequential_mixture_test(tr.z, tr.v_realized, alpha=c.alpha, burn_in=c.main_burn_in).stop_time

    return jax.vmap(one)(_uniforms(key, n, 2, c.power.curve_horizon))


def _rate(tau, t):
    """P(tau <= t) and its standard error."""
    p = float(np.mean(tau <= t))
    return p, math.sqrt(max(p * (1 - p), 1e-12) / tau.size)


def _curve(tau, t):
    """[t] P(tau <= s) for s = 1..t."""
    counts = np.bincount(np.minimum(tau, t + 1), minlength=t + 2)[1:t + 1]
    return np.cumsum(counts) / tau.size


# ----------------------------------------------------------------------------------------------
# 3. Oracle sample complexity.
# ----------------------------------------------------------------------------------------------


def _oracle_mean(info: float, x1):
    """The oracle study's alternative mu(x) = sqrt(I) x_1 / ||x_1 / sigma|| (linear shape, E[mu^2/sigma^2] = I)."""
    return math.sqrt(info) * _unit_shape(SHAPES.index("linear"), x1)


def _oracle_trace(x, y, *, info: float, block_size: int) -> av.MartingaleTrace:
    """The oracle-weight martingale with known variance: w = mu / sigma^2 exactly, V_t = sum mu^2 / sigma^2.

    `weighted_residual_martingale` forms w = g / sigma_hat^2 from the regressor's prediction g (an
    estimate of mu) and the variance regressor, so the oracle passes g = mu and sigma_hat^2 = sigma^2.
    (Before the fix the regressor returned mu / sigma^2 and the scan divided again: w was proportional
    to mu / sigma^4, whose efficiency E[mu^2/s^4]^2 / (E[mu^2/s^2] E[mu^2/s^6]) = 0.789 here inflated
    every E[tau] ratio by about 1/0.789.)
    """
    reg = av.fixed_regressor(lambda x: _oracle_mean(info, x[:, 0]))
    var = av.fixed_regressor(lambda x: _sigma(x[:, 0]) ** 2)
    return av.weighted_residual_martingale(x, y, regressor=reg, variance_regressor=var, block_size=block_size,
                                           normalize_weights=False, max_weight=1e6)


@functools.partial(jax.jit, static_argnames=("c", "n"))
def _oracle_stopping(key, alphas, *, c: Config, n: int):
    """Oracle weights mu / sigma^2 with the known variance (predictable V): stop times [n, a] with rho at
    the burn-in (default) and rho planned at the benchmark sample size 2 log(1/alpha) / I."""
    info = c.oracle.signal
    n_plan = 2.0 * jnp.log(1.0 / alphas) / info
    plan_scale = cs.optimal_rho_ratio(alphas) * n_plan / c.oracle.burn_in

    def one(u):
        x = _covariates(u[:1])
        y = _oracle_mean(info, x[:, 0]) + _sigma(x[:, 0]) * _gauss(u[1])
        tr = _oracle_trace(x, y, info=info, block_size=c.block_size)

        def test(al, scale):
            kw = dict(alpha=al, burn_in=c.oracle.burn_in)
            return (cs.sequential_mixture_test(tr.z, tr.v_predictable, **kw).stop_time,
                    cs.sequential_mixture_test(tr.z, tr.v_predictable, rho_scale=scale, **kw).stop_time)

        return jax.vmap(test)(alphas, plan_scale)

    return jax.vmap(one)(_uniforms(key, n, 2, c.oracle.horizon))


# ----------------------------------------------------------------------------------------------
# 4. Randomized trial.
# ----------------------------------------------------------------------------------------------

TRIAL_METHODS = ("gaavi", "ate", "linear")


@functools.partial(jax.jit, static_argnames=("c", "n"))
def _trial(key, delta, *, c: Config, n: int):
    """AIPW contrast tests with weights: GAAVI (RFF ridge), the average effect (running mean), linear."""
    nf = c.trial.rff_features
    p = 2 + nf
    masks = _masks(1, p, ("full", "intercept", "linear"))
    outcome = _masked_ridge(c, 1, jnp.ones((p,), jnp.float32), nf)
    t = c.horizon

    def one(u):
        x = _covariates(u[:1])
        a = (u[1] < 0.5).astype(jnp.float32)
        m0 = 1.0 + x[:, 0] + x[:, 0] ** 2
        y = m0 + a * delta * jnp.sin(math.pi * x[:, 0]) + _gauss(u[2])

        def test(mask):
            g = av.gaavi_contrast_test(x, a, y, propensity=0.5, outcome_regressor=outcome,
                                       regressor=_masked_ridge(c, 1, mask, nf), alpha=c.alpha, burn_in=c.main_burn_in,
                                       block_size=c.block_size)
            return g.test.stop_time

        return jax.vmap(test)(masks)  # one scan runs the three weight learners

    return jax.vmap(one)(_uniforms(key, n, 3, t))


@contextlib.contextmanager
def _pinned_to_one_cpu():
    """Pins every thread of this process to one CPU for the duration (Linux, CPU backend; else a no-op).

    Why: on the 2-core CPU machines (jaxlib 0.10.2), the compiled trial program hangs at random: the main
    thread waits for a result while every XLA worker thread sleeps (a lost wake-up; attaching a debugger
    releases it). Pinned to one CPU it ran to the end in every try. The other studies do not show it.
    """
    tasks = pathlib.Path("/proc/self/task")
    if jax.default_backend() != "cpu" or not hasattr(os, "sched_setaffinity") or not tasks.exists():
        yield
        return
    before = os.sched_getaffinity(0)
    one = {min(before)}
    for t in tasks.iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(t.name), one)
    try:
        yield
    finally:
        for t in tasks.iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(t.name), before)


# ----------------------------------------------------------------------------------------------
# 5. Confidence-sequence coverage.
# ----------------------------------------------------------------------------------------------

CS_FUNCTIONS = ("linear", "nonlinear")


def _cs_mu(name: str, x1, xp=jnp):
    return 0.8 * x1 - 0.2 if name == "linear" else xp.sin(math.pi * x1)


def _local_average_truth(name: str, grid, h: float) -> np.ndarray:
    """Box-kernel local average of mu over [x_g - h, x_g + h] (inside [-1, 1]), by quadrature (float64)."""
    out = []
    for g in grid:
        lo, hi = max(-1.0, g - h), min(1.0, g + h)
        x = np.linspace(lo, hi, 20_001)
        out.append(np.trapezoid(_cs_mu(name, x, np), x) / (hi - lo))
    return np.array(out)


@functools.partial(jax.jit, static_argnames=("c", "n"))
def _cs_cover(key, fn_idx, truth, *, c: Config, n: int):
    grid = jnp.asarray(c.cs.grid, jnp.float32)

    def one(u):
        x = _covariates(u[:1])
        mu = jnp.stack([_cs_mu(name, x[:, 0]) for name in CS_FUNCTIONS])[fn_idx]
        y = mu + _sigma(x[:, 0]) * _gauss(u[1])
        band = av.local_mean_confidence_band(x, y, grid, bandwidth=c.cs.bandwidth, alpha=c.alpha,
                                             burn_in=c.main_burn_in)
        ok = (band.lower <= truth) & (truth <= band.upper)  # [t, g]
        return jnp.all(ok), jnp.all(ok, axis=1), band.upper[-1] - band.lower[-1]

    return jax.vmap(one)(_uniforms(key, n, 2, c.horizon))


# ----------------------------------------------------------------------------------------------
# Studies (each returns its checks, verdict sentence, metrics and figures) and run.
# ----------------------------------------------------------------------------------------------


def _null_settings(c: Config) -> list[tuple[str, int]]:
    """(noise, d) of the null study: d = null.dims[0] with every noise, the other dims with Gaussian noise."""
    return [("gaussian" if i else n, d) for i, d in enumerate(c.null.dims) for n in
            (c.null.noises if i == 0 else ("gaussian",))]


def null_study(c: Config, workdir: pathlib.Path, bar) -> Study:
    """1. Null calibration under continuous monitoring: P(reject by T) of GAAVI (m >= 200) and the
    baselines within alpha + 3SE in every setting, while the z-test peeked at every sample is inflated."""
    T, a = c.horizon, c.alpha
    null = {}
    for i, (noise, d) in enumerate(_null_settings(c)):
        key = jax.random.fold_in(_root(c.seed, 1), i)
        fn = functools.partial(_simulate, amp=jnp.float32(0.0), shape_idx=jnp.int32(0),
                               noise_idx=jnp.int32(NOISES.index(noise)), c=c, d=d)
        n_null = c.null.streams if i == 0 else c.null.streams_other
        out = _batched(fn, key, n_null, c.batch_size)
        entry = {k: _rate(v, T) for k, v in out.items() if k != "single_look"}
        entry["streams"] = n_null
        entry["slack_3se"] = 3.0 * math.sqrt(a * (1 - a) / n_null)
        entry["single_look_rate_by_t"] = out["single_look"].mean(axis=0)
        entry["curves"] = {k: _curve(out[k], T) for k in [f"gaavi_m{m}" for m in c.burn_ins] + ["peek"]}
        null[f"{noise}, d={d}"] = entry
        bar.update(1)
    slack = max(v["slack_3se"] for v in null.values())  # the loosest (fewest streams), for the report
    valid_burn_ins = [m for m in c.burn_ins if m >= min(200, max(c.burn_ins))]
    worst_gaavi = max(null[k][f"gaavi_m{m}"][0] for k in null for m in valid_burn_ins)
    worst_baseline = max(max(null[k]["linear"][0], null[k]["discretized"][0]) for k in null)
    min_peek = min(null[k]["peek"][0] for k in null)
    single = np.concatenate([null[k]["single_look_rate_by_t"][c.main_burn_in - 1:] for k in null])
    # Each setting is judged with the slack of its own number of streams.
    null_ok = all(max([v[f"gaavi_m{m}"][0] for m in valid_burn_ins] + [v["linear"][0], v["discretized"][0]])
                  <= a + v["slack_3se"] for v in null.values())
    peek_inflated = all(v["peek"][0] > a + v["slack_3se"] for v in null.values())

    checks = [
        Check("type-I <= alpha + 3SE (GAAVI m >= 200 and baselines)", max(worst_gaavi, worst_baseline),
              paper="type-I error <= alpha under continuous monitoring",
              threshold="<= alpha + 3SE of its streams in every setting", passed=null_ok),
        Check("peeking inflated", min_peek, paper="a fixed-n test peeked at continuously loses its level",
              threshold="> alpha + 3SE of its streams in every setting", passed=peek_inflated),
    ]
    g_txt = ", ".join(f"{k}: {v[f'gaavi_m{c.main_burn_in}'][0]:.3f}" for k, v in null.items())
    m_txt = ", ".join(f"m={m}: {max(null[k][f'gaavi_m{m}'][0] for k in null):.3f}" for m in c.burn_ins)
    context = (
        f"Null, continuous monitoring to T={T} (alpha={a}; {c.null.streams} streams for gaussian, d=1, 3SE slack "
        f"{3 * math.sqrt(a * (1 - a) / c.null.streams):.3f}; {c.null.streams_other} for the other settings, slack "
        f"{3 * math.sqrt(a * (1 - a) / c.null.streams_other):.3f}): "
        f"GAAVI (m={c.main_burn_in}) P(reject by T) {g_txt}; worst over settings by burn-in {m_txt}; linear/"
        f"discretized worst {worst_baseline:.3f}; the z-test peeked at every sample from n={c.peek_start} rejects "
        f"{min_peek:.3f}-{max(null[k]['peek'][0] for k in null):.3f} while used once it rejects "
        f"{single.min():.3f}-{single.max():.3f} at every n.")
    metrics = {
        "null_slack_3se": slack,
        "null_worst_gaavi_m_ge_200": worst_gaavi,
        "null_worst_linear_or_discretized": worst_baseline,
        "null_min_peeking_rate": min_peek,
        "single_look_rate_range": [float(single.min()), float(single.max())],
        "null": {k: {m: (v[m] if isinstance(v[m], tuple) else None) for m in v if m not in ("curves",
                                                                                           "single_look_rate_by_t")}
                 for k, v in null.items()},
    }
    return Study(checks, context, metrics, [_plot_null(null, c, workdir)])


POWER_METHODS = ("gaavi", "oracle", "linear", "discretized")
POWER_CHECK = "power one and beats blind baselines"


def power_study(c: Config, workdir: pathlib.Path, bar) -> Study:
    """2. Power and stopping time: GAAVI's power by T at the top signal is >= 0.9 for every shape, and
    significantly above the linear projection (quadratic) and the discretized test (oscillating)."""
    T = c.horizon
    methods = list(POWER_METHODS)
    power = {}
    for si, shape in enumerate(c.power.shapes):
        power[shape] = {}
        for j, info in enumerate(c.power.signals):
            key = jax.random.fold_in(_root(c.seed, 2), 100 * si + j)
            fn = functools.partial(_simulate, amp=jnp.float32(math.sqrt(info)),
                                   shape_idx=jnp.int32(SHAPES.index(shape)), noise_idx=jnp.int32(0), c=c, d=1)
            out = _batched(fn, key, c.power.streams, c.batch_size)
            out["gaavi"] = out[f"gaavi_m{c.main_burn_in}"]
            power[shape][info] = {m: {"power": _rate(out[m], T)[0], "se": _rate(out[m], T)[1],
                                      "mean_stop": float(np.mean(np.minimum(out[m], T))),
                                      "curve": _curve(out[m], T)} for m in methods}
            bar.update(1)
    top = max(c.power.signals)
    se_p = lambda p: math.sqrt(max(p * (1 - p), 1e-12) / c.power.streams)
    long_curves = {}  # power against T up to power.curve_horizon (off when power.curve_streams = 0)
    if c.power.curve_streams:
        for si, shape in enumerate(c.power.shapes):
            fn = functools.partial(_gaavi_long, amp=jnp.float32(math.sqrt(top)),
                                   shape_idx=jnp.int32(SHAPES.index(shape)), c=c)
            tau = _batched(fn, jax.random.fold_in(_root(c.seed, 6), si), c.power.curve_streams, c.batch_size)
            long_curves[shape] = _curve(tau, c.power.curve_horizon)
            bar.update(1)
    power_one = {s: power[s][top]["gaavi"]["power"] for s in c.power.shapes}
    beats = {}
    for shape, base in (("quadratic", "linear"), ("oscillating", "discretized")):
        if shape in c.power.shapes:
            g, b = power[shape][top]["gaavi"]["power"], power[shape][top][base]["power"]
            beats[f"{shape} vs {base}"] = (g, b, g - b > 3 * math.hypot(se_p(g), se_p(b)))
    power_ok = min(power_one.values()) >= 0.9 and all(v[2] for v in beats.values())

    checks = [Check(POWER_CHECK, min(power_one.values()),
                    paper="power one; well powered where discretized or linear-projection tests are not",
                    threshold=">= 0.9 for every shape at the top signal, and above the linear projection "
                              "(quadratic) and the discretized test (oscillating) by 3SE", passed=power_ok)]
    p_txt = "; ".join(f"{s}: " + ", ".join(f"{m} {power[s][top][m]['power']:.2f}" for m in methods)
                      for s in c.power.shapes)
    st_txt = "; ".join(f"{s}: " + ", ".join(f"{m} {power[s][top][m]['mean_stop']:.0f}" for m in methods)
                       for s in c.power.shapes)
    context = (f"Power by T at I=E[mu^2/sigma^2]={top:g} ({c.power.streams} streams; gaavi, oracle, linear, "
               f"discretized): {p_txt}; mean stopping times {st_txt}.")
    power_vs_t = {}
    if long_curves:
        tl = c.power.curve_horizon
        ts = sorted({t for t in (tl // 8, tl // 4, tl // 2, c.horizon, tl) if 1 <= t <= tl})
        se_l = lambda p: math.sqrt(max(p * (1 - p), 1e-12) / c.power.curve_streams)
        power_vs_t = {s: {str(t): {"power": float(v[t - 1]), "se": se_l(float(v[t - 1]))} for t in ts}
                      for s, v in long_curves.items()}
        l_txt = "; ".join(f"{s}: " + "/".join(f"{v[str(t)]['power']:.3f}" for t in ts) for s, v in power_vs_t.items())
        context += (f" GAAVI power against T (reported, not checked; I={top:g}, {c.power.curve_streams} streams, "
                    f"P(rejected by t) at t=" + "/".join(str(t) for t in ts) + f"): {l_txt}.")
    metrics = {
        "power_at_top_signal": {s: {m: power[s][top][m]["power"] for m in methods} for s in c.power.shapes},
        "power": {s: {f"{i:g}": {m: {"power": r[m]["power"], "mean_stop": r[m]["mean_stop"]} for m in methods}
                      for i, r in v.items()} for s, v in power.items()},
        "gaavi_beats_blind_baselines": {k: {"gaavi": v[0], "baseline": v[1], "significant": v[2]}
                                        for k, v in beats.items()},
    }
    plots = [_plot_power(power, c, workdir)]
    if long_curves:
        metrics["power_vs_T"] = power_vs_t
        plots.append(_plot_power_vs_t(long_curves, top, c, workdir))
    return Study(checks, context, metrics, plots)


def oracle_study(c: Config, workdir: pathlib.Path, bar) -> Study:
    """3. Sample complexity: with oracle weights, E[tau] I / (2 log(1/alpha)) at the smallest alpha (rho
    planned at the benchmark sample size) is in [0.8, 1.5] (the Gaussian-location rate)."""
    oracle = {}
    bench = lambda al: 2 * math.log(1 / al) / c.oracle.signal
    alphas = jnp.asarray(c.oracle.alphas, jnp.float32)
    tau_d, tau_p = _batched(functools.partial(_oracle_stopping, alphas=alphas, c=c), _root(c.seed, 3),
                            c.oracle.streams, c.batch_size)  # [n, a]
    for j, al in enumerate(c.oracle.alphas):
        oracle[al] = {"benchmark": bench(al),
                      "ratio_default_rho": float(np.mean(np.minimum(tau_d[:, j], c.oracle.horizon)) / bench(al)),
                      "ratio_planned_rho": float(np.mean(np.minimum(tau_p[:, j], c.oracle.horizon)) / bench(al)),
                      "censored_default": float(np.mean(tau_d[:, j] > c.oracle.horizon)),
                      "censored_planned": float(np.mean(tau_p[:, j] > c.oracle.horizon))}
    bar.update(1)
    a_min = min(c.oracle.alphas)
    ratio_ok = 0.8 <= oracle[a_min]["ratio_planned_rho"] <= 1.5

    checks = [Check(f"oracle E[tau] ratio in [0.8, 1.5] at alpha={a_min:g}", oracle[a_min]["ratio_planned_rho"],
                    paper="sample complexity matching Gaussian location testing (ratio -> 1 as alpha -> 0)",
                    threshold="in [0.8, 1.5] (rho planned)", passed=ratio_ok)]
    o_txt = ", ".join(f"alpha={al:g}: {v['ratio_default_rho']:.2f} (rho at m) / {v['ratio_planned_rho']:.2f} "
                      f"(rho planned)" for al, v in oracle.items())
    context = f"Oracle E[tau] I/(2 log 1/alpha): {o_txt}."
    metrics = {"oracle_stopping": {f"{al:g}": v for al, v in oracle.items()}}
    return Study(checks, context, metrics, [_plot_oracle(oracle, c, workdir)])


def _trial_runs(c: Config, bar) -> dict:
    """4. The randomized trial's rejections: {delta: {method: {"power", "curve"}}} (TRIAL_METHODS)."""
    T = c.horizon
    trial = {}
    for j, delta in enumerate(c.trial.deltas):
        with _pinned_to_one_cpu():
            out = _batched(functools.partial(_trial, delta=jnp.float32(delta), c=c),
                           jax.random.fold_in(_root(c.seed, 4), j), c.trial.streams, c.batch_size)  # [n, 3]
        trial[delta] = {m: {"power": _rate(out[:, k], T)[0], "curve": _curve(out[:, k], T)}
                        for k, m in enumerate(TRIAL_METHODS)}
        bar.update(1)
    return trial


def trial_study(c: Config, trial: dict) -> Study:
    """4. Randomized trial (contrast): every method within alpha + 3SE at delta = 0, and GAAVI's power at
    the largest delta significantly above the average-effect test (the CATE averages to 0)."""
    a = c.alpha
    t_slack = 3.0 * math.sqrt(a * (1 - a) / c.trial.streams)
    se_t = lambda p: math.sqrt(max(p * (1 - p), 1e-12) / c.trial.streams)
    if trial:  # an empty `trial.deltas` skips the study (the smoke preset, to stay within seconds)
        trial_null = max(trial[0.0][m]["power"] for m in trial[0.0]) if 0.0 in trial else 0.0
        d_top = max(c.trial.deltas)
        g_top, ate_top = trial[d_top]["gaavi"]["power"], trial[d_top]["ate"]["power"]
        trial_ok = trial_null <= a + t_slack and g_top > ate_top + 3 * math.hypot(se_t(g_top), se_t(ate_top))
        measured = f"level {trial_null:.3f}; power {g_top:.2f} vs average effect {ate_top:.2f}"
    else:
        trial_ok = True
        measured = "skipped"

    checks = [Check("trial: level and power over the average-effect test", measured,
                    paper="valid tests of treatment contrasts, powered where the average effect is 0",
                    threshold=f"level <= alpha + 3SE ({a + t_slack:.3f}); power above the average-effect test by 3SE",
                    passed=trial_ok)]
    tr_txt = "skipped" if not trial else ", ".join(
        f"delta={dl:g}: " + "/".join(f"{v[m]['power']:.2f}" for m in ("gaavi", "ate", "linear"))
        for dl, v in trial.items())
    context = f"Randomized trial, tau = delta sin(pi x) (ATE 0), power gaavi/ATE/linear: {tr_txt}."
    metrics = {"trial_power": {f"{dl:g}": {m: v[m]["power"] for m in v} for dl, v in trial.items()}}
    return Study(checks, context, metrics, [])


def _coverage_runs(c: Config, bar) -> dict:
    """5. The local-mean bands' coverage: {mu: {"time_uniform", "by_t", "median_final_width"}} (CS_FUNCTIONS)."""
    coverage = {}
    for j, name in enumerate(CS_FUNCTIONS):
        truth = jnp.asarray(_local_average_truth(name, c.cs.grid, c.cs.bandwidth), jnp.float32)
        cov, cov_t, width = _batched(functools.partial(_cs_cover, fn_idx=jnp.int32(j), truth=truth, c=c),
                                     jax.random.fold_in(_root(c.seed, 5), j), c.cs.streams, c.batch_size)
        coverage[name] = {"time_uniform": float(cov.mean()), "by_t": cov_t.mean(axis=0),
                          "median_final_width": float(np.median(width))}
        bar.update(1)
    return coverage


def coverage_study(c: Config, coverage: dict) -> Study:
    """5. Confidence sequences: time-uniform coverage of the local-mean band >= 1 - alpha - 3SE for every mu."""
    a = c.alpha
    c_slack = 3.0 * math.sqrt(a * (1 - a) / c.cs.streams)
    worst = min(v["time_uniform"] for v in coverage.values())
    cs_ok = worst >= 1 - a - c_slack

    checks = [Check("CS coverage", worst, paper="function-valued confidence sequences (time-uniform coverage)",
                    threshold=f">= 1 - alpha - 3SE ({1 - a - c_slack:.3f}) for every mu", passed=cs_ok)]
    context = ("Local-mean CS time-uniform coverage: "
               + ", ".join(f"{k} {v['time_uniform']:.3f}" for k, v in coverage.items()) + f" (target {1 - a:.2f}).")
    metrics = {"cs_coverage": {k: {"time_uniform": v["time_uniform"], "median_final_width": v["median_final_width"]}
                               for k, v in coverage.items()}}
    return Study(checks, context, metrics, [])


CLAIM = ("GAAVI keeps type-I error <= alpha under continuous monitoring, has power one where the linear-projection "
         "and discretized tests are blind, a Gaussian-location sample complexity, valid treatment-contrast tests "
         "and time-uniform confidence sequences")


def _power_one_at(power_vs_t: Mapping[str, Any]) -> tuple[int, float] | None:
    """The first checkpoint t of the power-against-T report where every shape rejects >= 0.995, and the lowest
    power there; None if none does (or the report is off)."""
    ts = sorted({int(t) for v in power_vs_t.values() for t in v})
    for t in ts:
        low = min(v[str(t)]["power"] for v in power_vs_t.values())
        if low >= 0.995:
            return t, low
    return None


def _cause(checks: list[Check], power: Study, c: Config) -> str:
    """Why the failing required checks failed (empty when all pass): the diagnosed cause class per check."""
    parts = []
    for ch in checks:
        if not ch.required or ch.passed:
            continue
        if ch.name == POWER_CHECK:
            reason = (f"{ch.name}: scale limit - power one is a T -> infinity statement and T={c.horizon} is short "
                      f"for the top signal")
            curves = power.metrics.get("power_vs_T", {})
            if curves:
                hit = _power_one_at(curves)
                reason += (f"; GAAVI's power against T reaches {hit[1]:.3f} for every shape by t={hit[0]}" if hit
                           else f"; GAAVI's power against T stays below 0.995 up to t={c.power.curve_horizon}")
            parts.append(reason)
        else:
            parts.append(f"{ch.name}: not diagnosed (bug in our code, or doubtful spec part: the paper's statistic "
                         "is not public and the test is the spec's reconstruction)")
    return "; ".join(parts)


def _cause_class(checks: list[Check]) -> str | None:
    """"scale" when the power-one check is the only failing required check (see `_cause`); None otherwise."""
    failing = [ch.name for ch in checks if ch.required and not ch.passed]
    return "scale" if failing and all(name == POWER_CHECK for name in failing) else None


def _short(x: float, digits: int = 2) -> str:
    """A rate without its leading zero (".94"), as the catalog writes it."""
    return f"{x:.{digits}f}".removeprefix("0")


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    null = metrics["null"].values()
    type1 = max(v[k][0] for v in null for k in v if k.startswith("gaavi_m"))
    peek = [v["peek"][0] for v in null]
    out = [f"type-I <={_short(type1, 3)} over noises/dims/burn-ins (z-test peeked every sample "
           f"{_short(min(peek))}-{_short(max(peek))})"]
    beats = metrics["gaavi_beats_blind_baselines"]
    if beats:
        out.append("blind-spot power GAAVI " + "/".join(_short(v["gaavi"]) for v in beats.values()) + " vs "
                   + "/".join(f"{k.split(' vs ')[1]} {_short(v['baseline'])}" for k, v in beats.items())
                   + " (" + "/".join(k.split(" vs ")[0] for k in beats) + ")")
    hit = _power_one_at(metrics.get("power_vs_T", {}))
    if hit:
        out[-1] += f", {hit[1]:.2f} by t={hit[0]}"
    trial = metrics["trial_power"]
    if trial:
        top = trial[max(trial, key=float)]
        out.append(f"trial {_short(top['gaavi'])} vs ATE {_short(top['ate'])}")
    oracle = metrics["oracle_stopping"]
    out.append(f"oracle E[tau] ratio {oracle[min(oracle, key=float)]['ratio_planned_rho']:.2f}")
    # (an older result stores checks as {name: passed}: iterating it yields names, which are skipped)
    failed = [ch for ch in metrics.get("checks", []) if isinstance(ch, dict) and ch["required"] and not ch["passed"]]
    if failed:
        out.append("fails: " + ", ".join(
            f"{ch['name']} ({_short(ch['measured']) if isinstance(ch['measured'], float) else ch['measured']})"
            for ch in failed))
    return "; ".join(out)


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    n_tasks = (len(_null_settings(c)) + len(c.power.shapes) * len(c.power.signals) + 1 + len(c.trial.deltas)
               + len(CS_FUNCTIONS) + (len(c.power.shapes) if c.power.curve_streams else 0))
    bar = tqdm.tqdm(total=n_tasks, desc="anytime_cmf", disable=not c.progress)
    null = null_study(c, workdir, bar)
    power = power_study(c, workdir, bar)
    oracle = oracle_study(c, workdir, bar)
    trial_runs = _trial_runs(c, bar)
    trial = trial_study(c, trial_runs)
    coverage_runs = _coverage_runs(c, bar)
    coverage = coverage_study(c, coverage_runs)
    bar.close()

    studies = (null, power, oracle, trial, coverage)
    checks = [ch for s in studies for ch in s.checks]
    cause_class = _cause_class(checks)
    verdict, reproduced = checks_lib.verdict(checks, claim=CLAIM, context=" ".join(s.context for s in studies),
                                             cause=_cause(checks, power, c), cause_class=cause_class)
    metrics = {k: v for s in studies for k, v in s.metrics.items()}
    metrics["checks"] = [ch.as_dict() for ch in checks]
    plots = [p for s in studies for p in s.plots] + [_plot_trial_cs(trial_runs, coverage_runs, c, workdir)]
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced,
            "cause": None if reproduced else cause_class, "plots": plots}


# ----------------------------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------------------------


def _plot_null(null, c: Config, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(11, 4))
    t = np.arange(1, c.horizon + 1)
    main = next(iter(null))
    v = null[main]
    for m in c.burn_ins:
        ax1.plot(t, v["curves"][f"gaavi_m{m}"], lw=1.8, label=f"GAAVI, burn-in m={m}")
    ax1.plot(t, v["curves"]["peek"], color="tab:red", lw=1.8, label=f"z-test peeked every sample (from {c.peek_start})")
    ax1.plot(t, v["single_look_rate_by_t"], color="gray", lw=0.8, label="z-test used once at n")
    ax1.axhline(c.alpha, color="k", ls="--", lw=0.8)
    ax1.set(xlabel="samples t", ylabel="P(rejected by t) under H0", title=f"type-I error over time ({main})")
    ax1.legend(fontsize=7)
    names = list(null)
    xs = np.arange(len(names))
    cols = [f"gaavi_m{m}" for m in c.burn_ins] + ["linear", "discretized", "peek"]
    wdt = 0.8 / len(cols)
    for k, col in enumerate(cols):
        vals = [null[n][col][0] for n in names]
        errs = [2 * null[n][col][1] for n in names]
        ax2.bar(xs + k * wdt, vals, wdt, yerr=errs, label=col.replace("gaavi_m", "GAAVI m="))
    ax2.axhline(c.alpha, color="k", ls="--", lw=0.8)
    ax2.set_xticks(xs + 0.4 - wdt / 2, names, fontsize=7, rotation=15)
    ax2.set(ylabel=f"P(reject by T={c.horizon})", yscale="log", title="null rejection by setting")
    ax2.legend(fontsize=6, ncol=2)
    return report.savefig(fig, workdir / "type1_over_time.png")


def _plot_power(power, c: Config, workdir: pathlib.Path) -> str:
    shapes = list(power)
    fig, axes = plotting.subplots(2, len(shapes), figsize=(3.2 * len(shapes), 6.4), squeeze=False)
    t = np.arange(1, c.horizon + 1)
    top = max(c.power.signals)
    styles = {"gaavi": dict(color="k", lw=2), "oracle": dict(color="tab:green", ls="--"),
              "linear": dict(color="tab:blue"), "discretized": dict(color="tab:orange")}
    for j, s in enumerate(shapes):
        for m, st in styles.items():
            axes[0, j].plot(t, power[s][top][m]["curve"], label=m, **st)
            axes[1, j].plot(c.power.signals, [power[s][i][m]["power"] for i in c.power.signals], marker="o", label=m,
                            **st)
        axes[0, j].set(title=f"{s}, I={top:g}", xlabel="t", ylabel="P(rejected by t)")
        axes[1, j].set(xlabel="I = E[mu^2/sigma^2]", ylabel=f"power by T={c.horizon}", xscale="log")
    axes[0, 0].legend(fontsize=7)
    return report.savefig(fig, workdir / "power.png")


def _plot_power_vs_t(curves, info, c: Config, workdir: pathlib.Path) -> str:
    fig, ax = plotting.subplots(figsize=(5.5, 3.8))
    t = np.arange(1, c.power.curve_horizon + 1)
    for s, v in curves.items():
        ax.plot(t, v, lw=1.5, label=s)
    ax.axhline(0.9, color="k", ls=":", lw=0.8)
    ax.axvline(c.horizon, color="gray", ls="--", lw=0.8)
    ax.set(xlabel="t", ylabel="P(rejected by t)", ylim=(0, 1.01),
           title=f"GAAVI power against T, I={info:g} ({c.power.curve_streams} streams)")
    ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "power_vs_T.png")


def _plot_oracle(oracle, c: Config, workdir: pathlib.Path) -> str:
    fig, ax = plotting.subplots(figsize=(5.5, 3.8))
    al = list(oracle)
    ax.plot(al, [oracle[x]["ratio_default_rho"] for x in al], marker="o", label="rho = r(alpha) V_m (default)")
    ax.plot(al, [oracle[x]["ratio_planned_rho"] for x in al], marker="s", label="rho planned at 2 log(1/alpha)/I")
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="alpha", ylabel="E[tau] I / (2 log(1/alpha))",
           title=f"oracle weights, I={c.oracle.signal:g}: Gaussian-location rate")
    ax.invert_xaxis()
    ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "stopping_time.png")


def _plot_trial_cs(trial, coverage, c: Config, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(11, 4))
    t = np.arange(1, c.horizon + 1)
    for dl, v in trial.items():
        for m, ls in (("gaavi", "-"), ("ate", ":"), ("linear", "--")):
            ax1.plot(t, v[m]["curve"], ls=ls, label=f"{m}, delta={dl:g}")
    ax1.axhline(c.alpha, color="k", ls="--", lw=0.8)
    ax1.set(xlabel="t", ylabel="P(rejected by t)", title="randomized trial, tau(x) = delta sin(pi x)")
    if trial:
        ax1.legend(fontsize=6, ncol=2)
    for k, v in coverage.items():
        ax2.plot(t, v["by_t"], label=f"mu {k}: time-uniform {v['time_uniform']:.3f}")
    ax2.axhline(1 - c.alpha, color="k", ls="--", lw=0.8)
    ax2.set(xlabel="t", ylabel="P(truth in band at t, all grid points)", ylim=(0.9, 1.001),
            title="local-mean confidence sequence coverage")
    ax2.legend(fontsize=7)
    return report.savefig(fig, workdir / "trial_and_cs.png")


EXPERIMENT = registry.Experiment(
    slug="anytime_cmf",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(horizon=300, block_size=25, burn_ins=(50, 100), main_burn_in=100,
                                learner=LearnerConfig(rff_features=16),
                                null=NullConfig(streams=64, streams_other=64, noises=("gaussian",), dims=(1,)),
                                power=PowerConfig(streams=32, shapes=("quadratic",), signals=(0.05,), curve_streams=0),
                                oracle=OracleConfig(streams=32, alphas=(0.05,), horizon=300),
                                trial=TrialConfig(deltas=()), cs=CSConfig(streams=32),
                                batch_size=64, progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(horizon=5000, learner=LearnerConfig(rff_features=64),
                                null=NullConfig(streams=10_000, streams_other=10_000),
                                power=PowerConfig(streams=2000, signals=(0.005, 0.01, 0.02, 0.04), curve_streams=2000,
                                                  curve_horizon=10_000),
                                oracle=OracleConfig(streams=2000, alphas=(0.05, 1e-2, 1e-3, 1e-4), horizon=8000),
                                trial=TrialConfig(streams=2000), cs=CSConfig(streams=2000), batch_size=1000),
    },
    run=run,
)
