"""First-passage times of a single-boundary drift-diffusion model (DDM) with time-dependent drift.

A user responds (clicks, leaves a video) at the first time `T` the evidence process

    X_t = M(t) + sigma W_t,    M(t) = int_0^t mu(s) ds,    X_0 = 0,

reaches the threshold `a > 0`. External signals (notifications, feed items) move the drift,
`mu(t) = mu0 + sum_j beta_j g(t - tau_j)`, with a kernel `g` (step, pulse, exponential decay, or a
transient bump of the evidence). Writing `b(t) = (a - M(t)) / sigma`, `T` is the first time a standard
Brownian motion crosses the curved boundary `b`.

What this module computes:

* Constant drift (exact): the inverse-Gaussian density and CDF (`ig_pdf`, `ig_log_pdf`, `ig_cdf`),
  including negative drift, where the law is defective with mass `exp(2 mu a / sigma^2) < 1`, and zero
  drift (hits almost surely, infinite mean).
* Time-varying drift (closed form, high-threshold): the tangent-line approximation

      f_hat(t) = (a - M(t) + t mu(t)) / (sigma sqrt(2 pi t^3)) exp(-(a - M(t))^2 / (2 sigma^2 t)),

  exact for constant drift and asymptotically exact as `a -> inf` with time scaled like `a`. The
  prefactor can turn negative when the drift falls below its running mean; the density is then clipped
  at 0 (`tangent_prefactor` exposes the sign so callers can report the clipped region and mass defect).
  `tangent_pdf` takes `M(t)` and `mu(t)` as arrays, so any drift shape plugs in; `signal_tangent_pdf` /
  `signal_tangent_cdf` evaluate it for signal kernels, the CDF by composite Gauss-Legendre quadrature
  whose panels break at the kernels' discontinuities. The nodes move with the signal times, so
  `jax.grad` of the CDF with respect to `tau` includes the Leibniz boundary terms of those jumps.
* Ground truth (numpy, float64): the Volterra integral equation of the second kind of Buonocore,
  Nobile and Ricciardi (1987) for the first-passage density through `b`, discretised on a uniform grid
  (`volterra_fpt_density`), O(n^2).
* Monte Carlo (`simulate_first_passage`): Euler-Maruyama steps that add the exact drift increment
  `M(t_{k+1}) - M(t_k)` (identical to the Euler step `mu dt` when the drift is constant on a step), with
  the Brownian-bridge crossing correction: a step that starts and ends below `a` crossed in between with
  probability `exp(-2 (a - x_k)(a - x_{k+1}) / (sigma^2 dt))`. For drift that is constant on each step
  this makes the grid CDF unbiased. It also returns the Rao-Blackwellised per-path survival (the
  product of the no-crossing probabilities), a lower-variance estimator of `P(T > t_n)`.

Dimension legend: `...` leading batch dims (broadcast), `n` time points, `s` signals, `p` Monte-Carlo
paths, `q` quadrature nodes.

References:
  Buonocore, Nobile, Ricciardi, "A new integral equation for the evaluation of first-passage-time
  probability densities", Advances in Applied Probability 19(4), 1987 (no arXiv id).
  Daniels, "Approximating the first crossing-time density for a curved boundary", Bernoulli 2(2), 1996
  (no arXiv id); Lerche, "Boundary Crossing of Brownian Motion", Springer LNS 40, 1986 (tangent
  approximation).
  "Approximating Drift-Diffusion Models for User Decisions under Nudging and External Information",
  ICML 2026 (arXiv id not known; the closed form here is a reconstruction, see the spec).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr, ndtr

from primitives.validation import concrete_value

__all__ = [
    "KERNELS",
    "signal_kernel",
    "signal_kernel_integral",
    "signal_drift",
    "signal_breakpoints",
    "ig_log_pdf",
    "ig_pdf",
    "ig_cdf",
    "ig_mass",
    "tangent_prefactor",
    "tangent_log_pdf",
    "tangent_pdf",
    "signal_tangent_pdf",
    "signal_tangent_log_pdf",
    "signal_tangent_cdf",
    "cumulative_trapezoid",
    "volterra_fpt_density",
    "FirstPassageSample",
    "simulate_first_passage",
    "empirical_cdf",
]

KERNELS = ("step", "pulse", "decay", "transient")
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


# ----------------------------------------------------------------------------------------------------
# Signal kernels.
# ----------------------------------------------------------------------------------------------------


def _check_kernel(kind: str, width) -> None:
    if kind not in KERNELS:
        raise ValueError(f"kind must be one of {KERNELS}; got kind={kind!r}")
    if isinstance(width, (int, float)) and not width > 0:
        raise ValueError(f"width must be > 0 (pulse width or decay/transient time constant); got width={width}")


def _jit_with_kernel(fn):
    """jax.jit of `fn` with `kind` (and quadrature sizes) static; the kernel is validated before tracing.

    `width` stays traced (it may be a traced value inside vmap/grad), so it is checked here where it is a
    Python number.
    """
    static = tuple(n for n in ("kind", "num_nodes", "num_panels", "num_graded")
                   if n in inspect.signature(fn).parameters)
    jitted = jax.jit(fn, static_argnames=static)

    @functools.wraps(fn)
    def wrapper(*args, kind: str, width=1.0, **kwargs):
        _check_kernel(kind, width)
        return jitted(*args, kind=kind, width=width, **kwargs)

    return wrapper


def signal_kernel(u: jax.Array, *, kind: str, width: float = 1.0) -> jax.Array:
    """The drift kernel g(u) of one signal, u = time since the signal.

    Kinds: `step` g = 1{u >= 0}; `pulse` g = 1{0 <= u < width}; `decay` g = exp(-u / width) 1{u >= 0};
    `transient` g = (1 - u / width) exp(1 - u / width) 1{u >= 0}, the drift of an evidence bump
    G(u) = u exp(1 - u / width) that peaks at u = width with height width and then fades (its effect on
    the evidence is temporary, unlike the other three whose G is non-decreasing).

    Args:
      u: time since the signal, any shape.
      kind: one of `KERNELS`.
      width: pulse width or time constant, > 0.

    Returns:
      g(u), same shape as `u`.

    References:
      Spec section 7 (step, pulse, decay kernels); the transient kernel is our addition.
    """
    _check_kernel(kind, width)
    u = jnp.asarray(u, dtype=jnp.result_type(float))
    on = u >= 0
    up = jnp.maximum(u, 0.0)
    if kind == "step":
        return on.astype(u.dtype)
    if kind == "pulse":
        return (on & (u < width)).astype(u.dtype)
    if kind == "decay":
        return jnp.where(on, jnp.exp(-up / width), 0.0)
    return jnp.where(on, (1.0 - up / width) * jnp.exp(1.0 - up / width), 0.0)


def signal_kernel_integral(u: jax.Array, *, kind: str, width: float = 1.0) -> jax.Array:
    """G(u) = int_0^u g, the displacement of the evidence caused by one unit-amplitude signal.

    Args:
      u: time since the signal, any shape.
      kind: one of `KERNELS`.
      width: pulse width or time constant, > 0.

    Returns:
      G(u), same shape as `u` (0 for u <= 0).
    """
    _check_kernel(kind, width)
    u = jnp.asarray(u, dtype=jnp.result_type(float))
    up = jnp.maximum(u, 0.0)
    if kind == "step":
        return up
    if kind == "pulse":
        return jnp.minimum(up, width)
    if kind == "decay":
        return width * -jnp.expm1(-up / width)
    return up * jnp.exp(1.0 - up / width)


def _check_last(name: str, x: jax.Array, ndim_min: int = 1) -> None:
    if x.ndim < ndim_min:
        raise ValueError(f"{name} must have at least {ndim_min} dim(s) (..., s); got shape {x.shape}")


@_jit_with_kernel
def signal_drift(t: jax.Array, mu0: jax.Array, tau: jax.Array, beta: jax.Array, *, kind: str,
                 width: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Drift mu(t) and cumulative drift M(t) of `mu0 + sum_j beta_j g(t - tau_j)`.

    Args:
      t: times, shape (..., n).
      mu0: baseline drift, shape (...) (broadcast against the batch dims).
      tau: signal times, shape (..., s).
      beta: signal amplitudes, broadcastable to `tau` (a zero amplitude switches a padded signal off).
      kind: kernel, one of `KERNELS`.
      width: kernel width / time constant.

    Returns:
      (mu, M), each of shape (..., n).
    """
    t = jnp.asarray(t, dtype=jnp.result_type(float))
    tau = jnp.asarray(tau, dtype=t.dtype)
    _check_last("t", t)
    _check_last("tau", tau)
    beta = jnp.broadcast_to(jnp.asarray(beta, dtype=t.dtype), jnp.broadcast_shapes(jnp.shape(beta), tau.shape))
    mu0 = jnp.asarray(mu0, dtype=t.dtype)[..., None]
    u = t[..., :, None] - tau[..., None, :]
    mu = mu0 + jnp.sum(beta[..., None, :] * signal_kernel(u, kind=kind, width=width), axis=-1)
    cum = mu0 * t + jnp.sum(beta[..., None, :] * signal_kernel_integral(u, kind=kind, width=width), axis=-1)
    return mu, cum


def signal_breakpoints(tau: jax.Array, *, kind: str, width: float = 1.0) -> jax.Array:
    """Times where the drift of the signals jumps: tau (all kernels) and tau + width (pulse); (..., s or 2s)."""
    _check_kernel(kind, width)
    tau = jnp.asarray(tau, dtype=jnp.result_type(float))
    if kind == "pulse":
        return jnp.concatenate([tau, tau + width], axis=-1)
    return tau


# ----------------------------------------------------------------------------------------------------
# Constant drift: inverse Gaussian.
# ----------------------------------------------------------------------------------------------------


def _check_a_sigma(fn):
    """Front that checks concrete `a` and `sigma` (> 0, finite) and `mu` (finite) before `fn` runs.

    Traced values (inside jit/vmap/grad) are not checked: a threshold or scale <= 0 then gives NaN.
    """
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def front(*args, **kwargs):
        bound = sig.bind_partial(*args, **kwargs).arguments
        for name, positive in (("a", True), ("sigma", True), ("mu", False)):
            arr = concrete_value(bound[name]) if name in bound else None
            if arr is None:
                continue
            arr = np.asarray(arr, np.float64)
            if not np.all(np.isfinite(arr) & ((arr > 0) if positive else True)):
                raise ValueError(f"{name} must be finite{' and > 0' if positive else ''}; got {name}={bound[name]}")
        return fn(*args, **kwargs)

    return front


def _positive_time(t):
    t = jnp.asarray(t, dtype=jnp.result_type(float))
    pos = t > 0
    return t, pos, jnp.where(pos, t, 1.0)


@_check_a_sigma
@jax.jit
def ig_log_pdf(t: jax.Array, a: jax.Array, mu: jax.Array, sigma: jax.Array) -> jax.Array:
    """Log first-passage density of X_t = mu t + sigma W_t through a > 0 (-inf for t <= 0).

    `log f(t) = log a - log sigma - 0.5 log(2 pi t^3) - (a - mu t)^2 / (2 sigma^2 t)`; valid for any sign
    of `mu` (for mu < 0 it integrates to exp(2 mu a / sigma^2)). All arguments broadcast.

    References:
      Schroedinger (1915); Chhikara and Folks, "The Inverse Gaussian Distribution", 1989.
    """
    t, pos, ts = _positive_time(t)
    a = jnp.asarray(a, t.dtype)
    logf = (jnp.log(a) - jnp.log(sigma) - _LOG_SQRT_2PI - 1.5 * jnp.log(ts)
            - (a - mu * ts) ** 2 / (2.0 * sigma**2 * ts))
    return jnp.where(pos, logf, -jnp.inf)


@_check_a_sigma
@jax.jit
def ig_pdf(t: jax.Array, a: jax.Array, mu: jax.Array, sigma: jax.Array) -> jax.Array:
    """First-passage density of mu t + sigma W_t through a (inverse Gaussian; defective for mu < 0).

    Like `ig_log_pdf`, `ig_cdf` and `ig_mass`, it raises ValueError for concrete `a` or `sigma` that
    are not finite and > 0 or a non-finite `mu`; traced values (inside jit/vmap/grad) are not checked
    and such inputs then give NaN.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(ig_pdf(jnp.array(1.0), 1.0, 1.0, 1.0)), 6)   # 1 / sqrt(2 pi)
      0.398942
    """
    t, pos, _ = _positive_time(t)
    return jnp.where(pos, jnp.exp(ig_log_pdf(t, a, mu, sigma)), 0.0)


@_check_a_sigma
@jax.jit
def ig_cdf(t: jax.Array, a: jax.Array, mu: jax.Array, sigma: jax.Array) -> jax.Array:
    """P(T <= t) for constant drift.

    `F(t) = Phi((mu t - a)/(sigma sqrt t)) + exp(2 mu a/sigma^2) Phi((-mu t - a)/(sigma sqrt t))`.

    The second term is evaluated in log space (log Phi), so large `mu a / sigma^2` neither overflows nor
    loses the term. Tends to `ig_mass` as t -> inf. All arguments broadcast.
    """
    t, pos, ts = _positive_time(t)
    a = jnp.asarray(a, t.dtype)
    s = sigma * jnp.sqrt(ts)
    first = ndtr((mu * ts - a) / s)
    second = jnp.exp(2.0 * mu * a / sigma**2 + log_ndtr((-mu * ts - a) / s))
    return jnp.where(pos, jnp.clip(first + second, 0.0, 1.0), 0.0)


@_check_a_sigma
@jax.jit
def ig_mass(a: jax.Array, mu: jax.Array, sigma: jax.Array) -> jax.Array:
    """P(T < inf) = min(1, exp(2 mu a / sigma^2)): 1 for mu >= 0, defective for mu < 0."""
    return jnp.exp(jnp.minimum(2.0 * mu * jnp.asarray(a, jnp.result_type(float)) / sigma**2, 0.0))


# ----------------------------------------------------------------------------------------------------
# Time-varying drift: tangent (high-threshold) approximation.
# ----------------------------------------------------------------------------------------------------


def tangent_prefactor(t: jax.Array, a: jax.Array, cum_drift: jax.Array, drift: jax.Array) -> jax.Array:
    """a - M(t) + t mu(t): the approximation is a density only where this is >= 0 (all broadcast)."""
    return a - cum_drift + t * drift


@jax.jit
def tangent_log_pdf(t: jax.Array, a: jax.Array, sigma: jax.Array, cum_drift: jax.Array,
                    drift: jax.Array) -> jax.Array:
    """Log of the tangent-line first-passage density; -inf where t <= 0 or the prefactor is <= 0.

    Args:
      t: times, any shape.
      a: threshold (> 0), broadcast.
      sigma: diffusion scale (> 0), broadcast.
      cum_drift: M(t) at `t`, broadcast with `t`.
      drift: mu(t) at `t`, broadcast with `t`.

    Returns:
      log f_hat(t), broadcast shape. For constant drift it equals `ig_log_pdf` exactly.

    References:
      Lerche (1986); Daniels (1996); spec section 7 (b).
    """
    t, pos, ts = _positive_time(t)
    pref = tangent_prefactor(ts, a, cum_drift, drift)
    ok = pos & (pref > 0)
    logf = (jnp.log(jnp.where(ok, pref, 1.0)) - jnp.log(sigma) - _LOG_SQRT_2PI - 1.5 * jnp.log(ts)
            - (a - cum_drift) ** 2 / (2.0 * sigma**2 * ts))
    return jnp.where(ok, logf, -jnp.inf)


@jax.jit
def tangent_pdf(t: jax.Array, a: jax.Array, sigma: jax.Array, cum_drift: jax.Array, drift: jax.Array) -> jax.Array:
    """Tangent-line first-passage density f_hat(t), clipped at 0 where the prefactor is negative.

    Examples:
      >>> import jax.numpy as jnp
      >>> t = jnp.array([0.5, 1.0, 2.0])
      >>> bool(jnp.allclose(tangent_pdf(t, 1.0, 1.0, 0.7 * t, 0.7 * jnp.ones(3)), ig_pdf(t, 1.0, 0.7, 1.0)))
      True
    """
    logf = tangent_log_pdf(t, a, sigma, cum_drift, drift)
    return jnp.where(jnp.isfinite(logf), jnp.exp(jnp.where(jnp.isfinite(logf), logf, 0.0)), 0.0)


@_jit_with_kernel
def signal_tangent_log_pdf(t: jax.Array, a: jax.Array, sigma: jax.Array, mu0: jax.Array, tau: jax.Array,
                           beta: jax.Array, *, kind: str, width: float = 1.0) -> jax.Array:
    """`tangent_log_pdf` for drift mu0 + sum_j beta_j g(t - tau_j); t (..., n), tau (..., s) -> (..., n).

    `a`, `sigma` and `mu0` have the batch shape (...) and are broadcast along n.
    """
    mu, cum = signal_drift(t, mu0, tau, beta, kind=kind, width=width)
    a = jnp.asarray(a, mu.dtype)[..., None]
    sigma = jnp.asarray(sigma, mu.dtype)[..., None]
    return tangent_log_pdf(jnp.asarray(t, mu.dtype), a, sigma, cum, mu)


@_jit_with_kernel
def signal_tangent_pdf(t: jax.Array, a: jax.Array, sigma: jax.Array, mu0: jax.Array, tau: jax.Array,
                       beta: jax.Array, *, kind: str, width: float = 1.0) -> jax.Array:
    """`tangent_pdf` for drift mu0 + sum_j beta_j g(t - tau_j); t (..., n), tau (..., s) -> (..., n)."""
    logf = signal_tangent_log_pdf(t, a, sigma, mu0, tau, beta, kind=kind, width=width)
    return jnp.where(jnp.isfinite(logf), jnp.exp(jnp.where(jnp.isfinite(logf), logf, 0.0)), 0.0)


@_jit_with_kernel
def signal_tangent_cdf(horizon: jax.Array, a: jax.Array, sigma: jax.Array, mu0: jax.Array, tau: jax.Array,
                       beta: jax.Array, *, kind: str, width: float = 1.0, num_nodes: int = 16,
                       num_panels: int = 8, num_graded: int = 16) -> jax.Array:
    """F_hat(H) = int_0^H f_hat, by composite Gauss-Legendre quadrature broken at the drift's jumps.

    [0, H] is split at the kernels' breakpoints (clipped to [0, H] and sorted), each piece into
    `num_panels` equal panels merged with `num_graded` geometric panels (ratio 1/2) toward the piece's
    start, each with `num_nodes` Gauss-Legendre nodes; the geometric panels resolve mass near t = 0
    (small thresholds, long horizons) and just after a jump. The integrand is smooth inside each piece,
    so the rule converges fast. The nodes are differentiable functions of `tau` and `H`, so `jax.grad`
    gives the derivative of the rule including the Leibniz jump terms f(tau-) - f(tau+), which a rule
    with fixed nodes would miss.

    Args:
      horizon: H >= 0, shape (...).
      a, sigma, mu0: shape (...) each (broadcast).
      tau: signal times, (..., s); beta broadcastable to tau.
      kind, width: the signal kernel.
      num_nodes, num_panels, num_graded: the quadrature rule (static).

    Returns:
      F_hat(H), shape (...). Exceeds 1 or falls short of the true mass where the approximation is poor;
      it is not clipped.
    """
    if num_nodes < 1 or num_panels < 1 or num_graded < 0:
        raise ValueError(f"num_nodes, num_panels must be >= 1 and num_graded >= 0; got num_nodes={num_nodes}, "
                         f"num_panels={num_panels}, num_graded={num_graded}")
    dtype = jnp.result_type(float)
    tau = jnp.asarray(tau, dtype)
    _check_last("tau", tau)
    horizon = jnp.asarray(horizon, dtype)
    beta = jnp.asarray(beta, dtype)
    batch = jnp.broadcast_shapes(horizon.shape, jnp.shape(a), jnp.shape(sigma), jnp.shape(mu0), tau.shape[:-1],
                                 jnp.shape(beta)[:-1] if jnp.ndim(beta) else ())
    horizon = jnp.broadcast_to(horizon, batch)
    tau = jnp.broadcast_to(tau, batch + tau.shape[-1:])
    beta = jnp.broadcast_to(beta, tau.shape)
    bps = jnp.sort(jnp.clip(signal_breakpoints(tau, kind=kind, width=width), 0.0, horizon[..., None]), axis=-1)
    edges = jnp.concatenate([jnp.zeros(batch + (1,), dtype), bps, horizon[..., None]], axis=-1)
    # Panel edges as fractions of each piece: uniform, plus geometric refinement toward the piece's start
    # (t = 0 for small thresholds, just after a jump otherwise); a static, sorted set.
    frac = np.union1d(np.linspace(0.0, 1.0, num_panels + 1), 0.5 ** np.arange(1, num_graded + 1))
    frac = jnp.asarray(frac, dtype)
    lo, hi = edges[..., :-1, None], edges[..., 1:, None]
    panel = lo + (hi - lo) * frac  # (..., pieces, panels + 1)
    plo = panel[..., :-1].reshape(batch + (-1,))
    phi = panel[..., 1:].reshape(batch + (-1,))
    x, w = np.polynomial.legendre.leggauss(num_nodes)
    half = 0.5 * (phi - plo)
    nodes = (0.5 * (phi + plo))[..., None] + half[..., None] * jnp.asarray(x, dtype)
    weights = half[..., None] * jnp.asarray(w, dtype)
    q = nodes.shape[-2] * nodes.shape[-1]
    nodes = nodes.reshape(batch + (q,))
    weights = weights.reshape(batch + (q,))
    f = signal_tangent_pdf(nodes, jnp.broadcast_to(jnp.asarray(a, dtype), batch),
                           jnp.broadcast_to(jnp.asarray(sigma, dtype), batch),
                           jnp.broadcast_to(jnp.asarray(mu0, dtype), batch), tau, beta, kind=kind, width=width)
    return jnp.sum(weights * f, axis=-1)


def cumulative_trapezoid(y: jax.Array, t: jax.Array) -> jax.Array:
    """Running trapezoid integral of y over t along the last axis, starting at 0; (..., n) -> (..., n)."""
    y = jnp.asarray(y)
    t = jnp.asarray(t, y.dtype)
    inc = 0.5 * (y[..., 1:] + y[..., :-1]) * jnp.diff(t, axis=-1)
    return jnp.concatenate([jnp.zeros(y.shape[:-1] + (1,), y.dtype), jnp.cumsum(inc, axis=-1)], axis=-1)


# ----------------------------------------------------------------------------------------------------
# Ground truth: Volterra integral equation (numpy float64).
# ----------------------------------------------------------------------------------------------------


def volterra_fpt_density(t: np.ndarray, a, sigma, cum_drift: np.ndarray, drift: np.ndarray) -> np.ndarray:
    """First-passage density through a for X = M(t) + sigma W, by the Buonocore-Nobile-Ricciardi equation.

    With b(t) = (a - M(t))/sigma, b'(t) = -mu(t)/sigma, phi_v(z) = exp(-z^2/(2v))/sqrt(2 pi v) and
    Psi(t | y, s) = 0.5 [b'(t) - (b(t) - y)/(t - s)] phi_{t-s}(b(t) - y), the density g solves

        g(t) = -2 Psi(t | 0, 0) + 2 int_0^t g(s) Psi(t | b(s), s) ds.

    The kernel vanishes on the diagonal for smooth b, so the trapezoid rule on a uniform grid reduces to
    g(t_k) = -2 Psi(t_k | 0, 0) + 2 h sum_{j=1}^{k-1} g(t_j) Psi(t_k | b(t_j), t_j), solved forward in
    O(n^2) (float64, vectorized over batch dims and over j). For constant drift the kernel is 0 and g is
    the inverse Gaussian exactly; for a kinked boundary (a drift jump) the error is O(h) near the jump.

    Args:
      t: uniform grid starting at 0, shape (n,).
      a: threshold > 0, shape (...) (broadcast).
      sigma: diffusion scale > 0, shape (...).
      cum_drift: M(t) on the grid, shape (..., n).
      drift: mu(t) on the grid, shape (..., n) (the value just after a jump at a grid point).

    Returns:
      g on the grid, shape (..., n), with g[..., 0] = 0.

    References:
      Buonocore, Nobile, Ricciardi, Adv. Appl. Probab. 19 (1987) 784-800 (no arXiv id).
    """
    t = np.asarray(t, np.float64)
    if t.ndim != 1 or t.shape[0] < 3:
        raise ValueError(f"t must be a 1-D grid of >= 3 points; got shape {t.shape}")
    if t[0] != 0.0:
        raise ValueError(f"t must start at 0; got t[0]={t[0]}")
    h = t[1] - t[0]
    if not h > 0 or not np.allclose(np.diff(t), h, rtol=1e-9, atol=1e-12 * max(1.0, t[-1])):
        raise ValueError("t must be uniformly spaced and increasing")
    cum = np.asarray(cum_drift, np.float64)
    mu = np.asarray(drift, np.float64)
    n = t.shape[0]
    for name, arr in (("cum_drift", cum), ("drift", mu)):
        if arr.shape[-1:] != (n,):
            raise ValueError(f"{name} must have shape (..., {n}) matching t; got {arr.shape}")
    a = np.asarray(a, np.float64)
    sigma = np.asarray(sigma, np.float64)
    if np.any(a <= 0) or np.any(sigma <= 0):
        raise ValueError(f"a and sigma must be > 0; got a={a}, sigma={sigma}")
    batch = np.broadcast_shapes(a.shape, sigma.shape, cum.shape[:-1], mu.shape[:-1])
    a = np.broadcast_to(a, batch)[..., None]
    sigma = np.broadcast_to(sigma, batch)[..., None]
    b = (a - np.broadcast_to(cum, batch + (n,))) / sigma
    bp = -np.broadcast_to(mu, batch + (n,)) / sigma
    g = np.zeros(batch + (n,))
    for k in range(1, n):
        tk = t[k]
        bk, bpk = b[..., k], bp[..., k]
        psi0 = 0.5 * (bpk - bk / tk) * np.exp(-bk**2 / (2.0 * tk)) / np.sqrt(2.0 * np.pi * tk)
        if k > 1:
            dt = tk - t[1:k]
            z = bk[..., None] - b[..., 1:k]
            psi = 0.5 * (bpk[..., None] - z / dt) * np.exp(-z**2 / (2.0 * dt)) / np.sqrt(2.0 * np.pi * dt)
            integral = h * np.sum(g[..., 1:k] * psi, axis=-1)
        else:
            integral = 0.0
        g[..., k] = -2.0 * psi0 + 2.0 * integral
    return g


# ----------------------------------------------------------------------------------------------------
# Monte Carlo with the Brownian-bridge correction.
# ----------------------------------------------------------------------------------------------------


class FirstPassageSample(NamedTuple):
    """Monte-Carlo first passages on a time grid.

    Attributes:
      hit_time: (..., p) right end t_{k+1} of the step in which the first crossing was detected (the
        crossing lies in (t_k, t_{k+1}]); +inf if none by t_n.
      survival: (..., p) probability that the path has not crossed by t_n given its grid values
        (Rao-Blackwellised; its mean estimates P(T > t_n) with lower variance than the hit indicator).
    """

    hit_time: jax.Array
    survival: jax.Array


def simulate_first_passage(key: jax.Array, t: jax.Array, cum_drift: jax.Array, a: jax.Array, sigma: jax.Array,
                           *, num_paths: int, bridge: bool = True, shared_noise: bool = False) -> FirstPassageSample:
    """Euler-Maruyama first passages of X = M(t) + sigma W through a, with the Brownian-bridge correction.

    Step k adds the drift increment M(t_{k+1}) - M(t_k) and sigma sqrt(dt_k) Z. With `bridge`, a step
    that starts and ends below a counts as a crossing with probability
    exp(-2 (a - x_k)(a - x_{k+1}) / (sigma^2 dt_k)) (exact for Brownian motion with constant drift on the
    step); without it only grid values >= a count, which detects crossings late.

    Args:
      key: PRNG key.
      t: increasing time grid starting at the process start, shape (n + 1,).
      cum_drift: M on the grid, shape (..., n + 1).
      a: threshold > 0, shape (...) (broadcast).
      sigma: diffusion scale > 0, shape (...).
      num_paths: p, paths per batch element (static).
      bridge: apply the Brownian-bridge crossing correction (static).
      shared_noise: use the same p noise paths for every batch element (common random numbers, for
        comparing drifts), instead of independent noise per batch element (static).

    Returns:
      `FirstPassageSample` with arrays of shape (..., p).

    References:
      Baldi, "Exact asymptotics for the probability of exit from a domain and applications to
      simulation", Annals of Probability 23(4), 1995; Glasserman, "Monte Carlo Methods in Financial
      Engineering", 2003, section 6.4 (no arXiv ids).
    """
    t = jnp.asarray(t, jnp.result_type(float))
    if t.ndim != 1 or t.shape[0] < 2:
        raise ValueError(f"t must be a 1-D grid of >= 2 points; got shape {t.shape}")
    cum = jnp.asarray(cum_drift, t.dtype)
    if cum.shape[-1:] != t.shape:
        raise ValueError(f"cum_drift must have shape (..., {t.shape[0]}) matching t; got {cum.shape}")
    if num_paths < 1:
        raise ValueError(f"num_paths must be >= 1; got {num_paths}")
    batch = jnp.broadcast_shapes(cum.shape[:-1], jnp.shape(a), jnp.shape(sigma))
    a = jnp.broadcast_to(jnp.asarray(a, t.dtype), batch)[..., None]
    sigma = jnp.broadcast_to(jnp.asarray(sigma, t.dtype), batch)[..., None]
    dm = jnp.moveaxis(jnp.broadcast_to(jnp.diff(cum, axis=-1), batch + (t.shape[0] - 1,)), -1, 0)
    dts = jnp.diff(t)
    shape = batch + (num_paths,)
    noise_shape = (num_paths,) if shared_noise else shape

    def step(carry, inp):
        x, hit, surv = carry
        k, dt, dmk, t_next = inp
        kz, ku = jax.random.split(jax.random.fold_in(key, k))
        z = jax.random.normal(kz, noise_shape, t.dtype)
        x_new = x + dmk[..., None] + sigma * jnp.sqrt(dt) * z
        above = (x >= a) | (x_new >= a)
        if bridge:
            p_cross = jnp.where(above, 1.0, jnp.exp(-2.0 * jnp.maximum(a - x, 0.0) * jnp.maximum(a - x_new, 0.0)
                                                    / (sigma**2 * dt)))
            u = jax.random.uniform(ku, noise_shape, t.dtype)
            crossed = u < p_cross
        else:
            p_cross = above.astype(t.dtype)
            crossed = above
        hit = jnp.where(jnp.isinf(hit) & crossed, t_next, hit)
        return (x_new, hit, surv * (1.0 - p_cross)), None

    init = (jnp.zeros(shape, t.dtype), jnp.full(shape, jnp.inf, t.dtype), jnp.ones(shape, t.dtype))
    steps = jnp.arange(t.shape[0] - 1)
    (_, hit, surv), _ = jax.lax.scan(step, init, (steps, dts, dm, t[1:]))
    return FirstPassageSample(hit_time=hit, survival=surv)


def empirical_cdf(hit_time: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Monte-Carlo CDF P(T <= t) and its standard error from hit times (..., p) at times t (m,) -> (..., m)."""
    hit_time = jnp.asarray(hit_time)
    t = jnp.asarray(t, hit_time.dtype)
    p = hit_time.shape[-1]
    cdf = jnp.mean(hit_time[..., None, :] <= t[:, None], axis=-1)
    return cdf, jnp.sqrt(cdf * (1.0 - cdf) / p)
