"""Parametric Prior Mapping (PPM): hybrid loss, training, sampling, evaluation and baselines.

The model (:class:`models.ppm.PPM`) maps a look-back window x to K forecast samples ``y^_1..y^_K`` by
pushing draws of an input-adaptive Gaussian prior ``N(mu(x), sigma^2(x))`` through a learnable mapping.
It is trained with the **hybrid loss** of the released code,

    loss = tau * KDE-NLL + MSE(mean_k y^_k, y) [+ beta * KL(N(mu, sigma^2) || N(0, I))],

    KDE-NLL = - mean_b clamp( mean_{t,c} [ log sum_k Kern((y - y^_k) / h) - log K - log h ], min=-25 ),

i.e. the negative log-likelihood of the target under a kernel density estimate with bandwidth h built
from the K samples (Gaussian kernel by default; Laplace, Student-t(nu), Cauchy and logistic kernels
too), computed on the data's (globally standardized) scale after undoing the per-window instance
normalization. tau = 0.1, h = 0.3, K = 100 and beta = 0 (no KL term) are the released defaults.

Baselines (same MLP trunk and instance normalization, :mod:`models.ppm`):

* Gaussian head (:func:`gaussian_nll_loss`): per-step mean and std, Gaussian NLL;
* quantile regression (:func:`pinball_loss`): Q quantiles at levels ``(q - 1/2) / Q``, pinball loss;
  its quantiles are used as an ensemble of Q members;
* point MLP + residual bootstrap (:func:`mse_loss`, :func:`bootstrap_samples`): deterministic forecast
  plus horizon-long residual vectors resampled from the validation split;
* seasonal naive + residual bootstrap (:func:`seasonal_naive`): repeat the last period;
* conditional DDPM (:func:`make_ddpm_loss`, :func:`sample_ddpm`, :class:`models.ppm.DiffusionMLP`): the
  deep-generative class the paper compares with (TimeGrad, CSDI, ... are DDPMs with other denoisers),
  trained on the noise-prediction loss on the instance-normalized horizon and sampled with T ancestral
  steps (CSDI's T = 50 quadratic schedule by default), so each forecast costs T network passes.

Training (:func:`train`) is a jitted optax Adam loop over shuffled mini-batches with the code's "type1"
schedule ``lr_e = lr * decay^(e - 1)`` per epoch (:func:`make_optimizer`) and early stopping on the validation
loss (the best parameters are kept). :func:`evaluate` scores sample forecasts with MSE/MAE of the sample mean,
ensemble CRPS, QICE, central-interval coverage and PIT calibration error (:mod:`primitives.probabilistic_metrics`).

Usage:

    model = models.ppm.PPM(PPMConfig(seq_len=96, pred_len=24, d_model=64, d_ff=128), rngs=nnx.Rngs(0))
    loss = make_ppm_loss(HybridLossConfig(num_samples=16))
    result = train(model, loss, (x_tr, y_tr), (x_va, y_va), key=jax.random.key(0), config=TrainConfig())
    samples = sample_ppm(result.model, x_te, jax.random.key(1), num_samples=100)   # [b, K, H, c]
    scores = evaluate(samples, y_te)

Dimension legend: ``b`` windows, ``L`` look-back, ``H`` horizon, ``c`` channels, ``K`` samples.

References:
  Li, Tan, Fang, Gui, "Parametric Prior Mapping Framework for Non-stationary Probabilistic Time Series
  Forecasting", arXiv:2605.23402 (ICML 2026); code github.com/ljl8336/PPM.
  Koenker, Bassett, "Regression Quantiles", Econometrica 1978.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.scipy.special import gammaln

from models.ppm import PPM, DiffusionMLP, GaussianMLP, PointMLP, QuantileMLP, count_params, instance_normalize
from primitives import ddpm
from primitives import probabilistic_metrics as pm

__all__ = [
    "KERNELS",
    "HybridLossConfig",
    "TrainConfig",
    "TrainResult",
    "kernel_log_density",
    "kde_log_likelihood",
    "kde_nll",
    "gaussian_kl",
    "hybrid_loss",
    "make_ppm_loss",
    "gaussian_nll_loss",
    "pinball_loss",
    "mse_loss",
    "make_ddpm_loss",
    "sample_ddpm",
    "quantile_levels",
    "epoch_learning_rate",
    "epoch_steps",
    "make_optimizer",
    "train",
    "sample_ppm",
    "predict",
    "gaussian_samples",
    "kde_samples",
    "bootstrap_samples",
    "seasonal_naive",
    "sliding_windows",
    "evaluate",
]

KERNELS = ("gaussian", "laplace", "student_t", "cauchy", "logistic")


# ----------------------------------------------------------------------------------------------
# The hybrid loss.
# ----------------------------------------------------------------------------------------------

def kernel_log_density(u: jax.Array, kernel: str = "gaussian", *, nu: float = 5.0) -> jax.Array:
    """log Kern(u) of a standardized (unit-scale) kernel.

    Examples:
      >>> round(float(kernel_log_density(jnp.array(0.0))), 6)  # -log sqrt(2 pi)
      -0.918939
    """
    if kernel == "gaussian":
        return -0.5 * u * u - 0.5 * math.log(2 * math.pi)
    if kernel == "laplace":
        return -jnp.abs(u) - math.log(2.0)
    if kernel == "student_t":
        if not nu > 0:
            raise ValueError(f"nu must be > 0 for the student_t kernel, got {nu}")
        c = gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * math.log(nu * math.pi)
        return c - (nu + 1) / 2 * jnp.log1p(u * u / nu)
    if kernel == "cauchy":
        return -math.log(math.pi) - jnp.log1p(u * u)
    if kernel == "logistic":
        return -jnp.abs(u) - 2.0 * jax.nn.softplus(-jnp.abs(u))
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def _check_samples_target(samples, y):
    if samples.ndim != 4 or y.ndim != 3 or samples.shape[:1] + samples.shape[2:] != y.shape:
        raise ValueError(f"samples must be [b, K, H, c] and y [b, H, c] with matching b, H, c; got "
                         f"{samples.shape} and {y.shape}")


def kde_log_likelihood(samples: jax.Array, y: jax.Array, *, bandwidth: float = 0.3, kernel: str = "gaussian",
                       nu: float = 5.0, clamp_min: float | None = -25.0) -> jax.Array:
    """Per-window KDE log-likelihood ``clamp(mean_{t,c} log p_KDE(y_{t,c}), clamp_min)``, shape [b].

    ``p_KDE(y) = 1/(K h) sum_k Kern((y - y^_k) / h)`` from the K samples of each (window, step, channel).
    """
    _check_samples_target(samples, y)
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    k = samples.shape[1]
    u = (y[:, None] - samples) / bandwidth
    ll = jax.nn.logsumexp(kernel_log_density(u, kernel, nu=nu), axis=1) - math.log(k) - math.log(bandwidth)
    ll = jnp.mean(ll, axis=(1, 2))
    return ll if clamp_min is None else jnp.maximum(ll, clamp_min)


def kde_nll(samples, y, **kwargs) -> jax.Array:
    """``- mean_b kde_log_likelihood``: the probabilistic half of the hybrid loss (scalar)."""
    return -jnp.mean(kde_log_likelihood(samples, y, **kwargs))


def gaussian_kl(mu: jax.Array, logvar: jax.Array) -> jax.Array:
    """``KL(N(mu, diag e^logvar) || N(0, I))`` summed over the latent axis, averaged over the rest."""
    return jnp.mean(0.5 * jnp.sum(jnp.exp(logvar) + mu * mu - 1.0 - logvar, axis=-1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridLossConfig:
    """The hybrid objective (defaults: the released scripts, except K which the scripts set to 100).

    Attributes:
      tau: weight of the KDE-NLL term.
      bandwidth: KDE bandwidth h (on the data's standardized scale).
      kernel: one of KERNELS.
      nu: Student-t degrees of freedom.
      num_samples: K samples per window during training.
      beta_kl: weight of an optional KL(prior || N(0, I)) term (0 = the released code).
      clamp_min: lower clamp on each window's mean log-likelihood (None: no clamp).
    """

    tau: float = 0.1
    bandwidth: float = 0.3
    kernel: str = "gaussian"
    nu: float = 5.0
    num_samples: int = 100
    beta_kl: float = 0.0
    clamp_min: float | None = -25.0

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0, got {self.bandwidth}")
        if self.tau < 0 or self.beta_kl < 0:
            raise ValueError(f"tau and beta_kl must be >= 0, got {self.tau}, {self.beta_kl}")
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {self.num_samples!r}")


def hybrid_loss(samples, y, *, mu=None, logvar=None, config: HybridLossConfig = HybridLossConfig()):
    """``tau KDE-NLL + MSE(sample mean) [+ beta KL]`` and its parts, from already drawn samples."""
    nll = kde_nll(samples, y, bandwidth=config.bandwidth, kernel=config.kernel, nu=config.nu,
                  clamp_min=config.clamp_min)
    mse = jnp.mean((jnp.mean(samples, axis=1) - y) ** 2)
    loss = config.tau * nll + mse
    parts = {"kde_nll": nll, "mse": mse}
    if config.beta_kl > 0:
        if mu is None or logvar is None:
            raise ValueError("beta_kl > 0 needs the prior's mu and logvar")
        kl = gaussian_kl(mu, logvar)
        loss = loss + config.beta_kl * kl
        parts["kl"] = kl
    return loss, parts


LossFn = Callable[[nnx.Module, jax.Array, jax.Array, jax.Array], tuple[jax.Array, dict]]


def make_ppm_loss(config: HybridLossConfig = HybridLossConfig()) -> LossFn:
    """``(model, x, y, key) -> (loss, parts)`` for a :class:`models.ppm.PPM`."""

    def loss_fn(model, x, y, key):
        out = model(x, key, num_samples=config.num_samples)
        return hybrid_loss(out.samples, y, mu=out.mu, logvar=out.logvar, config=config)

    return loss_fn


def gaussian_nll_loss(model: GaussianMLP, x, y, key=None):
    """Mean Gaussian negative log-likelihood of y under the model's per-step (mean, std)."""
    mean, std = model(x)
    nll = jnp.mean(jnp.log(std) + 0.5 * ((y - mean) / std) ** 2 + 0.5 * math.log(2 * math.pi))
    return nll, {"nll": nll}


def quantile_levels(num_quantiles: int) -> jax.Array:
    """Mid-point levels ``(q - 1/2) / Q``, q = 1..Q."""
    return (jnp.arange(num_quantiles, dtype=jnp.float32) + 0.5) / num_quantiles


def pinball_loss(model: QuantileMLP, x, y, key=None):
    """Mean pinball (quantile) loss over the model's Q levels."""
    q = model(x)  # [b, Q, H, c]
    tau = quantile_levels(q.shape[1])[None, :, None, None]
    d = y[:, None] - q
    loss = jnp.mean(jnp.maximum(tau * d, (tau - 1.0) * d))
    return loss, {"pinball": loss}


def mse_loss(model: PointMLP, x, y, key=None):
    """Mean squared error of a point forecast."""
    loss = jnp.mean((model(x) - y) ** 2)
    return loss, {"mse": loss}


def _normalized_target(model: DiffusionMLP, x, y):
    """(x~ [b, c, L], y~ [b, c, 1, H], m, s): window and horizon on the window's instance-normalized scale."""
    xn, m, s = instance_normalize(x, model.config.eps)
    yn = jnp.swapaxes((y - m) / (s + model.config.eps), 1, 2)[:, :, None, :]
    return xn, yn, m, s


def make_ddpm_loss(schedule: ddpm.DDPMSchedule) -> LossFn:
    """``(model, x, y, key) -> (loss, parts)`` for a :class:`models.ppm.DiffusionMLP`: the mean squared error
    of the predicted noise at one uniformly drawn step t in 1..T per series (Ho et al. eq. 14)."""

    def loss_fn(model, x, y, key):
        xn, yn, _, _ = _normalized_target(model, x, y)
        kt, kn = jax.random.split(key)
        t = jax.random.randint(kt, yn.shape[:3], 1, schedule.num_steps + 1)
        noise = jax.random.normal(kn, yn.shape, yn.dtype)
        yt = ddpm.q_sample(yn, t[..., None], noise, schedule)
        loss = jnp.mean(jnp.square(model(model.condition(xn), yt, t) - noise))
        return loss, {"eps_mse": loss}

    return loss_fn


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples"))
def _ddpm_apply(graphdef, state, schedule, x, key, num_samples):
    model = nnx.merge(graphdef, state)
    xn, m, s = instance_normalize(x, model.config.eps)
    cond = model.condition(xn)
    shape = xn.shape[:2] + (num_samples, model.config.pred_len)

    def step(y, t):
        z = jax.random.normal(jax.random.fold_in(key, t), shape, y.dtype)
        return ddpm.ancestral_step(y, model(cond, y, t), t, z, schedule), None

    y0 = jax.random.normal(jax.random.fold_in(key, 0), shape, jnp.float32)
    y, _ = jax.lax.scan(step, y0, jnp.arange(schedule.num_steps, 0, -1))
    y = jnp.transpose(y, (0, 2, 3, 1))  # [b, K, H, c]
    return y * (s[:, None] + model.config.eps) + m[:, None]


def sample_ddpm(model: DiffusionMLP, x, key: jax.Array, schedule: ddpm.DDPMSchedule, *, num_samples: int = 100,
                batch_size: int = 256) -> jax.Array:
    """K forecast samples [b, K, H, c] (numpy) from a conditional DDPM: T ancestral steps from N(0, I)."""
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    graphdef, state = nnx.split(model)
    return _batched(lambda xb, i: _ddpm_apply(graphdef, state, schedule, jnp.asarray(xb), jax.random.fold_in(key, i),
                                              num_samples), np.asarray(x), batch_size)


# ----------------------------------------------------------------------------------------------
# Training.
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimizer and schedule (defaults: the released ETTh1 script, 30 epochs, lr 1e-4, batch 64).

    Attributes:
      learning_rate: Adam learning rate of epoch 1.
      lr_decay: per-epoch factor ("type1" schedule: lr * decay^(epoch - 1)); 1.0 = constant.
      batch_size: windows per step.
      epochs: maximum epochs.
      patience: early stopping after this many epochs without a better validation loss (0 = never).
      max_steps_per_epoch: cap on steps per epoch (0 = a full pass over the training windows).
      progress: show a tqdm bar.
    """

    learning_rate: float = 1e-4
    lr_decay: float = 0.5
    batch_size: int = 64
    epochs: int = 30
    patience: int = 5
    max_steps_per_epoch: int = 0
    progress: bool = False

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        for name in ("batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class TrainResult(NamedTuple):
    """What :func:`train` returns.

    Attributes:
      model: the model with the best-validation parameters.
      history: one dict per epoch (train_loss, val_loss, lr, seconds).
      wall_s: training wall time in seconds (compilation included).
      steps: optimizer steps taken.
      best_epoch: 1-based epoch of the kept parameters.
      num_params: parameter count.
    """

    model: nnx.Module
    history: list
    wall_s: float
    steps: int
    best_epoch: int
    num_params: int


def _np_rng(key: jax.Array) -> np.random.Generator:
    """A numpy generator seeded by a jax key's data (deterministic in the key)."""
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())


def _check_windows(name, data):
    x, y = data
    if x.ndim != 3 or y.ndim != 3 or x.shape[0] != y.shape[0] or x.shape[2] != y.shape[2]:
        raise ValueError(f"{name} must be (x [n, L, c], y [n, H, c]) with matching n and c; got "
                         f"{np.shape(x)}, {np.shape(y)}")


def epoch_learning_rate(config: TrainConfig, epoch: int) -> float:
    """The "type1" learning rate of 1-based `epoch`: ``lr * decay^(epoch - 1)``."""
    return config.learning_rate * config.lr_decay ** (epoch - 1)


def epoch_steps(num_windows: int, config: TrainConfig) -> tuple[int, int]:
    """(windows per step, steps per epoch) of :func:`train` on `num_windows` training windows."""
    if num_windows < 1:
        raise ValueError(f"num_windows must be >= 1, got {num_windows}")
    bs = min(config.batch_size, num_windows)
    steps = num_windows // bs
    if config.max_steps_per_epoch:
        steps = min(steps, config.max_steps_per_epoch)
    return bs, steps


def make_optimizer(config: TrainConfig, steps_per_epoch: int) -> optax.GradientTransformation:
    """The optimizer :func:`train` steps with: Adam's unit step (`optax.scale_by_adam`) times ``-lr_e``.

    ``lr_e`` is the "type1" rate of the step's epoch (:func:`epoch_learning_rate`, computed in float64 and
    rounded to float32 once), looked up by ``step // steps_per_epoch`` (the last epoch's rate past
    ``config.epochs``); :func:`train` takes exactly `steps_per_epoch` steps per epoch, so step s is in epoch
    ``s // steps_per_epoch + 1``.
    """
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    rates = np.asarray([epoch_learning_rate(config, e) for e in range(1, config.epochs + 1)], np.float32)

    def learning_rate(count):
        return jnp.asarray(rates)[jnp.minimum(count // steps_per_epoch, config.epochs - 1)]

    return optax.chain(optax.scale_by_adam(), optax.scale_by_learning_rate(learning_rate))


def train(model: nnx.Module, loss_fn: LossFn, train_data, val_data, *, key: jax.Array,
          config: TrainConfig = TrainConfig()) -> TrainResult:
    """Adam on mini-batches of ``train_data = (x, y)`` with per-epoch lr decay and early stopping.

    Args:
      model: an NNX module (its parameters are the trainable state).
      loss_fn: ``(model, x, y, key) -> (loss, parts)``.
      train_data: numpy arrays x [n, L, c], y [n, H, c].
      val_data: the same for validation (early stopping).
      key: PRNG key for shuffling and for the loss's noise.
      config: TrainConfig.

    Returns:
      TrainResult.
    """
    from tqdm.auto import tqdm

    _check_windows("train_data", train_data)
    _check_windows("val_data", val_data)
    x_tr, y_tr = (np.asarray(a, np.float32) for a in train_data)
    x_va, y_va = (np.asarray(a, np.float32) for a in val_data)
    n = x_tr.shape[0]
    bs, steps_per_epoch = epoch_steps(n, config)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = make_optimizer(config, steps_per_epoch)
    opt_state = opt.init(params)

    def loss_of(p, x, y, k):
        loss, parts = loss_fn(nnx.merge(graphdef, p, rest), x, y, k)
        return loss, parts

    @jax.jit
    def step(p, s, x, y, k):
        (loss, _), grads = jax.value_and_grad(loss_of, has_aux=True)(p, x, y, k)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    @jax.jit
    def val_loss(p, x, y, k):
        return loss_of(p, x, y, k)[0]

    val_bs = max(bs, 256)
    val_key = jax.random.fold_in(key, 10**6)

    def validate(p):
        tot, cnt = 0.0, 0
        for i in range(0, x_va.shape[0] - val_bs + 1, val_bs):
            tot += float(val_loss(p, x_va[i:i + val_bs], y_va[i:i + val_bs], jax.random.fold_in(val_key, i)))
            cnt += 1
        if cnt == 0:  # fewer validation windows than one batch
            tot, cnt = float(val_loss(p, x_va, y_va, val_key)), 1
        return tot / cnt

    start = time.perf_counter()
    best, best_params, best_epoch, bad, steps, history = math.inf, params, 0, 0, 0, []
    bar = tqdm(total=config.epochs * steps_per_epoch, desc="train", disable=not config.progress, leave=False)
    for epoch in range(1, config.epochs + 1):
        t0 = time.perf_counter()
        lr = epoch_learning_rate(config, epoch)  # what `opt` scales this epoch's steps by
        ekey = jax.random.fold_in(key, epoch)
        perm = _np_rng(ekey).permutation(n)  # numpy: jax's shuffle compiles for seconds on a small CPU
        tot = 0.0
        for i in range(steps_per_epoch):
            idx = perm[i * bs:(i + 1) * bs]
            params, opt_state, loss = step(params, opt_state, x_tr[idx], y_tr[idx], jax.random.fold_in(ekey, i + 1))
            tot += float(loss)
            steps += 1
            bar.update(1)
        v = validate(params)
        history.append({"epoch": epoch, "train_loss": tot / max(steps_per_epoch, 1), "val_loss": v, "lr": lr,
                        "seconds": time.perf_counter() - t0})
        if v < best:
            best, best_params, best_epoch, bad = v, params, epoch, 0
        else:
            bad += 1
            if config.patience and bad >= config.patience:
                break
    bar.close()
    wall = time.perf_counter() - start
    trained = nnx.merge(graphdef, best_params, rest)
    return TrainResult(model=trained, history=history, wall_s=wall, steps=steps, best_epoch=best_epoch,
                       num_params=count_params(trained))


# ----------------------------------------------------------------------------------------------
# Forecasting.
# ----------------------------------------------------------------------------------------------

def _batched(fn, x, batch_size):
    """fn over consecutive batches of x; every call gets exactly ``batch_size`` rows (the last batch is
    padded by repeating its final row, and the padding is dropped), so each model compiles once."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = x.shape[0]
    if n == 0:
        raise ValueError(f"x must hold at least one window, got shape {x.shape}")
    outs = []
    for i in range(0, n, batch_size):
        xb = x[i:i + batch_size]
        m = xb.shape[0]
        if m < batch_size:
            xb = np.concatenate([xb, np.repeat(xb[-1:], batch_size - m, axis=0)], axis=0)
        outs.append(jax.tree.map(lambda a, m=m: np.asarray(a)[:m], fn(xb, i)))
    return jax.tree.map(lambda *a: np.concatenate(a, axis=0), *outs)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples"))
def _ppm_apply(graphdef, state, x, key, num_samples):
    return nnx.merge(graphdef, state)(x, key, num_samples=num_samples).samples


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _apply(graphdef, state, x):
    return nnx.merge(graphdef, state)(x)


def sample_ppm(model: PPM, x, key: jax.Array, *, num_samples: int = 100, batch_size: int = 256) -> jax.Array:
    """K forecast samples [b, K, H, c] (numpy) from a PPM, one forward pass per batch of windows."""
    graphdef, state = nnx.split(model)
    return _batched(lambda xb, i: _ppm_apply(graphdef, state, jnp.asarray(xb), jax.random.fold_in(key, i),
                                             num_samples), np.asarray(x), batch_size)


def predict(model: nnx.Module, x, *, batch_size: int = 256):
    """The deterministic outputs (numpy) of a baseline model (GaussianMLP, QuantileMLP or PointMLP), batched."""
    graphdef, state = nnx.split(model)
    return _batched(lambda xb, i: _apply(graphdef, state, jnp.asarray(xb)), np.asarray(x), batch_size)


def gaussian_samples(key: jax.Array, mean, std, *, num_samples: int) -> jax.Array:
    """K draws [b, K, H, c] from independent Gaussians N(mean, std^2) of shape [b, H, c]."""
    eps = jax.random.normal(key, (mean.shape[0], num_samples) + mean.shape[1:], jnp.float32)
    return mean[:, None] + std[:, None] * eps


def kde_samples(key: jax.Array, samples, *, bandwidth: float = 0.3) -> jax.Array:
    """Draws from the Gaussian-kernel density the hybrid loss fits: ``samples + bandwidth * N(0, 1)``.

    The KDE-NLL scores the target under ``1/K sum_k N(y; y^_k, h^2)``, so a model trained with it spreads
    its raw samples by about ``sqrt(Var(y) - h^2)`` only; adding the kernel noise gives samples of the
    density that was actually trained (same shape as ``samples``). The released code scores raw samples.
    """
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    samples = jnp.asarray(samples)
    return samples + bandwidth * jax.random.normal(key, samples.shape, samples.dtype)


def bootstrap_samples(key: jax.Array, point, residuals, *, num_samples: int) -> jax.Array:
    """``point [b, H, c]`` plus K residual vectors [H, c] drawn with replacement from ``residuals [m, H, c]``."""
    if residuals.ndim != 3 or residuals.shape[1:] != point.shape[1:]:
        raise ValueError(f"residuals must be [m, H, c] with (H, c) = {point.shape[1:]}, got {residuals.shape}")
    idx = jax.random.randint(key, (point.shape[0], num_samples), 0, residuals.shape[0])
    return point[:, None] + jnp.asarray(residuals)[idx]


def seasonal_naive(x, *, period: int, pred_len: int) -> jax.Array:
    """Repeat the last ``period`` steps of x [b, L, c] over the horizon: [b, H, c]."""
    x = jnp.asarray(x)
    if not 1 <= period <= x.shape[1]:
        raise ValueError(f"period must be in [1, L={x.shape[1]}], got {period}")
    reps = -(-pred_len // period)
    return jnp.tile(x[:, -period:], (1, reps, 1))[:, :pred_len]


def sliding_windows(series: np.ndarray, *, seq_len: int, pred_len: int, stride: int = 1):
    """All (x [n, L, c], y [n, H, c]) windows of a [T, c] series, consecutive starts ``stride`` apart."""
    series = np.asarray(series, np.float32)
    if series.ndim != 2:
        raise ValueError(f"series must be [T, c], got shape {series.shape}")
    n = (series.shape[0] - seq_len - pred_len) // stride + 1
    if n < 1:
        raise ValueError(f"series of length {series.shape[0]} is shorter than seq_len + pred_len = "
                         f"{seq_len + pred_len}")
    starts = np.arange(n) * stride
    x = series[starts[:, None] + np.arange(seq_len)]
    y = series[starts[:, None] + seq_len + np.arange(pred_len)]
    return x, y


@functools.partial(jax.jit, static_argnames=("alphas", "num_bins"))
def _scores(samples, y, key, alphas, num_bins):
    mean = jnp.mean(samples, axis=1)
    out = {"mse": jnp.mean((mean - y) ** 2), "mae": jnp.mean(jnp.abs(mean - y)),
           "crps": jnp.mean(pm.crps_ensemble(samples, y, axis=1)),
           "qice": pm.qice(samples, y, num_bins=num_bins, axis=1)}
    for a in alphas:
        lo = jnp.quantile(samples, a / 2, axis=1)
        hi = jnp.quantile(samples, 1 - a / 2, axis=1)
        out[f"coverage_{1 - a:g}"] = jnp.mean(((y >= lo) & (y <= hi)).astype(jnp.float32))
        out[f"width_{1 - a:g}"] = jnp.mean(hi - lo)
    pit = pm.pit_ensemble(samples, y, axis=1, key=key)
    out["pit_calibration_error"] = pm.pit_calibration_error(pit, num_bins=num_bins)
    return out, pit


def evaluate(samples, y, *, alphas=(0.5, 0.1), num_bins: int = 10, key: jax.Array | None = None,
             return_pit: bool = False):
    """Scores of sample forecasts [b, K, H, c] against y [b, H, c] (plain floats).

    Returns mse / mae of the sample mean, crps (ensemble estimator), qice (PPM-code convention, fraction),
    coverage_{1-alpha} and width_{1-alpha} of central intervals, and pit_calibration_error (ties split at
    random with ``key``, at their midpoint without). With ``return_pit`` also the PIT values [b, H, c]
    (as a second return value).
    """
    samples, y = jnp.asarray(samples, jnp.float32), jnp.asarray(y, jnp.float32)
    _check_samples_target(samples, y)
    for a in alphas:
        if not 0 < a < 1:
            raise ValueError(f"alphas must lie in (0, 1), got {alphas}")
    if int(num_bins) < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    out, pit = _scores(samples, y, key, tuple(float(a) for a in alphas), int(num_bins))
    out = {k: float(v) for k, v in out.items()}
    return (out, np.asarray(pit)) if return_pit else out
