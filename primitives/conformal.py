"""Split conformal prediction as pure functions: regression (absolute residual, CQR), classification
(APS / RAPS, randomized or not), and the interval-stability diagnostic.

Split conformal prediction turns any fitted predictor into prediction sets with finite-sample
marginal coverage. A *score* s(x, y) measures how badly y fits the prediction at x; with the
scores V_1..V_n of a calibration fold, the radius is the k-th smallest score,

    k = ceil((n + 1) (1 - alpha)),

and the set at a test point x' is {y : s(x', y) <= q_hat}. When the calibration points and the test
point are exchangeable, P(Y' in C(X')) >= 1 - alpha, and for continuous scores the coverage is exactly
k / (n + 1) <= 1 - alpha + 1 / (n + 1). When k > n (fewer than 1/alpha - 1 calibration points) no finite
radius has the guarantee and the radius is +inf (the whole label space); when k <= 0 (alpha = 1) the
radius is -inf (the empty set).

Two readings of the quantile are offered (`method=`):

* ``"exact"`` (default): the k-th order statistic above, which carries the guarantee.
* ``"percentile"``: the reading of the paper's code, ``np.percentile(scores, 100 k / n)`` with linear
  interpolation (between the k-th and (k+1)-th order statistics, so never smaller than "exact").

Interval stability (Min et al., Def. 4.1) is the variance of a randomized method's set size across
re-runs of its internal randomness at a fixed input (calibration set and model fixed), averaged over
inputs. `interval_stability` takes the sizes of R re-runs and reduces them with the paper's variance
(default), or with the per-point standard deviation (``"std"``) or standard error ``std / sqrt(R)``
(``"sem"``, what the paper's tables report).

Dimension legend:
  n   calibration points
  m   test points
  k   classes
  r   re-runs of a randomized method (independent draws of its internal randomness)

Sets are represented as arrays: a regression interval as a pair ``(lower [m], upper [m])`` and a
classification set as a boolean mask ``[m, k]``.

References:
  Vovk, Gammerman, Shafer, "Algorithmic Learning in a Random World", Springer, 2005 (conformal prediction).
  Lei, G'Sell, Rinaldo, Tibshirani, Wasserman, "Distribution-Free Predictive Inference for Regression",
    arXiv:1604.04173, 2016 (split conformal regression).
  Romano, Patterson, Candes, "Conformalized Quantile Regression", arXiv:1905.03222, 2019 (CQR).
  Romano, Sesia, Candes, "Classification with Valid and Adaptive Coverage", arXiv:2006.02544, 2020 (APS).
  Angelopoulos, Bates, Malik, Jordan, "Uncertainty Sets for Image Classifiers using Conformal
    Prediction", arXiv:2009.14193, 2020 (RAPS).
  Min, Lu, Li, Zhang, Teng, "Questioning the Coverage-Length Metric in Conformal Prediction: When
    Shorter Intervals Are Not Better", ICML 2026 (interval stability, Def. 4.1).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from primitives.validation import concrete_value

__all__ = [
    "QUANTILE_METHODS",
    "STABILITY_REDUCTIONS",
    "conformal_rank",
    "conformal_quantile",
    "absolute_residual_scores",
    "split_conformal_interval",
    "cqr_scores",
    "cqr_interval",
    "interval_length",
    "interval_covers",
    "raps_label_scores",
    "raps_scores",
    "raps_sets",
    "aps_scores",
    "aps_sets",
    "set_size",
    "set_covers",
    "interval_stability",
    "rerun_sizes",
]

QUANTILE_METHODS = ("exact", "percentile")
STABILITY_REDUCTIONS = ("variance", "std", "sem")


# ----------------------------------------------------------------------------------------------
# Checks.


def _check_method(method: str) -> None:
    if method not in QUANTILE_METHODS:
        raise ValueError(f"method must be one of {QUANTILE_METHODS}; got method={method!r}")


def _check_1d(name: str, x: jax.Array) -> None:
    if jnp.ndim(x) != 1:
        raise ValueError(f"{name} must be 1-D [{'n' if 'cal' in name or name == 'scores' else 'm'}]; "
                         f"got shape {jnp.shape(x)}")


def _check_no_nan(name: str, x: jax.Array) -> None:
    """Concrete scores must not hold NaN (a NaN sorts last and silently shifts the quantile)."""
    arr = concrete_value(x)
    if arr is None or not np.issubdtype(arr.dtype, np.inexact):
        return
    nan = np.isnan(arr)
    if nan.any():
        raise ValueError(f"{name} must not contain NaN; got {int(nan.sum())} NaN of {arr.size} "
                         f"(first at index {int(np.argmax(nan.ravel()))})")


def _check_same_shape(**arrays) -> None:
    shapes = {k: jnp.shape(v) for k, v in arrays.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{', '.join(shapes)} must have the same shape; got {shapes}")


def _concrete_alpha(alpha) -> np.ndarray | None:
    """alpha as a float64 numpy array if it is concrete (not traced), else None."""
    try:
        return np.asarray(alpha, dtype=np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
        return None


# ----------------------------------------------------------------------------------------------
# The conformal quantile.


def conformal_rank(n: int, alpha):
    """The rank k = ceil((n + 1)(1 - alpha)) of the conformal quantile among n calibration scores.

    k > n means the radius is infinite, k <= 0 that it is -inf (empty set). With a concrete `alpha`
    (Python float or numpy/concrete array) k is computed in float64 and returned as numpy int64; a
    traced `alpha` (inside jit/vmap) gives an int32 jax array computed in float32. Both subtract a
    guard of about 1e-9 (float64) or 1e-6 (float32) times (n + 1) before the ceiling so that levels
    such as (n + 1)(1 - 0.1) = 900.0000000000001 are not pushed to the next rank by rounding.

    Args:
      n: number of calibration scores (>= 1).
      alpha: miscoverage level(s) in [0, 1], any shape.

    Returns:
      k, same shape as alpha.

    Examples:
      >>> int(conformal_rank(9, 0.1)), int(conformal_rank(8, 0.1)), int(conformal_rank(99, 0.1))
      (9, 9, 90)
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int; got n={n!r}")
    a = _concrete_alpha(alpha)
    if a is not None:
        if np.any((a < 0) | (a > 1)) or np.any(np.isnan(a)):
            raise ValueError(f"alpha must lie in [0, 1]; got alpha={alpha}")
        x = (n + 1) * (1.0 - a)
        return np.ceil(x - 1e-9 * (n + 1)).astype(np.int64)
    a = jnp.asarray(alpha, jnp.float32)
    x = (n + 1) * (1.0 - a)
    return jnp.ceil(x - 2.0 ** -20 * (n + 1)).astype(jnp.int32)


def conformal_quantile(scores: jax.Array, alpha, *, method: str = "exact") -> jax.Array:
    """The split-conformal radius q_hat of calibration scores at miscoverage `alpha`.

    Args:
      scores: calibration scores [n].
      alpha: miscoverage level(s) in [0, 1]; any shape (the result has the same shape).
      method: "exact" (the ceil((n+1)(1-alpha))-th smallest score, with the finite-sample guarantee)
        or "percentile" (the paper code's `np.percentile(scores, 100 k / n)`, linear interpolation).

    Returns:
      q_hat with alpha's shape, in the dtype of `scores`: +inf where k > n, -inf where k <= 0.

    Raises:
      ValueError: for concrete scores holding NaN (+-inf scores are allowed). Traced scores
        (inside `jit`) are not checked; a NaN then sorts last and is counted as the largest score.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.arange(1.0, 10.0)           # n = 9
      >>> float(conformal_quantile(s, 0.1))   # ceil(10 * 0.9) = 9 -> the largest score
      9.0
      >>> float(conformal_quantile(s[:8], 0.1))  # n = 8 < 1/alpha - 1: infinite radius
      inf
      >>> k = 5  # ceil(10 * 0.5); "percentile" interpolates np.percentile(s, 100 * 5 / 9)
      >>> float(conformal_quantile(s, 0.5)), round(float(conformal_quantile(s, 0.5, method="percentile")), 4)
      (5.0, 5.4444)
    """
    _check_method(method)
    scores = jnp.asarray(scores)
    _check_1d("scores", scores)
    _check_no_nan("scores", scores)
    if not jnp.issubdtype(scores.dtype, jnp.floating):
        scores = scores.astype(jnp.float32)
    n = scores.shape[0]
    return _quantile_from_rank(scores, jnp.asarray(conformal_rank(n, alpha)), method=method)


@functools.partial(jax.jit, static_argnames=("method",))
def _quantile_from_rank(scores: jax.Array, k: jax.Array, *, method: str) -> jax.Array:
    """The k-th smallest score ("exact") or its np.percentile reading; +-inf outside 1..n (jitted core)."""
    n = scores.shape[0]
    sorted_scores = jnp.sort(scores)
    if method == "exact":
        q = sorted_scores[jnp.clip(k - 1, 0, n - 1)]
    else:
        # np.percentile(..., method="linear"): position (n - 1) * level among 0-based order statistics.
        pos = (n - 1) * (jnp.clip(k, 0, n).astype(scores.dtype) / n)
        lo = jnp.floor(pos).astype(jnp.int32)
        hi = jnp.minimum(lo + 1, n - 1)
        frac = pos - lo
        q = sorted_scores[lo] + frac * (sorted_scores[hi] - sorted_scores[lo])
    q = jnp.where(k > n, jnp.inf, q)
    q = jnp.where(k <= 0, -jnp.inf, q)
    return q.astype(scores.dtype)


# ----------------------------------------------------------------------------------------------
# Regression.


def absolute_residual_scores(pred: jax.Array, y: jax.Array) -> jax.Array:
    """Vanilla split-conformal scores |y - pred| (same shape as the inputs)."""
    pred, y = jnp.asarray(pred), jnp.asarray(y)
    _check_same_shape(pred=pred, y=y)
    return jnp.abs(y - pred)


def split_conformal_interval(cal_pred: jax.Array, cal_y: jax.Array, test_pred: jax.Array, *, alpha,
                             method: str = "exact") -> tuple[jax.Array, jax.Array]:
    """Vanilla split conformal (VCP) intervals [pred - q_hat, pred + q_hat].

    Args:
      cal_pred: predictions on the calibration fold [n].
      cal_y: calibration labels [n].
      test_pred: predictions at the test points [m].
      alpha: miscoverage level in [0, 1] (scalar).
      method: quantile reading, see `conformal_quantile`.

    Returns:
      (lower [m], upper [m]). The radius is clipped at 0 (alpha = 1 gives the point interval
      [pred, pred]) and is +inf when the calibration fold is too small.

    Examples:
      >>> import jax.numpy as jnp
      >>> lo, hi = split_conformal_interval(jnp.zeros(9), jnp.arange(1.0, 10.0), jnp.array([0.0, 5.0]), alpha=0.2)
      >>> lo.tolist(), hi.tolist()      # ceil(10 * 0.8) = 8 -> radius 8
      ([-8.0, -3.0], [8.0, 13.0])
    """
    cal_pred, cal_y, test_pred = jnp.asarray(cal_pred), jnp.asarray(cal_y), jnp.asarray(test_pred)
    _check_1d("cal_pred", cal_pred)
    _check_same_shape(cal_pred=cal_pred, cal_y=cal_y)
    _check_no_nan("cal_pred", cal_pred)
    _check_no_nan("cal_y", cal_y)
    _check_1d("test_pred", test_pred)
    if jnp.ndim(alpha) != 0:
        raise ValueError(f"alpha must be a scalar; got shape {jnp.shape(alpha)}")
    q = conformal_quantile(absolute_residual_scores(cal_pred, cal_y), alpha, method=method)
    radius = jnp.maximum(q, 0.0).astype(test_pred.dtype)
    return test_pred - radius, test_pred + radius


def cqr_scores(lo_pred: jax.Array, hi_pred: jax.Array, y: jax.Array) -> jax.Array:
    """CQR scores max(lo - y, y - hi): negative inside the predicted band, positive outside."""
    lo_pred, hi_pred, y = jnp.asarray(lo_pred), jnp.asarray(hi_pred), jnp.asarray(y)
    _check_same_shape(lo_pred=lo_pred, hi_pred=hi_pred, y=y)
    return jnp.maximum(lo_pred - y, y - hi_pred)


def cqr_interval(cal_lo: jax.Array, cal_hi: jax.Array, cal_y: jax.Array, test_lo: jax.Array,
                 test_hi: jax.Array, *, alpha, method: str = "exact") -> tuple[jax.Array, jax.Array]:
    """Conformalized quantile regression intervals [lo - q_hat, hi + q_hat].

    Args:
      cal_lo, cal_hi: lower/upper quantile predictions on the calibration fold [n].
      cal_y: calibration labels [n].
      test_lo, test_hi: lower/upper quantile predictions at the test points [m].
      alpha: miscoverage level in [0, 1] (scalar).
      method: quantile reading, see `conformal_quantile`.

    Returns:
      (lower [m], upper [m]); q_hat may be negative (the band shrinks); an empty set has
      lower > upper (its `interval_length` is 0).

    Examples:
      >>> import jax.numpy as jnp
      >>> y = jnp.arange(9.0)
      >>> lo, hi = cqr_interval(y - 1, y + 1, y + 3.0 * (jnp.arange(9) % 2), jnp.zeros(1), jnp.ones(1), alpha=0.2)
      >>> lo.tolist(), hi.tolist()      # scores are -1 (even) or 2 (odd): 8th smallest = 2
      ([-2.0], [3.0])
    """
    cal_lo, cal_hi, cal_y = jnp.asarray(cal_lo), jnp.asarray(cal_hi), jnp.asarray(cal_y)
    test_lo, test_hi = jnp.asarray(test_lo), jnp.asarray(test_hi)
    _check_1d("cal_lo", cal_lo)
    _check_same_shape(cal_lo=cal_lo, cal_hi=cal_hi, cal_y=cal_y)
    for name, arr in (("cal_lo", cal_lo), ("cal_hi", cal_hi), ("cal_y", cal_y)):
        _check_no_nan(name, arr)
    _check_1d("test_lo", test_lo)
    _check_same_shape(test_lo=test_lo, test_hi=test_hi)
    if jnp.ndim(alpha) != 0:
        raise ValueError(f"alpha must be a scalar; got shape {jnp.shape(alpha)}")
    q = conformal_quantile(cqr_scores(cal_lo, cal_hi, cal_y), alpha, method=method).astype(test_lo.dtype)
    return test_lo - q, test_hi + q


def interval_length(lower: jax.Array, upper: jax.Array) -> jax.Array:
    """Lebesgue measure max(upper - lower, 0) of intervals (inf for unbounded ones, 0 for empty)."""
    lower, upper = jnp.asarray(lower), jnp.asarray(upper)
    _check_same_shape(lower=lower, upper=upper)
    width = upper - lower
    return jnp.where(width > 0, width, jnp.zeros_like(width))


def interval_covers(lower: jax.Array, upper: jax.Array, y: jax.Array) -> jax.Array:
    """Whether lower <= y <= upper, elementwise (bool)."""
    lower, upper, y = jnp.asarray(lower), jnp.asarray(upper), jnp.asarray(y)
    _check_same_shape(lower=lower, upper=upper, y=y)
    return (lower <= y) & (y <= upper)


# ----------------------------------------------------------------------------------------------
# Classification: APS and RAPS.


def _check_probs(probs: jax.Array) -> None:
    if jnp.ndim(probs) != 2:
        raise ValueError(f"probs must be 2-D [m, k]; got shape {jnp.shape(probs)}")


def _uniforms(key, m: int, randomized: bool, dtype) -> jax.Array:
    if not randomized:
        return jnp.ones((m,), dtype)
    if key is None:
        raise ValueError("key must be a PRNG key when randomized=True; got key=None")
    return jax.random.uniform(key, (m,), dtype)


def raps_label_scores(probs: jax.Array, u: jax.Array, *, lam: float = 0.0, k_reg: int = 0) -> jax.Array:
    """RAPS scores of every label: E(x, y, u) = (mass strictly above y) + u * pi_y + lam * (rank(y) - k_reg)^+.

    The ranking is by decreasing probability with ties broken by label index; rank is 1-based. With
    u = 1 this is the non-randomized score (mass up to and including y); lam = 0 gives APS.

    Args:
      probs: predicted class probabilities [m, k].
      u: the randomization U(0,1) per row [m] (use ones for the non-randomized score).
      lam: rank penalty weight (>= 0).
      k_reg: number of top ranks exempt from the penalty (>= 0).

    Returns:
      scores [m, k], nondecreasing along the ranking of each row.
    """
    probs = jnp.asarray(probs)
    _check_probs(probs)
    u = jnp.asarray(u, probs.dtype)
    if u.shape != probs.shape[:1]:
        raise ValueError(f"u must have shape [m]={probs.shape[:1]}; got {u.shape}")
    if lam < 0 or k_reg < 0:
        raise ValueError(f"lam and k_reg must be >= 0; got lam={lam}, k_reg={k_reg}")
    return _raps_label_scores(probs, u, lam=float(lam), k_reg=int(k_reg))


@functools.partial(jax.jit, static_argnames=("lam", "k_reg"))
def _raps_label_scores(probs: jax.Array, u: jax.Array, *, lam: float, k_reg: int) -> jax.Array:
    k = probs.shape[1]
    order = jnp.argsort(-probs, axis=1, stable=True)           # [m, k] label at each rank
    sorted_p = jnp.take_along_axis(probs, order, axis=1)
    mass_before = jnp.cumsum(sorted_p, axis=1) - sorted_p
    ranks = jnp.arange(1, k + 1, dtype=probs.dtype)
    penalty = lam * jnp.maximum(ranks - k_reg, 0.0)
    score_sorted = mass_before + u[:, None] * sorted_p + penalty[None, :]
    inverse = jnp.argsort(order, axis=1)                      # rank position of each label
    return jnp.take_along_axis(score_sorted, inverse, axis=1)


def raps_scores(probs: jax.Array, labels: jax.Array, key: jax.Array | None = None, *, lam: float = 0.0,
                k_reg: int = 0, randomized: bool = True) -> jax.Array:
    """Calibration RAPS scores of the true labels [n] (one fresh U per row when randomized).

    Args:
      probs: calibration probabilities [n, k].
      labels: true labels [n] (int in [0, k)).
      key: PRNG key for the U's (ignored when randomized=False).
      lam, k_reg: RAPS regularization (lam = 0 is APS).
      randomized: draw U ~ Unif(0,1) (exact coverage) or use U = 1 (conservative).
    """
    probs = jnp.asarray(probs)
    _check_probs(probs)
    labels = jnp.asarray(labels)
    if labels.shape != probs.shape[:1]:
        raise ValueError(f"labels must have shape [n]={probs.shape[:1]}; got {labels.shape}")
    u = _uniforms(key, probs.shape[0], randomized, probs.dtype)
    all_scores = raps_label_scores(probs, u, lam=lam, k_reg=k_reg)
    return jnp.take_along_axis(all_scores, labels[:, None].astype(jnp.int32), axis=1)[:, 0]


def raps_sets(probs: jax.Array, q_hat, key: jax.Array | None = None, *, lam: float = 0.0, k_reg: int = 0,
              randomized: bool = True, allow_zero_sets: bool = True) -> jax.Array:
    """RAPS prediction sets {y : E(x, y, U) <= q_hat} as a boolean mask [m, k].

    Args:
      probs: test probabilities [m, k].
      q_hat: conformal quantile of the calibration `raps_scores` (scalar; +inf gives every label).
      key: PRNG key for the test U's (one per row; ignored when randomized=False).
      lam, k_reg, randomized: must match those used for the calibration scores.
      allow_zero_sets: if False the top-ranked label is always included (RAPS's default); this only
        adds coverage.

    Examples:
      >>> import jax.numpy as jnp
      >>> p = jnp.array([[0.5, 0.3, 0.2]])
      >>> raps_sets(p, 0.75, randomized=False).tolist()   # cumulative mass 0.5, 0.8, 1.0
      [[True, False, False]]
    """
    probs = jnp.asarray(probs)
    _check_probs(probs)
    if jnp.ndim(q_hat) != 0:
        raise ValueError(f"q_hat must be a scalar; got shape {jnp.shape(q_hat)}")
    u = _uniforms(key, probs.shape[0], randomized, probs.dtype)
    scores = raps_label_scores(probs, u, lam=lam, k_reg=k_reg)
    sets = scores <= q_hat
    if not allow_zero_sets:
        top = jnp.argmax(probs, axis=1)
        sets = sets | jax.nn.one_hot(top, probs.shape[1], dtype=bool)
    return sets


def aps_scores(probs: jax.Array, labels: jax.Array, key: jax.Array | None = None, *,
               randomized: bool = True) -> jax.Array:
    """APS calibration scores (RAPS with lam = 0); see `raps_scores`."""
    return raps_scores(probs, labels, key, lam=0.0, k_reg=0, randomized=randomized)


def aps_sets(probs: jax.Array, q_hat, key: jax.Array | None = None, *, randomized: bool = True,
             allow_zero_sets: bool = True) -> jax.Array:
    """APS prediction sets (RAPS with lam = 0); see `raps_sets`."""
    return raps_sets(probs, q_hat, key, lam=0.0, k_reg=0, randomized=randomized,
                     allow_zero_sets=allow_zero_sets)


def set_size(sets: jax.Array) -> jax.Array:
    """Number of labels in each set [m] (float32, so it averages like an interval length)."""
    sets = jnp.asarray(sets)
    if sets.ndim != 2:
        raise ValueError(f"sets must be a boolean mask [m, k]; got shape {sets.shape}")
    return jnp.sum(sets, axis=1).astype(jnp.float32)


def set_covers(sets: jax.Array, labels: jax.Array) -> jax.Array:
    """Whether each set contains its label [m] (bool)."""
    sets, labels = jnp.asarray(sets), jnp.asarray(labels)
    if sets.ndim != 2 or labels.shape != sets.shape[:1]:
        raise ValueError(f"sets must be [m, k] and labels [m]; got sets {sets.shape}, labels {labels.shape}")
    return jnp.take_along_axis(sets, labels[:, None].astype(jnp.int32), axis=1)[:, 0]


# ----------------------------------------------------------------------------------------------
# Interval stability (Def. 4.1).


def interval_stability(sizes: jax.Array, *, reduction: str = "variance", ddof: int = 0,
                       per_point: bool = False) -> jax.Array:
    """Interval stability of a method from the set sizes of r re-runs at m fixed inputs.

    IS(C) = E_X[ Var_runs(|C(X)|) ] (Def. 4.1): the run-to-run variance of the set size at a fixed
    input and fixed calibration data, averaged over inputs. Deterministic methods give exactly 0 (the
    variance is computed from differences to the first run, which vanish bitwise for constant sizes).

    Args:
      sizes: set sizes or interval lengths [r, m] (run i, input j).
      reduction: per-input reduction before averaging over inputs: "variance" (the paper's definition),
        "std" (standard deviation), or "sem" (std / sqrt(r), what the paper's code and tables report).
      ddof: delta degrees of freedom of the variance (0: population variance, like np.std; 1: unbiased).
      per_point: return the per-input values [m] instead of their mean.

    Returns:
      A scalar (or [m] with per_point=True), float32 or the dtype of `sizes`.

    Examples:
      >>> import jax.numpy as jnp
      >>> runs = jnp.array([[2.0, 1.0], [0.0, 1.0]])          # two runs, two inputs
      >>> float(interval_stability(runs)), float(interval_stability(runs, reduction="std"))
      (0.5, 0.5)
    """
    if reduction not in STABILITY_REDUCTIONS:
        raise ValueError(f"reduction must be one of {STABILITY_REDUCTIONS}; got reduction={reduction!r}")
    sizes = jnp.asarray(sizes)
    if sizes.ndim != 2:
        raise ValueError(f"sizes must be 2-D [r, m] (re-runs, inputs); got shape {sizes.shape}")
    r = sizes.shape[0]
    if r - ddof < 1:
        raise ValueError(f"need more re-runs than ddof; got r={r}, ddof={ddof}")
    if not jnp.issubdtype(sizes.dtype, jnp.floating):
        sizes = sizes.astype(jnp.float32)
    return _interval_stability(sizes, reduction=reduction, ddof=int(ddof), per_point=bool(per_point))


@functools.partial(jax.jit, static_argnames=("reduction", "ddof", "per_point"))
def _interval_stability(sizes: jax.Array, *, reduction: str, ddof: int, per_point: bool) -> jax.Array:
    r = sizes.shape[0]
    ref = sizes[:1]
    same = sizes == ref
    d = jnp.where(same, jnp.zeros_like(sizes), sizes - ref)  # exact 0 for constant (even infinite) sizes
    finite = jnp.isfinite(d)
    d_f = jnp.where(finite, d, 0.0)
    mean_d = jnp.mean(d_f, axis=0)
    var = jnp.sum((d_f - mean_d) ** 2, axis=0) / (r - ddof)
    var = jnp.where(jnp.all(finite, axis=0), var, jnp.inf)  # finite and infinite sizes mixed
    var = jnp.where(jnp.all(same, axis=0), 0.0, var)
    if reduction == "variance":
        out = var
    elif reduction == "std":
        out = jnp.sqrt(var)
    else:
        out = jnp.sqrt(var) / np.sqrt(r)
    return out if per_point else jnp.mean(out)


def rerun_sizes(size_fn: Callable[[jax.Array], jax.Array], key: jax.Array, *, num_runs: int) -> jax.Array:
    """Sizes [r, m] of `num_runs` re-runs of a randomized method, `size_fn(key) -> [m]`, vmapped over keys.

    The calibration data and the model must be closed over by `size_fn` (held fixed across re-runs);
    only the key changes.
    """
    if num_runs < 1:
        raise ValueError(f"num_runs must be >= 1; got {num_runs}")
    keys = jax.random.split(key, num_runs)
    out = jax.vmap(size_fn)(keys)
    if out.ndim != 2:
        raise ValueError(f"size_fn must return sizes [m]; got shape {out.shape[1:]}")
    return out
