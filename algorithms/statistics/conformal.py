"""The Prejudicial Trick (PT) around any conformal method, its length theory, and experiment helpers.

Min, Lu, Li, Zhang, Teng (ICML 2026) show that coverage and mean length can be gamed. The Prejudicial
Trick (Algorithm 1) wraps a conformal map A_{1-a}(.) and, independently at every test point and run,

    U ~ Unif[0, 1]
    U >  p : return the null set (regression: the point interval [mu(x), mu(x)], classification: {})
    U <= p : return A_{1-alpha'}(x) with alpha' = 1 - (1 - alpha) / p   (a more conservative level)

so that the marginal coverage is p (1 - alpha') = 1 - alpha exactly (Thm. 3.3), and conditional
coverage is inherited because U is independent of (X, Y). p must lie in (1 - alpha, 1]; p = 1 returns
the base set itself (bitwise). The relaxed PT (Remark 3.1) returns A at a tiny coverage level
alpha_low (miscoverage close to 1) with probability 1 - p and A at alpha_high otherwise, with
(1 - p) alpha_low + p alpha_high = alpha.

Length theory. With L(x, u) the length of the base set at x for coverage level u and
G(u) = E_X L(X, u), PT's mean length is p G((1 - alpha) / p). Writing q = 1 - alpha:

* Lemma 3.6: PT is shorter iff some p in (q, 1) has p G(q / p) < G(q)            (`pt_improves_length`)
* Thm. 3.7 (first order): sufficient that G(q) / q > G'(q)                         (`first_order_criterion`)
* Thm. 3.10 (secant): some u in (q, 1) with G(q)/q > (G(u) - G(q)) / (u - q); p = q / u works
  (`secant_criterion`; on matching grids u = q / p it is equivalent to the Lemma 3.6 check).
* Example 3 (success): scores with P(S <= r) = r^2 give G(u) = 2 sqrt(u) (`sqrt_score_length`).
* Example 4 (failure): N(0, 1) residuals give G(u) = 2 Phi^{-1}((1 + u) / 2) and PT is always longer;
  residuals N(+-mu, 1) (the paper's Example 2 mixture, or a constant bias mu in the predictor) give the
  folded-normal curve (`folded_normal_length`), concave enough for PT to win when mu is large.

Interval stability (Def. 4.1, `primitives.conformal.interval_stability`) exposes the trick: PT's is
p (1 - p) E_X[L(X, q / p)^2] > 0 (Prop. 4.2, `pt_interval_stability`), deterministic methods have 0.

Experiment helpers: the synthetic mixture regression of Example 2 / App. D.1.1
(`simulate_mixture_regression`, `synthetic_pt_trial`), least squares and linear quantile regression
fits, softmax regression for classification, and the RAPS parameter choice of Angelopoulos et al.

Dimension legend:
  n   calibration points          m   test points          k   classes
  d   features                    r   re-runs              a   miscoverage levels      p   PT probabilities

References:
  Min, Lu, Li, Zhang, Teng, "Questioning the Coverage-Length Metric in Conformal Prediction: When
    Shorter Intervals Are Not Better", ICML 2026 (no arXiv id; code github.com/benben-cd/PT-Conformal-Prediction).
  Romano, Patterson, Candes, "Conformalized Quantile Regression", arXiv:1905.03222, 2019.
  Angelopoulos, Bates, Malik, Jordan, "Uncertainty Sets for Image Classifiers using Conformal
    Prediction", arXiv:2009.14193, 2020.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import stats

from primitives import conformal as cp

__all__ = [
    "PTResult",
    "CriterionResult",
    "FirstOrderResult",
    "pt_alpha_prime",
    "relaxed_pt_levels",
    "pt_accept",
    "select_sets",
    "prejudicial_trick",
    "relaxed_prejudicial_trick",
    "pt_split_conformal",
    "pt_cqr",
    "pt_raps",
    "pt_expected_length",
    "pt_interval_stability",
    "pt_subgroup_coverage_gap",
    "pt_improves_length",
    "first_order_criterion",
    "secant_criterion",
    "sqrt_score_length",
    "folded_normal_length",
    "empirical_length_curve",
    "simulate_mixture_regression",
    "fit_linear",
    "predict_linear",
    "fit_linear_quantiles",
    "fit_softmax_regression",
    "softmax_probs",
    "tune_raps",
    "synthetic_pt_trial",
]


# ----------------------------------------------------------------------------------------------
# The trick.


class PTResult(NamedTuple):
    """Output of the Prejudicial Trick.

    Attributes:
      sets: the returned sets, same pytree structure as the base method's (leading dim m).
      accepted: [m] bool, True where the base set at the adjusted level was returned.
      alpha_prime: the level of the accepted sets (alpha_high for the relaxed trick).
      alpha_null: the level of the rejected sets (None for the plain trick: the null set).
    """

    sets: Any
    accepted: jax.Array
    alpha_prime: float
    alpha_null: float | None = None


def _check_alpha(alpha) -> float:
    if not isinstance(alpha, (int, float, np.floating, np.integer)) or not 0 < float(alpha) < 1:
        raise ValueError(f"alpha must be a float in (0, 1); got alpha={alpha!r}")
    return float(alpha)


def pt_alpha_prime(alpha: float, p: float) -> float:
    """The adjusted level alpha' = 1 - (1 - alpha) / p of the Prejudicial Trick.

    Args:
      alpha: target miscoverage in (0, 1).
      p: probability of returning a non-null set, in (1 - alpha, 1].

    Returns:
      alpha' in [0, alpha]; exactly `alpha` when p == 1.

    Examples:
      >>> round(pt_alpha_prime(0.1, 0.96), 6)
      0.0625
      >>> pt_alpha_prime(0.1, 1.0)
      0.1
    """
    alpha = _check_alpha(alpha)
    if not isinstance(p, (int, float, np.floating, np.integer)) or not (1.0 - alpha < float(p) <= 1.0):
        raise ValueError(f"p must be a float in (1 - alpha, 1] = ({1.0 - alpha:g}, 1]; got p={p!r}")
    p = float(p)
    if p == 1.0:
        return alpha
    return max(0.0, 1.0 - (1.0 - alpha) / p)


def relaxed_pt_levels(alpha: float, p: float, alpha_low: float) -> tuple[float, float]:
    """Levels (alpha_low, alpha_high) of the relaxed trick: (1 - p) alpha_low + p alpha_high = alpha.

    Args:
      alpha: target miscoverage in (0, 1).
      p: probability of using alpha_high, in (0, 1].
      alpha_low: the miscoverage used with probability 1 - p, in [alpha, 1] (1 = the null set).

    Returns:
      (alpha_low, alpha_high) with alpha_high in [0, alpha].
    """
    alpha = _check_alpha(alpha)
    if not 0.0 < float(p) <= 1.0:
        raise ValueError(f"p must be in (0, 1]; got p={p!r}")
    if not alpha <= float(alpha_low) <= 1.0:
        raise ValueError(f"alpha_low must be in [alpha, 1] = [{alpha:g}, 1]; got alpha_low={alpha_low!r}")
    p, alpha_low = float(p), float(alpha_low)
    if p == 1.0:
        return alpha_low, alpha
    alpha_high = (alpha - (1.0 - p) * alpha_low) / p
    if alpha_high < -1e-12:
        raise ValueError(f"alpha_low={alpha_low} is too large for p={p}: alpha_high = {alpha_high:.4g} < 0; "
                         f"need (1 - p) alpha_low <= alpha")
    return alpha_low, max(0.0, alpha_high)


def pt_accept(key: jax.Array, p: float, num_points: int) -> jax.Array:
    """Fresh U_j ~ Unif[0, 1) per test point; True (keep the base set) where U_j <= p. Shape [m]."""
    if num_points < 1:
        raise ValueError(f"num_points must be >= 1; got {num_points}")
    return jax.random.uniform(key, (num_points,)) <= p


def select_sets(accepted: jax.Array, sets_if_true: Any, sets_if_false: Any) -> Any:
    """Per test point choice between two set pytrees with leading dim m (broadcasting `accepted` [m])."""

    def pick(a, b):
        a, b = jnp.asarray(a), jnp.asarray(b)
        if a.shape != b.shape or a.shape[:1] != accepted.shape:
            raise ValueError(f"sets must share shape [m, ...] with m={accepted.shape[0]}; got {a.shape} and {b.shape}")
        mask = accepted.reshape(accepted.shape + (1,) * (a.ndim - 1))
        return jnp.where(mask, a, b)

    return jax.tree_util.tree_map(pick, sets_if_true, sets_if_false)


def _num_points(sets: Any) -> int:
    leaves = jax.tree_util.tree_leaves(sets)
    if not leaves:
        raise ValueError("sets must contain at least one array")
    return int(jnp.shape(leaves[0])[0])


def prejudicial_trick(base_set_fn: Callable[[float], Any], null_sets: Any, key: jax.Array, *, alpha: float,
                      p: float) -> PTResult:
    """Algorithm 1: the Prejudicial Trick around any conformal method.

    Args:
      base_set_fn: `alpha_level -> sets` of the base method at all m test points (a pytree of arrays
        with leading dim m, e.g. (lower, upper) or a mask [m, k]); calibration data and any base
        randomness are closed over.
      null_sets: the null sets, same structure (e.g. (pred, pred) or an all-False mask).
      key: PRNG key for the per-point U's.
      alpha: target miscoverage in (0, 1).
      p: probability of returning the base set, in (1 - alpha, 1]. With p = 1 the result is the base
        set at `alpha`, bitwise.

    Returns:
      PTResult(sets, accepted [m], alpha_prime).
    """
    alpha_prime = pt_alpha_prime(alpha, p)
    base = base_set_fn(alpha_prime)
    accepted = pt_accept(key, p, _num_points(null_sets))
    return PTResult(select_sets(accepted, base, null_sets), accepted, alpha_prime)


def relaxed_prejudicial_trick(base_set_fn: Callable[[float], Any], key: jax.Array, *, alpha: float, p: float,
                              alpha_low: float) -> PTResult:
    """The relaxed trick (Remark 3.1): base at alpha_low w.p. 1 - p, at alpha_high w.p. p.

    Args:
      base_set_fn: `alpha_level -> sets`, as in `prejudicial_trick`.
      key: PRNG key for the per-point U's.
      alpha: target miscoverage in (0, 1).
      p: probability of the conservative level alpha_high.
      alpha_low: miscoverage (close to 1) used with probability 1 - p; see `relaxed_pt_levels`.

    Returns:
      PTResult(sets, accepted [m] (True = alpha_high), alpha_prime=alpha_high, alpha_null=alpha_low).
    """
    a_low, a_high = relaxed_pt_levels(alpha, p, alpha_low)
    high = base_set_fn(a_high)
    low = base_set_fn(a_low)
    accepted = pt_accept(key, p, _num_points(high))
    return PTResult(select_sets(accepted, high, low), accepted, a_high, a_low)


def _trick(base_set_fn, null_sets, key, alpha, p, alpha_low):
    if alpha_low is None:
        return prejudicial_trick(base_set_fn, null_sets, key, alpha=alpha, p=p)
    return relaxed_prejudicial_trick(base_set_fn, key, alpha=alpha, p=p, alpha_low=alpha_low)


def pt_split_conformal(cal_pred: jax.Array, cal_y: jax.Array, test_pred: jax.Array, key: jax.Array, *,
                       alpha: float, p: float, alpha_low: float | None = None,
                       method: str = "exact") -> PTResult:
    """PT-VCP: the trick around vanilla split conformal; sets are (lower [m], upper [m]).

    The null set is the point interval [pred, pred] (length 0). `alpha_low` switches to the relaxed
    trick. `method` is the quantile reading of `primitives.conformal.conformal_quantile`.
    """
    test_pred = jnp.asarray(test_pred)
    fn = lambda a: cp.split_conformal_interval(cal_pred, cal_y, test_pred, alpha=a, method=method)
    return _trick(fn, (test_pred, test_pred), key, alpha, p, alpha_low)


def pt_cqr(cal_lo: jax.Array, cal_hi: jax.Array, cal_y: jax.Array, test_lo: jax.Array, test_hi: jax.Array,
           key: jax.Array, *, alpha: float, p: float, alpha_low: float | None = None,
           method: str = "exact") -> PTResult:
    """PT-CQR: the trick around conformalized quantile regression; null set = point at the band's middle."""
    test_lo, test_hi = jnp.asarray(test_lo), jnp.asarray(test_hi)
    mid = 0.5 * (test_lo + test_hi)
    fn = lambda a: cp.cqr_interval(cal_lo, cal_hi, cal_y, test_lo, test_hi, alpha=a, method=method)
    return _trick(fn, (mid, mid), key, alpha, p, alpha_low)


def pt_raps(cal_scores: jax.Array, test_probs: jax.Array, key: jax.Array, *, alpha: float, p: float,
            lam: float = 0.0, k_reg: int = 0, randomized: bool = True, allow_zero_sets: bool = False,
            alpha_low: float | None = None, method: str = "exact") -> PTResult:
    """PT-RAPS (PT-APS with lam = 0): the trick around RAPS; sets are masks [m, k], null = empty set.

    Args:
      cal_scores: calibration `primitives.conformal.raps_scores` [n] (same lam, k_reg, randomized).
      test_probs: test probabilities [m, k].
      key: split into the trick's U's and the base method's test randomization.
      alpha, p, alpha_low: as in `prejudicial_trick` / `relaxed_prejudicial_trick`.
      lam, k_reg, randomized, allow_zero_sets: the base RAPS options.
      method: quantile reading.
    """
    test_probs = jnp.asarray(test_probs)
    k_trick, k_base = jax.random.split(key)

    def fn(a):
        q = cp.conformal_quantile(cal_scores, a, method=method)
        return cp.raps_sets(test_probs, q, k_base, lam=lam, k_reg=k_reg, randomized=randomized,
                            allow_zero_sets=allow_zero_sets)

    return _trick(fn, jnp.zeros(test_probs.shape, bool), k_trick, alpha, p, alpha_low)


# ----------------------------------------------------------------------------------------------
# Length theory (float64 numpy; G is any vectorized callable u -> mean length at coverage u).


class CriterionResult(NamedTuple):
    """Outcome of a length-improvement check.

    Attributes:
      holds: whether the criterion certifies that PT is shorter for some p.
      p: the best p on the grid (for the secant check: p = (1 - alpha) / u).
      pt_length: p G((1 - alpha) / p) at that p.
      base_length: G(1 - alpha).
    """

    holds: bool
    p: float
    pt_length: float
    base_length: float


class FirstOrderResult(NamedTuple):
    """Thm. 3.7: holds iff G(q) / q > G'(q) (q = 1 - alpha)."""

    holds: bool
    average_slope: float   # G(q) / q
    slope: float           # G'(q)


def pt_expected_length(G: Callable, alpha: float, p) -> np.ndarray:
    """PT's mean length p G((1 - alpha) / p) for the base length curve G (p scalar or array)."""
    alpha = _check_alpha(alpha)
    p = np.asarray(p, np.float64)
    return p * np.asarray(G((1.0 - alpha) / p), np.float64)


def pt_interval_stability(lengths_at_alpha_prime, p: float) -> float:
    """Prop. 4.2: IS(PT) = p (1 - p) E_X[L(X, (1 - alpha)/p)^2] from base lengths at alpha' [m]."""
    lengths = np.asarray(lengths_at_alpha_prime, np.float64)
    return float(p * (1.0 - p) * np.mean(lengths ** 2))


def pt_subgroup_coverage_gap(miscoverage_fn: Callable, alpha: float, p: float) -> float:
    """Remark 3.5: PT minus base coverage on a subset A, [f_A(alpha) - f_A(alpha')] - (1 - p)(1 - f_A(alpha')).

    Args:
      miscoverage_fn: f_A(level), the base method's miscoverage on A when run at `level`.
      alpha: target miscoverage.
      p: PT probability.
    """
    a_prime = pt_alpha_prime(alpha, p)
    f_a, f_ap = float(miscoverage_fn(alpha)), float(miscoverage_fn(a_prime))
    return (f_a - f_ap) - (1.0 - p) * (1.0 - f_ap)


def _default_p_grid(alpha: float, num: int) -> np.ndarray:
    q = 1.0 - alpha
    return q + (1.0 - q) * np.arange(1, num + 1) / (num + 1)  # strictly inside (q, 1)


def pt_improves_length(G: Callable, alpha: float, *, p_grid: Sequence[float] | None = None,
                       num: int = 999, rtol: float = 1e-12) -> CriterionResult:
    """Lemma 3.6 on a grid: does some p in (1 - alpha, 1) give p G((1 - alpha) / p) < G(1 - alpha)?

    Args:
      G: base mean length as a function of the coverage level u (vectorized over numpy arrays).
      alpha: target miscoverage.
      p_grid: the p's to try (default: `num` equispaced points strictly inside (1 - alpha, 1)).
      num: grid size for the default grid.
      rtol: relative margin below which a decrease does not count (float noise).

    Examples:
      >>> pt_improves_length(sqrt_score_length, 0.1).holds, pt_improves_length(folded_normal_length, 0.1).holds
      (True, False)
    """
    alpha = _check_alpha(alpha)
    grid = _default_p_grid(alpha, num) if p_grid is None else np.asarray(p_grid, np.float64)
    if grid.ndim != 1 or np.any(grid <= 1 - alpha) or np.any(grid > 1):
        raise ValueError(f"p_grid must be 1-D inside (1 - alpha, 1] = ({1 - alpha:g}, 1]; got {grid}")
    base = float(G(1.0 - alpha))
    lengths = pt_expected_length(G, alpha, grid)
    i = int(np.nanargmin(lengths))
    holds = bool(lengths[i] < base * (1.0 - rtol))
    return CriterionResult(holds, float(grid[i]), float(lengths[i]), base)


def first_order_criterion(G: Callable, alpha: float, *, dG: Callable | None = None,
                          step: float = 1e-6) -> FirstOrderResult:
    """Thm. 3.7: G(q) / q > G'(q) at q = 1 - alpha implies that PT is shorter for some p < 1.

    Args:
      G: base mean length curve u -> G(u).
      alpha: target miscoverage.
      dG: its derivative; default a central finite difference with `step` (float64).
      step: finite-difference step.

    Examples:
      >>> first_order_criterion(sqrt_score_length, 0.1).holds   # concave G (Cor. 3.8)
      True
    """
    alpha = _check_alpha(alpha)
    q = 1.0 - alpha
    slope = float(dG(q)) if dG is not None else float((G(q + step) - G(q - step)) / (2 * step))
    avg = float(G(q)) / q
    return FirstOrderResult(bool(avg > slope), avg, slope)


def secant_criterion(G: Callable, alpha: float, *, u_grid: Sequence[float] | None = None,
                     num: int = 999, rtol: float = 1e-12) -> CriterionResult:
    """Thm. 3.10: some u in (q, 1) with G(q)/q > (G(u) - G(q)) / (u - q); then p = q / u shortens.

    Args:
      G: base mean length curve.
      alpha: target miscoverage (q = 1 - alpha).
      u_grid: coverage levels to try (default `num` points strictly inside (q, 1)).
      num: default grid size.
      rtol: relative margin (float noise).

    Returns:
      CriterionResult with p = q / u at the u of the largest margin.
    """
    alpha = _check_alpha(alpha)
    q = 1.0 - alpha
    grid = _default_p_grid(alpha, num) if u_grid is None else np.asarray(u_grid, np.float64)
    if grid.ndim != 1 or np.any(grid <= q) or np.any(grid >= 1):
        raise ValueError(f"u_grid must be 1-D inside (1 - alpha, 1) = ({q:g}, 1); got {grid}")
    gq = float(G(q))
    secant = (np.asarray(G(grid), np.float64) - gq) / (grid - q)
    margin = gq / q - secant
    i = int(np.nanargmax(margin))
    holds = bool(margin[i] > rtol * abs(gq / q))
    p = q / grid[i]
    return CriterionResult(holds, float(p), float(pt_expected_length(G, alpha, p)), gq)


def sqrt_score_length(u) -> np.ndarray:
    """Example 3: scores with P(S <= r) = r^2 on [0, 1] give G(u) = 2 sqrt(u)."""
    return 2.0 * np.sqrt(np.asarray(u, np.float64))


def folded_normal_length(u, *, mu: float = 0.0, sigma: float = 1.0) -> np.ndarray:
    """G(u) = 2 F^{-1}(u) for scores |N(mu, sigma^2)| (equivalently |mu * sign + N(0, sigma^2)|).

    mu = 0 is Example 4 (Gaussian residuals: 2 sigma Phi^{-1}((1 + u)/2), PT always longer); mu > 0 is
    the +-mu mixture of Example 2 or a predictor shifted by a constant bias mu. The quantile of the
    folded normal, F(r) = Phi((r - mu)/sigma) - Phi((-r - mu)/sigma), is found by vectorized bisection
    inside the bracket [mu + sigma Phi^{-1}(u), mu + sigma Phi^{-1}((1 + u)/2)] (float64, to rounding;
    scipy's `foldnorm.ppf` agrees but is about 100x slower).

    Examples:
      >>> round(float(folded_normal_length(0.9)), 4), round(float(folded_normal_length(0.5, mu=10.0)), 4)
      (3.2897, 20.0)
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0; got sigma={sigma}")
    u = np.asarray(u, np.float64)
    if np.any((u < 0) | (u > 1)):
        raise ValueError(f"coverage levels u must lie in [0, 1]; got min {u.min()}, max {u.max()}")
    if mu == 0:
        return 2.0 * sigma * stats.norm.ppf((1.0 + u) / 2.0)
    m = abs(float(mu)) / sigma
    inner = (u > 0) & (u < 1)
    v = np.where(inner, u, 0.5)
    lo = np.maximum(m + stats.norm.ppf(v), 0.0)
    hi = m + stats.norm.ppf((1.0 + v) / 2.0)
    for _ in range(64):                      # bracket width shrinks below float64 resolution
        mid = 0.5 * (lo + hi)
        below = np.where(v > 0.5, stats.norm.sf(mid - m) + stats.norm.cdf(-mid - m) > 1.0 - v,   # tails: sf
                         stats.norm.cdf(mid - m) - stats.norm.cdf(-mid - m) < v)
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    r = np.where(inner, 0.5 * (lo + hi), np.where(u >= 1, np.inf, 0.0))
    return 2.0 * sigma * r


def empirical_length_curve(scores) -> Callable:
    """VCP's G from a sample of scores: u -> 2 * (empirical u-quantile), for the criteria above."""
    s = np.sort(np.asarray(scores, np.float64))
    if s.ndim != 1 or s.size < 2:
        raise ValueError(f"scores must be 1-D with >= 2 entries; got shape {s.shape}")
    return lambda u: 2.0 * np.quantile(s, np.clip(np.asarray(u, np.float64), 0.0, 1.0))


# ----------------------------------------------------------------------------------------------
# Experiment helpers.


def simulate_mixture_regression(key: jax.Array, n: int, *, mu, beta: Sequence[float] = (1.0, 1.0),
                                noise_sd: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Example 2 / App. D.1.1: Y = X^T beta + eps, X ~ N(0, I_d), eps = +-mu + N(0, noise_sd^2) (signs 1/2 each).

    mu = 0 is the correctly specified Gaussian case (Fig. 5); `mu` may be traced (vmap over it).

    Returns:
      x [n, d], y [n] (float32).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    beta = jnp.asarray(beta, jnp.float32)
    if beta.ndim != 1:
        raise ValueError(f"beta must be 1-D [d]; got shape {beta.shape}")
    kz, ks = jax.random.split(key)
    z = jax.random.normal(kz, (n, beta.shape[0] + 1))     # features and the Gaussian part of the noise
    x = z[:, :-1]
    sign = jnp.where(jax.random.uniform(ks, (n,)) < 0.5, 1.0, -1.0)
    eps = sign * mu + noise_sd * z[:, -1]
    return x, x @ beta + eps


def fit_linear(x: jax.Array, y: jax.Array, *, ridge: float = 0.0) -> jax.Array:
    """Least squares (ridge >= 0, intercept unpenalized) with intercept; returns coef [d + 1] (intercept last)."""
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
    if x.ndim != 2 or y.shape != x.shape[:1]:
        raise ValueError(f"x must be [n, d] and y [n]; got x {x.shape}, y {y.shape}")
    xm, ym = jnp.mean(x, axis=0), jnp.mean(y)
    xc, yc = x - xm, y - ym
    if ridge > 0:
        d = x.shape[1]
        w = jnp.linalg.solve(xc.T @ xc + ridge * jnp.eye(d), xc.T @ yc)
    else:
        w = jnp.linalg.lstsq(xc, yc)[0]
    return jnp.concatenate([w, (ym - xm @ w)[None]])


def predict_linear(coef: jax.Array, x: jax.Array) -> jax.Array:
    """x @ coef[:-1] + coef[-1] for coef [d + 1] ([m]) or a stack coef [t, d + 1] ([t, m])."""
    coef, x = jnp.asarray(coef), jnp.asarray(x)
    if coef.shape[-1] != x.shape[-1] + 1:
        raise ValueError(f"coef must have last dim d + 1 = {x.shape[-1] + 1}; got {coef.shape}")
    return jnp.einsum("md,...d->...m", x, coef[..., :-1]) + coef[..., -1:]


def fit_linear_quantiles(x: jax.Array, y: jax.Array, taus: Sequence[float], *, steps: int = 1500,
                         learning_rate: float = 0.05, ridge: float = 0.0) -> jax.Array:
    """Linear quantile regression at levels `taus` by Adam on the pinball loss (CQR's base model).

    Starts from the least-squares fit shifted to the empirical tau-quantile of its residuals, then
    minimizes mean pinball loss + ridge * |w|^2 with a cosine-decayed Adam (full batch).

    Returns:
      coef [t, d + 1] (intercept last), usable with `predict_linear`.
    """
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
    taus_np = np.asarray(taus, np.float64)   # static: validated with numpy, also inside jit
    if taus_np.ndim != 1 or np.any((taus_np <= 0) | (taus_np >= 1)):
        raise ValueError(f"taus must be 1-D in (0, 1); got {taus}")
    taus_arr = jnp.asarray(taus_np, jnp.float32)
    scale = jnp.std(y) + 1e-6
    ys = y / scale
    ls = fit_linear(x, ys)
    resid = ys - predict_linear(ls, x)
    init = jnp.tile(ls[None], (taus_arr.shape[0], 1))
    init = init.at[:, -1].add(jnp.quantile(resid, taus_arr))

    def loss(coef):
        r = ys[None, :] - predict_linear(coef, x)                  # [t, n]
        pin = jnp.maximum(taus_arr[:, None] * r, (taus_arr[:, None] - 1.0) * r)
        return jnp.sum(jnp.mean(pin, axis=1)) + ridge * jnp.sum(coef[:, :-1] ** 2)

    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    def step(carry, _):
        coef, state = carry
        g = jax.grad(loss)(coef)
        upd, state = opt.update(g, state, coef)
        return (optax.apply_updates(coef, upd), state), None

    (coef, _), _ = jax.lax.scan(step, (init, opt.init(init)), None, length=steps)
    return coef * scale


def fit_softmax_regression(x: jax.Array, labels: jax.Array, num_classes: int, *, l2: float = 1e-3,
                           steps: int = 500, learning_rate: float = 0.1) -> tuple[jax.Array, jax.Array]:
    """Multinomial logistic regression by full-batch Adam; returns (W [d, k], b [k])."""
    x = jnp.asarray(x, jnp.float32)
    labels = jnp.asarray(labels, jnp.int32)
    if x.ndim != 2 or labels.shape != x.shape[:1]:
        raise ValueError(f"x must be [n, d] and labels [n]; got x {x.shape}, labels {labels.shape}")
    params = (jnp.zeros((x.shape[1], num_classes)), jnp.zeros((num_classes,)))
    onehot = jax.nn.one_hot(labels, num_classes)

    def loss(pr):
        w, b = pr
        logp = jax.nn.log_softmax(x @ w + b)
        return -jnp.mean(jnp.sum(onehot * logp, axis=1)) + l2 * jnp.sum(w ** 2)

    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    def step(carry, _):
        pr, state = carry
        g = jax.grad(loss)(pr)
        upd, state = opt.update(g, state, pr)
        return (optax.apply_updates(pr, upd), state), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
    return params


def softmax_probs(params: tuple[jax.Array, jax.Array], x: jax.Array, *, logit_bias: jax.Array | None = None
                  ) -> jax.Array:
    """Class probabilities [m, k] of a softmax regression, with an optional additive logit bias [k]."""
    w, b = params
    logits = jnp.asarray(x, jnp.float32) @ w + b
    if logit_bias is not None:
        logits = logits + jnp.asarray(logit_bias, jnp.float32)
    return jax.nn.softmax(logits, axis=-1)


def tune_raps(probs: jax.Array, labels: jax.Array, key: jax.Array, *, alpha: float,
              lam_grid: Sequence[float] = (0.001, 0.01, 0.1, 0.2, 0.5), randomized: bool = True
              ) -> tuple[float, int]:
    """RAPS parameters by the 'size' criterion of Angelopoulos et al. on a tuning split.

    k_reg is the conformal (1 - alpha) quantile of the true labels' ranks; lam is the grid value with
    the smallest mean set size when RAPS is calibrated on one half of the tuning data and evaluated
    on the other. Use a split disjoint from the calibration data to keep the guarantee.

    Returns:
      (lam, k_reg) as Python numbers.
    """
    probs, labels = jnp.asarray(probs), jnp.asarray(labels, jnp.int32)
    n = probs.shape[0]
    if n < 4:
        raise ValueError(f"need at least 4 tuning points; got {n}")
    order = jnp.argsort(-probs, axis=1, stable=True)
    ranks = jnp.argmax(order == labels[:, None], axis=1) + 1
    q_rank = float(cp.conformal_quantile(ranks.astype(jnp.float32), alpha))
    k_reg = int(min(q_rank, probs.shape[1])) if np.isfinite(q_rank) else probs.shape[1]
    half = n // 2
    k_cal, k_test = jax.random.split(key)
    sizes = []
    for lam in lam_grid:
        s = cp.raps_scores(probs[:half], labels[:half], k_cal, lam=lam, k_reg=k_reg, randomized=randomized)
        q = cp.conformal_quantile(s, alpha)
        sets = cp.raps_sets(probs[half:], q, k_test, lam=lam, k_reg=k_reg, randomized=randomized,
                            allow_zero_sets=False)
        sizes.append(float(jnp.mean(cp.set_size(sets))))
    return float(lam_grid[int(np.argmin(sizes))]), int(k_reg)


def synthetic_pt_trial(key: jax.Array, mu, *, n: int = 2000, test_fraction: float = 0.2,
                       alphas: Sequence[float] = (0.05, 0.1, 0.15, 0.2),
                       ps: Sequence[float] = (0.96, 0.97, 0.98, 0.99, 1.0), beta: Sequence[float] = (1.0, 1.0),
                       alpha_low: float | None = None, method: str = "exact") -> dict[str, jax.Array]:
    """One seed of the synthetic study (App. D.1.1): VCP and PT-VCP around a misspecified OLS fit.

    n points of `simulate_mixture_regression`; the last `test_fraction` are test points, the rest is
    split in half (train / calibration) at random; OLS with intercept on the train half. jit/vmap
    friendly over (key, mu) with the keyword options static.

    Returns:
      dict with vcp_coverage [a], vcp_length [a], pt_coverage [a, p], pt_length [a, p] and, when
      `alpha_low` is given, relaxed_coverage / relaxed_length [a, p] (pairs with alpha_high < 0 give nan).
    """
    k_data, k_split, k_pt, k_rel = jax.random.split(key, 4)
    x, y = simulate_mixture_regression(k_data, n, mu=mu, beta=beta)
    n_test = int(round(n * test_fraction))
    n_fit = n - n_test
    half = n_fit // 2
    perm = jnp.argsort(jax.random.uniform(k_split, (n_fit,)))     # a uniform random split
    tr, ca = perm[:half], perm[half:2 * half]
    coef = fit_linear(x[tr], y[tr])
    cal_pred, cal_y = predict_linear(coef, x[ca]), y[ca]
    test_pred, test_y = predict_linear(coef, x[n_fit:]), y[n_fit:]

    def metrics(lo, hi):
        return jnp.mean(cp.interval_covers(lo, hi, test_y)), jnp.mean(cp.interval_length(lo, hi))

    out: dict[str, list] = {"vcp_coverage": [], "vcp_length": [], "pt_coverage": [], "pt_length": [],
                            "relaxed_coverage": [], "relaxed_length": []}
    for i, a in enumerate(alphas):
        c, l = metrics(*cp.split_conformal_interval(cal_pred, cal_y, test_pred, alpha=a, method=method))
        out["vcp_coverage"].append(c)
        out["vcp_length"].append(l)
        pc, pl, rc, rl = [], [], [], []
        for j, pr in enumerate(ps):
            res = pt_split_conformal(cal_pred, cal_y, test_pred, jax.random.fold_in(k_pt, i * len(ps) + j),
                                     alpha=a, p=pr, method=method)
            c, l = metrics(*res.sets)
            pc.append(c)
            pl.append(l)
            if alpha_low is not None:
                if (1.0 - pr) * alpha_low <= a:
                    rel = pt_split_conformal(cal_pred, cal_y, test_pred, jax.random.fold_in(k_rel, i * len(ps) + j),
                                             alpha=a, p=pr, alpha_low=alpha_low, method=method)
                    c, l = metrics(*rel.sets)
                else:
                    c = l = jnp.float32(jnp.nan)
                rc.append(c)
                rl.append(l)
        out["pt_coverage"].append(jnp.stack(pc))
        out["pt_length"].append(jnp.stack(pl))
        if alpha_low is not None:
            out["relaxed_coverage"].append(jnp.stack(rc))
            out["relaxed_length"].append(jnp.stack(rl))
    return {k: jnp.stack(v) for k, v in out.items() if v}
