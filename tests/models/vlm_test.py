"""VLM: shapes, image/audio influence, text-only == plain LM, generation against references, overfit."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.decoding import generate
from experiments.tasks import scenes as sc
from models.transformer import TransformerConfig
from models.vit import ViTConfig
from models.vlm import VLM, VLMConfig

TOK = sc.make_tokenizer()
IMG, AUD = TOK.encode(sc.IMAGE_TOKEN)[0], TOK.encode(sc.AUDIO_TOKEN)[0]


def _model(seed=0):
    lm = TransformerConfig(vocab_size=TOK.vocab_size, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=64)
    vit = ViTConfig(image_size=24, patch_size=12, channels=3, num_classes=1, d_model=16, num_heads=2, d_ff=32,
                    num_layers=1, pooling="mean")
    cfg = VLMConfig(lm=lm, vit=vit, image_token_id=IMG, audio_token_id=AUD, audio_frames=9, audio_frame_len=16)
    return VLM(cfg, rngs=nnx.Rngs(seed))


@nnx.jit
def _logits(m, tokens, images, audio):
    return m(tokens, images=images, audio=audio).logits


def _batch(n=4, seed=0, **kw):
    b = sc.make_batch(n, seed=seed, image_tokens=4, audio_tokens=9, **kw)
    return (jnp.asarray(b["tokens"]), jnp.asarray(b["images"])[:, None], jnp.asarray(b["audio"])[:, None], b)


def test_shapes_and_media_influence_logits():
    m = _model()
    tokens, images, audio, _ = _batch()
    out = m(tokens, images=images, audio=audio)
    assert out.logits.shape == tokens.shape + (TOK.vocab_size,)
    assert m.num_image_tokens == 4
    base = _logits(m, tokens, images, audio)
    np.testing.assert_allclose(base, out.logits, rtol=1e-5, atol=1e-5)
    other = _logits(m, tokens, images[::-1], audio)
    diff = jnp.abs(other - base).max(axis=(-1))  # [b, t]
    # before the first placeholder nothing changes (causal); after it, the logits change
    np.testing.assert_array_equal(diff[:, 0], 0.0)
    assert bool(jnp.all(diff[:, 1:].max(-1) > 1e-4))
    other_audio = _logits(m, tokens, images, audio[::-1])
    assert bool(jnp.all(jnp.abs(other_audio - base)[:, 14:].max(axis=(-2, -1)) > 1e-4))
    # two images per row: the placeholders are filled in order
    two = jnp.concatenate([tokens[:, :5], tokens[:, 1:]], axis=1)
    x = m.embed(two, jnp.concatenate([images, images[::-1]], 1), audio)
    feats = m.encode_images(images)
    # the features are encoded in another batch than feats: equal up to float32 rounding (atol for those near 0)
    np.testing.assert_allclose(x[:, 1:5], feats, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x[:, 5:9], feats[::-1], rtol=1e-6, atol=1e-6)


def test_embed_places_projected_features():
    m = _model()
    tokens, images, audio, _ = _batch()  # the first test's shapes: its eager ops are compiled already
    x = m.embed(tokens, images, audio)
    np.testing.assert_allclose(x[:, 1:5], m.encode_images(images), rtol=1e-6)
    np.testing.assert_allclose(x[:, 5:14], m.encode_audio(audio), rtol=1e-6)
    np.testing.assert_array_equal(x[:, 14:], jnp.take(m.lm.embed[...], tokens[:, 14:], axis=0))


def test_text_only_equals_plain_lm():
    m = _model()
    b = sc.make_batch(3, seed=2, image_tokens=0, audio_tokens=0, kinds=("count", "compose"))
    tokens = jnp.asarray(b["tokens"])
    np.testing.assert_array_equal(m(tokens).logits, m.lm(tokens).logits)
    out = m(tokens, return_intermediates=True)
    assert out.intermediates["residuals"].shape == (3,) + tokens.shape + (32,)
    np.testing.assert_array_equal(out.intermediates["residuals"],
                                  m.lm(tokens, return_intermediates=True).intermediates["residuals"])


def test_generation_matches_generate_and_full_recompute():
    m = _model(1)
    tokens, images, audio, b = _batch(4, seed=4)  # the first test's batch size: its eager encoder ops are reused
    lengths = jnp.asarray(b["prompt_lengths"])
    n = 3
    got = m.generate_greedy(tokens, lengths, max_new_tokens=n, images=images, audio=audio)
    # reference 1: algorithms.decoding.generate from the VLM's prefilled cache
    cache, last = m.prefill(tokens, lengths, images=images, audio=audio, capacity=tokens.shape[1] + n + 1)
    ref = generate(m.lm, last, max_new_tokens=n, cache=cache)
    np.testing.assert_array_equal(got, ref.tokens)
    # reference 2: no cache, recompute the whole (padded) sequence each step
    seqs = np.zeros((4, tokens.shape[1] + n), np.int32)
    seqs[:, :tokens.shape[1]] = np.asarray(tokens)
    rows, lens = np.arange(4), np.asarray(lengths)
    for k in range(n):
        lg = np.asarray(_logits(m, jnp.asarray(seqs), images, audio))
        seqs[rows, lens + k] = lg[rows, lens + k - 1].argmax(-1)
    np.testing.assert_array_equal(got, np.stack([seqs[i, lens[i]:lens[i] + n] for i in range(4)]))


def test_overfit_reduces_loss():
    m = _model(2)
    tokens, images, audio, b = _batch(8, seed=5)
    targets, mask = jnp.asarray(b["targets"]), jnp.asarray(b["loss_mask"])
    opt = nnx.Optimizer(m, optax.adam(3e-3), wrt=nnx.Param)

    def loss_fn(model):
        logits = model(tokens[:, :-1], images=images, audio=audio).logits
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        return jnp.sum(ce * mask) / jnp.sum(mask)

    @nnx.jit
    def step(model, opt):
        loss, g = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, g)
        return loss

    losses = [float(step(m, opt)) for _ in range(25)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_bad_input():
    m = _model()
    tokens, images, audio, _ = _batch()
    with pytest.raises(ValueError, match="placeholders"):
        m(tokens[:, 2:], images=images, audio=audio)
    with pytest.raises(ValueError, match=r"images must be \[b, n_img"):
        m(tokens, images=images[:, 0], audio=audio)
    with pytest.raises(ValueError, match="audio must be"):
        m(tokens, images=images, audio=audio[..., :8])
    with pytest.raises(ValueError, match="vit.pooling"):
        VLMConfig(lm=m.config.lm, vit=ViTConfig(image_size=8, patch_size=4, num_classes=1, d_model=8, num_heads=2,
                                                d_ff=16, num_layers=1), image_token_id=IMG)
    with pytest.raises(ValueError, match="image_token_id"):
        VLMConfig(lm=m.config.lm, vit=m.config.vit, image_token_id=10_000)
    with pytest.raises(ValueError, match="last prompt token"):
        m.prefill(tokens, jnp.array([3, 3, 3, 3]), images=images, audio=audio, capacity=80)
