"""`python -m experiments aot`: a training step compiled ahead of time for a TPU slice (needs libtpu; the
compile test skips without it, saying why)."""

import json

import pytest

from experiments import __main__ as cli
from pallas_kernels import aot as kernel_aot

needs_libtpu = pytest.mark.skipif(not kernel_aot.libtpu_available(),
                                  reason='libtpu is not installed (pip install -e ".[tpu]")')


@needs_libtpu
def test_lm_arithmetic_smoke_step_compiles_for_v5e_and_reports_per_chip_memory(tmp_path, capsys):
    out = tmp_path / "steps.json"
    rc = cli.main(["aot", "lm_arithmetic", "--preset", "smoke", "--topology", "v5e:2x2", "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ok"] and row["fits"] and row["chips"] == 4 and row["mesh"] == [1, 4, 1]
    assert row["batch_size"] == 16 and 0 < row["total_bytes"] < row["hbm_bytes"] == 16 * 2**30
    assert "fits" in capsys.readouterr().out


@needs_libtpu
def test_a_batch_that_does_not_split_over_the_mesh_is_refused_by_name(capsys):
    assert cli.main(["aot", "lm_arithmetic", "--preset", "smoke", "--topology", "v5e:2x2", "--batch", "6"]) == 2
    assert "batch_size 6 does not split over the mesh's data x fsdp = 4" in capsys.readouterr().out


def test_an_experiment_without_a_training_step_is_refused_by_name(capsys, monkeypatch):
    from experiments import aot

    monkeypatch.setattr(aot, "targets", lambda: {"lm_1b": "", "lm_arithmetic": ""})
    assert cli.main(["aot", "sysr"]) == 2
    assert "'sysr' defines no training step to compile; targets: ['lm_1b', 'lm_arithmetic']" in \
        capsys.readouterr().out


def test_compiling_for_resolves_kernels_for_the_target_platform():
    from pallas_kernels import _backend

    assert _backend.resolve_implementation(None) == "xla" and _backend.resolve_interpret(None)  # CPU here
    with _backend.compiling_for("tpu"):
        assert _backend.target_backend() == "tpu"
        assert _backend.resolve_implementation(None) == "pallas_tpu" and not _backend.resolve_interpret(None)
        with _backend.compiling_for("gpu"):
            assert _backend.resolve_implementation("pallas") == "pallas_triton"
        assert _backend.resolve_implementation("pallas") == "pallas_tpu"
    assert _backend.target_backend() == "cpu"
    with pytest.raises(ValueError, match="platform must be 'tpu', 'gpu' or 'cpu'; got 'TPU'"):
        with _backend.compiling_for("TPU"):
            pass


def test_list_prints_the_targets(capsys, monkeypatch):
    from experiments import aot

    monkeypatch.setattr(aot, "targets", lambda: {"lm_1b": "the 1B LM", "lm_arithmetic": "its step"})
    assert cli.main(["aot", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["lm_1b", "the", "1B", "LM", "lm_arithmetic", "its", "step"]


def _classifier_step(batch_size: int = 8):
    """A non-LM step built the way a vision experiment calls `fit`: a model_fn, a loss and one batch."""
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from experiments import aot

    def loss_fn(model, batch):
        logits = model(batch["images"].reshape(batch["images"].shape[0], -1))
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean(), {}

    batch = {"images": np.zeros((batch_size, 8, 8, 3), np.float32), "labels": np.zeros((batch_size,), np.int32)}
    return aot.TrainStep.from_batch(batch, model={"in": 192, "out": 10}, loss_fn=loss_fn,
                                    model_fn=lambda rngs: nnx.Linear(192, 10, rngs=rngs))


def test_a_step_from_one_batch_has_its_shapes_and_checks_its_fields():
    import jax.numpy as jnp

    from experiments import aot
    from models.transformer import TransformerConfig

    step = _classifier_step()
    assert not step.is_lm and step.batch_size == 8 and step.seq_len is None
    assert step.batch_shapes() == {"images": ((8, 8, 8, 3), jnp.float32), "labels": ((8,), jnp.int32)}
    lm = aot.TrainStep(model=TransformerConfig(vocab_size=16, d_model=8, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=16),
                       batch_size=4, seq_len=5)
    assert lm.is_lm and lm.batch_shapes()["inputs"] == ((4, 5), jnp.int32)
    with pytest.raises(ValueError, match="TrainStep needs model_fn for a model config of type dict"):
        aot.TrainStep(model={}, batch_size=2, seq_len=3)
    with pytest.raises(ValueError, match="exactly one of seq_len .* and example; got seq_len=None, example=None"):
        aot.TrainStep(model=lm.model, batch_size=2)
    with pytest.raises(ValueError, match=r"leading \(batch\) axis; got \{'a': 2, 'b': 3\}"):
        aot.TrainStep.from_batch({"a": jnp.zeros((2, 1)), "b": jnp.zeros((3,))}, model=lm.model)


@needs_libtpu
def test_a_non_lm_step_compiles_for_v5e_and_lm_flags_are_refused_for_it(capsys, monkeypatch):
    from algorithms import training
    from experiments import aot

    import dataclasses

    import optax

    # an optax transformation the config cannot express is compiled as given
    step = dataclasses.replace(_classifier_step(), optimizer=optax.sgd(optax.linear_onecycle_schedule(10, 0.1)))
    row = aot.compile_train_step(step, topology="v5e:2x2", mesh=training.MeshConfig(data=1, fsdp=-1, tensor=1))
    assert row["ok"] and row["fits"] and row["params"] == 192 * 10 + 10 and row["model"] == "dict"
    step = _classifier_step()
    assert row["batch"] == {"images": [8, 8, 8, 3], "labels": [8]} and "remat" not in row
    assert "dict of 2k params, batch images 8x8x8x3, labels 8" in aot._describe({"target": "clf", **row})
    monkeypatch.setattr(aot, "_target_step", lambda *a: step)
    assert cli.main(["aot", "clf", "--topology", "v5e:2x2", "--remat", "none"]) == 2
    assert "--remat applies to decoder LM targets; clf's model is a dict" in capsys.readouterr().out


# A decode step whose cache is a quarter of a GiB per layer, so a copy of a layer's keys cannot hide in VMEM.
_DECODE_CONTEXT = 262_144


def _decode_lm(decode: str, layout: str):
    from models.transformer import AttentionConfig, TransformerConfig

    return TransformerConfig(vocab_size=256, d_model=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=128,
                             d_ff=512, dtype="bfloat16", attention=AttentionConfig(decode=decode, kv_layout=layout))


@needs_libtpu
@pytest.mark.parametrize("decode", ["dense", "kernel"])
@pytest.mark.parametrize("layout", ["bskd", "bksd"])
def test_the_decode_step_updates_its_cache_in_place_and_copies_no_cache_buffer_on_tpu(decode, layout):
    from experiments import aot

    row = aot.compile_decode_step(_decode_lm(decode, layout), topology="v5e:2x2", batch_size=2,
                                  context=_DECODE_CONTEXT)
    assert row["ok"], row["error"]
    assert row["kv_layout"] == layout and row["decode"] == decode
    assert row["cache_bytes"] == 2 * 2 * (2 * _DECODE_CONTEXT * 2 * 128 * 2)  # K and V, 2 layers, bf16
    assert row["in_place"] and row["bytes"]["alias"] >= row["cache_bytes"]
    assert not row["cache_copy"], row["bytes"]


@needs_libtpu
def test_the_ffd_decode_step_compiles_for_tpu_and_updates_keys_values_and_pages_in_place():
    """An FFD model's cache carries its quantized pages; the TPU step writes K, V and the pages in place,
    and, with the default pages of 128 tokens (channel-major codes: one 32 x 128 uint8 tile per page),
    copies none of it: the temporaries hold less than one layer's codes. (Token-major codes, [128, 32]
    per page, took 142 MB of temporaries here, relayouts of the codes for the kernel; 2.2 MB now.)"""
    from experiments import aot

    row = aot.compile_decode_step(_decode_lm("ffd", "bksd"), topology="v5e:2x2", batch_size=2,
                                  context=_DECODE_CONTEXT)
    assert row["ok"], row["error"]
    kv = 2 * 2 * (2 * _DECODE_CONTEXT * 2 * 128 * 2)  # K and V, 2 layers, bf16
    pages = _DECODE_CONTEXT // 128 * 2 * 2 * 2 * (128 * 128 * (4 + 0.25) + 3 * 128 * 4)  # residual, codes, bounds
    assert row["cache_bytes"] >= kv + pages  # the pages are counted with the cache
    assert row["in_place"] and row["bytes"]["alias"] >= row["cache_bytes"]
    layer_codes = 2 * 2 * _DECODE_CONTEXT * 128 // 4  # b, k, tokens x d 2-bit codes
    assert row["bytes"]["temp"] < layer_codes, row["bytes"]


@needs_libtpu
def test_a_transposed_cache_handed_to_the_decode_kernel_shows_in_the_temporaries():
    """The premise of `cache_copy`: a materialised copy of a layer's keys is counted in temp bytes."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.decode_attention import decode_attention

    kv = jax.ShapeDtypeStruct((2, 2, _DECODE_CONTEXT, 128), jnp.bfloat16)  # [b, k, s, d]
    args = kernel_aot._on_device((jax.ShapeDtypeStruct((2, 4, 128), jnp.bfloat16), kv, kv,
                                  jax.ShapeDtypeStruct((2,), jnp.int32)), kernel_aot.tpu_devices("v5e:2x2")[0])

    def temp_bytes(fn):
        with kernel_aot.without_compilation_cache():
            return jax.jit(fn).trace(*args).lower().compile().memory_analysis().temp_size_in_bytes

    kernel = dict(implementation="pallas_tpu", interpret=False)
    native = temp_bytes(lambda q, k, v, n: decode_attention(q, k, v, n, kv_layout="bksd", **kernel))
    copied = temp_bytes(lambda q, k, v, n: decode_attention(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), n,
                                                            kv_layout="bskd", **kernel))
    layer_keys = 2 * 2 * _DECODE_CONTEXT * 128 * 2
    assert native < layer_keys <= copied


@needs_libtpu
def test_decode_flag_compiles_the_lm_decode_step_and_refuses_non_lm_targets(tmp_path, capsys, monkeypatch):
    out = tmp_path / "decode.json"
    rc = cli.main(["aot", "lm_arithmetic", "--preset", "smoke", "--decode", "64", "--kv-layout", "bksd",
                   "--topology", "v5e:2x2", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "kv_layout=bksd, decode=dense" in text and "updated in place" in text and "no cache copy" in text
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ok"] and row["context"] == 64 and row["in_place"] and not row["cache_copy"]
    assert cli.main(["aot", "toast", "--preset", "smoke", "--decode", "64"]) == 2
    assert "--decode applies to decoder LM targets; toast's model is a" in capsys.readouterr().out
    assert cli.main(["aot", "lm_arithmetic", "--preset", "smoke", "--decode", "64", "--ffd-residual", "bfloat16"]) == 2
    assert "--ffd-residual applies to --decode-attention ffd; got dense" in capsys.readouterr().out
