"""primitives.ddpm against float64 closed forms and Monte Carlo with tolerances from the sample count."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import ddpm


def test_schedule_matches_the_closed_forms():
    sch = ddpm.ddpm_schedule(num_steps=50, beta_start=1e-4, beta_end=0.5, kind="quad")
    betas = np.linspace(1e-2, 0.5 ** 0.5, 50) ** 2
    abar = np.cumprod(1 - betas)
    np.testing.assert_allclose(sch.betas, betas, rtol=1e-6)
    np.testing.assert_allclose(sch.alpha_bars, abar, rtol=1e-5)
    assert float(sch.posterior_variances[0]) == 0.0
    np.testing.assert_allclose(sch.posterior_variances[1:], betas[1:] * (1 - abar[:-1]) / (1 - abar[1:]), rtol=1e-5)
    lin = ddpm.ddpm_schedule(num_steps=4, beta_start=0.1, beta_end=0.4, kind="linear")
    np.testing.assert_allclose(lin.betas, [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
    assert sch.num_steps == 50


@pytest.mark.parametrize("kwargs, match", [({"num_steps": 0}, "num_steps"),
                                           ({"num_steps": 5, "beta_end": 1.0}, "beta_end"),
                                           ({"num_steps": 5, "kind": "cosine"}, "kind")])
def test_bad_schedule_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ddpm.ddpm_schedule(**kwargs)


def test_q_sample_has_the_marginal_moments():
    sch = ddpm.ddpm_schedule(num_steps=20)
    n, t, x0 = 200_000, 7, 1.5
    xt = ddpm.q_sample(jnp.full((n,), x0), t, jax.random.normal(jax.random.key(0), (n,)), sch)
    abar = float(sch.alpha_bars[t - 1])
    sd = math.sqrt(1 - abar)
    assert abs(float(xt.mean()) - math.sqrt(abar) * x0) < 5 * sd / math.sqrt(n)
    assert abs(float(xt.std()) - sd) < 5 * sd / math.sqrt(2 * n)


def _sample(sch, n, key, mean, std):
    x = jax.random.normal(key, (n,))
    for t in range(sch.num_steps, 0, -1):
        eps = ddpm.optimal_noise_gaussian(x, t, sch, mean=mean, std=std)
        x = ddpm.ancestral_step(x, eps, t, jax.random.normal(jax.random.fold_in(key, t), (n,)), sch)
    return np.asarray(x, np.float64)


def test_point_mass_data_is_recovered_exactly():
    # With x_0 = m surely, E[eps | x_t] is exact and the last step lands on m.
    sch = ddpm.ddpm_schedule(num_steps=10)
    x = _sample(sch, 1000, jax.random.key(1), mean=0.7, std=0.0)
    np.testing.assert_allclose(x, 0.7, atol=1e-4)


def test_ancestral_sampling_matches_the_exact_linear_gaussian_propagation():
    # For Gaussian data the optimal denoiser is linear, so every step maps N(m_t, v_t) to a Gaussian whose
    # moments a float64 recursion gives exactly; the sampler's Monte Carlo moments must match it.
    sch = ddpm.ddpm_schedule(num_steps=50)
    mean, std, n = 1.0, 0.5, 200_000
    x = _sample(sch, n, jax.random.key(2), mean, std)
    b64 = np.asarray(sch.betas, np.float64)
    abar = np.cumprod(1 - b64)
    post = np.concatenate([[0.0], b64[1:] * (1 - abar[:-1]) / (1 - abar[1:])])
    m, v = 0.0, 1.0
    for i in range(len(b64) - 1, -1, -1):
        a, b = math.sqrt(abar[i]), math.sqrt(1 - abar[i])
        g = b / (abar[i] * std ** 2 + 1 - abar[i])  # eps = g (x - a mean)
        c = (1 - b64[i] / b * g) / math.sqrt(1 - b64[i])
        d = (b64[i] / b * g * a * mean) / math.sqrt(1 - b64[i])
        m, v = c * m + d, c * c * v + post[i]
    sd = math.sqrt(v)
    assert abs(x.mean() - m) < 5 * sd / math.sqrt(n)
    assert abs(x.std() - sd) < 5 * sd / math.sqrt(2 * n)
    assert abs(m - mean) < 0.05 and abs(sd - std) < 0.1  # and the schedule is fine enough to land near the data
