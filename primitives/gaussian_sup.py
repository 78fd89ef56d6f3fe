"""Expected suprema of Gaussian vectors: exact 1-D quadrature, Monte Carlo, correlated variants.

The objective of variance allocation (Paes Leme, Stein, Teng, Worah) is

    F(sigma) = E[ sum_j max_{i in S_j} X_i ],   X_i ~ N(mu_i, sigma_i^2) independent,

a sum over a family of index sets S_1..S_m of expected maxima. For one set the maximum M has the CDF
`F_j(x) = prod_{i in S_j} P(X_i <= x)`, where a coordinate with `sigma_i = 0` is the constant mu_i
(its factor is the step 1[x >= mu_i]: a floor under the maximum). With the split point
c_j = max_{i in S_j} mu_i,

    E[M_j] = c_j + int_{c_j}^inf (1 - F_j(x)) dx - int_{-inf}^{c_j} F_j(x) dx,

evaluated by Gauss-Legendre quadrature on one grid shared by all sets: the range
[L, U] = [min_i mu_i - tail sigma_i, max_i mu_i + tail sigma_i] (the truncated tails are below
Phi(-tail) sigma, about 1e-17 at tail = 8.5) is cut at uniform panel edges and at mu_i + a sigma_i for
every coordinate (a in 0, +-1.5, +-3, +-6), so every c_j, every floor and every coordinate's own scale
is a breakpoint, even when the scales differ by orders of magnitude; each sub-interval gets the same
number of nodes (static shapes). The log-CDF factors log P(X_i <= x) are computed once per node and
coordinate and summed per set (`log F_j`), and `1 - F = -expm1(log F)`, so float32 keeps about 1e-7
relative accuracy and many sets cost little more than one. All functions are pure and
jit/vmap/grad-friendly; gradients with respect to sigma are exact derivatives of the rule.

Correlated variant with exact quadrature ("block" correlation): random coordinates are split into
groups; inside group g every coordinate is `X_i = mu_i + s_i sigma_i Z_g` with one shared standard
normal Z_g and a sign s_i in {+1, -1} (perfect positive / negative correlation), groups independent.
The CDF of the maximum over the members of g in S_j is
`min_{s_i=+1} Phi((x - mu_i)/sigma_i) - max_{s_i=-1} Phi((mu_i - x)/sigma_i)` (clipped at 0).
This covers the paper's Fig. 1 structures (2x2 blocks of perfectly correlated pairs). It has kinks
where two members' lines cross; with equal means they sit at the breakpoint mu, otherwise the rule
converges at the slower O(h^2) rate there (raise num_panels). A general PSD covariance is handled by
Monte Carlo (`expected_max_correlated_mc`) and, for two variables, by Clark's closed form
(`expected_max_bivariate`).

A float64 numpy twin (`expected_sum_of_max_f64`, with the analytic gradient, independent coordinates)
serves the exact baselines in `algorithms.optimization.gaussian_sup` (brute force), and
`iid_expected_max` gives the h-tables of Algorithm 3.

Dimension legend: `n` variables, `m` sets, `...` leading batch dims, `k` quadrature nodes,
`g` correlation groups, `N` Monte-Carlo samples.

References:
  Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463, 2025.
  Clark, "The greatest of a finite set of random variables", Operations Research 9(2), 1961.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy import special as jsp
from scipy import special as ssp

__all__ = [
    "expected_max",
    "expected_sum_of_max",
    "expected_sum_of_max_f64",
    "iid_expected_max",
    "expected_max_mc",
    "expected_max_correlated_mc",
    "expected_max_bivariate",
    "block_covariance",
    "sets_to_mask",
    "participation_ratio",
    "MonteCarloEstimate",
]

_BIG_X = 1e30  # sentinel for positions (finite so that gradients never see inf - inf)
_Z_CLIP = 1e4  # standardized arguments are clipped here; log_ndtr(-1e4) is still finite in float32
_LOG_ZERO = -1e4  # log of an exactly-zero CDF factor (exp underflows to 0, gradients stay finite)
_OFFSETS = (-6.0, -3.0, -1.5, 0.0, 1.5, 3.0, 6.0)  # per-coordinate breakpoints mu_i + a sigma_i


class MonteCarloEstimate(NamedTuple):
    """A Monte-Carlo mean with its standard error (both scalars)."""

    mean: jax.Array
    stderr: jax.Array


@functools.lru_cache(maxsize=32)
def _nodes(num_panels: int, nodes_per_panel: int) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre nodes t in [0, 1] and weights summing to 1 (float64)."""
    t, w = np.polynomial.legendre.leggauss(nodes_per_panel)
    t = (t + 1.0) / 2.0
    w = w / 2.0
    edges = np.arange(num_panels, dtype=np.float64) / num_panels
    nodes = (edges[:, None] + t[None, :] / num_panels).reshape(-1)
    weights = np.tile(w / num_panels, num_panels)
    return nodes, weights


def _check_quadrature(num_panels: int, nodes_per_panel: int, tail: float) -> None:
    if not (isinstance(num_panels, int) and num_panels >= 1):
        raise ValueError(f"num_panels must be a positive int; got {num_panels!r}")
    if not (isinstance(nodes_per_panel, int) and nodes_per_panel >= 2):
        raise ValueError(f"nodes_per_panel must be an int >= 2; got {nodes_per_panel!r}")
    if not tail > 0:
        raise ValueError(f"tail must be > 0 (in standard deviations); got {tail!r}")


def _grid(xp, mu, sigma, tail, num_panels, nodes_per_panel):
    """Shared nodes x [..., k] and weights [..., k] on [L, U] cut at all breakpoints."""
    t_np, w_np = _nodes(1, nodes_per_panel)
    dtype = sigma.dtype
    t, w = xp.asarray(t_np, dtype=dtype), xp.asarray(w_np, dtype=dtype)
    lower = xp.min(mu - tail * sigma, axis=-1)
    upper = xp.max(mu + tail * sigma, axis=-1)
    u = xp.asarray(np.arange(0, num_panels + 1) / num_panels, dtype=dtype)
    offsets = xp.asarray(np.asarray(_OFFSETS), dtype=dtype)
    own = mu[..., :, None] + offsets * sigma[..., :, None]  # [..., n, a]
    own = xp.clip(own, lower[..., None, None], upper[..., None, None]).reshape(own.shape[:-2] + (-1,))
    panels = lower[..., None] + (upper - lower)[..., None] * u
    points = xp.sort(xp.concatenate([panels, own], axis=-1), axis=-1)
    left, width = points[..., :-1], points[..., 1:] - points[..., :-1]
    x = (left[..., :, None] + width[..., :, None] * t).reshape(left.shape[:-1] + (-1,))
    wx = (width[..., :, None] * w).reshape(x.shape)
    return x, wx


def _log_factors(xp, log_ndtr, x, mu, sigma):
    """log P(X_i <= x) at the nodes: [..., k, n]; constants (sigma_i = 0) give the step 1[x >= mu_i]."""
    stoch = sigma > 0
    sig_safe = xp.where(stoch, sigma, 1.0)
    z = xp.clip((x[..., :, None] - mu[..., None, :]) / sig_safe[..., None, :], -_Z_CLIP, _Z_CLIP)
    step = xp.where(z >= 0, 0.0, _LOG_ZERO)
    return xp.where(stoch[..., None, :], log_ndtr(z), step), z, stoch, sig_safe


def _combine(xp, x, wx, log_cdf, mu, sets):
    """E[max] per set from log F_j at the nodes: log_cdf [..., m, k] -> [..., m]."""
    c = xp.max(xp.where(sets, mu[..., None, :], -_BIG_X), axis=-1)  # [..., m]
    above = x[..., None, :] >= c[..., None]
    integrand = xp.where(above, -xp.expm1(log_cdf), -xp.exp(log_cdf))
    value = c + xp.sum(wx[..., None, :] * integrand, axis=-1)
    return xp.where(xp.any(sets, axis=-1), value, -xp.inf)


def _set_log_cdf(xp, log_phi, sets):
    """log F_j = sum_{i in S_j} log P(X_i <= x): log_phi [..., k, n], sets [..., m, n] -> [..., m, k].

    A batched matmul (memory k (n + m) per batch element, not k m n); full float32 precision in JAX so
    that accelerators do not round the log-CDF sums to bfloat16.
    """
    weights = xp.swapaxes(sets, -1, -2).astype(log_phi.dtype)  # [..., n, m]
    if xp is jnp:
        out = jnp.matmul(log_phi, weights, precision=jax.lax.Precision.HIGHEST)
    else:
        out = np.matmul(log_phi, weights)
    return xp.swapaxes(out, -1, -2)


def _group_members(groups: np.ndarray, num_groups: int) -> np.ndarray:
    """Padded member table [g, s] of coordinate indices per group; the pad index is n."""
    n = groups.shape[0]
    lists = [np.flatnonzero(groups == g) for g in range(num_groups)]
    size = max(1, max(len(v) for v in lists))
    table = np.full((num_groups, size), n, dtype=np.int32)
    for g, v in enumerate(lists):
        table[g, :len(v)] = v
    return table


def _block_log_cdf(z, log_phi, stoch, sets, members, signs):
    """log F_j for block-correlated coordinates (JAX): [..., m, k]. members: padded table [g, s]."""
    # Constants contribute their step; random coordinates are combined inside their group.
    step = jnp.where(stoch[..., None, :], 0.0, log_phi)  # [..., k, n]
    log_det = _set_log_cdf(jnp, step, sets)
    pos = stoch & (signs > 0)
    neg = stoch & (signs < 0)
    member = sets[..., :, None, :]  # [..., m, 1, n]
    in_pos = member & pos[..., None, None, :]
    in_neg = member & neg[..., None, None, :]
    lp = jnp.where(in_pos, log_phi[..., None, :, :], 0.0)  # [..., m, k, n]; 0 = log 1 is neutral for min
    q = jnp.where(in_neg, jsp.ndtr(-z)[..., None, :, :], 0.0)  # 0 is neutral for max

    def gather(a, fill):
        pad = jnp.full(a.shape[:-1] + (1,), fill, a.dtype)
        return jnp.concatenate([a, pad], axis=-1)[..., members]  # [..., g, s]

    log_a = jnp.min(gather(lp, 0.0), axis=-1)  # [..., m, k, g]
    b = jnp.max(gather(q, 0.0), axis=-1)
    has_neg = jnp.any(gather(in_neg, False), axis=-1)  # [..., m, 1, g]
    prob = jnp.exp(log_a) - b
    safe = jnp.where(prob > 0, prob, 1.0)
    log_p = jnp.where(has_neg, jnp.where(prob > 0, jnp.log(safe), _LOG_ZERO), log_a)
    return log_det + jnp.sum(log_p, axis=-1)


def _check_vectors(mu, sigma, sets):
    if mu.ndim < 1 or sigma.ndim < 1:
        raise ValueError(f"mu and sigma must have a trailing variable axis n; got shapes mu={mu.shape}, "
                         f"sigma={sigma.shape}")
    if mu.shape[-1] != sigma.shape[-1]:
        raise ValueError(f"mu and sigma must have the same number of variables n; got mu.shape={mu.shape}, "
                         f"sigma.shape={sigma.shape}")
    if sets is not None and sets.shape[-1] != mu.shape[-1]:
        raise ValueError(f"the set mask must have trailing size n={mu.shape[-1]}; got shape {sets.shape}")


def _check_blocks(n, groups, signs, num_groups):
    """Validates the block structure; returns (member table [g, s] or None, signs or None)."""
    if groups is None and signs is None:
        return None, None
    if groups is None or signs is None or num_groups is None:
        raise ValueError("block correlation needs all of groups, signs and num_groups; got "
                         f"groups={'set' if groups is not None else None}, "
                         f"signs={'set' if signs is not None else None}, num_groups={num_groups}")
    if groups.shape != (n,) or signs.shape != (n,):
        raise ValueError(f"groups and signs must have shape (n,)=({n},); got groups.shape={groups.shape}, "
                         f"signs.shape={signs.shape}")
    if not (isinstance(num_groups, int) and num_groups >= 1):
        raise ValueError(f"num_groups must be a positive int; got {num_groups!r}")
    if isinstance(groups, jax.core.Tracer):
        raise ValueError("groups must be concrete (a numpy or jax array outside jit): it fixes the structure")
    g = np.asarray(groups)
    if g.min() < 0 or g.max() >= num_groups:
        raise ValueError(f"groups must lie in [0, num_groups={num_groups}); got range [{g.min()}, {g.max()}]")
    return jnp.asarray(_group_members(g, num_groups)), jnp.asarray(signs)


@functools.partial(jax.jit, static_argnums=(5, 6, 7))
def _per_set(mu, sigma, sets, members, signs, num_panels, nodes_per_panel, tail):
    """E[max_{i in S_j} X_i] for every set: mu [..., n], sigma [..., n], sets [..., m, n] -> [..., m]."""
    x, wx = _grid(jnp, mu, sigma, tail, num_panels, nodes_per_panel)
    log_phi, z, stoch, _ = _log_factors(jnp, jsp.log_ndtr, x, mu, sigma)
    if members is None:
        log_cdf = _set_log_cdf(jnp, log_phi, sets)
    else:
        log_cdf = _block_log_cdf(z, log_phi, stoch, sets, members, signs)
    return _combine(jnp, x, wx, log_cdf, mu, sets)


def _as_float(mu, sigma):
    mu = jnp.asarray(mu)
    sigma = jnp.asarray(sigma)
    dtype = jnp.result_type(mu.dtype, sigma.dtype, jnp.float32)
    return mu.astype(dtype), sigma.astype(dtype)


def expected_max(mu: jax.Array, sigma: jax.Array, mask: jax.Array | None = None, *,
                 groups: jax.Array | None = None, signs: jax.Array | None = None,
                 num_groups: int | None = None, num_panels: int = 16, nodes_per_panel: int = 12,
                 tail: float = 8.5) -> jax.Array:
    """Exact E[max_{i in mask} X_i] by 1-D Gauss-Legendre quadrature, X_i ~ N(mu_i, sigma_i^2).

    Coordinates with `sigma_i == 0` are the constants mu_i (a floor under the maximum). Independent
    coordinates by default; with `groups`/`signs` the random coordinates of a group share one standard
    normal (`X_i = mu_i + signs_i sigma_i Z_{groups_i}`, perfect (anti-)correlation), groups independent.

    Args:
      mu: means [..., n].
      sigma: standard deviations [..., n], >= 0 (broadcast against mu).
      mask: optional bool [..., n], the index set S (default: all n). An all-False mask gives -inf.
      groups: optional int [n] group id of each coordinate (block correlation), in [0, num_groups).
      signs: optional [n] of +1 / -1, the sign of each coordinate on its group's normal.
      num_groups: static number of groups (required with `groups`).
      num_panels: uniform panels over the range (static); every coordinate adds its own breakpoints
        mu_i + a sigma_i, a in (0, +-1.5, +-3, +-6), on top.
      nodes_per_panel: Gauss-Legendre nodes per sub-interval (static).
      tail: truncation of the integration range in standard deviations (static).

    Returns:
      E[max] with shape [...] in the dtype of mu and sigma (at least float32).

    References:
      Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(expected_max(jnp.zeros(2), jnp.ones(2))), 5)  # 1 / sqrt(pi)
      0.56419
      >>> round(float(expected_max(jnp.zeros(2), jnp.array([1.0, 0.0]))), 5)  # E max(0, Z)
      0.39894
    """
    _check_quadrature(num_panels, nodes_per_panel, tail)
    mu, sigma = _as_float(mu, sigma)
    if mask is not None:
        mask = jnp.asarray(mask, dtype=bool)
    _check_vectors(mu, sigma, mask)
    n = mu.shape[-1]
    groups = None if groups is None else (groups if isinstance(groups, jax.core.Tracer) else np.asarray(groups))
    members, signs = _check_blocks(n, groups, None if signs is None else jnp.asarray(signs), num_groups)
    mu, sigma = jnp.broadcast_arrays(mu, sigma)
    if mask is None:
        mask = jnp.ones(mu.shape, dtype=bool)
    mu, sigma, mask = jnp.broadcast_arrays(mu, sigma, mask)
    out = _per_set(mu, sigma, mask[..., None, :], members, signs, num_panels, nodes_per_panel, tail)
    return out[..., 0]


def expected_sum_of_max(mu: jax.Array, sigma: jax.Array, sets: jax.Array, *, groups: jax.Array | None = None,
                        signs: jax.Array | None = None, num_groups: int | None = None, num_panels: int = 16,
                        nodes_per_panel: int = 12, tail: float = 8.5, per_set: bool = False) -> jax.Array:
    """F(sigma) = E[sum_j max_{i in S_j} X_i], the variance-allocation objective.

    Args:
      mu: means [n].
      sigma: standard deviations [..., n] (leading dims are a batch of allocations).
      sets: bool membership matrix [m, n] (row j is S_j; see `sets_to_mask`); every row non-empty.
      groups, signs, num_groups, num_panels, nodes_per_panel, tail: as in `expected_max`.
      per_set: return the m expected maxima [..., m] instead of their sum.

    Returns:
      The objective with shape [...] (or [..., m] with `per_set`).

    References:
      Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463.

    Examples:
      >>> import jax.numpy as jnp
      >>> sets = jnp.array([[True, True, False], [False, True, True]])
      >>> round(float(expected_sum_of_max(jnp.zeros(3), jnp.array([0.0, 1.0, 0.0]), sets)), 5)
      0.79788
    """
    _check_quadrature(num_panels, nodes_per_panel, tail)
    mu, sigma = _as_float(mu, sigma)
    sets = jnp.asarray(sets, dtype=bool)
    if mu.ndim != 1:
        raise ValueError(f"mu must have shape (n,); got {mu.shape}")
    n = mu.shape[0]
    if sets.ndim != 2 or sets.shape[1] != n:
        raise ValueError(f"sets must be a bool membership matrix of shape (m, n={n}); got {sets.shape}")
    if sigma.shape[-1:] != (n,):
        raise ValueError(f"sigma must have shape (..., n={n}); got {sigma.shape}")
    if not isinstance(sets, jax.core.Tracer) and not bool(np.all(np.asarray(sets).any(axis=1))):
        empty = np.flatnonzero(~np.asarray(sets).any(axis=1)).tolist()
        raise ValueError(f"every set must be non-empty; empty rows of sets: {empty}")
    groups = None if groups is None else (groups if isinstance(groups, jax.core.Tracer) else np.asarray(groups))
    members, signs = _check_blocks(n, groups, None if signs is None else jnp.asarray(signs), num_groups)
    mu_b = jnp.broadcast_to(mu, sigma.shape)
    values = _per_set(mu_b, sigma, sets, members, signs, num_panels, nodes_per_panel, tail)
    return values if per_set else jnp.sum(values, axis=-1)


def expected_sum_of_max_f64(mu, sigma, sets=None, *, return_grad: bool = False, num_panels: int = 16,
                            nodes_per_panel: int = 12, tail: float = 8.5):
    """Float64 numpy twin of `expected_sum_of_max` for independent coordinates, optionally with d/dsigma.

    Same rule as the JAX version, evaluated in float64 (for exact baselines and ground truths). The
    gradient is `dF/dsigma_i = -sum_j int dF_j(x)/dsigma_i dx` (the endpoint terms vanish up to the
    Phi(-tail) truncation); at sigma_i = 0 it is 0 (the coordinate is a constant).

    Args:
      mu: means [n].
      sigma: standard deviations [..., n], >= 0.
      sets: bool [m, n] (default: one set with all n variables).
      return_grad: also return the gradient [..., n].

    Returns:
      F [...] (and the gradient [..., n] when `return_grad`).
    """
    _check_quadrature(num_panels, nodes_per_panel, tail)
    mu = np.asarray(mu, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    if mu.ndim != 1:
        raise ValueError(f"mu must have shape (n,); got {mu.shape}")
    n = mu.shape[0]
    if sigma.shape[-1:] != (n,):
        raise ValueError(f"sigma must have shape (..., n={n}); got {sigma.shape}")
    if np.any(sigma < 0):
        raise ValueError(f"sigma must be >= 0; got min {sigma.min()}")
    sets = np.ones((1, n), dtype=bool) if sets is None else np.asarray(sets, dtype=bool)
    if sets.ndim != 2 or sets.shape[1] != n:
        raise ValueError(f"sets must be a bool membership matrix of shape (m, n={n}); got {sets.shape}")
    if not np.all(sets.any(axis=1)):
        raise ValueError(f"every set must be non-empty; empty rows: {np.flatnonzero(~sets.any(axis=1)).tolist()}")
    mu_b = np.broadcast_to(mu, sigma.shape)
    x, wx = _grid(np, mu_b, sigma, tail, num_panels, nodes_per_panel)
    log_phi, z, stoch, sig_safe = _log_factors(np, ssp.log_ndtr, x, mu_b, sigma)
    log_cdf = _set_log_cdf(np, log_phi, sets)  # [..., m, k]
    value = np.sum(_combine(np, x, wx, log_cdf, mu_b, sets), axis=-1)
    if not return_grad:
        return value
    # d log Phi(z)/d sigma = -(phi(z)/Phi(z)) z / sigma, with phi/Phi = exp(log phi - log Phi).
    ratio = np.exp(-0.5 * z * z - 0.5 * math.log(2 * math.pi) - ssp.log_ndtr(z))
    dlog = np.where(stoch[..., None, :], -ratio * z / sig_safe[..., None, :], 0.0)  # [..., k, n]
    weighted = np.einsum("...k,...mk->...mk", wx, np.exp(log_cdf))
    grad = -np.einsum("...mk,mn,...kn->...n", weighted, sets.astype(np.float64), dlog)
    return value, grad


def iid_expected_max(t, *, floor: bool, num_panels: int = 64, nodes_per_panel: int = 16) -> np.ndarray:
    """E[max(Z_1..Z_t)] (floor=False) or E[max(0, Z_1..Z_t)] (floor=True) for iid N(0,1), float64.

    These are the h_s(t) tables of Algorithm 3: h_s(t) = iid_expected_max(t, floor=t < s).
    t = 0 gives 0 with a floor and -inf without.

    Args:
      t: int or int array of counts >= 0.
      floor: whether a constant 0 joins the maximum.

    Returns:
      float64 array of the shape of t.
    """
    t = np.asarray(t)
    if np.any(t < 0):
        raise ValueError(f"t must be >= 0; got min {t.min()}")
    nodes, w = _nodes(num_panels, nodes_per_panel)
    tf = t.astype(np.float64)[..., None]
    hi = 9.0 + np.sqrt(2 * np.log(np.maximum(tf, 1.0)))
    x_hi = hi * nodes
    above = hi[..., 0] * np.sum(w * -np.expm1(tf * ssp.log_ndtr(x_hi)), axis=-1)
    x_lo = -9.0 * nodes
    below = 9.0 * np.sum(w * np.exp(tf * ssp.log_ndtr(x_lo)), axis=-1)
    out = above if floor else above - below
    zero = np.zeros_like(out) if floor else np.full_like(out, -np.inf)
    return np.where(t == 0, zero, out)


def _mc_values(key, mu, scale, sets, num_samples, batch_size, correlated):
    n = mu.shape[0]
    num_batches = -(-num_samples // batch_size)
    keys = jax.random.split(key, num_batches)

    def batch(k):
        z = jax.random.normal(k, (batch_size, n), dtype=mu.dtype)
        x = mu + (z @ scale.T if correlated else z * scale)
        return jnp.sum(jnp.max(jnp.where(sets, x[:, None, :], -jnp.inf), axis=-1), axis=-1)

    values = jax.lax.map(batch, keys).reshape(-1)[:num_samples]
    return MonteCarloEstimate(jnp.mean(values), jnp.std(values, ddof=1) / math.sqrt(num_samples))


@functools.partial(jax.jit, static_argnames=("num_samples", "batch_size", "correlated"))
def _mc_jit(key, mu, scale, sets, *, num_samples, batch_size, correlated):
    return _mc_values(key, mu, scale, sets, num_samples, batch_size, correlated)


def _prepare_sets(sets, n):
    if sets is None:
        return jnp.ones((1, n), dtype=bool)
    sets = jnp.asarray(sets, dtype=bool)
    if sets.ndim == 1:
        sets = sets[None]
    if sets.ndim != 2 or sets.shape[1] != n:
        raise ValueError(f"sets must be a bool membership matrix of shape (m, n={n}); got {sets.shape}")
    return sets


def _check_mc(num_samples, batch_size):
    if not (isinstance(num_samples, int) and num_samples >= 2):
        raise ValueError(f"num_samples must be an int >= 2; got {num_samples!r}")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")


def expected_max_mc(key: jax.Array, mu: jax.Array, sigma: jax.Array, sets: jax.Array | None = None, *,
                    num_samples: int = 100_000, batch_size: int = 8192) -> MonteCarloEstimate:
    """Monte-Carlo estimate of E[sum_j max_{i in S_j} X_i] for independent X_i ~ N(mu_i, sigma_i^2).

    For cross-checking the quadrature; the standard error is that of the per-sample sum.

    Args:
      key: PRNG key.
      mu: means [n].
      sigma: standard deviations [n], >= 0.
      sets: bool [m, n] or [n] (default: one set with all n variables).
      num_samples: number of draws N (static).
      batch_size: draws per vectorized batch (static; bounds memory at batch_size * m * n).

    Returns:
      MonteCarloEstimate(mean, stderr).

    References:
      Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463.
    """
    _check_mc(num_samples, batch_size)
    mu = jnp.asarray(mu, dtype=jnp.float32)
    sigma = jnp.asarray(sigma, dtype=jnp.float32)
    if mu.ndim != 1 or sigma.shape != mu.shape:
        raise ValueError(f"mu and sigma must both have shape (n,); got mu={mu.shape}, sigma={sigma.shape}")
    sets = _prepare_sets(sets, mu.shape[0])
    return _mc_jit(key, mu, sigma, sets, num_samples=num_samples, batch_size=batch_size, correlated=False)


def expected_max_correlated_mc(key: jax.Array, mu: jax.Array, cov: jax.Array, sets: jax.Array | None = None, *,
                               num_samples: int = 100_000, batch_size: int = 8192) -> MonteCarloEstimate:
    """Monte-Carlo estimate of E[sum_j max_{i in S_j} X_i] for X ~ N(mu, cov), cov PSD (may be singular).

    Args:
      key: PRNG key.
      mu: means [n].
      cov: covariance [n, n], symmetric positive semi-definite (a symmetric square root via eigh is used).
      sets: bool [m, n] or [n] (default: one set with all n variables).
      num_samples: number of draws N (static).
      batch_size: draws per vectorized batch (static).

    Returns:
      MonteCarloEstimate(mean, stderr).

    References:
      Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463.
    """
    _check_mc(num_samples, batch_size)
    mu = jnp.asarray(mu, dtype=jnp.float32)
    cov = jnp.asarray(cov, dtype=jnp.float32)
    n = mu.shape[0] if mu.ndim == 1 else -1
    if mu.ndim != 1 or cov.shape != (n, n):
        raise ValueError(f"mu must have shape (n,) and cov shape (n, n); got mu={mu.shape}, cov={cov.shape}")
    if not isinstance(cov, jax.core.Tracer):
        c = np.asarray(cov, dtype=np.float64)
        scale_ = max(1.0, float(np.abs(c).max()))
        if not np.allclose(c, c.T, atol=1e-6 * scale_):
            raise ValueError("cov must be symmetric; got max |cov - cov.T| = "
                             f"{float(np.abs(c - c.T).max()):.3g}")
        lam_min = float(np.linalg.eigvalsh(c).min())
        if lam_min < -1e-5 * scale_:
            raise ValueError(f"cov must be positive semi-definite; got smallest eigenvalue {lam_min:.3g}")
    lam, vec = jnp.linalg.eigh(0.5 * (cov + cov.T))
    root = vec * jnp.sqrt(jnp.maximum(lam, 0.0))[None, :]
    sets = _prepare_sets(sets, n)
    return _mc_jit(key, mu, root, sets, num_samples=num_samples, batch_size=batch_size, correlated=True)


def expected_max_bivariate(mu: jax.Array, cov: jax.Array) -> jax.Array:
    """Closed form E[max(X_1, X_2)] for (X_1, X_2) ~ N(mu, cov) (Clark 1961).

    E max = mu_1 Phi(a) + mu_2 Phi(-a) + theta phi(a), theta^2 = Var(X_1 - X_2), a = (mu_1 - mu_2)/theta;
    theta = 0 gives max(mu_1, mu_2).

    Args:
      mu: means [..., 2].
      cov: covariances [..., 2, 2].

    Returns:
      E[max] with shape [...].

    References:
      Clark, "The greatest of a finite set of random variables", Operations Research 9(2), 1961.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(expected_max_bivariate(jnp.zeros(2), jnp.array([[.5, -.5], [-.5, .5]]))), 5)
      0.56419
    """
    mu = jnp.asarray(mu, dtype=jnp.result_type(mu, jnp.float32))
    cov = jnp.asarray(cov, dtype=mu.dtype)
    if mu.shape[-1:] != (2,) or cov.shape[-2:] != (2, 2):
        raise ValueError(f"mu must have shape (..., 2) and cov (..., 2, 2); got mu={mu.shape}, cov={cov.shape}")
    var = cov[..., 0, 0] + cov[..., 1, 1] - 2.0 * cov[..., 0, 1]
    theta = jnp.sqrt(jnp.maximum(var, 0.0))
    pos = theta > 0
    th = jnp.where(pos, theta, 1.0)
    a = (mu[..., 0] - mu[..., 1]) / th
    value = mu[..., 0] * jsp.ndtr(a) + mu[..., 1] * jsp.ndtr(-a) + th * jnp.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
    return jnp.where(pos, value, jnp.maximum(mu[..., 0], mu[..., 1]))


def block_covariance(sigma: jax.Array, groups: jax.Array, signs: jax.Array) -> jax.Array:
    """The covariance [n, n] of the block structure: cov_ij = s_i s_j sigma_i sigma_j [groups_i == groups_j]."""
    sigma = jnp.asarray(sigma)
    groups = jnp.asarray(groups)
    signs = jnp.asarray(signs, dtype=sigma.dtype)
    if sigma.ndim != 1 or groups.shape != sigma.shape or signs.shape != sigma.shape:
        raise ValueError(f"sigma, groups and signs must all have shape (n,); got {sigma.shape}, {groups.shape}, "
                         f"{signs.shape}")
    a = signs * sigma
    return jnp.outer(a, a) * (groups[:, None] == groups[None, :])


def sets_to_mask(sets, n: int) -> np.ndarray:
    """Index lists (an iterable of iterables of ints in [0, n)) -> bool membership matrix [m, n]."""
    rows = [list(s) for s in sets]
    mask = np.zeros((len(rows), n), dtype=bool)
    for j, row in enumerate(rows):
        if not row:
            raise ValueError(f"set {j} is empty; every set needs at least one index")
        for i in row:
            if not 0 <= int(i) < n:
                raise ValueError(f"set {j} has index {i} outside [0, n={n})")
            mask[j, int(i)] = True
    return mask


def participation_ratio(sigma) -> jax.Array:
    """Effective number of variables carrying variance: (sum sigma_i^2)^2 / sum sigma_i^4, over the last axis."""
    v = jnp.square(jnp.asarray(sigma))
    return jnp.square(jnp.sum(v, axis=-1)) / jnp.maximum(jnp.sum(v * v, axis=-1), jnp.finfo(v.dtype).tiny)
