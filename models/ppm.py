"""Parametric Prior Mapping (PPM) forecaster and its MLP baselines, in Flax NNX.

PPM (Li, Tan, Fang & Gui, ICML 2026) turns a look-back window into a predictive *distribution* over the
next H steps in one forward pass: a light **parametric estimator** reads the window and outputs an
input-adaptive Gaussian prior ``N(mu(x), diag sigma^2(x))`` in a latent space, and a **learnable
mapping** (decoder) pushes prior draws, together with an embedding of the window, to forecast samples.
Everything is channel-independent (each variable is its own series; weights are shared across
channels) and wrapped in per-series instance normalization, as in the released MLP code:

    m, s   = mean_t(x), std_t(x)                       # per series, over the L look-back steps
    x~     = (x - m) / (s + eps)                        # [b, c, L]
    h      = GELU(W_1 x~ + b_1)                         # prior estimator, [b, c, D]
    mu     = W_mu h + b_mu,  log sigma^2 = W_lv h + b_lv
    z_k    = mu + sigma * eps_k,   eps_k ~ N(0, I),   k = 1..K
    e      = W_e x~ + b_e                               # window embedding (condition), [b, c, D]
    y^_k   = W_3 GELU(W_2 [z_k ; e] + b_2) + b_3        # mapping to the horizon, [b, c, K, H]
    y^_k  <- y^_k (s + eps) + m                         # back to the input scale, [b, K, H, c]

The prior estimator is pluggable (`estimator=`): any module mapping ``x~ [b, c, L]`` to
``(mu, logvar)`` of shape ``[b, c, D]``.

Baselines with the same trunk and normalization (:class:`GaussianMLP`: mean and standard deviation per
horizon step; :class:`QuantileMLP`: Q quantiles per step; :class:`PointMLP`: a point forecast;
:class:`DiffusionMLP`: the noise predictor of a conditional DDPM, the deep-generative baseline).

Dimension legend: ``b`` batch (windows), ``L`` look-back length, ``H`` horizon, ``c`` channels
(variables), ``K`` samples, ``D`` latent width (d_model), ``F`` hidden width (d_ff), ``Q`` quantiles.

Example:
  >>> import jax
  >>> from flax import nnx
  >>> cfg = PPMConfig(seq_len=16, pred_len=4, d_model=8, d_ff=16)
  >>> model = PPM(cfg, rngs=nnx.Rngs(0))
  >>> x = jax.random.normal(jax.random.key(1), (2, 16, 3))
  >>> model(x, jax.random.key(2), num_samples=5).samples.shape
  (2, 5, 4, 3)
  >>> cfg.num_params() == sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  True

References:
  Li, Tan, Fang, Gui, "Parametric Prior Mapping Framework for Non-stationary Probabilistic Time Series
  Forecasting", arXiv:2605.23402 (ICML 2026); code github.com/ljl8336/PPM.
  Kim et al., "Reversible Instance Normalization for Accurate Time-Series Forecasting", ICLR 2022.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = [
    "PPMConfig",
    "PPM",
    "PPMOutput",
    "PriorEstimator",
    "GaussianMLP",
    "QuantileMLP",
    "PointMLP",
    "DiffusionMLP",
    "Dense",
    "instance_normalize",
    "count_params",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPMConfig:
    """Shapes of the PPM forecaster (defaults: the released ETTh1 script, d_model 256 / d_ff 512).

    Attributes:
      seq_len: look-back length L.
      pred_len: horizon H.
      d_model: latent / embedding width D.
      d_ff: hidden width F of the mapping.
      eps: instance-normalization epsilon (added to the standard deviation).
    """

    seq_len: int = 96
    pred_len: int = 192
    d_model: int = 256
    d_ff: int = 512
    eps: float = 1e-6

    def __post_init__(self):
        for name in ("seq_len", "pred_len", "d_model", "d_ff"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"PPMConfig.{name} must be an int >= 1; got {v!r}")
        if not self.eps > 0:
            raise ValueError(f"PPMConfig.eps must be > 0; got {self.eps}")

    def num_params(self) -> int:
        """Parameter count of :class:`PPM` with the default estimator."""
        L, H, D, F = self.seq_len, self.pred_len, self.d_model, self.d_ff
        estimator = (L * D + D) + 2 * (D * D + D)
        mapping = (L * D + D) + (2 * D * F + F) + (F * H + H)
        return estimator + mapping


def _uniform(key: jax.Array, shape: tuple[int, ...], bound: float) -> jax.Array:
    """Uniform(-bound, bound) draws from ``key``.

    With a concrete key the draws come from numpy's PCG64 seeded by the key's data: one compiled
    threefry program per parameter shape costs about half a second on a small CPU, which dominates
    the start-up of these tiny models. Under a trace (``nnx.jit``, ``nnx.eval_shape``) jax.random is
    used instead. Either way the result is a deterministic function of the key.
    """
    if isinstance(key, jax.core.Tracer):
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound)
    seed = np.asarray(jax.random.key_data(key)).ravel().tolist()
    return jnp.asarray(np.random.default_rng(seed).uniform(-bound, bound, shape), jnp.float32)


class Dense(nnx.Module):
    """``y = x W + b`` with PyTorch's default init (uniform +- 1/sqrt(fan_in)) and logical axis names."""

    def __init__(self, d_in: int, d_out: int, *, rngs: nnx.Rngs, axes: tuple[str | None, str | None] = (None, "mlp")):
        bound = 1.0 / math.sqrt(d_in)
        w = _uniform(rngs.params(), (d_in, d_out), bound)
        b = _uniform(rngs.params(), (d_out,), bound)
        self.w = nnx.Param(w, out_sharding=axes, eager_sharding=False)
        self.b = nnx.Param(b, out_sharding=(axes[1],), eager_sharding=False)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.w[...] + self.b[...]


def instance_normalize(x: jax.Array, eps: float = 1e-6) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-series normalization over time: x [b, L, c] -> (x~ [b, c, L], m [b, 1, c], s [b, 1, c]).

    ``s`` is the population standard deviation (ddof 0); ``x~ = (x - m) / (s + eps)``.
    """
    m = jnp.mean(x, axis=1, keepdims=True)
    s = jnp.std(x, axis=1, keepdims=True)
    xn = (x - m) / (s + eps)
    return jnp.swapaxes(xn, 1, 2), m, s


def _check_input(x: jax.Array, seq_len: int) -> None:
    if x.ndim != 3 or x.shape[1] != seq_len:
        raise ValueError(f"x must have shape [batch, seq_len={seq_len}, channels], got {x.shape}")


class PriorEstimator(nnx.Module):
    """The parametric prior estimator: x~ [b, c, L] -> (mu, logvar) [b, c, D] of a diagonal Gaussian."""

    def __init__(self, seq_len: int, d_model: int, *, rngs: nnx.Rngs):
        self.inp = Dense(seq_len, d_model, rngs=rngs, axes=(None, "embed"))
        self.mu = Dense(d_model, d_model, rngs=rngs, axes=("embed", "mlp"))
        self.logvar = Dense(d_model, d_model, rngs=rngs, axes=("embed", "mlp"))

    def __call__(self, xn: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jax.nn.gelu(self.inp(xn), approximate=False)
        return self.mu(h), self.logvar(h)


class PPMOutput(NamedTuple):
    """What :class:`PPM` returns.

    Attributes:
      samples: forecast samples on the input scale, [b, K, H, c].
      mu: prior means, [b, c, D].
      logvar: prior log-variances, [b, c, D].
    """

    samples: jax.Array
    mu: jax.Array
    logvar: jax.Array


class PPM(nnx.Module):
    """Parametric prior estimator + learnable mapping; one forward pass gives K forecast samples."""

    def __init__(self, config: PPMConfig, *, rngs: nnx.Rngs, estimator: nnx.Module | None = None):
        c = config
        self.config = c
        self.estimator = estimator if estimator is not None else PriorEstimator(c.seq_len, c.d_model, rngs=rngs)
        self.cond = Dense(c.seq_len, c.d_model, rngs=rngs, axes=(None, "embed"))
        self.hidden = Dense(2 * c.d_model, c.d_ff, rngs=rngs, axes=("embed", "mlp"))
        self.out = Dense(c.d_ff, c.pred_len, rngs=rngs, axes=("mlp", None))

    def __call__(self, x: jax.Array, key: jax.Array, *, num_samples: int) -> PPMOutput:
        """Forecast samples for windows x [b, L, c], using prior noise drawn from `key`."""
        c = self.config
        _check_input(x, c.seq_len)
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        xn, m, s = instance_normalize(x, c.eps)
        mu, logvar = self.estimator(xn)
        if mu.shape != xn.shape[:2] + (c.d_model,) or logvar.shape != mu.shape:
            raise ValueError(f"the estimator must return mu, logvar of shape {xn.shape[:2] + (c.d_model,)}, "
                             f"got {mu.shape}, {logvar.shape}")
        noise = jax.random.normal(key, mu.shape[:2] + (num_samples, c.d_model), mu.dtype)
        z = mu[:, :, None, :] + jnp.exp(0.5 * logvar)[:, :, None, :] * noise  # [b, c, K, D]
        e = jnp.broadcast_to(self.cond(xn)[:, :, None, :], z.shape)
        y = self.out(jax.nn.gelu(self.hidden(jnp.concatenate([z, e], axis=-1)), approximate=False))  # [b,c,K,H]
        y = jnp.transpose(y, (0, 2, 3, 1))  # [b, K, H, c]
        y = y * (s[:, None] + c.eps) + m[:, None]
        return PPMOutput(samples=y, mu=mu, logvar=logvar)


class _Trunk(nnx.Module):
    """x~ [b, c, L] -> GELU(GELU(x~ W_1) W_2) [b, c, F]."""

    def __init__(self, seq_len: int, d_model: int, d_ff: int, *, rngs: nnx.Rngs):
        self.l1 = Dense(seq_len, d_model, rngs=rngs, axes=(None, "embed"))
        self.l2 = Dense(d_model, d_ff, rngs=rngs, axes=("embed", "mlp"))

    def __call__(self, xn):
        return jax.nn.gelu(self.l2(jax.nn.gelu(self.l1(xn), approximate=False)), approximate=False)


class GaussianMLP(nnx.Module):
    """Gaussian-output baseline: x [b, L, c] -> (mean, std) [b, H, c], each step an independent Gaussian."""

    def __init__(self, config: PPMConfig, *, rngs: nnx.Rngs, min_std: float = 1e-4):
        c = config
        self.config = c
        self.trunk = _Trunk(c.seq_len, c.d_model, c.d_ff, rngs=rngs)
        self.mean = Dense(c.d_ff, c.pred_len, rngs=rngs, axes=("mlp", None))
        self.log_std = Dense(c.d_ff, c.pred_len, rngs=rngs, axes=("mlp", None))
        self.min_std = min_std

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = self.config
        _check_input(x, c.seq_len)
        xn, m, s = instance_normalize(x, c.eps)
        h = self.trunk(xn)
        mean = jnp.swapaxes(self.mean(h), 1, 2) * (s + c.eps) + m
        std = (jnp.swapaxes(jax.nn.softplus(self.log_std(h)), 1, 2) + self.min_std) * (s + c.eps)
        return mean, std


class QuantileMLP(nnx.Module):
    """Quantile-regression baseline: x [b, L, c] -> quantiles [b, Q, H, c] at fixed levels."""

    def __init__(self, config: PPMConfig, *, num_quantiles: int, rngs: nnx.Rngs):
        if num_quantiles < 1:
            raise ValueError(f"num_quantiles must be >= 1, got {num_quantiles}")
        c = config
        self.config = c
        self.num_quantiles = num_quantiles
        self.trunk = _Trunk(c.seq_len, c.d_model, c.d_ff, rngs=rngs)
        self.head = Dense(c.d_ff, c.pred_len * num_quantiles, rngs=rngs, axes=("mlp", None))

    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        _check_input(x, c.seq_len)
        xn, m, s = instance_normalize(x, c.eps)
        q = self.head(self.trunk(xn)).reshape(xn.shape[:2] + (self.num_quantiles, c.pred_len))  # [b, c, Q, H]
        q = jnp.transpose(q, (0, 2, 3, 1))
        return q * (s[:, None] + c.eps) + m[:, None]


class PointMLP(nnx.Module):
    """Deterministic baseline (the PPM mapping without a prior): x [b, L, c] -> y^ [b, H, c]."""

    def __init__(self, config: PPMConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.trunk = _Trunk(c.seq_len, c.d_model, c.d_ff, rngs=rngs)
        self.head = Dense(c.d_ff, c.pred_len, rngs=rngs, axes=("mlp", None))

    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        _check_input(x, c.seq_len)
        xn, m, s = instance_normalize(x, c.eps)
        return jnp.swapaxes(self.head(self.trunk(xn)), 1, 2) * (s + c.eps) + m


class DiffusionMLP(nnx.Module):
    """Noise predictor of a conditional DDPM forecaster (the deep-generative baseline; `primitives.ddpm`).

    Channel-independent like :class:`PPM`: on the instance-normalized scale, a noisy horizon y_t [b, c, K, H]
    (K samples per window) and the step t are mapped to the predicted noise [b, c, K, H], conditioned on the
    window x~ [b, c, L]:  eps = W_o GELU(W_h GELU(W_c x~ + W_y y_t + W_t emb(t))), emb = sinusoidal (D wide).
    The conditioning is computed once per window and shared by the K samples and every step.
    """

    def __init__(self, config: PPMConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.cond = Dense(c.seq_len, c.d_model, rngs=rngs, axes=(None, "embed"))
        self.inp = Dense(c.pred_len, c.d_model, rngs=rngs, axes=(None, "embed"))
        self.temb = Dense(c.d_model, c.d_model, rngs=rngs, axes=(None, "embed"))
        self.hidden = Dense(c.d_model, c.d_ff, rngs=rngs, axes=("embed", "mlp"))
        self.out = Dense(c.d_ff, c.pred_len, rngs=rngs, axes=("mlp", None))

    def condition(self, xn: jax.Array) -> jax.Array:
        """x~ [b, c, L] -> the conditioning [b, c, 1, D]."""
        return self.cond(xn)[:, :, None, :]

    def __call__(self, cond: jax.Array, yt: jax.Array, t: jax.Array) -> jax.Array:
        """cond [b, c, 1, D] (from `condition`), y_t [b, c, K, H], t int [b, c, K] or scalar -> noise [b, c, K, H]."""
        d = self.config.d_model
        freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(d // 2, dtype=jnp.float32) / max(d // 2, 1))
        ang = jnp.asarray(t, jnp.float32)[..., None] * freqs
        emb = jnp.concatenate([jnp.sin(ang), jnp.cos(ang)] + ([jnp.zeros_like(ang[..., :1])] if d % 2 else []), -1)
        h = jax.nn.gelu(cond + self.inp(yt) + self.temb(emb), approximate=False)
        return self.out(jax.nn.gelu(self.hidden(h), approximate=False))


def count_params(model: nnx.Module) -> int:
    """Number of scalar parameters of an NNX module."""
    return int(sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param))))
