"""Training layouts of the decoder LM: scanned blocks, rematerialisation and flash prefill change memory and
compile time, not results (checked against the unrolled, non-rematerialised model with the same weights)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms import training
from models import AttentionConfig, MoEConfig, Transformer, TransformerConfig

BASE = TransformerConfig(vocab_size=13, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=24)
TOKENS = jax.random.randint(jax.random.key(1), (2, 7), 0, 13)


def _same_weights(reference: Transformer, config: TransformerConfig) -> Transformer:
    """A model of `config` holding `reference`'s weights (stacked along "layers" when scanned)."""
    model = Transformer(config, rngs=nnx.Rngs(1))  # another seed: every weight must come from `reference`
    params = nnx.to_pure_dict(nnx.state(reference, nnx.Param))
    if config.scan_layers:
        layers = [params["layers"][i] for i in range(config.num_layers)]
        params = dict(params, layers=jax.tree.map(lambda *xs: jnp.stack(xs), *layers))
    graphdef, state = nnx.split(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


@nnx.jit
def _forward(model):
    out = model(TOKENS)
    return out.logits, out.aux_loss


@nnx.jit
def _loss_and_grads(model):
    def loss(m):
        out = m(TOKENS)
        return jnp.mean(out.logits ** 2) + out.aux_loss

    value, grads = nnx.value_and_grad(loss)(model)
    return value, nnx.to_pure_dict(grads)


@pytest.mark.parametrize("changes,ffn_type", [
    (dict(remat="full"), "gated"), (dict(remat="dots"), "gated"), (dict(scan_layers=True), "gated"),
    (dict(scan_layers=True, remat="full"), "moe"),  # the MoE auxiliary loss summed through the scan
], ids=["remat-full", "remat-dots", "scan", "scan-remat-moe"])
def test_scan_and_remat_equal_the_unrolled_model(changes, ffn_type):
    base = dataclasses.replace(BASE, ffn_type=ffn_type, moe=MoEConfig(num_experts=4, experts_per_token=2))
    reference = Transformer(base, rngs=nnx.Rngs(0))
    model = _same_weights(reference, dataclasses.replace(base, **changes))
    (ref_logits, ref_aux), (logits, aux) = _forward(reference), _forward(model)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(aux, ref_aux, atol=1e-6, rtol=1e-5)
    ref_loss, ref_grads = _loss_and_grads(reference)
    loss, grads = _loss_and_grads(model)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    if changes.get("scan_layers"):
        layers = [ref_grads["layers"][i] for i in range(base.num_layers)]
        ref_grads = dict(ref_grads, layers=jax.tree.map(lambda *xs: jnp.stack(xs), *layers))
    jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4), grads, ref_grads)


def test_scanned_parameters_carry_a_layers_axis_and_shard_like_the_unrolled_ones():
    model = Transformer(dataclasses.replace(BASE, scan_layers=True), rngs=nnx.Rngs(0))
    specs = nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(model, nnx.Param)))
    assert specs["layers"]["attn"]["wq"] == jax.sharding.PartitionSpec("layers", "embed", "heads", "head_dim")
    assert nnx.state(model, nnx.Param)["layers"]["attn"]["wq"][...].shape == (2, 16, 4, 4)


def test_scan_layers_refuses_the_per_layer_hooks_and_the_cache():
    model = Transformer(dataclasses.replace(BASE, scan_layers=True), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="scan_layers model takes no head_mask"):
        model(TOKENS, head_mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="takes no cache"):
        model(TOKENS, cache=model.init_cache(2, 16))
    with pytest.raises(ValueError, match="return_intermediates"):
        model(TOKENS, return_intermediates=True)


def test_flash_prefill_equals_dense_and_refuses_what_it_cannot_mask():
    reference = Transformer(dataclasses.replace(BASE, attention=AttentionConfig(prefill="dense")), rngs=nnx.Rngs(0))
    flash = _same_weights(reference, dataclasses.replace(BASE, attention=AttentionConfig(prefill="flash")))
    np.testing.assert_allclose(flash(TOKENS).logits, reference(TOKENS).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="needs the default positions"):
        flash(TOKENS, positions=jnp.broadcast_to(jnp.arange(7), (2, 7)))
    with pytest.raises(ValueError, match="no segment_ids or attention_bias"):
        flash(TOKENS, segment_ids=jnp.zeros((2, 7), jnp.int32))


def test_auto_prefill_is_flash_only_when_compiling_for_tpu():
    """The default ("auto") traces the TPU flash kernel under `compiling_for("tpu")`, and dense attention on
    CPU or when the call has positions/segments flash cannot mask."""
    from pallas_kernels import _backend

    model = Transformer(BASE, rngs=nnx.Rngs(0))
    tokens = jnp.zeros((1, 11), jnp.int32)  # a shape no other test traces (kernel wrappers cache traces by shape)
    graphdef, state = nnx.split(model)
    trace = lambda **kw: str(jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(tokens, **kw).logits)(state))  # noqa: E731
    assert "pallas_call" not in trace()
    with _backend.compiling_for("tpu"):
        assert "pallas_call" in trace()
        assert "pallas_call" not in trace(positions=jnp.arange(11)[None])
def test_new_fields_are_validated_and_hidden_from_the_repr_at_their_defaults():
    assert "scan_layers" not in repr(BASE) and "prefill" not in repr(BASE)
    changed = dataclasses.replace(BASE, remat="full", attention=AttentionConfig(prefill="flash"))
    assert "remat='full'" in repr(changed) and "prefill='flash'" in repr(changed)
    with pytest.raises(ValueError, match="remat must be one of"):
        dataclasses.replace(BASE, remat="some")
    with pytest.raises(ValueError, match="attention.prefill must be one of"):
        AttentionConfig(prefill="sparse")
    with pytest.raises(TypeError, match="scan_layers must be a bool"):
        dataclasses.replace(BASE, scan_layers=1)


def test_abstract_train_state_matches_the_materialised_one():
    """`init_train_state(abstract=True)`: the same shapes, dtypes and shardings, without computing anything."""
    mesh = training.make_mesh(training.MeshConfig(data=2, fsdp=2, tensor=2))
    cfg = dataclasses.replace(BASE, d_model=32, num_heads=4, num_kv_heads=2, scan_layers=True)
    optimizer = training.make_optimizer(training.OptimizerConfig())
    build = lambda rngs: Transformer(cfg, rngs=rngs)  # noqa: E731
    _, real, real_sh = training.init_train_state(build, optimizer, mesh=mesh)
    _, abstract, sh = training.init_train_state(build, optimizer, mesh=mesh, abstract=True)
    assert jax.tree.structure(abstract) == jax.tree.structure(real)
    for a, r, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(real), jax.tree.leaves(real_sh)):
        assert isinstance(a, jax.ShapeDtypeStruct) and isinstance(r, jax.Array)
        assert (a.shape, a.dtype) == (r.shape, r.dtype)
        assert a.sharding == r.sharding == s
    _, unsharded, none = training.init_train_state(build, optimizer, abstract=True)
    assert none is None and all(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(unsharded))


def test_per_shard_kernels_in_a_sharded_train_step_equal_one_device():
    """Inside `make_train_step`'s mesh the flash prefill and the MoE experts' grouped matmuls run per batch
    shard (`jax.shard_map`: Pallas TPU kernels cannot be partitioned automatically); one step of a 2x2x2
    sharded scanned model gives the unsharded step's loss and gradient norm."""
    optimizer = training.make_optimizer(training.OptimizerConfig())
    cfg = dataclasses.replace(BASE, scan_layers=True, attention=AttentionConfig(prefill="flash"), ffn_type="moe",
                              moe=MoEConfig(num_experts=4, experts_per_token=2))
    tokens = np.random.default_rng(0).integers(0, 13, (8, 9)).astype(np.int32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": np.ones((8, 8), np.float32)}
    metrics = {}
    for name, mesh in (("one", None), ("sharded", training.make_mesh(training.MeshConfig(data=2, fsdp=2, tensor=2)))):
        graphdef, state, shardings = training.init_train_state(lambda r: Transformer(cfg, rngs=r), optimizer, mesh=mesh)
        step = training.make_train_step(graphdef, optimizer, shardings=shardings, mesh=mesh)
        metrics[name] = step(state, batch if mesh is None else jax.device_put(batch, training.batch_sharding(mesh)))[1]
    np.testing.assert_allclose(metrics["sharded"]["loss"], metrics["one"]["loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["sharded"]["grad_norm"], metrics["one"]["grad_norm"], rtol=1e-5)
