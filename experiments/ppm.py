"""PPM: probabilistic forecasting of non-stationary multivariate series (Li et al., arXiv:2605.23402).

No ETT/ECL files offline, so the data are generated: C channels mixed from a few latent factors, each
a piecewise-linear trend (random slope breaks) + daily (24) and weekly (168) seasonality whose
amplitudes drift as slow random walks + a Markov regime chain that shifts the level and rescales the
daily cycle, plus heteroscedastic noise whose scale follows a slow log random walk. Two noise variants:

* ``gaussian``: Gaussian noise;
* ``bimodal``: a symmetric two-component mixture (modes at +-0.9, within-mode std 0.44, unit variance),
  where a Gaussian predictive distribution is misspecified.

Splits 70/10/20 by time, standardized with the training split's per-channel mean and std (as the
Time-Series-Library loaders do); windows L -> H, all metrics on that standardized scale.

Models, each trained on the same windows with the same Adam "type1" schedule and early stopping:
PPM (hybrid loss, tau KDE-NLL + MSE), a Gaussian-head MLP (NLL), a quantile-regression MLP (pinball), a
point MLP with validation-residual bootstrap, seasonal naive (period 24) with residual bootstrap, and a
conditional DDPM (`primitives.ddpm`, an MLP noise predictor of PPM's size conditioned on the window,
CSDI's T = 50 quadratic schedule, T ancestral steps per forecast): the deep-generative class the paper
compares with (TimeGrad, CSDI, TMDM, NsDiff are DDPMs with larger denoisers; not built here).

Reported per dataset and model: CRPS, QICE, MSE, MAE, 50% / 90% interval coverage, PIT calibration
error, parameter count, training wall time and inference time per window (same process).

Claims checked. The paper's (abstract): deep generative models "struggle ... without extensive data and
computation", PPM "yields precise forecasts with well-calibrated uncertainty estimates" and "outperforms
existing baselines ..., offering a superior trade-off between accuracy and computational efficiency".
Required, against the conditional DDPM on every variant: (3) PPM's CRPS <= the DDPM's; (4) PPM's QICE
<= the DDPM's; (5) the DDPM costs >= 10x PPM's inference time per window (threshold ours: one pass vs
T = 50). Reported but not deciding (issue 33: they are the spec's CPU-plan targets, section 10(d),
not the paper's statements): (1) PPM's CRPS <= the Gaussian head's on the bimodal variant; (2) PPM's
QICE < the point MLP + bootstrap's on every variant. Also reported: the lowest-CRPS model, a "PPM +
kernel noise" row (PPM's samples plus the loss's N(0, h^2) kernel noise, i.e. draws from the density
the KDE-NLL fits; the released code scores raw samples), and a sweep of PPM's training samples K and
KDE bandwidth h (the released K = 100, h = 0.3 is the main row in `quick` and `paper`) with coverage.

Recipe:
    python -m experiments run ppm --preset smoke     # seconds, used by the tests
    python -m experiments run ppm --preset quick     # about 3 CPU minutes (d_model 32, <= 800 steps per model)
    python -m experiments run ppm --preset paper     # the released sizes (d_model 256, H 192, K 100)
    python -m experiments run ppm --preset smoke --loss.bandwidth 0.1   # one field of a config section

Config sections (`run ppm --help` lists every field): data, model, loss, sweep, ddpm, train.
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
from flax import nnx

from algorithms.forecasting import ppm as F
from experiments import _plotting as plotting
from experiments import registry, report
from experiments.checks import Check
from experiments.checks import verdict as verdict_from_checks
from models import ppm as M
from primitives import ddpm
from primitives import probabilistic_metrics as pm

NOISES = ("gaussian", "bimodal")
DDPM = "Conditional DDPM"
MODELS = ("PPM", "Gaussian MLP", "Quantile MLP", "MLP + bootstrap", "Seasonal naive + bootstrap", DDPM)
REQUIRED = ("PPM", "Gaussian MLP", "MLP + bootstrap", DDPM)  # the claims compare these
SPEEDUP_THRESHOLD = 10.0
SWEEP_METRICS = ("crps", "qice", "coverage_0.9")  # check (5): DDPM / PPM inference time per window
KDE_ROW = "PPM + kernel noise"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    """The generated series and their windows L -> H (``--data.length 6000 --data.noises bimodal``)."""

    length: int = 8000
    num_channels: int = 7
    num_factors: int = 3
    noise_level: float = 0.6
    noises: tuple[str, ...] = NOISES
    seq_len: int = 96
    pred_len: int = 24
    max_test_windows: int = 0  # 0 = all


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The widths every MLP-based model shares (``--model.d-model 32``)."""

    d_model: int = 64
    d_ff: int = 128
    num_quantiles: int = 19


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossSection:
    """PPM's hybrid loss (tau KDE-NLL + MSE) and its sample counts (``--loss.bandwidth 0.1``)."""

    tau: float = 0.1
    bandwidth: float = 0.3
    train_samples: int = 16
    test_samples: int = 100  # K samples per window of every sampled model at test time
    beta_kl: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSection:
    """PPM retrained with other (training samples K, KDE bandwidth h) pairs on `noises`, reported
    (``--sweep.pairs 8 0.3 32 0.1``)."""

    pairs: tuple[tuple[int, float], ...] = ()
    noises: tuple[str, ...] = ("bimodal",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DDPMSection:
    """The conditional DDPM baseline (``--ddpm.epochs 60``).

    Its noise-prediction loss is noisier than the others' and needs more steps (quick scale: CRPS 0.59 after
    the shared 630 steps at lr 1e-3, 0.27 after 1890 at 3e-3), so it gets its own learning rate and epoch
    count; everything else is shared (`train`).
    """

    diffusion_steps: int = 50
    learning_rate: float = 3e-3
    epochs: int = 30
    lr_decay: float = 0.9


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """Adam with the "type1" schedule and early stopping, shared by every model (``--train.epochs 20``)."""

    learning_rate: float = 1e-3
    lr_decay: float = 0.8
    batch_size: int = 64
    epochs: int = 10
    patience: int = 3
    max_steps_per_epoch: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """ppm settings, in sections overridden on the command line as ``--loss.bandwidth 0.1``."""

    data: DataSection = DataSection()
    models: tuple[str, ...] = MODELS  # must contain REQUIRED
    model: ModelSection = ModelSection()
    loss: LossSection = LossSection()
    sweep: SweepSection = SweepSection()
    ddpm: DDPMSection = DDPMSection()
    train: TrainSection = TrainSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        err = registry.ConfigError
        if not self.data.noises or any(n not in NOISES for n in self.data.noises):
            raise err("data.noises", f"must be a non-empty subset of {NOISES}; got {self.data.noises}")
        unknown = [m for m in self.models if m not in MODELS]
        missing = [m for m in REQUIRED if m not in self.models]
        if unknown or missing:
            raise err("models", f"must be a subset of {MODELS} containing {REQUIRED}; got {self.models}")


def make_series(key: jax.Array, *, length: int, num_channels: int, num_factors: int = 3, noise: str = "gaussian",
                noise_level: float = 0.6) -> np.ndarray:
    """A non-stationary [length, num_channels] series (see the module docstring), float32 numpy.

    The draws come from numpy's PCG64 seeded by ``key``'s data (a deterministic function of the key;
    numpy because dozens of small eager jax.random calls would each compile).
    """
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if length < 2 or num_channels < 1 or num_factors < 1:
        raise ValueError(f"need length >= 2, num_channels >= 1, num_factors >= 1; got {length}, {num_channels}, "
                         f"{num_factors}")
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    t = np.arange(length, dtype=np.float64)
    f = num_factors
    # Piecewise-linear trend: the slope is redrawn at breaks, about every 1500 steps.
    breaks = rng.random((length, f)) < 1.0 / 1500
    breaks[0] = True
    slopes = rng.standard_normal((length, f)) * 1.5e-3
    last = np.maximum.accumulate(np.where(breaks, np.arange(length)[:, None], 0), axis=0)
    trend = np.cumsum(np.take_along_axis(slopes, last, axis=0), axis=0)
    # Seasonality (periods 24 and 168) with amplitudes drifting as bounded random walks.
    amp_d = 1.0 + 0.5 * np.tanh(np.cumsum(rng.standard_normal((length, f)) * 0.01, axis=0))
    amp_w = 0.6 + 0.3 * np.tanh(np.cumsum(rng.standard_normal((length, f)) * 0.01, axis=0))
    phase = rng.random((2, f)) * 2 * math.pi
    # Markov regimes (3 states, switch probability 1/400 per step): level shift and daily-cycle scale.
    switches = rng.random(length) < 1.0 / 400
    jumps = rng.integers(1, 3, length)
    state = np.cumsum(np.where(switches, jumps, 0)) % 3
    loadings = np.array(([1.0, -0.7, 0.5] + [0.3] * max(0, f - 3))[:f])
    level = np.array([-1.0, 0.0, 1.5])[state][:, None] * loadings
    dscale = np.array([1.0, 0.4, 1.6])[state][:, None]
    daily = dscale * amp_d * np.sin(2 * math.pi * t[:, None] / 24 + phase[0])
    weekly = amp_w * np.sin(2 * math.pi * t[:, None] / 168 + phase[1])
    factors = trend + daily + weekly + level  # [T, f]
    signal = factors @ (rng.standard_normal((f, num_channels)) / math.sqrt(f))  # cross-channel mixing
    # Heteroscedastic noise: the log scale follows a bounded slow random walk.
    log_scale = 0.5 * np.tanh(np.cumsum(rng.standard_normal((length, num_channels)) * 0.02, axis=0))
    if noise == "gaussian":
        eps = rng.standard_normal((length, num_channels))
    else:  # symmetric two-mode mixture with unit variance: 0.9^2 + 0.19 = 1
        sign = np.where(rng.random((length, num_channels)) < 0.5, 1.0, -1.0)
        eps = 0.9 * sign + math.sqrt(1 - 0.81) * rng.standard_normal((length, num_channels))
    return (signal + noise_level * np.exp(log_scale) * eps).astype(np.float32)


def _splits(series: np.ndarray, c: Config):
    n = series.shape[0]
    a, b = int(0.7 * n), int(0.8 * n)
    mean, std = series[:a].mean(0), series[:a].std(0) + 1e-8
    z = (series - mean) / std
    # Each later split keeps the preceding seq_len steps as look-back (as in Time-Series-Library).
    parts = (z[:a], z[a - c.data.seq_len:b], z[b - c.data.seq_len:])
    return [F.sliding_windows(p, seq_len=c.data.seq_len, pred_len=c.data.pred_len) for p in parts]


def _timeit(fn):
    out = fn()
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return out, time.perf_counter() - t0


def _model_config(c: Config) -> M.PPMConfig:
    return M.PPMConfig(seq_len=c.data.seq_len, pred_len=c.data.pred_len, d_model=c.model.d_model, d_ff=c.model.d_ff)


def _train_config(c: Config) -> F.TrainConfig:
    return F.TrainConfig(learning_rate=c.train.learning_rate, lr_decay=c.train.lr_decay,
                         batch_size=c.train.batch_size, epochs=c.train.epochs, patience=c.train.patience,
                         max_steps_per_epoch=c.train.max_steps_per_epoch, progress=c.progress)


def _loss_config(c: Config) -> F.HybridLossConfig:
    return F.HybridLossConfig(tau=c.loss.tau, bandwidth=c.loss.bandwidth, num_samples=c.loss.train_samples,
                              beta_kl=c.loss.beta_kl)


def _run_dataset(c: Config, noise: str, key: jax.Array):
    kd, kt, ks = jax.random.split(key, 3)
    series = make_series(kd, length=c.data.length, num_channels=c.data.num_channels, num_factors=c.data.num_factors,
                         noise=noise, noise_level=c.data.noise_level)
    (xtr, ytr), (xva, yva), (xte, yte) = _splits(series, c)
    if c.data.max_test_windows:
        xte, yte = xte[:c.data.max_test_windows], yte[:c.data.max_test_windows]
    mcfg, tcfg, lcfg = _model_config(c), _train_config(c), _loss_config(c)
    K, nte = c.loss.test_samples, xte.shape[0]
    samples, cost = {}, {}

    def fit(name, model, loss, config=tcfg):
        r = F.train(model, loss, (xtr, ytr), (xva, yva), key=jax.random.fold_in(kt, MODELS.index(name)),
                    config=config)
        cost[name] = {"params": r.num_params, "train_s": r.wall_s, "steps": r.steps, "best_epoch": r.best_epoch,
                      "val_curve": [h["val_loss"] for h in r.history]}
        return r.model

    def timed(name, fn):
        out, t = _timeit(fn)
        cost[name]["infer_ms_per_window"] = 1e3 * t / nte
        return out

    ppm = fit("PPM", M.PPM(mcfg, rngs=nnx.Rngs(c.seed)), F.make_ppm_loss(lcfg))
    samples["PPM"] = timed("PPM", lambda: F.sample_ppm(ppm, xte, jax.random.fold_in(ks, 0), num_samples=K))
    samples[KDE_ROW] = F.kde_samples(jax.random.fold_in(ks, 5), samples["PPM"], bandwidth=c.loss.bandwidth)
    cost[KDE_ROW] = dict(cost["PPM"])

    gm = fit("Gaussian MLP", M.GaussianMLP(mcfg, rngs=nnx.Rngs(c.seed)), F.gaussian_nll_loss)
    mean, std = timed("Gaussian MLP", lambda: F.predict(gm, xte))
    samples["Gaussian MLP"] = F.gaussian_samples(jax.random.fold_in(ks, 1), mean, std, num_samples=K)
    gauss_closed_crps = float(jnp.mean(pm.crps_gaussian(yte, mean, std)))

    if "Quantile MLP" in c.models:
        qm = fit("Quantile MLP", M.QuantileMLP(mcfg, num_quantiles=c.model.num_quantiles, rngs=nnx.Rngs(c.seed)),
                 F.pinball_loss)
        samples["Quantile MLP"] = jnp.sort(timed("Quantile MLP", lambda: F.predict(qm, xte)), axis=1)

    pmod = fit("MLP + bootstrap", M.PointMLP(mcfg, rngs=nnx.Rngs(c.seed)), F.mse_loss)
    point = timed("MLP + bootstrap", lambda: F.predict(pmod, xte))
    resid = yva - np.asarray(F.predict(pmod, xva))
    samples["MLP + bootstrap"] = F.bootstrap_samples(jax.random.fold_in(ks, 3), point, resid, num_samples=K)

    if DDPM in c.models:
        sch = ddpm.ddpm_schedule(num_steps=c.ddpm.diffusion_steps)
        dm = fit(DDPM, M.DiffusionMLP(mcfg, rngs=nnx.Rngs(c.seed)), F.make_ddpm_loss(sch),
                 dataclasses.replace(tcfg, learning_rate=c.ddpm.learning_rate, epochs=c.ddpm.epochs,
                                     lr_decay=c.ddpm.lr_decay, patience=0))
        samples[DDPM] = timed(DDPM, lambda: F.sample_ddpm(dm, xte, jax.random.fold_in(ks, 6), sch, num_samples=K))

    if "Seasonal naive + bootstrap" in c.models:
        sn_val = F.seasonal_naive(xva, period=24, pred_len=c.data.pred_len)
        cost["Seasonal naive + bootstrap"] = {"params": 0, "train_s": 0.0, "steps": 0}
        sn = timed("Seasonal naive + bootstrap", lambda: F.seasonal_naive(xte, period=24, pred_len=c.data.pred_len))
        samples["Seasonal naive + bootstrap"] = F.bootstrap_samples(jax.random.fold_in(ks, 4), sn,
                                                                   yva - np.asarray(sn_val), num_samples=K)
    res, pits = {}, {}
    for i, name in enumerate(samples):
        res[name], pit = F.evaluate(samples[name], yte, key=jax.random.fold_in(ks, 100 + i), return_pit=True)
        res[name].update({k: v for k, v in cost[name].items() if not k.endswith("curve")})
        pits[name] = pit.ravel()
    res["Gaussian MLP"]["crps_closed_form"] = gauss_closed_crps
    sweep = {}  # "K=.., h=..": CRPS, QICE, coverage of PPM trained with that pair (main pair included)
    if noise in c.sweep.noises and c.sweep.pairs:
        sweep[f"K={c.loss.train_samples}, h={c.loss.bandwidth:g}"] = {m: res["PPM"][m] for m in SWEEP_METRICS}
        for k_train, h in c.sweep.pairs:
            if (k_train, h) == (c.loss.train_samples, c.loss.bandwidth):
                continue
            lc = dataclasses.replace(lcfg, num_samples=int(k_train), bandwidth=float(h))
            r = F.train(M.PPM(mcfg, rngs=nnx.Rngs(c.seed)), F.make_ppm_loss(lc), (xtr, ytr), (xva, yva),
                        key=jax.random.fold_in(kt, MODELS.index("PPM")), config=tcfg)
            sc = F.evaluate(F.sample_ppm(r.model, xte, jax.random.fold_in(ks, 0), num_samples=K), yte,
                            key=jax.random.fold_in(ks, 99))
            sweep[f"K={k_train}, h={h:g}"] = {m: sc[m] for m in SWEEP_METRICS}
    extra = {"series": series, "xte": xte[:1], "yte": yte[:1], "samples": {k: np.asarray(v[:1]) for k, v in samples.items()},
             "curves": {k: v.get("val_curve") for k, v in cost.items()}, "pit": pits,
             "windows": (xtr.shape[0], xva.shape[0], nte), "sweep": sweep}
    return res, extra


def _num_train_windows(c: Config) -> int:
    """Training windows of one series (as `_splits` cuts them): the first 70% of the steps, stride 1."""
    return int(0.7 * c.data.length) - c.data.seq_len - c.data.pred_len + 1


def _step_loss(model: M.PPM, batch: Mapping[str, Any], *, loss: F.LossFn):
    """PPM's hybrid loss of one training step with the step's PRNG key carried in the batch.

    `F.train`'s step takes windows ``(x, y)`` and one ``rbg`` key per step (`run`'s keys are ``rbg``); a
    `experiments.aot.TrainStep` batch holds only arrays with a batch axis, so the key's raw data rides along
    as ``batch["key"]`` ``[batch_size, 4]`` uint32 and row 0 is the step's key.
    """
    key = jax.random.wrap_key_data(batch["key"][0], impl="rbg")
    return loss(model, batch["x"], batch["y"], key)


def train_step(c: Config):
    """PPM's training step (`F.train` of the hybrid loss, `_run_dataset`'s main model), for
    ``python -m experiments aot ppm`` (`experiments.aot`): `models.ppm.PPM` of `_model_config`, the loss
    `F.make_ppm_loss(_loss_config(c))`, the optax transformation `F.make_optimizer` builds for `F.train` (Adam
    with the per-epoch "type1" rate; its steps per epoch from the training windows of one series), and a batch
    of the windows `F.train` feeds one step (x [B, L, c], y [B, H, c] float32) plus the step's key
    (`_step_loss`). The baselines (Gaussian, quantile, point MLPs, the DDPM) train with the same loop and are
    not hooked."""
    import functools

    from experiments import aot

    mcfg, tcfg = _model_config(c), _train_config(c)
    bs, steps_per_epoch = F.epoch_steps(_num_train_windows(c), tcfg)
    key_data = jax.random.key_data(jax.random.key(c.seed, impl="rbg"))
    batch = {"x": jnp.zeros((bs, c.data.seq_len, c.data.num_channels), jnp.float32),
             "y": jnp.zeros((bs, c.data.pred_len, c.data.num_channels), jnp.float32),
             "key": jnp.zeros((bs, *key_data.shape), key_data.dtype)}
    return aot.TrainStep.from_batch(batch, model=mcfg, model_fn=lambda rngs: M.PPM(mcfg, rngs=rngs),
                                    loss_fn=functools.partial(_step_loss, loss=F.make_ppm_loss(_loss_config(c))),
                                    optimizer=F.make_optimizer(tcfg, steps_per_epoch))


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    per = metrics["per_dataset"]
    noises = sorted(per, key=lambda n: n != "bimodal")  # the bimodal variant first
    tag = "/".join(noises)
    crps = "/".join(f"{per[n]['PPM']['crps']:.3f}" for n in noises)
    out = [f"CRPS PPM {crps} vs DDPM " + "/".join(f"{per[n][DDPM]['crps']:.3f}" for n in noises) + f" ({tag})",
           "QICE PPM " + "/".join(f"{100 * per[n]['PPM']['qice']:.1f}" for n in noises) + "% vs DDPM "
           + "/".join(f"{100 * per[n][DDPM]['qice']:.1f}" for n in noises) + "%",
           f"DDPM {metrics['ddpm_over_ppm_infer_time']:.0f}x slower per window",
           "90% coverage PPM " + "/".join(f"{per[n]['PPM']['coverage_0.9']:.2f}" for n in noises)]
    return "synthetic series: " + "; ".join(out)


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = pathlib.Path(workdir)
    # RBG keys: XLA compiles their bit generator ~10x faster than threefry's on CPU (seconds per shape).
    key = jax.random.key(c.seed, impl="rbg")
    per, extras = {}, {}
    for i, noise in enumerate(c.data.noises):
        per[noise], extras[noise] = _run_dataset(c, noise, jax.random.fold_in(key, NOISES.index(noise)))
    rows = list(per[c.data.noises[0]])

    def crps(n, m):
        return per[n][m]["crps"]

    claim1 = crps("bimodal", "PPM") <= crps("bimodal", "Gaussian MLP") if "bimodal" in per else None
    claim2 = all(per[n]["PPM"]["qice"] < per[n]["MLP + bootstrap"]["qice"] for n in per)
    best = {n: min((m for m in rows if m != KDE_ROW), key=lambda m: crps(n, m)) for n in per}

    lines = []
    for n in per:
        r = per[n]
        lines.append(f"[{n}] CRPS " + ", ".join(f"{m} {r[m]['crps']:.4f}" for m in rows)
                     + "; QICE " + ", ".join(f"{m} {100 * r[m]['qice']:.2f}%" for m in rows)
                     + "; MSE " + ", ".join(f"{m} {r[m]['mse']:.4f}" for m in rows)
                     + "; 90% coverage " + ", ".join(f"{m} {r[m]['coverage_0.9']:.3f}" for m in rows))
    p0 = per[c.data.noises[0]]
    cost_txt = ", ".join(f"{m} {p0[m]['params']} params / {p0[m]['train_s']:.1f} s train / "
                         f"{p0[m]['infer_ms_per_window']:.3f} ms per window" for m in rows if m != KDE_ROW)

    checks = []
    spec_note = "the spec's CPU-plan target (10(d), inferred), not the paper's statement; reported only"
    if claim1 is not None:
        checks.append(Check("(1) PPM CRPS on the bimodal variant", crps("bimodal", "PPM"),
                            paper="PPM's density head beats a Gaussian head when the noise is multimodal",
                            threshold=f"<= Gaussian MLP {crps('bimodal', 'Gaussian MLP'):.4f}", passed=claim1,
                            note=spec_note, required=False))
    for n in per:
        checks.append(Check(f"(2) PPM QICE on the {n} variant", per[n]["PPM"]["qice"],
                            paper="QICE 1.475% (ETTh1, H=192), calibrated quantiles",
                            threshold=f"< MLP + bootstrap {per[n]['MLP + bootstrap']['qice']:.4f}",
                            passed=per[n]["PPM"]["qice"] < per[n]["MLP + bootstrap"]["qice"],
                            note=spec_note, required=False))
    for n in per:
        checks.append(Check(f"(3) PPM CRPS vs the conditional DDPM, {n} variant", crps(n, "PPM"),
                            paper="outperforms existing (deep generative) baselines (abstract); ETTh1 CRPS 0.3369",
                            threshold=f"<= DDPM {crps(n, DDPM):.4f}", passed=crps(n, "PPM") <= crps(n, DDPM)))
        checks.append(Check(f"(4) PPM QICE vs the conditional DDPM, {n} variant", per[n]["PPM"]["qice"],
                            paper="well-calibrated uncertainty estimates (abstract); ETTh1 QICE 1.475%",
                            threshold=f"<= DDPM {per[n][DDPM]['qice']:.4f}",
                            passed=per[n]["PPM"]["qice"] <= per[n][DDPM]["qice"]))
    speedup = min(per[n][DDPM]["infer_ms_per_window"] / per[n]["PPM"]["infer_ms_per_window"] for n in per)
    checks.append(Check("(5) inference time per window, DDPM / PPM (worst variant)", speedup,
                        paper="the efficiency of parametric methods; generative models need more computation",
                        threshold=f">= {SPEEDUP_THRESHOLD:g}", passed=speedup >= SPEEDUP_THRESHOLD,
                        note=f"T = {c.ddpm.diffusion_steps} denoiser passes vs one; same process and batch size"))
    sweep_txt = " | ".join(f"[{n}] " + ", ".join(f"{k}: CRPS {v['crps']:.4f}, QICE {100 * v['qice']:.2f}%, "
                                                 f"90% cov. {v['coverage_0.9']:.3f}"
                                                 for k, v in extras[n]["sweep"].items())
                           for n in per if extras[n]["sweep"]) or "not run"
    claim = "PPM beats a conditional DDPM on CRPS and QICE at a fraction of its inference cost"
    verdict, ok = verdict_from_checks(
        checks, claim=claim,
        context=(f"Scale: series length {c.data.length}, {c.data.num_channels} channels, L={c.data.seq_len}, "
                 f"H={c.data.pred_len}, d_model {c.model.d_model}, d_ff {c.model.d_ff}, K={c.loss.train_samples} "
                 f"training / {c.loss.test_samples} test samples, h={c.loss.bandwidth}, <= {c.train.epochs} epochs x "
                 f"{c.train.max_steps_per_epoch or 'all'} steps of batch {c.train.batch_size}, one seed, "
                 f"{extras[c.data.noises[0]]['windows']} train/val/test windows; DDPM with "
                 f"T={c.ddpm.diffusion_steps}. " + " | ".join(lines)
                 + f". Cost ({c.data.noises[0]}, train time includes compilation): " + cost_txt
                 + f". Lowest CRPS (raw-sample rows): {best}. '{KDE_ROW}' adds the loss's N(0, h^2) kernel noise "
                 f"(h={c.loss.bandwidth}) to PPM's samples, i.e. samples the density the KDE-NLL trains. "
                 f"PPM by training samples K and bandwidth h: {sweep_txt}."
                 " Paper (ETTh1, H=192, vs diffusion baselines): CRPS 0.3369, QICE 1.475%, MSE 0.4474"),
        cause=_cause(per, c, {n: extras[n]["sweep"] for n in per}, speedup), cause_class="scale")
    reproduced = ok
    metrics = {"per_dataset": per, "claim_ppm_crps_le_gaussian_bimodal": claim1,
               "claim_ppm_qice_lt_bootstrap": claim2, "best_crps_model": best, "ddpm_over_ppm_infer_time": speedup,
               "sweep": {n: extras[n]["sweep"] for n in per}, "checks": [ch.as_dict() for ch in checks]}
    for n in per:
        for m, tag in (("PPM", "ppm"), (KDE_ROW, "ppm_kde"), ("Gaussian MLP", "gaussian"), ("MLP + bootstrap", "bootstrap"),
                       (DDPM, "ddpm")):
            metrics[f"{n}_{tag}_crps"] = per[n][m]["crps"]
            metrics[f"{n}_{tag}_qice"] = per[n][m]["qice"]
            metrics[f"{n}_{tag}_coverage90"] = per[n][m]["coverage_0.9"]
    plots = [_plot_forecasts(extras, c, workdir), _plot_calibration(extras, per, workdir), _plot_cost(per, c, workdir)]
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots,
            "cause": "scale" if not reproduced else None}


def _cause(per: Mapping[str, Any], c: Config, sweep: Mapping[str, Any], speedup: float) -> str:
    """Why the paper-statement checks fail (class "scale"), with the run's accuracy, calibration and cost numbers."""
    acc = "; ".join(f"{n}: CRPS PPM {per[n]['PPM']['crps']:.4f} vs DDPM {per[n][DDPM]['crps']:.4f}, QICE "
                    f"{100 * per[n]['PPM']['qice']:.2f}% vs {100 * per[n][DDPM]['qice']:.2f}%" for n in per)
    cov = ", ".join(f"{n} {per[n]['PPM']['coverage_0.9']:.2f} (with kernel noise {per[n][KDE_ROW]['coverage_0.9']:.2f})"
                    for n in per)
    swept = "; ".join(f"{n}: " + ", ".join(f"{k} -> 90% coverage {v['coverage_0.9']:.2f}, QICE {100 * v['qice']:.2f}%"
                                            for k, v in rows.items()) for n, rows in sweep.items() if rows)
    return (f"a small conditional DDPM ({per[next(iter(per))][DDPM]['params']} parameters, {c.ddpm.epochs} epochs) "
            f"learns these series as well as PPM or better ({acc}); the abstract's case against generative models is "
            f"that they need extensive data and computation, and {c.data.length} steps of {c.data.num_channels} "
            f"synthetic channels at H={c.data.pred_len} are enough data for one this small, while the cost side does "
            f"show (PPM forecasts in one pass, {speedup:.0f}x faster per window). PPM's raw samples are "
            f"under-dispersed at the released bandwidth h={c.loss.bandwidth} (90% coverage {cov}): the MSE on the mean "
            f"of K={c.loss.train_samples} training samples rewards a spread shrinking by Var/K and the KDE-NLL fits "
            f"samples narrower than the target by h" + (f"; retrained with other (K, h): {swept}" if swept else ""))


def _plot_forecasts(extras, c: Config, workdir):
    cols = ("PPM", KDE_ROW, "Gaussian MLP")
    fig, axes = plotting.subplots(len(extras), 1 + len(cols), figsize=(16, 3.2 * len(extras)), squeeze=False)
    for row, (noise, ex) in enumerate(extras.items()):
        ax = axes[row, 0]
        ax.plot(ex["series"][:: max(1, ex["series"].shape[0] // 2000), :3], lw=0.4)
        ax.set(title=f"{noise}: raw series (<= 3 of {c.data.num_channels} channels)", xlabel="t (subsampled)")
        for col, m in enumerate(cols):
            ax = axes[row, col + 1]
            s = ex["samples"][m][0, :, :, 0]  # [K, H]
            x, y = ex["xte"][0, :, 0], ex["yte"][0, :, 0]
            tx, ty = np.arange(-c.data.seq_len, 0), np.arange(c.data.pred_len)
            ax.plot(tx, x, color="k", lw=1)
            ax.plot(ty, y, color="k", lw=1, ls="--", label="truth")
            lo, hi = np.quantile(s, [0.05, 0.95], axis=0)
            ax.fill_between(ty, lo, hi, alpha=0.3, label="90% band")
            ax.plot(ty, s[:5].T, lw=0.5, alpha=0.7)
            ax.set(title=f"{noise}: {m}, test window 0, ch. 0", xlim=(-min(48, c.data.seq_len), c.data.pred_len))
            ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "forecasts.png")


def _plot_calibration(extras, per, workdir):
    fig, axes = plotting.subplots(1, len(extras) + 1, figsize=(4.5 * (len(extras) + 1), 3.6), squeeze=False)
    for i, (noise, ex) in enumerate(extras.items()):
        ax = axes[0, i]
        for m in ex["pit"]:
            u = np.sort(ex["pit"][m])
            ax.plot(u, np.linspace(0, 1, u.size), label=m, lw=1.2)
        ax.plot([0, 1], [0, 1], "k:", lw=0.8)
        ax.set(title=f"{noise}: PIT CDF (diagonal = calibrated)", xlabel="PIT", ylabel="fraction")
        ax.legend(fontsize=6)
    ax = axes[0, -1]
    w = 0.8 / len(per)
    rows = list(next(iter(per.values())))
    for j, noise in enumerate(per):
        ax.bar(np.arange(len(rows)) + j * w, [per[noise][m]["crps"] for m in rows], w, label=noise)
    ax.set_xticks(np.arange(len(rows)) + 0.4 - w / 2, [m.replace(" + ", "+\n") for m in rows], fontsize=6)
    ax.set(title="test CRPS (lower is better)")
    ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "calibration.png")


def _plot_cost(per, c: Config, workdir):
    noise = c.data.noises[0]
    fig, ax = plotting.subplots(figsize=(6, 3.8))
    for m in per[noise]:
        if m == KDE_ROW:
            continue
        r = per[noise][m]
        ax.scatter(max(r["train_s"], 1e-2), r["crps"], s=30 + r["params"] / 300, label=f"{m} ({r['params']} p)")
    ax.set(xscale="log", xlabel="training wall time (s)", ylabel="test CRPS", title=f"{noise}: cost vs accuracy")
    ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "cost.png")


EXPERIMENT = registry.Experiment(
    slug="ppm",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(data=DataSection(length=900, num_channels=2, seq_len=48, pred_len=12,
                                                 max_test_windows=64, noises=("bimodal",)),
                                model=ModelSection(d_model=16, d_ff=32, num_quantiles=9),
                                loss=LossSection(train_samples=8, test_samples=32),
                                train=TrainSection(epochs=2, max_steps_per_epoch=10), progress=False,
                                models=REQUIRED, ddpm=DDPMSection(diffusion_steps=4, epochs=2),
                                sweep=SweepSection(pairs=((4, 0.1),))),
        "quick": lambda: Config(data=DataSection(length=6000, max_test_windows=512),
                                model=ModelSection(d_model=32, d_ff=64),
                                train=TrainSection(epochs=10, max_steps_per_epoch=80),
                                loss=LossSection(train_samples=32),
                                sweep=SweepSection(pairs=((8, 0.3), (100, 0.3), (32, 0.1))), progress=False),
        "paper": lambda: Config(data=DataSection(length=20000, pred_len=192), model=ModelSection(d_model=256, d_ff=512),
                                loss=LossSection(train_samples=100),
                                train=TrainSection(learning_rate=1e-4, lr_decay=0.5, epochs=30, patience=5),
                                sweep=SweepSection(pairs=((100, 0.1), (100, 0.5))),
                                ddpm=DDPMSection(learning_rate=1e-3, epochs=90)),
    },
    run=run,
    train_step=train_step,
)
