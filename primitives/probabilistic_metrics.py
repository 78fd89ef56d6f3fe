"""Scores of probabilistic forecasts: CRPS, PIT / calibration, interval coverage, QICE.

A probabilistic forecast of a scalar target ``y`` is either a Gaussian ``N(mu, sigma^2)`` or an ensemble
of ``K`` samples ``x_1..x_K``. All functions broadcast over leading "series" dimensions and return one
score per target (average them yourself), except the calibration summaries (:func:`qice`,
:func:`pit_calibration_error`), which pool all targets.

* **CRPS** (continuous ranked probability score), ``CRPS(F, y) = int (F(z) - 1{y <= z})^2 dz
  = E|X - y| - 1/2 E|X - X'|`` with ``X, X' ~ F`` independent (lower is better; for a point mass it is
  the absolute error).

  - Gaussian closed form (Gneiting & Raftery 2007), with ``z = (y - mu) / sigma``:
    ``CRPS = sigma [ z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi) ]``.
  - Ensemble estimator (the "CRPS" package convention used by the PPM code):
    ``CRPS = mean_k |x_k - y| - 1/(2 K^2) sum_{k,l} |x_k - x_l|``; computed in O(K log K) from the
    sorted ensemble, ``sum_{k,l} |x_k - x_l| = 2 sum_i (2 i - K - 1) x_(i)`` (i = 1..K).
    ``fair=True`` divides the pair term by ``K (K - 1)`` instead of ``K^2`` (unbiased for the CRPS of
    the sampling distribution).

* **PIT** (probability integral transform) ``u = F(y)``: uniform on [0, 1] when the forecast is
  calibrated. Ensemble PIT is the fraction of samples below ``y`` with ties split at random
  (``key``) or at their midpoint (no key). :func:`pit_calibration_error` is
  ``mean_b | count_b / N - 1 / B |`` over B equal PIT bins.
* **Central interval coverage** at level ``1 - alpha``: the fraction of targets inside
  ``[q_{alpha/2}, q_{1 - alpha/2}]`` (ensemble quantiles, or Gaussian quantiles).
* **QICE** (quantile interval coverage error, as in CARD / TMDM / NsDiff and the PPM code): bin edges
  are the ensemble's 0, 1/B, ..., 1 quantiles (B + 2 bins counting the two outside ones); count where
  ``y`` falls and report ``mean_b | count_b / N - 1 / B |`` over the B inner bins. The PPM code drops
  the two outside bins (``outside="discard"``, the default: mass outside the ensemble's range is
  penalized because the inner counts no longer sum to N); CARD merges them into the first and last
  inner bins (``outside="merge"``).

Dimension legend: ``...`` any leading series dimensions, ``k`` ensemble members (K).

References:
  Gneiting, Raftery, "Strictly Proper Scoring Rules, Prediction, and Estimation", JASA 102, 2007.
  Han, Zheng, Zhou, "CARD: Classification and Regression Diffusion Models", arXiv:2206.07275, 2022.
  Li, Tan, Fang, Gui, "Parametric Prior Mapping Framework for Non-stationary Probabilistic Time Series
  Forecasting", arXiv:2605.23402 (ICML 2026).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr, ndtri

__all__ = [
    "crps_gaussian",
    "crps_ensemble",
    "pit_gaussian",
    "pit_ensemble",
    "pit_calibration_error",
    "interval_coverage",
    "gaussian_interval_coverage",
    "qice",
]


def _check_sigma(sigma):
    if not isinstance(sigma, jax.core.Tracer) and bool(jnp.any(jnp.asarray(sigma) <= 0)):
        raise ValueError(f"sigma must be > 0 everywhere, got min {float(jnp.min(jnp.asarray(sigma)))}")


def _check_ensemble(samples, y, axis: int):
    samples = jnp.asarray(samples)
    y = jnp.asarray(y)
    if samples.ndim < 1:
        raise ValueError(f"samples must have an ensemble axis, got a scalar of shape {samples.shape}")
    ax = axis % samples.ndim
    moved = jnp.moveaxis(samples, ax, -1)
    if moved.shape[-1] < 1:
        raise ValueError(f"samples must have >= 1 member along axis {axis}, got shape {samples.shape}")
    try:
        jnp.broadcast_shapes(moved.shape[:-1], y.shape)
    except ValueError:
        raise ValueError(f"y of shape {y.shape} does not broadcast with samples {samples.shape} without "
                         f"the ensemble axis {axis} (i.e. {moved.shape[:-1]})") from None
    return moved, y


def crps_gaussian(y, mu, sigma):
    """Closed-form CRPS of ``N(mu, sigma^2)`` at ``y`` (broadcasting).

    Args:
      y: targets [...].
      mu: predictive means, broadcastable with y.
      sigma: predictive standard deviations > 0, broadcastable with y.

    Returns:
      CRPS per target, the broadcast shape.

    Raises:
      ValueError: if a (concrete) sigma is not positive.

    Examples:
      >>> round(float(crps_gaussian(0.0, 0.0, 1.0)), 4)  # (sqrt(2) - 1) / sqrt(pi)
      0.2337
    """
    _check_sigma(sigma)
    y, mu, sigma = jnp.asarray(y), jnp.asarray(mu), jnp.asarray(sigma)
    z = (y - mu) / sigma
    pdf = jnp.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return sigma * (z * (2.0 * ndtr(z) - 1.0) + 2.0 * pdf - 1.0 / math.sqrt(math.pi))


def crps_ensemble(samples, y, *, axis: int = 0, fair: bool = False):
    """Ensemble CRPS ``mean_k |x_k - y| - c sum_{k,l} |x_k - x_l|``, c = 1/(2K^2) (or 1/(2K(K-1)) if fair).

    Args:
      samples: ensemble with K members along ``axis``.
      y: targets, broadcastable with ``samples`` without its ensemble axis.
      axis: the ensemble axis of ``samples``.
      fair: use the unbiased pair term (needs K >= 2).

    Returns:
      CRPS per target.

    Examples:
      >>> float(crps_ensemble(jnp.array([2.0]), 0.5))  # a point mass: the absolute error
      1.5
      >>> round(float(crps_ensemble(jnp.array([0.0, 1.0]), 0.0)), 4)  # 0.5 - 2 * 1 / 8
      0.25
    """
    x, y = _check_ensemble(samples, y, axis)
    k = x.shape[-1]
    if fair and k < 2:
        raise ValueError(f"fair=True needs >= 2 ensemble members, got {k}")
    abs_err = jnp.mean(jnp.abs(x - y[..., None]), axis=-1)
    xs = jnp.sort(x, axis=-1)
    weights = 2.0 * jnp.arange(1, k + 1, dtype=xs.dtype) - k - 1.0
    pair_sum = 2.0 * jnp.sum(weights * xs, axis=-1)  # sum_{k,l} |x_k - x_l|
    denom = 2.0 * (k * (k - 1) if fair else k * k)
    return abs_err - pair_sum / denom


def pit_gaussian(y, mu, sigma):
    """PIT ``Phi((y - mu) / sigma)`` of a Gaussian forecast.

    Examples:
      >>> float(pit_gaussian(1.0, 1.0, 2.0))
      0.5
    """
    _check_sigma(sigma)
    return ndtr((jnp.asarray(y) - jnp.asarray(mu)) / jnp.asarray(sigma))


def pit_ensemble(samples, y, *, axis: int = 0, key: jax.Array | None = None):
    """Ensemble PIT: the fraction of members below ``y``, ties split (randomly with ``key``).

    With ``key`` the value is ``(#below + U (#equal + 1)) / (K + 1)``, U ~ Uniform(0, 1), which is exactly
    uniform for exchangeable (calibrated) members; without a key U = 1/2 (midpoint).

    Examples:
      >>> float(pit_ensemble(jnp.array([0.0, 1.0, 2.0]), 1.5))  # (2 + 0.5) / 4
      0.625
    """
    x, y = _check_ensemble(samples, y, axis)
    k = x.shape[-1]
    below = jnp.sum(x < y[..., None], axis=-1)
    equal = jnp.sum(x == y[..., None], axis=-1)
    if key is None:
        u = 0.5
    else:
        u = jax.random.uniform(key, jnp.broadcast_shapes(below.shape, equal.shape), dtype=x.dtype)
    return (below + u * (equal + 1)) / (k + 1)


def pit_calibration_error(pit, *, num_bins: int = 10):
    """``mean_b | count_b / N - 1 / B |`` over B equal-width bins of the PIT values (0 = calibrated).

    Examples:
      >>> float(pit_calibration_error(jnp.array([0.05, 0.55]), num_bins=2))
      0.0
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    u = jnp.ravel(jnp.asarray(pit))
    idx = jnp.clip(jnp.floor(u * num_bins).astype(jnp.int32), 0, num_bins - 1)
    counts = jnp.zeros((num_bins,), jnp.float32).at[idx].add(1.0)
    return jnp.mean(jnp.abs(counts / u.size - 1.0 / num_bins))


def _check_alpha(alpha):
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def interval_coverage(samples, y, *, alpha: float = 0.1, axis: int = 0):
    """1.0 where ``y`` lies in the ensemble's central ``1 - alpha`` interval, else 0.0 (per target).

    Interval ends are the (linearly interpolated) ``alpha/2`` and ``1 - alpha/2`` sample quantiles.

    Examples:
      >>> x = jnp.arange(101.0)
      >>> interval_coverage(x, jnp.array([3.0, 50.0, 99.0]), alpha=0.1).tolist()
      [0.0, 1.0, 0.0]
    """
    _check_alpha(alpha)
    x, y = _check_ensemble(samples, y, axis)
    lo = jnp.quantile(x, alpha / 2, axis=-1)
    hi = jnp.quantile(x, 1 - alpha / 2, axis=-1)
    return ((y >= lo) & (y <= hi)).astype(x.dtype)


def gaussian_interval_coverage(y, mu, sigma, *, alpha: float = 0.1):
    """1.0 where ``y`` lies in ``mu +- z_{1 - alpha/2} sigma``, else 0.0.

    Examples:
      >>> gaussian_interval_coverage(jnp.array([0.0, 1.7]), 0.0, 1.0, alpha=0.1).tolist()
      [1.0, 0.0]
    """
    _check_alpha(alpha)
    _check_sigma(sigma)
    half = ndtri(1 - alpha / 2) * jnp.asarray(sigma)
    d = jnp.abs(jnp.asarray(y) - jnp.asarray(mu))
    return (d <= half).astype(jnp.float32)


def qice(samples, y, *, num_bins: int = 10, axis: int = 0, outside: str = "discard"):
    """Quantile interval coverage error over all targets (0 = every quantile bin holds 1/B of them).

    Args:
      samples: ensemble with K members along ``axis``.
      y: targets, broadcastable with the samples minus the ensemble axis.
      num_bins: B quantile bins (edges at the 0, 1/B, ..., 1 sample quantiles).
      axis: the ensemble axis.
      outside: "discard" (PPM code) or "merge" (CARD) for targets outside the ensemble's range.

    Returns:
      Scalar QICE (a fraction; the PPM paper reports it in percent).

    Examples:
      >>> x = jnp.tile(jnp.linspace(0.0, 1.0, 11)[:, None], (1, 10))  # the same ensemble for 10 targets
      >>> round(float(qice(x, jnp.linspace(0.05, 0.95, 10), num_bins=10)), 6)  # one target per bin
      0.0
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    if outside not in ("discard", "merge"):
        raise ValueError(f"outside must be 'discard' or 'merge', got {outside!r}")
    x, y = _check_ensemble(samples, y, axis)
    levels = jnp.linspace(0.0, 1.0, num_bins + 1)
    edges = jnp.moveaxis(jnp.quantile(x, levels, axis=-1), 0, -1)  # [..., B + 1]
    yb = jnp.broadcast_to(y, edges.shape[:-1])
    # bin index in 0..B+1: the number of edges strictly below y (as the reference code's `y - q > 0`)
    idx = jnp.sum(edges < yb[..., None], axis=-1)
    if outside == "merge":
        idx = jnp.clip(idx, 1, num_bins)
    counts = jnp.zeros((num_bins + 2,), jnp.float32).at[jnp.ravel(idx)].add(1.0)[1:-1]
    return jnp.mean(jnp.abs(counts / idx.size - 1.0 / num_bins))
