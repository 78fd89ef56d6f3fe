"""The sparse data-constrained scaling law L(N, U, D, s), its 4-stage fit and its optimal-density analyses.

The law (float64 numpy; symbols as in the paper's released fitting notebook):

    L(N, U, D, s) = E + A f(s) / N'^alpha + B / D'^beta,        beta = alpha (tied)
    f(s)   = s^eps + c (1 - s)^mu                               (density factor, f(1) = 1)
    G(s)   = (alpha A f(s) / (beta B))^(1 / (alpha + beta))
    N_opt(C, s) = G (C/6)^(beta/(alpha+beta)),  D_opt(C, s) = (C/6)^(alpha/(alpha+beta)) / G
    C_U(s) = 6 (G U)^((alpha+beta)/alpha)                       (compute at which U is the optimal data)
    U_N    = min(N, N_opt(C_U, s))                              ("useful" parameters for U unique tokens)
    R_N    = max(N / U_N - 1, 0),   R_D = max(D / U - 1, 0)     (excess parameters, repeated epochs)
    R_N*(s) = gamma1 (1 + c11 (1-s) - c21 (1-s)^2)
    R_D*(s) = gamma2 (1 + c12 (1-s) - c22 (1-s)^2)
    N' = U_N + U_N R_N* (1 - exp(-R_N / R_N*)),  D' = U + U R_D* (1 - exp(-R_D / R_D*))

At s = 1 it is exactly the dense data-constrained law of Muennighoff et al. (2023) with decay
constants R_N* = gamma1, R_D* = gamma2, and with R_N = R_D = 0 it is Chinchilla's E + A/N^a + B/D^b.

Dimension legend: every function broadcasts its array arguments against each other (numpy rules);
`N` active (non-zero) parameters, `U` unique tokens, `D` total training tokens (= epochs * U),
`s` density (fraction of non-zero weights; sparsity = 1 - s), `C` training FLOPs (C = 6 N D).

Public names:
  LawParams, PUBLISHED, PUBLISHED_STAGE4_PRINTOUT: constants (frozen dataclass).
  density_factor, r_n_star, r_d_star, optimal_n, optimal_d, tokens_to_compute, useful_params,
  effective_params, effective_tokens, loss: the law and its pieces.
  log_loss_stage1 / _stage2 / _full: the parameterisations the stages fit (log-sum-exp forms).
  FitConfig, FitResult, fit_law: the 4-stage Huber / L-BFGS fit (scipy, float64, grid of inits).
  loss_optimal_density, compute_optimal_density, best_loss_at_compute: the two density analyses.
  published_findings: the paper's derived numbers evaluated from the constants.

References:
  "When Data Is Scarce: Scaling Sparse Language Models with Repeated Training" (ICML 2026; no arXiv id
  found), official code boqian333/sparse-dc-scaling (fitting/fitting.ipynb, figures/optimal_sparsity.ipynb).
  Muennighoff et al., "Scaling Data-Constrained Language Models", arXiv:2305.16264 (2023).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Iterable, Sequence

import numpy as np
import threadpoolctl
from scipy import optimize

__all__ = [
    "LawParams",
    "PUBLISHED",
    "PUBLISHED_STAGE4_PRINTOUT",
    "density_factor",
    "r_n_star",
    "r_d_star",
    "optimal_n",
    "optimal_d",
    "tokens_to_compute",
    "useful_params",
    "effective_params",
    "effective_tokens",
    "loss",
    "chinchilla_loss",
    "log_loss_stage1",
    "log_loss_stage2",
    "log_loss_full",
    "huber",
    "FitConfig",
    "FitResult",
    "fit_law",
    "loss_optimal_density",
    "best_loss_at_compute",
    "compute_optimal_density",
    "published_findings",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LawParams:
    """Constants of the sparse data-constrained law (A = e^a, B = e^b, E = e^e, beta = alpha).

    Attributes:
      a, b, e: log of the parameter-term, data-term and irreducible-loss coefficients.
      alpha: exponent of both N' and D' (beta is tied to alpha, as in the paper's fit).
      epsilon, mu, c: density factor f(s) = s^epsilon + c (1 - s)^mu.
      gamma1, gamma2: dense decay constants R_N*(1), R_D*(1).
      c11, c21: R_N*(s) = gamma1 (1 + c11 (1-s) - c21 (1-s)^2).
      c12, c22: R_D*(s) = gamma2 (1 + c12 (1-s) - c22 (1-s)^2).
    """

    a: float
    b: float
    e: float
    alpha: float
    epsilon: float = 0.0
    mu: float = 1.0
    c: float = 0.0
    gamma1: float = 1.0
    gamma2: float = 1.0
    c11: float = 0.0
    c12: float = 0.0
    c21: float = 0.0
    c22: float = 0.0

    @property
    def beta(self) -> float:
        return self.alpha

    @property
    def A(self) -> float:  # noqa: N802 - the paper's symbol
        return math.exp(self.a)

    @property
    def B(self) -> float:  # noqa: N802
        return math.exp(self.b)

    @property
    def E(self) -> float:  # noqa: N802
        return math.exp(self.e)


# The constants hard-coded in the paper's figures/optimal_sparsity.ipynb (stage 2 outputs of the
# fitting notebook plus its stage 3 gammas; c11..c22 as in the plotting notebook).
PUBLISHED = LawParams(
    a=5.24073718, b=6.10303089, e=0.85355013, alpha=0.32682177,
    epsilon=-0.00968044, mu=0.84661793, c=-0.27288932,
    gamma1=11.08763712, gamma2=4.40474882,
    c11=1.90420893, c12=1.82159486, c21=2.79936732, c22=1.36557887,
)
# The fitting notebook's own stage-4 printout (differs from PUBLISHED in the 4th decimal).
PUBLISHED_STAGE4_PRINTOUT = dataclasses.replace(PUBLISHED, c11=1.90396, c12=1.82138, c21=2.79909, c22=1.36531)


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _check_density(s) -> np.ndarray:
    s = _arr(s)
    if np.any(~np.isfinite(s)) or np.any(s <= 0) or np.any(s > 1):
        raise ValueError(f"density must lie in (0, 1]; got values in [{np.min(s)}, {np.max(s)}]")
    return s


def _check_positive(name: str, x) -> np.ndarray:
    x = _arr(x)
    if np.any(~np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"{name} must be finite and > 0; got min {np.min(x)}")
    return x


def density_factor(s, p: LawParams = PUBLISHED) -> np.ndarray:
    """f(s) = s^epsilon + c (1 - s)^mu; f(1) = 1.

    Examples:
      >>> round(float(density_factor(0.5)), 4)
      0.855
    """
    s = _check_density(s)
    return s ** p.epsilon + p.c * (1.0 - s) ** p.mu


def r_n_star(s, p: LawParams = PUBLISHED) -> np.ndarray:
    """R_N*(s) = gamma1 (1 + c11 (1-s) - c21 (1-s)^2), the decay constant of excess parameters."""
    q = 1.0 - _check_density(s)
    return p.gamma1 * (1.0 + p.c11 * q - p.c21 * q ** 2)


def r_d_star(s, p: LawParams = PUBLISHED) -> np.ndarray:
    """R_D*(s) = gamma2 (1 + c12 (1-s) - c22 (1-s)^2), how many repeated epochs keep paying off.

    Examples:
      >>> [round(float(r_d_star(s)), 2) for s in (1.0, 0.5)]
      [4.4, 6.91]
    """
    q = 1.0 - _check_density(s)
    return p.gamma2 * (1.0 + p.c12 * q - p.c22 * q ** 2)


def _g(s, p: LawParams) -> np.ndarray:
    f = density_factor(s, p)
    if np.any(f <= 0):
        raise ValueError(f"the density factor f(s) must be > 0 for the allocation; got min {np.min(f)}")
    return (p.alpha * p.A * f / (p.beta * p.B)) ** (1.0 / (p.alpha + p.beta))


def optimal_n(C, s=1.0, p: LawParams = PUBLISHED) -> np.ndarray:
    """Compute-optimal active parameters N_opt(C, s) = G(s) (C/6)^(beta/(alpha+beta))."""
    C = _check_positive("C", C)
    return _g(s, p) * (C / 6.0) ** (p.beta / (p.alpha + p.beta))


def optimal_d(C, s=1.0, p: LawParams = PUBLISHED) -> np.ndarray:
    """Compute-optimal tokens D_opt(C, s) = (C/6)^(alpha/(alpha+beta)) / G(s); N_opt D_opt 6 = C."""
    C = _check_positive("C", C)
    return (C / 6.0) ** (p.alpha / (p.alpha + p.beta)) / _g(s, p)


def tokens_to_compute(D, s=1.0, p: LawParams = PUBLISHED) -> np.ndarray:
    """The compute C at which D is the optimal data size: inverse of `optimal_d` (C_U when D = U)."""
    D = _check_positive("D", D)
    return 6.0 * (_g(s, p) * D) ** ((p.alpha + p.beta) / p.alpha)


def useful_params(N, U, s=1.0, p: LawParams = PUBLISHED) -> np.ndarray:
    """U_N = min(N, N_opt(C_U, s)): the parameters U unique tokens can use compute-optimally."""
    N = _check_positive("N", N)
    return np.minimum(N, optimal_n(tokens_to_compute(U, s, p), s, p))


def effective_params(N, U, s=1.0, p: LawParams = PUBLISHED) -> np.ndarray:
    """N' = U_N + U_N R_N* (1 - exp(-R_N / R_N*)), R_N = max(N / U_N - 1, 0)."""
    un = useful_params(N, U, s, p)
    rn = np.maximum(_arr(N) / un - 1.0, 0.0)
    ns = r_n_star(s, p)
    return un + un * ns * (1.0 - np.exp(-rn / ns))


def effective_tokens(U, D, s=1.0, p: LawParams = PUBLISHED) -> np.ndarray:
    """D' = U + U R_D* (1 - exp(-R_D / R_D*)), R_D = max(D / U - 1, 0); D' <= U (1 + R_D*).

    Examples:
      >>> float(effective_tokens(1e9, 1e9))  # one epoch: no repetition
      1000000000.0
    """
    U, D = _check_positive("U", U), _check_positive("D", D)
    rd = np.maximum(D / U - 1.0, 0.0)
    ds = r_d_star(s, p)
    return U + U * ds * (1.0 - np.exp(-rd / ds))


def loss(N, U, D, s=1.0, p: LawParams = PUBLISHED) -> np.ndarray:
    """L(N, U, D, s) = E + A f(s) / N'^alpha + B / D'^beta (validation loss in nats/token).

    Args:
      N: active (non-zero) parameters. The paper multiplies the whole parameter count (dense
        embeddings included) by s; pass N_total * s to match it.
      U: unique tokens (U <= D; pass min(U, D) when fewer than U tokens are seen).
      D: total training tokens.
      s: density in (0, 1].
      p: the law's constants.

    Returns:
      The predicted loss, broadcast over the inputs (float64).

    Examples:
      >>> round(float(loss(1e9, 2e10, 2e10)), 4)  # dense, one epoch
      2.7563
    """
    f = density_factor(s, p)
    return (p.E + p.A * f / effective_params(N, U, s, p) ** p.alpha
            + p.B / effective_tokens(U, D, s, p) ** p.beta)


def chinchilla_loss(N, D, p: LawParams = PUBLISHED) -> np.ndarray:
    """E + A / N^alpha + B / D^beta: the law without density or repetition terms."""
    return p.E + p.A / _check_positive("N", N) ** p.alpha + p.B / _check_positive("D", D) ** p.beta


# ----------------------------------------------------------------------------------------------
# The parameterisations fitted by the four stages (the notebook's log-sum-exp forms).

_STAGE_FIELDS = {
    1: ("a", "b", "e", "alpha"),
    2: ("a", "b", "e", "alpha", "epsilon", "mu", "c"),
    3: ("gamma1", "gamma2"),
    4: ("c11", "c12", "c21", "c22"),
}


def _lse3(x, y, z) -> np.ndarray:
    x, y, z = np.broadcast_arrays(x, y, z)
    m = np.maximum(np.maximum(x, y), z)
    return m + np.log(np.exp(x - m) + np.exp(y - m) + np.exp(z - m))


def log_loss_stage1(p: LawParams, N, D) -> np.ndarray:
    """log(E + A / N^alpha + B / D^alpha): stage 1 (dense, single epoch)."""
    N, D = _arr(N), _arr(D)
    return _lse3(p.a - p.alpha * np.log(N), p.b - p.beta * np.log(D), p.e)


def log_loss_stage2(p: LawParams, N, D, s) -> np.ndarray:
    """log(E + A f(s) / N^alpha + B / D^alpha): stage 2 (all single-epoch runs; N active)."""
    N, D = _arr(N), _arr(D)
    s = np.clip(_arr(s), 1e-8, 1.0)
    f = np.maximum(s ** p.epsilon + p.c * (1.0 - s) ** p.mu, 1e-12)  # the notebook's clamp
    return _lse3(p.a - p.alpha * np.log(N) + np.log(f), p.b - p.beta * np.log(D), p.e)


def log_loss_full(p: LawParams, N, U, D, s) -> np.ndarray:
    """log L(N, U, D, s) of the full law (stages 3 and 4), in log-sum-exp form."""
    N, U, D, s = _arr(N), _arr(U), _arr(D), _arr(s)
    with np.errstate(all="ignore"):  # the optimiser may probe constants where the law is undefined
        f = s ** p.epsilon + p.c * (1.0 - s) ** p.mu
        g = np.exp((p.a - p.b + np.log(np.maximum(f, 1e-12))) / (2.0 * p.alpha))  # alpha = beta
        c_u = 6.0 * (g * U) ** ((p.alpha + p.beta) / p.alpha)
        un = np.minimum(N, g * (c_u / 6.0) ** (p.beta / (p.alpha + p.beta)))
        rn, rd = np.maximum(N / un - 1.0, 0.0), np.maximum(D / U - 1.0, 0.0)
        q = 1.0 - s
        ns = p.gamma1 * (1.0 + q * p.c11 - p.c21 * q ** 2)
        ds = p.gamma2 * (1.0 + q * p.c12 - p.c22 * q ** 2)
        n_eff = un + un * ns * -np.expm1(-rn / ns)
        d_eff = U + U * ds * -np.expm1(-rd / ds)
        out = _lse3(p.a + np.log(np.maximum(f, 1e-12)) - p.alpha * np.log(n_eff),
                    p.b - p.beta * np.log(d_eff), p.e)
    return out


def huber(residual, delta: float) -> np.ndarray:
    """Elementwise Huber: r^2 / 2 for |r| <= delta, delta (|r| - delta / 2) beyond (torch's convention)."""
    r = np.abs(_arr(residual))
    return np.where(r <= delta, 0.5 * r * r, delta * (r - 0.5 * delta))


# ----------------------------------------------------------------------------------------------
# Fitting.


def _spec_grids() -> dict[int, dict[str, tuple[float, ...]]]:
    ls = lambda lo, hi, n: tuple(np.linspace(lo, hi, n).tolist())  # noqa: E731
    return {
        1: {"a": ls(0, 10, 5), "b": ls(0, 10, 5), "e": ls(-1, 1, 4), "alpha": ls(0, 1, 4)},
        2: {"epsilon": ls(-2, 2, 5), "mu": ls(-2, 2, 5), "c": ls(-2, 2, 5)},
        3: {"gamma1": ls(1, 20, 10), "gamma2": ls(1, 20, 10)},
        4: {"c11": ls(-2, 2, 5), "c12": ls(-2, 2, 5), "c21": ls(-2, 2, 5), "c22": ls(-2, 2, 5)},
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitConfig:
    """Settings of the 4-stage fit (defaults: the paper's notebook).

    Attributes:
      delta: Huber threshold on log-loss residuals (1e-3 in the paper; summed over points).
      grids: stage -> {field: grid of initial values}; stage 2 starts a, b, e, alpha from stage 1's
        result and grids epsilon, mu, c; stages 3 and 4 freeze the earlier constants. None = the
        paper's grids (400, 125, 100 and 625 initialisations).
      maxiter: L-BFGS iterations per initialisation (scipy L-BFGS-B, float64, numerical gradients).
      stages: which stages to run; a skipped stage (or one without data) keeps `init`'s values.
      init: values of constants that are not fitted (defaults give f = 1 and constant R*).
    """

    delta: float = 1e-3
    grids: dict | None = None
    maxiter: int = 300
    stages: tuple[int, ...] = (1, 2, 3, 4)
    init: LawParams = LawParams(a=0.0, b=0.0, e=0.0, alpha=0.5, gamma1=5.0, gamma2=5.0)

    def __post_init__(self):
        if self.delta <= 0:
            raise ValueError(f"delta must be > 0; got {self.delta}")
        bad = [s for s in self.stages if s not in _STAGE_FIELDS]
        if bad:
            raise ValueError(f"stages must be a subset of (1, 2, 3, 4); got {self.stages}")

    def grid(self, stage: int) -> dict[str, tuple[float, ...]]:
        g = _spec_grids()[stage]
        if self.grids is not None and stage in self.grids:
            g = dict(g, **{k: tuple(v) for k, v in self.grids[stage].items()})
        return g


@dataclasses.dataclass(frozen=True)
class FitResult:
    """Output of `fit_law`.

    Attributes:
      params: the fitted LawParams.
      stage_losses: stage -> best summed Huber objective.
      stage_points: stage -> number of data points the stage used.
      r2: R^2 of the full law's predicted loss on all points.
      max_abs_log_error: max |log L_hat - log L| over all points.
    """

    params: LawParams
    stage_losses: dict
    stage_points: dict
    r2: float
    max_abs_log_error: float


def _stage_masks(N, U, D, s, tol=1e-9):
    single = D <= U * (1 + tol)
    dense = np.isclose(s, 1.0)
    return {1: single & dense, 2: single, 3: dense & ~single, 4: ~dense & ~single}


def _minimize(obj, x0: np.ndarray, maxiter: int) -> tuple[float, np.ndarray]:
    with np.errstate(all="ignore"):
        res = optimize.minimize(obj, x0, jac=True, method="L-BFGS-B",
                                options={"maxiter": maxiter, "ftol": 1e-12, "gtol": 1e-8, "maxls": 50})
    val = float(res.fun) if np.isfinite(res.fun) else math.inf
    return val, np.asarray(res.x, np.float64)


def fit_law(N, U, D, s, observed_loss, *, config: FitConfig = FitConfig(), progress: bool = False) -> FitResult:
    """Fits the law in the paper's four stages (Huber on log loss, L-BFGS, grid of initialisations).

    Stage 1: dense single-epoch points (D <= U, s = 1) fit a, b, e, alpha with N' = N, D' = D.
    Stage 2: all single-epoch points fit a, b, e, alpha, epsilon, mu, c from stage 1's values.
    Stage 3: dense multi-epoch points (D > U) fit gamma1, gamma2, the rest frozen.
    Stage 4: sparse multi-epoch points fit c11, c12, c21, c22, the rest frozen.
    Each stage keeps the best of its grid of initialisations.

    Args:
      N: [n] active parameters per run.
      U: [n] unique tokens seen (min(U, D)).
      D: [n] total tokens.
      s: [n] densities in (0, 1].
      observed_loss: [n] validation losses (> 0).
      config: FitConfig.
      progress: tqdm bar over initialisations.

    Returns:
      FitResult.

    Raises:
      ValueError: mismatched lengths, non-positive inputs, or stage 1/2 without data.
    """
    N, U, D, L = (_check_positive(k, v).ravel() for k, v in (("N", N), ("U", U), ("D", D),
                                                               ("observed_loss", observed_loss)))
    s = _check_density(s).ravel()
    n = N.size
    if not all(x.size == n for x in (U, D, s, L)):
        raise ValueError(f"N, U, D, s, observed_loss must have equal lengths; got "
                         f"{[x.size for x in (N, U, D, s, L)]}")
    if np.any(U > D * (1 + 1e-9)):
        raise ValueError("U must be <= D for every point (pass min(U, D) as the unique tokens seen)")
    y = np.log(L)
    masks = _stage_masks(N, U, D, s)
    params = config.init
    stage_losses, stage_points = {}, {}

    def run_stage(stage, fields, grid, base, model):
        idx = masks[stage]
        stage_points[stage] = int(idx.sum())
        if stage_points[stage] == 0:
            if stage in (1, 2):
                raise ValueError(f"stage {stage} needs single-epoch points (D <= U{', s = 1' if stage == 1 else ''}); "
                                 "got none")
            return base
        args = tuple(a[idx] for a in (N, U, D, s))
        yy = y[idx]

        k = len(fields)
        steps = np.concatenate([np.zeros((1, k)), np.eye(k), -np.eye(k)])

        def obj(x):
            # Value and central-difference gradient from one vectorised evaluation: the constants
            # are [2k+1, 1] columns broadcast against the data. Scaled by 1 / delta^2 (same argmin)
            # so that the L-BFGS tolerances act on an O(1) objective.
            h = 1e-6 * np.maximum(1.0, np.abs(x))
            xs = x[None, :] + steps * h[None, :]
            q = dataclasses.replace(base, **{f: xs[:, i:i + 1] for i, f in enumerate(fields)})
            r = model(q, *args) - yy[None, :]
            v = np.sum(huber(r, config.delta), axis=1) / config.delta ** 2
            if not np.all(np.isfinite(v)):
                return 1e30, np.zeros(k)
            return float(v[0]), (v[1:k + 1] - v[k + 1:]) / (2.0 * h)

        names = list(grid)
        starts = list(itertools.product(*(grid[k] for k in names)))
        from tqdm.auto import tqdm
        best = (math.inf, None)
        for start in tqdm(starts, desc=f"fit stage {stage}", disable=not progress, leave=False):
            x0 = np.array([dict(zip(names, start)).get(f, getattr(base, f)) for f in fields], np.float64)
            val, x = _minimize(obj, x0, config.maxiter)
            if val < best[0]:
                best = (val, x)
        if best[1] is None:
            raise ValueError(f"stage {stage}: no initialisation gave a finite objective")
        stage_losses[stage] = best[0] * config.delta ** 2
        return dataclasses.replace(base, **dict(zip(fields, best[1].tolist())))

    models = {
        1: lambda q, n_, u_, d_, s_: log_loss_stage1(q, n_, d_),
        2: lambda q, n_, u_, d_, s_: log_loss_stage2(q, n_, d_, s_),
        3: lambda q, n_, u_, d_, s_: log_loss_full(q, n_, u_, d_, s_),
        4: lambda q, n_, u_, d_, s_: log_loss_full(q, n_, u_, d_, s_),
    }
    # L-BFGS-B's small dense algebra goes through BLAS; multithreaded BLAS on a busy machine makes
    # each 4-parameter iteration milliseconds slower (16x measured), so fit single-threaded.
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        for stage in sorted(config.stages):
            grid = config.grid(stage)
            fields = _STAGE_FIELDS[stage]
            if stage == 2:
                grid = {k: v for k, v in grid.items() if k in ("epsilon", "mu", "c")}
            params = run_stage(stage, fields, grid, params, models[stage])

    pred = log_loss_full(params, N, U, D, s)
    resid = pred - y
    ss_res = float(np.sum((np.exp(pred) - L) ** 2))
    ss_tot = float(np.sum((L - L.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return FitResult(params, stage_losses, stage_points, r2, float(np.max(np.abs(resid))))


# ----------------------------------------------------------------------------------------------
# Optimal-density analyses.


def _densities(lo: float, hi: float, num: int) -> np.ndarray:
    if not 0 < lo < hi <= 1:
        raise ValueError(f"need 0 < density_min < density_max <= 1; got {lo}, {hi}")
    if num < 3:
        raise ValueError(f"num_densities must be >= 3; got {num}")
    return np.linspace(lo, hi, num)


def _refine_min(fun, grid: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """Grid argmin refined by a bounded Brent search on the neighbouring grid interval."""
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = optimize.minimize_scalar(fun, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    if res.fun <= values[i]:
        return float(res.x), float(res.fun)
    return float(grid[i]), float(values[i])


def loss_optimal_density(n_total: float, unique_tokens: float, epochs: float, p: LawParams = PUBLISHED, *,
                         density_min: float = 0.05, density_max: float = 1.0,
                         num_densities: int = 192) -> tuple[float, float]:
    """At fixed data (U, epochs) and fixed *total* parameters, the density minimising L(N_total s, U, eU, s).

    Returns:
      (s*, L(s*)).

    Examples:
      >>> s, _ = loss_optimal_density(1e8, 1.3e9, 16)
      >>> round(s, 2)
      0.79
    """
    _check_positive("n_total", n_total), _check_positive("unique_tokens", unique_tokens)
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1; got {epochs}")
    grid = _densities(density_min, density_max, num_densities)
    fun = lambda x: float(loss(n_total * x, unique_tokens, epochs * unique_tokens, x, p))  # noqa: E731
    return _refine_min(fun, grid, np.array([fun(x) for x in grid]))


def best_loss_at_compute(C: float, unique_tokens: float, s: float, p: LawParams = PUBLISHED, *,
                         log10_n_range: tuple[float, float] | None = None,
                         num_points: int = 801) -> tuple[float, float]:
    """min over the N/D split of L(N, min(U, D), D, s) with D = C / (6 N) (repetition when D > U).

    Returns:
      (loss, N at the optimum).
    """
    C = float(_check_positive("C", C))
    if log10_n_range is None:
        centre = math.log10(float(optimal_n(C, s, p)))
        log10_n_range = (centre - 4.0, centre + 4.0)
    x = np.linspace(*log10_n_range, num_points)

    def fun(lx):
        n = 10.0 ** lx
        d = C / (6.0 * n)
        return loss(n, np.minimum(unique_tokens, d), d, s, p)

    vals = fun(x)
    lx, val = _refine_min(lambda v: float(fun(v)), x, vals)
    return val, 10.0 ** lx


def compute_optimal_density(C: float, unique_tokens: float, p: LawParams = PUBLISHED, *,
                            density_min: float = 0.05, density_max: float = 1.0,
                            num_densities: int = 96) -> tuple[float, float]:
    """At fixed compute C = 6 N_active D (free N/D split), the density with the lowest achievable loss.

    Returns:
      (s*, best loss).
    """
    grid = _densities(density_min, density_max, num_densities)
    fun = lambda x: best_loss_at_compute(C, unique_tokens, x, p)[0]  # noqa: E731
    return _refine_min(fun, grid, np.array([fun(x) for x in grid]))


def published_findings(p: LawParams = PUBLISHED, *,
                       densities: Sequence[float] = (1.0, 0.5, 0.25, 0.125, 0.0625),
                       loss_opt_n_totals: Iterable[float] = (1e8, 5e8, 2e9, 8e9),
                       loss_opt_data: tuple[float, float] = (1.3e9, 16.0),
                       compute_budgets: Iterable[float] = (1e19, 1e20, 1e21),
                       compute_unique: Iterable[float] = (1.3e9, 1.3e10)) -> dict:
    """The derived numbers the paper's findings rest on, evaluated from constants `p`.

    Returns:
      {"r_d_star": {s: R_D*}, "r_n_star": {s: R_N*}, "f": {s: f(s)},
       "loss_optimal_density": {N_total: s*} at U, epochs = loss_opt_data,
       "compute_optimal_density": {U: {C: s*}}}.
    """
    u, ep = loss_opt_data
    return {
        "r_d_star": {s: float(r_d_star(s, p)) for s in densities},
        "r_n_star": {s: float(r_n_star(s, p)) for s in densities},
        "f": {s: float(density_factor(s, p)) for s in densities},
        "loss_optimal_density": {nt: loss_optimal_density(nt, u, ep, p)[0] for nt in loss_opt_n_totals},
        "compute_optimal_density": {uu: {c: compute_optimal_density(c, uu, p)[0] for c in compute_budgets}
                                    for uu in compute_unique},
    }
