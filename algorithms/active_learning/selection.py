"""Pool-based batch active-learning selection rules: DIRECT, margin, entropy, coreset (k-center greedy), random.

Every rule takes the pool state as arrays (class probabilities of the current small model on the whole pool,
a boolean ``labeled`` mask, features) and returns the indices to annotate next: exactly ``budget`` distinct
indices that were unlabeled (all remaining ones when fewer are left). Ties are broken uniformly at random
with the ``rng`` passed in, so a rule whose scores are all equal selects a uniformly random subset.

  Scores:      `margin_scores`, `entropy_scores`.
  Rules:       `random_select`, `top_score_select`, `margin_select`, `entropy_select`, `k_center_greedy`,
               `direct_select` (-> `DirectResult`).
  DIRECT math: `threshold_accuracy` (cumsum form of the 1-D threshold "accuracy"), `best_threshold`,
               `uncertainty_interval`, `version_space_reduction`, `query_around_threshold`,
               `largest_remainder` (integer allocation).

DIRECT follows the reference implementation (LabelBench ``strategy_impl/direct.py``) as transcribed in the spec:
per class k the pool is ordered by the margin ``P[:, k] - max_j P[:, j]`` (class-k-like first); labeled items get
``w = +1`` (label k) / ``-1`` (other label), unlabeled ``0``; phase 1 (half the budget, rarest classes first)
samples annotator batches of size ``parallel_annotators`` (B1) uniformly from the uncertainty interval [I, J] and
shrinks it towards the best 1-D threshold, which tolerates label noise (agnostic 1-D active learning); phase 2
spends the rest by labeling alternately left and right of each class's best threshold. Labels are obtained
from ``oracle(indices)`` during phase 1 (they steer the interval) and in phase 2 only recorded.

Dimension legend: ``n`` pool items, ``K`` classes, ``d`` feature width.

Spec: /work/shared/papers/specs/vision_weights_envs.md section 6(b) (DIRECT, read from LabelBench) and 6(e).

Deviations / INFERRED parts:
  * the tiny tie-break term of the margin is ``1e-8 max_j P[i, j]`` for every K (LabelBench uses ``P[i, 0]`` when
    K = 2, which orders the confident items of class 1 by increasing confidence);
  * sort ties are broken by a random key (LabelBench relies on numpy's unstable argsort order);
  * phase 2 carries a class's unspent budget to the next class (LabelBench loses it, which only happens when
    the whole pool is labeled, so the selection is the same);
  * ``class_rank`` and ``class_weights`` (phase-1 order and phase-2 split) are hooks for the FM priors of
    `algorithms.active_learning.fm_priors`; left at None they are LabelBench's (labeled frequency, even split).

References:
  Nuggehalli, Zhang, Jain, Nowak, "DIRECT: Deep Active Learning under Imbalance and Label Noise",
  arXiv:2312.09196 (ICML 2025).
  Sener & Savarese, "Active Learning for Convolutional Neural Networks: A Core-Set Approach", arXiv:1708.00489.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import numpy as np

__all__ = [
    "margin_scores", "entropy_scores", "random_select", "top_score_select", "margin_select", "entropy_select",
    "k_center_greedy", "threshold_accuracy", "best_threshold", "uncertainty_interval", "version_space_reduction",
    "query_around_threshold", "largest_remainder", "direct_select", "DirectResult", "BASELINES",
]


# ------------------------------------------------------------------------------------------------ validation
def _check_probs(name: str, probs, n: int | None = None) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"{name} must have shape (n, K) with K >= 2 classes, got shape {p.shape}")
    if n is not None and p.shape[0] != n:
        raise ValueError(f"{name} must have {n} rows (one per pool item), got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{name} must hold finite non-negative probabilities, got min {np.nanmin(p):.3g} "
                         f"and {int(np.sum(~np.isfinite(p)))} non-finite entries")
    return p


def _check_labeled(labeled, n: int | None = None) -> np.ndarray:
    m = np.asarray(labeled)
    if m.dtype != np.bool_ or m.ndim != 1:
        raise ValueError(f"labeled must be a 1-D boolean mask over the pool, got dtype {m.dtype} and shape {m.shape}")
    if n is not None and m.shape[0] != n:
        raise ValueError(f"labeled must have length {n} (the pool size), got {m.shape[0]}")
    return m


def _check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ValueError(f"budget must be a non-negative integer, got {budget!r}")
    return int(budget)


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


# ------------------------------------------------------------------------------------------------ scores
def margin_scores(probs) -> np.ndarray:
    """Uncertainty by margin: ``-(p_(1) - p_(2))`` per row (higher = more uncertain), shape (n,)."""
    p = _check_probs("probs", probs)
    top2 = -np.sort(-p, axis=1)[:, :2]
    return -(top2[:, 0] - top2[:, 1])


def entropy_scores(probs) -> np.ndarray:
    """Predictive entropy ``-sum_k p_k log p_k`` per row (nats; 0 log 0 = 0), shape (n,)."""
    p = _check_probs("probs", probs)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * np.log(p), 0.0)
    return -t.sum(axis=1)


# ------------------------------------------------------------------------------------------------ simple rules
def random_select(labeled, budget: int, *, rng: np.random.Generator) -> np.ndarray:
    """``budget`` unlabeled indices uniformly without replacement (all of them if fewer remain)."""
    m = _check_labeled(labeled)
    b = _check_budget(budget)
    rng = _check_rng(rng)
    cand = np.flatnonzero(~m)
    return rng.permutation(cand)[: min(b, cand.size)]


def top_score_select(scores, labeled, budget: int, *, rng: np.random.Generator) -> np.ndarray:
    """The ``budget`` unlabeled indices of highest score, ties broken uniformly at random.

    Args:
      scores: (n,) finite scores, higher is picked first.
      labeled: (n,) bool mask of already labeled items (never picked).
      budget: how many to pick; fewer when fewer are unlabeled.
      rng: numpy Generator for the tie-break.

    Returns:
      int array of picked indices, best first.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or not np.all(np.isfinite(s)):
        raise ValueError(f"scores must be a finite 1-D array, got shape {s.shape}")
    m = _check_labeled(labeled, s.shape[0])
    b = _check_budget(budget)
    rng = _check_rng(rng)
    cand = np.flatnonzero(~m)
    order = np.lexsort((rng.random(cand.size), -s[cand]))  # last key is primary
    return cand[order[: min(b, cand.size)]]


def margin_select(probs, labeled, budget: int, *, rng: np.random.Generator) -> np.ndarray:
    """Smallest-margin sampling (`top_score_select` of `margin_scores`)."""
    return top_score_select(margin_scores(probs), labeled, budget, rng=rng)


def entropy_select(probs, labeled, budget: int, *, rng: np.random.Generator) -> np.ndarray:
    """Maximum-entropy sampling (`top_score_select` of `entropy_scores`)."""
    return top_score_select(entropy_scores(probs), labeled, budget, rng=rng)


def k_center_greedy(features, labeled, budget: int, *, rng: np.random.Generator) -> np.ndarray:
    """Coreset selection by k-center greedy (Sener & Savarese 2018; Gonzalez' 2-approximation).

    Repeatedly picks the unlabeled point farthest (Euclidean) from the current centers (labeled points and
    points picked so far); with no labeled point the first center is uniform. Ties are broken uniformly.

    Args:
      features: (n, d) finite embeddings.
      labeled: (n,) bool mask; labeled points are the initial centers and are never picked.
      budget: how many centers to add.
      rng: numpy Generator.

    Returns:
      int array of picked indices in pick order.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"features must be a finite (n, d) array, got shape {x.shape}")
    m = _check_labeled(labeled, x.shape[0]).copy()
    b = min(_check_budget(budget), int((~m).sum()))
    rng = _check_rng(rng)
    sq = np.sum(x * x, axis=1)

    def dist_to(i):
        return np.sqrt(np.maximum(sq + sq[i] - 2.0 * x @ x[i], 0.0))

    mind = np.full(x.shape[0], np.inf)
    for i in np.flatnonzero(m):
        mind = np.minimum(mind, dist_to(i))
    picks = []
    for _ in range(b):
        cand = np.flatnonzero(~m)
        d = mind[cand]
        best = d.max()
        tied = cand[d >= best - 1e-12 * max(1.0, abs(best)) if np.isfinite(best) else d == best]
        i = int(tied[rng.integers(tied.size)])
        picks.append(i)
        m[i] = True
        mind = np.minimum(mind, dist_to(i))
    return np.asarray(picks, dtype=np.int64)


# ------------------------------------------------------------------------------------------------ DIRECT
def threshold_accuracy(w) -> np.ndarray:
    """1-D threshold "accuracy" of every cut: ``acc[j] = sum_{i<j} w_i - sum_{i>=j} w_i``, shape (n + 1,).

    ``w`` holds +1 (labeled, class k), -1 (labeled, other class) and 0 (unlabeled) along the class-k line;
    cutting at j predicts class k for the first j items. Computed with two cumulative sums (LabelBench).

    Examples:
        >>> threshold_accuracy([1, 1, -1, 1, -1, -1]).tolist()
        [0.0, 2.0, 4.0, 2.0, 4.0, 2.0, 0.0]
        >>> best_threshold([1, 1, -1, 1, -1, -1])
        2
    """
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"w must be 1-D, got shape {w.shape}")
    c = np.concatenate([[0.0], np.cumsum(w)])
    r = np.concatenate([[0.0], np.cumsum(w[::-1])])[::-1]
    return c - r


def best_threshold(w) -> int:
    """The cut maximizing `threshold_accuracy` (the first one on ties), in [0, n]."""
    return int(np.argmax(threshold_accuracy(w)))


def uncertainty_interval(w) -> tuple[int, int]:
    """DIRECT's initial uncertainty interval [I, J] on a class line (positions, inclusive).

    I is the last +1 met before the first -1 scanning from the top (0 if none); J is the last -1 met before the
    first +1 scanning from the bottom (n - 1 if none).
    """
    w = np.asarray(w)
    n = w.shape[0]
    i_pos = 0
    for idx in range(n):
        if w[idx] == 0:
            continue
        if w[idx] < 0:
            break
        i_pos = idx
    j_rev = 0
    for idx in range(n):
        v = w[n - 1 - idx]
        if v == 0:
            continue
        if v > 0:
            break
        j_rev = idx
    return i_pos, n - j_rev - 1


def version_space_reduction(w, is_labeled, lo: int, hi: int, *, batch: int, budget: int,
                            label_fn: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator,
                            trace: list | None = None) -> list[int]:
    """DIRECT phase 1 on one class line: agnostic 1-D active learning in parallel batches.

    Repeats until ``budget`` is spent or the interval holds no unlabeled item: sample min(batch, budget) unlabeled
    positions uniformly from [lo, hi]; label them with ``label_fn(positions) -> +1/-1``; then move inward the
    endpoint whose cut has the lower `threshold_accuracy` (coin flip on ties) until the interval holds at most
    ``ceil(diam / diam ** (1 / (budget // batch)))`` unlabeled items (no shrink when budget // batch <= 1).

    Args:
      w: (n,) float line weights, updated in place.
      is_labeled: (n,) bool along the line, updated in place.
      lo, hi: the interval (inclusive positions).
      batch: B1, the number of parallel annotators.
      budget: B2, labels to spend on this line.
      label_fn: positions -> their w values (+1 / -1), querying the annotator.
      rng: numpy Generator.
      trace: if a list, (lo, hi) after each batch is appended (for tests).

    Returns:
      the queried positions, in order.
    """
    queried: list[int] = []
    while budget > 0:
        b = min(batch, budget)
        cand = np.arange(lo, hi + 1)
        cand = cand[~is_labeled[cand]]
        if cand.size == 0:
            break
        pos = rng.choice(cand, size=min(b, cand.size), replace=False)
        w[pos] = label_fn(pos)
        is_labeled[pos] = True
        queried += [int(p) for p in pos]
        diam = int(np.sum(~is_labeled[lo:hi + 1]))
        if diam > 0:
            base = budget // batch
            c2 = 1.0 if base <= 1 else diam ** (1.0 / base)
            target = math.ceil(diam / c2)
            acc = threshold_accuracy(w)  # w does not change while shrinking
            while diam > target:
                if acc[lo] < acc[hi] or (acc[lo] == acc[hi] and rng.integers(2) == 0):
                    diam -= int(not is_labeled[lo])
                    lo += 1
                else:
                    diam -= int(not is_labeled[hi])
                    hi -= 1
        if trace is not None:
            trace.append((lo, hi))
        budget -= b
    return queried


def query_around_threshold(is_labeled, cut: int, count: int) -> np.ndarray:
    """DIRECT phase 2 on one class line: unlabeled positions alternately left and right of a cut.

    Starting with ``left = cut - 1`` and ``right = cut``, steps alternate left, right, left, ...; a step over a
    labeled position spends nothing; stops after ``count`` picks or when both ends are passed. ``is_labeled`` (the
    line's bool mask) is updated in place.

    Returns:
      int array of picked positions in pick order.
    """
    lab = is_labeled
    n = lab.shape[0]
    if not 0 <= cut <= n:
        raise ValueError(f"cut must lie in [0, {n}], got {cut}")
    left, right, take_left, picks = cut - 1, cut, True, []
    while len(picks) < count and (left >= 0 or right < n):
        if take_left and left >= 0:
            if not lab[left]:
                picks.append(left)
                lab[left] = True
            left -= 1
        elif not take_left and right < n:
            if not lab[right]:
                picks.append(right)
                lab[right] = True
            right += 1
        take_left = not take_left
    return np.asarray(picks, dtype=np.int64)


def largest_remainder(budget: int, weights) -> np.ndarray:
    """Integer split of ``budget`` proportional to ``weights`` (Hamilton's largest-remainder method).

    Sums to ``budget`` exactly; monotone (a larger weight never gets fewer units; ties go to the lower index).
    """
    b = _check_budget(budget)
    wt = np.asarray(weights, dtype=np.float64)
    if wt.ndim != 1 or wt.size == 0 or not np.all(np.isfinite(wt)) or np.any(wt < 0) or wt.sum() <= 0:
        raise ValueError(f"weights must be a non-empty 1-D array of finite non-negative values with a positive "
                         f"sum, got {wt}")
    share = b * wt / wt.sum()
    base = np.floor(share + 1e-12).astype(np.int64)
    rest = b - int(base.sum())
    if rest > 0:
        order = np.lexsort((np.arange(wt.size), -wt, -np.round(share - base, 12)))
        base[order[:rest]] += 1
    return base


class DirectResult(NamedTuple):
    """What `direct_select` returns: the picked pool ``indices`` (query order) and how many of them phase 1
    (version-space reduction) spent."""

    indices: np.ndarray
    phase1: int


def direct_select(probs, labels, labeled, budget: int, *, oracle: Callable[[np.ndarray], np.ndarray],
                  rng: np.random.Generator, parallel_annotators: int = 5, min_budget_per_class: int = 3,
                  class_rank: Sequence[int] | None = None, class_weights=None) -> DirectResult:
    """DIRECT batch selection (Nuggehalli et al.; LabelBench reference implementation).

    Args:
      probs: (n, K) small-model class probabilities on the whole pool.
      labels: (n,) int labels; read only where ``labeled`` (the annotations so far, possibly noisy).
      labeled: (n,) bool mask of labeled items; needs at least one.
      budget: labels to acquire this round.
      oracle: pool indices (int array) -> their annotated labels (called during phase 1).
      rng: numpy Generator (phase-1 sampling, coin flips, class order, sort tie-breaks).
      parallel_annotators: B1, the batch size of phase 1.
      min_budget_per_class: phase-1 labels per class when the budget is large (LabelBench's
        ``min_budget_per_class``).
      class_rank: classes from most to least frequent; phase 1 visits its last ``eff_class`` entries. None:
        by labeled frequency (LabelBench).
      class_weights: (K,) non-negative phase-2 weights; the remaining budget is split by `largest_remainder`.
        None or all equal: LabelBench's even split over a random class order.

    Returns:
      `DirectResult` with exactly ``budget`` distinct previously unlabeled indices (all if fewer remain).
    """
    p = _check_probs("probs", probs)
    n, K = p.shape
    m = _check_labeled(labeled, n).copy()
    y = np.asarray(labels)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be an integer array of shape ({n},), got dtype {y.dtype} shape {y.shape}")
    y = y.astype(np.int64).copy()
    if m.any() and (y[m].min() < 0 or y[m].max() >= K):
        raise ValueError(f"labels of labeled items must lie in [0, {K}), got range [{y[m].min()}, {y[m].max()}]")
    if not m.any():
        raise ValueError("labeled must mark at least one labeled item (DIRECT needs a labeled seed set), got none")
    b = min(_check_budget(budget), int((~m).sum()))
    rng = _check_rng(rng)
    if parallel_annotators < 1:
        raise ValueError(f"parallel_annotators must be >= 1, got {parallel_annotators}")
    if min_budget_per_class < 1:
        raise ValueError(f"min_budget_per_class must be >= 1, got {min_budget_per_class}")
    if class_rank is None:
        freq = np.bincount(y[m], minlength=K)
        rank = np.argsort(-freq, kind="stable")
    else:
        rank = np.asarray(class_rank, dtype=np.int64)
        if sorted(rank.tolist()) != list(range(K)):
            raise ValueError(f"class_rank must be a permutation of range({K}), got {rank.tolist()}")
    if class_weights is not None:
        cw = np.asarray(class_weights, dtype=np.float64)
        if cw.shape != (K,) or not np.all(np.isfinite(cw)) or np.any(cw < 0) or cw.sum() <= 0:
            raise ValueError(f"class_weights must be {K} finite non-negative weights with a positive sum, got {cw}")
        if np.all(cw == cw[0]):
            cw = None
    else:
        cw = None

    most = p.max(axis=1, keepdims=True)
    margins = p - most + 1e-8 * most  # LabelBench uses p[:, :1] for K = 2 (see the module docstring)
    lines = [np.lexsort((rng.random(n), -margins[:, k])) for k in range(K)]
    queried: list[int] = []

    def query(idx: np.ndarray) -> np.ndarray:
        got = np.asarray(oracle(np.asarray(idx, dtype=np.int64)))
        if got.shape != (len(idx),):
            raise ValueError(f"oracle must return one label per index, got shape {got.shape} for {len(idx)}")
        y[idx] = got
        m[idx] = True
        queried.extend(int(i) for i in idx)
        return got

    def line_w(k):
        order = lines[k]
        lab = m[order]
        return np.where(lab, np.where(y[order] == k, 1.0, -1.0), 0.0), lab

    # Phase 1: version-space reduction on the rarest classes.
    if b // K // 2 < min_budget_per_class:
        eff_class, b2 = K, b // K // 2
    else:
        eff_class, b2 = b // (2 * min_budget_per_class), min_budget_per_class
    for k in rank[len(rank) - min(eff_class, K):]:
        if b2 <= 0:
            break
        order = lines[k]
        w, lab = line_w(k)
        lo, hi = uncertainty_interval(w)
        b2 = min(b2, int((~lab).sum()))

        def label_fn(pos, order=order, k=k):
            return np.where(query(order[pos]) == k, 1.0, -1.0)

        version_space_reduction(w, lab, lo, hi, batch=parallel_annotators, budget=b2, label_fn=label_fn, rng=rng)
    phase1 = len(queried)

    # Phase 2: query around each class's best threshold.
    rem = b - phase1
    perm = rng.permutation(K)
    if cw is None:
        quota = [rem * (i + 1) // K - rem * i // K for i in range(K)]
    else:
        alloc = largest_remainder(rem, cw)
        quota = [int(alloc[k]) for k in perm]
    carry = 0
    for i, k in enumerate(perm):
        order = lines[k]
        w, lab = line_w(k)
        pos = query_around_threshold(lab, best_threshold(w), quota[i] + carry)
        need = quota[i] + carry - len(pos)
        picks = order[pos]
        carry = need
        if len(pos):
            query(np.asarray(picks, dtype=np.int64))
    return DirectResult(np.asarray(queried, dtype=np.int64), phase1)


BASELINES = ("direct", "margin", "entropy", "coreset", "random")
