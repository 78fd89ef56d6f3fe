"""SPF, its baselines and benchmarks against closed forms, float64 references and exact gradient identities."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy import integrate, special

from algorithms.optimization import stochastic_path_follower as S
from primitives import malliavin as M


def _flat(tree):
    return np.asarray(ravel_pytree(tree)[0], np.float64)


def _perturbed_params(sde, key, scale=0.3):
    """Random init with non-zero output layers, so drift and diffusion depend on (x, t)."""
    params = sde.init(key)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(99), len(leaves))
    leaves = [leaf + scale * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


# ----------------------------------------------------------------------------- benchmarks


@pytest.mark.parametrize("regressors", [False, True])
def test_least_squares_closed_form_optimal_path(regressors):
    prob = S.least_squares_recovery(jax.random.key(0), 3, noise_std=0.8, regressors=regressors)
    n_samples = 100_000
    for t in (0.0, 0.37, 0.81):
        m = np.asarray(prob.optimum(jnp.float32(t)), np.float64)
        np.testing.assert_allclose(np.asarray(prob.gradient(jnp.asarray(m, jnp.float32), t)), 0.0, atol=1e-6)
        xi = prob.sample(jax.random.key(int(100 * t) + 1), jnp.float32(t), n_samples)
        if regressors:
            a, b = (np.asarray(v, np.float64) for v in xi)
            x_hat = np.linalg.lstsq(a, b, rcond=None)[0]
        else:
            x_hat = np.asarray(xi, np.float64).mean(0)
        # The empirical minimizer's standard error is noise_std / sqrt(N) per coordinate.
        assert np.max(np.abs(x_hat - m)) < 5 * 0.8 / math.sqrt(n_samples)
        # Population objective against the sample mean of f at an arbitrary x (4 standard errors).
        x = jnp.asarray(m + np.array([0.5, -0.2, 0.1]), jnp.float32)
        vals = np.asarray(jax.vmap(lambda d: S.pointwise_loss(prob, x, d, jnp.float32(t)))(xi), np.float64)
        assert abs(vals.mean() - float(prob.objective(x, t))) < 4 * vals.std() / math.sqrt(n_samples)


def _np_logistic_terms(x, w):
    """float64 population F and grad F of the soft-label logistic loss by 1-D quadrature (scipy)."""
    def gauss(fn):
        return integrate.quad(lambda z: fn(z) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi), -12, 12,
                              limit=200)[0]

    rx, rw = np.linalg.norm(x), np.linalg.norm(w)
    c = lambda r: gauss(lambda z: special.expit(r * z) * special.expit(-r * z))  # noqa: E731
    f = gauss(lambda z: np.logaddexp(0.0, rx * z)) - c(rw) * np.dot(w, x)
    return f, c(rx) * x - c(rw) * w


def test_logistic_population_formulas_and_optimum_match_newton_on_a_large_sample():
    l2 = 0.1
    prob = S.logistic_regression_drift(jax.random.key(1), 3, l2=l2)
    t = jnp.float32(0.3)
    x_star = np.asarray(prob.optimum(t), np.float64)
    # Newton on the empirical objective of 200k soft-labelled samples, in float64.
    a, y = (np.asarray(v, np.float64) for v in prob.sample(jax.random.key(2), t, 200_000))
    x = np.zeros(3)
    for _ in range(25):
        p = special.expit(a @ x)
        grad = a.T @ (p - y) / len(y) + l2 * x
        hess = (a * (p * (1 - p))[:, None]).T @ a / len(y) + l2 * np.eye(3)
        x = x - np.linalg.solve(hess, grad)
    # Sandwich standard error of the M-estimator, per coordinate.
    p = special.expit(a @ x)
    scores = a * (p - y)[:, None] + l2 * x
    h_inv = np.linalg.inv(hess)
    se = np.sqrt(np.diag(h_inv @ np.cov(scores.T) @ h_inv) / len(y))
    assert np.all(np.abs(x - x_star) < 5 * se + 1e-4), (x, x_star, se)
    # Population objective and gradient against scipy quadrature in float64 (w*(t) read off the sampler).
    w_t = _w_star(prob, t)
    for probe in (x_star, x_star + np.array([0.3, -0.4, 0.2])):
        probe32 = jnp.asarray(probe, jnp.float32)
        f_ref, g_ref = _np_logistic_terms(probe, w_t)
        np.testing.assert_allclose(float(prob.objective(probe32, t)), f_ref + 0.5 * l2 * probe @ probe,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(prob.gradient(probe32, t)), g_ref + l2 * probe, rtol=1e-4,
                                   atol=1e-5)
    np.testing.assert_allclose(np.asarray(prob.gradient(jnp.asarray(x_star, jnp.float32), t)), 0.0, atol=2e-6)


def _w_star(prob, t):
    """Recovers w*(t) from the sampler: y = sigmoid(<a, w*>) on a basis of regressors."""
    a, y = prob.sample(jax.random.key(3), t, 8)
    logits = np.log(np.asarray(y, np.float64)) - np.log1p(-np.asarray(y, np.float64))
    return np.linalg.lstsq(np.asarray(a, np.float64), logits, rcond=None)[0]


def test_exact_drift_tracks_the_mean_and_the_energy_vanishes():
    """s = 0 and b = m'(t): the decision follows m(t) up to the Euler error O(dt), and the energy is that error."""
    amp, omega, k = 1.0, 2 * math.pi, 20
    prob = S.least_squares_recovery(jax.random.key(4), 2, amplitude=amp, omega=omega)
    ts = jnp.linspace(0.0, 1.0, k + 1)
    dm = jax.jacfwd(prob.optimum)

    @jax.jit
    def energies():
        x, jac = M.malliavin_first_variation(lambda x, t: dm(t), lambda x, t: 0.0 * x, prob.optimum(0.0), ts,
                                             jax.random.key(5))
        sigma = jnp.zeros((k, 2))
        return x, [S.population_energy(prob, x, jac, sigma, ts, malliavin_weight=lam) for lam in (1.0, 0.0)]

    x, (energy, no_mal) = energies()
    energy, no_mal = float(energy), float(no_mal)
    m = S.tracking_metrics(prob, x[None], ts)
    assert energy == no_mal  # G = 0 exactly when s = 0
    err = np.asarray(x, np.float64) - np.asarray(jax.vmap(prob.optimum)(ts), np.float64)  # [K+1, n]
    dt, tsn = 1.0 / k, np.asarray(ts, np.float64)
    # grad F = x - m: the energy is the right-Riemann sum of the squared tracking error.
    np.testing.assert_allclose(energy, dt * np.sum(err[1:] ** 2), rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(m["mean_optimality_distance"], np.mean(np.sum(err ** 2, -1)), rtol=1e-4)
    # Left-Riemann error of int m' per coordinate: |x_k - m(t_k)| <= t_k amp omega^2 dt / 2 (and > 0).
    bound = tsn[:, None] * amp * omega ** 2 * dt / 2
    assert np.all(np.abs(err) <= bound + 1e-5) and np.max(np.abs(err)) > 0.05 * bound.max()
    np.testing.assert_allclose(m["mean_suboptimality"], 0.5 * m["mean_optimality_distance"], rtol=1e-3,
                               atol=1e-7)


def test_legendre_basis_matches_numpy():
    ts = jnp.linspace(0.0, 1.0, 11)
    basis = np.asarray(S.legendre_basis(ts, 1.0, 5))
    u = 2 * np.asarray(ts, np.float64) - 1
    ref = np.stack([np.polynomial.legendre.legval(u, np.eye(6)[j]) - (-1.0) ** j for j in range(1, 6)], -1)
    np.testing.assert_allclose(basis, ref, atol=1e-5)


# ----------------------------------------------------------------------------- gradients

NUM_PATHS = 3


@pytest.fixture(scope="module")
def tiny():
    prob = S.logistic_regression_drift(jax.random.key(7), 2)
    sde = S.NeuralSDE(dim=2, width=8, depth=1, time_features=1, sigma_init=0.3)
    params = _perturbed_params(sde, jax.random.key(8))
    ts = jnp.linspace(0.0, 1.0, 9)
    return prob, sde, params, jnp.array([0.2, -0.1]), ts


@pytest.fixture(scope="module")
def bundle(tiny):
    """One compiled function returning every gradient the tests compare (one XLA compilation).

    `(params, key, lam) -> dict` with the SPF energy gradient at `malliavin_weight=lam`, the SPF objective
    gradient (adjoint of the first variation), forward-sensitivity PDM, an independent autodiff reference
    for the energy, and the explicit Malliavin derivatives / replica gradients of each path.
    """
    prob, sde, params, x0, ts = tiny
    b = NUM_PATHS

    def reference_energy(p, key):
        dw, dkeys = S._episode_noise(key, ts, 2, b, 2)
        paths = jax.vmap(lambda d: M.euler_maruyama(lambda x, t: sde.drift(p, x, t),
                                                    lambda x, t: sde.diffusion(p, x, t), x0, ts, dw=d))(dw)

        def psi(x, t, k):
            g = lambda kk: jax.grad(S._mean_loss, argnums=1)(prob, x, t, kk, 1)  # noqa: E731
            return jnp.dot(g(k[0]), g(k[1]))

        vals = jax.vmap(jax.vmap(psi, in_axes=(0, 0, 0)), in_axes=(0, None, 0))(paths, ts, dkeys)
        return jnp.mean(jnp.sum(S._weights(ts) * vals, 1))

    def pieces(p, dw_path, keys_path):
        x, jac = M.malliavin_first_variation(lambda y, t: sde.drift(p, y, t), lambda y, t: sde.diffusion(p, y, t),
                                             x0, ts, dw=dw_path)
        d = M.malliavin_derivative(jac, jax.vmap(lambda y, t: sde.diffusion(p, y, t))(x[:-1], ts[:-1]))
        grads = jax.vmap(lambda r: jax.vmap(lambda y, t, k: jax.grad(S._mean_loss, argnums=1)(prob, y, t, k[r], 1))(
            x, ts, keys_path))(jnp.arange(2))
        return d, grads

    def fn(p, key, lam):
        dw, dkeys = S._episode_noise(key, ts, 2, b, 2)
        return {
            "energy": S.spf_gradient(p, prob, sde, x0, ts, key, num_paths=b, loss="energy", malliavin_weight=lam),
            "reference_energy": jax.value_and_grad(reference_energy)(p, key),
            "objective": S.spf_gradient(p, prob, sde, x0, ts, key, num_paths=b, loss="objective",
                                        malliavin_weight=0.0)[0],
            "pdm_forward": S.pdm_forward_gradient(p, prob, sde, x0, ts, key, num_paths=b)[0],
            "pieces": jax.vmap(lambda w, k: pieces(p, w, k))(dw, dkeys),
        }

    # Tests check math, not speed: cheap XLA options (compilation dominates here).
    compiled = jax.jit(fn).lower(params, jax.random.key(0), jnp.float32(0.0)).compile(S.FAST_COMPILE)
    return lambda key, lam: compiled(params, key, jnp.float32(lam))


def test_spf_objective_gradient_equals_forward_sensitivity_pdm(bundle):
    """Two independent routes to d/dtheta E sum dt f(x_k): adjoint of the first variation (SPF, loss="objective")
    and the n + n phi forward-sensitivity SDE (PDM); the energy test below checks the adjoint route against
    reverse-mode autodiff through the path."""
    out = bundle(jax.random.key(9), 0.0)
    ref = _flat(out["pdm_forward"])
    assert np.linalg.norm(ref) > 1e-3
    np.testing.assert_allclose(_flat(out["objective"]), ref, rtol=2e-4, atol=2e-6)


def test_spf_energy_gradient_is_the_pathwise_gradient_of_the_energy(bundle):
    """lambda = 0: the SPF surrogate's gradient is backprop of E sum dt <grad f_1, grad f_2> through the path."""
    out = bundle(jax.random.key(10), 0.0)
    (g_spf, aux), (value, g_ref) = out["energy"], out["reference_energy"]
    np.testing.assert_allclose(float(aux["energy"]), float(value), rtol=1e-5, atol=1e-7)
    assert np.linalg.norm(_flat(g_ref)) > 1e-3
    np.testing.assert_allclose(_flat(g_spf), _flat(g_ref), rtol=2e-3, atol=2e-6)


def test_malliavin_term_equals_explicit_malliavin_derivative_sum(tiny, bundle):
    """energy(lambda=1) - energy(0) = E sum_i dt <G^1_i, G^2_i>, G^r_i = sum_{j>i} dt (D_{t_i} x_j)^T grad f_r(x_j)."""
    ts = tiny[-1]
    key = jax.random.key(11)
    out1, out0 = bundle(key, 1.0), bundle(key, 0.0)
    (g1, aux1), (g0, aux0) = out1["energy"], out0["energy"]
    # The Malliavin term moves only the diffusion network's gradient (D is stop-gradient).
    np.testing.assert_array_equal(_flat(g1["drift"]), _flat(g0["drift"]))
    assert not np.allclose(_flat(g1["diffusion"]), _flat(g0["diffusion"]))
    w, dt = np.asarray(S._weights(ts)), np.diff(np.asarray(ts))
    d_all, grads_all = (np.asarray(v, np.float64) for v in out0["pieces"])  # [B, K+1, K, n, m], [B, R, K+1, n]
    total = 0.0
    for d, grads in zip(d_all, grads_all):
        g_mal = [np.einsum("jinm,jn,j->im", d, g, w) for g in grads]
        total += np.sum(dt[:, None] * g_mal[0] * g_mal[1])
    assert abs(total) > 1e-6
    np.testing.assert_allclose(float(aux1["energy"] - aux0["energy"]), total / NUM_PATHS, rtol=1e-3, atol=1e-8)


def test_spf_is_deterministic_given_the_key(bundle):
    a, b, c = (_flat(bundle(jax.random.key(i), 0.1)["energy"][0]) for i in (21, 21, 22))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_path_following_drift_closed_form_for_least_squares():
    prob = S.least_squares_recovery(jax.random.key(12), 3, noise_std=0.0)
    x, t, kappa = jnp.array([0.3, -0.2, 0.5]), jnp.float32(0.4), 3.0
    keys = jax.random.split(jax.random.key(13), 2)
    got = jax.jit(lambda x: S.path_following_drift(prob, x, t, jnp.full((3,), 0.2), keys, kappa=kappa))(x)
    want = jax.jacfwd(prob.optimum)(t) + kappa * (prob.optimum(t) - x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- PSG


def test_psg_static_problem_converges_at_the_known_rate():
    """No drift: E[x_k] - x* = (1 - eta)^k (x_0 - x*) and the stationary variance is eta s^2 / (B (2 - eta))."""
    prob = S.least_squares_recovery(jax.random.key(14), 2, amplitude=0.0, noise_std=1.0)  # x* = 0
    ts = jnp.linspace(0.0, 1.0, 41)
    eta, batch, runs = 0.3, 2, 2000
    x0 = jnp.array([1.0, -2.0])
    keys = jax.random.split(jax.random.key(15), runs)
    # One compilation for both averaging settings (beta = 1: no averaging; beta = 0.4).
    both = jax.jit(jax.vmap(lambda beta: jax.vmap(lambda k: S.proximal_stochastic_gradient(
        prob, x0, ts, k, step_size=eta, averaging=beta, batch=batch))(keys)))(jnp.array([1.0, 0.4]))
    paths, avg = np.asarray(both[0], np.float64), np.asarray(both[1], np.float64)
    mean, se = paths.mean(0), paths.std(0, ddof=1) / math.sqrt(runs) + 1e-12
    expected = (1 - eta) ** np.arange(41)[:, None] * np.asarray(x0)[None]
    assert np.all(np.abs(mean - expected) < 4.5 * se)
    stat = eta / (batch * (2 - eta))
    var_late = paths[:, -1].var(0, ddof=1)
    exact_var = stat * (1 - (1 - eta) ** (2 * 40))
    np.testing.assert_allclose(var_late, exact_var, rtol=4 * math.sqrt(2 / runs))
    # With averaging, the mean follows the deterministic linear recursion.
    beta = 0.4
    xm, xb, rec = np.asarray(x0, np.float64), np.asarray(x0, np.float64), [np.asarray(x0, np.float64)]
    for _ in range(40):
        xm = (1 - eta) * xm
        xb = (1 - beta) * xb + beta * xm
        rec.append(xb)
    assert np.all(np.abs(avg.mean(0) - np.stack(rec)) < 4.5 * (avg.std(0, ddof=1) / math.sqrt(runs) + 1e-12))


def test_snapshot_after_k_episodes_is_the_k_episode_run(tiny):
    """The episode keys are a prefix-consistent split: a snapshot of a long run is a shorter run."""
    prob, sde, _, x0, ts = tiny
    opts = dict(method="pdm", num_paths=2, learning_rate=1e-2, compiler_options=S.FAST_COMPILE)
    long = S.train_path_follower(prob, sde, x0, ts, jax.random.key(3), num_episodes=4, snapshot_at=(2, 4), **opts)
    short = S.train_path_follower(prob, sde, x0, ts, jax.random.key(3), num_episodes=2, **opts)
    assert sorted(long.snapshots) == [2, 4] and short.snapshots == {}
    np.testing.assert_allclose(_flat(long.snapshots[2]), _flat(short.params), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(_flat(long.snapshots[4]), _flat(long.params))
    assert np.max(np.abs(_flat(long.params) - _flat(short.params))) > 1e-4  # two more steps moved them
    with pytest.raises(ValueError, match="snapshot_at"):
        S.train_path_follower(prob, sde, x0, ts, jax.random.key(3), num_episodes=2, snapshot_at=(3,), **opts)


def test_input_validation(tiny):
    prob, sde, params, x0, ts = tiny
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="loss"):
        S.spf_surrogate(params, prob, sde, x0, ts, key, num_paths=2, loss="adjoint")
    with pytest.raises(ValueError, match="x0"):
        S.spf_surrogate(params, prob, sde, jnp.zeros(3), ts, key, num_paths=2)
    with pytest.raises(ValueError, match="method"):
        S.train_path_follower(prob, sde, x0, ts, key, method="sgd")
    with pytest.raises(ValueError, match="num_paths"):
        S.simulate_paths(sde, params, x0, ts, key, num_paths=0)
    with pytest.raises(ValueError, match="averaging"):
        S.proximal_stochastic_gradient(prob, x0, ts, key, step_size=0.1, averaging=1.5)
    with pytest.raises(ValueError, match="dim"):
        S.least_squares_recovery(key, 0)
    with pytest.raises(ValueError, match="paths"):
        S.tracking_metrics(prob, jnp.zeros((2, 3, 2)), ts)
