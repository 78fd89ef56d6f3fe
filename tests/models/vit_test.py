"""ViT: shapes, poolings, a float64 numpy reference (dense and ragged pruned widths), training, bad input."""

import chex
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

from algorithms.training import OptimizerConfig, fit
from models.vit import ViT, ViTConfig, classification_loss

BASE = dict(image_size=8, patch_size=4, channels=2, num_classes=3, d_model=8, num_heads=2, d_ff=12, num_layers=1)


def _fwd(model, x, **kwargs):
    """One jitted forward (compiled once, so the persistent compilation cache serves reruns)."""
    graphdef, state = nnx.split(model)
    return jax.jit(lambda state, x: nnx.merge(graphdef, state)(x, **kwargs))(state, x)


def _images(b=3, cfg=None, seed=1):
    cfg = cfg or ViTConfig(**BASE)
    return jax.random.normal(jax.random.key(seed), (b, cfg.image_size, cfg.image_size, cfg.channels))


def _ln(x, p, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def numpy_vit(model, images, head_mask=None):
    """Float64 numpy forward of a ViT from its parameters, looping over heads and their used widths."""
    cfg = model.config
    P = jax.tree.map(lambda a: np.asarray(a, np.float64), nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    x = np.asarray(images, np.float64)
    b, p, g = x.shape[0], cfg.patch_size, cfg.image_size // cfg.patch_size
    patches = np.stack([x[:, i * p:(i + 1) * p, j * p:(j + 1) * p, :].reshape(b, -1)
                        for i in range(g) for j in range(g)], axis=1)
    t = patches @ P["patch_w"] + P["patch_b"]
    if cfg.pooling == "cls":
        t = np.concatenate([np.broadcast_to(P["cls_token"], (b, 1, cfg.d_model)), t], axis=1)
    t = t + P["pos_embed"]
    heads_all = []
    scale = 1 / math.sqrt(cfg.resolved_head_dim)
    for l in range(cfg.num_layers):
        L = P["layers"][l]
        a = L["attn"]
        y = _ln(t, L["norm1"], cfg.norm_eps)
        out = np.zeros_like(t) + a["bo"]
        heads = []
        for h in range(cfg.num_heads):
            nq, nv = cfg.layer_qk_dims(l)[h], cfg.layer_v_dims(l)[h]
            q = y @ a["wq"][:, h, :nq] + a["bq"][h, :nq]
            k = y @ a["wk"][:, h, :nq] + a["bk"][h, :nq]
            v = y @ a["wv"][:, h, :nv] + a["bv"][h, :nv]
            s = np.einsum("btd,bsd->bts", q, k) * scale
            w = np.exp(s - s.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            o = w @ v
            if head_mask is not None:
                o = o * np.asarray(head_mask, np.float64)[l, h]
            heads.append(o)
            out += o @ a["wo"][h, :nv]
        heads_all.append(heads)
        t = t + out
        z = _ln(t, L["norm2"], cfg.norm_eps) @ L["w1"] + L["b1"]
        z = 0.5 * z * (1 + erf(z / np.sqrt(2)))
        t = t + z @ L["w2"] + L["b2"]
    t = _ln(t, P["final_norm"], cfg.norm_eps)
    pooled = t[:, 0] if cfg.pooling == "cls" else t.mean(1)
    return pooled @ P["head_w"] + P["head_b"], heads_all


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_shapes_and_intermediates(pooling):
    cfg = ViTConfig(**dict(BASE, num_layers=2, pooling=pooling))
    model = ViT(cfg, rngs=nnx.Rngs(0))
    out = _fwd(model, _images(cfg=cfg), return_intermediates=True)
    n = cfg.num_patches + (pooling == "cls")
    assert cfg.num_tokens == n == (5 if pooling == "cls" else 4)
    assert out.logits.shape == (3, 3) and out.logits.dtype == jnp.float32
    it = out.intermediates
    chex.assert_shape([it["residuals"], it["head_outputs"], it["attn_rows"]],
                      [(3, 3, n, 8), (2, 3, n, 2, 4), (2, 3, n)])
    np.testing.assert_allclose(it["attn_rows"].sum(-1), 1.0, rtol=1e-5)  # a distribution over the keys
    assert hasattr(model, "cls_token") == (pooling == "cls")
    assert cfg.num_params() == sum(a.size for a in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_matches_float64_numpy_reference(pooling):
    cfg = ViTConfig(**dict(BASE, pooling=pooling))
    model = ViT(cfg, rngs=nnx.Rngs(3))
    x = _images(cfg=cfg)
    mask = jnp.array([[1.0, 0.5]])
    out = _fwd(model, x, head_mask=mask, return_intermediates=True)
    ref, ref_heads = numpy_vit(model, x, head_mask=mask)
    np.testing.assert_allclose(out.logits, ref, rtol=1e-5, atol=1e-5)
    for h in range(2):  # per-head outputs, after the head mask
        np.testing.assert_allclose(out.intermediates["head_outputs"][0, :, :, h], ref_heads[0][h], rtol=1e-5, atol=1e-5)


def test_pooling_reads_the_class_token_or_the_token_mean():
    for pooling in ("cls", "mean"):
        cfg = ViTConfig(**dict(BASE, pooling=pooling))
        model = ViT(cfg, rngs=nnx.Rngs(0))
        out = _fwd(model, _images(cfg=cfg), return_intermediates=True)
        last = model.final_norm(out.intermediates["residuals"][-1])
        pooled = last[:, 0] if pooling == "cls" else last.mean(1)
        np.testing.assert_allclose(out.logits, pooled @ model.head_w[...] + model.head_b[...], rtol=1e-6, atol=1e-6)


def test_ragged_pruned_widths_match_the_reference_and_ignore_unused_slots():
    cfg = ViTConfig(**dict(BASE, num_layers=2, qk_dims=((4, 2), (1, 0)), v_dims=((3, 0), (2, 4)), d_ffs=(5, 7)))
    model = ViT(cfg, rngs=nnx.Rngs(1))
    assert model.layers[0].attn.wq.shape == (8, 2, 4) and model.layers[1].attn.wq.shape == (8, 2, 1)
    assert model.layers[1].w1.shape == (8, 7)
    x = _images(cfg=cfg)
    ref, _ = numpy_vit(model, x)
    np.testing.assert_allclose(_fwd(model, x).logits, ref, rtol=1e-5, atol=1e-5)
    # Garbage in the unused slots of a ragged head changes nothing (the static mask zeroes them).
    model.layers[0].attn.wq[...] = model.layers[0].attn.wq[...].at[:, 1, 2:].set(7.0)
    model.layers[0].attn.wv[...] = model.layers[0].attn.wv[...].at[:, 1, :].set(5.0)
    model.layers[0].attn.wo[...] = model.layers[0].attn.wo[...].at[1].set(3.0)
    np.testing.assert_allclose(_fwd(model, x).logits, ref, rtol=1e-5, atol=1e-5)


def test_training_loss_decreases_on_a_tiny_batch():
    cfg = ViTConfig(**dict(BASE, num_layers=1))
    rng = np.random.default_rng(0)
    batch = {"image": rng.standard_normal((8, 8, 8, 2)).astype(np.float32), "label": np.arange(8, dtype=np.int32) % 3}
    res = fit(model_fn=lambda rngs: ViT(cfg, rngs=rngs), batch_fn=lambda pos: batch, num_steps=25, log_every=1,
              optimizer_config=OptimizerConfig(learning_rate=1e-2, warmup_steps=0, total_steps=25),
              loss_fn=classification_loss, progress=False)
    losses = [row["loss"] for row in res.history]
    assert losses[-1] < 0.5 * losses[0], losses
    loss, metrics = classification_loss(res.model(), {k: jnp.asarray(v) for k, v in batch.items()})
    assert float(metrics["accuracy"]) == 1.0 and float(loss) < losses[0]


def test_jit_and_bfloat16():
    cfg = ViTConfig(**dict(BASE, dtype="bfloat16"))
    model = ViT(cfg, rngs=nnx.Rngs(0))
    x = _images(cfg=cfg)
    y = nnx.jit(lambda m, x: m(x).logits)(model, x)
    ref, _ = numpy_vit(model, x)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(y, ref, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("field,value,exc", [
    ("patch_size", 3, ValueError), ("pooling", "max", ValueError), ("d_model", 8.0, TypeError),
    ("num_heads", 0, ValueError), ("num_heads", 3, ValueError), ("dtype", "int8", ValueError),
    ("head_dim", 0, ValueError), ("norm_eps", float("nan"), ValueError), ("num_classes", True, TypeError),
    ("qk_dims", ((4,),), ValueError), ("v_dims", ((4, 5),), ValueError), ("d_ffs", (0,), ValueError),
])
def test_bad_config_names_the_field(field, value, exc):
    with pytest.raises(exc, match=f"ViTConfig.{field}" if field != "num_heads" or value == 0 else "num_heads"):
        ViTConfig(**dict(BASE, **{field: value}))


def test_bad_inputs_raise_clear_errors():
    cfg = ViTConfig(**BASE)
    model = ViT(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"images must have shape \[b, 8, 8, 2\]"):
        model(jnp.zeros((2, 8, 8, 1)))
    with pytest.raises(TypeError, match="images must be a float array"):
        model(jnp.zeros((2, 8, 8, 2), jnp.int32))
    with pytest.raises(ValueError, match="head_mask"):
        model(jnp.zeros((2, 8, 8, 2)), head_mask=jnp.ones((1, 3)))
    with pytest.raises(ValueError, match="ffn_hook must return a mask"):
        model(jnp.zeros((2, 8, 8, 2)), ffn_hook=lambda l, s, x, a: jnp.ones(3))
    x = jnp.zeros((2, 8, 8, 2))
    with pytest.raises(ValueError, match="missing \\['label'\\]"):
        classification_loss(model, {"image": x})
    with pytest.raises(TypeError, match='batch\\["label"\\]'):
        classification_loss(model, {"image": x, "label": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"num_classes=3\); got min 0, max 3"):
        classification_loss(model, {"image": x, "label": jnp.array([0, 3])})
    with pytest.raises(ValueError, match=r'batch\["label"\] must have shape \[b=2\]'):
        classification_loss(model, {"image": x, "label": jnp.array([0, 1, 2])})
    assert dataclasses.replace(cfg, pooling="mean").num_tokens == 4
