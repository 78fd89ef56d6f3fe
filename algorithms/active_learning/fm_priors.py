"""Active learning with foundation-model (FM) priors: imbalance-aware co-decisions of a frozen FM and a small model.

A frozen foundation model gives zero-shot class probabilities ``Q`` (n, K) and embeddings on the whole pool; the
small model, retrained each round on the labels so far, gives ``P`` (n, K). The two decide together which items to
annotate:

  * co-decision score (log-linear pooling): ``S = alpha_t log P + (1 - alpha_t) log Q`` with the trust schedule
    ``alpha_t = n_labeled / (n_labeled + n0)`` (`trust_weight`); DIRECT (`selection.direct_select`) runs on
    ``softmax(S)`` (`pool_log_linear`) instead of ``P``;
  * imbalance awareness: pool class priors from the FM ``pi_k = mean_i Q[i, k]`` (`estimate_class_priors`);
    DIRECT's phase 1 visits classes rarest-by-``pi`` first (`prior_class_rank`) and phase 2 splits its budget
    proportionally to ``(1 / pi_k) ** beta`` (`class_budgets`);
  * noise handling: a new label that disagrees with both models while both are confident (``max P > tau``,
    ``max Q > tau``, same argmax) is flagged (`suspected_noise`) and down-weighted to ``omega`` in training
    (`training_weights`);
  * cold start: with no labels yet, k-center greedy on FM embeddings within each FM-predicted class, an equal
    share of the budget per class (`cold_start_select`).

`co_decision_select` is the round's selection; `FMPriorConfig` holds its settings. Limiting cases: with
``alpha = 1``, ``beta = 0`` and ``rank_by="labeled"`` it is DIRECT on ``P`` exactly; with ``alpha = 0`` DIRECT
runs on ``Q`` alone.

Dimension legend: ``n`` pool items, ``K`` classes, ``e`` embedding width.

Spec: /work/shared/papers/specs/vision_weights_envs.md section 6(b) ("Foundation-model priors and co-decision") and
6(g). INFERRED (the paper body and code were not available): the whole co-decision rule above (pooling form, trust
schedule with n0 ~ 10 K, priors from mean Q, beta = 0.5, tau, omega = 0.2, the cold start); only the DIRECT base
(`selection.direct_select`) is read from its reference implementation.

References:
  "Active Learning with Foundation Model Priors: Efficient Learning under Class Imbalance", ICML 2026
  (arXiv 2606.07630; abstract only).
  Nuggehalli, Zhang, Jain, Nowak, "DIRECT: Deep Active Learning under Imbalance and Label Noise", arXiv:2312.09196.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from algorithms.active_learning import selection

__all__ = [
    "FMPriorConfig", "pool_log_linear", "trust_weight", "estimate_class_priors", "prior_class_rank",
    "class_budgets", "suspected_noise", "training_weights", "cold_start_select", "co_decision_select",
]

_EPS = 1e-12


@dataclasses.dataclass(frozen=True, kw_only=True)
class FMPriorConfig:
    """Settings of the FM-prior co-decision (all [INFER] defaults from spec 6(b)).

    Attributes:
      n0: trust-schedule scale, ``alpha_t = n / (n + n0)``; None means ``10 K``.
      alpha: fixed pooling weight in [0, 1] instead of the schedule (None: schedule).
      beta: imbalance exponent of the phase-2 split ``(1 / pi) ** beta`` (0: even split).
      rank_by: phase-1 class order, "prior" (rarest by FM prior first) or "labeled" (DIRECT's labeled frequency).
      tau: confidence above which both models' agreement against a label flags it as suspected noise.
      omega: training weight of a suspected-noise label.
      parallel_annotators: DIRECT's B1.
      min_budget_per_class: DIRECT's phase-1 labels per class at large budgets.
    """

    n0: float | None = None
    alpha: float | None = None
    beta: float = 0.5
    rank_by: str = "prior"
    tau: float = 0.8
    omega: float = 0.2
    parallel_annotators: int = 5
    min_budget_per_class: int = 3

    def __post_init__(self):
        if self.n0 is not None and not self.n0 > 0:
            raise ValueError(f"n0 must be > 0 or None, got {self.n0!r}")
        if self.alpha is not None and not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1] or be None, got {self.alpha!r}")
        if not (np.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta must be a finite value >= 0, got {self.beta!r}")
        if self.rank_by not in ("prior", "labeled"):
            raise ValueError(f"rank_by must be 'prior' or 'labeled', got {self.rank_by!r}")
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"tau must lie in [0, 1], got {self.tau!r}")
        if not 0.0 <= self.omega <= 1.0:
            raise ValueError(f"omega must lie in [0, 1], got {self.omega!r}")


def _probs(name: str, x, n: int | None = None) -> np.ndarray:
    return selection._check_probs(name, x, n)


def pool_log_linear(p, q, alpha: float) -> np.ndarray:
    """Log-linear pooling ``softmax(alpha log P + (1 - alpha) log Q)`` row-wise, shape (n, K), float64.

    Exact limits: ``alpha = 1`` returns ``P`` (rows renormalized), ``alpha = 0`` returns ``Q``. Zero
    probabilities are clipped at 1e-12 before the log.
    """
    pp = _probs("p", p)
    qq = _probs("q", q)
    if pp.shape != qq.shape:
        raise ValueError(f"p and q must have the same shape, got {pp.shape} and {qq.shape}")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if alpha == 1.0:
        return pp / pp.sum(1, keepdims=True)
    if alpha == 0.0:
        return qq / qq.sum(1, keepdims=True)
    s = alpha * np.log(np.maximum(pp, _EPS)) + (1.0 - alpha) * np.log(np.maximum(qq, _EPS))
    s -= s.max(1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(1, keepdims=True)


def trust_weight(n_labeled: int, n0: float) -> float:
    """The small model's pooling weight ``alpha_t = n_labeled / (n_labeled + n0)`` in [0, 1)."""
    if n_labeled < 0:
        raise ValueError(f"n_labeled must be >= 0, got {n_labeled}")
    if not n0 > 0:
        raise ValueError(f"n0 must be > 0, got {n0}")
    return float(n_labeled) / (float(n_labeled) + float(n0))


def estimate_class_priors(q) -> np.ndarray:
    """Pool class priors from the FM: ``pi_k = mean_i Q[i, k]`` (rows normalized), shape (K,)."""
    qq = _probs("q", q)
    qq = qq / qq.sum(1, keepdims=True)
    return qq.mean(0)


def prior_class_rank(priors) -> np.ndarray:
    """Classes from most to least frequent by ``priors`` (DIRECT's ``class_rank`` convention; stable on ties)."""
    pi = np.asarray(priors, dtype=np.float64)
    if pi.ndim != 1 or pi.size < 2 or not np.all(np.isfinite(pi)):
        raise ValueError(f"priors must be a finite 1-D array over >= 2 classes, got {pi}")
    return np.argsort(-pi, kind="stable")


def class_budgets(priors, budget: int, *, beta: float = 0.5) -> np.ndarray:
    """Imbalance-aware per-class split of ``budget``: proportional to ``(1 / pi_k) ** beta``.

    Integer, sums to ``budget``, monotone in ``1 / pi`` (largest remainder; `selection.largest_remainder`);
    ``beta = 0`` is an even split. Priors are floored at 1e-12.

    Examples:
        >>> class_budgets([0.7, 0.2, 0.1], 9, beta=1.0).tolist()
        [1, 3, 5]
    """
    pi = np.asarray(priors, dtype=np.float64)
    if pi.ndim != 1 or pi.size < 1 or not np.all(np.isfinite(pi)) or np.any(pi < 0):
        raise ValueError(f"priors must be a finite non-negative 1-D array, got {pi}")
    if not (np.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite value >= 0, got {beta!r}")
    return selection.largest_remainder(budget, np.maximum(pi, _EPS) ** (-float(beta)))


def suspected_noise(p, q, labels, *, tau: float) -> np.ndarray:
    """Flags labels both models contradict with confidence: ``max P > tau``, ``max Q > tau``,
    ``argmax P == argmax Q != label``. Shapes: p, q (n, K), labels (n,) -> bool (n,)."""
    pp, qq = _probs("p", p), _probs("q", q)
    y = np.asarray(labels)
    if pp.shape != qq.shape or y.shape != (pp.shape[0],):
        raise ValueError(f"p, q must share shape (n, K) and labels be (n,), got {pp.shape}, {qq.shape}, {y.shape}")
    ap, aq = pp.argmax(1), qq.argmax(1)
    return (pp.max(1) > tau) & (qq.max(1) > tau) & (ap == aq) & (ap != y)


def training_weights(labeled, suspected, *, omega: float) -> np.ndarray:
    """Per-item training weights: 0 unlabeled, ``omega`` labeled and suspected noisy, 1 otherwise."""
    m = selection._check_labeled(labeled)
    s = np.asarray(suspected, dtype=bool)
    if s.shape != m.shape:
        raise ValueError(f"suspected must have shape {m.shape}, got {s.shape}")
    return np.where(m, np.where(s, float(omega), 1.0), 0.0)


def cold_start_select(embeddings, q, labeled, budget: int, *, rng: np.random.Generator) -> np.ndarray:
    """FM-only first round: k-center greedy on FM embeddings inside each FM-predicted class, balanced.

    The budget is split evenly over the classes the FM predicts on unlabeled items (a random class order takes the
    remainder); a class with too few items passes its surplus on; whatever is left is filled by k-center greedy on
    the whole pool.

    Args:
      embeddings: (n, e) FM embeddings.
      q: (n, K) FM probabilities.
      labeled: (n,) bool mask.
      budget: number to pick.
      rng: numpy Generator.
    """
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"embeddings must have shape (n, e), got {x.shape}")
    qq = _probs("q", q, x.shape[0])
    m = selection._check_labeled(labeled, qq.shape[0]).copy()
    b = min(selection._check_budget(budget), int((~m).sum()))
    rng = selection._check_rng(rng)
    pred = qq.argmax(1)
    classes = rng.permutation(np.unique(pred[~m]))
    picks: list[int] = []
    if classes.size:
        quota = [b * (i + 1) // classes.size - b * i // classes.size for i in range(classes.size)]
        carry = 0
        for c, qt in zip(classes, quota):
            members = np.flatnonzero(pred == c)
            sub_lab = m[members]
            take = min(qt + carry, int((~sub_lab).sum()))
            carry = qt + carry - take
            got = members[selection.k_center_greedy(x[members], sub_lab, take, rng=rng)]
            m[got] = True
            picks += got.tolist()
    rest = b - len(picks)
    if rest > 0:
        got = selection.k_center_greedy(x, m, rest, rng=rng)
        m[got] = True
        picks += got.tolist()
    return np.asarray(picks, dtype=np.int64)


def co_decision_select(p, q, labels, labeled, budget: int, *, oracle: Callable[[np.ndarray], np.ndarray],
                       rng: np.random.Generator, config: FMPriorConfig = FMPriorConfig()
                       ) -> selection.DirectResult:
    """One round of the FM-prior co-decision: DIRECT on the pooled ``softmax(alpha log P + (1 - alpha) log Q)``
    with FM-prior class order and an imbalance-aware phase-2 split.

    Args:
      p: (n, K) small-model probabilities on the pool.
      q: (n, K) frozen-FM probabilities on the pool.
      labels: (n,) int annotations (read where labeled).
      labeled: (n,) bool mask, at least one True (use `cold_start_select` before the first label).
      budget: labels to acquire.
      oracle: indices -> annotated labels.
      rng: numpy Generator.
      config: `FMPriorConfig`.

    Returns:
      `selection.DirectResult` (exactly ``budget`` new distinct indices, or all remaining).
    """
    pp, qq = _probs("p", p), _probs("q", q)
    if pp.shape != qq.shape:
        raise ValueError(f"p and q must have the same shape, got {pp.shape} and {qq.shape}")
    m = selection._check_labeled(labeled, pp.shape[0])
    K = pp.shape[1]
    n0 = config.n0 if config.n0 is not None else 10.0 * K
    alpha = config.alpha if config.alpha is not None else trust_weight(int(m.sum()), n0)
    pooled = pool_log_linear(pp, qq, alpha)
    pi = estimate_class_priors(qq)
    rank = prior_class_rank(pi) if config.rank_by == "prior" else None
    weights = None if config.beta == 0 else np.maximum(pi, _EPS) ** (-config.beta)
    return selection.direct_select(pooled, labels, m, budget, oracle=oracle, rng=rng,
                                   parallel_annotators=config.parallel_annotators,
                                   min_budget_per_class=config.min_budget_per_class,
                                   class_rank=rank, class_weights=weights)
