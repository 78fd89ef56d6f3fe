"""E2I-VRWKV: the EPI structure tensor recovers known slopes, each switch turns its block off exactly,
the cross-modal Bi-WKV's linear path equals the O(T^2) one, metrics, training signal, bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.vision import e2i_vrwkv as e2i
from experiments.tasks import light_fields as lf
from models import vrwkv as vr

BB = vr.VRWKVConfig(image_size=8, patch_size=4, num_classes=3, d_model=8, num_layers=1)
CFG = e2i.E2IConfig(backbone=BB, views=3, prior_dim=4)


def _views(seed=0, b=2):
    return jax.random.uniform(jax.random.key(seed), (b, 3, 3, 8, 8))


def _fwd(model, x):
    return np.asarray(model(x))


@pytest.mark.parametrize("d,n", [(-2.0, 5), (-0.6, 3), (0.0, 5), (1.3, 2), (2.0, 3)])
def test_structure_tensor_recovers_epi_slope(d, n):
    s = np.arange(float(n))[:, None] - n // 2  # n views
    x = np.arange(48.0)[None, :]
    f = lambda z: np.sin(2 * np.pi * z / 31) + 0.5 * np.cos(2 * np.pi * z / 43 + 1.0)
    epi = f(x - d * s)  # a Lambertian texture moving d px per view: lines of slope d
    slope, conf = e2i.epi_structure_tensor(jnp.asarray(epi), sigma=1.5)
    assert slope.shape == (48,)
    inner = slice(6, 42)
    np.testing.assert_allclose(np.asarray(slope)[inner], d, atol=0.1)
    assert np.median(np.asarray(conf)[inner]) > 0.98 and np.asarray(conf)[inner].min() > 0.8


def test_epi_features_of_rendered_plane():
    size, views, d, margin = 24, 3, 1.0, 2
    yy, xx = np.mgrid[0:size + 2 * margin, 0:size + 2 * margin]
    tex = 0.5 + 0.25 * np.sin(2 * np.pi * xx / 13) + 0.25 * np.sin(2 * np.pi * yy / 11)
    out, _, _ = lf.render_light_field([lf.Layer(np.ones_like(tex), tex, d, 0)], size=size, views=views, margin=margin)
    feats = np.asarray(e2i.epi_features(jnp.asarray(out[None])))
    assert feats.shape == (1, size, size, 4)
    inner = (0, slice(4, 20), slice(4, 20))
    np.testing.assert_allclose(feats[inner + (0,)], d, atol=0.15)  # horizontal EPIs
    np.testing.assert_allclose(feats[inner + (2,)], d, atol=0.15)  # vertical EPIs


def test_angular_off_is_the_plain_vrwkv():
    model = e2i.E2IVRWKV(dataclasses.replace(CFG, angular=False), rngs=nnx.Rngs(0))
    plain = vr.VRWKVSegmenter(BB, rngs=nnx.Rngs(5))
    nnx.update(plain, nnx.state(model.backbone))
    x = _views()
    np.testing.assert_array_equal(_fwd(model, x), _fwd(plain, x[:, 1, 1, :, :, None]))
    # the angular blocks are off: perturbing them changes nothing
    before = _fwd(model, x)
    model.ecma.w_v[...] = model.ecma.w_v[...] + 1.0
    model.angular_stream.w1[...] = model.angular_stream.w1[...] * 3.0
    np.testing.assert_array_equal(_fwd(model, x), before)


def test_epi_prior_off_equals_zero_prior_weights():
    full = e2i.E2IVRWKV(CFG, rngs=nnx.Rngs(1))
    off = e2i.E2IVRWKV(dataclasses.replace(CFG, epi_prior=False), rngs=nnx.Rngs(1))
    x = _views(2)
    assert not np.allclose(_fwd(full, x), _fwd(off, x))  # the prior matters when its weights are not zero
    for m in (full.ecma, full.gate, full.naive):
        m.w_g[...] = jnp.zeros_like(m.w_g[...])
    np.testing.assert_allclose(_fwd(full, x), _fwd(off, x), rtol=1e-6, atol=1e-6)


def test_gate_off_equals_gate_of_one():
    full = e2i.E2IVRWKV(CFG, rngs=nnx.Rngs(2))
    off = e2i.E2IVRWKV(dataclasses.replace(CFG, gate=False), rngs=nnx.Rngs(2))
    x = _views(3)
    assert not np.allclose(_fwd(full, x), _fwd(off, x))
    for name in ("w_s", "w_y", "w_g"):
        getattr(full.gate, name)[...] = jnp.zeros_like(getattr(full.gate, name)[...])
    full.gate.b[...] = jnp.full_like(full.gate.b[...], 100.0)  # sigmoid(100) == 1 in float32
    np.testing.assert_allclose(_fwd(full, x), _fwd(off, x), rtol=1e-6, atol=1e-6)


def test_ecma_off_uses_naive_fusion_only():
    off = e2i.E2IVRWKV(dataclasses.replace(CFG, ecma=False), rngs=nnx.Rngs(4))
    on = e2i.E2IVRWKV(CFG, rngs=nnx.Rngs(4))
    x = _views(4)
    a, b = _fwd(off, x), _fwd(on, x)
    assert not np.allclose(a, b)
    off.ecma.w_k[...] = off.ecma.w_k[...] + 2.0  # ECMA weights are unused when it is off
    np.testing.assert_array_equal(_fwd(off, x), a)
    on.naive.w_f[...] = on.naive.w_f[...] + 2.0  # and the naive fusion's when it is on
    np.testing.assert_array_equal(_fwd(on, x), b)
    # the naive fusion is (LN(F_a) + g W_g) W_f: with W_f = 0 it adds nothing, leaving F_s + gamma * 0
    off.naive.w_f[...] = jnp.zeros_like(off.naive.w_f[...])
    plain = vr.VRWKVSegmenter(BB, rngs=nnx.Rngs(9))
    nnx.update(plain, nnx.state(off.backbone))
    np.testing.assert_allclose(_fwd(off, x), _fwd(plain, x[:, 1, 1, :, :, None]), rtol=1e-6, atol=1e-6)


def test_ecma_linear_path_equals_quadratic():
    fast = e2i.E2IVRWKV(CFG, rngs=nnx.Rngs(6))
    slow = e2i.E2IVRWKV(dataclasses.replace(CFG, backbone=dataclasses.replace(BB, wkv_implementation="quadratic")),
                        rngs=nnx.Rngs(6))
    x = _views(6)
    np.testing.assert_allclose(_fwd(fast, x), _fwd(slow, x), rtol=1e-5, atol=1e-5)


def test_metrics_and_loss():
    labels = np.array([[0, 0, 1, 1, -1]])
    pred = np.array([[0, 1, 1, 1, 2]])
    cm = e2i.confusion_matrix(pred, labels, 3)
    np.testing.assert_array_equal(cm, [[1, 1, 0], [0, 2, 0], [0, 0, 0]])
    miou, iou = e2i.mean_iou(cm)
    np.testing.assert_allclose(iou[:2], [1 / 2, 2 / 3])
    assert np.isnan(iou[2]) and miou == pytest.approx((1 / 2 + 2 / 3) / 2)
    logits = jnp.zeros((1, 1, 2, 3)).at[0, 0, 0, 1].set(5.0)
    loss = e2i.segmentation_loss(logits, jnp.array([[[1, -1]]]))
    assert float(loss) == pytest.approx(np.log(2 + np.exp(5.0)) - 5.0, rel=1e-5)  # the ignored pixel adds nothing


def test_training_lowers_the_loss():
    data = lf.make_light_fields(8, seed=0, size=16, views=3)
    cfg = e2i.E2IConfig(backbone=vr.VRWKVConfig(image_size=16, patch_size=4, num_classes=4, d_model=8,
                                                num_layers=1), views=3, prior_dim=4)
    model = e2i.E2IVRWKV(cfg, rngs=nnx.Rngs(0))
    batch = {"input": data.views, "labels": data.labels}
    model, hist = e2i.train_segmenter(model, lambda i: batch, num_steps=25, learning_rate=1e-2, progress=False)
    assert hist[-1]["loss"] < hist[0]["loss"]


def test_bad_input():
    model = e2i.E2IVRWKV(CFG, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="views must have shape"):
        model(jnp.zeros((2, 3, 3, 8)))
    with pytest.raises(ValueError, match="odd U and V"):
        model(jnp.zeros((2, 4, 3, 8, 8)))
    with pytest.raises(ValueError, match=r"\[b, 3, 3, 8, 8\]"):
        model(jnp.zeros((2, 5, 5, 8, 8)))
    with pytest.raises(TypeError, match="float"):
        model(jnp.zeros((2, 3, 3, 8, 8), jnp.int32))
    with pytest.raises(ValueError, match="epi must have shape"):
        e2i.epi_structure_tensor(jnp.zeros((1, 5)))
    with pytest.raises(ValueError, match="E2IConfig.views"):
        e2i.E2IConfig(backbone=BB, views=4)
    with pytest.raises(ValueError, match="channels"):
        e2i.E2IConfig(backbone=dataclasses.replace(BB, channels=3))
    with pytest.raises(ValueError, match="labels must have shape"):
        e2i.segmentation_loss(jnp.zeros((1, 2, 2, 3)), jnp.zeros((1, 2), jnp.int32))
