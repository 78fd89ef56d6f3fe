"""The mean-reverting SDE (IR-SDE) of PLMD's official code, as pure functions.

Spec: papers/specs/vision_weights_envs.md section 3 (b) "Diffusion process" (quoting
``PLMD-training/utils/sde_utils.py`` of ``FrankZxShen/PLMD``). For a clean state ``x_0`` and a
"degraded" mean ``mu`` (the partial map with unknown cells zeroed) the forward process is

    dx = theta_t (mu - x) dt + sigma_t dw,        sigma_t^2 = 2 lambda^2 theta_t,

discretised over ``T`` steps. Schedule (exactly as the code): ``theta`` is the "cosine" schedule with
``timesteps = T + 2`` grid points of the cosine alpha-bar curve (s = 0.008), ``theta_i = 1 - abar_{i+1}``
for i = 0..T (the code's ``betas = 1 - alphas_cumprod[1:-1]``), ``thetabar_t = sum_{i<=t} theta_i - theta_0``
and ``dt = -log(eps) / thetabar_T``. Closed forms:

    x_t | x_0 ~ N(mu + (x_0 - mu) exp(-thetabar_t dt), lambda^2 (1 - exp(-2 thetabar_t dt)))
    x*_{t-1} = A(1-C^2)/(1-B^2) (x_t - mu) + C(1-A^2)/(1-B^2) (x_0 - mu) + mu,
         A = exp(-theta_t dt), B = exp(-thetabar_t dt), C = exp(-thetabar_{t-1} dt)       (posterior mean)
    score = -eps_hat / sigmabar_t,    x_{t-1} = x_t - (theta_t (mu - x_t) - sigma_t^2 score) dt [- sigma_t sqrt(dt) z]

Dimension legend: any array shape ``...`` (images are ``[b, H, W, c]``); ``T`` diffusion steps; ``t`` an
integer step in 0..T (0 = clean). ``t`` may be a Python int or an int array broadcastable against ``x``'s
leading batch axis (pass it shaped ``[b, 1, 1, 1]`` for per-sample steps).

References:
  Luo, Gustafsson, Zhao, Sjolund, Schon, "Image Restoration with Mean-Reverting Stochastic Differential
  Equations", arXiv:2301.11699, 2023 (IR-SDE).
  PLMD: "Plug-and-Play Label Map Diffusion for goal-oriented navigation", arXiv:2605.05960, 2026.

Example:
    >>> import jax.numpy as jnp
    >>> sch = irsde_schedule(T=100, max_sigma=30 / 255)
    >>> m, s = marginal_mean_std(jnp.ones(3), jnp.zeros(3), 100, sch)
    >>> bool(abs(float(m[0]) - 0.005) < 1e-6), bool(abs(float(s) - (30 / 255) * (1 - 0.005**2) ** 0.5) < 1e-6)
    (True, True)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["IRSDESchedule", "irsde_schedule", "marginal_mean_std", "forward_sample", "forward_step",
           "optimal_reverse_mean", "score_from_noise", "noise_from_state", "reverse_step"]


class IRSDESchedule(NamedTuple):
    """Precomputed IR-SDE constants (float32 arrays of length T + 1, index = step).

    Attributes:
      thetas: theta_t, t = 0..T.
      sigmas: sigma_t = sqrt(2 lambda^2 theta_t).
      thetas_cumsum: thetabar_t = sum_{i<=t} theta_i - theta_0 (thetabar_0 = 0).
      sigma_bars: marginal std lambda sqrt(1 - exp(-2 thetabar_t dt)).
      dt: the time step -log(eps) / thetabar_T (a scalar array).
      max_sigma: lambda (a scalar array).
    """

    thetas: jax.Array
    sigmas: jax.Array
    thetas_cumsum: jax.Array
    sigma_bars: jax.Array
    dt: jax.Array
    max_sigma: jax.Array

    @property
    def T(self) -> int:
        return int(self.thetas.shape[0]) - 1


def irsde_schedule(*, T: int, max_sigma: float, eps: float = 0.005, s: float = 0.008) -> IRSDESchedule:
    """Builds the IR-SDE constants of the official code (cosine theta schedule).

    Args:
      T: number of diffusion steps (>= 2).
      max_sigma: lambda, the stationary std (the code uses 30 / 255 on [0, 1] images).
      eps: exp(-thetabar_T dt) = eps, i.e. how close x_T's mean gets to mu (code: 0.005).
      s: offset of the cosine alpha-bar curve.

    Returns:
      The `IRSDESchedule` (computed in float64, stored as float32).

    Raises:
      ValueError: naming the argument when T < 2, max_sigma <= 0 or eps not in (0, 1).
    """
    if not isinstance(T, (int, np.integer)) or isinstance(T, bool) or T < 2:
        raise ValueError(f"T must be an int >= 2, got {T!r}")
    if not (np.isfinite(max_sigma) and max_sigma > 0):
        raise ValueError(f"max_sigma must be a finite number > 0, got {max_sigma!r}")
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    timesteps = T + 2
    x = np.linspace(0, timesteps, timesteps + 1)
    abar = np.cos(((x / timesteps) + s) / (1 + s) * math.pi * 0.5) ** 2
    abar = abar / abar[0]
    thetas = 1 - abar[1:-1]                                    # length T + 1, exactly as the code
    sigmas = np.sqrt(max_sigma**2 * 2 * thetas)
    cums = np.cumsum(thetas) - thetas[0]
    dt = -math.log(eps) / cums[-1]
    sigma_bars = np.sqrt(max_sigma**2 * (1 - np.exp(-2 * cums * dt)))
    f = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return IRSDESchedule(f(thetas), f(sigmas), f(cums), f(sigma_bars), f(dt), f(max_sigma))


def _at(arr: jax.Array, t) -> jax.Array:
    return arr[jnp.asarray(t, jnp.int32)]


def _check_t(t, sch: IRSDESchedule, *, lo: int) -> None:
    if isinstance(t, (int, np.integer)) and not lo <= int(t) <= sch.T:
        raise ValueError(f"t must lie in [{lo}, {sch.T}], got {t}")


def marginal_mean_std(x0: jax.Array, mu: jax.Array, t, sch: IRSDESchedule) -> tuple[jax.Array, jax.Array]:
    """Mean and std of x_t | x_0: ``mu + (x_0 - mu) exp(-thetabar_t dt)`` and ``sigmabar_t``.

    Args:
      x0: clean state ``[...]``.
      mu: degraded mean, same shape as ``x0``.
      t: step(s) in 0..T.
      sch: the schedule.

    Returns:
      ``(mean [...], std)`` with std broadcastable to ``x0``.
    """
    if x0.shape != mu.shape:
        raise ValueError(f"x0 and mu must have the same shape, got {x0.shape} and {mu.shape}")
    _check_t(t, sch, lo=0)
    mean = mu + (x0 - mu) * jnp.exp(-_at(sch.thetas_cumsum, t) * sch.dt)
    return mean, _at(sch.sigma_bars, t)


def forward_sample(key: jax.Array, x0: jax.Array, mu: jax.Array, t, sch: IRSDESchedule) -> tuple[jax.Array, jax.Array]:
    """Draws x_t ~ q(x_t | x_0) from the closed-form marginal; returns ``(x_t, noise)`` with
    ``x_t = mean + sigmabar_t * noise`` (the code's ``noisy_state``)."""
    mean, std = marginal_mean_std(x0, mu, t, sch)
    noise = jax.random.normal(key, x0.shape, x0.dtype)
    return mean + std * noise, noise


def forward_step(key: jax.Array, x: jax.Array, mu: jax.Array, t, sch: IRSDESchedule) -> jax.Array:
    """One Euler-Maruyama step of the forward SDE (step t-1 -> t, t in 1..T):
    ``x + theta_t (mu - x) dt + sigma_t sqrt(dt) z`` (the code's ``forward_step``)."""
    if x.shape != mu.shape:
        raise ValueError(f"x and mu must have the same shape, got {x.shape} and {mu.shape}")
    _check_t(t, sch, lo=1)
    z = jax.random.normal(key, x.shape, x.dtype)
    return x + _at(sch.thetas, t) * (mu - x) * sch.dt + _at(sch.sigmas, t) * jnp.sqrt(sch.dt) * z


def optimal_reverse_mean(xt: jax.Array, x0: jax.Array, mu: jax.Array, t, sch: IRSDESchedule) -> jax.Array:
    """The training target x*_{t-1}: the mean of the Gaussian posterior q(x_{t-1} | x_t, x_0), t in 1..T
    (``reverse_optimum_step`` of the code; at t = 1 it returns x_0 since thetabar_0 = 0)."""
    if not xt.shape == x0.shape == mu.shape:
        raise ValueError(f"xt, x0 and mu must share a shape, got {xt.shape}, {x0.shape}, {mu.shape}")
    _check_t(t, sch, lo=1)
    t = jnp.asarray(t, jnp.int32)
    a = jnp.exp(-sch.thetas[t] * sch.dt)
    b = jnp.exp(-sch.thetas_cumsum[t] * sch.dt)
    c = jnp.exp(-sch.thetas_cumsum[t - 1] * sch.dt)
    term1 = a * (1 - c**2) / (1 - b**2)
    term2 = c * (1 - a**2) / (1 - b**2)
    return term1 * (xt - mu) + term2 * (x0 - mu) + mu


def score_from_noise(noise: jax.Array, t, sch: IRSDESchedule) -> jax.Array:
    """``score = -noise / sigmabar_t`` (the code's ``get_score_from_noise``), t in 1..T."""
    _check_t(t, sch, lo=1)
    return -noise / _at(sch.sigma_bars, t)


def noise_from_state(xt: jax.Array, x0: jax.Array, mu: jax.Array, t, sch: IRSDESchedule) -> jax.Array:
    """The true conditional noise ``(x_t - mean_t(x_0)) / sigmabar_t`` (what the network regresses)."""
    _check_t(t, sch, lo=1)
    mean, std = marginal_mean_std(x0, mu, t, sch)
    return (xt - mean) / std


def reverse_step(xt: jax.Array, noise_pred: jax.Array, mu: jax.Array, t, sch: IRSDESchedule, *,
                 key: jax.Array | None = None) -> jax.Array:
    """One reverse-SDE step t -> t-1 given a noise prediction ``eps_hat``.

    ``x_{t-1} = x_t - (theta_t (mu - x_t) - sigma_t^2 score) dt`` with ``score = -eps_hat / sigmabar_t``
    (``reverse_sde_step_mean``, the training path); with ``key`` the code's stochastic
    ``reverse_sde_step`` additionally subtracts ``sigma_t sqrt(dt) z``.

    Args:
      xt: state at step t ``[...]``.
      noise_pred: the network's eps_hat, same shape.
      mu: degraded mean, same shape.
      t: step(s) in 1..T.
      sch: the schedule.
      key: PRNG key for the stochastic step; None = the mean step.

    Returns:
      x_{t-1}, same shape as ``xt``.
    """
    if not xt.shape == noise_pred.shape == mu.shape:
        raise ValueError(f"xt, noise_pred and mu must share a shape, got {xt.shape}, {noise_pred.shape}, {mu.shape}")
    _check_t(t, sch, lo=1)
    score = score_from_noise(noise_pred, t, sch)
    theta, sigma = _at(sch.thetas, t), _at(sch.sigmas, t)
    out = xt - (theta * (mu - xt) - sigma**2 * score) * sch.dt
    if key is not None:
        out = out - sigma * jnp.sqrt(sch.dt) * jax.random.normal(key, xt.shape, xt.dtype)
    return out
