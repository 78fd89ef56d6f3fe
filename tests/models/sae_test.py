"""Tests for models.sae (TopK sparse autoencoder and its training loop).

References: numpy argsort for the TopK support, float64 numpy for the decoder projection and the
linear decode, scipy's minimiser for the geometric median, and an orthonormal planted dictionary
for which the exact codes are known.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import sae as S


def test_topk_support_has_exactly_k_latents_and_matches_argsort():
    pre = jax.random.normal(jax.random.key(0), (50, 40))
    for k in (1, 3, 8, 40):
        vals, sup = S.topk_activation(pre, k, postact="identity")
        assert (np.asarray(sup).sum(1) == k).all()
        assert (np.count_nonzero(np.asarray(vals), axis=1) == k).all()
        ref = np.argsort(-np.asarray(pre), axis=1)[:, :k]
        want = np.zeros(pre.shape, bool)
        np.put_along_axis(want, ref, True, axis=1)
        np.testing.assert_array_equal(np.asarray(sup), want)
        np.testing.assert_array_equal(np.asarray(vals), np.where(want, np.asarray(pre), 0.0))
        rvals, rsup = S.topk_activation(pre, k)  # ReLU: the kept positives, same support
        np.testing.assert_array_equal(np.asarray(rsup), want)
        np.testing.assert_array_equal(np.asarray(rvals), np.where(want, np.maximum(np.asarray(pre), 0), 0.0))


def test_topk_batched_leading_dims_and_bad_k():
    pre = jax.random.normal(jax.random.key(1), (2, 3, 10))
    _, sup = S.topk_activation(pre, 4)
    assert sup.shape == (2, 3, 10) and (np.asarray(sup).sum(-1) == 4).all()
    with pytest.raises(ValueError, match="k must be"):
        S.topk_activation(pre, 11)
    with pytest.raises(ValueError, match="postact"):
        S.topk_activation(pre, 2, postact="gelu")


def test_module_forward_is_the_formula_and_checks_shapes():
    sae = S.TopKSAE(6, 20, k=3, rngs=nnx.Rngs(0), b_dec=np.arange(6.0))
    sae.b_enc[...] = jax.random.normal(jax.random.key(3), (20,))
    x = jax.random.normal(jax.random.key(2), (7, 6))
    out = sae(x)
    we, be, wd, bd = (np.asarray(p[...], np.float64) for p in (sae.w_enc, sae.b_enc, sae.w_dec, sae.b_dec))
    pre = (np.asarray(x, np.float64) - bd) @ we + be
    np.testing.assert_allclose(np.asarray(out.pre_activations), pre, rtol=1e-5, atol=1e-5)
    f = np.asarray(out.latents, np.float64)
    np.testing.assert_allclose(np.asarray(out.reconstruction), f @ wd + bd, rtol=1e-5, atol=1e-5)
    assert (np.asarray(out.support).sum(1) == 3).all() and (f >= 0).all()
    np.testing.assert_allclose(np.linalg.norm(wd, axis=1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="x must have shape"):
        sae(jnp.zeros((2, 5)))
    with pytest.raises(ValueError, match="k must be"):
        S.TopKSAE(6, 4, k=5, rngs=nnx.Rngs(0))


def test_project_out_parallel_removes_only_the_parallel_part():
    g = np.random.default_rng(0).normal(size=(9, 5))
    w = np.random.default_rng(1).normal(size=(9, 5))
    p = np.asarray(S.project_out_parallel(jnp.asarray(g), jnp.asarray(w)), np.float64)
    u = w / np.linalg.norm(w, axis=1, keepdims=True)
    np.testing.assert_allclose((p * u).sum(1), 0.0, atol=1e-5)
    np.testing.assert_allclose(p, g - (g * u).sum(1, keepdims=True) * u, rtol=1e-5, atol=1e-5)


def test_geometric_median_matches_a_generic_minimiser():
    from scipy.optimize import minimize

    x = np.random.default_rng(0).standard_t(2, size=(60, 3))
    m = S.geometric_median(x)
    ref = minimize(lambda c: np.linalg.norm(x - c, axis=1).sum(), x.mean(0), method="Nelder-Mead",
                   options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 20000}).x
    np.testing.assert_allclose(m, ref, atol=1e-4)


def test_oracle_sae_recovers_planted_codes_exactly():
    rng = np.random.default_rng(0)
    d, F, k, n = 16, 12, 3, 40
    dirs = np.linalg.qr(rng.normal(size=(d, d)))[0][:, :F].T  # orthonormal rows
    codes = np.zeros((n, F))
    for t in range(n):
        codes[t, rng.choice(F, k, replace=False)] = rng.uniform(0.5, 1.5, k)
    x = codes @ dirs
    sae = S.TopKSAE(d, F, k=k, rngs=nnx.Rngs(0))
    sae.w_dec[...] = jnp.asarray(dirs, jnp.float32)
    sae.w_enc[...] = jnp.asarray(dirs.T, jnp.float32)
    out = sae(jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(np.asarray(out.latents), codes, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.support), codes > 0)
    np.testing.assert_allclose(np.asarray(out.reconstruction), x, atol=1e-5)


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(0)
    d, F, n = 12, 24, 3000
    dirs = rng.normal(size=(F, d))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    codes = np.zeros((n, F))
    for t in range(n):
        codes[t, rng.choice(F, 2, replace=False)] = rng.uniform(0.5, 1.5, 2)
    x = (codes @ dirs).astype(np.float32)
    cfg = S.SAETrainConfig(num_latents=32, k=3, steps=150, batch_size=256, learning_rate=3e-3, warmup_steps=10,
                           aux_k=8, dead_steps=20, progress=False)
    model, hist = S.train_sae(jax.random.key(0), x, cfg)
    return x, model, hist


def test_training_keeps_unit_decoder_rows_and_reduces_mse(trained):
    x, model, hist = trained
    np.testing.assert_allclose(np.linalg.norm(np.asarray(model.w_dec[...]), axis=1), 1.0, atol=1e-5)
    assert hist.mse.shape == (150,) and np.all(np.isfinite(hist.mse))
    assert hist.mse[-10:].mean() < 0.5 * hist.mse[:10].mean()
    out = model(jnp.asarray(x[:100]))
    assert (np.asarray(out.support).sum(1) == 3).all()
    assert (np.count_nonzero(np.asarray(out.latents), axis=1) <= 3).all()


def test_train_rejects_bad_data():
    with pytest.raises(ValueError, match="data must be"):
        S.train_sae(jax.random.key(0), np.zeros(5), S.SAETrainConfig(num_latents=4, k=1, steps=1, progress=False))
    with pytest.raises(ValueError, match="finite"):
        S.train_sae(jax.random.key(0), np.full((4, 2), np.nan),
                    S.SAETrainConfig(num_latents=4, k=1, steps=1, progress=False))
