"""GAAVI: asymptotic anytime-valid tests and confidence sequences for the conditional mean function.

Tests H0: mu(x) = E[Y | X = x] = f0(x), or a treatment contrast tau(x) = c(x), on a stream, looking
after every sample from a burn-in m on. A predictable weight w_t (a sequential regressor fitted on the
data before t, ideally mu / sigma^2) makes S_t = sum_i w_i(X_i) (Y_i - f0(X_i)) a martingale under H0;
the test is the delayed-start normal-mixture boundary of `primitives.confidence_sequences`. This is
the library's reconstruction of the paper's design (confidence in the exact statistic: low-medium).

Public functions:
  * sequential regressors (`SequentialRegressor`): `ridge_regressor` on `linear_features`,
    `polynomial_features` or `random_fourier_features`; `mlp_regressor`, `fixed_regressor` (oracle
    weights), `running_mean_regressor`;
  * martingales: `weighted_residual_martingale`, `aipw_martingale` (with `aipw_pseudo_outcome`);
  * tests: `gaavi_test`, `gaavi_contrast_test`; baselines `peeking_z_test` (not anytime valid),
    `fixed_sample_z_test`, `linear_projection_test`, `discretized_test` (with `cell_index`);
  * confidence sequences by inversion: `inversion_confidence_sequence`, `contrast_confidence_sequence`,
    `local_mean_confidence_band`.

All functions take one stream; vmap over streams (see `experiments/anytime_cmf.py`).

Dimension legend: `t` samples (time), `d` covariate dimension, `n` rows in one block or call,
`p` regression features, `k` candidate functions, `g` grid points, `b` cells.

Spec: `../shared/papers/specs/statistics_theory.md`, section 3.

References:
  Cho, Dwivedi, Kallus, "GAAVI: Global Asymptotic Anytime Valid Inference for the Conditional Mean
    Function", arXiv:2602.08096, 2026.
  Bibaut, Kallus, Lindon, "Near-Optimal Non-Parametric Sequential Tests and Confidence Sequences with
    Possibly Dependent Observations", arXiv:2212.14411, 2022.
  Lindon, Ham, Tingley, Bojinov, "Anytime-Valid Linear Models and Regression Adjusted Causal
    Inference in Randomized Experiments", arXiv:2210.08589, 2022 (the linear-projection baseline).
  Rahimi, Recht, "Random Features for Large-Scale Kernel Machines", NeurIPS 2007.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from primitives import confidence_sequences as cs

__all__ = [
    "SequentialRegressor",
    "linear_features",
    "polynomial_features",
    "random_fourier_features",
    "ridge_regressor",
    "mlp_regressor",
    "fixed_regressor",
    "running_mean_regressor",
    "aipw_pseudo_outcome",
    "MartingaleTrace",
    "weighted_residual_martingale",
    "aipw_martingale",
    "GaaviResult",
    "gaavi_test",
    "gaavi_contrast_test",
    "PeekingResult",
    "peeking_z_test",
    "fixed_sample_z_test",
    "linear_projection_test",
    "DiscretizedResult",
    "discretized_test",
    "cell_index",
    "inversion_confidence_sequence",
    "contrast_confidence_sequence",
    "ConfidenceBand",
    "local_mean_confidence_band",
]

Array = jax.Array
FeatureFn = Callable[[Array], Array]


# --------------------------------------------------------------------------------------------------
# Sequential regressors: pure (init, predict, update) triples over a state pytree.
# --------------------------------------------------------------------------------------------------


class SequentialRegressor(NamedTuple):
    """A sequential regressor as three pure functions over a state pytree.

    Attributes:
      init: () -> state (the regressor before any data; its predictions are used for the first block).
      predict: (state, x [n, d]) -> [n] predictions.
      update: (state, x [n, d], y [n], sample_weight [n]) -> state, after seeing one block of data
        (rows with weight 0 are ignored).
    """

    init: Callable[[], Any]
    predict: Callable[[Any, Array], Array]
    update: Callable[[Any, Array, Array, Array], Any]


def linear_features(x: Array) -> Array:
    """[n, d] -> [n, 1 + d]: intercept and the raw covariates."""
    x = jnp.asarray(x, jnp.float32)
    return jnp.concatenate([jnp.ones(x.shape[:-1] + (1,), x.dtype), x], axis=-1)


def polynomial_features(degree: int) -> FeatureFn:
    """Per-coordinate powers 1..degree plus an intercept (no cross terms): [n, d] -> [n, 1 + d * degree]."""
    if degree < 1:
        raise ValueError(f"degree must be >= 1; got degree={degree}")

    def fn(x):
        x = jnp.asarray(x, jnp.float32)
        powers = [x ** k for k in range(1, degree + 1)]
        return jnp.concatenate([jnp.ones(x.shape[:-1] + (1,), x.dtype)] + powers, axis=-1)

    return fn


def random_fourier_features(key: Array, dim: int, num_features: int, *, lengthscale: float = 0.5,
                            include_linear: bool = True) -> FeatureFn:
    """Random Fourier features of a Gaussian kernel (plus intercept and, optionally, raw x).

    phi(x) = [1, x, sqrt(2 / p) cos(x Omega / lengthscale + b)], Omega ~ N(0, I), b ~ U[0, 2 pi).

    Args:
      key: PRNG key for the frequencies (fixed once: the feature map is deterministic afterwards).
      dim: covariate dimension d.
      num_features: number p of cosine features.
      lengthscale: Gaussian kernel lengthscale.
      include_linear: append the raw covariates.

    Returns:
      A feature map [n, d] -> [n, 1 + (d if include_linear) + p].

    References:
      Rahimi, Recht, NeurIPS 2007.
    """
    if dim < 1 or num_features < 1:
        raise ValueError(f"dim and num_features must be >= 1; got dim={dim}, num_features={num_features}")
    if not lengthscale > 0:
        raise ValueError(f"lengthscale must be > 0; got lengthscale={lengthscale}")
    k1, k2 = jax.random.split(key)
    omega = jax.random.normal(k1, (dim, num_features), jnp.float32) / lengthscale
    phase = jax.random.uniform(k2, (num_features,), jnp.float32, 0.0, 2.0 * math.pi)
    scale = math.sqrt(2.0 / num_features)

    def fn(x):
        x = jnp.asarray(x, jnp.float32)
        if x.shape[-1] != dim:
            raise ValueError(f"x must have {dim} columns; got shape {x.shape}")
        parts = [jnp.ones(x.shape[:-1] + (1,), x.dtype)]
        if include_linear:
            parts.append(x)
        parts.append(scale * jnp.cos(x @ omega + phase))
        return jnp.concatenate(parts, axis=-1)

    return fn


class RidgeState(NamedTuple):
    gram: Array  # [p, p] sum of weighted phi phi^T
    xty: Array  # [p] sum of weighted phi y
    beta: Array  # [p] current solution
    count: Array  # [] weighted sample count


def ridge_regressor(feature_fn: FeatureFn, *, dim: int, l2: float = 1.0, forgetting: float = 1.0) -> SequentialRegressor:
    """Online ridge regression on a feature map, refitted exactly after every block.

    beta = (sum phi phi^T + l2 I)^{-1} sum phi y over the samples seen so far (with `forgetting` < 1
    the sufficient statistics are discounted per block, for drifting streams).

    Args:
      feature_fn: [n, d] -> [n, p] feature map (`linear_features`, `polynomial_features(k)`,
        `random_fourier_features(...)`).
      dim: covariate dimension d (to size the state).
      l2: ridge penalty (> 0).
      forgetting: per-block discount in (0, 1].

    Returns:
      `SequentialRegressor` whose state is a `RidgeState`.
    """
    if not l2 > 0:
        raise ValueError(f"l2 must be > 0; got l2={l2}")
    if not 0 < forgetting <= 1:
        raise ValueError(f"forgetting must be in (0, 1]; got forgetting={forgetting}")
    p = jax.eval_shape(feature_fn, jax.ShapeDtypeStruct((1, dim), jnp.float32)).shape[-1]

    def init():
        return RidgeState(gram=jnp.zeros((p, p), jnp.float32), xty=jnp.zeros((p,), jnp.float32),
                          beta=jnp.zeros((p,), jnp.float32), count=jnp.zeros((), jnp.float32))

    def predict(state, x):
        return feature_fn(x) @ state.beta

    def update(state, x, y, sample_weight):
        phi = feature_fn(x)
        sw = jnp.asarray(sample_weight, jnp.float32)
        gram = forgetting * state.gram + (phi * sw[:, None]).T @ phi
        xty = forgetting * state.xty + phi.T @ (sw * y)
        # gram + l2 I is symmetric positive definite: a Cholesky solve (cheaper to compile than LU).
        chol = jnp.linalg.cholesky(gram + l2 * jnp.eye(p, dtype=jnp.float32))
        beta = jax.scipy.linalg.cho_solve((chol, True), xty[:, None])[:, 0]
        return RidgeState(gram=gram, xty=xty, beta=beta, count=forgetting * state.count + jnp.sum(sw))

    return SequentialRegressor(init=init, predict=predict, update=update)


def mlp_regressor(key: Array, dim: int, *, hidden: int = 32, learning_rate: float = 0.05, decay_rate: float = 0.5,
                  steps_per_update: int = 1) -> SequentialRegressor:
    """A one-hidden-layer tanh MLP trained online by SGD on the squared loss (a "neural network" weight).

    After each block it takes `steps_per_update` gradient steps on the block's weighted mean squared
    error with step size learning_rate / (1 + k)^decay_rate at update k (the "decay rate" reading of
    the paper's hyper-parameter that concerns the weight learner).

    Args:
      key: PRNG key for the initial parameters (output layer starts at 0, so the first weights are 0).
      dim: covariate dimension.
      hidden: hidden width.
      learning_rate: initial SGD step size.
      decay_rate: exponent of the step-size decay (0 = constant).
      steps_per_update: SGD steps per block.

    Returns:
      `SequentialRegressor` with state (params, update_count).
    """
    if hidden < 1 or steps_per_update < 1:
        raise ValueError(f"hidden and steps_per_update must be >= 1; got {hidden}, {steps_per_update}")
    k1, _ = jax.random.split(key)
    params0 = {"w1": jax.random.normal(k1, (dim, hidden), jnp.float32) / math.sqrt(dim),
               "b1": jnp.zeros((hidden,), jnp.float32), "w2": jnp.zeros((hidden,), jnp.float32),
               "b2": jnp.zeros((), jnp.float32)}

    def net(params, x):
        h = jnp.tanh(jnp.asarray(x, jnp.float32) @ params["w1"] + params["b1"])
        return h @ params["w2"] + params["b2"]

    def loss(params, x, y, sw):
        err = net(params, x) - y
        return jnp.sum(sw * err * err) / jnp.maximum(jnp.sum(sw), 1.0)

    grad = jax.grad(loss)

    def init():
        return (params0, jnp.zeros((), jnp.float32))

    def predict(state, x):
        return net(state[0], x)

    def update(state, x, y, sample_weight):
        params, k = state
        lr = learning_rate / (1.0 + k) ** decay_rate
        for _ in range(steps_per_update):
            g = grad(params, x, y, jnp.asarray(sample_weight, jnp.float32))
            params = jax.tree.map(lambda p_, g_: p_ - lr * g_, params, g)
        return (params, k + 1.0)

    return SequentialRegressor(init=init, predict=predict, update=update)


def fixed_regressor(fn: Callable[[Array], Array]) -> SequentialRegressor:
    """A regressor that always predicts fn(x); never learns.

    As the `regressor` of `weighted_residual_martingale` it is an oracle mean: the weight is its
    prediction divided by the variance regressor's, so oracle weights mu / sigma^2 take fn = mu with a
    fixed variance regressor sigma^2 (fn = mu / sigma^2 there would give mu / sigma^4).
    """

    def predict(state, x):
        del state
        return jnp.asarray(fn(x), jnp.float32)

    return SequentialRegressor(init=lambda: (), predict=predict, update=lambda s, x, y, w: s)


def running_mean_regressor(*, prior_mean: float = 1.0, prior_count: float = 1.0) -> SequentialRegressor:
    """Predicts the (weighted) running mean of y everywhere, shrunk toward `prior_mean` with `prior_count`."""

    def init():
        return (jnp.asarray(prior_mean * prior_count, jnp.float32), jnp.asarray(prior_count, jnp.float32))

    def predict(state, x):
        total, count = state
        return jnp.full(x.shape[:-1], total / count, jnp.float32)

    def update(state, x, y, sample_weight):
        sw = jnp.asarray(sample_weight, jnp.float32)
        return (state[0] + jnp.sum(sw * y), state[1] + jnp.sum(sw))

    return SequentialRegressor(init=init, predict=predict, update=update)


# --------------------------------------------------------------------------------------------------
# The weighted residual martingale.
# --------------------------------------------------------------------------------------------------


def aipw_pseudo_outcome(y: Array, a: Array, propensity: Array, m1: Array, m0: Array) -> Array:
    """AIPW pseudo-outcome, whose conditional mean given X is tau(X) = mu_1(X) - mu_0(X) for any m1, m0.

    phi = m1 - m0 + A (Y - m1) / e - (1 - A)(Y - m0) / (1 - e), elementwise (all arguments broadcast).

    Args:
      y: outcomes. a: treatment indicators in {0, 1}. propensity: known e(X) in (0, 1).
      m1, m0: outcome-model predictions for the treated / control arm (predictable in GAAVI).

    Returns:
      phi, same broadcast shape.

    References:
      Robins, Rotnitzky, Zhao (1994); Cho, Dwivedi, Kallus, arXiv:2602.08096 (its use for contrasts).

    Examples:
      >>> float(aipw_pseudo_outcome(3.0, 1.0, 0.5, 1.0, 0.0))
      5.0
    """
    y, a, e, m1, m0 = (jnp.asarray(v, jnp.float32) for v in (y, a, propensity, m1, m0))
    return m1 - m0 + a * (y - m1) / e - (1.0 - a) * (y - m0) / (1.0 - e)


class MartingaleTrace(NamedTuple):
    """Per-sample quantities of the weighted residual martingale (each [t]).

    Attributes:
      z: increments Z_t = w_t(X_t) r_t.
      v_realized: Z_t^2.
      v_predictable: w_t(X_t)^2 sigma_hat^2_{t-1}(X_t).
      weight: w_t(X_t) (predictable).
      residual: r_t = Y_t - f0(X_t), or phi_t - c(X_t) for contrasts.
      prediction: g_hat_{t-1}(X_t), the regressor's prediction of E[r | X].
    """

    z: Array
    v_realized: Array
    v_predictable: Array
    weight: Array
    residual: Array
    prediction: Array


def _as_stream(x, name="x"):
    x = jnp.asarray(x, jnp.float32)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"{name} must be [t, d] (or [t]); got shape {x.shape}")
    return x


def _per_sample(v, t, name):
    v = jnp.asarray(v, jnp.float32)
    if v.ndim == 0:
        return jnp.full((t,), v)
    if v.shape != (t,):
        raise ValueError(f"{name} must be a scalar or [t={t}]; got shape {v.shape}")
    return v


def _check_block(t, block_size):
    if block_size < 1 or t % block_size:
        raise ValueError(f"block_size must be >= 1 and divide the stream length t={t}; got block_size={block_size}")


def _martingale_scan(x, y, a, e, c, *, regressor, variance_regressor, outcome_regressor, block_size, max_weight,
                     normalize_weights, shrink_steps, default_weight, var_floor, reference_size):
    t, d = x.shape
    nb = t // block_size
    aipw = outcome_regressor is not None
    var_reg = variance_regressor if variance_regressor is not None else running_mean_regressor()
    ref = max(reference_size, block_size) if normalize_weights else 1

    def raw_weight(wstate, vstate, xs):
        g = regressor.predict(wstate, xs)
        s2 = jnp.maximum(var_reg.predict(vstate, xs), var_floor)
        return g, g / s2, s2

    def step(carry, blk):
        wstate, vstate, o1, o0, ref_x, ref_n, n_seen = carry
        xb, yb, ab, eb, cb = blk
        if aipw:
            m1 = outcome_regressor.predict(o1, xb)
            m0 = outcome_regressor.predict(o0, xb)
            r = aipw_pseudo_outcome(yb, ab, eb, m1, m0) - cb
        else:
            r = yb - cb
        g, w, s2 = raw_weight(wstate, vstate, xb)
        if normalize_weights:
            _, w_ref, _ = raw_weight(wstate, vstate, ref_x)
            valid = (jnp.arange(ref) < ref_n).astype(jnp.float32)
            ms = jnp.sum(valid * w_ref * w_ref) / jnp.maximum(jnp.sum(valid), 1.0)
            scale = jnp.sqrt(ms)
            w = jnp.where(scale > 1e-12, w / jnp.where(scale > 1e-12, scale, 1.0), 0.0)
        if shrink_steps > 0:
            lam = shrink_steps / (shrink_steps + n_seen)
            w = (1.0 - lam) * w + lam * default_weight
        w = jnp.clip(w, -max_weight, max_weight)
        z = w * r
        out = (z, z * z, w * w * s2, w, r, g)
        # Learn from this block only after its weights are fixed (predictability).
        ones = jnp.ones((block_size,), jnp.float32)
        wstate = regressor.update(wstate, xb, r, ones)
        vstate = var_reg.update(vstate, xb, (r - g) ** 2, ones)
        if aipw:
            o1 = outcome_regressor.update(o1, xb, yb, ab)
            o0 = outcome_regressor.update(o0, xb, yb, 1.0 - ab)
        if normalize_weights:
            ref_x = jnp.concatenate([ref_x, xb], axis=0)[-ref:]
            ref_n = jnp.minimum(ref_n + block_size, ref)
        return (wstate, vstate, o1, o0, ref_x, ref_n, n_seen + block_size), out

    o_init = outcome_regressor.init() if aipw else ()
    carry0 = (regressor.init(), var_reg.init(), o_init, o_init, jnp.zeros((ref, d), jnp.float32),
              jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32))
    blocks = tuple(v.reshape((nb, block_size) + v.shape[1:]) for v in (x, y, a, e, c))
    _, outs = jax.lax.scan(step, carry0, blocks)
    return MartingaleTrace(*(o.reshape(t) for o in outs))


def weighted_residual_martingale(x: Array, y: Array, *, regressor: SequentialRegressor, null_values=None,
                                 variance_regressor: SequentialRegressor | None = None, block_size: int = 1,
                                 max_weight: float = 10.0, normalize_weights: bool = True, shrink_steps: float = 0.0,
                                 default_weight: float = 0.0, var_floor: float = 1e-3,
                                 reference_size: int = 64) -> MartingaleTrace:
    """The predictable weighted residual martingale Z_t = w_t(X_t) (Y_t - f0(X_t)) of one stream.

    Reconstruction of GAAVI's statistic from the spec (low-medium confidence about the paper's exact
    form): w_t = clip(normalize(g_hat_{t-1} / sigma_hat^2_{t-1})), where g_hat is any sequential
    regressor fitted to the residuals r = Y - f0(X) of the previous blocks and sigma_hat^2 a sequential
    regressor (default: the running mean) of the squared prediction errors (r - g_hat)^2.

    Args:
      x: [t, d] covariates (or [t]).
      y: [t] outcomes.
      regressor: the weight learner (`SequentialRegressor`), an estimate g_hat of the mean of the residuals
        (not of the weight: the raw weight is g_hat / sigma_hat^2).
      null_values: f0(X_t), scalar or [t] (default 0: the null mu = 0).
      variance_regressor: sequential regressor of the conditional variance (default: running mean,
        i.e. homoscedastic weights).
      block_size: the regressors are refitted after every block of this many samples (divides t).
      max_weight: clip |w| <= max_weight.
      normalize_weights: divide the raw weight by its root mean square over the last `reference_size`
        past covariates under the current fit (a predictable scale; keeps weights O(1) as g_hat shrinks).
      shrink_steps: > 0 shrinks w toward `default_weight` with factor shrink_steps / (shrink_steps + n)
        after n samples (the "decay" reading that concerns early weights); 0 = off.
      default_weight: the weight shrunk toward.
      var_floor: floor on sigma_hat^2 (absolute; set it relative to Var(Y)).
      reference_size: see `normalize_weights`.

    Returns:
      `MartingaleTrace`; under H0 the partial sums of `z` are a martingale.

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096.
    """
    x = _as_stream(x)
    t = x.shape[0]
    y = _per_sample(y, t, "y")
    _check_block(t, block_size)
    c = _per_sample(0.0 if null_values is None else null_values, t, "null_values")
    zeros = jnp.zeros((t,), jnp.float32)
    return _martingale_scan(x, y, zeros, zeros + 0.5, c, regressor=regressor, variance_regressor=variance_regressor,
                            outcome_regressor=None, block_size=block_size, max_weight=max_weight,
                            normalize_weights=normalize_weights, shrink_steps=shrink_steps,
                            default_weight=default_weight, var_floor=var_floor, reference_size=reference_size)


def aipw_martingale(x: Array, a: Array, y: Array, *, propensity, outcome_regressor: SequentialRegressor,
                    regressor: SequentialRegressor, contrast=0.0, variance_regressor: SequentialRegressor | None = None,
                    block_size: int = 1, max_weight: float = 10.0, normalize_weights: bool = True,
                    shrink_steps: float = 0.0, default_weight: float = 0.0, var_floor: float = 1e-3,
                    reference_size: int = 64) -> MartingaleTrace:
    """The weighted martingale for a treatment contrast: Z_t = w_t(X_t) (phi_t - c(X_t)).

    phi_t is the AIPW pseudo-outcome with predictable outcome models m_1, m_0 (one
    `outcome_regressor` state per arm, fitted on past treated / control samples) and the known
    propensity; under H0: tau = c, E[phi_t - c(X_t) | X_t, past] = 0 for any m_1, m_0, so the partial
    sums are a martingale even when the nuisances never converge.

    Args:
      x: [t, d] covariates. a: [t] treatments in {0, 1}. y: [t] outcomes.
      propensity: known e(X_t), scalar or [t], in (0, 1).
      outcome_regressor: the per-arm outcome model.
      regressor: the weight learner, fitted to phi - c.
      contrast: c(X_t), scalar or [t] (0 = no effect; a constant tests mu_1 = mu_0 + c).
      variance_regressor, block_size, max_weight, normalize_weights, shrink_steps, default_weight,
        var_floor, reference_size: as in `weighted_residual_martingale`.

    Returns:
      `MartingaleTrace` with `residual` = phi - c.

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096.
    """
    x = _as_stream(x)
    t = x.shape[0]
    a = _per_sample(a, t, "a")
    y = _per_sample(y, t, "y")
    e = _per_sample(propensity, t, "propensity")
    if isinstance(propensity, (int, float)) and not 0 < propensity < 1:
        raise ValueError(f"propensity must be in (0, 1); got propensity={propensity}")
    _check_block(t, block_size)
    c = _per_sample(contrast, t, "contrast")
    return _martingale_scan(x, y, a, e, c, regressor=regressor, variance_regressor=variance_regressor,
                            outcome_regressor=outcome_regressor, block_size=block_size, max_weight=max_weight,
                            normalize_weights=normalize_weights, shrink_steps=shrink_steps,
                            default_weight=default_weight, var_floor=var_floor, reference_size=reference_size)


# --------------------------------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------------------------------


class GaaviResult(NamedTuple):
    """A GAAVI test on one stream: the martingale trace and the mixture test on it."""

    trace: MartingaleTrace
    test: cs.MixtureTestResult


def _variance_increments(trace: MartingaleTrace, variance: str) -> Array:
    if variance == "realized":
        return trace.v_realized
    if variance == "predictable":
        return trace.v_predictable
    raise ValueError(f"variance must be 'realized' or 'predictable'; got variance={variance!r}")


def gaavi_test(x: Array, y: Array, *, regressor: SequentialRegressor, alpha: float = 0.05, burn_in: int = 100,
               rho=None, rho_scale=None, two_sided: bool = True, variance: str = "realized", null_values=None,
               **martingale_options) -> GaaviResult:
    """GAAVI's anytime-valid test of the global null mu = f0 on one stream.

    Rejects at the first sample count t >= burn_in with |S_t| >= b(V_t) (normal-mixture boundary,
    `primitives.confidence_sequences`), where S, V come from `weighted_residual_martingale`.

    Args:
      x: [t, d] covariates. y: [t] outcomes.
      regressor: the weight learner.
      alpha: level. burn_in: minimum sample count m before a rejection.
      rho: fixed mixture precision, or rho_scale: rho = rho_scale * V_m (default r(alpha) V_m).
      two_sided: two-sided test (default) or one-sided (E[w mu] > 0).
      variance: "realized" (sum Z^2, default) or "predictable" (sum w^2 sigma_hat^2).
      null_values: f0(X_t) (default 0).
      **martingale_options: forwarded to `weighted_residual_martingale` (block_size, max_weight, ...).

    Returns:
      `GaaviResult` (decision in `.test.rejected`, stopping time in `.test.stop_time`).

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096.
    """
    trace = weighted_residual_martingale(x, y, regressor=regressor, null_values=null_values, **martingale_options)
    test = cs.sequential_mixture_test(trace.z, _variance_increments(trace, variance), alpha=alpha, burn_in=burn_in,
                                      rho=rho, rho_scale=rho_scale, two_sided=two_sided)
    return GaaviResult(trace=trace, test=test)


def gaavi_contrast_test(x: Array, a: Array, y: Array, *, propensity, outcome_regressor: SequentialRegressor,
                        regressor: SequentialRegressor, contrast=0.0, alpha: float = 0.05, burn_in: int = 100,
                        rho=None, rho_scale=None, two_sided: bool = True, variance: str = "realized",
                        **martingale_options) -> GaaviResult:
    """GAAVI's anytime-valid test of a contrast H0: tau = mu_1 - mu_0 = c with AIPW pseudo-outcomes.

    Args: as `aipw_martingale` plus the test options of `gaavi_test`.

    Returns:
      `GaaviResult`.

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096.
    """
    trace = aipw_martingale(x, a, y, propensity=propensity, outcome_regressor=outcome_regressor, regressor=regressor,
                            contrast=contrast, **martingale_options)
    test = cs.sequential_mixture_test(trace.z, _variance_increments(trace, variance), alpha=alpha, burn_in=burn_in,
                                      rho=rho, rho_scale=rho_scale, two_sided=two_sided)
    return GaaviResult(trace=trace, test=test)


def _z_quantile(alpha: float, two_sided: bool) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1); got alpha={alpha}")
    return statistics.NormalDist().inv_cdf(1.0 - alpha / 2.0 if two_sided else 1.0 - alpha)


class PeekingResult(NamedTuple):
    """A fixed-sample z-test applied repeatedly: crossed [t], rejected [], stop_time [] (T + 1 if never)."""

    crossed: Array
    rejected: Array
    stop_time: Array


def peeking_z_test(s: Array, v: Array, *, alpha: float = 0.05, burn_in: int = 1, two_sided: bool = True,
                   peek_every: int = 1) -> PeekingResult:
    """The naive baseline: the fixed-n z-test |S_t| / sqrt(V_t) >= z_{1 - alpha/2}, checked at every peek.

    Valid at one pre-set t; checked at every t >= burn_in (every `peek_every` samples) its type-I error
    grows without bound with the horizon (law of the iterated logarithm).

    Args:
      s: [..., t] martingale S. v: [..., t] its variance V.
      alpha: nominal level of each look. burn_in: first look. two_sided: |z| or z.
      peek_every: look at sample counts burn_in, burn_in + peek_every, ...

    Returns:
      `PeekingResult`.
    """
    s = jnp.asarray(s, jnp.float32)
    v = jnp.asarray(v, jnp.float32)
    if s.shape != v.shape or s.ndim < 1:
        raise ValueError(f"s and v must share a shape with a time axis; got {s.shape} and {v.shape}")
    if peek_every < 1:
        raise ValueError(f"peek_every must be >= 1; got peek_every={peek_every}")
    n = s.shape[-1]
    q = _z_quantile(alpha, two_sided)
    zstat = s / jnp.sqrt(jnp.maximum(v, 1e-30))
    stat = jnp.abs(zstat) if two_sided else zstat
    counts = jnp.arange(1, n + 1)
    look = jnp.logical_and(counts >= burn_in, (counts - burn_in) % peek_every == 0)
    crossed = jnp.logical_and(jnp.logical_and(stat >= q, look), v > 0)
    rejected, tau = cs.stopping_time(crossed, burn_in=burn_in)
    return PeekingResult(crossed=crossed, rejected=rejected, stop_time=tau)


def fixed_sample_z_test(s: Array, v: Array, *, alpha: float = 0.05, two_sided: bool = True) -> Array:
    """The same z-test used once, at the final sample (valid asymptotically): [..., t] -> [...] bool."""
    q = _z_quantile(alpha, two_sided)
    zstat = s[..., -1] / jnp.sqrt(jnp.maximum(v[..., -1], 1e-30))
    return (jnp.abs(zstat) if two_sided else zstat) >= q


def linear_projection_test(x: Array, y: Array, *, l2: float = 1.0, **test_options) -> GaaviResult:
    """Baseline: the GAAVI test with the linear weight w = [1, X]^T beta_hat_{t-1} (ridge on [1, X]).

    Tests beta = 0 in the linear projection of mu; an alternative whose linear projection is zero
    (e.g. mu = x^2 - 1/3 on U[-1, 1]) leaves S a martingale, so this test stays at level alpha there.

    Args:
      x: [t, d] covariates. y: [t] outcomes. l2: ridge penalty.
      **test_options: as in `gaavi_test`.

    References:
      Lindon et al., arXiv:2210.08589 (anytime-valid linear models); Cho, Dwivedi, Kallus, arXiv:2602.08096.
    """
    x = _as_stream(x)
    reg = ridge_regressor(linear_features, dim=x.shape[1], l2=l2)
    return gaavi_test(x, y, regressor=reg, **test_options)


def cell_index(x: Array, *, bins_per_dim: int, low: float = -1.0, high: float = 1.0) -> Array:
    """Index of the grid cell of each row of x [t, d] on [low, high]^d with bins_per_dim^d cells: [t] int32."""
    x = _as_stream(x)
    if bins_per_dim < 1:
        raise ValueError(f"bins_per_dim must be >= 1; got bins_per_dim={bins_per_dim}")
    if not high > low:
        raise ValueError(f"need high > low; got low={low}, high={high}")
    k = bins_per_dim
    b = jnp.clip(jnp.floor((x - low) / (high - low) * k), 0, k - 1).astype(jnp.int32)
    return jnp.sum(b * (k ** jnp.arange(x.shape[1], dtype=jnp.int32)), axis=-1)


class DiscretizedResult(NamedTuple):
    """Per-cell mixture tests with Bonferroni: rejected [], stop_time [], cell_rejected [b], cell_count [b]."""

    rejected: Array
    stop_time: Array
    cell_rejected: Array
    cell_count: Array


def discretized_test(x: Array, y: Array, *, bins_per_dim: int = 4, low: float = -1.0, high: float = 1.0,
                     alpha: float = 0.05, burn_in: int = 100, rho_scale=None, null_values=None,
                     two_sided: bool = True) -> DiscretizedResult:
    """Baseline: bin X into B = bins_per_dim^d cells and test every cell mean with its own mixture test.

    Cell c's martingale is S_c = sum_{X_i in c} (Y_i - f0(X_i)) with realized variance V_c, its boundary
    the normal mixture at level alpha / B with rho_c = rho_scale * V_c(burn_in) (default r(alpha / B));
    the global null is rejected the first time t >= burn_in that any cell crosses. Valid (asymptotically)
    for any mu; powerless against alternatives that average to zero within cells.

    Args:
      x: [t, d] covariates in [low, high]^d. y: [t] outcomes.
      bins_per_dim, low, high: the grid.
      alpha, burn_in, rho_scale, null_values, two_sided: as in `gaavi_test`.

    Returns:
      `DiscretizedResult`.
    """
    x = _as_stream(x)
    t, d = x.shape
    y = _per_sample(y, t, "y")
    if not 1 <= burn_in <= t:
        raise ValueError(f"burn_in must be in [1, t={t}]; got burn_in={burn_in}")
    nb = bins_per_dim ** d
    r = y - _per_sample(0.0 if null_values is None else null_values, t, "null_values")
    onehot = jax.nn.one_hot(cell_index(x, bins_per_dim=bins_per_dim, low=low, high=high), nb, dtype=jnp.float32)
    s = jnp.cumsum(onehot * r[:, None], axis=0)  # [t, b]
    v = jnp.cumsum(onehot * (r * r)[:, None], axis=0)
    counts = jnp.cumsum(onehot, axis=0)
    a_cell = alpha / nb
    rho = cs.resolve_rho(v[burn_in - 1], a_cell, rho_scale=rho_scale, two_sided=two_sided)  # [b]
    b = cs.normal_mixture_boundary(v, rho[None, :], a_cell, two_sided)
    stat = jnp.abs(s) if two_sided else s
    active = jnp.logical_and((jnp.arange(1, t + 1) >= burn_in)[:, None], v[burn_in - 1][None, :] > 0)
    crossed = jnp.logical_and(active, stat >= b)  # [t, b]
    cell_rej, _ = cs.stopping_time(crossed.T, burn_in=burn_in)
    rejected, tau = cs.stopping_time(jnp.any(crossed, axis=1), burn_in=burn_in)
    return DiscretizedResult(rejected=rejected, stop_time=tau, cell_rejected=cell_rej, cell_count=counts[-1])


# --------------------------------------------------------------------------------------------------
# Confidence sequences.
# --------------------------------------------------------------------------------------------------


def _running_not_crossed(crossed: Array) -> Array:
    return jnp.logical_not(jnp.cumsum(crossed.astype(jnp.int32), axis=-1) > 0)


def inversion_confidence_sequence(x: Array, y: Array, candidate_values: Array, **test_options) -> Array:
    """Function-valued confidence sequence by test inversion over a finite class of candidate functions.

    CS_t = {f_k : the GAAVI test of H0: mu = f_k has not rejected by t} (the running intersection of the
    per-time acceptance regions). Each candidate's test is run with its own weight learner fitted to
    Y - f_k(X), vmapped over the candidates. If mu is in the class, P(mu in CS_t for all t >= m) >= 1 - alpha
    asymptotically (before the burn-in every candidate is in the set).

    Args:
      x: [t, d] covariates. y: [t] outcomes.
      candidate_values: [k, t] the candidates' values f_k(X_t) on the stream.
      **test_options: as in `gaavi_test` (regressor, alpha, burn_in, ...).

    Returns:
      [k, t] bool: in_set[k, i] = f_k still in the confidence sequence after sample i + 1.

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096 (inversion; the finite-class version is this library's).
    """
    x = _as_stream(x)
    cand = jnp.asarray(candidate_values, jnp.float32)
    if cand.ndim != 2 or cand.shape[1] != x.shape[0]:
        raise ValueError(f"candidate_values must be [k, t={x.shape[0]}]; got shape {cand.shape}")
    crossed = jax.vmap(lambda f: gaavi_test(x, y, null_values=f, **test_options).test.crossed)(cand)
    return _running_not_crossed(crossed)


def contrast_confidence_sequence(x: Array, a: Array, y: Array, contrasts: Array, **test_options) -> Array:
    """Confidence sequence for a contrast by inverting `gaavi_contrast_test` over candidate contrasts.

    Args:
      x, a, y: the stream ([t, d], [t], [t]).
      contrasts: [k] constant shifts c (tests mu_1 = mu_0 + c) or [k, t] values c_k(X_t).
      **test_options: as in `gaavi_contrast_test` (propensity, outcome_regressor, regressor, ...).

    Returns:
      [k, t] bool, candidate k still in the set after each sample.

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096.
    """
    x = _as_stream(x)
    t = x.shape[0]
    c = jnp.asarray(contrasts, jnp.float32)
    if c.ndim == 1:
        c = jnp.broadcast_to(c[:, None], (c.shape[0], t))
    if c.ndim != 2 or c.shape[1] != t:
        raise ValueError(f"contrasts must be [k] or [k, t={t}]; got shape {jnp.shape(contrasts)}")
    crossed = jax.vmap(lambda ck: gaavi_contrast_test(x, a, y, contrast=ck, **test_options).test.crossed)(c)
    return _running_not_crossed(crossed)


class ConfidenceBand(NamedTuple):
    """A time-uniform band for localized means at grid points: center, lower, upper, each [t, g]."""

    center: Array
    lower: Array
    upper: Array


def local_mean_confidence_band(x: Array, y: Array, grid: Array, *, bandwidth: float, alpha: float = 0.05,
                               burn_in: int = 100, rho_scale=None, kernel: str = "box",
                               intersect: bool = True) -> ConfidenceBand:
    """Closed-form inversion with localized weights w_i = K_h(X_i - x_g), union bound over the grid.

    For each grid point x_g the target is the localized mean theta_g = E[K_h(X - x_g) mu(X)] / E[K_h(X - x_g)]
    (equal to mu(x_g) when mu is locally affine and the kernel symmetric, a smoothed mu otherwise).
    M_t = sum K_i (Y_i - theta_g) is a martingale, so {theta : |sum K_i (Y_i - theta)| <= b(V_t)} with
    the normal-mixture boundary at level alpha / g is an (asymptotic) confidence sequence, i.e. the
    interval center_t +- b(V_t) / sum K_i with center_t = sum K_i Y_i / sum K_i. The intrinsic time uses
    the predictable plug-in V_t = sum K_i^2 (Y_i - center_{i-1})^2, rho = rho_scale * V_m.

    Args:
      x: [t, d] covariates. y: [t] outcomes.
      grid: [g, d] grid points (or [g] when d = 1).
      bandwidth: h > 0.
      alpha: simultaneous level over the grid and all t >= burn_in.
      burn_in: before it the band is (-inf, inf).
      rho_scale: rho = rho_scale * V_m (default r(alpha / g)).
      kernel: "box" (K = 1{|x - x_g|_inf <= h}) or "gaussian" (K = exp(-|x - x_g|^2 / (2 h^2))).
      intersect: return the running intersection (a nested band) instead of the per-time intervals.

    Returns:
      `ConfidenceBand` with [t, g] arrays.

    References:
      Cho, Dwivedi, Kallus, arXiv:2602.08096 (inversion with localized weights, reconstructed).
    """
    x = _as_stream(x)
    t, d = x.shape
    y = _per_sample(y, t, "y")
    grid = jnp.asarray(grid, jnp.float32)
    if grid.ndim == 1:
        grid = grid[:, None]
    if grid.ndim != 2 or grid.shape[1] != d:
        raise ValueError(f"grid must be [g, d={d}]; got shape {grid.shape}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0; got bandwidth={bandwidth}")
    if not 1 <= burn_in <= t:
        raise ValueError(f"burn_in must be in [1, t={t}]; got burn_in={burn_in}")
    diff = x[:, None, :] - grid[None, :, :]  # [t, g, d]
    if kernel == "box":
        k = jnp.all(jnp.abs(diff) <= bandwidth, axis=-1).astype(jnp.float32)
    elif kernel == "gaussian":
        k = jnp.exp(-0.5 * jnp.sum(diff * diff, axis=-1) / bandwidth ** 2)
    else:
        raise ValueError(f"kernel must be 'box' or 'gaussian'; got kernel={kernel!r}")
    ng = grid.shape[0]
    sk = jnp.cumsum(k, axis=0)
    sky = jnp.cumsum(k * y[:, None], axis=0)
    center = sky / jnp.maximum(sk, 1e-12)
    prev_center = jnp.concatenate([jnp.zeros((1, ng), jnp.float32), center[:-1]], axis=0)
    v = jnp.cumsum((k * (y[:, None] - prev_center)) ** 2, axis=0)
    a_g = alpha / ng
    rho = cs.resolve_rho(v[burn_in - 1], a_g, rho_scale=rho_scale)
    half = cs.normal_mixture_boundary(v, rho[None, :], a_g) / jnp.maximum(sk, 1e-12)
    active = jnp.logical_and((jnp.arange(1, t + 1) >= burn_in)[:, None], sk > 0)
    lower = jnp.where(active, center - half, -jnp.inf)
    upper = jnp.where(active, center + half, jnp.inf)
    if intersect:
        lower = jax.lax.cummax(lower, axis=0)
        upper = jax.lax.cummin(upper, axis=0)
    return ConfidenceBand(center=center, lower=lower, upper=upper)
