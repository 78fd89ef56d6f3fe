"""Tests of primitives.gaussian_sup: the quadrature expected maximum against closed forms (1/sqrt(pi),
3/(2 sqrt(pi)), Clark's bivariate formula), the spec's uniform-allocation tables, Monte Carlo (tolerance
from the sample count), finite differences for the gradients, convexity in sigma, Lemma 2.1's bound,
and the block-correlated variant against Monte Carlo with the same covariance."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import gaussian_sup as gs

# Spec (section 1 (b)): E[max_k Z]/sqrt(k) and E[max(0, Z_1..Z_k)]/sqrt(k), k = 1..8.
NO_FLOOR = [0.0, .398942, .488603, .514688, .520094, .517335, .511075, .503319]
WITH_FLOOR = [.398942, .481566, .512772, .522878, .523108, .518505, .511547, .503514]


def test_known_values_two_and_three_standard_normals():
    assert float(gs.expected_max(jnp.zeros(2), jnp.ones(2))) == pytest.approx(1 / math.sqrt(math.pi), abs=2e-7)
    assert float(gs.expected_max(jnp.zeros(3), jnp.ones(3))) == pytest.approx(1.5 / math.sqrt(math.pi), abs=3e-7)
    two = float(gs.expected_sum_of_max_f64(np.zeros(2), np.ones(2)))
    assert two == pytest.approx(1 / math.sqrt(math.pi), abs=1e-12)
    assert float(gs.expected_sum_of_max_f64(np.zeros(3), np.ones(3))) == pytest.approx(1.5 / math.sqrt(math.pi),
                                                                                      abs=1e-12)


def test_spec_uniform_tables_to_1e6():
    for k in range(1, 9):
        s = np.ones(k) / math.sqrt(k)
        assert gs.expected_sum_of_max_f64(np.zeros(k), s) == pytest.approx(NO_FLOOR[k - 1], abs=1e-6), k
        floored = gs.expected_sum_of_max_f64(np.zeros(k + 2), np.r_[s, 0.0, 0.0])
        assert floored == pytest.approx(WITH_FLOOR[k - 1], abs=1e-6), k
        assert gs.iid_expected_max(k, floor=False) / math.sqrt(k) == pytest.approx(NO_FLOOR[k - 1], abs=1e-6)
        assert gs.iid_expected_max(k, floor=True) / math.sqrt(k) == pytest.approx(WITH_FLOOR[k - 1], abs=1e-6)
    # float32 JAX path agrees with the float64 twin.
    vals = [float(gs.expected_max(jnp.zeros(k), jnp.ones(k) / math.sqrt(k))) for k in (2, 4, 8)]
    np.testing.assert_allclose(vals, [NO_FLOOR[1], NO_FLOOR[3], NO_FLOOR[7]], atol=2e-6)


def test_clark_closed_form_with_disparate_scales():
    for mu, sig in [((0.3, 0.0), (1e-3, 3.0)), ((2.0, -1.0), (0.5, 0.05)), ((0.0, 0.1), (1e-4, 1e-4))]:
        cov = np.diag(np.square(sig))
        ref = float(gs.expected_max_bivariate(jnp.array(mu, jnp.float32), jnp.array(cov, jnp.float32)))
        # independent reference: Clark in float64 by hand
        th = math.hypot(*sig)
        a = (mu[0] - mu[1]) / th
        phi = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(a / math.sqrt(2)))
        exact = mu[0] * cdf + mu[1] * (1 - cdf) + th * phi
        assert ref == pytest.approx(exact, abs=2e-6 * max(1, abs(exact)))
        assert float(gs.expected_sum_of_max_f64(np.array(mu), np.array(sig))) == pytest.approx(exact, abs=1e-9)
        assert float(gs.expected_max(jnp.array(mu), jnp.array(sig))) == pytest.approx(exact, rel=2e-6, abs=1e-6)


@pytest.fixture(scope="module")
def instance():
    rng = np.random.default_rng(0)
    mu = rng.normal(size=6)
    sigma = np.abs(rng.normal(size=6)) * np.array([1, 0, 1, 1, 0, 1])  # two deterministic coordinates
    sets = np.array([[1, 1, 1, 0, 0, 0], [0, 1, 0, 0, 1, 0], [1, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 0]], bool)
    return mu, sigma, sets


def test_quadrature_matches_monte_carlo_within_4_se(instance):
    mu, sigma, sets = instance
    exact = gs.expected_sum_of_max_f64(mu, sigma, sets)
    est = gs.expected_max_mc(jax.random.key(1), mu, sigma, sets, num_samples=100_000)
    assert abs(float(est.mean) - exact) < 4 * float(est.stderr)
    per = np.asarray(gs.expected_sum_of_max(mu, sigma, sets, per_set=True))
    assert per[3] == pytest.approx(mu[4], abs=1e-6)  # a set of one constant coordinate
    assert per[1] == pytest.approx(max(mu[1], mu[4]), abs=1e-6)
    assert float(np.sum(per)) == pytest.approx(exact, abs=1e-5)


def test_f64_gradient_matches_finite_differences_and_jax(instance):
    mu, sigma, sets = instance
    sigma = sigma + np.array([0, 0.3, 0, 0, 0.2, 0])  # all positive for central differences
    _, grad = gs.expected_sum_of_max_f64(mu, sigma, sets, return_grad=True)
    h = 1e-6
    fd = [(gs.expected_sum_of_max_f64(mu, sigma + h * e, sets) - gs.expected_sum_of_max_f64(mu, sigma - h * e, sets))
          / (2 * h) for e in np.eye(6)]
    np.testing.assert_allclose(grad, fd, atol=1e-6)
    jgrad = jax.grad(lambda s: gs.expected_sum_of_max(jnp.asarray(mu, jnp.float32), s, sets))(
        jnp.asarray(sigma, jnp.float32))
    np.testing.assert_allclose(np.asarray(jgrad), grad, atol=2e-4)


def test_convex_in_sigma_and_even_monotone(instance):
    mu, _, sets = instance
    rng = np.random.default_rng(2)
    a, b = np.abs(rng.normal(size=(2, 64, 6)))
    t = rng.random((64, 1))
    lhs = gs.expected_sum_of_max_f64(mu, t * a + (1 - t) * b, sets)
    rhs = t[:, 0] * gs.expected_sum_of_max_f64(mu, a, sets) + (1 - t[:, 0]) * gs.expected_sum_of_max_f64(mu, b, sets)
    assert np.all(lhs <= rhs + 1e-10)
    assert np.max(rhs - lhs) > 1e-3  # strictly convex somewhere: the test can fail
    grown = a.copy()
    grown[:, 0] += 0.5
    assert np.all(gs.expected_sum_of_max_f64(mu, grown, sets) >= gs.expected_sum_of_max_f64(mu, a, sets) - 1e-12)


def test_lemma_2_1_epsilon_contribution_bound():
    for eps in (1 / math.e, 0.25, 0.1, 0.05):
        m = math.ceil(eps ** -2)
        value = eps * gs.iid_expected_max(m, floor=True)
        assert value <= math.e * math.sqrt(2) * eps * math.sqrt(math.log(1 / eps))


def test_correlated_two_variable_anchors():
    half = jnp.full(2, math.sqrt(0.5))
    indep = float(gs.expected_max(jnp.zeros(2), half))
    anti = float(gs.expected_max(jnp.zeros(2), half, groups=np.array([0, 0]), signs=np.array([1, -1]), num_groups=1))
    same = float(gs.expected_max(jnp.zeros(2), half, groups=np.array([0, 0]), signs=np.array([1, 1]), num_groups=1))
    assert indep == pytest.approx(0.398942, abs=1e-6)
    assert anti == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)  # E|X_1|, sigma^2 = 1/2
    assert same == pytest.approx(0.0, abs=1e-6)
    cov = np.array([[0.5, -0.5], [-0.5, 0.5]])
    assert float(gs.expected_max_bivariate(jnp.zeros(2), jnp.asarray(cov))) == pytest.approx(anti, abs=1e-6)


def test_block_quadrature_matches_correlated_monte_carlo():
    mu = np.array([0.2, 0.0, -0.1, 0.3, 0.0])
    sigma = np.array([0.6, 0.5, 0.3, 0.0, 0.5])
    groups, signs = np.array([0, 0, 1, 1, 2]), np.array([1, -1, 1, 1, 1])
    sets = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 1, 1, 1]], bool)
    quad = float(gs.expected_sum_of_max(mu, sigma, sets, groups=groups, signs=signs, num_groups=3, num_panels=64))
    cov = np.asarray(gs.block_covariance(jnp.asarray(sigma), jnp.asarray(groups), jnp.asarray(signs)))
    est = gs.expected_max_correlated_mc(jax.random.key(3), mu, cov, sets, num_samples=100_000)
    assert abs(float(est.mean) - quad) < 4 * float(est.stderr) + 1e-4


def test_permutation_invariance(instance):
    mu, sigma, sets = instance
    perm = np.random.default_rng(4).permutation(6)
    a = gs.expected_sum_of_max_f64(mu, sigma, sets)
    b = gs.expected_sum_of_max_f64(mu[perm], sigma[perm], sets[:, perm])
    assert a == pytest.approx(b, abs=1e-12)


def test_helpers():
    np.testing.assert_array_equal(gs.sets_to_mask([[0, 2], [1]], 3), [[True, False, True], [False, True, False]])
    assert float(gs.participation_ratio(jnp.ones(5) / math.sqrt(5))) == pytest.approx(5.0, rel=1e-6)
    assert float(gs.participation_ratio(jnp.array([1.0, 0.0, 0.0]))) == pytest.approx(1.0)
    assert float(gs.expected_max(jnp.zeros(3), jnp.ones(3), jnp.zeros(3, bool))) == -np.inf
    assert gs.iid_expected_max(0, floor=True) == 0.0


@pytest.mark.parametrize("call, match", [
    (lambda: gs.expected_max(jnp.zeros(3), jnp.ones(2)), "same number of variables"),
    (lambda: gs.expected_sum_of_max(jnp.zeros(3), jnp.ones(3), np.zeros((2, 3), bool)), "non-empty"),
    (lambda: gs.expected_sum_of_max(jnp.zeros(3), jnp.ones(3), np.ones((2, 4), bool)), r"shape \(m, n=3\)"),
    (lambda: gs.expected_sum_of_max_f64(np.zeros(2), np.array([1.0, -0.1])), "sigma must be >= 0"),
    (lambda: gs.expected_max(jnp.zeros(2), jnp.ones(2), num_panels=0), "num_panels"),
    (lambda: gs.expected_max_mc(jax.random.key(0), jnp.zeros(2), jnp.ones(2), num_samples=1), "num_samples"),
    (lambda: gs.expected_max_correlated_mc(jax.random.key(0), jnp.zeros(2), jnp.array([[1.0, 2.0], [2.0, 1.0]])),
     "positive semi-definite"),
    (lambda: gs.expected_max(jnp.zeros(2), jnp.ones(2), groups=np.array([0, 1])), "groups, signs and num_groups"),
    (lambda: gs.sets_to_mask([[0, 5]], 3), "outside"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
