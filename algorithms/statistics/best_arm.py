"""Fixed-budget best-model identification: Successive Rejects and Synchronized Successive Rejects (SySRs).

The problem: K models (arms) and a finite pool of N prompts with a score in [0, 1] for every (model,
prompt) pair. One *pull* is one (model, prompt) evaluation. With a budget of n pulls, return the model
with the highest mean score over the pool. The metric is the probability of returning a best model.

* **Successive Rejects (SR)** (Audibert, Bubeck & Munos, 2010) splits the budget into K-1 phases with
  the cumulative per-arm sample sizes
  ``n_k = ceil((n - K) / (logbar(K) (K + 1 - k)))``, ``logbar(K) = 1/2 + sum_{i=2..K} 1/i``;
  after phase k every surviving arm has n_k samples and the arm with the lowest empirical mean is
  removed (ties uniformly at random). Here every arm draws its prompts independently, without
  replacement (one random prompt order per arm).
* **SySRs** (Lyu, Nejma, Wegel, Yang & Dorner, 2026) keeps exactly that schedule but draws ONE random
  prompt order per run, shared by all arms: after phase k every survivor has been scored on the same
  n_k prompts, so the elimination is a paired comparison whose noise is the variance of the per-prompt
  score *difference*, small when models are alike. No hyper-parameters.
* **Finite-pool reallocation** (extension, not the paper's Algorithm 1; the official code does it):
  when a phase would need more than N prompts per arm it is capped at N and the budget it cannot use
  is given proportionally to the unsaturated phases (:func:`phase_schedule` with ``reallocate=True``).
* **Baselines**: naive shared-prompt uniform (n // K shared prompts for every arm), independent
  uniform (n // K prompts per arm, drawn independently), UCB-E (Audibert et al., 2010) with a fixed
  exploration constant ``a`` (pull the argmax of ``mean + sqrt(a / count)``, prompts per arm without
  replacement) and shared-prompt UCB-E (the j-th pull of every arm is the j-th prompt of one shared
  random order).
* **Hardness** plug-ins on the pool: SR's ``H_2 = max_i i / Delta_(i)^2`` and the paired Bernstein term
  ``H_SySRs = max_i i [2 Var(Y_best - Y_i) + (2/3)(1 + Delta_i) Delta_i] / Delta_i^2`` (ranks by
  decreasing per-arm term), each with the bound ``K (K - 1) / 2 exp(-(n - K) / (logbar(K) H))``.
* :func:`synthetic_benchmark`: binary scores from latent prompt difficulty and model ability, a noise
  scale setting how alike the models are.

Everything random takes an explicit PRNG key; one call is one run, and :func:`simulate` vmaps runs
(and all budgets at once: a run's prompt order is shared by its budgets, common random numbers, as in
the official protocol that reseeds every budget identically).

Dimension legend: ``k`` arms (models, K), ``n`` prompts in the pool (N), ``p`` phases (K - 1),
``b`` budgets, ``c`` UCB-E checkpoints (budgets), ``r`` runs.

References:
  Lyu, Nejma, Wegel, Yang, Dorner, "Cutting LLM Evaluation Costs with SySRs: A Bandit Algorithm that
  Provably Exploits Model Similarity", arXiv:2606.07726 (ICML 2026).
  Audibert, Bubeck, Munos, "Best Arm Identification in Multi-Armed Bandits", COLT 2010.
"""

from __future__ import annotations

import fractions
import functools
import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri

__all__ = [
    "METHODS",
    "SRTrace",
    "SyntheticBenchmark",
    "logbar",
    "phase_schedule",
    "schedule_pulls",
    "max_budget_without_reallocation",
    "budgets_from_fractions",
    "successive_rejects",
    "synchronized_successive_rejects",
    "uniform_allocation",
    "ucb_e",
    "simulate",
    "best_arms",
    "error_indicator",
    "error_probability",
    "confidence_budget",
    "hardness_sr",
    "hardness_sysr",
    "error_bound",
    "synthetic_benchmark",
]

METHODS = ("sysr", "sr", "naive", "uniform", "ucbe", "smart_ucbe")


# ----------------------------------------------------------------------------------------------
# The phase schedule (exact rational arithmetic; static Python ints).
# ----------------------------------------------------------------------------------------------

def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _logbar_fraction(num_arms: int) -> fractions.Fraction:
    return fractions.Fraction(1, 2) + sum((fractions.Fraction(1, i) for i in range(2, num_arms + 1)),
                                          fractions.Fraction(0))


def logbar(num_arms: int) -> float:
    """``logbar(K) = 1/2 + sum_{i=2..K} 1/i``, the normaliser of the SR schedule.

    Args:
      num_arms: K >= 2.

    Returns:
      logbar(K) as a float (logbar(2) = 1).

    References:
      Audibert, Bubeck, Munos, "Best Arm Identification in Multi-Armed Bandits", COLT 2010.

    Examples:
      >>> logbar(2), round(logbar(3), 6)
      (1.0, 1.333333)
    """
    return float(_logbar_fraction(_check_int("num_arms", num_arms, 2)))


def _ceil(x: fractions.Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def phase_schedule(budget: int, num_arms: int, *, num_prompts: int | None = None,
                   reallocate: bool = False) -> tuple[int, ...]:
    """The cumulative per-arm sample sizes ``(n_1, ..., n_{K-1})`` shared by SR and SySRs.

    ``n_k = ceil((n - K) / (logbar(K) (K + 1 - k)))`` computed in exact rational arithmetic, then the
    cumulative maximum. The budget used, ``sum_k (n_k - n_{k-1}) (K + 1 - k) = sum_k n_k + n_{K-1}``
    (:func:`schedule_pulls`), never exceeds ``n``.

    Finite-pool reallocation (``reallocate=True``; an implementation extension of the official code,
    not part of the paper's Algorithm 1): if ``n_{K-1}`` exceeds the pool size N, the trailing phases
    that saturate are capped at N and the unsaturated phases are scaled by a common factor alpha >= 1
    so that the real-valued schedule spends exactly ``n - K`` (phase K-1 counted twice), repeating
    until no unsaturated phase exceeds N; then ceil (which adds fewer than K pulls), cap at N and
    cumulative max. With ``reallocate`` and ``n >= K N`` every phase is N (each arm sees the whole
    pool) even when the plain schedule would fit.

    Args:
      budget: total number of pulls n >= K.
      num_arms: K >= 2.
      num_prompts: pool size N; when given, a schedule needing more than N prompts per arm raises
        unless ``reallocate``.
      reallocate: cap and redistribute as above (requires ``num_prompts``).

    Returns:
      Tuple of K-1 non-decreasing ints.

    Raises:
      ValueError: on bad arguments, or when ``n_{K-1} > N`` without ``reallocate``.

    References:
      Audibert, Bubeck, Munos, COLT 2010; Lyu et al., arXiv:2606.07726.

    Examples:
      >>> phase_schedule(100, 4)
      (16, 21, 31)
      >>> schedule_pulls(phase_schedule(100, 4))
      99
    """
    num_arms = _check_int("num_arms", num_arms, 2)
    budget = _check_int("budget", budget, num_arms)
    if num_prompts is not None:
        num_prompts = _check_int("num_prompts", num_prompts, 1)
    if reallocate and num_prompts is None:
        raise ValueError("reallocate=True needs num_prompts (the pool size N), got None")
    k_arms, lb = num_arms, _logbar_fraction(num_arms)
    base = [fractions.Fraction(1, k_arms + 1 - k) for k in range(1, k_arms)]
    target = fractions.Fraction(budget - k_arms)
    sched = [_ceil(target / lb * b) for b in base]
    sched = list(np.maximum.accumulate(sched)) if sched else sched
    sched = [int(s) for s in sched]
    if reallocate and budget >= k_arms * num_prompts:  # every arm can see the whole pool
        return (num_prompts,) * (k_arms - 1)
    if num_prompts is None or sched[-1] <= num_prompts:
        return tuple(sched)
    if not reallocate:
        raise ValueError(
            f"budget={budget} needs n_{k_arms - 1}={sched[-1]} prompts per arm but num_prompts={num_prompts}; "
            f"the largest budget without reallocation is {max_budget_without_reallocation(k_arms, num_prompts)}"
            f" (or pass reallocate=True)")
    return _reallocated_schedule(target, k_arms, num_prompts, base)


def _reallocated_schedule(target: fractions.Fraction, k_arms: int, n_pool: int,
                          base: list[fractions.Fraction]) -> tuple[int, ...]:
    phases = k_arms - 1
    weight = [1] * (phases - 1) + [2]  # the last phase is paid by its two survivors
    if target + k_arms >= k_arms * n_pool:  # n >= K N: every arm can see the whole pool
        return (n_pool,) * phases
    real = None
    for saturated in range(1, phases):  # number of trailing phases capped at N
        free = phases - saturated
        alpha = ((target - n_pool * sum(weight[free:]))
                 / sum(w * b for w, b in zip(weight[:free], base[:free])))
        candidate = [alpha * b for b in base[:free]] + [fractions.Fraction(n_pool)] * saturated
        if candidate[free - 1] <= n_pool:
            real = candidate
            break
    if real is None:  # unreachable when target < K N (one free phase always fits); kept for safety
        real = [fractions.Fraction(n_pool)] * phases
    sched = np.maximum.accumulate([min(_ceil(max(x, fractions.Fraction(0))), n_pool) for x in real])
    return tuple(int(s) for s in sched)


def schedule_pulls(schedule: Sequence[int]) -> int:
    """Total pulls of a phase schedule: ``sum_k (n_k - n_{k-1}) (K + 1 - k) = sum_k n_k + n_{K-1}``.

    Args:
      schedule: the K-1 cumulative per-arm sample sizes.

    Returns:
      The number of (model, prompt) evaluations SR or SySRs makes with it.
    """
    schedule = [int(s) for s in schedule]
    if not schedule:
        raise ValueError("schedule must have K-1 >= 1 entries, got an empty sequence")
    return sum(schedule) + schedule[-1]


def max_budget_without_reallocation(num_arms: int, num_prompts: int) -> int:
    """Largest budget n whose plain SR schedule needs at most N prompts per arm (``n_{K-1} <= N``).

    ``ceil((n - K) / (2 logbar(K))) <= N`` iff ``n <= K + floor(2 logbar(K) N)``.

    Args:
      num_arms: K >= 2.
      num_prompts: pool size N >= 1.

    Returns:
      That budget (an int).
    """
    num_arms = _check_int("num_arms", num_arms, 2)
    num_prompts = _check_int("num_prompts", num_prompts, 1)
    x = 2 * _logbar_fraction(num_arms) * num_prompts
    return num_arms + x.numerator // x.denominator


def budgets_from_fractions(fractions_of_grid: Sequence[float], num_arms: int, num_prompts: int) -> tuple[int, ...]:
    """Budgets as fractions of the K x N grid, rounded down to multiples of K (at least K).

    Args:
      fractions_of_grid: fractions in (0, 1].
      num_arms: K.
      num_prompts: N.

    Returns:
      One budget per fraction (same order; duplicates kept so the grid stays aligned).
    """
    num_arms = _check_int("num_arms", num_arms, 2)
    num_prompts = _check_int("num_prompts", num_prompts, 1)
    out = []
    for f in fractions_of_grid:
        if not 0.0 < float(f) <= 1.0:
            raise ValueError(f"fractions_of_grid must lie in (0, 1], got {f}")
        raw = int(round(num_arms * num_prompts * float(f), 9))
        out.append(max(num_arms, raw // num_arms * num_arms))
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# One run of each algorithm (pure JAX; vmap over keys for many runs).
# ----------------------------------------------------------------------------------------------

class SRTrace(NamedTuple):
    """What one run of (Synchronized) Successive Rejects did, for each budget of the call.

    Attributes:
      selected: [b] int32, the returned arm.
      eliminated: [b, p] int32, the arm removed at the end of each phase.
      counts: [b, k] int32, prompts evaluated per arm (the first ``counts[a]`` entries of ``order[a]``).
      order: [k, n] int32, the prompt order of each arm (all rows equal for SySRs).
    """

    selected: jax.Array
    eliminated: jax.Array
    counts: jax.Array
    order: jax.Array


def _check_scores(scores) -> tuple[int, int]:
    if getattr(scores, "ndim", None) != 2:
        raise ValueError(f"scores must be a [k, n] array (models x prompts), got shape {getattr(scores, 'shape', None)}")
    k_arms, n_pool = scores.shape
    if k_arms < 2 or n_pool < 1:
        raise ValueError(f"scores needs at least 2 models and 1 prompt, got shape {scores.shape}")
    return k_arms, n_pool


def _run_randomness(key: jax.Array, k_arms: int, n_pool: int, shared: bool, num_priorities: int):
    """All of a run's randomness from ONE threefry call (each call site costs XLA compile time).

    Returns the prompt orders [k, n] (random permutations as the argsort of 32-bit random keys; a
    collision, probability <= n^2 / 2^33, only makes two prompts keep their index order) and
    ``num_priorities`` random int32 priorities in [0, 2^31) for tie-breaking.
    """
    rows = 1 if shared else k_arms
    bits = jax.random.bits(key, (rows * n_pool + num_priorities,), jnp.uint32)
    order = jnp.argsort(bits[:rows * n_pool].reshape(rows, n_pool), axis=1).astype(jnp.int32)
    order = jnp.broadcast_to(order, (k_arms, n_pool))
    return order, (bits[rows * n_pool:] >> 1).astype(jnp.int32)


def _prefix_sums(scores: jax.Array, order: jax.Array) -> jax.Array:
    revealed = jnp.take_along_axis(scores.astype(jnp.float32), order, axis=1)
    return jnp.concatenate([jnp.zeros((scores.shape[0], 1), jnp.float32), jnp.cumsum(revealed, axis=1)], axis=1)


def _random_argmax(priority: jax.Array, values: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """Argmax over the last axis, ties (among ``valid`` entries) broken by random int ``priority``."""
    if valid is not None:
        values = jnp.where(valid, values, -jnp.inf)
    is_max = values == jnp.max(values, axis=-1, keepdims=True)
    if valid is not None:
        is_max = is_max & valid
    return jnp.argmax(jnp.where(is_max, priority, -1), axis=-1).astype(jnp.int32)


def _hash_priority(seed: jax.Array, step, arms: jax.Array) -> jax.Array:
    """Cheap counter-based random priorities in [0, 2^31) for tie-breaking inside long scans.

    A murmur3 ``fmix32`` finaliser of (run seed, step, arm): uniform-looking, deterministic in the key,
    and about 2x cheaper per UCB-E step than drawing fresh threefry uniforms.
    """
    x = seed ^ (jnp.asarray(step).astype(jnp.uint32) * jnp.uint32(0x9E3779B1) + arms * jnp.uint32(0x632BE5AB))
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    x = x ^ (x >> 16)
    return (x >> 1).astype(jnp.int32)


def _eliminate(priority: jax.Array, prefix: jax.Array, schedule: jax.Array):
    k_arms = prefix.shape[0]
    sums = jnp.take(prefix, schedule, axis=1).T  # [p, k]: every survivor has n_k samples, compare sums

    def phase(active, xs):
        s, pri = xs
        loser = _random_argmax(pri, -s, active)
        return active.at[loser].set(False), loser

    active, losers = jax.lax.scan(phase, jnp.ones((k_arms,), bool), (sums, priority))
    selected = jnp.argmax(active).astype(jnp.int32)
    counts = jnp.zeros((k_arms,), jnp.int32).at[losers].set(schedule.astype(jnp.int32))
    counts = counts.at[selected].set(schedule[-1].astype(jnp.int32))
    return selected, losers.astype(jnp.int32), counts


def successive_rejects(key: jax.Array, scores: jax.Array, schedules, *, synchronized: bool = False) -> SRTrace:
    """One run of Successive Rejects (independent prompts per arm) or SySRs (``synchronized=True``).

    All budgets in ``schedules`` reuse this run's prompt order(s), so one call gives a run's answer at
    every budget (common random numbers across budgets); ties are broken uniformly at random.

    Args:
      key: PRNG key of the run.
      scores: [k, n] scores in [0, 1] of every model on every prompt of the pool.
      schedules: [b, p] or [p] int cumulative per-arm sample sizes from :func:`phase_schedule`
        (each <= n).
      synchronized: share one prompt order between all arms (SySRs) instead of one per arm (SR).

    Returns:
      :class:`SRTrace` (without the leading ``b`` axis when ``schedules`` is 1-D).

    References:
      Lyu et al., arXiv:2606.07726 (SySRs); Audibert, Bubeck, Munos, COLT 2010 (SR).
    """
    k_arms, n_pool = _check_scores(scores)
    schedules = jnp.asarray(schedules, jnp.int32)
    squeeze = schedules.ndim == 1
    if squeeze:
        schedules = schedules[None]
    if schedules.ndim != 2 or schedules.shape[1] != k_arms - 1:
        raise ValueError(f"schedules must be [b, {k_arms - 1}] (K-1 phases for K={k_arms} arms), "
                         f"got shape {schedules.shape}")
    if not isinstance(schedules, jax.core.Tracer):
        top = int(np.max(np.asarray(schedules)))
        if top > n_pool or int(np.min(np.asarray(schedules))) < 0:
            raise ValueError(f"schedules entries must lie in [0, num_prompts={n_pool}], got max {top}")
    num_b = schedules.shape[0]
    order, priority = _run_randomness(key, k_arms, n_pool, synchronized, num_b * (k_arms - 1) * k_arms)
    prefix = _prefix_sums(scores, order)
    priority = priority.reshape(num_b, k_arms - 1, k_arms)
    selected, eliminated, counts = jax.vmap(_eliminate, in_axes=(0, None, 0))(priority, prefix, schedules)
    if squeeze:
        selected, eliminated, counts = selected[0], eliminated[0], counts[0]
    return SRTrace(selected=selected, eliminated=eliminated, counts=counts, order=order)


def synchronized_successive_rejects(key: jax.Array, scores: jax.Array, schedules) -> SRTrace:
    """One run of SySRs: SR's schedule, every survivor evaluated on the same prompts in the same order.

    Args:
      key: PRNG key of the run.
      scores: [k, n] scores in [0, 1].
      schedules: [b, p] or [p] phase schedules (see :func:`phase_schedule`).

    Returns:
      :class:`SRTrace`; all rows of ``order`` are the run's one shared prompt permutation.

    References:
      Lyu, Nejma, Wegel, Yang, Dorner, "Cutting LLM Evaluation Costs with SySRs", arXiv:2606.07726.

    Examples:
      >>> scores = jnp.array([[1., 1., 0., 1.], [1., 0., 0., 1.], [0., 0., 0., 1.]])
      >>> sched = phase_schedule(12, 3, num_prompts=4)
      >>> sched, int(synchronized_successive_rejects(jax.random.key(0), scores, sched).selected)
      ((3, 4), 0)
    """
    return successive_rejects(key, scores, schedules, synchronized=True)


def uniform_allocation(key: jax.Array, scores: jax.Array, per_arm, *, shared: bool) -> jax.Array:
    """Uniform baselines: every arm gets ``per_arm = n // K`` prompts; return the best empirical mean.

    ``shared=True`` is the naive baseline ("smart uniform": the same prompts for every arm),
    ``shared=False`` draws each arm's prompts independently (without replacement).

    Args:
      key: PRNG key of the run.
      scores: [k, n] scores in [0, 1].
      per_arm: [b] or scalar int prompts per arm (each <= n).
      shared: one prompt order for all arms instead of one per arm.

    Returns:
      [b] int32 selected arms (a scalar when ``per_arm`` is a scalar).

    References:
      Lyu et al., arXiv:2606.07726 (baselines "Naive" and "Uniform-Pulls").
    """
    k_arms, n_pool = _check_scores(scores)
    per_arm = jnp.asarray(per_arm, jnp.int32)
    squeeze = per_arm.ndim == 0
    per_arm = jnp.atleast_1d(per_arm)
    if per_arm.ndim != 1:
        raise ValueError(f"per_arm must be a scalar or [b], got shape {per_arm.shape}")
    order, priority = _run_randomness(key, k_arms, n_pool, shared, per_arm.shape[0] * k_arms)
    sums = jnp.take(_prefix_sums(scores, order), per_arm, axis=1).T  # [b, k]
    selected = _random_argmax(priority.reshape(sums.shape), sums)
    return selected[0] if squeeze else selected


def ucb_e(key: jax.Array, scores: jax.Array, checkpoints: Sequence[int], *, exploration: float,
          shared: bool = False) -> jax.Array:
    """UCB-E with a fixed exploration constant, answering at several budgets of one run.

    Each arm is pulled once, then each pull goes to ``argmax_a mean_a + sqrt(exploration / count_a)``
    (ties at random) among arms with prompts left. Arm a's j-th pull is prompt ``order[a, j]``: one
    random order per arm (UCB-E) or one shared order (``shared=True``, "Smart-UCB-E": every arm walks
    the same prompt sequence, so arms with equal counts have seen the same prompts). The answer at a
    checkpoint budget is the best empirical mean after that many pulls (ties at random). Ties of the
    index inside the loop are broken by a counter-based hash of (run key, step, arm), a cheap stand-in
    for fresh uniforms at every pull.

    Args:
      key: PRNG key of the run.
      scores: [k, n] scores in [0, 1].
      checkpoints: static, strictly increasing budgets, each in [K, K N].
      exploration: the constant ``a`` > 0 (the official protocol uses 0.1, 1, 10, 100).
      shared: shared prompt order (Smart-UCB-E).

    Returns:
      [c] int32 selected arm at each checkpoint.

    References:
      Audibert, Bubeck, Munos, COLT 2010 (UCB-E); Lyu et al., arXiv:2606.07726 (Smart-UCB-E).
    """
    k_arms, n_pool = _check_scores(scores)
    checkpoints = tuple(int(c) for c in checkpoints)
    if not checkpoints or any(b <= a for a, b in zip(checkpoints, checkpoints[1:])):
        raise ValueError(f"checkpoints must be a non-empty strictly increasing sequence, got {checkpoints}")
    if checkpoints[0] < k_arms or checkpoints[-1] > k_arms * n_pool:
        raise ValueError(f"checkpoints must lie in [K={k_arms}, K*N={k_arms * n_pool}], got {checkpoints}")
    if not float(exploration) > 0.0:
        raise ValueError(f"exploration must be > 0, got {exploration}")
    order, priority = _run_randomness(key, k_arms, n_pool, shared, 1 + len(checkpoints) * k_arms)
    seed, answer_priority = priority[0].astype(jnp.uint32), priority[1:].reshape(len(checkpoints), k_arms)
    revealed = jnp.take_along_axis(scores.astype(jnp.float32), order, axis=1)  # [k, n]
    sums, counts = revealed[:, 0], jnp.ones((k_arms,), jnp.int32)
    arms = jnp.arange(k_arms, dtype=jnp.uint32)

    def pull(t, state):
        s, c = state
        cf = c.astype(jnp.float32)
        index = jnp.where(c < n_pool, s / cf + jnp.sqrt(exploration / cf), -jnp.inf)
        tied = index == jnp.max(index)
        arm = jnp.argmax(jnp.where(tied, _hash_priority(seed, t, arms), -1))
        value = revealed[arm, jnp.minimum(c[arm], n_pool - 1)]
        hit = arms == arm
        return s + jnp.where(hit, value, 0.0), c + hit.astype(jnp.int32)

    out, state, t = [], (sums, counts), k_arms
    for i, budget in enumerate(checkpoints):
        state = jax.lax.fori_loop(t, budget, pull, state)
        t = budget
        s, c = state
        out.append(_random_argmax(answer_priority[i], s / c.astype(jnp.float32)))
    return jnp.stack(out)


# ----------------------------------------------------------------------------------------------
# Many runs, many budgets.
# ----------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("synchronized",))
def _sr_runs(keys, scores, schedules, *, synchronized):
    return jax.vmap(lambda k: successive_rejects(k, scores, schedules, synchronized=synchronized).selected)(keys)


@functools.partial(jax.jit, static_argnames=("shared",))
def _uniform_runs(keys, scores, per_arm, *, shared):
    return jax.vmap(lambda k: uniform_allocation(k, scores, per_arm, shared=shared))(keys)


@functools.partial(jax.jit, static_argnames=("checkpoints", "exploration", "shared"))
def _ucb_runs(keys, scores, *, checkpoints, exploration, shared):
    return jax.vmap(lambda k: ucb_e(k, scores, checkpoints, exploration=exploration, shared=shared))(keys)


def simulate(method: str, key: jax.Array, scores, budgets: Sequence[int], *, num_runs: int,
             reallocate: bool = True, exploration: float = 1.0, run_batch_size: int | None = None) -> np.ndarray:
    """Runs ``method`` ``num_runs`` times (independent keys) at every budget; returns the selected arms.

    Args:
      method: one of :data:`METHODS`: ``"sysr"``, ``"sr"``, ``"naive"`` (shared-prompt uniform),
        ``"uniform"`` (independent uniform), ``"ucbe"``, ``"smart_ucbe"``.
      key: PRNG key; run r uses ``jax.random.split(key, num_runs)[r]``.
      scores: [k, n] scores in [0, 1].
      budgets: budgets (pulls) >= K; UCB-E needs them strictly increasing, uniform ones use n // K.
      num_runs: number of runs r.
      reallocate: finite-pool reallocation for SR/SySRs (the official code's behaviour, an extension
        of the paper's Algorithm 1); without it budgets with ``n_{K-1} > N`` raise.
      exploration: UCB-E constant ``a``.
      run_batch_size: runs vectorised per compiled call (memory knob); default all.

    Returns:
      [b, r] int selected arms.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    num_runs = _check_int("num_runs", num_runs, 1)
    scores_np = np.asarray(scores, np.float32)
    k_arms, n_pool = _check_scores(scores_np)
    if not (np.all(np.isfinite(scores_np)) and scores_np.min() >= 0.0 and scores_np.max() <= 1.0):
        raise ValueError(f"scores must lie in [0, 1], got range [{scores_np.min()}, {scores_np.max()}]")
    budgets = tuple(_check_int("budgets entry", int(b), k_arms) for b in budgets)
    if not budgets:
        raise ValueError("budgets must be non-empty")
    if max(budgets) > k_arms * n_pool and method in ("naive", "uniform", "ucbe", "smart_ucbe"):
        raise ValueError(f"budgets must be <= K*N={k_arms * n_pool} for {method!r}, got {max(budgets)}")
    scores_j = jnp.asarray(scores_np)
    if method in ("sysr", "sr"):
        schedules = np.array([phase_schedule(b, k_arms, num_prompts=n_pool, reallocate=reallocate)
                              for b in budgets], np.int32)
        fn = functools.partial(_sr_runs, scores=scores_j, schedules=jnp.asarray(schedules),
                               synchronized=method == "sysr")
    elif method in ("naive", "uniform"):
        per_arm = jnp.asarray([b // k_arms for b in budgets], jnp.int32)
        fn = functools.partial(_uniform_runs, scores=scores_j, per_arm=per_arm, shared=method == "naive")
    else:
        uniq = tuple(sorted(set(budgets)))
        fn = functools.partial(_ucb_runs, scores=scores_j, checkpoints=uniq, exploration=float(exploration),
                               shared=method == "smart_ucbe")
    keys = jax.random.split(key, num_runs)
    batch = num_runs if run_batch_size is None else _check_int("run_batch_size", run_batch_size, 1)
    chunks = []
    for start in range(0, num_runs, batch):
        chunk = keys[start:start + batch]
        valid = chunk.shape[0]
        if valid < batch:  # pad to one compiled shape
            chunk = jnp.concatenate([chunk, jnp.broadcast_to(chunk[:1], (batch - valid,) + chunk.shape[1:])])
        chunks.append(np.asarray(fn(chunk))[:valid])
    selected = np.concatenate(chunks, axis=0)  # [r, b'] in the method's budget order
    if method in ("ucbe", "smart_ucbe"):
        position = {b: i for i, b in enumerate(uniq)}
        selected = selected[:, [position[b] for b in budgets]]
    return selected.T


def best_arms(scores) -> np.ndarray:
    """Boolean [k] mask of the arms with the highest pool mean (float64)."""
    means = np.asarray(scores, np.float64).mean(axis=1)
    return means >= means.max() - 1e-12


def error_indicator(selected, scores) -> np.ndarray:
    """1.0 where a selected arm is not a best arm (same shape as ``selected``)."""
    return (~best_arms(scores)[np.asarray(selected)]).astype(np.float64)


def error_probability(selected, scores) -> np.ndarray:
    """Fraction of runs (last axis of ``selected``) that did not return a best arm."""
    return error_indicator(selected, scores).mean(axis=-1)


def confidence_budget(budget_fractions: Sequence[float], accuracy: Sequence[float], tau: float) -> float:
    """The confidence budget CB(tau): the smallest budget from which accuracy stays >= tau.

    Args:
      budget_fractions: increasing budgets (e.g. fractions of the K x N grid).
      accuracy: best-arm accuracy (1 - error) at each budget.
      tau: the target accuracy in [0, 1].

    Returns:
      The first budget b_i with ``accuracy[j] >= tau`` for every j >= i; ``inf`` if never.

    References:
      Lyu et al., arXiv:2606.07726 (the "confidence budget" metric).
    """
    fr, acc = np.asarray(budget_fractions, np.float64), np.asarray(accuracy, np.float64)
    if fr.shape != acc.shape or fr.ndim != 1:
        raise ValueError(f"budget_fractions and accuracy must be 1-D of equal length, got {fr.shape}, {acc.shape}")
    if np.any(np.diff(fr) <= 0):
        raise ValueError("budget_fractions must be strictly increasing")
    ok = acc >= tau - 1e-12
    tail_ok = np.flip(np.cumprod(np.flip(ok)).astype(bool))
    return float(fr[np.argmax(tail_ok)]) if tail_ok.any() else math.inf


# ----------------------------------------------------------------------------------------------
# Hardness terms and bounds (float64 numpy plug-ins on the pool).
# ----------------------------------------------------------------------------------------------

def _ranked_max(per_arm_terms: np.ndarray) -> float:
    """``max_i i h_(i)`` with h sorted decreasingly over the suboptimal arms, ranks starting at 2."""
    h = np.sort(per_arm_terms)[::-1]
    return float(np.max(np.arange(2, h.size + 2) * h))


def _gaps(scores):
    y = np.asarray(scores, np.float64)
    _check_scores(y)
    means = y.mean(axis=1)
    best = int(np.argmax(means))
    others = np.array([a for a in range(y.shape[0]) if a != best])
    return y, best, others, means[best] - means[others]


def hardness_sr(scores) -> float:
    """SR's ``H_2 = max_{i>=2} i / Delta_(i)^2`` on the pool (gaps sorted increasingly); inf on a tie.

    References:
      Audibert, Bubeck, Munos, COLT 2010.
    """
    _, _, _, gaps = _gaps(scores)
    if np.any(gaps <= 1e-12):
        return math.inf
    return _ranked_max(1.0 / gaps ** 2)


def hardness_sysr(scores) -> float:
    """SySRs' paired Bernstein hardness on the pool; inf on a tie.

    ``H = max_{i>=2} i h_(i)`` with ``h_i = [2 Var(Y_best - Y_i) + (2/3)(1 + Delta_i) Delta_i] / Delta_i^2``
    (population variance over the pool), ranked by decreasing ``h_i``. Small when models disagree on
    few prompts; for identical-but-independent models ``Var`` is about twice an arm's variance.
    (The constants are reconstructed from the paper's Theorem 5.1; see the spec.)

    References:
      Lyu et al., arXiv:2606.07726 (Sec. 5).
    """
    y, best, others, gaps = _gaps(scores)
    if np.any(gaps <= 1e-12):
        return math.inf
    var = np.var(y[best][None, :] - y[others], axis=1)
    return _ranked_max((2.0 * var + (2.0 / 3.0) * (1.0 + gaps) * gaps) / gaps ** 2)


def error_bound(budget, num_arms: int, hardness: float):
    """``K (K - 1) / 2 exp(-(n - K) / (logbar(K) H))`` (float or array over budgets)."""
    n = np.asarray(budget, np.float64)
    return num_arms * (num_arms - 1) / 2.0 * np.exp(-(n - num_arms) / (logbar(num_arms) * hardness))


# ----------------------------------------------------------------------------------------------
# Synthetic benchmark.
# ----------------------------------------------------------------------------------------------

class SyntheticBenchmark(NamedTuple):
    """A generated model x prompt score matrix.

    Attributes:
      scores: [k, n] float32 binary scores.
      abilities: [k] latent abilities (probit of each model's expected accuracy).
      difficulties: [n] latent prompt difficulties.
    """

    scores: jax.Array
    abilities: jax.Array
    difficulties: jax.Array


@functools.partial(jax.jit, static_argnames=("acc", "num_prompts", "exact_pool_means"))
def _synthetic_scores(key, w_prompt, w_noise, *, acc, num_prompts, exact_pool_means):
    k_b, k_e = jax.random.split(key)
    theta = ndtri(jnp.asarray(acc, jnp.float32))
    b = jax.random.normal(k_b, (num_prompts,), jnp.float32)
    eps = jax.random.normal(k_e, (len(acc), num_prompts), jnp.float32)
    latent = w_prompt * b[None, :] + w_noise * eps
    if exact_pool_means:
        solved = jnp.asarray(np.round(np.asarray(acc) * num_prompts).astype(np.int32))
        rank = jnp.argsort(jnp.argsort(latent, axis=1), axis=1)
        scores = (rank < solved[:, None]).astype(jnp.float32)
    else:
        scores = (theta[:, None] > latent).astype(jnp.float32)
    return scores, theta, b


def synthetic_benchmark(key: jax.Array, *, num_models: int, num_prompts: int, noise_scale: float,
                        best_accuracy: float = 0.75, worst_accuracy: float = 0.45,
                        exact_pool_means: bool = True) -> SyntheticBenchmark:
    """Binary scores from latent prompt difficulty and model ability; ``noise_scale`` sets similarity.

    Model a has target accuracy ``acc_a`` evenly spaced from ``best_accuracy`` (model 0) to
    ``worst_accuracy`` and ability ``theta_a = Phi^{-1}(acc_a)``; prompt j has difficulty
    ``b_j ~ N(0, 1)``; model a's latent on prompt j is ``u_aj = (b_j + s eps_aj) / sqrt(1 + s^2)`` with
    ``eps_aj ~ N(0, 1)`` independent, so two models' latents have correlation ``1 / (1 + s^2)``:
    ``s = 0`` makes the models nested (a stronger model solves every prompt a weaker one solves),
    ``s = inf`` makes them independent (no prompt effect).

    * ``exact_pool_means=False``: model a solves prompt j iff ``u_aj < theta_a`` (expected accuracy
      ``acc_a`` at every s; realised pool means scatter around it).
    * ``exact_pool_means=True`` (default): model a solves exactly ``round(acc_a N)`` prompts, those with
      its lowest latents, so the pool means, hence the gaps and SR's difficulty (SR only sees each
      model's own pool), are the same at every s and only the similarity changes.

    Args:
      key: PRNG key.
      num_models: K >= 2.
      num_prompts: N >= 1.
      noise_scale: s in [0, inf].
      best_accuracy: accuracy of model 0, in (0, 1).
      worst_accuracy: accuracy of model K-1, in (0, 1).
      exact_pool_means: fix each model's number of solved prompts (see above).

    Returns:
      :class:`SyntheticBenchmark`. The best arm is the one with the highest realised pool mean.

    References:
      Lyu et al., arXiv:2606.07726 (the reproduction plan of the spec, Sec. 4(d)).
    """
    num_models = _check_int("num_models", num_models, 2)
    num_prompts = _check_int("num_prompts", num_prompts, 1)
    s = float(noise_scale)
    if not s >= 0.0:
        raise ValueError(f"noise_scale must be in [0, inf], got {noise_scale}")
    for name, v in (("best_accuracy", best_accuracy), ("worst_accuracy", worst_accuracy)):
        if not 0.0 < float(v) < 1.0:
            raise ValueError(f"{name} must lie in (0, 1), got {v}")
    w_prompt, w_noise = (0.0, 1.0) if math.isinf(s) else (1.0 / math.sqrt(1.0 + s * s), s / math.sqrt(1.0 + s * s))
    acc = tuple(float(a) for a in np.linspace(float(best_accuracy), float(worst_accuracy), num_models))
    scores, theta, b = _synthetic_scores(key, jnp.float32(w_prompt), jnp.float32(w_noise), acc=acc,
                                         num_prompts=num_prompts, exact_pool_means=bool(exact_pool_means))
    return SyntheticBenchmark(scores=scores, abilities=theta, difficulties=b)
