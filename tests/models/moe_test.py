"""MoE FFN / MoE LM: dense all-experts equality, router-bias identities and gradients, KV-cache decode,
training, config checks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms import training as T
from models import MoEConfig, MoEFFN, Transformer, TransformerConfig, dense_moe_reference

VOCAB, L, E = 19, 2, 4


def moe_config(moe: dict | None = None, **overrides):
    """The test MoE LM's config; ``moe`` overrides fields of its `MoEConfig` section."""
    section = MoEConfig(**(dict(num_experts=E, experts_per_token=2, d_ff=24) | (moe or {})))
    base = dict(vocab_size=VOCAB, d_model=32, num_layers=L, num_heads=4, num_kv_heads=2, d_ff=48, ffn_type="moe",
                moe=section)
    return TransformerConfig(**(base | overrides))


@pytest.fixture(scope="module")
def model():
    return Transformer(moe_config(moe=dict(num_shared_experts=1)), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tokens():
    return jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (3, 9)), jnp.int32)


@functools.partial(jax.jit, static_argnames="graphdef")
def _forward(graphdef, state, tokens, biases=None, cache=None):
    return nnx.merge(graphdef, state)(tokens, router_biases=biases, cache=cache, return_intermediates=cache is None)


@pytest.mark.parametrize("renormalize, shared, bias", [(True, 1, None), (True, 0, "shared"), (False, 1, "per_row")])
def test_moe_ffn_equals_dense_all_experts_reference(renormalize, shared, bias):
    ffn = MoEFFN(moe_config(moe=dict(router_renormalize=renormalize, num_shared_experts=shared)), rngs=nnx.Rngs(1))
    x = jax.random.normal(jax.random.key(2), (2, 7, 32))
    bias = {None: None, "shared": jnp.array([0.5, -1.0, 0.0, 2.0]),
            "per_row": jax.random.normal(jax.random.key(3), (2, E))}[bias]
    graphdef, state = nnx.split(ffn)

    @jax.jit
    def both(state, x, bias):
        f = nnx.merge(graphdef, state)
        return f(x, router_bias=bias), dense_moe_reference(f, x, router_bias=bias)

    (y, aux), want = both(state, x, bias)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert aux["router_logits"].shape == (2, 7, E) and aux["expert_indices"].shape == (2, 7, 2)
    np.testing.assert_array_equal(aux["router_inputs"], x)


def test_aux_entries_and_zero_bias_is_bitwise_identity(model, tokens):
    graphdef, state = nnx.split(model)
    base = _forward(graphdef, state, tokens)
    zero = _forward(graphdef, state, tokens, jnp.zeros((L, E)))
    np.testing.assert_array_equal(zero.logits, base.logits)
    for a, b in zip(base.intermediates["ffn_aux"], zero.intermediates["ffn_aux"]):
        np.testing.assert_array_equal(a["router_logits"], b["router_logits"])
    aux = base.intermediates["ffn_aux"]
    assert len(aux) == L
    # router_inputs are the normed residual stream entering the FFN; the logits are inputs @ W_r.
    for l in range(L):
        np.testing.assert_allclose(aux[l]["router_logits"], aux[l]["router_inputs"] @ model.layers[l].ffn.router_rows().T,
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(base.aux_loss, sum(a["loss"] for a in aux), rtol=1e-6)
    # A bias on layer 1 changes layer 1's logits by exactly the bias and leaves layer 0 alone.
    bias = jnp.zeros((L, E)).at[1].set(jnp.array([3.0, 0.0, -3.0, 0.0]))
    out = _forward(graphdef, state, tokens, bias)
    np.testing.assert_array_equal(out.intermediates["ffn_aux"][0]["router_logits"], aux[0]["router_logits"])
    assert not np.allclose(out.logits, base.logits)


def test_router_bias_gradient_nonzero_and_sums_to_zero(tokens):
    # Raw softmax gates (OLMoE style); the renormalized case is covered in tests/primitives/routing_test.py.
    model = Transformer(moe_config(moe=dict(router_renormalize=False)), rngs=nnx.Rngs(4))
    graphdef, state = nnx.split(model)
    before = jax.tree.map(np.asarray, state)

    @jax.jit
    def grad(biases):
        def ce(b):
            logits = nnx.merge(graphdef, state)(tokens[:, :-1], router_biases=b).logits
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))
        return jax.grad(ce)(biases)

    g = grad(jnp.zeros((L, E)))
    assert float(jnp.min(jnp.max(jnp.abs(g), axis=1))) > 1e-5  # every layer's bias gets gradient
    np.testing.assert_allclose(jnp.sum(g, axis=1), 0.0, atol=1e-6)  # softmax shift invariance
    # Per-sequence biases [L, b, E] give per-sequence gradients summing to the shared one.
    g_b = grad(jnp.zeros((L, tokens.shape[0], E)))
    np.testing.assert_allclose(g_b.sum(1), g, atol=1e-6)
    # Frozen weights: differentiating w.r.t. the bias alone leaves the parameters untouched.
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, nnx.split(model)[1]))


def test_kv_cache_decode_matches_full_forward_with_router_bias(model, tokens):
    graphdef, state = nnx.split(model)
    bias = jnp.zeros((L, E)).at[0].set(jnp.array([1.0, -0.5, 0.0, 0.25]))
    full = _forward(graphdef, state, tokens, bias).logits
    cache = model.init_cache(tokens.shape[0], 16)
    out = _forward(graphdef, state, tokens[:, :6], bias, cache)
    np.testing.assert_allclose(out.logits, full[:, :6], atol=1e-5)
    cache = out.cache
    for pos in range(6, tokens.shape[1]):
        out = _forward(graphdef, state, tokens[:, pos:pos + 1], bias, cache)
        np.testing.assert_allclose(out.logits[:, 0], full[:, pos], atol=1e-5)
        cache = out.cache


def test_pallas_interpret_path_equals_xla_path(tokens):
    cfg = moe_config(num_layers=1)
    ref_model = Transformer(cfg, rngs=nnx.Rngs(5))
    _, state = nnx.split(ref_model)
    kern = Transformer(moe_config(num_layers=1, moe=dict(implementation="pallas_triton")), rngs=nnx.Rngs(5))
    g_ref, _ = nnx.split(ref_model)
    g_kern, _ = nnx.split(kern)
    run = jax.jit(lambda g, st, t: nnx.merge(g, st)(t).logits, static_argnums=0)
    np.testing.assert_allclose(run(g_kern, state, tokens), run(g_ref, state, tokens), rtol=1e-5, atol=1e-5)


def test_tiny_moe_lm_loss_decreases_with_training():
    cfg = moe_config(vocab_size=8, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, moe=dict(d_ff=16))

    def batch_fn(position):  # a learnable rule: next token = (token + 1) mod 8
        start = np.random.default_rng([1, position]).integers(0, 8, (8, 1))
        seq = ((start + np.arange(9)[None]) % 8).astype(np.int32)
        return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": np.ones((8, 8), np.float32)}

    res = T.fit(model_fn=lambda rngs: Transformer(cfg, rngs=rngs), batch_fn=batch_fn, num_steps=12, log_every=1,
                optimizer_config=T.OptimizerConfig(learning_rate=3e-2, warmup_steps=1, total_steps=12), progress=False)
    losses = [h["loss"] for h in res.history]
    assert losses[-1] < 0.7 * losses[0]
    assert all(h["aux_loss"] > 0 for h in res.history)
    assert all(np.isfinite(losses))


def test_param_count_and_flops_and_config_checks():
    cfg = moe_config(moe=dict(num_shared_experts=1))
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    count = sum(x.size for x in jax.tree.leaves(nnx.split(model, nnx.Param)[1]))
    assert cfg.num_params() == count
    dense = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=L, num_heads=4, num_kv_heads=2, d_ff=24)
    # Active FFN weights per token: (k + shared) experts plus the router.
    extra = 3 * L * 32 * 24 * (2 + 1 - 1) + L * 32 * E
    assert cfg.flops_per_token(8) == dense.flops_per_token(8) + 6 * extra
    with pytest.raises(ValueError, match="experts_per_token"):
        moe_config(moe=dict(experts_per_token=5))
    with pytest.raises(ValueError, match="moe.implementation"):
        moe_config(moe=dict(implementation="cuda"))
    TransformerConfig(vocab_size=5, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=8,
                      moe=MoEConfig(experts_per_token=99))
    with pytest.raises(ValueError, match="router_biases"):
        model(jnp.zeros((1, 3), jnp.int32), router_biases=jnp.zeros((L, E + 1)))


def test_dense_ffn_ignores_router_biases():
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=24)
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    t = jnp.zeros((1, 4), jnp.int32)
    run = jax.jit(lambda st, b: nnx.merge(graphdef, st)(t, router_biases=b).logits)
    np.testing.assert_array_equal(run(state, jnp.ones((1, 3))), run(state, None))
