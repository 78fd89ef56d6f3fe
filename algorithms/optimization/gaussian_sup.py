"""Allocating variance to maximize the expected supremum of Gaussians (Paes Leme, Stein, Teng, Worah).

Choose standard deviations sigma_i >= 0 with sum_i sigma_i^2 = 1 to maximize

    F(sigma) = E[ sum_j max_{i in S_j} X_i ],   X_i ~ N(mu_i, sigma_i^2) independent,

(`primitives.gaussian_sup.expected_sum_of_max`). F is convex in sigma (each draw is a max of affine
functions of sigma) and even in every sigma_i, hence non-decreasing in each sigma_i >= 0: the problem
maximizes a convex function over the sphere, and adding variance to a coordinate never lowers F.

Implemented here:

  * `ptas_single_set` - Algorithm 1, the additive PTAS for one set (m = 1, mu >= 0): every support
    T of size s <= K = min(n, ceil(eps^-2)), every sigma_T on the grid {eps^3 j : j = 1..floor(eps^-3)}
    with sum sigma^2 <= 1, the leftover variance 1 - sum sigma^2 put on the coordinate of T where it
    helps most; coordinates outside T are the constants mu_i. Runtime n^O(eps^-2): a faithful
    reference for small n and eps >= ~0.5, not a practical solver.
  * `greedy_variance_levels` - Algorithm 3, the O(log n)-approximation for many sets (GraphVarAlloc):
    for every level k = 0..floor(log2 n), the equal variance 4^-k on a set A of at most min(4^k, n)
    variables chosen greedily by exact marginal gain (for mu = 0 the level objective is
    g_k(A) = 2^-k sum_j h_{|S_j|}(|A cap S_j|), h the expected maximum of t iid normals with a zero
    floor when t < |S_j|, monotone submodular in A); the best level wins. `exhaustive_level` is the
    brute force over all sets of one size at one level (the 1 - 1/e reference).
  * `projected_gradient_ascent` - a practical HEURISTIC (no guarantee): Riemannian gradient ascent on
    the positive part of the sphere with random restarts, iterate tracking and support pruning (JAX,
    exact gradients of the quadrature, block correlation supported). Validated against
    `brute_force_optimum` in the tests and the experiment.
  * `brute_force_optimum` - the reference for tiny n: every point of a dense grid on the variance
    simplex (all supports included); the best ones (symmetric copies removed), jittered copies of them
    and seeded random Dirichlet points polished by SLSQP (float64, analytic gradient).

Everything that reports a value evaluates F exactly in float64 (`expected_sum_of_max_f64`).
The guarantees of Algorithms 1 and 3 are stated for mu >= 0 (Algorithm 3's analysis for mu = 0);
both run for any mu, the guarantee then does not apply.

Dimension legend: `n` variables, `m` sets, `R` restarts, `C` candidate allocations.

References:
  Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463, 2025
  (algorithm skeletons as read by a third-party reproduction; constants are not verified against the PDF).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from primitives import gaussian_sup as gs

__all__ = [
    "objective",
    "evaluate_batch",
    "complete_leftover",
    "ptas_grid",
    "PTASResult",
    "ptas_single_set",
    "LevelResult",
    "GreedyResult",
    "level_objective",
    "greedy_variance_levels",
    "exhaustive_level",
    "AscentResult",
    "projected_gradient_ascent",
    "BruteForceResult",
    "brute_force_optimum",
    "simplex_grid",
    "all_k_subsets",
    "pair_blocks",
]

_MAX_ELEMENTS = 4_000_000  # float64 elements per evaluation chunk (C k (n + m))


# ----------------------------------------------------------------------------------------------
# Input checks and exact float64 evaluation.
# ----------------------------------------------------------------------------------------------

def _check_mu(mu) -> np.ndarray:
    mu = np.asarray(mu, dtype=np.float64)
    if mu.ndim != 1 or mu.shape[0] < 1:
        raise ValueError(f"mu must have shape (n,) with n >= 1; got shape {mu.shape}")
    if not np.all(np.isfinite(mu)):
        raise ValueError(f"mu must be finite; got {mu.tolist()}")
    return mu


def _check_sets(sets, n: int) -> np.ndarray:
    if sets is None:
        return np.ones((1, n), dtype=bool)
    sets = np.asarray(sets)
    if sets.ndim == 1:
        sets = sets[None]
    if sets.ndim != 2 or sets.shape[1] != n:
        raise ValueError(f"sets must be a bool membership matrix of shape (m, n={n}); got shape {sets.shape}")
    sets = sets.astype(bool)
    if not np.all(sets.any(axis=1)):
        empty = np.flatnonzero(~sets.any(axis=1)).tolist()
        raise ValueError(f"every set must be non-empty; empty rows of sets: {empty}")
    return sets


def _check_sigma(sigma, n: int, *, name: str = "sigma") -> np.ndarray:
    sigma = np.asarray(sigma, dtype=np.float64)
    if sigma.shape[-1:] != (n,):
        raise ValueError(f"{name} must have shape (..., n={n}); got shape {sigma.shape}")
    if np.any(sigma < 0) or not np.all(np.isfinite(sigma)):
        raise ValueError(f"{name} must be finite and >= 0; got min {np.min(sigma)}")
    return sigma


def objective(mu, sigma, sets=None) -> float:
    """Exact F(sigma) = E[sum_j max_{i in S_j} X_i] in float64 (sets default: one set of all n)."""
    mu = _check_mu(mu)
    sets = _check_sets(sets, mu.shape[0])
    sigma = _check_sigma(sigma, mu.shape[0])
    if sigma.ndim != 1:
        raise ValueError(f"sigma must have shape (n,); got {sigma.shape} (use evaluate_batch for batches)")
    return float(gs.expected_sum_of_max_f64(mu, sigma, sets))


def evaluate_batch(mu, sigmas, sets=None, *, return_grad: bool = False):
    """Exact F for a batch of allocations sigmas [C, n] (float64, chunked to bound memory) -> [C]."""
    mu = _check_mu(mu)
    n = mu.shape[0]
    sets = _check_sets(sets, n)
    sigmas = _check_sigma(sigmas, n, name="sigmas").reshape(-1, n)
    nodes = (16 + 7 * n) * 12
    chunk = max(1, _MAX_ELEMENTS // (nodes * (n + sets.shape[0])))
    vals, grads = [], []
    for start in range(0, sigmas.shape[0], chunk):
        out = gs.expected_sum_of_max_f64(mu, sigmas[start:start + chunk], sets, return_grad=return_grad)
        if return_grad:
            vals.append(out[0])
            grads.append(out[1])
        else:
            vals.append(out)
    values = np.concatenate(vals) if vals else np.zeros((0,))
    if return_grad:
        return values, (np.concatenate(grads) if grads else np.zeros((0, n)))
    return values


def complete_leftover(mu, sigma, candidates=None, sets=None) -> tuple[np.ndarray, int]:
    """Puts the leftover variance 1 - sum sigma^2 on the candidate coordinate where F gains most.

    Because F is even and convex in each sigma_i, this never decreases F.

    Args:
      mu: means [n].
      sigma: allocation [n] with sum sigma^2 <= 1.
      candidates: indices that may receive the leftover (default: all n).
      sets: bool [m, n] (default: one set).

    Returns:
      (completed sigma [n] with sum sigma^2 = 1, the index that received the leftover).
    """
    mu = _check_mu(mu)
    n = mu.shape[0]
    sigma = _check_sigma(sigma, n)
    total = float(np.sum(sigma ** 2))
    if total > 1.0 + 1e-9:
        raise ValueError(f"sigma must satisfy sum sigma^2 <= 1; got {total:.6g}")
    cand = list(range(n)) if candidates is None else [int(i) for i in candidates]
    if not cand or any(not 0 <= i < n for i in cand):
        raise ValueError(f"candidates must be a non-empty list of indices in [0, n={n}); got {candidates}")
    left = max(0.0, 1.0 - total)
    trial = np.repeat(sigma[None], len(cand), axis=0)
    for r, i in enumerate(cand):
        trial[r, i] = math.sqrt(sigma[i] ** 2 + left)
    values = evaluate_batch(mu, trial, sets)
    best = int(np.argmax(values))
    return trial[best], cand[best]


# ----------------------------------------------------------------------------------------------
# Algorithm 1: additive PTAS for one set.
# ----------------------------------------------------------------------------------------------

def _check_eps(eps) -> float:
    if not (isinstance(eps, (int, float)) and 0.0 < float(eps) < 1.0):
        raise ValueError(f"eps must be a float in (0, 1); got {eps!r}")
    return float(eps)


def ptas_grid(eps: float) -> np.ndarray:
    """The standard-deviation grid {eps^3 j : j = 1..floor(eps^-3)} of Algorithm 1 (float64)."""
    eps = _check_eps(eps)
    step = eps ** 3
    count = int(math.floor(1.0 / step + 1e-9))
    return step * np.arange(1, count + 1, dtype=np.float64)


def _count_tuples(num_values: int, budget: int, max_len: int) -> list[int]:
    """counts[s] = #{(j_1..j_s) in [1, num_values]^s : sum j^2 <= budget} for s = 0..max_len (DP)."""
    ways = np.zeros(budget + 1, dtype=object)
    ways[0] = 1
    counts = [1]
    for _ in range(max_len):
        new = np.zeros(budget + 1, dtype=object)
        for j in range(1, num_values + 1):
            if j * j <= budget:
                new[j * j:] += ways[: budget + 1 - j * j]
        ways = new
        counts.append(int(ways.sum()))
    return counts


def _feasible_tuples(num_values: int, budget: int, length: int) -> np.ndarray:
    """All integer tuples [C, length] in [1, num_values] with sum of squares <= budget (pruned recursion)."""
    out = []

    def rec(prefix, left):
        if len(prefix) == length:
            out.append(prefix)
            return
        for j in range(1, num_values + 1):
            if j * j > left - (length - len(prefix) - 1):  # the remaining entries need at least 1 each
                break
            rec(prefix + (j,), left - j * j)

    rec((), budget)
    return np.asarray(out, dtype=np.float64).reshape(-1, length)


class PTASResult(NamedTuple):
    """Output of Algorithm 1.

    Attributes:
      sigma: the allocation [n], sum sigma^2 = 1.
      value: F(sigma) (exact, float64).
      support: the enumerated support T (sorted indices).
      grid_sigma: the allocation [n] before completion (entries of T on the eps^3 grid, others 0).
      completed: the index of T that received the leftover variance.
      num_candidates: number of completed allocations evaluated.
      max_support: K = min(n, ceil(eps^-2)) (or the cap that was passed).
    """

    sigma: np.ndarray
    value: float
    support: tuple[int, ...]
    grid_sigma: np.ndarray
    completed: int
    num_candidates: int
    max_support: int


def ptas_single_set(mu, eps: float, *, max_support: int | None = None,
                    max_candidates: int = 5_000_000) -> PTASResult:
    """Algorithm 1: additive PTAS for VarAlloc (one set of all n variables, mu >= 0).

    Enumerates every support T with |T| <= K = min(n, ceil(eps^-2)), every sigma_T in G^|T| with
    G = {eps^3 j : j = 1..floor(eps^-3)} and sum sigma_T^2 <= 1, completes the leftover variance onto
    the best coordinate of T (convexity: no loss) and keeps the best exact value. Coordinates outside T
    are the constants mu_i. Guarantee (as reported): F >= OPT - O(eps) for mu >= 0.

    Args:
      mu: means [n] (the guarantee needs mu >= 0).
      eps: accuracy in (0, 1); runtime n^O(eps^-2) eps^-O(eps^-2), practical for eps >= ~0.5, small n.
      max_support: optional cap on K (a deviation from the paper; default the paper's K).
      max_candidates: refuse (ValueError) instances that would evaluate more allocations than this,
        or whose candidate count needs a table of more than this many entries (eps^-6); both are
        checked before anything of the grid's size is allocated.

    Returns:
      PTASResult.

    References:
      Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463.
    """
    mu = _check_mu(mu)
    n = mu.shape[0]
    eps = _check_eps(eps)
    k_max = min(n, int(math.ceil(1.0 / eps ** 2 - 1e-9)))
    if max_support is not None:
        if not (isinstance(max_support, int) and max_support >= 1):
            raise ValueError(f"max_support must be a positive int; got {max_support!r}")
        k_max = min(k_max, max_support)
    step = eps ** 3
    budget = int(math.floor(1.0 / step ** 2 + 1e-9))  # sum_i j_i^2 <= eps^-6 <=> sum sigma^2 <= 1
    # Before allocating anything of the grid's size: a lower bound on the candidate count (every
    # tuple with all j <= sqrt(budget / s) is feasible) and the size of the counting table.
    lower = sum(math.comb(n, s) * math.isqrt(budget // s) ** s * s for s in range(1, k_max + 1))
    if lower > max_candidates:
        raise ValueError(f"Algorithm 1 at eps={eps}, n={n} would evaluate at least {lower} allocations > "
                         f"max_candidates={max_candidates}; raise eps or max_candidates")
    if budget + 1 > max_candidates:
        raise ValueError(f"Algorithm 1 at eps={eps} needs a counting table of eps^-6 = {budget + 1} entries > "
                         f"max_candidates={max_candidates}; raise eps or max_candidates")
    grid = ptas_grid(eps)
    counts = _count_tuples(grid.size, budget, k_max)
    total = sum(math.comb(n, s) * counts[s] * s for s in range(1, k_max + 1))
    if total > max_candidates:
        raise ValueError(f"Algorithm 1 at eps={eps}, n={n} would evaluate {total} allocations > "
                         f"max_candidates={max_candidates}; raise eps or max_candidates")
    tuples = {s: step * _feasible_tuples(grid.size, budget, s) for s in range(1, k_max + 1)}
    best_val, best = -math.inf, None
    count = 0
    for s, combos in tuples.items():
        if combos.shape[0] == 0:
            continue
        left = np.maximum(0.0, 1.0 - np.sum(combos ** 2, axis=1))  # [G_s]
        for support in itertools.combinations(range(n), s):
            idx = np.asarray(support)
            base = np.zeros((combos.shape[0], n))
            base[:, idx] = combos
            trial = np.repeat(base[:, None, :], s, axis=1)  # [G_s, s, n]: leftover on position p
            for p in range(s):
                trial[:, p, idx[p]] = np.sqrt(combos[:, p] ** 2 + left)
            vals = evaluate_batch(mu, trial.reshape(-1, n)).reshape(-1, s)
            count += vals.size
            g, p = np.unravel_index(int(np.argmax(vals)), vals.shape)
            if vals[g, p] > best_val:
                best_val = float(vals[g, p])
                best = (trial[g, p].copy(), support, base[g].copy(), int(idx[p]))
    sigma, support, grid_sigma, completed = best
    return PTASResult(sigma=sigma, value=best_val, support=tuple(int(i) for i in support), grid_sigma=grid_sigma,
                      completed=completed, num_candidates=count, max_support=k_max)


# ----------------------------------------------------------------------------------------------
# Algorithm 3: greedy over variance levels 4^-k for many sets.
# ----------------------------------------------------------------------------------------------

class LevelResult(NamedTuple):
    """One level of Algorithm 3: variance 4^-level on `chosen` (|chosen| <= min(4^level, n))."""

    level: int
    chosen: tuple[int, ...]
    value: float  # exact F of the level's allocation (may have total variance < 1)


class GreedyResult(NamedTuple):
    """Output of Algorithm 3.

    Attributes:
      sigma: the best level's allocation [n] (2^-level on the chosen variables; sum sigma^2 <= 1).
      value: its exact F.
      level: the winning level k.
      chosen: its chosen variables (in greedy order).
      levels: every level's LevelResult.
    """

    sigma: np.ndarray
    value: float
    level: int
    chosen: tuple[int, ...]
    levels: tuple[LevelResult, ...]


@functools.lru_cache(maxsize=64)
def _h_tables(max_size: int) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(max_size + 1)
    return gs.iid_expected_max(t, floor=True), gs.iid_expected_max(t, floor=False)


def _zero_mean(mu) -> bool:
    return bool(np.all(mu == 0.0))


def level_objective(mu, sets, masks, level: int) -> np.ndarray:
    """F with variance 4^-level on each chosen set: masks bool [C, n] -> [C] (exact, float64).

    For mu = 0 this is g_k(A) = 2^-k sum_j h_{|S_j|}(|A cap S_j|) from the h-tables (fast, any n);
    otherwise the quadrature.
    """
    mu = _check_mu(mu)
    n = mu.shape[0]
    sets = _check_sets(sets, n)
    masks = np.asarray(masks, dtype=bool).reshape(-1, n)
    scale = 2.0 ** (-level)
    if _zero_mean(mu):
        sizes = sets.sum(axis=1)
        floor_t, nofloor_t = _h_tables(int(sizes.max()))
        t = masks.astype(np.int64) @ sets.T.astype(np.int64)  # [C, m]
        h = np.where(t == sizes[None, :], nofloor_t[t], floor_t[t])
        return scale * h.sum(axis=1)
    return evaluate_batch(mu, scale * masks.astype(np.float64), sets)


def greedy_variance_levels(mu, sets, *, max_level: int | None = None) -> GreedyResult:
    """Algorithm 3: O(log n)-approximation for GraphVarAlloc by greedy selection at each variance level.

    For k = 0..floor(log2 n): variance 4^-k, budget min(4^k, n) variables, picked one at a time by the
    exact marginal gain of the level objective (ties to the lowest index; stops early if no variable
    gains); returns the level with the largest exact F.

    Args:
      mu: means [n] (the analysis is for mu = 0; mu >= 0 is reduced to it at constant loss).
      sets: bool membership matrix [m, n].
      max_level: optional last level (default floor(log2 n)).

    Returns:
      GreedyResult.

    References:
      Paes Leme, Stein, Teng, Worah, "Allocating Variance to Maximize Expectation", arXiv:2502.18463.
    """
    mu = _check_mu(mu)
    n = mu.shape[0]
    sets = _check_sets(sets, n)
    top = int(math.floor(math.log2(n))) if n > 1 else 0
    if max_level is not None:
        if not (isinstance(max_level, int) and max_level >= 0):
            raise ValueError(f"max_level must be an int >= 0; got {max_level!r}")
        top = max_level
    zero = _zero_mean(mu)
    sizes = sets.sum(axis=1)
    floor_t, nofloor_t = _h_tables(int(sizes.max()))
    levels = []
    for k in range(top + 1):
        budget = min(4 ** k, n)
        chosen = np.zeros(n, dtype=bool)
        order = []
        current = float(level_objective(mu, sets, chosen[None], k)[0])
        for _ in range(budget):
            free = np.flatnonzero(~chosen)
            if zero:  # marginal gains from the h-tables in O(m n): g_k(A + i) = g_k(A) + sum_{j ni i} delta_j
                t = sets[:, chosen].sum(axis=1)
                grow = np.minimum(t + 1, sizes)
                delta = np.where(grow == sizes, nofloor_t[grow], floor_t[grow]) - np.where(
                    t == sizes, nofloor_t[t], floor_t[t])
                vals = current + 2.0 ** (-k) * (sets[:, free].T.astype(np.float64) @ delta)
            else:
                trial = np.repeat(chosen[None], free.size, axis=0)
                trial[np.arange(free.size), free] = True
                vals = level_objective(mu, sets, trial, k)
            j = int(np.argmax(vals))
            if vals[j] <= current + 1e-15 and order:
                break
            chosen[free[j]] = True
            order.append(int(free[j]))
            current = float(vals[j])
        if zero:  # recompute exactly (no accumulated rounding)
            current = float(level_objective(mu, sets, chosen[None], k)[0])
        levels.append(LevelResult(level=k, chosen=tuple(order), value=current))
    best = max(levels, key=lambda r: r.value)
    sigma = np.zeros(n)
    sigma[list(best.chosen)] = 2.0 ** (-best.level)
    return GreedyResult(sigma=sigma, value=best.value, level=best.level, chosen=best.chosen, levels=tuple(levels))


def exhaustive_level(mu, sets, level: int, size: int) -> tuple[float, tuple[int, ...]]:
    """Brute force at one level: the best set of exactly `size` variables at variance 4^-level."""
    mu = _check_mu(mu)
    n = mu.shape[0]
    if not (isinstance(size, int) and 0 <= size <= n):
        raise ValueError(f"size must be an int in [0, n={n}]; got {size!r}")
    if 4.0 ** (-level) * size > 1.0 + 1e-12:
        raise ValueError(f"infeasible: size * 4^-level = {size * 4.0 ** (-level):.4g} > 1")
    combos = list(itertools.combinations(range(n), size))
    if len(combos) > 200_000:
        raise ValueError(f"exhaustive_level would enumerate {len(combos)} sets; use smaller n")
    masks = np.zeros((len(combos), n), dtype=bool)
    for r, c in enumerate(combos):
        masks[r, list(c)] = True
    vals = level_objective(mu, sets, masks, level)
    j = int(np.argmax(vals))
    return float(vals[j]), combos[j]


# ----------------------------------------------------------------------------------------------
# Practical heuristic: projected gradient ascent on the sphere with restarts and pruning.
# ----------------------------------------------------------------------------------------------

class AscentResult(NamedTuple):
    """Output of the heuristic.

    Attributes:
      sigma: best allocation [n] (pruned, sum sigma^2 = 1).
      value: its exact F (float64; for block correlation the float32 quadrature of the block model).
      restart_values: F of every restart's final allocation [R].
    """

    sigma: np.ndarray
    value: float
    restart_values: np.ndarray


def _project(x):
    x = jnp.maximum(x, 0.0)
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.maximum(norm, 1e-30)


@functools.partial(jax.jit, static_argnames=("num_steps", "num_groups", "groups"))
def _ascent(sigma0, mu, sets, signs, step_size, *, num_steps, num_groups, groups):
    # groups: None (independent) or a tuple of group ids (static: it fixes the structure).
    kw = {} if groups is None else dict(groups=np.asarray(groups), signs=signs, num_groups=num_groups)

    def total(s):
        v = gs.expected_sum_of_max(mu, s, sets, **kw)
        return jnp.sum(v), v

    grad_fn = jax.grad(total, has_aux=True)

    def body(carry, t):
        s, best_s, best_v = carry
        g, v = grad_fn(s)
        improved = v > best_v
        best_v = jnp.where(improved, v, best_v)
        best_s = jnp.where(improved[:, None], s, best_s)
        tangent = g - jnp.sum(g * s, axis=-1, keepdims=True) * s
        lr = step_size * 0.5 * (1.0 + jnp.cos(jnp.pi * t / num_steps))
        return (_project(s + lr * tangent), best_s, best_v), None

    init = (sigma0, sigma0, jnp.full(sigma0.shape[:-1], -jnp.inf, sigma0.dtype))
    (s, best_s, best_v), _ = jax.lax.scan(body, init, jnp.arange(num_steps, dtype=sigma0.dtype))
    v_last = gs.expected_sum_of_max(mu, s, sets, **kw)
    return jnp.where((v_last > best_v)[:, None], s, best_s)


def _prune(sigma: np.ndarray, tol: float) -> np.ndarray:
    s = np.where(sigma >= tol * np.max(sigma, axis=-1, keepdims=True), sigma, 0.0)
    return s / np.linalg.norm(s, axis=-1, keepdims=True)


def projected_gradient_ascent(key: jax.Array, mu, sets=None, *, groups=None, signs=None,
                              num_groups: int | None = None, num_restarts: int = 16, num_steps: int = 150,
                              step_size: float = 0.5, prune_tol: float = 1e-2, polish_steps: int = 50,
                              init=None, polish: bool = True) -> AscentResult:
    """HEURISTIC optimizer of F on {sigma >= 0, |sigma| = 1}: projected gradient ascent with restarts.

    Each restart follows the tangent gradient with a cosine-decayed step, projected back onto the
    positive part of the sphere, and keeps its best iterate; coordinates below `prune_tol` times the
    largest are then set to 0 (support pruning) and the rest refined; the best restart by exact
    value wins after the 4 best are polished by SLSQP in float64 (`polish`). Restart 0 is the uniform
    allocation, the others random sparse ones. No optimality
    guarantee (F is convex: many local maxima); compare with `brute_force_optimum` on small n.

    Args:
      key: PRNG key for the restarts.
      mu: means [n].
      sets: bool [m, n] (default: one set of all n).
      groups, signs, num_groups: optional block correlation (see `primitives.gaussian_sup.expected_max`).
      num_restarts: R (static).
      num_steps: ascent steps per restart (static).
      step_size: initial step.
      prune_tol: relative threshold of the support pruning (0 disables it).
      polish_steps: steps after pruning (static; 0 skips).
      init: optional extra starting allocations [r, n] (added to the restarts).
      polish: finish the 4 best restarts with a float64 SLSQP polish on the sphere (independent case only).

    Returns:
      AscentResult.
    """
    mu = _check_mu(mu)
    n = mu.shape[0]
    sets = _check_sets(sets, n)
    if not (isinstance(num_restarts, int) and num_restarts >= 1):
        raise ValueError(f"num_restarts must be a positive int; got {num_restarts!r}")
    if not (isinstance(num_steps, int) and num_steps >= 1):
        raise ValueError(f"num_steps must be a positive int; got {num_steps!r}")
    if not step_size > 0:
        raise ValueError(f"step_size must be > 0; got {step_size!r}")
    if not 0 <= prune_tol < 1:
        raise ValueError(f"prune_tol must be in [0, 1); got {prune_tol!r}")
    has_blocks = groups is not None
    k_sup, k_val = jax.random.split(key)
    raw = np.abs(np.asarray(jax.random.normal(k_val, (num_restarts, n)), dtype=np.float64))
    sizes = np.asarray(jax.random.randint(k_sup, (num_restarts,), 1, n + 1))
    for r in range(num_restarts):  # sparse random starts: keep the `sizes[r]` largest entries
        keep = np.argsort(-raw[r])[: sizes[r]]
        row = np.zeros(n)
        row[keep] = raw[r, keep] + 0.05
        raw[r] = row
    raw[0] = 1.0
    starts = raw
    if init is not None:
        extra = _check_sigma(init, n, name="init").reshape(-1, n)
        starts = np.concatenate([starts, extra + 1e-12], axis=0)
    starts = starts / np.linalg.norm(starts, axis=1, keepdims=True)
    s_arr = jnp.asarray(np.ones(n, np.float32) if signs is None else np.asarray(signs, np.float32))
    args = (jnp.asarray(mu, jnp.float32), jnp.asarray(sets), s_arr if has_blocks else None, jnp.float32(step_size))
    static = dict(num_groups=num_groups if has_blocks else None,
                  groups=tuple(int(v) for v in np.asarray(groups)) if has_blocks else None)
    out = np.asarray(_ascent(jnp.asarray(starts, jnp.float32), *args, num_steps=num_steps, **static),
                     dtype=np.float64)
    if prune_tol > 0:
        out = _prune(out, prune_tol)
        if polish_steps > 0:
            out = np.asarray(_ascent(jnp.asarray(out, jnp.float32), *args[:-1], jnp.float32(step_size * 0.2),
                                     num_steps=polish_steps, **static), dtype=np.float64)
            out = _prune(out, prune_tol * 0.1)
    out = out / np.linalg.norm(out, axis=1, keepdims=True)
    if has_blocks:
        vals = np.asarray(gs.expected_sum_of_max(jnp.asarray(mu, jnp.float32), jnp.asarray(out, jnp.float32),
                                                 jnp.asarray(sets), groups=np.asarray(groups),
                                                 signs=np.asarray(signs), num_groups=num_groups), np.float64)
    else:
        vals = evaluate_batch(mu, out, sets)
    j = int(np.argmax(vals))
    sigma, value = out[j], float(vals[j])
    if polish and not has_blocks:
        # Local float64 polish (SLSQP) of the best few restarts; pruned coordinates restart just above 0.
        for r in np.argsort(-vals)[:4]:
            start = np.maximum(out[r], 1e-3)
            s_pol, _ = _polish(mu, sets, start / np.linalg.norm(start))
            s_pol = _prune(s_pol[None], 1e-4)[0]
            v_pol = float(gs.expected_sum_of_max_f64(mu, s_pol, sets))
            if v_pol > value:
                sigma, value = s_pol, v_pol
    return AscentResult(sigma=sigma, value=value, restart_values=vals)


# ----------------------------------------------------------------------------------------------
# Brute force for tiny n.
# ----------------------------------------------------------------------------------------------

def simplex_grid(n: int, resolution: int) -> np.ndarray:
    """All variance vectors v [C, n] with v_i = c_i / resolution, c_i >= 0 integers summing to resolution."""
    if not (isinstance(n, int) and n >= 1 and isinstance(resolution, int) and resolution >= 1):
        raise ValueError(f"n and resolution must be positive ints; got n={n!r}, resolution={resolution!r}")
    rows = []
    for bars in itertools.combinations(range(resolution + n - 1), n - 1):
        edges = (-1,) + bars + (resolution + n - 1,)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(n)])
    return np.asarray(rows, dtype=np.float64) / resolution


class BruteForceResult(NamedTuple):
    """Reference optimum: best allocation [n], its exact value, and the grid resolution used."""

    sigma: np.ndarray
    value: float
    resolution: int
    grid_value: float  # best value on the grid before polishing


def _polish(mu, sets, sigma0: np.ndarray) -> tuple[np.ndarray, float]:
    from scipy import optimize

    support = np.flatnonzero(sigma0 > 0)
    n = mu.shape[0]

    def full(x):
        s = np.zeros(n)
        s[support] = np.maximum(x, 0.0)
        return s

    def fun(x):
        v, g = gs.expected_sum_of_max_f64(mu, full(x), sets, return_grad=True)
        return -float(v), -g[support]

    cons = {"type": "eq", "fun": lambda x: np.sum(x ** 2) - 1.0, "jac": lambda x: 2.0 * x}
    res = optimize.minimize(fun, sigma0[support], jac=True, method="SLSQP", bounds=[(0.0, 1.0)] * support.size,
                            constraints=[cons], options={"maxiter": 200, "ftol": 1e-13})
    s = full(res.x)
    s = s / np.linalg.norm(s)
    return s, float(gs.expected_sum_of_max_f64(mu, s, sets))


def _interchangeable_classes(mu: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """Class label [n] of coordinates that the instance cannot tell apart.

    i ~ j when mu_i == mu_j and swapping columns i and j maps the family of sets onto itself (as a
    multiset of rows). Swaps that are automorphisms compose ((i k) = (i j)(j k)(i j)), so ~ is an
    equivalence and every permutation inside a class is a symmetry of F: sorting the variances inside
    every class gives a canonical representative of a start's symmetry orbit.
    """
    n = mu.shape[0]
    rows = sorted(map(tuple, sets.astype(np.int8).tolist()))
    label = -np.ones(n, dtype=np.int64)
    for i in range(n):
        if label[i] >= 0:
            continue
        label[i] = i
        for j in range(i + 1, n):
            if label[j] >= 0 or mu[j] != mu[i]:
                continue
            swapped = sets.copy()
            swapped[:, [i, j]] = swapped[:, [j, i]]
            if sorted(map(tuple, swapped.astype(np.int8).tolist())) == rows:
                label[j] = i
    return label


def _canonical(counts: np.ndarray, label: np.ndarray) -> tuple[int, ...]:
    """Representative of an integer grid point's orbit: entries sorted (descending) inside every class."""
    out = counts.copy()
    for c in np.unique(label):
        idx = np.flatnonzero(label == c)
        out[idx] = np.sort(counts[idx])[::-1]
    return tuple(int(v) for v in out)


def brute_force_optimum(mu, sets=None, *, max_points: int = 20_000, num_polish: int = 6, num_random: int = 12,
                        jitter: float = 0.1, seed: int = 0) -> BruteForceResult:
    """Reference optimum for tiny n: the variance-simplex grid (every support) plus SLSQP polishing.

    The resolution is the largest with at most `max_points` grid points. Polish starts (each run by
    SLSQP on its own support):

      * the `num_polish` best grid points and the best grid point of every support size, after
        removing symmetric copies (variances sorted inside every class of interchangeable coordinates,
        see `_interchangeable_classes`: with zero means the six permutations of (0.2 x 5, 0) are one start);
      * every such start moved towards a Dirichlet(1) point on its own support by `jitter`: symmetric grid
        points can be saddles of F on the sphere that SLSQP does not leave (n = 6, zero means: every
        permutation of (0.2 x 5, 0) polishes to 0.5231079 while the optimum is 0.5240333, four variances
        0.2471 and one 0.0115);
      * `num_random` Dirichlet(1) points on the full variance simplex (asymmetric, full support).

    All random draws come from `numpy.random.default_rng(seed)`: the result is deterministic.

    Args:
      mu: means [n] (n <= 8 is sensible).
      sets: bool [m, n] (default: one set).
      max_points: grid size cap.
      num_polish: number of distinct (up to symmetry) best grid points polished.
      num_random: number of random full-support starts.
      jitter: weight of the Dirichlet point in the jittered copies (0 disables them).
      seed: seed of the random starts.

    Returns:
      BruteForceResult.
    """
    mu = _check_mu(mu)
    n = mu.shape[0]
    sets = _check_sets(sets, n)
    if not (isinstance(num_random, int) and num_random >= 0):
        raise ValueError(f"num_random must be an int >= 0; got {num_random!r}")
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1); got {jitter!r}")
    if n == 1:
        s = np.ones(1)
        v = float(gs.expected_sum_of_max_f64(mu, s, sets))
        return BruteForceResult(sigma=s, value=v, resolution=1, grid_value=v)
    resolution = 1
    while math.comb(resolution + 1 + n - 1, n - 1) <= max_points:
        resolution += 1
    variances = simplex_grid(n, resolution)
    grid = np.sqrt(variances)
    vals = evaluate_batch(mu, grid, sets)
    counts = np.rint(variances * resolution).astype(np.int64)
    label = _interchangeable_classes(mu, sets)
    ranked = np.argsort(-vals, kind="stable")
    seen: set[tuple[int, ...]] = set()
    order: list[int] = []
    for i in ranked:  # the best `num_polish` distinct orbits
        if len(order) >= num_polish:
            break
        key = _canonical(counts[i], label)
        if key not in seen:
            seen.add(key)
            order.append(int(i))
    nnz = (counts > 0).sum(axis=1)
    for s in range(1, n + 1):  # plus the best of every support size (if not already there)
        idx = np.flatnonzero(nnz == s)
        if idx.size:
            i = int(idx[np.argmax(vals[idx])])
            key = _canonical(counts[i], label)
            if key not in seen:
                seen.add(key)
                order.append(i)
    rng = np.random.default_rng(seed)
    starts = [grid[i] for i in order]
    if jitter > 0:
        for i in order:
            support = np.flatnonzero(counts[i] > 0)
            if support.size < 2:
                continue
            v = variances[i].copy()
            v[support] = (1.0 - jitter) * v[support] + jitter * rng.dirichlet(np.ones(support.size))
            starts.append(np.sqrt(v))
    for v in rng.dirichlet(np.ones(n), size=num_random):
        starts.append(np.sqrt(v))
    best_s, best_v = grid[order[0]], float(vals[order[0]])
    for start in starts:
        s, v = _polish(mu, sets, start)
        if v > best_v:
            best_s, best_v = s, v
    return BruteForceResult(sigma=best_s, value=best_v, resolution=resolution, grid_value=float(vals.max()))


# ----------------------------------------------------------------------------------------------
# Instance families.
# ----------------------------------------------------------------------------------------------

def all_k_subsets(n: int, k: int) -> np.ndarray:
    """Membership matrix [C(n, k), n] of all k-subsets of [n] (the family of the paper's Thm 1.5)."""
    if not (isinstance(n, int) and isinstance(k, int) and 1 <= k <= n):
        raise ValueError(f"need ints 1 <= k <= n; got n={n!r}, k={k!r}")
    return gs.sets_to_mask(itertools.combinations(range(n), k), n)


def pair_blocks(n: int, *, negative: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Block structure of 2x2 perfectly correlated pairs (0,1), (2,3), ...: (groups [n], signs [n], g).

    `negative=True` flips the sign of the second member of each pair (perfect anti-correlation).
    """
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"n must be a positive int; got {n!r}")
    groups = np.arange(n) // 2
    signs = np.ones(n, dtype=np.float32)
    if negative:
        signs[1::2] = -1.0
    return groups.astype(np.int32), signs, int(groups.max()) + 1
