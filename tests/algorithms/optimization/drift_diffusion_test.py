"""Tests for algorithms/optimization/drift_diffusion.py: timing optimisation, Monte Carlo, environment, MLE.

Kept small on purpose: one timing fixture and one fitting fixture (both models share one compiled optimiser),
float64 numpy/scipy references for the likelihood and the scores.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize
from scipy.special import log_ndtr, ndtr

from algorithms.optimization import drift_diffusion as ddo


def _params(a=4.0, mu0=0.5, beta=1.0, sigma=1.0):
    return ddo.DDMParams(a=jnp.float32(a), mu0=jnp.float32(mu0), beta=jnp.float32(beta), sigma=jnp.float32(sigma))


def ig_cdf64(t, a, mu, sigma=1.0):
    s = sigma * np.sqrt(t)
    return ndtr((mu * t - a) / s) + np.exp(2 * mu * a / sigma**2 + log_ndtr((-mu * t - a) / s))


def ig_logpdf64(t, a, mu, sigma=1.0):
    return np.log(a / sigma) - 0.5 * np.log(2 * np.pi * t**3) - (a - mu * t) ** 2 / (2 * sigma**2 * t)


# ----------------------------------------------------------------------------------------------------
# Optimal timing.
# ----------------------------------------------------------------------------------------------------

_H, _W = 8.0, 1.0  # horizon and transient-kernel width


@pytest.fixture(scope="module")
def timing():
    params = _params(beta=1.0)
    res = ddo.optimal_signal_times(params, _H, kind="transient", width=_W, grid_size=101)
    grid = jnp.linspace(0.0, _H, 17)[:, None]
    prob, se = ddo.mc_response_probability(jax.random.key(0), grid, params, _H, kind="transient", width=_W,
                                           dt=0.04, num_paths=5000)
    return res, np.asarray(grid[:, 0]), np.asarray(prob), np.asarray(se)


def test_optimal_time_beats_brute_force_grid_and_is_stationary(timing):
    res = timing[0]
    # The objective on the scanned grid is a brute-force search (101 points); refinement never loses to it.
    np.testing.assert_allclose(res.grid_tau, np.linspace(0.0, _H, 101), atol=1e-5)
    assert float(res.value) >= float(np.max(res.grid_value)) - 1e-6
    tau = float(res.tau[0])
    assert 0.05 < tau < _H - 0.05  # interior optimum: stationary point
    assert abs(float(res.gradient[0])) < 1e-3


def test_transient_kernel_has_interior_optimum_in_closed_form_and_monte_carlo(timing):
    """An evidence bump that fades (transient kernel) is best timed shortly before the crossing window."""
    res, grid, prob, se = timing
    assert 0.5 * _H < float(res.tau[0]) < _H
    best = int(np.argmax(prob))
    assert 0 < best < len(grid) - 1
    # The interior optimum beats both ends by far more than the Monte-Carlo noise ...
    assert prob[best] - max(prob[0], prob[-1]) > 5 * se[best]
    # ... and the closed-form optimum lies within two MC grid cells of the Monte-Carlo one.
    assert abs(float(res.tau[0]) - grid[best]) <= 2 * (grid[1] - grid[0])


def test_monte_carlo_dominance_earlier_non_negative_signal_is_better():
    """Common random numbers make the Monte-Carlo estimate respect pathwise dominance exactly."""
    grid = jnp.linspace(0.0, 8.0, 9)[:, None]
    prob, _ = ddo.mc_response_probability(jax.random.key(1), grid, _params(beta=0.5), 8.0, kind="decay", width=2.0,
                                          dt=0.08, num_paths=1000)
    assert np.all(np.diff(np.asarray(prob)) <= 1e-6)
    assert float(prob[0] - prob[-1]) > 0.02


def test_two_signal_gradient_matches_finite_differences():
    # Autodiff gradient of a two-pulse schedule (four moving breakpoints) vs central differences, float64.
    with jax.enable_x64(True):
        p64 = ddo.DDMParams(a=jnp.float64(5.0), mu0=jnp.float64(0.4), beta=jnp.float64(0.7), sigma=jnp.float64(1.1))
        obj = lambda tau: ddo.response_probability(tau, p64, 12.0, kind="pulse", width=3.0)  # noqa: E731
        tau = jnp.array([1.5, 6.2], jnp.float64)
        grad = np.asarray(jax.grad(obj)(tau))
        h = 1e-5
        fd = [float(obj(tau + h * e) - obj(tau - h * e)) / (2 * h) for e in np.eye(2)]
        np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-9)


def test_timing_argument_errors():
    with pytest.raises(ValueError, match="horizon must be > 0; got horizon=0.0"):
        ddo.optimal_signal_times(_params(), 0.0, kind="decay", width=1.0)
    with pytest.raises(ValueError, match="key is required"):
        ddo.optimal_signal_times(_params(), 5.0, kind="decay", width=1.0, num_signals=2)
    with pytest.raises(ValueError, match="kind must be one of"):
        ddo.optimal_signal_times(_params(), 5.0, kind="ramp", width=1.0)
    with pytest.raises(ValueError, match=r"tau must have shape \(k, s\); got \(3,\)"):
        ddo.mc_response_probability(jax.random.key(0), jnp.zeros(3), _params(), 5.0, kind="decay", width=1.0)


# ----------------------------------------------------------------------------------------------------
# Environment, fitting, evaluation.
# ----------------------------------------------------------------------------------------------------

_L, _KIND, _WIDTH, _LAPSE = 30.0, "decay", 4.0, 0.02
# Users: two high-threshold signal responders (up and down), one that ignores signals, one strong responder.
_USERS = ddo.DDMParams(a=jnp.array([6.0, 6.0, 3.0, 4.0]), mu0=jnp.array([0.5, 0.5, 0.3, 0.2]),
                       beta=jnp.array([0.6, -0.2, 0.0, 0.8]), sigma=jnp.array([1.0, 1.0, 1.0, 1.0]))


@pytest.fixture(scope="module")
def env():
    S = ddo.simulate_sessions(jax.random.key(5), _USERS, num_sessions=300, max_signals=2, video_length=_L,
                              kind=_KIND, width=_WIDTH, dt=0.04)
    train, test = ddo.split_sessions(S, 240)
    fits = {m: ddo.fit_users(train, model=m, kind=_KIND, width=_WIDTH, lapse=_LAPSE, num_iters=600, init_threshold=4.0)
            for m in ddo.MODELS}
    scores = {m: ddo.evaluate_predictions(fits[m][0], test, model=m, kind=_KIND, width=_WIDTH, event_horizon=10.0,
                                          lapse=_LAPSE) for m in ddo.MODELS}
    return S, train, test, fits, scores


def test_simulated_sessions_structure_and_inverse_gaussian_without_response(env):
    S = env[0]
    assert S.time.shape == (4, 300) and S.tau.shape == (4, 300, 2)
    assert np.all(np.asarray(S.time)[np.asarray(S.censored)] == _L)
    assert np.all(np.asarray(S.tau)[np.asarray(S.mask) == 0] == _L)
    assert set(np.unique(np.asarray(S.mask).sum(-1)).tolist()) == {0.0, 1.0, 2.0}
    # User 2 ignores the signals (beta = 0): leave times follow the inverse Gaussian (a = 3, mu0 = 0.3).
    times = np.asarray(S.time[2])
    for t in (3.0, 8.0, 15.0):
        p = float(ig_cdf64(t, 3.0, 0.3))
        assert abs(np.mean(times <= t) - p) < 3 * np.sqrt(p * (1 - p) / times.size) + 0.01  # + half-step offset


def _censored_ig_nll64(theta, time, censored):
    """Independent float64 numpy NLL of the constant-drift model with the lapse component (sigma = 1)."""
    a, mu = theta
    if a <= 0:
        return np.inf
    obs = np.logaddexp(np.log1p(-_LAPSE) + ig_logpdf64(time, a, mu), np.log(_LAPSE / (2 * _L)))
    cens = np.log((1 - _LAPSE) * np.clip(1 - ig_cdf64(_L, a, mu), 0, 1) + 0.5 * _LAPSE)
    return -np.mean(np.where(censored, cens, obs))


def test_constant_model_mle_equals_scipy_optimum(env):
    """The Adam fit of the inverse-Gaussian model hits the optimum of an independent float64 likelihood."""
    _, train, _, fits, _ = env
    params, hist = fits["constant"]
    assert float(hist[-1]) <= float(hist[0])
    np.testing.assert_allclose(params.beta, 0.0)
    for u in range(4):
        time, cens = np.asarray(train.time[u], np.float64), np.asarray(train.censored[u])
        ref = optimize.minimize(_censored_ig_nll64, x0=[4.0, 0.4], args=(time, cens), method="Nelder-Mead",
                                options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 2000}).x
        np.testing.assert_allclose([params.a[u], params.mu0[u]], ref, rtol=2e-3, atol=2e-3, err_msg=str(u))
    # With no signal response the constant model is the true one: it recovers user 2.
    assert abs(float(params.a[2]) - 3.0) < 0.3 and abs(float(params.mu0[2]) - 0.3) < 0.05


def test_tangent_mle_optimises_the_likelihood_and_recovers_signal_signs(env):
    """The signal model fits better than the constant one, and finds who responds to signals.

    At these thresholds (a = 3-6) the closed form is only approximate for a decaying drift bump, so the
    tangent-model MLE is biased towards smaller |beta| (about 0.1-0.3 here); it is not compared with the
    truth at a tight tolerance.
    """
    _, _, _, fits, _ = env
    params, hist = fits["tangent"]
    assert float(hist[-1]) < float(fits["constant"][1][-1])  # the larger model fits the training data better
    beta = np.asarray(params.beta)
    assert beta[0] > 0.3 and beta[3] > 0.3  # positive responders
    assert abs(beta[2]) < 0.25 and beta[1] < beta[2] + 0.2  # non-responder, negative responder
    np.testing.assert_allclose(params.a, _USERS.a, rtol=0.25)


def test_signal_model_beats_constant_drift_on_held_out_sessions(env):
    scores = env[4]
    assert scores["tangent"]["nll"] < scores["constant"]["nll"]
    assert scores["tangent"]["crps"] < scores["constant"]["crps"]
    assert scores["tangent"]["brier"] < scores["constant"]["brier"]


def test_scores_against_numpy(env):
    """NLL, CRPS (same 64-point trapezoid), median MAE and Brier of the constant model, recomputed in numpy."""
    _, _, test, fits, scores = env
    params = fits["constant"][0]
    a, mu = np.asarray(params.a, np.float64)[:, None], np.asarray(params.mu0, np.float64)[:, None]
    time, cens = np.asarray(test.time, np.float64), np.asarray(test.censored)
    s = scores["constant"]
    nll = np.mean([_censored_ig_nll64((a[u, 0], mu[u, 0]), time[u], cens[u]) for u in range(4)])
    assert s["nll"] == pytest.approx(nll, rel=1e-4)
    t = np.linspace(0.0, _L, 64)
    F = np.where(t > 0, ig_cdf64(np.maximum(t, 1e-12)[None, :], a, mu), 0.0)  # (u, m)
    sq = (F[:, None, :] - (time[..., None] <= t)) ** 2
    crps = np.mean(np.sum(0.5 * (sq[..., 1:] + sq[..., :-1]) * np.diff(t), axis=-1))
    assert s["crps"] == pytest.approx(crps, rel=1e-3)
    med = np.array([optimize.brentq(lambda x: ig_cdf64(x, a[u, 0], mu[u, 0]) - 0.5, 1e-3, _L)
                    if ig_cdf64(_L, a[u, 0], mu[u, 0]) > 0.5 else _L for u in range(4)])
    assert s["mae_median"] == pytest.approx(np.mean(np.abs(med[:, None] - time)), abs=0.05)
    p = ig_cdf64(10.0, a, mu)
    obs = (time <= 10.0) & ~cens
    assert s["brier"] == pytest.approx(np.mean((p - obs) ** 2), rel=1e-3)


def test_likelihood_is_finite_where_closed_form_is_zero():
    """A late strong drift drop clips the density to 0; the lapse component keeps the NLL finite."""
    params = ddo.DDMParams(a=jnp.array([2.0]), mu0=jnp.array([1.0]), beta=jnp.array([-0.9]), sigma=jnp.array([1.0]))
    S = ddo.Sessions(time=jnp.array([[20.0, 3.0]]), censored=jnp.array([[False, False]]),
                     tau=jnp.array([[[6.0], [6.0]]]), mask=jnp.ones((1, 2, 1)), video_length=30.0)
    ll = ddo.session_log_likelihood(params, S, model="tangent", kind="step", width=1.0, lapse=0.02)
    assert np.all(np.isfinite(ll))
    assert float(ll[0, 0]) == pytest.approx(np.log(0.02 / 60.0), rel=1e-5)  # only the lapse term remains
    assert np.isneginf(float(ddo.session_log_likelihood(params, S, model="tangent", kind="step", width=1.0,
                                                        lapse=0.0)[0, 0]))


def test_environment_argument_errors():
    users = _USERS
    three = ddo.DDMParams(*(x[:3] for x in _USERS))
    S = ddo.Sessions(time=jnp.ones((4, 3)), censored=jnp.zeros((4, 3), bool), tau=jnp.zeros((4, 3, 1)),
                     mask=jnp.zeros((4, 3, 1)), video_length=5.0)
    with pytest.raises(ValueError, match="model must be one of"):
        ddo.fit_users(S, model="ig", kind="step", width=1.0)
    with pytest.raises(ValueError, match=r"lapse must be in \[0, 1\); got lapse=1.0"):
        ddo.session_log_likelihood(users, S, model="tangent", kind="step", width=1.0, lapse=1.0)
    with pytest.raises(ValueError, match=r"params must have shape \(u,\) = \(4,\).*got a.shape=\(3,\)"):
        ddo.session_log_likelihood(three, S, model="tangent", kind="step", width=1.0)
    with pytest.raises(ValueError, match=r"num_train must be in \[1, 2\].*got 3"):
        ddo.split_sessions(S, 3)
    with pytest.raises(ValueError, match="num_users must be >= 1; got 0"):
        ddo.sample_users(jax.random.key(0), 0)
    with pytest.raises(ValueError, match="users must be DDMParams of shape"):
        ddo.simulate_sessions(jax.random.key(0), three._replace(a=jnp.ones((3, 1))),
                              num_sessions=2, max_signals=1, video_length=5.0, kind="step", width=1.0)
