"""Denoising diffusion (DDPM) in discrete time, as pure functions: schedule, forward noising, ancestral step.

For a clean sample ``x_0`` and steps ``t = 1..T`` with variances ``beta_t``:

    q(x_t | x_0) = N(sqrt(abar_t) x_0, (1 - abar_t) I),          alpha_t = 1 - beta_t, abar_t = prod_{s<=t} alpha_s
    eps-prediction loss:  E || eps - eps_theta(sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps, t) ||^2
    ancestral step:  x_{t-1} = (x_t - beta_t / sqrt(1 - abar_t) eps_theta) / sqrt(alpha_t) + sigma_t z,
                     sigma_t^2 = beta~_t = beta_t (1 - abar_{t-1}) / (1 - abar_t)   (no noise at t = 1)

Used as the deep-generative baseline of the PPM experiment (the paper compares PPM with diffusion
forecasters such as TimeGrad and CSDI, which are DDPMs of this form with other denoisers).

Dimension legend: any array shape ``...``; ``T`` steps; ``t`` an integer step in 1..T (a Python int or
an int array broadcastable against ``x``, e.g. shaped ``[b, 1, 1]`` for one step per row).

References:
  Ho, Jain, Abbeel, "Denoising Diffusion Probabilistic Models", NeurIPS 2020 (eqs. 4, 11, 14; Algorithm 2).
  Tashiro, Song, Song, Ermon, "CSDI: Conditional Score-based Diffusion Models for Probabilistic Time Series
  Imputation", NeurIPS 2021 (T = 50, quadratic schedule 1e-4 .. 0.5).

Example:
    >>> sch = ddpm_schedule(num_steps=50)
    >>> round(float(sch.alpha_bars[0]), 6), bool(sch.alpha_bars[-1] < 1e-3)
    (0.9999, True)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DDPMSchedule", "ddpm_schedule", "q_sample", "optimal_noise_gaussian", "ancestral_step"]

SCHEDULES = ("linear", "quad")


class DDPMSchedule(NamedTuple):
    """Per-step constants, float32 arrays of length T; index ``t - 1`` holds step t."""

    betas: jax.Array
    alpha_bars: jax.Array
    posterior_variances: jax.Array  # beta~_t; beta~_1 = 0

    @property
    def num_steps(self) -> int:
        return int(self.betas.shape[0])


def ddpm_schedule(*, num_steps: int, beta_start: float = 1e-4, beta_end: float = 0.5,
                  kind: str = "quad") -> DDPMSchedule:
    """The schedule of ``num_steps`` betas from ``beta_start`` to ``beta_end``.

    ``kind="linear"`` spaces the betas linearly (Ho et al.: 1e-4 .. 0.02 over T = 1000); ``"quad"`` spaces
    their square roots linearly (CSDI: 1e-4 .. 0.5 over T = 50).
    """
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1; got {num_steps!r}")
    if not 0 < beta_start <= beta_end < 1:
        raise ValueError(f"need 0 < beta_start <= beta_end < 1; got beta_start={beta_start}, beta_end={beta_end}")
    if kind not in SCHEDULES:
        raise ValueError(f"kind must be one of {SCHEDULES}; got {kind!r}")
    if kind == "linear":
        betas = np.linspace(beta_start, beta_end, num_steps, dtype=np.float64)
    else:
        betas = np.linspace(beta_start ** 0.5, beta_end ** 0.5, num_steps, dtype=np.float64) ** 2
    abar = np.cumprod(1.0 - betas)
    abar_prev = np.concatenate([[1.0], abar[:-1]])
    post = betas * (1.0 - abar_prev) / (1.0 - abar)
    return DDPMSchedule(jnp.asarray(betas, jnp.float32), jnp.asarray(abar, jnp.float32),
                        jnp.asarray(post, jnp.float32))


def _at(arr: jax.Array, t) -> jax.Array:
    return jnp.take(arr, jnp.asarray(t) - 1)


def q_sample(x0: jax.Array, t, noise: jax.Array, sch: DDPMSchedule) -> jax.Array:
    """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise (same shape as x0)."""
    abar = _at(sch.alpha_bars, t)
    return jnp.sqrt(abar) * x0 + jnp.sqrt(1.0 - abar) * noise


def optimal_noise_gaussian(xt: jax.Array, t, sch: DDPMSchedule, *, mean, std) -> jax.Array:
    """E[eps | x_t] when x_0 ~ N(mean, std^2) elementwise: the exact minimizer of the eps loss.

    With x_t = a x_0 + b eps (a = sqrt(abar_t), b = sqrt(1 - abar_t)): E[eps | x_t] = b (x_t - a mean) /
    (a^2 std^2 + b^2). A closed-form denoiser for testing samplers.
    """
    abar = _at(sch.alpha_bars, t)
    a, b = jnp.sqrt(abar), jnp.sqrt(1.0 - abar)
    return b * (xt - a * mean) / (abar * jnp.square(std) + (1.0 - abar))


def ancestral_step(xt: jax.Array, noise_pred: jax.Array, t, z: jax.Array, sch: DDPMSchedule) -> jax.Array:
    """One reverse step x_t -> x_{t-1} of DDPM's Algorithm 2 with ``z ~ N(0, I)`` (ignored at t = 1)."""
    beta, abar = _at(sch.betas, t), _at(sch.alpha_bars, t)
    mean = (xt - beta / jnp.sqrt(1.0 - abar) * noise_pred) / jnp.sqrt(1.0 - beta)
    return mean + jnp.sqrt(_at(sch.posterior_variances, t)) * z
