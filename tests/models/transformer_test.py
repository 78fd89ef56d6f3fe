"""Decoder LM: KV-cache paths equal the full forward pass; hooks and intermediates behave as documented."""

import chex
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import AttentionConfig, FFDConfig, Transformer, TransformerConfig
from models.kv_cache import truncate

VOCAB = 23


def tiny_config(**overrides):
    base = dict(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48)
    return TransformerConfig(**(base | overrides))


@functools.partial(jax.jit, static_argnames="graphdef")
def _forward(graphdef, state, tokens, cache=None, num_valid=None, segment_ids=None, positions=None):
    """One compiled forward per shape (eager calls compile every op again for each new shape)."""
    return nnx.merge(graphdef, state)(tokens, cache=cache, num_valid=num_valid, segment_ids=segment_ids,
                                      positions=positions)


@pytest.fixture(scope="module", params=[
    dict(num_kv_heads=2),                      # GQA
    dict(num_kv_heads=1, tie_embeddings=True),  # MQA, tied embeddings
    dict(num_kv_heads=4, ffn_activation="gelu"),  # MHA
    # GQA, token-major cache (the CPU default is head-major)
    dict(num_kv_heads=2, attention=AttentionConfig(kv_layout="bskd")),
], ids=["gqa", "mqa-tied", "mha-gelu", "gqa-bskd"])
def model(request):
    return Transformer(tiny_config(**request.param), rngs=nnx.Rngs(0))


def test_cache_prefill_decode_and_append_equal_full_forward(model):
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    b, total = 3, 12
    tokens = jnp.asarray(rng.integers(0, VOCAB, (b, total)), jnp.int32)
    prompt_lengths = np.array([5, 2, 7])
    # Full forward of each row's own sequence is the ground truth.
    full = _forward(graphdef, state, tokens).logits

    # Prefill a right-padded block with ragged lengths.
    block = np.zeros((b, 7), np.int32)
    for r in range(b):
        block[r, :prompt_lengths[r]] = tokens[r, :prompt_lengths[r]]
    cache = model.init_cache(b, 16)
    out = _forward(graphdef, state, jnp.asarray(block), cache, jnp.asarray(prompt_lengths))
    for r in range(b):
        np.testing.assert_allclose(out.logits[r, :prompt_lengths[r]], full[r, :prompt_lengths[r]], atol=1e-5)
    cache = out.cache
    np.testing.assert_array_equal(cache.lengths, prompt_lengths)

    # Single-token decode: each row continues its own sequence.
    for step in range(2):
        pos = prompt_lengths + step
        nxt = tokens[jnp.arange(b), pos][:, None]
        out = _forward(graphdef, state, nxt, cache)
        np.testing.assert_allclose(out.logits[:, 0], full[jnp.arange(b), pos], atol=1e-5)
        cache = out.cache

    # Multi-token append of 3 tokens (speculative verification), then roll back 2.
    pos = prompt_lengths + 2
    chunk = jnp.stack([tokens[r, pos[r]:pos[r] + 3] for r in range(b)])
    out = _forward(graphdef, state, chunk, cache)
    for r in range(b):
        np.testing.assert_allclose(out.logits[r], full[r, pos[r]:pos[r] + 3], atol=1e-5)
    cache = truncate(out.cache, jnp.asarray(pos + 1))
    out = _forward(graphdef, state, chunk[:, 1:2], cache)
    np.testing.assert_allclose(out.logits[:, 0], full[jnp.arange(b), pos + 1], atol=1e-5)


def test_hooks_identity_values_change_nothing(model):
    c = model.config
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, VOCAB, (2, 6)), jnp.int32)
    base = model(tokens, return_intermediates=True)
    hooked = model(
        tokens,
        head_mask=jnp.ones((c.num_layers, c.num_heads)),
        head_deltas=jnp.zeros((c.num_layers, c.num_heads, c.resolved_head_dim)),
        residual_deltas=jnp.zeros((c.num_layers, c.d_model)),
    )
    np.testing.assert_allclose(hooked.logits, base.logits, atol=1e-6)
    inter = base.intermediates
    chex.assert_shape(inter["residuals"], (c.num_layers + 1, 2, 6, c.d_model))
    chex.assert_shape(inter["head_outputs"], (c.num_layers, 2, 6, c.num_heads, c.resolved_head_dim))
    assert len(inter["ffn_aux"]) == c.num_layers


def test_input_embeddings_and_attention_bias_hooks(model):
    c = model.config
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, VOCAB, (2, 6)), jnp.int32)
    base = model(tokens).logits
    # the embedding lookup passed in as input embeddings is the same model
    emb = jnp.take(model.embed[...], tokens, axis=0)
    np.testing.assert_allclose(model(jnp.zeros_like(tokens), input_embeddings=emb).logits, base, atol=1e-6)
    zero = lambda l, q, k: jnp.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    np.testing.assert_allclose(model(tokens, attention_bias=zero).logits, base, atol=1e-6)
    # a content-dependent bias (different per layer) changes the output, and the cached path
    # (prefill of 4, then a one-token and a one-token step) computes the same as the full pass
    calls = []

    def bias(l, q, k):
        calls.append(l)
        kq = jnp.repeat(k, c.num_heads // c.num_kv_heads, axis=2)
        return (0.5 + l) * jnp.einsum("bthd,bshd->bhts", q, kq)

    full = model(tokens, attention_bias=bias).logits
    assert calls[:c.num_layers] == list(range(c.num_layers))
    assert float(jnp.max(jnp.abs(full - base))) > 1e-3
    out = model(tokens[:, :4], cache=model.init_cache(2, 8), attention_bias=bias)
    np.testing.assert_allclose(out.logits, full[:, :4], atol=2e-5)
    cache = out.cache
    for i in (4, 5):
        out = model(tokens[:, i:i + 1], cache=cache, attention_bias=bias)
        np.testing.assert_allclose(out.logits[:, 0], full[:, i], atol=2e-5)
        cache = out.cache
    with pytest.raises(ValueError, match="input_embeddings must be"):
        model(tokens, input_embeddings=emb[:, :3])


def test_head_mask_equals_removing_the_heads_output_projection():
    model = Transformer(tiny_config(num_layers=1), rngs=nnx.Rngs(1))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, VOCAB, (2, 6)), jnp.int32)  # the eager calls' shape
    mask = jnp.array([[1.0, 0.0, 1.0, 0.0]])
    masked = model(tokens, head_mask=mask).logits
    # Same thing by editing the weights: zero the output projection of heads 1 and 3.
    model.layers[0].attn.wo[...] = model.layers[0].attn.wo[...] * mask[0][:, None, None]
    np.testing.assert_allclose(masked, model(tokens).logits, atol=1e-5)


def test_residual_delta_after_last_block_shifts_the_final_stream():
    model = Transformer(tiny_config(), rngs=nnx.Rngs(2))
    c = model.config
    tokens = jnp.zeros((2, 6), jnp.int32)  # the shape of the other eager calls: their compiled ops are reused
    delta = jnp.zeros((c.num_layers, c.d_model)).at[-1].set(jnp.arange(c.d_model) / c.d_model)
    base = model(tokens, return_intermediates=True).intermediates["residuals"][-1]
    steered = model(tokens, residual_deltas=delta, return_intermediates=True).intermediates["residuals"][-1]
    np.testing.assert_allclose(steered - base, jnp.broadcast_to(delta[-1], base.shape), atol=1e-5)


def test_segment_ids_make_packed_sequences_independent():
    model = Transformer(tiny_config(), rngs=nnx.Rngs(3))
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, VOCAB, (1, 4)), rng.integers(0, VOCAB, (1, 3))
    packed = jnp.asarray(np.concatenate([a, b], 1), jnp.int32)
    seg = jnp.array([[0, 0, 0, 0, 1, 1, 1]])
    pos = jnp.array([[0, 1, 2, 3, 0, 1, 2]])
    graphdef, state = nnx.split(model)
    out = _forward(graphdef, state, packed, segment_ids=seg, positions=pos).logits
    np.testing.assert_allclose(out[:, :4], _forward(graphdef, state, jnp.asarray(a)).logits, atol=1e-5)
    np.testing.assert_allclose(out[:, 4:], _forward(graphdef, state, jnp.asarray(b)).logits, atol=1e-5)


def test_every_parameter_has_logical_axes_and_the_count_matches():
    for cfg in (tiny_config(), tiny_config(tie_embeddings=True)):
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        params = nnx.state(model, nnx.Param)
        specs = jax.tree.leaves(nnx.get_partition_spec(params), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
        leaves = jax.tree.leaves(params)
        assert len(specs) == len(leaves)
        for spec, leaf in zip(specs, leaves):
            assert len(spec) == leaf.ndim and all(name is not None for name in spec)
        assert sum(x.size for x in leaves) == cfg.num_params()


def test_bfloat16_compute_is_close_to_float32():
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, VOCAB, (2, 6)), jnp.int32)
    f32 = Transformer(tiny_config(), rngs=nnx.Rngs(5))(tokens).logits
    bf16 = Transformer(tiny_config(dtype="bfloat16"), rngs=nnx.Rngs(5))(tokens).logits
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(bf16, f32, atol=5e-2)


@pytest.mark.parametrize("overrides, match", [
    (dict(num_heads=3, num_kv_heads=2), "multiple of num_kv_heads"),
    (dict(d_model=30, num_heads=4), "divisible by num_heads"),
    (dict(ffn_type="no_such_ffn"), "unknown ffn_type"),
    (dict(ffn_activation="relu"), "ffn_activation"),
    (dict(num_layers=0), "num_layers"),
])
def test_bad_config_is_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        Transformer(tiny_config(**overrides), rngs=nnx.Rngs(0))


def test_bad_hook_and_cache_arguments_are_rejected():
    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    tokens = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="head_mask must have one of the shapes"):
        model(tokens, head_mask=jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="residual_deltas"):
        model(tokens, residual_deltas=jnp.ones((2, 5)))
    with pytest.raises(ValueError, match="cache batch size"):
        model(tokens, cache=model.init_cache(3, 8))
    with pytest.raises(ValueError, match="segment_ids cannot be combined"):
        model(tokens, cache=model.init_cache(2, 8), segment_ids=jnp.zeros((2, 3), jnp.int32))


def test_model_works_in_nnx_tree_mode():
    """Flax plans to make tree mode (no shared references) the default; the model must not notice."""
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, VOCAB, (2, 6)), jnp.int32)  # the eager calls' shape
    graph_logits = Transformer(tiny_config(), rngs=nnx.Rngs(6))(tokens).logits
    with nnx.set_graph_mode(False):
        model = Transformer(tiny_config(), rngs=nnx.Rngs(6))
        graphdef, state = nnx.split(model)
        out = nnx.merge(graphdef, state)(tokens, cache=model.init_cache(2, 8))
    np.testing.assert_allclose(out.logits, graph_logits, atol=1e-5)


@pytest.mark.parametrize("mode, overrides, atol", [
    ("kernel", {}, 1e-5),                                            # split-K decode dispatcher
    ("ffd", {"ffd": FFDConfig(delta=float("inf"), page_size=4)}, 1e-4),  # every page kept: exact
    ("ffd", {"ffd": FFDConfig(delta=0.0, page_size=4)}, None),          # sparse: close, not equal
    ("ffd", {"ffd": FFDConfig(selector="quest", kept_fraction=1.0, page_size=4)}, 1e-4),  # baseline, all pages
    # the other cache axis order (the dense model keeps the default): switching order changes nothing
    ("dense", {"kv_layout": "bskd"}, 1e-5),
    ("kernel", {"kv_layout": "bskd"}, 1e-5),
    ("ffd", {"ffd": FFDConfig(delta=float("inf"), page_size=4), "kv_layout": "bskd"}, 1e-4),
])
def test_decode_attention_routes_through_kernels(mode, overrides, atol):
    dense = Transformer(tiny_config(head_dim=16), rngs=nnx.Rngs(1))
    routed = Transformer(tiny_config(head_dim=16, attention=AttentionConfig(decode=mode, **overrides)),
                         rngs=nnx.Rngs(1))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, VOCAB, (2, 15)), jnp.int32)
    lengths = jnp.array([14, 9])
    outs = []
    for m in (dense, routed):
        graphdef, state = nnx.split(m)
        cache = _forward(graphdef, state, tokens[:, :14], m.init_cache(2, 16), lengths).cache
        outs.append(_forward(graphdef, state, tokens[jnp.arange(2), lengths][:, None], cache))
    if atol is None:
        assert np.all(np.isfinite(np.asarray(outs[1].logits))) and not np.allclose(outs[0].logits, outs[1].logits,
                                                                                    atol=1e-6)
    else:
        np.testing.assert_allclose(outs[1].logits, outs[0].logits, atol=atol)
    assert outs[0].intermediates is None
    if mode == "ffd":  # the step's kept page fraction per layer: every page when exact, fewer when sparse
        kept = np.asarray(outs[1].intermediates["ffd_kept_fraction"])
        assert kept.shape == (tiny_config().num_layers,) and np.all((kept > 0) & (kept <= 1))
        assert np.all(kept == 1.0) if atol is not None else np.all(kept < 1.0)
    else:
        assert outs[1].intermediates is None
