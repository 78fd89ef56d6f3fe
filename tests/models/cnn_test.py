"""The small CNN: shapes, a float64 numpy forward pass, the classification loss, config checks, training."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.training import OptimizerConfig, fit
from models.cnn import CNN, CNNConfig, classification_loss

CFG = CNNConfig(num_classes=3, in_channels=2, channels=(4, 6), kernel_size=3, num_groups=2, hidden_dim=5)


@pytest.fixture(scope="module")
def model():
    return CNN(CFG, rngs=nnx.Rngs(0))


def _numpy_forward(model, x, cfg):
    """Float64 reference: loops over the kernel offsets (SAME zero padding), group norm, pooling."""
    x = np.asarray(x, np.float64)
    for i, stage in enumerate(model.stages):
        k = np.asarray(stage.kernel[...], np.float64)
        r = k.shape[0] // 2
        b, h, w, _ = x.shape
        xp = np.pad(x, ((0, 0), (r, r), (r, r), (0, 0)))
        y = np.zeros((b, h, w, k.shape[-1]))
        for di in range(k.shape[0]):
            for dj in range(k.shape[1]):
                y += xp[:, di:di + h, dj:dj + w] @ k[di, dj]
        y += np.asarray(stage.bias[...])
        g = y.reshape(b, h, w, cfg.num_groups, -1)
        g = (g - g.mean((1, 2, 4), keepdims=True)) / np.sqrt(g.var((1, 2, 4), keepdims=True) + cfg.norm_eps)
        y = g.reshape(y.shape) * np.asarray(stage.scale[...]) + np.asarray(stage.shift[...])
        x = np.maximum(y, 0)
        if i < len(model.stages) - 1:
            x = x[:, : h // 2 * 2, : w // 2 * 2].reshape(b, h // 2, 2, w // 2, 2, -1).mean((2, 4))
    f = np.maximum(x.mean((1, 2)) @ np.asarray(model.dense_w[...]) + np.asarray(model.dense_b[...]), 0)
    return f @ np.asarray(model.head_w[...]) + np.asarray(model.head_b[...]), f


def test_forward_matches_numpy_reference(model):
    x = jax.random.uniform(jax.random.key(1), (3, 7, 6, 2))  # odd side: the pooling drops the last row
    logits, feats = model(x, return_features=True)
    ref_logits, ref_feats = _numpy_forward(model, x, CFG)
    assert logits.shape == (3, 3) and feats.shape == (3, CFG.feature_dim)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4)
    np.testing.assert_allclose(feats, ref_feats, atol=1e-4)
    assert float(feats.min()) >= 0.0
    np.testing.assert_allclose(model(x), logits, atol=0)


def test_layer_norm_and_no_norm_variants_run():
    for norm in ("layer", "none"):
        cfg = CNNConfig(num_classes=2, in_channels=1, channels=(3,), norm=norm, hidden_dim=0)
        out, feats = CNN(cfg, rngs=nnx.Rngs(0))(jnp.ones((2, 4, 4, 1)), return_features=True)
        chex.assert_shape([out, feats], [(2, 2), (2, 3)])
        chex.assert_tree_all_finite(out)


def test_classification_loss_matches_float64_cross_entropy(model):
    x = jax.random.uniform(jax.random.key(2), (4, 5, 5, 2))
    y = jnp.array([0, 2, 1, 2], jnp.int32)
    loss, metrics = classification_loss(model, {"image": x, "label": y})
    logits = np.asarray(model(x), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    np.testing.assert_allclose(float(loss), -logp[np.arange(4), np.asarray(y)].mean(), rtol=1e-5)
    assert float(metrics["accuracy"]) == float((logits.argmax(-1) == np.asarray(y)).mean())


def test_fit_with_classification_loss_learns_stripe_orientation():
    """Horizontal vs vertical stripes: 30 Adam steps through `fit` drive the loss well down."""
    stripes = np.tile((np.arange(6) % 2).astype(np.float32), (6, 1))  # vertical stripes [6, 6]

    def batch_fn(position):
        r = np.random.default_rng([1, position])
        label = r.integers(0, 2, 16).astype(np.int32)
        image = np.where(label[:, None, None] == 1, stripes.T[None], stripes[None])
        image = np.clip(0.2 + 0.6 * image + 0.05 * r.standard_normal((16, 6, 6)), 0, 1)
        return {"image": image[..., None].astype(np.float32), "label": label}

    cfg = CNNConfig(num_classes=2, in_channels=1, channels=(8,), num_groups=2, hidden_dim=8)
    out = fit(model_fn=lambda rngs: CNN(cfg, rngs=rngs), batch_fn=batch_fn, num_steps=30, loss_fn=classification_loss,
              optimizer_config=OptimizerConfig(learning_rate=3e-2, warmup_steps=0, total_steps=30),
              log_every=5, progress=False)
    losses = [row["loss"] for row in out.history]
    assert losses[-1] < 0.4 * losses[0], losses


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(num_groups=3), ValueError, r"num_groups=3 must divide every stage's channels"),
    (dict(kernel_size=4), ValueError, r"kernel_size must be an odd int >= 1; got 4"),
    (dict(norm="batch"), ValueError, r"norm must be one of \('group', 'layer', 'none'\); got 'batch'"),
    (dict(channels=()), ValueError, r"channels must be a non-empty tuple"),
    (dict(channels=(4, 0)), ValueError, r"channels\[1\] must be >= 1; got 0"),
    (dict(num_classes=1), ValueError, r"num_classes must be >= 2; got 1"),
    (dict(hidden_dim=2.5), TypeError, r"hidden_dim must be an int; got 2.5"),
    (dict(norm_eps=float("nan")), ValueError, r"norm_eps must be a finite number > 0"),
])
def test_config_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        CNNConfig(**{**dict(channels=(4, 8), num_groups=2), **kwargs})


def test_bad_inputs(model):
    with pytest.raises(ValueError, match=r"images must have shape \[b, H, W, c=2\]; got \(2, 4, 4, 3\)"):
        model(jnp.ones((2, 4, 4, 3)))
    with pytest.raises(ValueError, match=r"missing \['label'\]"):
        classification_loss(model, {"image": jnp.ones((2, 4, 4, 2))})
    with pytest.raises(TypeError, match=r'batch\["label"\] must be an integer array'):
        classification_loss(model, {"image": jnp.ones((2, 4, 4, 2)), "label": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r'batch\["image"\] must be \[b, H, W, c\] and batch\["label"\] \[b\]'):
        classification_loss(model, {"image": jnp.ones((2, 4, 4, 2)), "label": jnp.zeros(3, jnp.int32)})
    with pytest.raises(TypeError, match=r"config must be a CNNConfig"):
        CNN({"channels": (4,)}, rngs=nnx.Rngs(0))
