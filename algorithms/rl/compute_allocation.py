"""Iso-compute allocation of on-policy RL sampling (IsoCompute Playbook).

Under a sampling budget of C rollouts split as C = n * B_p * M (n rollouts per
problem, B_p problems per batch, M update steps), the paper measures the
compute-optimal n*(C) and finds it rises with C and then saturates. This
module provides the protocol pieces:

  * `iso_compute_configs`: the sweep generator (exact budget accounting),
  * `fixed_batch_pairs`: the (B_p, n) splits of a fixed hardware batch B = B_p * n,
  * `frontier`: the argmax configuration per budget from sweep results,
  * `fit_saturating` / `saturating_curve`: the saturating fit
    log2 n*(C) = a + (b - a) * sigmoid(k * (log2 C - c0)) (scipy, float64),
  * a multi-problem softmax-bandit surrogate of GRPO (`make_bandit`,
    `train_bandit`, `mc_gradient`, `exact_gradient`, `bandit_metrics`):
    P problems, each a softmax over K answers with one correct answer; the
    logits share parameters theta [D] across problems (interference), or each
    problem has its own theta[p] (`per_problem=True`: a problem learns only
    from its own groups, so a group with no success gives it nothing); updates are
    group-relative policy gradients with n samples per problem, either
    Monte-Carlo (sampled answers, GRPO advantages) or the exact expectation
    of that estimator.

Dimension legend: P problems, K answers per problem, D shared parameters,
B = B_p problems in a batch, n (= G) samples per problem, S seeds.

Exact expected GRPO gradient: with std-normalised group advantages A_i, by
exchangeability E[(1/n) sum_i A_i grad log pi(a_i)] = (f1 - f0) grad p, where
p is the correct mass and f_r = E[A_1 | r_1 = r] over the Binomial(n - 1, p)
successes of the other samples. n = 1 gives f1 = f0 = 0 (no learning).

References:
  Cheng, Xie, Qu, Setlur, ..., Kumar. "IsoCompute Playbook: compute-optimal
  sampling allocation for on-policy LLM RL" (arXiv:2603.12151).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.optimize
import scipy.special
import scipy.stats

from primitives.policy_losses import group_advantages

# --------------------------------------------------------------------------- sweep


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """One iso-compute configuration: n * B_p * M rollouts (== C when exact)."""

    budget: int
    n: int
    num_problems: int
    steps: int

    @property
    def rollouts(self) -> int:
        return self.n * self.num_problems * self.steps


def _pos_ints(name: str, values: Iterable[int]) -> tuple[int, ...]:
    vals = tuple(int(v) for v in values)
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{name} must be a non-empty list of positive integers; got {vals}")
    return vals


def iso_compute_configs(
    budgets: Sequence[int],
    n_grid: Sequence[int],
    bp_grid: Sequence[int],
    *,
    min_steps: int = 1,
    exact: bool = True,
) -> list[SweepConfig]:
    """All (n, B_p, M) with n * B_p * M == C (or floor-rounded M when not exact).

    Args:
      budgets: budgets C in rollouts.
      n_grid: rollouts per problem n.
      bp_grid: problems per batch B_p.
      min_steps: drop configurations with M < min_steps.
      exact: if True, configurations where n * B_p does not divide C are
        excluded, so every config spends exactly C; otherwise M = C // (n B_p)
        (spends C - n B_p < rollouts <= C).

    Returns:
      list of SweepConfig, ordered by (budget, n, B_p).

    Raises:
      ValueError: on non-positive grids or min_steps < 1.

    Examples:
      >>> [(c.n, c.num_problems, c.steps) for c in iso_compute_configs([16], [2, 3, 4], [2])]
      [(2, 2, 4), (4, 2, 2)]
    """
    budgets = _pos_ints("budgets", budgets)
    n_grid = _pos_ints("n_grid", n_grid)
    bp_grid = _pos_ints("bp_grid", bp_grid)
    if min_steps < 1:
        raise ValueError(f"min_steps must be >= 1; got {min_steps}")
    out = []
    for c in sorted(set(budgets)):
        for n in sorted(set(n_grid)):
            for bp in sorted(set(bp_grid)):
                per_step = n * bp
                if exact and c % per_step:
                    continue
                m = c // per_step
                if m < min_steps:
                    continue
                out.append(SweepConfig(budget=c, n=n, num_problems=bp, steps=m))
    return out


def fixed_batch_pairs(batch_size: int, n_grid: Sequence[int]) -> list[tuple[int, int]]:
    """(B_p, n) pairs with B_p * n == batch_size for the n of `n_grid` that divide it.

    Examples:
      >>> fixed_batch_pairs(64, [1, 3, 4, 128])
      [(64, 1), (16, 4)]
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    return [(batch_size // n, n) for n in sorted(set(_pos_ints("n_grid", n_grid))) if batch_size % n == 0]


def frontier(rows: Sequence[dict], *, key: str = "score", group: str = "budget") -> dict:
    """Best row per budget: {C: row with the largest `key` among rows with that C}.

    Ties go to the first row in the given order.

    Examples:
      >>> rows = [dict(budget=8, n=2, score=0.1), dict(budget=8, n=4, score=0.3)]
      >>> frontier(rows)[8]["n"]
      4
    """
    if not rows:
        raise ValueError("rows must be non-empty")
    best: dict = {}
    for r in rows:
        c = r[group]
        if c not in best or r[key] > best[c][key]:
            best[c] = r
    return dict(sorted(best.items()))


# --------------------------------------------------------------------------- saturating fit


class SaturatingFit(NamedTuple):
    """log2 n*(C) = a + (b - a) * sigmoid(k * (log2 C - c0))."""

    a: float
    b: float
    k: float
    c0: float
    rmse: float


def saturating_curve(log2_c, a: float, b: float, k: float, c0: float) -> np.ndarray:
    """The saturating (sigmoid in log-log) frontier, in log2 n units (float64)."""
    x = np.asarray(log2_c, np.float64)
    return a + (b - a) * scipy.special.expit(k * (x - c0))


def fit_saturating(log2_c, log2_n, *, init: tuple[float, float, float, float] | None = None) -> SaturatingFit:
    """Least-squares fit of `saturating_curve` (scipy, float64, k > 0).

    Args:
      log2_c: [N] log2 budgets.
      log2_n: [N] log2 n*(C).
      init: optional (a, b, k, c0) start; default from the data range.

    Raises:
      ValueError: shape mismatch or fewer than 4 points.
    """
    x = np.asarray(log2_c, np.float64).ravel()
    y = np.asarray(log2_n, np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"log2_c and log2_n must match; got {x.shape} vs {y.shape}")
    if x.size < 4:
        raise ValueError(f"need >= 4 points for a 4-parameter fit; got {x.size}")
    if init is None:
        init = (float(y.min()), float(y.max()), 1.0, float(np.median(x)))
    span = max(float(x.max() - x.min()), 1.0)

    def resid(p):
        return saturating_curve(x, *p) - y

    lo = [-np.inf, -np.inf, 1e-3, x.min() - span]
    hi = [np.inf, np.inf, 50.0, x.max() + span]
    best = None
    for k0 in (init[2], 0.5, 2.0):
        p0 = np.clip(np.array([init[0], init[1], k0, init[3]], np.float64), np.array(lo) + 1e-9, np.array(hi) - 1e-9)
        res = scipy.optimize.least_squares(resid, p0, bounds=(lo, hi))
        if best is None or res.cost < best.cost:
            best = res
    a, b, k, c0 = (float(v) for v in best.x)
    return SaturatingFit(a, b, k, c0, float(np.sqrt(np.mean(best.fun**2))))


# --------------------------------------------------------------------------- bandit surrogate


class Bandit(NamedTuple):
    """Multi-problem softmax bandit: logits_p = base[p] + phi[p] @ theta.

    Attributes:
      base: [P, K] base logits (set the base policy's correct mass).
      phi: [P, K, D] shared-parameter features (cross-problem interference).
      correct: [P] int32 index of the correct answer.
    """

    base: jax.Array
    phi: jax.Array
    correct: jax.Array


def make_bandit(key, base_correct_mass, *, num_answers: int = 32, dim: int = 16, feature_scale: float = 1.0) -> Bandit:
    """Bandit whose base policy puts exactly `base_correct_mass[p]` on the correct answer.

    Args:
      key: PRNG key.
      base_correct_mass: [P] values in (0, 1).
      num_answers: K >= 2.
      dim: D >= 1.
      feature_scale: std of phi entries times sqrt(D).

    Raises:
      ValueError: on masses outside (0, 1) or bad sizes.
    """
    m = np.asarray(base_correct_mass, np.float64).ravel()
    if m.size == 0 or np.any((m <= 0) | (m >= 1)):
        raise ValueError(f"base_correct_mass must be non-empty in (0, 1); got min {m.min() if m.size else None}")
    if num_answers < 2 or dim < 1:
        raise ValueError(f"num_answers must be >= 2 and dim >= 1; got {num_answers}, {dim}")
    p = m.size
    k1, k2, k3 = jax.random.split(key, 3)
    correct = np.asarray(jax.random.randint(k1, (p,), 0, num_answers))
    base = np.asarray(jax.random.normal(k2, (p, num_answers)), np.float64)
    others = base.copy()
    others[np.arange(p), correct] = -np.inf
    lse = scipy.special.logsumexp(others, axis=1)
    base[np.arange(p), correct] = np.log(m / (1 - m)) + lse
    phi = jax.random.normal(k3, (p, num_answers, dim)) * (feature_scale / math.sqrt(dim))
    return Bandit(jnp.asarray(base, jnp.float32), phi, jnp.asarray(correct, jnp.int32))


def _logits(bandit: Bandit, theta: jax.Array) -> jax.Array:
    """[P, K] logits: base + phi @ theta for shared theta [D], or per problem for theta [P, D]."""
    if theta.ndim == 2:
        return bandit.base + jnp.einsum("pkd,pd->pk", bandit.phi, theta)
    return bandit.base + bandit.phi @ theta


def correct_mass(bandit: Bandit, theta: jax.Array) -> jax.Array:
    """[P] probability of the correct answer under theta: [D] shared, or [P, D] per-problem parameters."""
    logits = _logits(bandit, theta)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.exp(jnp.take_along_axis(logp, bandit.correct[:, None], axis=-1)[:, 0])


def _sub(bandit: Bandit, idx: jax.Array) -> Bandit:
    return Bandit(bandit.base[idx], bandit.phi[idx], bandit.correct[idx])


def mc_gradient(key, bandit: Bandit, theta: jax.Array, n: int, *, normalize_std: bool = True) -> jax.Array:
    """Monte-Carlo GRPO gradient on all problems of `bandit` with n samples each.

    g = (1/(P n)) sum_{p,i} A_{p,i} grad log pi_p(a_{p,i}); A from
    `group_advantages` over each problem's n rewards. Returns the ascent
    direction, shaped like theta ([D] shared or [P, D] per problem).
    """
    logits0 = _logits(bandit, theta)
    a = jax.random.categorical(key, logits0[:, None, :], axis=-1, shape=(logits0.shape[0], n))  # [P, n]
    r = (a == bandit.correct[:, None]).astype(jnp.float32)
    adv = jax.lax.stop_gradient(group_advantages(r, normalize_std=normalize_std))

    def obj(th):
        logp = jax.nn.log_softmax(_logits(bandit, th), axis=-1)
        lp = jnp.take_along_axis(logp, a, axis=-1)  # [P, n]
        return jnp.mean(adv * lp)

    return jax.grad(obj)(theta)


def advantage_weight(n: int, p: jax.Array, *, normalize_std: bool = True, eps: float = 1e-6) -> jax.Array:
    """f1 - f0: E[GRPO gradient] = (f1 - f0) grad p for one problem (see module doc).

    Args:
      n: samples per group.
      p: [...] correct mass.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    k = jnp.arange(n, dtype=jnp.float32)  # successes among the other n-1 samples
    p = jnp.asarray(p, jnp.float32)[..., None]
    logpmf = jax.scipy.stats.binom.logpmf(k, n - 1, p) if n > 1 else jnp.zeros_like(p + k)
    pmf = jnp.where(k <= n - 1, jnp.exp(logpmf), 0.0)

    def adv(s, r):
        m = s / n
        sd = jnp.sqrt(jnp.maximum(m * (1 - m), 0.0))
        return (r - m) / (sd + eps) if normalize_std else (r - m)

    f1 = jnp.sum(pmf * adv(k + 1, 1.0), -1)
    f0 = jnp.sum(pmf * adv(k, 0.0), -1)
    return f1 - f0


def exact_gradient(bandit: Bandit, theta: jax.Array, n: int, *, normalize_std: bool = True) -> jax.Array:
    """Exact expectation of `mc_gradient`: (1/P) sum_p (f1 - f0)(p_p) grad p_p, shaped like theta."""
    w = jax.lax.stop_gradient(advantage_weight(n, correct_mass(bandit, theta), normalize_std=normalize_std))
    return jax.grad(lambda th: jnp.mean(w * correct_mass(bandit, th)))(theta)


def pass_at_k_exact(p: jax.Array, k: int) -> jax.Array:
    """Expected pass@k = 1 - (1 - p)^k for correct mass p."""
    return 1.0 - (1.0 - p) ** k


def bandit_metrics(p: jax.Array, *, k: int = 16, solved_threshold: float = 0.5) -> dict:
    """Per-set metrics from the [P] correct masses: pass@1 (sharpening) and coverage.

    Returns dict with pass1 (mean p), pass_k (mean 1 - (1 - p)^k) and solved
    (fraction of problems with p >= solved_threshold).
    """
    return {
        "pass1": jnp.mean(p),
        f"pass{k}": jnp.mean(pass_at_k_exact(p, k)),
        "solved": jnp.mean((p >= solved_threshold).astype(jnp.float32)),
    }


def train_bandit(
    key,
    bandit: Bandit,
    *,
    n: int,
    num_problems: int,
    steps,
    lr: float = 0.05,
    mode: str = "mc",
    normalize_std: bool = True,
    per_problem: bool = False,
) -> dict:
    """Run M GRPO steps (Adam) on the bandit; each step draws B_p problems.

    Args:
      key: PRNG key (vmap over keys for seeds).
      bandit: the problem set (P problems); B_p <= P draws without replacement.
      n: samples per problem (static).
      num_problems: B_p (static).
      steps: M (may be traced: one compile serves all M for a given (n, B_p)).
      lr: Adam learning rate.
      mode: "mc" (sampled answers) or "exact" (expected gradient).
      per_problem: if True each problem has its own parameters theta[p] [D] (theta is [P, D]), so a
        problem moves only when its own group has a reward spread (no transfer across problems);
        otherwise theta [D] is shared by all problems.

    Returns:
      dict with theta ([D], or [P, D] with per_problem), best (max over steps 0..M of mean correct mass),
      final_p [P] (correct masses at the end) and best_p [P] (at the best step).
    """
    if mode not in ("mc", "exact"):
        raise ValueError(f"mode must be 'mc' or 'exact'; got {mode!r}")
    num_total = bandit.correct.shape[0]
    if not 1 <= num_problems <= num_total:
        raise ValueError(f"num_problems must be in [1, {num_total}]; got {num_problems}")
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    opt = optax.adam(lr)
    dim = bandit.phi.shape[-1]
    theta = jnp.zeros((num_total, dim) if per_problem else (dim,), jnp.float32)
    p0 = correct_mass(bandit, theta)

    def body(i, carry):
        th, st, best, best_p = carry
        kk = jax.random.fold_in(key, i)
        k1, k2 = jax.random.split(kk)
        idx = jax.random.permutation(k1, num_total)[:num_problems]
        sub = _sub(bandit, idx)
        th_sub = th[idx] if per_problem else th
        g = mc_gradient(k2, sub, th_sub, n, normalize_std=normalize_std) if mode == "mc" else exact_gradient(
            sub, th_sub, n, normalize_std=normalize_std)
        if per_problem:  # the drawn problems' rows; the others get a zero gradient
            g = jnp.zeros_like(th).at[idx].set(g)
        upd, st = opt.update(-g, st, th)
        th = optax.apply_updates(th, upd)
        p = correct_mass(bandit, th)
        better = jnp.mean(p) > best
        return th, st, jnp.where(better, jnp.mean(p), best), jnp.where(better, p, best_p)

    th, _, best, best_p = jax.lax.fori_loop(0, steps, body, (theta, opt.init(theta), jnp.mean(p0), p0))
    return {"theta": th, "best": best, "final_p": correct_mass(bandit, th), "best_p": best_p}


def non_degenerate_prob(n: int, p) -> np.ndarray:
    """P(a group of n has both a success and a failure) = 1 - p^n - (1 - p)^n."""
    p = np.asarray(p, np.float64)
    return 1.0 - p**n - (1.0 - p) ** n


__all__ = [
    "SweepConfig", "iso_compute_configs", "fixed_batch_pairs", "frontier", "SaturatingFit", "saturating_curve", "fit_saturating",
    "Bandit", "make_bandit", "correct_mass", "mc_gradient", "advantage_weight", "exact_gradient",
    "pass_at_k_exact", "bandit_metrics", "train_bandit", "non_degenerate_prob",
]
