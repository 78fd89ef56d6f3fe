"""Normal-mixture confidence sequences: the mixture martingale, its boundary, burn-in and stopping rule.

For a (near-)Gaussian martingale S_t with intrinsic time (accumulated variance) V_t, Robbins'
normal mixture over the drift, lambda ~ N(0, 1/rho), gives the nonnegative martingale

    L_t = sqrt(rho / (V_t + rho)) * exp(S_t^2 / (2 (V_t + rho)))               (two-sided)
    L_t = 2 sqrt(rho / (V_t + rho)) * exp(S_t^2 / (2 (V_t + rho))) * Phi(S_t / sqrt(V_t + rho))
                                                                                (one-sided, lambda >= 0)

with E[L_t] = 1 when S is a standard Brownian motion run on the clock V. Ville's inequality,
P(sup_t L_t >= 1/alpha) <= alpha, turns it into a time-uniform test: reject the first time
L_t >= 1/alpha, i.e. when |S_t| >= b(V_t) with the closed-form two-sided boundary

    b(V) = sqrt((V + rho) * log((V + rho) / (rho * alpha^2))),

and, one-sided, when S_t >= b_1(V_t) where b_1 solves L = 1/alpha (no closed form; found here by a
fixed number of Newton steps that converge monotonically, so it is jit/vmap friendly).

Burn-in (delayed start). Monitoring starts at the burn-in sample count m; the mixture precision is
either fixed (`rho`) or proportional to the intrinsic time reached at the burn-in, rho = c * V_m
(`rho_scale`), which makes the test invariant to the scale of the increments and, for Gaussian
increments, gives a crossing probability after m that does not depend on m. For non-Gaussian
martingales the crossing probability tends to the Gaussian one as m grows (strong invariance; the
"asymptotic anytime validity" of Bibaut, Kallus and Lindon and of Waudby-Smith et al.). The default
c = `optimal_rho_ratio(alpha)` minimizes the boundary at the burn-in itself: the minimizer of
b(V*) over rho is rho = r(alpha) V* with 1/r = -W_{-1}(-alpha^2 / e) - 1 (Lambert W, lower branch),
computed here by a fixed-point iteration.

Stopping rule. `stopping_time(crossed, burn_in=m)` returns the first sample count t >= m at which
the boundary is crossed (1-based; T + 1 when never crossed within the T samples: right-censored).
`sequential_mixture_test` runs the whole test on a stream of increments at once (cumulative sums,
for recorded streams and Monte-Carlo studies); `mixture_test_init` / `mixture_test_update` are the
same test as a pure (init, update) pair for online use inside `lax.scan` (with an optional
per-element `observed` mask, so a vector of tests with their own sample counts can run in lockstep).

Dimension legend: `...` any batch dims (streams, cells, candidates), `t` time (samples, last axis).

This module is part of the library's GAAVI reconstruction (the spec's design, low-medium
confidence about the paper's exact statistic; the normal mixture itself is classical).

References:
  Cho, Dwivedi, Kallus, "GAAVI: Global Asymptotic Anytime Valid Inference for the Conditional
    Mean Function", arXiv:2602.08096, 2026.
  Robbins, "Statistical methods related to the law of the iterated logarithm", Ann. Math. Statist.
    41 (1970) (normal-mixture boundaries).
  Bibaut, Kallus, Lindon, "Near-Optimal Non-Parametric Sequential Tests and Confidence Sequences
    with Possibly Dependent Observations", arXiv:2212.14411, 2022 (delayed-start normal mixtures).
  Waudby-Smith, Arbour, Sinha, Kennedy, Ramdas, "Time-uniform central limit theory and asymptotic
    confidence sequences", arXiv:2103.06476, 2021 (rho tuning via Lambert W).
"""

from __future__ import annotations

from typing import NamedTuple

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import log_ndtr

__all__ = [
    "mixture_martingale",
    "normal_mixture_boundary",
    "optimal_rho_ratio",
    "optimal_rho",
    "stopping_time",
    "resolve_rho",
    "MixtureTestResult",
    "sequential_mixture_test",
    "MixtureTestState",
    "mixture_test_init",
    "mixture_test_update",
]

_LOG2 = 0.6931471805599453
_RHO_FLOOR = 1e-12


def _check_alpha(alpha) -> None:
    if isinstance(alpha, (int, float)) and not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be in (0, 1); got alpha={alpha}")


def _check_rho(rho) -> None:
    if isinstance(rho, (int, float)) and not float(rho) > 0.0:
        raise ValueError(f"rho must be > 0; got rho={rho}")


def mixture_martingale(s: jax.Array, v: jax.Array, rho, *, two_sided: bool = True, log: bool = False) -> jax.Array:
    """The normal-mixture martingale L(S, V) (or log L), elementwise.

    Args:
      s: [...] martingale value S_t.
      v: [...] intrinsic time V_t >= 0 (broadcasts with `s`).
      rho: mixing precision (> 0; scalar or broadcastable array). The drift is mixed over N(0, 1/rho),
        or over the half-normal on [0, inf) when `two_sided=False`.
      two_sided: the symmetric mixture (tests S's drift != 0) or the half-normal one (drift > 0).
      log: return log L (numerically safe for large S).

    Returns:
      [...] L_t, with E[L_t] = 1 when S_t ~ N(0, V_t).

    References:
      Robbins (1970); Cho, Dwivedi, Kallus, arXiv:2602.08096 (its use in GAAVI).

    Examples:
      >>> import jax.numpy as jnp
      >>> float(mixture_martingale(jnp.array(0.0), jnp.array(3.0), 1.0))
      0.5
    """
    _check_rho(rho)
    s = jnp.asarray(s, jnp.float32)
    v = jnp.asarray(v, jnp.float32)
    rho = jnp.asarray(rho, jnp.float32)
    vr = v + rho
    log_l = 0.5 * jnp.log(rho / vr) + 0.5 * s * s / vr
    if not two_sided:
        log_l = log_l + _LOG2 + log_ndtr(s / jnp.sqrt(vr))
    return log_l if log else jnp.exp(log_l)


def normal_mixture_boundary(v: jax.Array, rho, alpha, two_sided: bool = True, *,
                            num_newton: int = 8) -> jax.Array:
    """The boundary b(V) at which the normal-mixture martingale reaches 1/alpha.

    Two-sided: |S| >= b(V) = sqrt((V + rho) log((V + rho) / (rho alpha^2))) (closed form).
    One-sided: S >= b_1(V), the root of log L(b, V) = log(1/alpha) for the half-normal mixture,
    found by Newton's method in u = b / sqrt(V + rho), started at sqrt(2 c) with
    c = log(1/alpha) + log((V + rho)/rho) / 2, where the (convex, increasing) equation is >= 0.

    Args:
      v: [...] intrinsic time V >= 0.
      rho: mixing precision (> 0; scalar or broadcastable).
      alpha: level in (0, 1) (scalar or broadcastable).
      two_sided: which mixture (see `mixture_martingale`).
      num_newton: Newton steps for the one-sided root (monotone from above; 8 reach float32 resolution).

    Returns:
      [...] b(V) > 0, increasing in V.

    References:
      Robbins (1970); Cho, Dwivedi, Kallus, arXiv:2602.08096.

    Examples:
      >>> import jax.numpy as jnp, math
      >>> b = normal_mixture_boundary(jnp.array(99.0), 1.0, 0.05)
      >>> round(float(b), 3) == round(math.sqrt(100 * math.log(100 / 0.05 ** 2)), 3)
      True
    """
    _check_alpha(alpha)
    _check_rho(rho)
    v = jnp.asarray(v, jnp.float32)
    rho = jnp.asarray(rho, jnp.float32)
    alpha = jnp.asarray(alpha, jnp.float32)
    vr = v + rho
    c = -jnp.log(alpha) + 0.5 * jnp.log(vr / rho)
    if two_sided:
        return jnp.sqrt(vr * 2.0 * c)
    # f(u) = log 2 + u^2/2 + log Phi(u) - c is increasing and convex in u, and f(sqrt(2c)) >= 0, so
    # Newton's method started at sqrt(2c) decreases monotonically to the root (quadratically).
    u = jnp.sqrt(2.0 * c)

    def body(_, u):
        log_phi_cdf = log_ndtr(u)
        f = _LOG2 + 0.5 * u * u + log_phi_cdf - c
        mills = jnp.exp(-0.5 * u * u - 0.5 * math.log(2.0 * math.pi) - log_phi_cdf)  # phi(u) / Phi(u)
        return jnp.maximum(u - f / (u + mills), 0.0)

    u = jax.lax.fori_loop(0, num_newton, body, u)
    return u * jnp.sqrt(vr)


def optimal_rho_ratio(alpha, *, two_sided: bool = True, num_iter: int = 60) -> jax.Array:
    """r(alpha) such that rho = r(alpha) * V* minimizes the boundary b(V*) over rho.

    Setting d b(V*)^2 / d rho = 0 with u = V*/rho gives u - log(1 + u) = 2 log(1/alpha), i.e.
    u = -W_{-1}(-alpha^2/e) - 1; solved by the contraction u <- 2 log(1/alpha) + log(1 + u).
    One-sided: uses 2 alpha (the one-sided boundary at alpha approaches the two-sided one at 2 alpha).

    Args:
      alpha: level in (0, 1) (scalar or array).
      two_sided: see above.
      num_iter: fixed-point iterations (converges geometrically; 60 is float32-exact).

    Returns:
      r(alpha) = 1/u (same shape as `alpha`).

    References:
      Waudby-Smith et al., arXiv:2103.06476 (the Lambert-W tuning); Cho, Dwivedi, Kallus, arXiv:2602.08096.

    Examples:
      >>> round(float(optimal_rho_ratio(0.05)), 4)
      0.1218
    """
    _check_alpha(alpha)
    a = jnp.asarray(alpha, jnp.float32)
    if not two_sided:
        a = jnp.minimum(2.0 * a, 0.999)
    c = -2.0 * jnp.log(a)
    u = jax.lax.fori_loop(0, num_iter, lambda _, u: c + jnp.log1p(u), c + jnp.log1p(c))
    return 1.0 / u


def optimal_rho(v_star, alpha, *, two_sided: bool = True) -> jax.Array:
    """The rho minimizing the boundary at a planned intrinsic time `v_star`: r(alpha) * v_star."""
    return optimal_rho_ratio(alpha, two_sided=two_sided) * jnp.asarray(v_star, jnp.float32)


def stopping_time(crossed: jax.Array, *, burn_in: int = 1) -> tuple[jax.Array, jax.Array]:
    """The stopping rule: first sample count t >= burn_in at which the boundary is crossed.

    Args:
      crossed: [..., t] bool; crossed[..., i] refers to sample count i + 1.
      burn_in: minimum sample count m >= 1 before a rejection may happen.

    Returns:
      (rejected [...] bool, tau [...] int32): tau is the 1-based first crossing count >= m, or
      T + 1 when there is none (right-censored at the horizon T).

    Examples:
      >>> import jax.numpy as jnp
      >>> rej, tau = stopping_time(jnp.array([True, False, True, True]), burn_in=2)
      >>> bool(rej), int(tau)
      (True, 3)
    """
    crossed = jnp.asarray(crossed)
    if crossed.ndim < 1:
        raise ValueError(f"crossed must have a time axis (last); got shape {crossed.shape}")
    if burn_in < 1:
        raise ValueError(f"burn_in must be >= 1; got burn_in={burn_in}")
    n = crossed.shape[-1]
    counts = jnp.arange(1, n + 1)
    hit = jnp.logical_and(crossed.astype(bool), counts >= burn_in)
    rejected = jnp.any(hit, axis=-1)
    tau = jnp.where(rejected, jnp.argmax(hit, axis=-1) + 1, n + 1).astype(jnp.int32)
    return rejected, tau


def resolve_rho(v_at_burn_in: jax.Array, alpha, *, rho=None, rho_scale=None, two_sided: bool = True) -> jax.Array:
    """The mixture precision: `rho` if given, else `rho_scale` (default r(alpha)) times V_m.

    Floored at 1e-12 so that a degenerate stream (V_m = 0) never divides by zero.
    """
    if rho is not None and rho_scale is not None:
        raise ValueError(f"give at most one of rho and rho_scale; got rho={rho}, rho_scale={rho_scale}")
    if rho is not None:
        _check_rho(rho)
        return jnp.broadcast_to(jnp.asarray(rho, jnp.float32), jnp.shape(v_at_burn_in))
    if rho_scale is None:
        rho_scale = optimal_rho_ratio(alpha, two_sided=two_sided)
    elif isinstance(rho_scale, (int, float)) and not rho_scale > 0:
        raise ValueError(f"rho_scale must be > 0; got rho_scale={rho_scale}")
    return jnp.maximum(jnp.asarray(rho_scale, jnp.float32) * jnp.asarray(v_at_burn_in, jnp.float32), _RHO_FLOOR)


class MixtureTestResult(NamedTuple):
    """Trajectory and decision of a normal-mixture sequential test (`...` batch, `t` time).

    Attributes:
      s: [..., t] martingale S_t.
      v: [..., t] intrinsic time V_t.
      boundary: [..., t] b(V_t) (+inf before the burn-in).
      log_e: [..., t] log L_t (the log e-value; -inf before the burn-in).
      crossed: [..., t] bool, boundary crossed at t (never before the burn-in).
      rejected: [...] bool, crossed at some t <= T.
      stop_time: [...] int32, first crossing count (T + 1 if none).
      rho: [...] the mixture precision used.
    """

    s: jax.Array
    v: jax.Array
    boundary: jax.Array
    log_e: jax.Array
    crossed: jax.Array
    rejected: jax.Array
    stop_time: jax.Array
    rho: jax.Array


def sequential_mixture_test(z: jax.Array, v_increments: jax.Array, *, alpha: float = 0.05, burn_in: int = 1,
                            rho=None, rho_scale=None, two_sided: bool = True) -> MixtureTestResult:
    """The whole normal-mixture test on a recorded stream of martingale increments.

    Args:
      z: [..., t] increments Z_i (S_t = sum_{i<=t} Z_i).
      v_increments: [..., t] variance increments (Z_i^2 for the realized quadratic variation, or a
        predictable conditional variance), nonnegative.
      alpha: level.
      burn_in: the first sample count m at which rejection may happen (1 <= m <= T).
      rho: fixed mixture precision; or
      rho_scale: rho = rho_scale * V_m (default when both are None: `optimal_rho_ratio(alpha)`).
      two_sided: two-sided (|S| >= b) or one-sided (S >= b_1) test.

    Returns:
      `MixtureTestResult`.

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096; Bibaut, Kallus, Lindon, arXiv:2212.14411.
    """
    z = jnp.asarray(z, jnp.float32)
    v_increments = jnp.asarray(v_increments, jnp.float32)
    if z.ndim < 1:
        raise ValueError(f"z must have a time axis (last); got shape {z.shape}")
    if v_increments.shape != z.shape:
        raise ValueError(f"v_increments must have the shape of z {z.shape}; got {v_increments.shape}")
    n = z.shape[-1]
    if not 1 <= burn_in <= n:
        raise ValueError(f"burn_in must be in [1, T={n}]; got burn_in={burn_in}")
    _check_alpha(alpha)
    s = jnp.cumsum(z, axis=-1)
    v = jnp.cumsum(v_increments, axis=-1)
    r = resolve_rho(v[..., burn_in - 1], alpha, rho=rho, rho_scale=rho_scale, two_sided=two_sided)
    active = jnp.arange(1, n + 1) >= burn_in
    b = normal_mixture_boundary(v, r[..., None], alpha, two_sided)
    stat = jnp.abs(s) if two_sided else s
    crossed = jnp.logical_and(stat >= b, active)
    log_e = jnp.where(active, mixture_martingale(s, v, r[..., None], two_sided=two_sided, log=True), -jnp.inf)
    rejected, tau = stopping_time(crossed, burn_in=burn_in)
    return MixtureTestResult(s=s, v=v, boundary=jnp.where(active, b, jnp.inf), log_e=log_e, crossed=crossed,
                             rejected=rejected, stop_time=tau, rho=r)


class MixtureTestState(NamedTuple):
    """State of the online normal-mixture test (all fields share the batch shape `...`).

    Attributes:
      s: running S. v: running V. rho: the precision (set at the burn-in; 0 before).
      count: samples seen. rejected: bool. stop_time: int32 first crossing count (0 while none).
    """

    s: jax.Array
    v: jax.Array
    rho: jax.Array
    count: jax.Array
    rejected: jax.Array
    stop_time: jax.Array


def mixture_test_init(shape: tuple[int, ...] = ()) -> MixtureTestState:
    """Initial state of `shape` online tests."""
    zf = jnp.zeros(shape, jnp.float32)
    zi = jnp.zeros(shape, jnp.int32)
    return MixtureTestState(s=zf, v=zf, rho=zf, count=zi, rejected=jnp.zeros(shape, bool), stop_time=zi)


def mixture_test_update(state: MixtureTestState, z: jax.Array, v_increment: jax.Array, *, alpha: float = 0.05,
                        burn_in: int = 1, rho=None, rho_scale=None, two_sided: bool = True,
                        observed: jax.Array | None = None) -> MixtureTestState:
    """One online step of the normal-mixture test; equals `sequential_mixture_test` step by step.

    Args:
      state: `MixtureTestState`.
      z: [...] the new increment(s).
      v_increment: [...] their variance increments.
      alpha, burn_in, rho, rho_scale, two_sided: as in `sequential_mixture_test`; the burn-in is
        counted per element in observed samples.
      observed: optional [...] bool; elements where False keep their state (their count does not move).

    Returns:
      The new state. Once rejected, a test stays rejected with its first stop time.
    """
    _check_alpha(alpha)
    if burn_in < 1:
        raise ValueError(f"burn_in must be >= 1; got burn_in={burn_in}")
    z = jnp.asarray(z, jnp.float32)
    v_increment = jnp.asarray(v_increment, jnp.float32)
    obs = jnp.ones(state.s.shape, bool) if observed is None else jnp.asarray(observed, bool)
    s = state.s + jnp.where(obs, z, 0.0)
    v = state.v + jnp.where(obs, v_increment, 0.0)
    count = state.count + obs.astype(jnp.int32)
    at_burn_in = jnp.logical_and(obs, count == burn_in)
    rho_now = resolve_rho(v, alpha, rho=rho, rho_scale=rho_scale, two_sided=two_sided)
    r = jnp.where(at_burn_in, rho_now, state.rho)
    active = jnp.logical_and(obs, count >= burn_in)
    b = normal_mixture_boundary(v, jnp.where(active, r, 1.0), alpha, two_sided)
    stat = jnp.abs(s) if two_sided else s
    crossed = jnp.logical_and(active, stat >= b)
    new = jnp.logical_and(crossed, ~state.rejected)
    return MixtureTestState(s=s, v=v, rho=r, count=count, rejected=jnp.logical_or(state.rejected, crossed),
                            stop_time=jnp.where(new, count, state.stop_time))
