"""Off-policy evaluation when rewards are missing not at random: shadow variables, bridge function, ProxFQE.

Estimates the value of a (missingness-aware) target policy from logged episodes whose rewards are
recorded only when O_t = 1, where P(O_t = 1) depends on the reward itself (MNAR). The next state is a
shadow variable: a bridge b_t with ``E[b_t(S_t, A_t, S_{t+1}) | R_t, S_t, A_t] = R_t``, fitted on complete
cases, imputes the missing rewards inside fitted-Q evaluation (ProxFQE).

Public functions:
  * simulator (the paper's 2-d linear-Gaussian MDP, JAX, explicit keys): `SimParams`, `simulate`,
    `true_value`, `missing_rate`, `calibrate_intercept`, `behaviour_policy`, `target_policy`
    (`behaviour_probs`, `target_probs`);
  * kernels: `rbf_kernel`, `median_heuristic`, `KernelRidgeLOO` (exact leave-one-out choice of lambda);
  * bridges: :func:`fit_bridge_rkhs` (closed-form min-max RKHS estimator, as in the official code),
    :func:`fit_bridge_rkhs_cv` (bandwidth and regularisation by K-fold CV), :func:`fit_bridge_sieve`
    (linear-sieve 2SLS);
  * :func:`evaluate` with a method of `METHODS`: ``"prox_fqe"`` and the baselines ``"naive_fqe"``
    (complete cases), ``"mar_impute_fqe"``, ``"mar_ipw_fqe"``, ``"scope_is"`` and ``"oracle_fqe"`` (all
    rewards observed; a reference, not an estimator).

Numerics: the simulator is JAX float32; the kernel solves are NumPy float64. Rewards where ``observed``
is False are never read except by ``"oracle_fqe"``.

Dimension legend: ``n`` episodes, ``T`` horizon, ``d`` state dimension, ``k`` actions, ``m`` points.

Spec: `../shared/papers/specs/statistics_theory.md`, section 2.

References:
  Wei, Qu, Miao, "Off-Policy Evaluation for Missingness-Aware Policies in MDPs with Rewards Missing
  Not at Random", arXiv:2606.20206 (ICML 2026); official code github.com/EverettWei/OPE-MDP-MNAR.
  Dikkala, Lewis, Mackey, Syrgkanis, "Minimax Estimation of Conditional Moment Models", NeurIPS 2020.
  Le, Voloshin, Yue, "Batch Policy Learning under Constraints" (FQE), ICML 2019.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
import threadpoolctl

__all__ = [
    "METHODS",
    "SimParams",
    "Episodes",
    "simulate",
    "true_value",
    "missing_rate",
    "calibrate_intercept",
    "behaviour_probs",
    "target_probs",
    "target_policy",
    "behaviour_policy",
    "rbf_kernel",
    "median_heuristic",
    "KernelRidgeLOO",
    "BridgeFit",
    "RKHSBridge",
    "SieveBridge",
    "fit_bridge_rkhs",
    "fit_bridge_rkhs_cv",
    "fit_bridge_sieve",
    "OPEResult",
    "evaluate",
]

METHODS = ("prox_fqe", "naive_fqe", "mar_impute_fqe", "mar_ipw_fqe", "scope_is", "oracle_fqe")
_REWARD_TYPES = ("sigmoid", "linear")


# ----------------------------------------------------------------------------------------------
# The simulator (official code's sim_envs, ported to JAX).
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class SimParams:
    """The paper's simulation MDP (its numbers are traced, so changing them does not recompile).

    S_1 ~ N(0, I_2); A in {-1, +1}; S_{t+1} = 0.9 S_t + 0.2 A_t + N(0, 0.1^2 I).
    sigmoid reward: ``sigmoid((0.9 - 0.6 A, -0.7) . S + (1.3, 2.0) . S' - 0.4 A) + U(-0.1, 0.1)``;
    linear reward: ``clip(0.5 s1 - 0.3 s2 + 0.8 s'1 + 0.6 s'2 - 0.3 a + N(0, 0.1^2), -1, 1)``.
    ``P(O = 1) = sigmoid(intercept + action_coef A + state_coef . S + next_state_coef . S' + reward_coef R)``.
    Behaviour ``P(A = +1 | s) = sigmoid(0.3 + 0.8 s1 - 0.3 s2)``; target
    ``P(A = +1 | s, o_prev) = sigmoid(1.5 + 3.0 s1 + 0.9 s2 + target_o_coef (2 o_prev - 1))``.

    Attributes:
      reward_type: "sigmoid" or "linear".
      intercept: c0; {0.3, -0.7, -1.5, -2.8} give about 20/40/54/78% missing (sigmoid reward).
      reward_coef: the MNAR strength (0 = missing at random given (S, A)).
      action_coef, state_coef: the (S, A) part of the missingness logit.
      next_state_coef: nonzero breaks the shadow-variable exclusion (negative control).
      target_o_coef: how much the target policy reacts to O_{t-1} (0 = missingness-unaware).
    """

    reward_type: str = "sigmoid"
    intercept: float = -0.7
    reward_coef: float = 2.5
    action_coef: float = -0.1
    state_coef: tuple[float, float] = (0.2, -0.4)
    next_state_coef: tuple[float, float] = (0.0, 0.0)
    target_o_coef: float = -2.4

    def __post_init__(self):
        if self.reward_type not in _REWARD_TYPES:
            raise ValueError(f"reward_type must be one of {_REWARD_TYPES}, got {self.reward_type!r}")
        for name in ("state_coef", "next_state_coef"):
            v = getattr(self, name)
            if len(v) != 2:
                raise ValueError(f"{name} must have 2 entries (the state dimension), got {v!r}")
            object.__setattr__(self, name, tuple(float(x) for x in v))
        for name in ("intercept", "reward_coef", "action_coef", "target_o_coef"):
            object.__setattr__(self, name, float(getattr(self, name)))


class Episodes(NamedTuple):
    """A batch of logged episodes.

    Attributes:
      states: [n, T+1, d] S_1..S_{T+1}.
      actions: [n, T] action values (e.g. -1/+1).
      rewards: [n, T] rewards (the full rewards in simulation; only ``observed`` entries are used by
        the estimators, all of them by the oracle).
      observed: [n, T] bool, O_t.
    """

    states: jax.Array
    actions: jax.Array
    rewards: jax.Array
    observed: jax.Array


def behaviour_probs(states):
    """Behaviour ``P(A = +1 | s) = sigmoid(0.3 + 0.8 s1 - 0.3 s2)`` for states [..., 2]."""
    return jax.nn.sigmoid(0.3 + 0.8 * states[..., 0] - 0.3 * states[..., 1])


def target_probs(states, o_prev, *, o_coef: float = -2.4):
    """Target ``P(A = +1 | s, o_prev) = sigmoid(1.5 + 3 s1 + 0.9 s2 + o_coef (2 o_prev - 1))``."""
    o = jnp.asarray(o_prev, jnp.asarray(states).dtype)
    return jax.nn.sigmoid(1.5 + 3.0 * states[..., 0] + 0.9 * states[..., 1] + o_coef * (2.0 * o - 1.0))


def target_policy(params: SimParams) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The target policy of ``params`` in the estimators' form: ``(states [m, 2], o_prev [m]) -> [m, 2]``.

    Columns are the probabilities of the actions (-1, +1), as float64 NumPy.
    """
    def policy(states, o_prev):
        s = np.asarray(states, np.float64)
        o = np.asarray(o_prev, np.float64)
        p = 1.0 / (1.0 + np.exp(-(1.5 + 3.0 * s[:, 0] + 0.9 * s[:, 1] + params.target_o_coef * (2.0 * o - 1.0))))
        return np.stack([1.0 - p, p], axis=1)

    return policy


def behaviour_policy() -> Callable[[np.ndarray], np.ndarray]:
    """The simulator's behaviour policy in the estimators' form: ``states [m, 2] -> [m, 2]``.

    Columns are the probabilities of the actions (-1, +1), as float64 NumPy (see :func:`behaviour_probs`).
    """
    def policy(states):
        s = np.asarray(states, np.float64)
        p = 1.0 / (1.0 + np.exp(-(0.3 + 0.8 * s[:, 0] - 0.3 * s[:, 1])))
        return np.stack([1.0 - p, p], axis=1)

    return policy


def _reward(reward_type: str, s, a, s_next, key):
    if reward_type == "sigmoid":
        z = (0.9 - 0.6 * a) * s[:, 0] - 0.7 * s[:, 1] + 1.3 * s_next[:, 0] + 2.0 * s_next[:, 1] - 0.4 * a
        return jax.nn.sigmoid(z) + jax.random.uniform(key, a.shape, minval=-0.1, maxval=0.1)
    z = (0.5 * s[:, 0] - 0.3 * s[:, 1] + 0.8 * s_next[:, 0] + 0.6 * s_next[:, 1] - 0.3 * a
         + 0.1 * jax.random.normal(key, a.shape))
    return jnp.clip(z, -1.0, 1.0)


def _coef_vector(params: SimParams) -> np.ndarray:
    return np.array([params.intercept, params.reward_coef, params.action_coef, *params.state_coef,
                     *params.next_state_coef, params.target_o_coef], np.float32)


@functools.partial(jax.jit, static_argnames=("reward_type", "num_episodes", "horizon"))
def _simulate(key, coefs, is_target, reward_type: str, num_episodes: int, horizon: int) -> Episodes:
    intercept, reward_coef, action_coef, o_coef = coefs[0], coefs[1], coefs[2], coefs[7]
    sc, nc = coefs[3:5], coefs[5:7]
    k0, kscan = jax.random.split(key)
    s0 = jax.random.normal(k0, (num_episodes, 2))
    o0 = jnp.zeros((num_episodes,), jnp.float32)

    def step(carry, k):
        s, o_prev = carry
        ka, ks, kr, ko = jax.random.split(k, 4)
        p = jnp.where(is_target, target_probs(s, o_prev, o_coef=o_coef), behaviour_probs(s))
        a = jnp.where(jax.random.uniform(ka, p.shape) < p, 1.0, -1.0)
        s_next = 0.9 * s + 0.2 * a[:, None] + 0.1 * jax.random.normal(ks, s.shape)
        r = _reward(reward_type, s, a, s_next, kr)
        logit = intercept + action_coef * a + s @ sc + s_next @ nc + reward_coef * r
        o = (jax.random.uniform(ko, r.shape) < jax.nn.sigmoid(logit)).astype(jnp.float32)
        return (s_next, o), (s_next, a, r, o)

    _, (s_next, a, r, o) = jax.lax.scan(step, (s0, o0), jax.random.split(kscan, horizon))
    states = jnp.concatenate([s0[None], s_next], axis=0).transpose(1, 0, 2)
    return Episodes(states=states, actions=a.T, rewards=r.T, observed=o.T > 0.5)


def _check_pos_int(name, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
    return int(v)


_BLOCK = 2048  # episodes per compiled simulator call: one compilation per (horizon, reward type)


def simulate(key, params: SimParams, *, num_episodes: int, horizon: int, policy: str = "behaviour") -> Episodes:
    """Episodes of the simulation MDP (vectorised over episodes, one ``lax.scan`` over time).

    Episodes are drawn in blocks of 2048 (block i uses ``fold_in(key, i)``) so that every episode
    count reuses one compiled program.

    Args:
      key: PRNG key.
      params: the MDP.
      num_episodes: n >= 1.
      horizon: T >= 1.
      policy: "behaviour" (the logging policy) or "target" (on-policy rollouts of the target).

    Returns:
      :class:`Episodes` with the full rewards and the missingness indicators.

    Examples:
      >>> ep = simulate(jax.random.key(0), SimParams(), num_episodes=3, horizon=2)
      >>> ep.states.shape, ep.actions.shape, ep.observed.dtype
      ((3, 3, 2), (3, 2), dtype('bool'))
    """
    if not isinstance(params, SimParams):
        raise ValueError(f"params must be a SimParams, got {type(params).__name__}")
    if policy not in ("behaviour", "target"):
        raise ValueError(f"policy must be 'behaviour' or 'target', got {policy!r}")
    n = _check_pos_int("num_episodes", num_episodes)
    horizon = _check_pos_int("horizon", horizon)
    coefs = jnp.asarray(_coef_vector(params))
    is_target = jnp.asarray(policy == "target")
    blocks = [_simulate(jax.random.fold_in(key, i), coefs, is_target, params.reward_type, _BLOCK, horizon)
              for i in range(-(-n // _BLOCK))]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0)[:n], *blocks)


def true_value(key, params: SimParams, *, horizon: int, gamma: float = 1.0,
               num_episodes: int = 100_000) -> tuple[float, float]:
    """V(pi) of the target policy by on-policy rollout: (mean, standard error) over episodes.

    The target policy sees its own missingness indicators, so the value depends on the missingness
    mechanism (``params.intercept`` etc.) unless ``target_o_coef = 0``.
    """
    ep = simulate(key, params, num_episodes=num_episodes, horizon=horizon, policy="target")
    g = np.asarray(ep.rewards, np.float64) @ (float(gamma) ** np.arange(horizon))
    return float(g.mean()), float(g.std(ddof=1) / np.sqrt(g.size))


def missing_rate(key, params: SimParams, *, horizon: int, num_episodes: int = 20_000) -> float:
    """The fraction of missing rewards in behaviour data."""
    ep = simulate(key, params, num_episodes=num_episodes, horizon=horizon)
    return float(1.0 - np.asarray(ep.observed).mean())


def calibrate_intercept(key, params: SimParams, target_missing_rate: float, *, horizon: int,
                        num_episodes: int = 20_000, iters: int = 30) -> SimParams:
    """``params`` with the missingness intercept c0 set (by bisection, common random numbers) so that the
    behaviour data miss ``target_missing_rate`` of the rewards; used to vary the MNAR strength at a
    fixed missing rate."""
    if not 0.0 < target_missing_rate < 1.0:
        raise ValueError(f"target_missing_rate must lie in (0, 1), got {target_missing_rate}")
    lo, hi = -12.0, 12.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        rate = missing_rate(key, dataclasses.replace(params, intercept=mid), horizon=horizon,
                            num_episodes=num_episodes)
        lo, hi = (lo, mid) if rate < target_missing_rate else (mid, hi)
    return dataclasses.replace(params, intercept=0.5 * (lo + hi))


# ----------------------------------------------------------------------------------------------
# Kernels and kernel ridge regression (NumPy float64).
# ----------------------------------------------------------------------------------------------

def _single_blas_thread(fn):
    """Runs ``fn`` with one BLAS thread: the matrices are small, and multithreaded OpenBLAS spins (it was
    about 25x slower on a shared 2-core machine)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


def _sq_dists(x, y):
    d = (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * x @ y.T
    return np.maximum(d, 0.0)


def rbf_kernel(x, y, gamma: float) -> np.ndarray:
    """``exp(-gamma ||x_i - y_j||^2)`` for x [m, p], y [m', p] (float64)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must be [m, p] and [m', p], got {x.shape} and {y.shape}")
    return np.exp(-gamma * _sq_dists(x, y))


def median_heuristic(x, *, max_points: int = 1000) -> float:
    """``1 / median`` of the squared pairwise distances among the first ``max_points`` rows (i < j)."""
    x = np.asarray(x, np.float64)[:max_points]
    if x.shape[0] < 2:
        return 1.0
    d = _sq_dists(x, x)[np.triu_indices(x.shape[0], 1)]
    med = np.median(d)
    return float(1.0 / med) if med > 0 else 1.0


class _Scaler:
    """Robust scaling: (x - median) / IQR per column (std, then 1, where the IQR is 0)."""

    def __init__(self, x):
        x = np.asarray(x, np.float64)
        self.center = np.median(x, axis=0)
        q75, q25 = np.percentile(x, [75, 25], axis=0)
        scale = q75 - q25
        std = x.std(axis=0)
        scale = np.where(scale > 1e-12, scale, np.where(std > 1e-12, std, 1.0))
        self.scale = scale

    def __call__(self, x):
        return (np.asarray(x, np.float64) - self.center) / self.scale


DEFAULT_KRR_LAMBDAS = tuple(np.logspace(-7, 1, 30))  # eval_grid.py's grid; alpha = n * lambda


class KernelRidgeLOO:
    """Kernel ridge regression on a fixed design with lambda chosen by exact leave-one-out CV.

    ``f = K c``, ``(K + n lambda I) c = y`` with an RBF kernel on robust-scaled inputs (median-heuristic
    gamma). One eigendecomposition of K serves every lambda and every target ``y`` fitted on the same
    design (the FQE targets of all estimators at one time step).

    Args:
      x: [m, p] design.
      lambdas: the grid of per-sample ridge penalties.
      gamma: kernel parameter on the scaled inputs (None: median heuristic).
    """

    def __init__(self, x, *, lambdas: Sequence[float] = DEFAULT_KRR_LAMBDAS, gamma: float | None = None):
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"x must be [m >= 2, p], got shape {x.shape}")
        self.scaler = _Scaler(x)
        self.z = self.scaler(x)
        self.gamma = median_heuristic(self.z) if gamma is None else float(gamma)
        self.lambdas = np.asarray(lambdas, np.float64)
        if self.lambdas.ndim != 1 or self.lambdas.size == 0 or np.any(self.lambdas <= 0):
            raise ValueError(f"lambdas must be a non-empty 1-d grid of positive numbers, got {lambdas!r}")
        k = rbf_kernel(self.z, self.z, self.gamma)
        self.eig, self.vec = np.linalg.eigh(k)
        self.eig = np.maximum(self.eig, 0.0)

    def fit(self, y) -> "_KRRFit":
        y = np.asarray(y, np.float64)
        n = self.z.shape[0]
        if y.shape != (n,):
            raise ValueError(f"y must have shape ({n},), got {y.shape}")
        uty = self.vec.T @ y
        alpha = n * self.lambdas  # [L]
        h = self.eig[None, :] / (self.eig[None, :] + alpha[:, None])  # [L, n] hat-matrix eigenvalues
        yhat = (h * uty[None, :]) @ self.vec.T  # [L, n]
        hii = (self.vec ** 2) @ h.T  # [n, L]
        resid = (y[None, :] - yhat) / np.maximum(1.0 - hii.T, 1e-10)
        loo = (resid ** 2).mean(axis=1)
        best = int(np.argmin(loo))
        coef = self.vec @ (uty / (self.eig + alpha[best]))
        return _KRRFit(self, coef, float(self.lambdas[best]), float(loo[best]))


class _KRRFit(NamedTuple):
    design: KernelRidgeLOO
    coef: np.ndarray
    lam: float
    loo_mse: float

    def __call__(self, x):
        d = self.design
        return rbf_kernel(d.scaler(x), d.z, d.gamma) @ self.coef


class _LinearDesign:
    """Least squares on user features (minimum-norm; cell means for one-hot features)."""

    def __init__(self, x, features):
        self.features = features
        self.phi = np.asarray(features(x), np.float64)
        if self.phi.ndim != 2 or self.phi.shape[0] != np.asarray(x).shape[0]:
            raise ValueError(f"features must map [m, p] inputs to [m, q], got {self.phi.shape}")
        self.pinv = np.linalg.pinv(self.phi)

    def fit(self, y):
        theta = self.pinv @ np.asarray(y, np.float64)
        return lambda x: np.asarray(self.features(x), np.float64) @ theta


# ----------------------------------------------------------------------------------------------
# Bridge functions.
# ----------------------------------------------------------------------------------------------

class BridgeFit(NamedTuple):
    """A fitted bridge ``b(x_h)``; call it on [m, p_h] inputs (x_h = (S', S, A)).

    Attributes:
      predict: ``x_h [m, p_h] -> [m]``.
      info: diagnostics (chosen hyper-parameters, projected moment violation, condition number).
    """

    predict: Callable[[np.ndarray], np.ndarray]
    info: dict

    def __call__(self, xh):
        return self.predict(xh)


def _m_matrix(kf, delta):
    """``M = Kf^(1/2) (Kf / (2 n delta^2) + I / 2)^(-1) Kf^(1/2)`` through the eigendecomposition of Kf."""
    n = kf.shape[0]
    e, u = np.linalg.eigh(kf)
    e = np.maximum(e, 0.0)
    c = n * delta ** 2
    return (u * (2.0 * c * e / (e + c))) @ u.T


def _rkhs_solve(kh, m, y, alphas, jitter: float = 1e-8):
    """Solutions ``a`` of ``(Kh M Kh + alpha Kh) a = Kh M y``, one per alpha, and the condition number.

    With ``Kh + jitter I = L L^T`` and ``a = L^-T d`` the system is ``(L^T M L + alpha I) d = L^T M y``; one
    eigendecomposition of ``L^T M L`` serves every alpha.
    """
    n = kh.shape[0]
    chol = np.linalg.cholesky(kh + jitter * max(float(np.trace(kh)) / n, 1e-300) * np.eye(n))
    g = chol.T @ m @ chol
    gw, w = np.linalg.eigh(0.5 * (g + g.T))
    gw = np.maximum(gw, 0.0)
    rhs = w.T @ (chol.T @ (m @ y))
    d = w @ (rhs[:, None] / (gw[:, None] + np.asarray(alphas)[None, :]))  # [n, alphas]
    a = scipy.linalg.solve_triangular(chol.T, d, lower=False)
    cond = float((gw.max() + min(alphas)) / (gw.min() + min(alphas)))
    return [a[:, j] for j in range(a.shape[1])], cond


def _as_2d(name, x, n=None):
    x = np.asarray(x, np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-d array [m, p], got shape {x.shape}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} must have {n} rows, got {x.shape[0]}")
    return x


@_single_blas_thread
def fit_bridge_rkhs(xh, xf, y, *, gamma_h: float, gamma_f: float, alpha_scale: float = 0.1,
                    delta_scale: float = 5.0, delta_exp: float = 0.4, scale: bool = True) -> BridgeFit:
    """The min-max RKHS bridge in closed form (Dikkala et al., 2020; the official code's RKHSIV).

    Solves ``E[b(X_h) - Y | X_f] = 0`` on the given rows (complete cases):
    ``a = argmin_a (Kh a - y)^T M (Kh a - y) + alpha a^T Kh a``, ``b(x) = k_h(x, X_h) a``.

    Args:
      xh: [m, p_h] the bridge's inputs (shadow variable and covariates: S', S, A).
      xf: [m, p_f] the conditioning variables (R, S, A).
      y: [m] the outcome (R).
      gamma_h, gamma_f: RBF parameters (on robust-scaled inputs when ``scale``).
      alpha_scale: alpha = alpha_scale * delta^4.
      delta_scale, delta_exp: the critical radius delta = delta_scale / m^delta_exp.
      scale: robust-scale xh and xf first (the scaling is part of the returned predictor).

    Returns:
      :class:`BridgeFit`.
    """
    y = np.asarray(y, np.float64)
    if y.ndim != 1 or y.size < 2:
        raise ValueError(f"y must be a 1-d array with at least 2 entries, got shape {y.shape}")
    n = y.size
    xh, xf = _as_2d("xh", xh, n), _as_2d("xf", xf, n)
    sh = _Scaler(xh) if scale else (lambda v: np.asarray(v, np.float64))
    sf = _Scaler(xf) if scale else (lambda v: np.asarray(v, np.float64))
    zh, zf = sh(xh), sf(xf)
    delta = delta_scale / n ** delta_exp
    m = _m_matrix(rbf_kernel(zf, zf, gamma_f), delta)
    kh = rbf_kernel(zh, zh, gamma_h)
    (a,), cond = _rkhs_solve(kh, m, y, [alpha_scale * delta ** 4])
    res = y - kh @ a
    info = {"gamma_h": float(gamma_h), "gamma_f": float(gamma_f), "alpha_scale": float(alpha_scale),
            "delta": float(delta), "moment_violation": float(res @ m @ res / n ** 2), "condition_number": cond,
            "num_rows": n}
    return BridgeFit(lambda x: rbf_kernel(sh(x), zh, gamma_h) @ a, info)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RKHSBridge:
    """Settings of the cross-validated RKHS min-max bridge (:func:`fit_bridge_rkhs_cv`).

    The official code uses 15 bandwidths, 16 alpha scales and 5 folds; the defaults here are a 4 x 6
    grid and 3 folds (the spec's CPU plan cuts the grids for speed).
    """

    num_gamma: int = 5  # gamma_h = 1 / quantile(squared distances, i / num_gamma), i = 1..num_gamma-1
    alpha_scales: tuple[float, ...] = tuple(np.geomspace(0.02, 2.0, 6))
    num_folds: int = 3
    delta_scale: float = 5.0
    delta_exp: float = 0.4


@_single_blas_thread
def fit_bridge_rkhs_cv(xh, xf, y, settings: RKHSBridge = RKHSBridge()) -> BridgeFit:
    """:func:`fit_bridge_rkhs` with gamma_h and alpha_scale chosen by K-fold CV.

    The score of a candidate is the held-out projected moment violation ``r^T M_val r / m_val^2``
    (``M_val`` built on the held-out fold's conditioning kernel), summed over folds; folds are
    contiguous blocks (the rows are exchangeable). gamma_f is the median heuristic.
    """
    y = np.asarray(y, np.float64)
    if y.ndim != 1 or y.size < 2 * settings.num_folds:
        raise ValueError(f"y must be 1-d with at least 2 * num_folds = {2 * settings.num_folds} rows, "
                         f"got shape {y.shape}")
    n = y.size
    xh, xf = _as_2d("xh", xh, n), _as_2d("xf", xf, n)
    zh, zf = _Scaler(xh)(xh), _Scaler(xf)(xf)
    gamma_f = median_heuristic(zf)
    sub = zh[:1000]
    d = _sq_dists(sub, sub)[np.triu_indices(sub.shape[0], 1)]
    qs = np.arange(1, settings.num_gamma) / settings.num_gamma
    gammas = 1.0 / np.maximum(np.quantile(d, qs), 1e-12)
    alphas = np.asarray(settings.alpha_scales, np.float64)
    kf_all, folds = rbf_kernel(zf, zf, gamma_f), np.array_split(np.arange(n), settings.num_folds)
    scores = np.zeros((gammas.size, alphas.size))
    for val in folds:
        tr = np.setdiff1d(np.arange(n), val)
        d_tr = settings.delta_scale / tr.size ** settings.delta_exp
        d_val = settings.delta_scale / val.size ** settings.delta_exp
        m_tr = _m_matrix(kf_all[np.ix_(tr, tr)], d_tr)
        m_val = _m_matrix(kf_all[np.ix_(val, val)], d_val)
        for i, g in enumerate(gammas):
            kh = rbf_kernel(zh[tr], zh[tr], g)
            kv = rbf_kernel(zh[val], zh[tr], g)
            sols, _ = _rkhs_solve(kh, m_tr, y[tr], alphas * d_tr ** 4)
            for j, a in enumerate(sols):
                r = y[val] - kv @ a
                scores[i, j] += r @ m_val @ r / val.size ** 2
    i, j = np.unravel_index(int(np.argmin(scores)), scores.shape)
    fit = fit_bridge_rkhs(xh, xf, y, gamma_h=float(gammas[i]), gamma_f=gamma_f, alpha_scale=float(alphas[j]),
                          delta_scale=settings.delta_scale, delta_exp=settings.delta_exp)
    fit.info["cv_score"] = float(scores[i, j] / settings.num_folds)
    return fit


@dataclasses.dataclass(frozen=True)
class SieveBridge:
    """Linear-sieve GMM bridge (:func:`fit_bridge_sieve`) with feature maps of x_h and x_f."""

    h_features: Callable[[np.ndarray], np.ndarray]
    f_features: Callable[[np.ndarray], np.ndarray]
    ridge: float = 1e-10


@_single_blas_thread
def fit_bridge_sieve(xh, xf, y, h_features, f_features, *, ridge: float = 1e-10) -> BridgeFit:
    """Linear-sieve GMM (two-stage least squares) for ``E[b(X_h) - Y | X_f] = 0``.

    ``b(x) = phi(x)^T theta`` with ``theta = (Phi^T P Phi + ridge I)^(-1) Phi^T P y``, ``P`` the projection on
    the span of ``psi(X_f)``: the sample moments ``Psi^T (y - Phi theta) = 0`` hold exactly when the model
    is just identified (e.g. one-hot features of a tabular problem with as many reward levels as
    next states).

    Args:
      xh, xf, y: as in :func:`fit_bridge_rkhs`.
      h_features: ``[m, p_h] -> [m, q_h]`` sieve of the bridge.
      f_features: ``[m, p_f] -> [m, q_f]`` instruments (q_f >= q_h for identification).
      ridge: Tikhonov term on theta (numerical safeguard).

    Returns:
      :class:`BridgeFit`.

    Examples:
      >>> r = np.array([0., 1., 2., 0., 1., 2.]); s1 = 2 * r + 1  # S' = 2 R + 1 exactly
      >>> fit = fit_bridge_sieve(s1[:, None], r[:, None], r, lambda x: np.c_[np.ones(len(x)), x],
      ...                        lambda x: np.c_[np.ones(len(x)), x])
      >>> np.round(fit(np.array([[5.0]])), 6)  # b(s') = (s' - 1) / 2
      array([2.])
    """
    y = np.asarray(y, np.float64)
    if y.ndim != 1 or y.size < 1:
        raise ValueError(f"y must be a non-empty 1-d array, got shape {y.shape}")
    n = y.size
    xh, xf = _as_2d("xh", xh, n), _as_2d("xf", xf, n)
    phi, psi = _as_2d("h_features(xh)", h_features(xh), n), _as_2d("f_features(xf)", f_features(xf), n)
    proj_phi = psi @ (np.linalg.pinv(psi) @ phi)  # P Phi
    lhs = phi.T @ proj_phi + ridge * np.eye(phi.shape[1])
    theta = np.linalg.lstsq(lhs, proj_phi.T @ y, rcond=None)[0]
    res = y - phi @ theta
    mom = psi.T @ res / n
    info = {"moment_violation": float(mom @ mom), "condition_number": float(np.linalg.cond(lhs)), "num_rows": n}
    return BridgeFit(lambda x: np.asarray(h_features(_as_2d("xh", x)), np.float64) @ theta, info)


def _fit_bridge(bridge, xh, xf, y) -> BridgeFit:
    if isinstance(bridge, RKHSBridge):
        return fit_bridge_rkhs_cv(xh, xf, y, bridge)
    if isinstance(bridge, SieveBridge):
        return fit_bridge_sieve(xh, xf, y, bridge.h_features, bridge.f_features, ridge=bridge.ridge)
    raise ValueError(f"bridge must be an RKHSBridge or a SieveBridge, got {type(bridge).__name__}")


# ----------------------------------------------------------------------------------------------
# FQE and the estimators.
# ----------------------------------------------------------------------------------------------

class OPEResult(NamedTuple):
    """One estimate: the value, and per-time-step diagnostics (chosen lambdas, bridge fits)."""

    value: float
    method: str
    info: dict


def _logistic_fit(x, o, iters: int = 50, ridge: float = 1e-6):
    """Logistic regression of o on [1, x] by Newton's method; returns a predictor of P(o = 1 | x)."""
    xx = np.c_[np.ones(len(x)), x]
    w = np.zeros(xx.shape[1])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(xx @ w, -30, 30)))
        g = xx.T @ (o - p) - ridge * w
        hess = (xx * (p * (1 - p))[:, None]).T @ xx + ridge * np.eye(len(w))
        step = np.linalg.solve(hess, g)
        w += step
        if np.max(np.abs(step)) < 1e-10:
            break
    return lambda z: 1.0 / (1.0 + np.exp(-np.clip(np.c_[np.ones(len(z)), z] @ w, -30, 30)))


def _check_episodes(data: Episodes):
    states = np.asarray(data.states, np.float64)
    if states.ndim != 3:
        raise ValueError(f"data.states must be [n, T+1, d], got shape {states.shape}")
    n, t1, _ = states.shape
    shape = (n, t1 - 1)
    arrs = {}
    for name in ("actions", "rewards", "observed"):
        a = np.asarray(getattr(data, name))
        if a.shape != shape:
            raise ValueError(f"data.{name} must have shape {shape} (from data.states {states.shape}), got {a.shape}")
        arrs[name] = a
    if t1 < 2:
        raise ValueError(f"data needs a horizon T >= 1, got states of shape {states.shape}")
    return states, arrs["actions"].astype(np.float64), arrs["rewards"].astype(np.float64), arrs["observed"].astype(bool)


@_single_blas_thread
def evaluate(data: Episodes, policy: Callable[[np.ndarray, np.ndarray], np.ndarray], *,
             methods: Sequence[str] | None = None, gamma: float = 1.0, action_values: Sequence[float] = (-1.0, 1.0),
             bridge: RKHSBridge | SieveBridge = RKHSBridge(), q_features: Callable | None = None,
             krr_lambdas: Sequence[float] = DEFAULT_KRR_LAMBDAS, imputation: str = "missing",
             ipw_clip: tuple[float, float] = (0.01, 0.99),
             behaviour: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, OPEResult]:
    """Off-policy value estimates of ``policy`` from logged ``data`` with missing rewards.

    All methods share one FQE engine (backward regressions of ``R~_t + gamma V_{t+1}(S_{t+1}, O_t)``
    on (S_t, A_t)) and, at each time step, the kernel eigendecomposition of a shared design.

    Args:
      data: :class:`Episodes` (``rewards`` read only where ``observed``, except by ``"oracle_fqe"``).
      policy: ``(states [m, d], o_prev [m]) -> [m, k]`` action probabilities (columns follow
        ``action_values``); o_prev is O_{t-1} (0 before the first step).
      methods: any of :data:`METHODS`; None = all of them (without ``"scope_is"`` when ``behaviour`` is None).
      gamma: discount.
      action_values: the action encoding used in ``data.actions``.
      bridge: :class:`RKHSBridge` (default; the paper's min-max estimator) or :class:`SieveBridge`.
      q_features: None for kernel ridge Q-functions; or a map ``[m, d + 1] -> [m, q]`` of (S, A) for
        least-squares Q-functions on those features (e.g. one-hot cells of a tabular MDP).
      krr_lambdas: ridge grid of the kernel Q-regressions (leave-one-out CV).
      imputation: "missing" (impute only missing rewards with the bridge; the code) or "all".
      ipw_clip: clipping of the MAR propensity of ``"mar_ipw_fqe"``.
      behaviour: ``states [m, d] -> [m, k]`` behaviour action probabilities (columns follow
        ``action_values``); needed by ``"scope_is"`` only (e.g. :func:`behaviour_policy`).

    Returns:
      method -> :class:`OPEResult`.
    """
    if methods is None:
        methods = tuple(m for m in METHODS if m != "scope_is" or behaviour is not None)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {tuple(methods)}")
    if imputation not in ("missing", "all"):
        raise ValueError(f"imputation must be 'missing' or 'all', got {imputation!r}")
    states, actions, rewards, observed = _check_episodes(data)
    n, horizon = actions.shape
    avals = np.asarray(action_values, np.float64)
    if not np.all(np.isin(actions, avals)):
        raise ValueError(f"data.actions must take values in action_values={tuple(avals)}, "
                         f"got {np.unique(actions)[:10]}")
    if "scope_is" in methods and behaviour is None:
        raise ValueError("methods include 'scope_is', which needs behaviour= (states -> action probabilities)")
    if "oracle_fqe" in methods and not np.all(np.isfinite(rewards)):
        raise ValueError("oracle_fqe needs all rewards (data.rewards has non-finite entries)")
    probe = np.asarray(policy(states[:2, 0], np.zeros(min(n, 2))))
    if probe.shape != (min(n, 2), avals.size):
        raise ValueError(f"policy must return [m, {avals.size}] probabilities, got shape {probe.shape}")
    r_obs = np.where(observed, np.nan_to_num(rewards), np.nan)  # what an estimator may see
    obs_f = observed.astype(np.float64)

    designs: dict = {}

    def design(t, rows):
        key = (t, rows.tobytes())
        if key not in designs:
            x = np.c_[states[rows, t], actions[rows, t]]
            designs[key] = _LinearDesign(x, q_features) if q_features is not None else KernelRidgeLOO(
                x, lambdas=krr_lambdas)
        return designs[key]

    # Per-method reward targets, rows used and the O passed to the next-step policy.
    plans, infos = {}, {m: {} for m in methods}
    fqe_methods = [m for m in methods if m != "scope_is"]
    if "scope_is" in methods and "naive_fqe" not in fqe_methods:
        fqe_methods.append("naive_fqe")  # SCOPE's potentials are the complete-case FQE values
    for m in fqe_methods:
        if m == "oracle_fqe":
            plans[m] = (rewards, np.ones_like(observed), obs_f)
        elif m == "naive_fqe":
            plans[m] = (np.nan_to_num(r_obs), observed, np.ones_like(obs_f))
        elif m == "prox_fqe":
            tilde, binfo = np.zeros_like(rewards), []
            for t in range(horizon):
                cc = observed[:, t]
                xh = np.c_[states[:, t + 1], states[:, t], actions[:, t]]
                xf = np.c_[r_obs[cc, t], states[cc, t], actions[cc, t]]
                fit = _fit_bridge(bridge, xh[cc], xf, r_obs[cc, t])
                b = fit(xh)
                tilde[:, t] = b if imputation == "all" else np.where(cc, np.nan_to_num(r_obs[:, t]), b)
                binfo.append(fit.info)
            plans[m] = (tilde, np.ones_like(observed), obs_f)
            infos[m]["bridge"] = binfo
        elif m == "mar_impute_fqe":
            tilde = np.zeros_like(rewards)
            for t in range(horizon):
                cc = observed[:, t]
                reg = design(t, cc).fit(r_obs[cc, t])
                tilde[:, t] = np.where(cc, np.nan_to_num(r_obs[:, t]), reg(np.c_[states[:, t], actions[:, t]]))
            plans[m] = (tilde, np.ones_like(observed), obs_f)
        elif m == "mar_ipw_fqe":
            tilde = np.zeros_like(rewards)
            for t in range(horizon):
                x = np.c_[states[:, t], actions[:, t]]
                p = np.clip(_logistic_fit(x, obs_f[:, t])(x), *ipw_clip)
                tilde[:, t] = obs_f[:, t] * np.nan_to_num(r_obs[:, t]) / p
            plans[m] = (tilde, np.ones_like(observed), obs_f)

    def state_value(q, s, o_prev):  # sum_a pi(a | s, o_prev) Q(s, a)
        pi = np.asarray(policy(s, o_prev), np.float64)
        return (pi * np.stack([q(np.c_[s, np.full(len(s), a)]) for a in avals], axis=1)).sum(axis=1)

    out, q_funcs = {}, {}
    for m in plans:
        tilde, rows_all, next_o = plans[m]
        qs, lams = [None] * horizon, []
        for t in reversed(range(horizon)):
            rows = rows_all[:, t]
            y = tilde[rows, t].copy()
            if t + 1 < horizon:
                y += gamma * state_value(qs[t + 1], states[rows, t + 1], next_o[rows, t])
            qs[t] = design(t, rows).fit(y)
            lams.append(getattr(qs[t], "lam", None))
        q_funcs[m] = qs
        if m in methods:
            infos[m]["krr_lambdas"] = lams[::-1]
            out[m] = OPEResult(float(state_value(qs[0], states[:, 0], np.zeros(n)).mean()), m, infos[m])
    if "scope_is" in methods:
        value, info = _scope_is(states, actions, np.nan_to_num(r_obs), obs_f, policy, behaviour, avals, gamma,
                                potentials=lambda t, s, o: state_value(q_funcs["naive_fqe"][t], s, o))
        out["scope_is"] = OPEResult(value, "scope_is", info)
    return {m: out[m] for m in methods}


def _scope_is(states, actions, r_zero, obs_f, policy, behaviour, avals, gamma, *, potentials):
    """Per-decision IS with missing rewards as 0 and potential-based shaping (SCOPE-style).

    ``V = mean_i [Phi_1(S_1, 0) + sum_t gamma^(t-1) rho_(1:t) (O_t R_t + gamma Phi_(t+1)(S_(t+1), O_t)
    - Phi_t(S_t, O_(t-1)))]`` with ``rho_(1:t) = prod_(u<=t) pi_u(A_u | S_u, O_(u-1)) / mu(A_u | S_u)``
    and ``Phi_(T+1) = 0``. The shaping telescopes when rho = 1, so it only reduces variance; the zeros
    for missing rewards make the estimate biased under any missingness (the point of the baseline).
    """
    n, horizon = actions.shape
    a_idx = np.argmin(np.abs(actions[..., None] - avals), axis=-1)  # [n, T] column of each logged action
    o_prev = np.c_[np.zeros(n), obs_f[:, :-1]]
    rho, total, rows = np.ones(n), np.zeros(n), np.arange(n)
    phi = [potentials(t, states[:, t], o_prev[:, t]) for t in range(horizon)] + [np.zeros(n)]
    for t in range(horizon):
        pi_a = np.asarray(policy(states[:, t], o_prev[:, t]), np.float64)[rows, a_idx[:, t]]
        mu_a = np.asarray(behaviour(states[:, t]), np.float64)[rows, a_idx[:, t]]
        rho = rho * pi_a / mu_a
        total += gamma ** t * rho * (r_zero[:, t] * obs_f[:, t] + gamma * phi[t + 1] - phi[t])
    return float((phi[0] + total).mean()), {"max_weight": float(rho.max()), "mean_final_weight": float(rho.mean())}
