"""Compile one training step for a TPU pod slice ahead of time, on a machine without a TPU.

With libtpu installed (the ``[tpu]`` extra) the real TPU compiler runs here against the device
descriptions of a slice (`jax.experimental.topologies`), as MaxText's ``compile_topology`` does. The
train state is built abstractly (`algorithms.training.init_train_state(..., abstract=True)`: shapes and
shardings, nothing allocated), the step is traced with the kernels resolved for TPU
(`pallas_kernels._backend.compiling_for`), and the compiled program's per-chip memory is compared with
the chip's HBM::

    python -m experiments aot lm_1b --topology v5e:4x4 --mesh 1 16 1
    python -m experiments aot lm_arithmetic --preset paper --topology v5e:2x2
    python -m experiments aot lm_1b --topology v5e:4x4 --remat none --no-scan-layers   # what scan and remat buy

A target is `lm_1b` (the 1B-parameter decoder LM of issue 35: d_model 2048, 16 layers, 16/8 heads,
d_ff 7168, vocabulary 32k, sequence 2048, bfloat16 compute, scanned and rematerialised blocks, flash
attention in training) or an experiment whose registry entry defines ``train_step``: its preset's model,
optimizer, loss and batch as a `TrainStep` (a decoder LM from its `TransformerConfig`; a ViT, VLM or any
other model from the ``model_fn``, ``loss_fn`` and batch its run passes to `training.fit`). For
SFT-then-RL experiments it is the supervised step. Measured results: ``results/aot/train_steps.json``
(``--json``).

``--decode CONTEXT`` compiles a decoder LM target's one-token decode step instead (`compile_decode_step`:
one chip, a KV cache of CONTEXT tokens per sequence, the cache donated), in the KV-cache axis order of
``--kv-layout`` and the decode attention of ``--decode-attention``. It reports whether the cache is
updated in place and whether the program materialises a copy of a cache buffer (a per-step relayout),
for each axis order, without a TPU (issue 34)::

    python -m experiments aot lm_1b --decode 32768 --batch 4 --kv-layout bksd --topology v5e:2x2
    python -m experiments aot lm_1b --decode 32768 --batch 4 --kv-layout bskd --decode-attention kernel

Measured results: ``results/aot/decode_steps.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from algorithms import training
from models.kv_cache import KV_LAYOUTS
from models.transformer import (DECODE_ATTENTION, FFD_RESIDUAL_DTYPES, PREFILL_ATTENTION, REMAT, Transformer,
                                TransformerConfig)

__all__ = ["TrainStep", "HBM_GIB", "lm_1b", "compile_train_step", "compile_decode_step", "targets", "main"]

# HBM per chip, GiB (public spec sheets). XLA reserves a little of it: the compiler's own limit is the
# final word (a step over it fails to compile with its message).
HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainStep:
    """One training step to compile: a model, its optimizer, its loss and the global batch's shapes.

    A decoder LM needs only its `TransformerConfig` and the token length: the model is
    `Transformer(model)` and the batch is ``inputs``, ``targets`` (int32) and ``loss_mask`` (float32) of
    ``[batch_size, seq_len]``. Any other model (a ViT, a VLM, a video transformer) gives `model_fn` and
    `example`, exactly as its experiment calls `training.fit`.

    Attributes:
      model: the model's config. A `TransformerConfig` may have its `scan_layers`, `remat` and
        `attention.prefill` overridden from the command line; another config is only reported.
      optimizer: the `training.OptimizerConfig` of the run, or the run's own optax transformation where
        the config cannot express it (a one-cycle schedule, a frozen sub-tree); it must be the very
        object (or built by the very function) the run trains with.
      batch_size: global examples per step (split over the mesh's data and fsdp axes).
      seq_len: tokens per sequence (inputs and targets) of a decoder LM; None when `example` is given.
      loss_fn: `(model, batch) -> (loss, metrics)`; default next-token cross-entropy.
      model_fn: builds the model from `nnx.Rngs` (default `Transformer(model)`).
      example: one example's arrays, ``name -> (shape, dtype)`` without the batch axis (default the LM's
        tokens).
    """

    model: Any
    optimizer: training.OptimizerConfig | optax.GradientTransformation = training.OptimizerConfig()
    batch_size: int
    seq_len: int | None = None
    loss_fn: Callable = training.next_token_loss
    model_fn: Callable[[nnx.Rngs], nnx.Module] | None = None
    example: Mapping[str, tuple[tuple[int, ...], Any]] | None = None

    def __post_init__(self):
        if self.model_fn is None and not isinstance(self.model, TransformerConfig):
            raise ValueError(f"TrainStep needs model_fn for a model config of type {type(self.model).__name__} "
                             "(only a TransformerConfig builds itself)")
        if (self.example is None) == (self.seq_len is None):
            raise ValueError("TrainStep takes exactly one of seq_len (a decoder LM's tokens) and example; got "
                             f"seq_len={self.seq_len!r}, example={self.example!r}")

    @property
    def is_lm(self) -> bool:
        """Whether this is the decoder LM (`Transformer`) whose scan, remat and prefill may be overridden."""
        return self.model_fn is None

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return Transformer(self.model, rngs=rngs) if self.model_fn is None else self.model_fn(rngs)

    def batch_shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The global batch: ``name -> ((batch_size, *shape), dtype)``."""
        if self.example is None:
            tokens = (self.batch_size, self.seq_len)
            return {"inputs": (tokens, jnp.int32), "targets": (tokens, jnp.int32), "loss_mask": (tokens, jnp.float32)}
        return {k: ((self.batch_size, *shape), dtype) for k, (shape, dtype) in self.example.items()}

    @classmethod
    def from_batch(cls, batch: Mapping[str, Any], **kwargs) -> "TrainStep":
        """A step whose global batch has the shapes and dtypes of `batch` (one batch of the run's `batch_fn`)."""
        sizes = {k: jnp.shape(v)[0] for k, v in batch.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"batch arrays must share their leading (batch) axis; got {sizes}")
        example = {k: (tuple(jnp.shape(v)[1:]), jnp.result_type(v)) for k, v in batch.items()}
        return cls(batch_size=next(iter(sizes.values())), example=example, **kwargs)


def lm_1b(batch_size: int = 16) -> TrainStep:
    """The 1.04B-parameter decoder LM at sequence 2048 (AdamW, float32 parameters, bfloat16 compute)."""
    model = TransformerConfig(vocab_size=32_000, d_model=2048, num_layers=16, num_heads=16, num_kv_heads=8,
                              d_ff=7168, dtype="bfloat16", scan_layers=True, remat="full")
    return TrainStep(model=model, batch_size=batch_size, seq_len=2048)


def targets() -> dict[str, str]:
    """Target name -> what it compiles: `lm_1b` and every experiment with a ``train_step``."""
    from experiments import registry

    out = {"lm_1b": "the 1B decoder LM of issue 35 at sequence 2048"}
    for slug in registry.implemented_slugs():
        if registry.get(slug).train_step is not None:
            out[slug] = f"{slug}'s training step at a preset (--preset)"
    return out


def _global_batch(step: TrainStep, mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if step.batch_size % shards:
        raise ValueError(f"batch_size {step.batch_size} does not split over the mesh's data x fsdp = {shards} "
                         f"devices; use a multiple of {shards} (--batch)")
    sharding = training.batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for k, (shape, dtype) in step.batch_shapes().items()}


def _memory(compiled) -> dict[str, int]:
    """Per-chip bytes of a compiled program, by kind (its `memory_analysis()`)."""
    mem = compiled.memory_analysis()
    return {"argument": mem.argument_size_in_bytes, "output": mem.output_size_in_bytes,
            "alias": mem.alias_size_in_bytes, "temp": mem.temp_size_in_bytes, "code": mem.generated_code_size_in_bytes}


def compile_train_step(step: TrainStep, *, topology: str, mesh: training.MeshConfig) -> dict[str, Any]:
    """Compiles one `make_train_step` step of `step` for `topology` from abstract shapes.

    Returns:
      a dict: ok, error (the compiler's message when it refused), mesh, chips, params, compile_s,
      per-chip bytes (argument, output, alias, temp, generated code, total), hbm_bytes, fits, suggestion.

    Raises:
      RuntimeError: libtpu is not installed. ValueError: the mesh or batch does not divide the slice.
    """
    from pallas_kernels import _backend
    from pallas_kernels import aot as kernel_aot

    devices = kernel_aot.tpu_devices(topology)
    device_mesh = training.make_mesh(mesh, devices)
    batch = _global_batch(step, device_mesh)
    optimizer = training.make_optimizer(step.optimizer) if isinstance(step.optimizer, training.OptimizerConfig) \
        else step.optimizer
    row: dict[str, Any] = {"topology": topology, "chips": len(devices), "mesh": list(device_mesh.shape.values()),
                           "model": type(step.model).__name__, "batch_size": step.batch_size, "seq_len": step.seq_len,
                           "batch": {k: list(shape) for k, (shape, _) in step.batch_shapes().items()}}
    if step.is_lm:
        row.update(scan_layers=step.model.scan_layers, remat=step.model.remat,
                   # "auto" is the flash kernel when compiling for TPU
                   prefill="dense" if step.model.attention.prefill == "dense" else "flash")
    with kernel_aot.without_compilation_cache(), _backend.compiling_for("tpu"):
        t0 = time.perf_counter()
        graphdef, state, shardings = training.init_train_state(
            step.build, optimizer, mesh=device_mesh, rules=mesh.logical_axis_rules, abstract=True)
        row["params"] = sum(int(x.size) for x in jax.tree.leaves(state.params))
        fn = training.make_train_step(graphdef, optimizer, loss_fn=step.loss_fn, shardings=shardings,
                                      mesh=device_mesh)
        lowered = fn.trace(state, batch).lower()
        row["trace_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            compiled = lowered.compile()
        except Exception as e:  # the compiler's refusal (e.g. RESOURCE_EXHAUSTED over HBM) is the result
            row.update(ok=False, compile_s=time.perf_counter() - t0, error=kernel_aot.compiler_verdict(str(e)))
            row.update(fits=False, suggestion=_suggest(step, mesh, len(devices)))
            return row
        row["compile_s"] = time.perf_counter() - t0
    sizes = _memory(compiled)
    total = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"] + sizes["code"]
    hbm = HBM_GIB.get(topology.split(":")[0])
    fits = hbm is None or total <= hbm * 2**30
    row.update(ok=True, error=None, bytes={k: int(v) for k, v in sizes.items()}, total_bytes=int(total),
               hbm_bytes=None if hbm is None else hbm * 2**30, fits=fits,
               suggestion=None if fits else _suggest(step, mesh, len(devices)))
    return row


def compile_decode_step(model: TransformerConfig, *, topology: str, batch_size: int, context: int) -> dict[str, Any]:
    """Compiles one decode step of a decoder LM (one new token per sequence) for one chip of `topology`.

    The step is what `algorithms.decoding.generate` runs per token: the model on ``[batch_size, 1]``
    tokens with a KV cache of `context` tokens per sequence, in `model`'s KV-cache axis order
    (``model.attention.kv_layout``; None resolves on this machine's backend, "bksd" without an
    accelerator) and decode attention (``model.attention.decode``). The cache is donated, as in
    `generate`'s loop, so a cache updated in place shows as aliased bytes. Parameters stay float32
    (the model casts them per step).

    Returns:
      a dict: ok, error, kv_layout, decode, batch_size, context, params, compile_s, per-chip bytes
      (argument, output, alias, temp, code), cache_bytes (all layers' keys and values),
      ``in_place`` (the whole cache is aliased: the write of the new token copies nothing) and
      ``cache_copy`` (the temporaries could hold a layer's key buffer: a materialised relayout or
      copy of the cache per step), and the compiler cost model's ``bytes_accessed``.

    Raises:
      RuntimeError: libtpu is not installed. ValueError: `model` is not a decoder LM config, or
      `batch_size` / `context` is not positive.
    """
    from pallas_kernels import _backend
    from pallas_kernels import aot as kernel_aot

    if not isinstance(model, TransformerConfig):
        raise ValueError(f"a decode step needs a decoder LM (TransformerConfig); got {type(model).__name__}")
    for name, value in (("batch_size", batch_size), ("context", context)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value}")
    if model.scan_layers:  # the per-layer cache tuple is read by the unrolled blocks
        model = dataclasses.replace(model, scan_layers=False)
    layout = model.attention.resolved_kv_layout
    chip = kernel_aot.tpu_devices(topology)[0]
    row: dict[str, Any] = {"topology": topology, "kv_layout": layout, "decode": model.attention.decode,
                           "batch_size": batch_size, "context": context}
    if model.attention.decode == "ffd":
        row["ffd_residual"] = model.attention.ffd.residual_dtype
    with kernel_aot.without_compilation_cache(), _backend.compiling_for("tpu"):
        abstract = nnx.eval_shape(lambda: Transformer(model, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        cache = kernel_aot._on_device(jax.eval_shape(lambda: abstract.init_cache(batch_size, context)), chip)
        tokens = kernel_aot._on_device(jax.ShapeDtypeStruct((batch_size, 1), jnp.int32), chip)

        def step(state, tokens, cache):
            out = nnx.merge(graphdef, state)(tokens, cache=cache)
            return out.logits, out.cache

        t0 = time.perf_counter()
        try:
            compiled = jax.jit(step, donate_argnums=2).trace(kernel_aot._on_device(state, chip), tokens, cache).lower().compile()
        except Exception as e:  # the compiler's refusal is the result
            row.update(ok=False, compile_s=time.perf_counter() - t0, error=kernel_aot.compiler_verdict(str(e)))
            return row
        row["compile_s"] = time.perf_counter() - t0
    sizes = _memory(compiled)
    buffers = cache.keys + cache.values
    # K and V, and an FFD model's quantized pages (updated in place with them)
    cache_bytes = sum(b.size * b.dtype.itemsize for b in jax.tree.leaves((cache.keys, cache.values, cache.pages)))
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    row.update(ok=True, error=None, params=sum(int(x.size) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))),
               bytes={k: int(v) for k, v in sizes.items()}, cache_bytes=int(cache_bytes),
               in_place=sizes["alias"] >= cache_bytes,
               cache_copy=sizes["temp"] >= buffers[0].size * buffers[0].dtype.itemsize,
               bytes_accessed=float((cost or {}).get("bytes accessed", float("nan"))))
    return row


def _suggest(step: TrainStep, mesh: training.MeshConfig, chips: int) -> str:
    """What to try when a step does not fit: shard fully, then rematerialise, then fewer sequences per chip."""
    if (mesh.data, mesh.fsdp, mesh.tensor) not in ((1, chips, 1), (1, -1, 1)):
        return f"shard parameters and optimizer state over every chip: --mesh 1 {chips} 1"
    if step.is_lm and step.model.remat == "none":
        return "rematerialise each block: --remat full"
    if step.is_lm and step.model.attention.prefill == "dense":
        return "use the flash kernel for training attention (memory linear in sequence length): --prefill flash"
    if step.batch_size > chips:
        return f"fewer sequences per chip: --batch {chips}"
    return "a larger slice, or tensor parallelism: --mesh 1 N T with N x T chips"


def _target_step(name: str, preset: str, batch: int | None) -> TrainStep:
    if name == "lm_1b":
        return lm_1b(batch) if batch else lm_1b()
    from experiments import registry

    exp = registry.get(name)
    if exp.train_step is None:
        raise ValueError(f"{name!r} defines no training step to compile; targets: {sorted(targets())}")
    step = exp.train_step(exp.config(preset))
    return dataclasses.replace(step, batch_size=batch) if batch else step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments aot", description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", help="lm_1b, or an experiment slug with a training step (see --list)")
    p.add_argument("--list", action="store_true", help="list the targets and exit")
    p.add_argument("--preset", default="paper", help="the experiment's preset (default paper)")
    p.add_argument("--topology", default="v5e:4x4", help="a TPU slice, e.g. v5e:4x4, v5e:16x16, v6e:2x2")
    p.add_argument("--mesh", nargs=3, type=int, metavar=("DATA", "FSDP", "TENSOR"), default=None,
                   help="mesh axis sizes (one may be -1); default fully sharded: 1 <chips> 1")
    p.add_argument("--batch", type=int, default=None, help="global sequences per step (default: the target's)")
    p.add_argument("--remat", choices=REMAT, default=None, help="override the model's rematerialisation")
    p.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=None,
                   help="override whether the blocks are scanned (stacked parameters)")
    p.add_argument("--prefill", choices=PREFILL_ATTENTION, default=None, help="training attention: dense or flash")
    p.add_argument("--decode", type=int, default=None, metavar="CONTEXT",
                   help="compile the LM's one-token decode step over a cache of CONTEXT tokens (one chip) instead")
    p.add_argument("--kv-layout", choices=KV_LAYOUTS, default="bskd", help="with --decode: the cache's axis order")
    p.add_argument("--decode-attention", choices=DECODE_ATTENTION, default="dense",
                   help="with --decode: the decode attention")
    p.add_argument("--ffd-residual", choices=FFD_RESIDUAL_DTYPES, default=None,
                   help="with --decode-attention ffd: the storage of the pages' residual (default float32)")
    p.add_argument("--json", type=pathlib.Path, default=None, help="append the result row to this JSON file")
    a = p.parse_args(argv)
    if a.list or a.target is None:
        for name, what in targets().items():
            print(f"{name:24s} {what}")
        return 0 if a.list else 2
    try:
        step = _target_step(a.target, a.preset, a.batch)
        model = step.model
        overrides = [f for f in ("remat", "scan_layers", "prefill") if getattr(a, f) is not None]
        if overrides and not step.is_lm:
            raise ValueError(f"--{overrides[0].replace('_', '-')} applies to decoder LM targets; {a.target}'s model "
                             f"is a {type(model).__name__}")
        if a.remat is not None:
            model = dataclasses.replace(model, remat=a.remat)
        if a.scan_layers is not None:
            model = dataclasses.replace(model, scan_layers=a.scan_layers)
        if a.prefill is not None:
            model = dataclasses.replace(model, attention=dataclasses.replace(model.attention, prefill=a.prefill))
        step = dataclasses.replace(step, model=model)
        if a.decode is not None:
            if not step.is_lm:
                raise ValueError(f"--decode applies to decoder LM targets; {a.target}'s model is a "
                                 f"{type(model).__name__}")
            attention = dataclasses.replace(model.attention, kv_layout=a.kv_layout, decode=a.decode_attention)
            if a.ffd_residual is not None:
                if a.decode_attention != "ffd":
                    raise ValueError(f"--ffd-residual applies to --decode-attention ffd; got {a.decode_attention}")
                attention = dataclasses.replace(attention, ffd=dataclasses.replace(attention.ffd,
                                                                                   residual_dtype=a.ffd_residual))
            row = compile_decode_step(dataclasses.replace(model, attention=attention), topology=a.topology,
                                      batch_size=step.batch_size, context=a.decode)
        else:
            mesh = training.MeshConfig(data=1, fsdp=-1, tensor=1) if a.mesh is None else \
                training.MeshConfig(data=a.mesh[0], fsdp=a.mesh[1], tensor=a.mesh[2])
            row = compile_train_step(step, topology=a.topology, mesh=mesh)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}")
        return 2
    row = {"target": a.target, "preset": a.preset if a.target != "lm_1b" else None, **row}
    print(_describe_decode(row) if a.decode is not None else _describe(row))
    if a.json:
        rows = json.loads(a.json.read_text())["rows"] if a.json.exists() else []
        meta = {"jax": jax.__version__, "libtpu": _libtpu_version(), "note": "per-chip bytes from memory_analysis() "
                "of the step compiled for the slice's device descriptions on a CPU-only machine"}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({**meta, "rows": rows + [row]}, indent=1) + "\n")
    return 0 if row["ok"] and row.get("fits", True) else 1


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _libtpu_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("libtpu")


def _describe(r: Mapping[str, Any]) -> str:
    head = f"{r['target']} on {r['topology']} ({r['chips']} chips), mesh (data, fsdp, tensor) = {tuple(r['mesh'])}: "
    if "remat" in r:
        head += (f"{_count(r['params'])} params, batch {r['batch_size']} x {r['seq_len']} tokens, "
                 f"scan_layers={r['scan_layers']}, remat={r['remat']}, prefill={r['prefill']}")
    else:
        arrays = ", ".join(f"{k} {'x'.join(map(str, shape))}" for k, shape in r["batch"].items())
        head += f"{r['model']} of {_count(r['params'])} params, batch {arrays}"
    if not r["ok"]:
        return f"{head}\n  does not compile ({r['compile_s']:.1f} s): {r['error']}\n  suggestion: {r['suggestion']}"
    b = r["bytes"]
    hbm = "" if r["hbm_bytes"] is None else f" of {r['hbm_bytes'] / 2**30:.0f} GiB HBM"
    line = (f"{head}\n  compiled in {r['compile_s']:.1f} s (trace and lower {r['trace_s']:.1f} s); per chip "
            f"{_size(r['total_bytes'])}{hbm} (arguments {_size(b['argument'])}, temporaries {_size(b['temp'])}, "
            f"outputs not aliased {_size(b['output'] - b['alias'])}, code {_size(b['code'])}): "
            f"{'fits' if r['fits'] else 'does NOT fit'}")
    return line + ("" if r["fits"] else f"\n  suggestion: {r['suggestion']}")


def _describe_decode(r: Mapping[str, Any]) -> str:
    head = (f"{r['target']} decode step on one {r['topology'].split(':')[0]} chip: batch {r['batch_size']} x "
            f"{r['context']} cached tokens, kv_layout={r['kv_layout']}, decode={r['decode']}")
    if not r["ok"]:
        return f"{head}\n  does not compile ({r['compile_s']:.1f} s): {r['error']}"
    b = r["bytes"]
    return (f"{head}\n  compiled in {r['compile_s']:.1f} s; cache {_size(r['cache_bytes'])}, "
            f"{'updated in place' if r['in_place'] else 'NOT updated in place'} (aliased {_size(b['alias'])}); "
            f"temporaries {_size(b['temp'])}: {'a cache buffer is copied per step' if r['cache_copy'] else 'no cache copy'}; "
            f"cost model {r['bytes_accessed'] / 1e9:.2f} GB accessed")


if __name__ == "__main__":
    raise SystemExit(main())
