"""IR-SDE primitives vs closed forms, a float64 Gaussian posterior and Monte Carlo of the forward SDE."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import diffusion as d


def _posterior_mean_np(xt, x0, mu, t, sch):
    """Product of Gaussians in float64: x_{t-1}|x_0 ~ N(mu + (x0-mu) C, l^2 (1-C^2)) times the exact OU
    transition x_t|x_{t-1} ~ N(mu + (x_{t-1}-mu) A, l^2 (1-A^2)); returns the posterior mean."""
    th = np.asarray(sch.thetas, np.float64); cs = np.asarray(sch.thetas_cumsum, np.float64)
    dt = float(sch.dt); lam = float(sch.max_sigma)
    a, c = np.exp(-th[t] * dt), np.exp(-cs[t - 1] * dt)
    m0, v0 = mu + (x0 - mu) * c, lam**2 * (1 - c**2)
    v1 = lam**2 * (1 - a**2)          # likelihood of y = x_{t-1} - mu: (x_t - mu) = a y + noise
    prec = 1 / v0 + a**2 / v1
    return ((m0 - mu) / v0 + a * (xt - mu) / v1) / prec + mu


def test_schedule_endpoints():
    sch = d.irsde_schedule(T=100, max_sigma=30 / 255)
    lam = 30 / 255
    assert float(sch.thetas_cumsum[0]) == 0.0 and float(sch.sigma_bars[0]) == 0.0
    # sigmabar_T^2 = lambda^2 (1 - eps^2) exactly (spec (e)); exp(-thetabar_T dt) = eps.
    np.testing.assert_allclose(float(sch.sigma_bars[-1]) ** 2, lam**2 * (1 - 0.005**2), rtol=1e-5)
    np.testing.assert_allclose(np.exp(-float(sch.thetas_cumsum[-1]) * float(sch.dt)), 0.005, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(sch.sigmas) ** 2, 2 * lam**2 * np.asarray(sch.thetas), rtol=1e-5)


def test_marginal_matches_monte_carlo_of_forward_steps():
    T, n = 100, 20000
    sch = d.irsde_schedule(T=T, max_sigma=0.5)
    x0 = jnp.full((n,), 1.0); mu = jnp.full((n,), -0.3)
    x = x0
    keys = jax.random.split(jax.random.PRNGKey(0), T)
    step = jax.jit(lambda k, x, t: d.forward_step(k, x, mu, t, sch))
    for t in range(1, T + 1):
        x = step(keys[t - 1], x, t)
        if t in (10, 50, 100):
            mean, std = d.marginal_mean_std(x0, mu, t, sch)
            # Euler discretisation bias (spec (e): ~1 % on the std at T = 100) plus MC error std/sqrt(n):
            # 3 % of the scale lambda on the mean, 3 % relative on the std.
            assert abs(float(x.mean()) - float(mean[0])) < 0.03 * 0.5 + 4 * float(std) / np.sqrt(n)
            assert abs(float(x.std()) / float(std) - 1) < 0.03 + 4 / np.sqrt(2 * n)


def test_forward_sample_moments():
    sch = d.irsde_schedule(T=20, max_sigma=0.3)
    x0 = jnp.full((50000,), 0.8); mu = jnp.zeros(50000)
    xt, noise = d.forward_sample(jax.random.PRNGKey(1), x0, mu, 7, sch)
    mean, std = d.marginal_mean_std(x0, mu, 7, sch)
    se = float(std) / np.sqrt(50000)
    assert abs(float(xt.mean()) - float(mean[0])) < 5 * se
    np.testing.assert_allclose(np.asarray(d.noise_from_state(xt, x0, mu, 7, sch)), np.asarray(noise), atol=1e-4)


@pytest.mark.parametrize("t", [1, 2, 7, 19, 20])
def test_optimal_reverse_mean_is_gaussian_posterior_mean(t):
    sch = d.irsde_schedule(T=20, max_sigma=0.4)
    rng = np.random.default_rng(t)
    xt, x0, mu = (rng.normal(size=6) for _ in range(3))
    got = d.optimal_reverse_mean(*(jnp.asarray(a, jnp.float32) for a in (xt, x0, mu)), t, sch)
    if t == 1:  # thetabar_0 = 0: x_0 is known exactly, the posterior is a point mass at x_0
        np.testing.assert_allclose(np.asarray(got), x0, atol=1e-5)
        return
    np.testing.assert_allclose(np.asarray(got), _posterior_mean_np(xt, x0, mu, t, sch), rtol=1e-4, atol=1e-5)


def test_reverse_step_with_true_noise_approaches_posterior_mean_as_T_grows():
    """Plugging the true conditional noise into the reverse-mean step lands near x*_{t-1}, with an error
    O(1/T) (spec (e): decreasing monotonically in T)."""
    errs = []
    rng = np.random.default_rng(0)
    x0 = jnp.asarray(rng.normal(size=64), jnp.float32); mu = jnp.asarray(rng.normal(size=64), jnp.float32)
    for T in (50, 100, 200):
        sch = d.irsde_schedule(T=T, max_sigma=30 / 255)
        t = int(0.9 * T)
        xt, _ = d.forward_sample(jax.random.PRNGKey(3), x0, mu, t, sch)
        eps = d.noise_from_state(xt, x0, mu, t, sch)
        step = d.reverse_step(xt, eps, mu, t, sch)
        target = d.optimal_reverse_mean(xt, x0, mu, t, sch)
        errs.append(float(jnp.linalg.norm(step - target) / jnp.linalg.norm(target - xt)))
    assert errs[0] > errs[1] > errs[2], errs
    assert errs[2] < 0.1


def test_reverse_step_stochastic_term_has_the_right_scale():
    sch = d.irsde_schedule(T=10, max_sigma=0.5)
    x = jnp.zeros(40000); eps = jnp.zeros(40000)
    mean = d.reverse_step(x, eps, x, 5, sch)
    samp = d.reverse_step(x, eps, x, 5, sch, key=jax.random.PRNGKey(0))
    np.testing.assert_allclose(float((samp - mean).std()), float(sch.sigmas[5] * jnp.sqrt(sch.dt)), rtol=0.03)


def test_bad_input():
    with pytest.raises(ValueError, match="T must"):
        d.irsde_schedule(T=1, max_sigma=0.1)
    with pytest.raises(ValueError, match="max_sigma"):
        d.irsde_schedule(T=10, max_sigma=0.0)
    with pytest.raises(ValueError, match="eps"):
        d.irsde_schedule(T=10, max_sigma=0.1, eps=1.5)
    sch = d.irsde_schedule(T=10, max_sigma=0.1)
    with pytest.raises(ValueError, match="t must"):
        d.reverse_step(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), 0, sch)
    with pytest.raises(ValueError, match="same shape"):
        d.marginal_mean_std(jnp.zeros(3), jnp.zeros(4), 2, sch)
