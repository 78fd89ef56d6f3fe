"""PPM forecaster and baselines: shapes, a float64 numpy re-implementation, invariances, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

from models import ppm as M

CFG = M.PPMConfig(seq_len=12, pred_len=5, d_model=6, d_ff=10)
B, C, K = 3, 4, 7
X = np.random.default_rng(0).normal(size=(B, CFG.seq_len, C)).astype(np.float32) * 2.0 + 1.0
KEY = jax.random.key(1, impl="rbg")


@pytest.fixture(scope="module")
def ppm():
    return M.PPM(CFG, rngs=nnx.Rngs(0))


def _forward(model, x, key, k=K):
    return nnx.jit(lambda m, x, key: m(x, key, num_samples=k))(model, x, key)


def _apply(model, x):
    return nnx.jit(lambda m, x: m(x))(model, x)


def _np(a):
    return np.asarray(a, np.float64)


def _gelu(v):
    return 0.5 * v * (1.0 + erf(v / np.sqrt(2.0)))


def test_forward_matches_numpy_float64_reference(ppm):
    out = _forward(ppm, X, KEY)
    assert out.samples.shape == (B, K, CFG.pred_len, C)
    assert out.mu.shape == out.logvar.shape == (B, C, CFG.d_model)
    # the spec's pseudo-code in float64 numpy, with the same parameters and the same prior noise
    x = _np(X)
    m, s = x.mean(1, keepdims=True), x.std(1, keepdims=True)
    xn = np.swapaxes((x - m) / (s + CFG.eps), 1, 2)
    lin = lambda d, v: v @ _np(d.w[...]) + _np(d.b[...])
    h = _gelu(lin(ppm.estimator.inp, xn))
    mu, logvar = lin(ppm.estimator.mu, h), lin(ppm.estimator.logvar, h)
    eps = _np(jax.random.normal(KEY, (B, C, K, CFG.d_model)))
    z = mu[:, :, None] + np.exp(logvar / 2)[:, :, None] * eps
    cond = np.broadcast_to(lin(ppm.cond, xn)[:, :, None], z.shape)
    y = lin(ppm.out, _gelu(lin(ppm.hidden, np.concatenate([z, cond], -1))))  # [b, c, K, H]
    y = np.transpose(y, (0, 2, 3, 1)) * (s[:, None] + CFG.eps) + m[:, None]
    np.testing.assert_allclose(_np(out.mu), mu, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_np(out.samples), y, rtol=1e-4, atol=1e-4)


def test_instance_normalization_shift_and_scale_equivariance(ppm):
    base = _np(_forward(ppm, X, KEY).samples)
    np.testing.assert_allclose(_np(_forward(ppm, X + 5.0, KEY).samples), base + 5.0, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_np(_forward(ppm, 3.0 * X, KEY).samples), 3.0 * base, rtol=1e-4, atol=1e-4)


def test_channel_independence(ppm):
    x2 = X.copy()
    x2[..., 1] = np.random.default_rng(5).normal(size=x2[..., 1].shape) * 10.0
    a, b = _np(_forward(ppm, X, KEY).samples), _np(_forward(ppm, x2, KEY).samples)
    keep = [0, 2, 3]
    np.testing.assert_allclose(b[..., keep], a[..., keep], rtol=1e-6, atol=1e-6)  # same noise per channel
    assert np.abs(b[..., 1] - a[..., 1]).max() > 1e-2


def test_deterministic_prior_gives_identical_samples_and_permutation_equivariance():
    model = M.PPM(CFG, rngs=nnx.Rngs(2))
    model.estimator.logvar.b[...] = jnp.full((CFG.d_model,), -80.0)  # sigma = e^-40: the prior is a point mass
    y = _np(_forward(model, X, KEY).samples)
    np.testing.assert_allclose(y, np.broadcast_to(y[:, :1], y.shape), atol=1e-5)
    perm = [2, 0, 3, 1]
    yp = _np(_forward(model, X[..., perm], KEY).samples)
    np.testing.assert_allclose(yp, y[..., perm], rtol=1e-5, atol=1e-5)


def test_pluggable_estimator_and_its_shape_check():
    class Fixed(nnx.Module):
        def __init__(self, d):
            self.d = d

        def __call__(self, xn):
            zeros = jnp.zeros(xn.shape[:2] + (self.d,))
            return zeros, zeros - 100.0  # N(0, e^-100): deterministic z = 0

    model = M.PPM(CFG, rngs=nnx.Rngs(0), estimator=Fixed(CFG.d_model))
    out = _forward(model, X, KEY, 2)
    np.testing.assert_allclose(_np(out.samples[:, 0]), _np(out.samples[:, 1]), atol=1e-6)
    bad = M.PPM(CFG, rngs=nnx.Rngs(0), estimator=Fixed(CFG.d_model + 1))
    with pytest.raises(ValueError, match="the estimator must return mu, logvar of shape"):
        _forward(bad, X, KEY, 2)


def test_parameter_count_and_init_determinism(ppm):
    assert M.count_params(ppm) == CFG.num_params()
    again = M.PPM(CFG, rngs=nnx.Rngs(0))
    for a, b in zip(jax.tree.leaves(nnx.state(ppm, nnx.Param)), jax.tree.leaves(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    w = np.asarray(ppm.hidden.w[...])
    bound = 1.0 / np.sqrt(2 * CFG.d_model)  # PyTorch Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound


def test_baselines_shapes_positivity_and_shift_equivariance():
    gm = M.GaussianMLP(CFG, rngs=nnx.Rngs(0))
    mean, std = _apply(gm, X)
    assert mean.shape == std.shape == (B, CFG.pred_len, C) and float(std.min()) > 0
    mean2, std2 = _apply(gm, X + 4.0)
    np.testing.assert_allclose(_np(mean2), _np(mean) + 4.0, atol=1e-4)
    np.testing.assert_allclose(_np(std2), _np(std), rtol=1e-4)
    qm = M.QuantileMLP(CFG, num_quantiles=3, rngs=nnx.Rngs(0))
    assert _apply(qm, X).shape == (B, 3, CFG.pred_len, C)
    pmod = M.PointMLP(CFG, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(_np(_apply(pmod, 2.0 * X)), 2.0 * _np(_apply(pmod, X)), rtol=1e-4, atol=1e-4)


def test_bad_inputs_raise_clear_errors(ppm):
    with pytest.raises(ValueError, match=r"x must have shape \[batch, seq_len=12, channels\], got \(3, 11, 4\)"):
        ppm(X[:, :11], KEY, num_samples=2)
    with pytest.raises(ValueError, match="num_samples must be an int >= 1, got 0"):
        ppm(X, KEY, num_samples=0)
    with pytest.raises(ValueError, match="PPMConfig.d_model must be an int >= 1; got 0"):
        M.PPMConfig(d_model=0)
    with pytest.raises(ValueError, match="PPMConfig.eps must be > 0"):
        M.PPMConfig(eps=0.0)
    with pytest.raises(ValueError, match="num_quantiles must be >= 1, got 0"):
        M.QuantileMLP(CFG, num_quantiles=0, rngs=nnx.Rngs(0))
