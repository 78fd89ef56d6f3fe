"""GAAVI tests: type-I error under continuous monitoring (vs the peeking baseline), power one, stopping-time
scaling, predictability, AIPW, confidence-sequence coverage and the baselines, each against Monte Carlo with
tolerances from the number of streams, closed forms or brute force."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.statistics import anytime_valid as av
from primitives import confidence_sequences as cs

ALPHA = 0.05
T = 1000
BURN_IN = 100
BLOCK = 25


def _slack(p, n, k=3.0):
    return k * math.sqrt(p * (1 - p) / n)


def _key(seed):
    # The "rbg" generator: one draw compiles in a fraction of the time of a threefry draw on CPU, and
    # every simulator below draws all of its randomness in one call (the tests are compile-bound).
    return jax.random.key(seed, impl="rbg")


def _uniforms(key, shape):
    return jax.random.uniform(key, shape, minval=1e-7, maxval=1.0 - 1e-7)


def _gauss(u):
    return jax.scipy.special.ndtri(u)


def _rf_ridge(d=1):
    return av.ridge_regressor(av.random_fourier_features(jax.random.key(11), d, 16, lengthscale=0.5), dim=d, l2=1.0)


def _stream_from(u, mu_fn):
    """u [2, t] uniforms -> x [t, 1] on [-1, 1], y = mu(x) + (0.5 + |x|) N(0, 1)."""
    x = (2.0 * u[0] - 1.0)[:, None]
    return x, mu_fn(x) + (0.5 + jnp.abs(x[:, 0])) * _gauss(u[1])


def _stream(key, t, mu_fn):
    return _stream_from(_uniforms(key, (2, t)), mu_fn)


def _quadratic(delta):
    return lambda x: delta * (x[:, 0] ** 2 - 1.0 / 3.0)


# ---------------------------------------------------------------------------------------------- null / power


@functools.partial(jax.jit, static_argnames="n")
def _run_many(key, delta, heavy_tailed, n):
    """GAAVI, the peeking and fixed-n z-tests and the linear-projection test on n streams with
    mu = delta (x^2 - 1/3) and Gaussian (or, when heavy_tailed, scaled t_3) heteroscedastic noise."""
    reg = _rf_ridge()

    def one(u):
        x = (2.0 * u[0] - 1.0)[:, None]
        eps = _gauss(u[1])
        chi2_3 = jnp.sum(_gauss(u[2:5]) ** 2, axis=0)
        eps = jnp.where(heavy_tailed, eps / jnp.sqrt(chi2_3 / 3.0) / math.sqrt(3.0), eps)  # t_3 scaled to variance 1
        y = delta * (x[:, 0] ** 2 - 1.0 / 3.0) + (0.5 + jnp.abs(x[:, 0])) * eps
        g = av.gaavi_test(x, y, regressor=reg, alpha=ALPHA, burn_in=BURN_IN, block_size=BLOCK)
        peek = av.peeking_z_test(g.test.s, g.test.v, alpha=ALPHA, burn_in=BURN_IN)
        fixed = av.fixed_sample_z_test(g.test.s, g.test.v, alpha=ALPHA)
        lin = av.linear_projection_test(x, y, alpha=ALPHA, burn_in=BURN_IN, block_size=BLOCK)
        return g.test.rejected, g.test.stop_time, peek.rejected, fixed, lin.test.rejected

    return jax.vmap(one)(_uniforms(key, (n, 5, T)))


def _runs(n, seed, delta=0.0, heavy_tailed=False):
    out = _run_many(_key(seed), jnp.float32(delta), jnp.bool_(heavy_tailed), n)
    return dict(zip(["gaavi", "tau", "peek", "fixed", "linear"], (np.asarray(o) for o in out)))


N_NULL = 1500  # every call of _run_many uses this many streams (one compilation)


@pytest.fixture(scope="module")
def null_runs():
    return _runs(N_NULL, 0)


def test_type_one_error_under_continuous_monitoring(null_runs):
    """The acceptance test: GAAVI <= alpha + MC slack when looking after every sample; peeking exceeds alpha."""
    slack = _slack(ALPHA, N_NULL)
    assert null_runs["gaavi"].mean() <= ALPHA + slack
    assert null_runs["linear"].mean() <= ALPHA + slack
    assert null_runs["peek"].mean() > ALPHA + slack
    assert null_runs["peek"].mean() > 3 * null_runs["gaavi"].mean()
    # The same z-statistic used once at the horizon is (asymptotically) valid: the inflation is the peeking.
    assert abs(null_runs["fixed"].mean() - ALPHA) <= _slack(ALPHA, N_NULL, 4.0)


def test_type_one_error_heavy_tailed_noise():
    n = N_NULL
    runs = _runs(n, 1, heavy_tailed=True)
    assert runs["gaavi"].mean() <= ALPHA + _slack(ALPHA, n)


def test_power_one_and_linear_projection_blind_spot():
    """A clear nonlinear alternative with zero linear projection: every GAAVI stream stops within T, the
    linear-projection test stays at level alpha (its statistic is still a martingale there)."""
    n = N_NULL
    runs = _runs(n, 2, delta=1.5)
    assert runs["gaavi"].mean() >= 0.99
    assert np.all(runs["tau"][runs["gaavi"]] <= T)
    assert runs["linear"].mean() <= ALPHA + _slack(ALPHA, n)


def test_stopping_time_matches_gaussian_location_rate():
    """Oracle weights mu / sigma^2 with known variance: E[tau] E[mu^2/sigma^2] / (2 log(1/alpha)) in [0.8, 1.5]."""
    alpha, delta, n, t = 1e-3, 0.3, 300, 3000
    info = delta ** 2 / 3.0  # E[mu^2 / sigma^2] for mu = delta x, sigma = 1, x ~ U[-1, 1]
    v_star = 2 * math.log(1 / alpha)
    rho = float(cs.optimal_rho(v_star, alpha))
    reg = av.fixed_regressor(lambda x: delta * x[:, 0])
    unit = av.fixed_regressor(lambda x: jnp.ones(x.shape[0]))

    @jax.jit
    def run(key):
        def one(u):
            x = (2.0 * u[0] - 1.0)[:, None]
            y = delta * x[:, 0] + _gauss(u[1])
            g = av.gaavi_test(x, y, regressor=reg, variance_regressor=unit, alpha=alpha, burn_in=10, rho=rho,
                              variance="predictable", normalize_weights=False)
            return g.test.rejected, g.test.stop_time

        return jax.vmap(one)(_uniforms(key, (n, 2, t)))

    rej, tau = (np.asarray(o) for o in run(_key(4)))
    assert rej.all()
    ratio = tau.mean() * info / v_star
    assert 0.8 <= ratio <= 1.5, ratio


# ---------------------------------------------------------------------------------------------- structure


@pytest.mark.parametrize("block_size", [5])  # block_size = 1 runs the same code (blocks of one sample)
def test_weights_are_predictable(block_size):
    """Perturbing future data never changes past statistics; perturbing Y_j does not change w_j."""
    t, j = 60, 33
    x, y = _stream(_key(7), t, _quadratic(1.0))
    reg = _rf_ridge()
    f = jax.jit(lambda x, y: av.weighted_residual_martingale(x, y, regressor=reg, block_size=block_size,
                                                             reference_size=8))
    base = f(x, y)
    y2 = y.at[j:].add(5.0)
    x2 = x.at[j:].set(-x[j:])
    for pert in (f(x, y2), f(x2, y2)):
        for a, b in zip(base, pert):
            np.testing.assert_array_equal(np.asarray(a[:j]), np.asarray(b[:j]))
    only_y = f(x, y2)
    np.testing.assert_array_equal(np.asarray(base.weight[j]), np.asarray(only_y.weight[j]))
    # ... and the regressor does learn from the perturbed samples afterwards.
    assert not np.allclose(np.asarray(base.weight[-block_size:]), np.asarray(only_y.weight[-block_size:]))


def test_ridge_regressor_matches_numpy_closed_form():
    feat = av.polynomial_features(3)
    reg = av.ridge_regressor(feat, dim=2, l2=0.7)
    rng = np.random.default_rng(0)
    xs = rng.uniform(-1, 1, (3, 10, 2)).astype(np.float32)
    ys = rng.normal(size=(3, 10)).astype(np.float32)
    sw = (rng.random((3, 10)) < 0.7).astype(np.float32)
    state = reg.init()
    for xb, yb, wb in zip(xs, ys, sw):
        state = reg.update(state, jnp.asarray(xb), jnp.asarray(yb), jnp.asarray(wb))
    phi = np.asarray(feat(jnp.asarray(xs.reshape(-1, 2))), np.float64)
    w = sw.reshape(-1).astype(np.float64)
    beta = np.linalg.solve(phi.T @ (phi * w[:, None]) + 0.7 * np.eye(phi.shape[1]), phi.T @ (w * ys.reshape(-1)))
    np.testing.assert_allclose(np.asarray(state.beta), beta, rtol=2e-3, atol=2e-4)


def test_mlp_regressor_learns():
    reg = av.mlp_regressor(jax.random.key(0), 1, hidden=16, learning_rate=0.3, decay_rate=0.2, steps_per_update=2)
    xs = jax.random.uniform(jax.random.key(1), (200, 20, 1), minval=-1, maxval=1)
    ys = jnp.sin(3 * xs[..., 0])
    state = jax.lax.fori_loop(0, 200, lambda i, s: reg.update(s, xs[i], ys[i], jnp.ones(20)), reg.init())
    xt = jnp.linspace(-1, 1, 101)[:, None]
    mse = float(jnp.mean((reg.predict(state, xt) - jnp.sin(3 * xt[:, 0])) ** 2))
    assert mse < 0.2 * float(jnp.mean(jnp.sin(3 * xt[:, 0]) ** 2))


def test_aipw_pseudo_outcome_conditional_mean_with_wrong_nuisances():
    """At a fixed x, E[phi | X = x] = tau(x) for arbitrary (wrong) outcome models (MC, 4 SE)."""
    n, e = 100_000, 0.3
    mu1, mu0 = 1.7, -0.4  # tau(x) = 2.1 at this x
    u = _uniforms(_key(9), (2, n))
    a = (u[0] < e).astype(jnp.float32)
    y = jnp.where(a > 0, mu1, mu0) + 0.8 * _gauss(u[1])
    for m1, m0 in [(0.0, 0.0), (5.0, -3.0), (mu1, mu0)]:
        phi = np.asarray(av.aipw_pseudo_outcome(y, a, e, m1, m0), np.float64)
        assert abs(phi.mean() - (mu1 - mu0)) <= 4 * phi.std() / math.sqrt(n)


def _cate_stream(u, delta, shift=0.0):
    """u [3, t] -> a randomized trial: A ~ Bernoulli(1/2), mu_0 = 1 + x + x^2, tau = shift + delta sin(pi x)."""
    x = (2.0 * u[0] - 1.0)[:, None]
    a = (u[1] < 0.5).astype(jnp.float32)
    m0 = 1.0 + x[:, 0] + x[:, 0] ** 2
    tau = shift + delta * jnp.sin(math.pi * x[:, 0])
    return x, a, m0 + a * tau + _gauss(u[2])


def test_contrast_confidence_sequence_level_power_and_coverage():
    """Inverting the AIPW contrast test over candidate contrasts, with tau(x) = 0.5 + sin(pi x): the true
    function stays in the set (the level of its test, >= 1 - alpha - slack); "no effect" (c = 0) and the
    constant effect equal to the average effect (c = 0.5, wrong only through heterogeneity) are rejected."""
    n, t = 300, 600
    shifts = jnp.array([0.0, 0.5, 1.5])
    reg = _rf_ridge()

    @jax.jit
    def run(key):
        def one(u):
            x, a, y = _cate_stream(u, 1.0, shift=0.5)
            cand = jnp.concatenate([(0.5 + jnp.sin(math.pi * x[:, 0]))[None, :],
                                    jnp.broadcast_to(shifts[:, None], (3, t))])
            return av.contrast_confidence_sequence(x, a, y, cand, propensity=0.5, outcome_regressor=reg,
                                                   regressor=reg, alpha=ALPHA, burn_in=BURN_IN, block_size=BLOCK)

        return jax.vmap(one)(_uniforms(key, (n, 3, t)))

    in_set = np.asarray(run(_key(41)))  # [n, k, t]
    assert in_set[:, 0, -1].mean() >= 1 - ALPHA - _slack(ALPHA, n)  # type-I error of the test of the truth
    assert in_set[:, 1, -1].mean() <= 0.05  # power against "no effect"
    assert in_set[:, 2, -1].mean() <= 0.2  # power against the constant effect 0.5 (ATE-only tests cannot)
    assert in_set[:, 3, -1].mean() <= 0.01
    assert np.all(np.diff(in_set.astype(int), axis=-1) <= 0)  # nested in time


# ---------------------------------------------------------------------------------------------- CS + baselines


def test_local_mean_band_time_uniform_coverage():
    """Box kernel and a linear mu: the localized mean at interior grid points is mu(x_g) exactly."""
    n, t = 500, 600
    grid = jnp.array([-0.5, 0.0, 0.3, 0.6])
    mu = lambda x: 0.8 * x[:, 0] - 0.2

    @jax.jit
    def run(key):
        def one(u):
            x, y = _stream_from(u, mu)
            band = av.local_mean_confidence_band(x, y, grid, bandwidth=0.2, alpha=ALPHA, burn_in=BURN_IN)
            truth = mu(grid[:, None])
            covered = jnp.all((band.lower <= truth) & (truth <= band.upper))
            return covered, band.upper[-1] - band.lower[-1]

        return jax.vmap(one)(_uniforms(key, (n, 2, t)))

    covered, width = (np.asarray(o) for o in run(_key(21)))
    assert covered.mean() >= 1 - ALPHA - _slack(ALPHA, n)
    assert np.all(np.isfinite(width)) and np.median(width) < 0.7


def test_inversion_confidence_sequence_covers_truth_and_excludes_far_candidates():
    n, t = 200, 600
    slopes = jnp.array([-0.6, 0.0, 0.6, 1.2, 1.8])
    true_k = 2
    reg = _rf_ridge()

    @jax.jit
    def run(key):
        def one(u):
            x, y = _stream_from(u, lambda x: 0.6 * x[:, 0])
            cand = slopes[:, None] * x[None, :, 0]
            return av.inversion_confidence_sequence(x, y, cand, regressor=reg, alpha=ALPHA, burn_in=BURN_IN,
                                                    block_size=BLOCK)

        return jax.vmap(one)(_uniforms(key, (n, 2, t)))

    in_set = np.asarray(run(_key(31)))  # [n, k, t]
    assert in_set[:, :, :BURN_IN - 1].all()
    assert in_set[:, true_k, -1].mean() >= 1 - ALPHA - _slack(ALPHA, n)
    assert in_set[:, [0, 4], -1].mean() <= 0.05
    assert np.all(np.diff(in_set.astype(int), axis=-1) <= 0)  # nested in time


def test_discretized_test_level_power_and_cell_index():
    n = 1000

    @jax.jit
    def run(key, slope, wiggle):
        def one(u):
            x, y = _stream_from(u, lambda x: slope * x[:, 0] + wiggle * jnp.sin(4 * math.pi * x[:, 0]))
            return av.discretized_test(x, y, bins_per_dim=4, alpha=ALPHA, burn_in=BURN_IN).rejected

        return jax.vmap(one)(_uniforms(key, (n, 2, T)))

    assert np.asarray(run(_key(51), 0.0, 0.0)).mean() <= ALPHA + _slack(ALPHA, n)
    assert np.asarray(run(_key(52), 1.0, 0.0)).mean() >= 0.95
    # Blind to sin(4 pi x): its mean is 0 in each of the 4 cells of width 1/2, so every cell stays a martingale.
    assert np.asarray(run(_key(53), 0.0, 1.5)).mean() <= ALPHA + _slack(ALPHA, n)
    x = np.random.default_rng(0).uniform(-1, 1, (200, 3)).astype(np.float32)
    idx = np.asarray(av.cell_index(jnp.asarray(x), bins_per_dim=3))
    brute = [sum(min(int((xi[j] + 1) / 2 * 3), 2) * 3 ** j for j in range(3)) for xi in x]
    np.testing.assert_array_equal(idx, brute)


def test_bad_arguments_raise():
    reg = _rf_ridge()
    x = jnp.zeros((10, 1))
    with pytest.raises(ValueError, match="block_size"):
        av.weighted_residual_martingale(x, jnp.zeros(10), regressor=reg, block_size=3)
    with pytest.raises(ValueError, match="y"):
        av.weighted_residual_martingale(x, jnp.zeros(9), regressor=reg)
    with pytest.raises(ValueError, match="variance"):
        av.gaavi_test(x, jnp.zeros(10), regressor=reg, burn_in=2, variance="oops")
    with pytest.raises(ValueError, match="candidate_values"):
        av.inversion_confidence_sequence(x, jnp.zeros(10), jnp.zeros((3, 9)), regressor=reg, burn_in=2)
    with pytest.raises(ValueError, match="kernel"):
        av.local_mean_confidence_band(x, jnp.zeros(10), jnp.zeros(2), bandwidth=0.1, burn_in=2, kernel="tri")
    with pytest.raises(ValueError, match="propensity"):
        av.aipw_martingale(x, jnp.zeros(10), jnp.zeros(10), propensity=1.0, outcome_regressor=reg, regressor=reg)


def test_fixed_mean_and_variance_regressors_give_likelihood_ratio_weights():
    """The regressor predicts the mean, not the weight: with fixed mu and sigma^2 (no normalization) the weight
    is mu / sigma^2 and the predictable variance mu^2 / sigma^2 (closed form, heteroscedastic)."""
    x = jnp.linspace(-1.0, 1.0, 50)[:, None]
    mu, s2 = 0.3 * x[:, 0], (0.5 + jnp.abs(x[:, 0])) ** 2
    tr = av.weighted_residual_martingale(x, jnp.ones(50), regressor=av.fixed_regressor(lambda z: 0.3 * z[:, 0]),
                                         variance_regressor=av.fixed_regressor(lambda z: (0.5 + jnp.abs(z[:, 0])) ** 2),
                                         block_size=BLOCK, normalize_weights=False, max_weight=1e6)
    np.testing.assert_allclose(np.asarray(tr.weight), np.asarray(mu / s2), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(tr.v_predictable), np.asarray(mu ** 2 / s2), rtol=1e-5, atol=1e-8)
