"""PLMD: label-map completion by an obstacle IR-SDE chain guiding a SPADE-conditioned semantic chain.

Spec: papers/specs/vision_weights_envs.md section 3 (b) (the official code ``FrankZxShen/PLMD``: IR-SDE,
two denoisers, ``reverse_sde`` with adaptive resampling) and (d), (g) for the CPU-scale choices.

Dimension legend: ``b`` maps, ``H``/``W`` grid sides, ``L`` labels (FREE, WALL, K objects), ``T`` steps.

Encoding ([INFER], spec (g) 2): the semantic state is the one-hot label map scaled to [-1, 1]
(``[b, H, W, L]``), the obstacle state is ``+1`` on walls and ``-1`` elsewhere (``[b, H, W, 1]``). The
known mask ``m`` is 1 on observed cells; each chain's degraded mean is ``mu = x_0 * m`` (unknown cells 0).
Both denoisers are `models.unet.UNet` predicting the noise from ``concat(x_t, mu, m)`` ([INFER]: the
mask channel); the semantic one has SPADE blocks conditioned on the obstacle state ``S``.

Training (`loss_fn`, the code's objective): ``t ~ U{1..T}`` ([INFER]: the spec reads U{2..T}; step 1 is
used by the sampler so it is trained too), ``x_t`` from the closed-form marginal, ``x_hat_{t-1}`` = the
reverse-mean step with the predicted noise, loss = mean ``|x_hat_{t-1} - x*_{t-1}|`` (MatchingLoss, L1, on
all cells, spec (g) 6). The semantic denoiser sees ``S = x*_{t-1}`` of the obstacle chain (``S_optimum``).
The gate ``g`` and its extra terms are left out (spec (g) 4). Adam, constant learning rate ([INFER]
scale: a few thousand steps instead of 1M).

Sampling (`complete`, the code's ``reverse_sde``):

  early stage, t = T .. late+1 (late = round(0.4 T)):
      s <- obstacle step(s, t);  x' <- semantic step(x, t, S = s)
      [resample, when t % jump == 0: up to u_max trials: re-noise s forward ``re`` steps and denoise
       back (known cells replaced at every level), x' <- semantic step(x, t, S = s'), accept the trial
       where critic(x', s') < critic(x_upd, s_upd); otherwise average while trial < u_min, else stop]
  late stage, t = late .. 1:   s <- wall channel of x ([INFER] for the code's channel mean of the
      RGB palette image);  x <- semantic step(x, t, S = s)
  after every step the known cells of both chains are replaced by the known map forward-diffused to
  level t - 1 (RePaint-style replacement; the code does it for the obstacle chain, the brief asks it
  for both), and the output is ``x_0 * m + decode(x) * (1 - m)``: known cells never change.

The critic ([INFER]): the code's ``Disc`` is a GAN-trained time-conditioned discriminator whose training
code was not read (spec (g) 5). Here the default critic is training-free: the L1 distance of the
semantic step's known cells to the known map's marginal mean at t - 1 (how consistent the denoiser's
prediction under S' is with what was observed, the information ``Disc(t, x * m, s)`` sees) plus the
mean disagreement between the obstacle state and the semantic wall channel on unknown cells. Any
``critic(t, x_new, s_new, batch) -> [b]`` can be passed instead.

Variants (`complete(..., variant=)`): ``"plmd"`` (obstacle prior + resampling), ``"no_resample"``,
``"semantic_only"`` (one chain, no obstacle prior, no SPADE).

References:
  PLMD: "Plug-and-Play Label Map Diffusion for goal-oriented navigation", arXiv:2605.05960, 2026.
  Luo et al., "Image Restoration with Mean-Reverting SDEs" (IR-SDE), arXiv:2301.11699, 2023.
  Lugmayr et al., "RePaint: Inpainting using Denoising Diffusion Probabilistic Models", arXiv:2201.09865.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
import tqdm

from algorithms import training
from models.unet import UNet, UNetConfig
from primitives import diffusion as sde

__all__ = ["PLMDConfig", "PLMDModels", "encode", "decode", "init_models", "loss_fn", "optimizer_config", "train", "complete",
           "consistency_critic", "VARIANTS"]

VARIANTS = ("plmd", "no_resample", "semantic_only")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PLMDConfig:
    """PLMD settings (validated: ValueError naming the field).

    Attributes:
      num_labels: L (FREE, WALL and the object categories).
      wall_label: the label index of walls.
      T: diffusion steps.
      max_sigma: lambda ([INFER]: 30/255 of the code on [0, 1] images, doubled for the [-1, 1] range).
      channels: U-Net channels per level.
      late_fraction: the late stage covers t <= round(late_fraction T) (code: 0.4).
      jump, re, u_min, u_max: adaptive resampling (code: 2, 2, 4, 25).
      lr: Adam learning rate.
    """

    num_labels: int = 6
    wall_label: int = 1
    T: int = 20
    max_sigma: float = 60 / 255
    channels: tuple[int, ...] = (16, 32)
    late_fraction: float = 0.4
    jump: int = 2
    re: int = 2
    u_min: int = 1
    u_max: int = 3
    lr: float = 1e-3

    def __post_init__(self):
        for name in ("num_labels", "T", "jump", "re", "u_max"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.num_labels < 2:
            raise ValueError(f"num_labels must be >= 2, got {self.num_labels}")
        if not 0 <= self.wall_label < self.num_labels:
            raise ValueError(f"wall_label must lie in [0, {self.num_labels}), got {self.wall_label}")
        if self.T < 2:
            raise ValueError(f"T must be >= 2, got {self.T}")
        if not 0 <= self.u_min <= self.u_max:
            raise ValueError(f"u_min must lie in [0, u_max={self.u_max}], got {self.u_min}")
        if not 0 <= self.late_fraction < 1:
            raise ValueError(f"late_fraction must lie in [0, 1), got {self.late_fraction}")
        if not self.max_sigma > 0 or not self.lr > 0:
            raise ValueError(f"max_sigma and lr must be > 0, got {self.max_sigma}, {self.lr}")

    @property
    def schedule(self) -> sde.IRSDESchedule:
        return sde.irsde_schedule(T=self.T, max_sigma=self.max_sigma)


class PLMDModels(nnx.Module):
    """The three denoisers: obstacle (1 ch), semantic with SPADE(S), semantic-only (no SPADE)."""

    def __init__(self, config: PLMDConfig, *, rngs: nnx.Rngs):
        L, ch = config.num_labels, config.channels
        self.obstacle = UNet(UNetConfig(in_channels=1, cond_channels=2, channels=ch), rngs=rngs)
        self.semantic = UNet(UNetConfig(in_channels=L, cond_channels=L + 1, spade_channels=1, channels=ch), rngs=rngs)
        self.semantic_only = UNet(UNetConfig(in_channels=L, cond_channels=L + 1, channels=ch), rngs=rngs)


def init_models(config: PLMDConfig, seed: int = 0) -> PLMDModels:
    """The three freshly initialised denoisers. The initialisers draw from an ``rbg`` PRNG key
    (XLA's RngBitGenerator): the default threefry key makes the ~100 small eager initialiser
    calls compile one threefry kernel each, several seconds on CPU before any training."""
    return PLMDModels(config, rngs=nnx.Rngs(jax.random.key(seed, impl="rbg")))


def _check_maps(labels, known, num_labels):
    labels, known = jnp.asarray(labels), jnp.asarray(known)
    if labels.ndim != 3:
        raise ValueError(f"labels must be [b, H, W], got shape {labels.shape}")
    if known.shape != labels.shape:
        raise ValueError(f"known must have the labels' shape {labels.shape}, got {known.shape}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    return labels, known


def encode(labels: jax.Array, known: jax.Array, config: PLMDConfig) -> dict[str, jax.Array]:
    """Chain states of a batch: ``x0_s [b,H,W,L]``, ``x0_o [b,H,W,1]``, their means ``mu_s``, ``mu_o``
    (``x_0 * m``) and ``m [b,H,W,1]`` (float)."""
    labels, known = _check_maps(labels, known, config.num_labels)
    m = known.astype(jnp.float32)[..., None]
    x0_s = 2.0 * jax.nn.one_hot(labels, config.num_labels) - 1.0
    x0_o = jnp.where(labels == config.wall_label, 1.0, -1.0)[..., None]
    return {"x0_s": x0_s, "x0_o": x0_o, "mu_s": x0_s * m, "mu_o": x0_o * m, "m": m}


def decode(x_s: jax.Array) -> jax.Array:
    """Labels ``[b, H, W]`` by argmax over the semantic channels."""
    return jnp.argmax(x_s, -1)


def _eps(net, x, mu, m, t, spade=None):
    return net(x, jnp.concatenate([mu, m], -1), t, spade=spade)


def loss_fn(models: PLMDModels, batch: Mapping[str, jax.Array], key: jax.Array, config: PLMDConfig,
            sch: sde.IRSDESchedule) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Summed masked-L1 matching losses of the three denoisers on a batch ``{"labels", "known"}``."""
    e = encode(batch["labels"], batch["known"], config)
    b = e["m"].shape[0]
    kt, ko, ks = jax.random.split(key, 3)
    t = jax.random.randint(kt, (b,), 1, config.T + 1)
    t4 = t[:, None, None, None]
    xo_t, _ = sde.forward_sample(ko, e["x0_o"], e["mu_o"], t4, sch)
    xs_t, _ = sde.forward_sample(ks, e["x0_s"], e["mu_s"], t4, sch)
    o_star = sde.optimal_reverse_mean(xo_t, e["x0_o"], e["mu_o"], t4, sch)
    s_star = sde.optimal_reverse_mean(xs_t, e["x0_s"], e["mu_s"], t4, sch)
    o_hat = sde.reverse_step(xo_t, _eps(models.obstacle, xo_t, e["mu_o"], e["m"], t), e["mu_o"], t4, sch)
    s_hat = sde.reverse_step(xs_t, _eps(models.semantic, xs_t, e["mu_s"], e["m"], t, spade=o_star), e["mu_s"], t4, sch)
    so_hat = sde.reverse_step(xs_t, _eps(models.semantic_only, xs_t, e["mu_s"], e["m"], t), e["mu_s"], t4, sch)
    parts = {"obstacle": jnp.abs(o_hat - o_star).mean(), "semantic": jnp.abs(s_hat - s_star).mean(),
             "semantic_only": jnp.abs(so_hat - s_star).mean()}
    return sum(parts.values()), parts


def optimizer_config(config: PLMDConfig, *, steps: int) -> training.OptimizerConfig:
    """The denoisers' optimizer: Adam (b1 0.9, b2 0.99) at the constant ``config.lr``, no weight decay, no clipping.

    As a `training.OptimizerConfig` (no warmup, cosine end = peak: constant), whose `training.make_optimizer`
    updates are bit-identical to ``optax.adam(config.lr, b1=0.9, b2=0.99)``; `train` uses it, and so does the
    ahead-of-time compiled step of ``python -m experiments aot plmd``.
    """
    return training.OptimizerConfig.constant_adam(config.lr, steps, b2=0.99)


def train(models: PLMDModels, data: Mapping[str, np.ndarray], config: PLMDConfig, *, steps: int, batch_size: int,
          seed: int = 0, progress: bool = True) -> list[dict[str, float]]:
    """Trains the three denoisers in place (Adam) on random batches of ``data = {"labels", "known"}``.

    Returns:
      The loss history (one dict per 50 steps and the last step).
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    labels, known = np.asarray(data["labels"]), np.asarray(data["known"])
    _check_maps(labels[:1], known[:1], config.num_labels)
    sch = config.schedule
    opt = training.make_optimizer(optimizer_config(config, steps=steps))
    graphdef, params = nnx.split(models, nnx.Param)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, lab, kn, key):
        def f(p):
            return loss_fn(nnx.merge(graphdef, p), {"labels": lab, "known": kn}, key, config, sch)
        (loss, parts), grads = jax.value_and_grad(f, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, parts

    rng = np.random.default_rng(seed)
    key = jax.random.key(seed, impl="rbg")       # cheap to compile (see `init_models`)
    history = []
    for i in tqdm.trange(steps, desc="plmd train", disable=not progress):
        idx = rng.integers(0, len(labels), batch_size)
        key, sub = jax.random.split(key)
        params, opt_state, parts = step(params, opt_state, jnp.asarray(labels[idx]), jnp.asarray(known[idx]), sub)
        if i % 50 == 0 or i == steps - 1:
            history.append({"step": i, **{k: float(v) for k, v in parts.items()}})
    nnx.update(models, params)
    return history


def consistency_critic(t, x_new, s_new, enc, sch, config: PLMDConfig) -> jax.Array:
    """The default training-free critic ``[b]`` (lower = better; see the module docstring, [INFER])."""
    target, _ = sde.marginal_mean_std(enc["x0_s"] * enc["m"], enc["mu_s"], t - 1, sch)
    m = enc["m"]
    known_err = (jnp.abs(x_new - target) * m).sum((1, 2, 3)) / jnp.maximum(m.sum((1, 2, 3)) * x_new.shape[-1], 1)
    wall = x_new[..., config.wall_label:config.wall_label + 1]
    disagree = (jnp.abs(s_new - wall) * (1 - m)).sum((1, 2, 3)) / jnp.maximum((1 - m).sum((1, 2, 3)), 1)
    return known_err + disagree


def _merge(k, x, x0, mu, m, level, sch):
    """Known cells replaced by the known map forward-diffused to ``level`` (level 0 = the clean map)."""
    xt, _ = sde.forward_sample(k, x0, mu, jnp.maximum(level, 0), sch)
    return jnp.where(level > 0, xt, x0) * m + x * (1 - m)


def _obs_step(graphdef, p, enc, s, t, k, sch):
    net = nnx.merge(graphdef, p).obstacle
    tb = jnp.full((s.shape[0],), t)
    k1, k2 = jax.random.split(k)
    s = sde.reverse_step(s, _eps(net, s, enc["mu_o"], enc["m"], tb), enc["mu_o"], t, sch, key=k1)
    return _merge(k2, s, enc["x0_o"] * enc["m"], enc["mu_o"], enc["m"], t - 1, sch)


def _sem_step(graphdef, p, enc, x, t, s, k, sch, with_prior=True):
    mods = nnx.merge(graphdef, p)
    tb = jnp.full((x.shape[0],), t)
    eps = (_eps(mods.semantic, x, enc["mu_s"], enc["m"], tb, spade=s) if with_prior
           else _eps(mods.semantic_only, x, enc["mu_s"], enc["m"], tb))
    return sde.reverse_step(x, eps, enc["mu_s"], t, sch, key=k)


# Each jitted piece holds at most one U-Net, so a sampler compiles three U-Net forwards (obstacle,
# semantic with SPADE, semantic-only) however the stage functions combine them (the smoke preset's
# run time is mostly compilation).
@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def _obs_step_j(p, enc, s, t, k, *, graphdef, config):
    return _obs_step(graphdef, p, enc, s, t, k, config.schedule)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "with_prior"))
def _sem_step_j(p, enc, x, t, s, k, *, graphdef, config, with_prior):
    return _sem_step(graphdef, p, enc, x, t, s, k, config.schedule, with_prior)


@functools.partial(jax.jit, static_argnames=("config", "critic"))
def _critic_j(t, x, s, enc, *, config, critic):
    return critic(t, x, s, enc, config.schedule, config)


@functools.partial(jax.jit, static_argnames=("config",))
def _renoise_j(s, enc, t, k, *, config):
    """Re-noises s from level t-1 up to t-1+re (forward Euler steps)."""
    ks = jax.random.split(k, config.re)
    for j in range(config.re):
        s = sde.forward_step(ks[j], s, enc["mu_o"], jnp.minimum(t + j, config.T), config.schedule)
    return s


def _early(p, enc, x, s, t, k, *, graphdef, config, critic):
    k1, k2 = jax.random.split(k)
    s = _obs_step_j(p, enc, s, t, k1, graphdef=graphdef, config=config)
    x_new = _sem_step_j(p, enc, x, t, s, k2, graphdef=graphdef, config=config, with_prior=True)
    return x_new, s, _critic_j(t, x_new, s, enc, config=config, critic=critic)


def _trial(p, enc, x, s, t, k, *, graphdef, config, critic):
    T = config.T
    ks = jax.random.split(k, config.re + 2)
    s2 = _renoise_j(s, enc, t, ks[0], config=config)
    for j in range(config.re):                      # denoise back with known-cell replacement
        s2 = _obs_step_j(p, enc, s2, jnp.minimum(t - 1 + config.re - j, T), ks[1 + j], graphdef=graphdef,
                         config=config)
    x2 = _sem_step_j(p, enc, x, t, s2, ks[-1], graphdef=graphdef, config=config, with_prior=True)
    return x2, s2, _critic_j(t, x2, s2, enc, config=config, critic=critic)


def _late(p, enc, x, t, k, *, graphdef, config, critic, with_prior):
    del critic
    k1, k2 = jax.random.split(k)
    s = x[..., config.wall_label:config.wall_label + 1] if with_prior else None
    x = _sem_step_j(p, enc, x, t, s, k1, graphdef=graphdef, config=config, with_prior=with_prior)
    return _finish(enc, x, t, k2, config=config)


@functools.partial(jax.jit, static_argnames=("config",))
def _finish(enc, x, t, k, *, config):
    return _merge(k, x, enc["x0_s"] * enc["m"], enc["mu_s"], enc["m"], t - 1, config.schedule)


def _as_rbg(key: jax.Array) -> jax.Array:
    """A deterministic ``rbg`` key from any PRNG key (raw uint32 or typed): the sampler's many small
    random draws then compile as RngBitGenerator ops instead of threefry kernels (seconds on CPU)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0, impl="rbg")):
            return key
        key = jax.random.key_data(key)
    data = jnp.asarray(key, jnp.uint32).reshape(-1)
    data = jnp.resize(jnp.concatenate([data, data ^ jnp.uint32(0x9E3779B9)]), (4,))
    return jax.random.wrap_key_data(data, impl="rbg")


def complete(models: PLMDModels, labels: jax.Array, known: jax.Array, key: jax.Array, config: PLMDConfig, *,
             variant: str = "plmd", critic: Callable | None = None, progress: bool = False) -> dict[str, jax.Array]:
    """Completes the unknown cells of label maps.

    Args:
      models: trained `PLMDModels`.
      labels: ``[b, H, W]`` int label maps; only the known cells are read (unknown cells may hold anything).
      known: ``[b, H, W]`` bool known mask.
      key: PRNG key (the sampler is stochastic; deterministic given the key).
      config: the `PLMDConfig` the models were trained with.
      variant: one of `VARIANTS`.
      critic: ``critic(t, x_new, s_new, enc, sch, config) -> [b]`` for the adaptive resampling (lower is
        better); default `consistency_critic`.
      progress: tqdm bar over the steps.

    Returns:
      ``{"labels": [b, H, W] completed labels (== input on known cells), "x": the final semantic state,
      "obstacle": [b, H, W] the obstacle chain's walls at the end of the early stage (None-free: for
      "semantic_only" the wall channel), "accepted": number of accepted resampling trials}``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    labels, known = _check_maps(labels, known, config.num_labels)
    labels = jnp.where(known, labels, 0)          # nothing from the unknown region leaks in
    sch = config.schedule
    critic = critic or consistency_critic
    graphdef, params = nnx.split(models, nnx.Param)
    enc = encode(labels, known, config)
    m = enc["m"]
    T, late = config.T, int(round(config.late_fraction * config.T))
    statics = dict(graphdef=graphdef, config=config, critic=critic)

    k0, k1, key = jax.random.split(_as_rbg(key), 3)
    x = enc["mu_s"] + sch.max_sigma * jax.random.normal(k0, enc["mu_s"].shape)
    s = enc["mu_o"] + sch.max_sigma * jax.random.normal(k1, enc["mu_o"].shape)
    x = _merge(k0, x, enc["x0_s"] * m, enc["mu_s"], m, jnp.asarray(T), sch)
    s = _merge(k1, s, enc["x0_o"] * m, enc["mu_o"], m, jnp.asarray(T), sch)
    accepted = 0
    obstacle = None
    for t in tqdm.tqdm(range(T, 0, -1), desc=f"plmd sample ({variant})", disable=not progress):
        key, kstep, kfin = jax.random.split(key, 3)
        tt = jnp.asarray(t)
        if variant == "semantic_only":
            x = _late(params, enc, x, tt, kstep, with_prior=False, **statics)
            continue
        if t > late:
            x_upd, s_upd, d_n = _early(params, enc, x, s, tt, kstep, **statics)
            if variant == "plmd" and t % config.jump == 0:
                active = jnp.ones(d_n.shape, bool)
                for u in range(config.u_max):
                    key, kt = jax.random.split(key)
                    x2, s2, d_p = _trial(params, enc, x, s_upd, tt, kt, **statics)
                    better = active & (d_p < d_n)
                    avg = active & ~better & (u < config.u_min)
                    sel4 = lambda c: c[:, None, None, None]  # noqa: E731
                    x_upd = jnp.where(sel4(better), x2, jnp.where(sel4(avg), (x_upd + x2) / 2, x_upd))
                    s_upd = jnp.where(sel4(better), s2, jnp.where(sel4(avg), (s_upd + s2) / 2, s_upd))
                    accepted += int(better.sum())
                    active = better | avg
                    if not bool(active.any()):
                        break
            x = _finish(enc, x_upd, tt, kfin, config=config)
            s = s_upd
            if t == late + 1:
                obstacle = s[..., 0] > 0
        else:
            x = _late(params, enc, x, tt, kstep, with_prior=True, **statics)
    out = jnp.where(known, labels, decode(x))
    if obstacle is None:
        obstacle = decode(x) == config.wall_label
    obstacle = jnp.where(known, labels == config.wall_label, obstacle)
    return {"labels": out, "x": x, "obstacle": obstacle, "accepted": accepted}
