"""Annotator label noise for active-learning simulations: symmetric and class-conditional flips.

An annotator answers the true label y with probability ``1 - rate`` and otherwise another class, drawn
uniformly from the other classes (``kind="symmetric"``) or the next class ``(y + 1) mod K``
(``kind="pair"``, class-conditional), or any row-stochastic transition matrix ``T[y, y']``
(`flip_labels`). The noisy answer is drawn once per pool item (`noisy_annotations`), so querying an item
again returns the same label, as the spec asks.

Spec: /work/shared/papers/specs/vision_weights_envs.md section 6(d) ("symmetric label noise rate eta applied to
annotator responses, fixed per example") and 6(e) (noise simulator tests). The pair flip is INFERRED (the spec
names class-conditional noise only through the brief).
"""

from __future__ import annotations

import numpy as np

__all__ = ["NOISE_KINDS", "transition_matrix", "flip_labels", "noisy_annotations"]

NOISE_KINDS = ("symmetric", "pair")


def transition_matrix(num_classes: int, rate: float, *, kind: str = "symmetric") -> np.ndarray:
    """Row-stochastic (K, K) matrix ``T[y, y']`` = P(annotator says y' | true y), diagonal ``1 - rate``.

    Args:
      num_classes: K >= 2.
      rate: flip probability in [0, 1].
      kind: "symmetric" (uniform over the K - 1 other classes) or "pair" (all flips to (y + 1) mod K).
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if not (isinstance(rate, (int, float, np.floating)) and 0.0 <= float(rate) <= 1.0):
        raise ValueError(f"rate must be a flip probability in [0, 1], got {rate!r}")
    if kind not in NOISE_KINDS:
        raise ValueError(f"kind must be one of {NOISE_KINDS}, got {kind!r}")
    k = int(num_classes)
    if kind == "symmetric":
        t = np.full((k, k), float(rate) / (k - 1))
    else:
        t = np.zeros((k, k))
        t[np.arange(k), (np.arange(k) + 1) % k] = float(rate)
    np.fill_diagonal(t, 1.0 - float(rate))
    return t


def flip_labels(labels, transition, *, rng: np.random.Generator) -> np.ndarray:
    """Draws one noisy label per item: ``y'_i ~ T[y_i, :]`` (inverse-CDF sampling, one uniform per item).

    Args:
      labels: (n,) int true labels in [0, K).
      transition: (K, K) row-stochastic matrix.
      rng: numpy Generator.

    Returns:
      (n,) int64 noisy labels.
    """
    t = np.asarray(transition, dtype=np.float64)
    if t.ndim != 2 or t.shape[0] != t.shape[1] or np.any(t < 0) or not np.allclose(t.sum(1), 1.0):
        raise ValueError(f"transition must be a square row-stochastic matrix, got shape {t.shape} and row sums "
                         f"{np.round(t.sum(1), 6) if t.ndim == 2 else 'n/a'}")
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got dtype {y.dtype} and shape {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= t.shape[0]):
        raise ValueError(f"labels must lie in [0, {t.shape[0]}), got range [{y.min()}, {y.max()}]")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    cdf = np.cumsum(t, axis=1)
    cdf[:, -1] = 1.0
    u = rng.random(y.size)
    out = (u[:, None] >= cdf[y]).sum(axis=1)
    return out.astype(np.int64)


def noisy_annotations(labels, rate: float, *, num_classes: int, kind: str = "symmetric",
                      rng: np.random.Generator) -> np.ndarray:
    """The fixed annotator answer of every pool item: `flip_labels` with `transition_matrix(K, rate, kind)`."""
    return flip_labels(labels, transition_matrix(num_classes, rate, kind=kind), rng=rng)
