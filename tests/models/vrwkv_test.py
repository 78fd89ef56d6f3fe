"""VRWKV: block shapes, the block against a float64 numpy reference (quadratic softmax Bi-WKV and a hand
Q-Shift), the linear-time path against the O(T^2) path inside the block, fancy init, bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import vrwkv as vr


def _np(p):
    return np.asarray(p[...], np.float64)


def _qshift_np(x, h, w):
    """Hand-written Q-Shift on [b, t, c] (gamma 1/4, shift 1, zero padded)."""
    b, t, c = x.shape
    g = c // 4
    grid = x.reshape(b, h, w, c)
    out = grid.copy()
    out[..., :4 * g] = 0.0
    for i in range(h):
        for j in range(w):
            if j - 1 >= 0:
                out[:, i, j, 0:g] = grid[:, i, j - 1, 0:g]
            if j + 1 < w:
                out[:, i, j, g:2 * g] = grid[:, i, j + 1, g:2 * g]
            if i - 1 >= 0:
                out[:, i, j, 2 * g:3 * g] = grid[:, i - 1, j, 2 * g:3 * g]
            if i + 1 < h:
                out[:, i, j, 3 * g:4 * g] = grid[:, i + 1, j, 3 * g:4 * g]
    return out.reshape(b, t, c)


def _wkv_np(w, u, k, v):
    b, t, c = k.shape
    y = np.zeros_like(v)
    for q in range(t):
        logits = np.stack([k[:, j] - (abs(q - j) - 1) * w if j != q else u + k[:, q] for j in range(t)], 1)
        p = np.exp(logits - logits.max(1, keepdims=True))
        y[:, q] = (p * v).sum(1) / p.sum(1)
    return y


def _ln_np(x, ln):
    m = x.mean(-1, keepdims=True)
    var = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(var + ln.eps) * _np(ln.scale) + _np(ln.bias)


def _block_np(block, x, h, w):
    sig = lambda z: 1 / (1 + np.exp(-z))
    if block.ln0 is not None:
        x = _ln_np(x, block.ln0)
    a, t = block.att, x.shape[1]
    z = _ln_np(x, block.ln1)
    zz = _qshift_np(z, h, w)
    lerp = lambda mu: z * _np(mu) + zz * (1 - _np(mu))
    k, v, r = lerp(a.mu_k) @ _np(a.w_k), lerp(a.mu_v) @ _np(a.w_v), lerp(a.mu_r) @ _np(a.w_r)
    x = x + (sig(r) * _wkv_np(_np(a.spatial_decay) / t, _np(a.spatial_first) / t, k, v)) @ _np(a.w_o)
    f = block.ffn
    z = _ln_np(x, block.ln2)
    zz = _qshift_np(z, h, w)
    lerp = lambda mu: z * _np(mu) + zz * (1 - _np(mu))
    return x + sig(lerp(f.mu_r) @ _np(f.w_r)) * (np.maximum(lerp(f.mu_k) @ _np(f.w_k), 0) ** 2 @ _np(f.w_v))


@pytest.mark.parametrize("layer", [0, 1])
def test_block_matches_float64_reference(layer):
    h, w, c = 3, 4, 8
    block = vr.VRWKVBlock(c, layer, 2, rngs=nnx.Rngs(layer))
    x = jax.random.normal(jax.random.key(7), (2, h * w, c))
    y = block(x, height=h, width=w)
    assert y.shape == (2, h * w, c)
    np.testing.assert_allclose(np.asarray(y), _block_np(block, np.asarray(x, np.float64), h, w), rtol=1e-4,
                               atol=1e-5)


def test_linear_bi_wkv_equals_quadratic_inside_the_block():
    h, w, c = 4, 4, 8
    fast = vr.VRWKVBlock(c, 0, 1, implementation="xla", rngs=nnx.Rngs(3))
    slow = vr.VRWKVBlock(c, 0, 1, implementation="quadratic", rngs=nnx.Rngs(3))
    # decays of both signs, scaled up so the sequence positions matter
    fast.att.spatial_decay[...] = jnp.linspace(-40.0, 60.0, c)
    slow.att.spatial_decay[...] = jnp.linspace(-40.0, 60.0, c)
    x = 3.0 * jax.random.normal(jax.random.key(1), (2, h * w, c))
    np.testing.assert_allclose(np.asarray(fast(x, height=h, width=w)), np.asarray(slow(x, height=h, width=w)),
                               rtol=1e-5, atol=1e-5)
    gf = jax.grad(lambda x: fast(x, height=h, width=w).sum())(x)
    gs = jax.grad(lambda x: slow(x, height=h, width=w).sum())(x)
    np.testing.assert_allclose(np.asarray(gf), np.asarray(gs), rtol=1e-4, atol=1e-4)


def test_fancy_init_formulas():
    L, C = 2, 4
    for l in range(L):
        got = vr.fancy_init(l, L, C)
        for hh in range(C):
            assert got["w"][hh] == pytest.approx(-5 + 8 * (hh / 3) ** (0.7 + 1.3 * l), rel=1e-6)
            assert got["u"][hh] == pytest.approx(math.log(0.3) + 0.5 * ((hh + 1) % 3 - 1), rel=1e-6)
            assert got["mu_k"][hh] == pytest.approx((hh / 4) ** (1 - l / 2), abs=1e-7)
            assert got["mu_v"][hh] == pytest.approx((hh / 4) ** (1 - l / 2) + 0.3 * l, abs=1e-7)
            assert got["mu_r"][hh] == pytest.approx((hh / 4) ** (0.5 * (1 - l / 2)), abs=1e-7)
    np.testing.assert_allclose(vr.fancy_init(0, 2, 4)["w"], [-5, -5 + 8 * (1 / 3) ** 0.7, -5 + 8 * (2 / 3) ** 0.7, 3],
                               rtol=1e-6)


def test_segmenter_shapes_patchify_roundtrip_and_training_signal():
    cfg = vr.VRWKVConfig(image_size=8, patch_size=2, num_classes=3, d_model=8, num_layers=2)
    model = vr.VRWKVSegmenter(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))
    assert model(x).shape == (2, 8, 8, 3)
    assert model.features(x).shape == (2, 16, 8)
    p = vr.patchify(jnp.arange(2 * 8 * 8 * 3.0).reshape(2, 8, 8, 3), 2)
    np.testing.assert_array_equal(vr.unpatchify_logits(p, grid=4, patch=2, classes=3),
                                  jnp.arange(2 * 8 * 8 * 3.0).reshape(2, 8, 8, 3))
    g = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(g))
    assert np.abs(np.asarray(g.blocks[0].att.spatial_decay[...])).sum() > 0


def test_bad_input():
    with pytest.raises(ValueError, match="patch_size"):
        vr.VRWKVConfig(image_size=10, patch_size=4, num_classes=2, d_model=8, num_layers=1)
    with pytest.raises(ValueError, match="d_model"):
        vr.VRWKVConfig(image_size=8, patch_size=4, num_classes=2, d_model=2, num_layers=1)
    with pytest.raises(ValueError, match="wkv_implementation"):
        vr.VRWKVConfig(image_size=8, patch_size=4, num_classes=2, d_model=8, num_layers=1, wkv_implementation="cuda")
    cfg = vr.VRWKVConfig(image_size=8, patch_size=4, num_classes=2, d_model=8, num_layers=1)
    model = vr.VRWKVSegmenter(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="images must have shape"):
        model(jnp.zeros((1, 8, 4, 1)))
    with pytest.raises(TypeError, match="float"):
        model(jnp.zeros((1, 8, 8, 1), jnp.int32))
    with pytest.raises(ValueError, match="height"):
        model.blocks[0](jnp.zeros((1, 5, 8)), height=2, width=2)
