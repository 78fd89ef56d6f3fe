"""Ahead-of-time TPU compilation of every Pallas kernel at production shapes, on a machine without a TPU.

Lowering a kernel for TPU (the cross-lowering contract in `tests/pallas_kernels/contract_test.py`)
proves little: Mosaic, the real TPU compiler, rejects kernels that lower cleanly, typically when a
program's blocks do not fit the generation's scoped VMEM. With libtpu installed (the ``[tpu]`` extra:
``pip install -e ".[tpu]"``, about 680 MB) the real compiler runs on a CPU-only machine against a
device *description* of a TPU slice (`jax.experimental.topologies.get_topology_desc`), so each kernel
can be compiled for v5e and v6e here, as MaxText's ``compile_topology`` does for whole training steps.

`CASES` lists one production-shape case per kernel entry point (long contexts, a realistic MoE layer);
`compile_case` compiles one for a topology and returns its per-chip memory analysis or the compiler's
error. Run the survey with::

    python -m pallas_kernels.aot                     # every case on v5e:2x2 and v6e:2x2, a table
    python -m pallas_kernels.aot --json results/aot/kernels.json

`tests/pallas_kernels/aot_compile_test.py` compiles every case (it skips, saying why, without libtpu).
Cases that do not fit yet would be marked in `KNOWN_FAILURES` with their cause (none are today),
and `EXPECTED_ERRORS` holds the shapes a wrapper refuses before compiling, with a message naming the
limit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import time
from typing import Callable

import jax
import jax.numpy as jnp

TOPOLOGIES = ("v5e:2x2", "v6e:2x2")
_ENV = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost",  # quiet the host probe
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}  # several processes (xdist workers) may load libtpu


def libtpu_available() -> bool:
    """True when libtpu (the TPU compiler) is installed."""
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


@functools.cache
def tpu_devices(topology: str) -> tuple:
    """The device descriptions of a TPU slice, e.g. ``"v5e:2x2"`` (no TPU needed; libtpu is).

    Raises:
      RuntimeError: libtpu is not installed (install the ``[tpu]`` extra).
    """
    if not libtpu_available():
        raise RuntimeError('topology compilation needs libtpu: pip install -e ".[tpu]" (about 680 MB)')
    for k, v in _ENV.items():
        os.environ.setdefault(k, v)
    from jax.experimental import topologies

    return tuple(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel entry point at production shapes: `build()` -> (fn, abstract args)."""

    kernel: str  # the pallas_kernels sub-package
    name: str
    build: Callable[[], tuple]

    @property
    def id(self) -> str:
        return f"{self.kernel}.{self.name}"


CASES: list[Case] = []


def _case(kernel: str, name: str):
    def register(build):
        CASES.append(Case(kernel, name, build))
        return build

    return register


sd = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16

# Decode: batch 8, 32 query heads over 8 KV heads, head_dim 128.
_B, _H, _KH, _D = 8, 32, 8, 128


def _decode_args(s: int):
    return (sd((_B, _H, _D), BF16), sd((_B, s, _KH, _D), BF16), sd((_B, s, _KH, _D), BF16), sd((_B,), jnp.int32))


@_case("decode_attention", "decode_32k")
def _decode():
    from pallas_kernels.decode_attention import decode_attention

    return (lambda q, k, v, n: decode_attention(q, k, v, n, implementation="pallas_tpu", interpret=False),
            _decode_args(32768))


def _flash(t: int, backward: bool = False):
    from pallas_kernels.flash_attention import flash_attention

    def fwd(q, k, v):
        return flash_attention(q, k, v, causal=True, implementation="pallas_tpu", interpret=False)

    fn = fwd
    if backward:
        fn = lambda q, k, v: jax.grad(lambda *a: fwd(*a).astype(jnp.float32).sum(), (0, 1, 2))(q, k, v)
    return fn, (sd((1, t, _H, _D), BF16), sd((1, t, _KH, _D), BF16), sd((1, t, _KH, _D), BF16))


for _t in (4096, 8192, 32768):
    _case("flash_attention", f"forward_causal_{_t // 1024}k")(functools.partial(_flash, _t))
for _t in (2048, 8192):
    _case("flash_attention", f"forward_backward_{_t // 1024}k")(functools.partial(_flash, _t, True))


def _gmm(m: int, k: int, n: int, backward: bool):
    from pallas_kernels.grouped_matmul import grouped_matmul

    def fwd(x, w, g):
        return grouped_matmul(x, w, g, implementation="pallas_tpu", interpret=False)

    fn = fwd
    if backward:
        fn = lambda x, w, g: jax.grad(lambda a, b: fwd(a, b, g).astype(jnp.float32).sum(), (0, 1))(x, w)
    return fn, (sd((m, k), BF16), sd((8, k, n), BF16), sd((8,), jnp.int32))


# An MoE FFN of 8 experts, d_model 2048, d_ff 5632, 8192 routed tokens: up and down projections.
_case("grouped_matmul", "up_8x2048x5632")(functools.partial(_gmm, 8192, 2048, 5632, False))
_case("grouped_matmul", "up_8x2048x5632_backward")(functools.partial(_gmm, 8192, 2048, 5632, True))
_case("grouped_matmul", "down_8x5632x2048")(functools.partial(_gmm, 8192, 5632, 2048, False))


def _kv_tensors(s: int):
    from primitives import quantization as qz

    x = sd((_B, s, _KH, _D), BF16)
    kt = jax.eval_shape(lambda a: qz.quantize(a, bits=4, group_size=64), x)
    vt = jax.eval_shape(lambda a: qz.quantize(a, bits=2, group_size=128, scheme="asymmetric",
                                              scale_dtype=jnp.bfloat16), x)
    return x, kt, vt


@_case("kv_quant", "quantize_32k")
def _kv_quantize():
    from pallas_kernels.kv_quant import quantize

    x, _, _ = _kv_tensors(32768)
    return lambda a: quantize(a, bits=4, group_size=64, implementation="pallas_tpu", interpret=False), (x,)


@_case("kv_quant", "quantize_32k_head_major")
def _kv_quantize_head_major():  # a [b, k, s, d] cache: one row per token
    from pallas_kernels.kv_quant import quantize

    x = sd((_B, _KH, 32768, _D), BF16)
    return lambda a: quantize(a, bits=4, group_size=64, implementation="pallas_tpu", interpret=False), (x,)


@_case("kv_quant", "dequantize_32k")
def _kv_dequantize():
    from pallas_kernels.kv_quant import dequantize

    _, _, vt = _kv_tensors(32768)
    return lambda t: dequantize(t, implementation="pallas_tpu", interpret=False), (vt,)


@_case("kv_quant", "quantized_decode_32k")
def _kv_decode():
    from pallas_kernels.kv_quant import quantized_decode_attention

    _, kt, vt = _kv_tensors(32768)
    f = lambda q, k, v, n: quantized_decode_attention(q, k, v, n, implementation="pallas_tpu", interpret=False)
    return f, (sd((_B, _H, _D), BF16), kt, vt, sd((_B,), jnp.int32))


@_case("ffd_decode", "ffd_decode_32k")
def _ffd():
    from pallas_kernels.ffd_decode import ffd_decode
    from primitives import ffd as ffd_ref

    s = 32768
    cache = jax.eval_shape(lambda k, v, n: ffd_ref.build_cache(k, v, n, page_size=128, residual_dtype=BF16),
                           sd((_B, s, _KH, _D), BF16), sd((_B, s, _KH, _D), BF16), sd((_B,), jnp.int32))
    f = lambda q, c: ffd_decode(q, c, delta=5.0, implementation="pallas_tpu", interpret=False).out
    return f, (sd((_B, _H, _D), BF16), cache)


@_case("vegas", "verify_32k")
def _vegas_verify():
    from pallas_kernels.vegas import verify_attention

    s = 32768
    f = lambda q, k, v, p: verify_attention(q, k, v, p, rows=(0, 4), implementation="pallas_tpu", interpret=False)
    return f, (sd((_B, 5, _H, _D), BF16), sd((_B, s, _KH, _D), BF16), sd((_B, s, _KH, _D), BF16),
               sd((_B, 5), jnp.int32))


@_case("vegas", "sparse_decode_32k")
def _vegas_sparse():
    from pallas_kernels.vegas import sparse_decode_attention

    s, n = 32768, 2048
    f = lambda q, k, v, i, ok, rs, ln: sparse_decode_attention(q, k, v, i, ok, rs, ln, max_recent=64,
                                                               return_lse=True, implementation="pallas_tpu",
                                                               interpret=False)
    return f, (sd((_B, _H, _D), BF16), sd((_B, s, _KH, _D), BF16), sd((_B, s, _KH, _D), BF16),
               sd((_B, n), jnp.int32), sd((_B, n), jnp.bool_), sd((_B,), jnp.int32), sd((_B,), jnp.int32))


@_case("qvg", "kmeans_assign")
def _qvg_assign():
    from pallas_kernels.qvg import kmeans_assign

    return (lambda x, c: kmeans_assign(x, c, implementation="pallas_tpu", interpret=False),
            (sd((64, 8192, 128), jnp.float32), sd((64, 256, 128), jnp.float32)))


def _qvg_attention(span: int):
    from pallas_kernels.qvg import qvg_attention
    from primitives import residual_quantization as rq

    x = sd((_B, _KH, span, _D), BF16)
    kt = jax.eval_shape(lambda a: rq.qvg_quantize(a, jax.random.key(0), config=rq.QVG), x)
    vt = jax.eval_shape(lambda a: rq.qvg_quantize(a, jax.random.key(0), config=rq.QVG_PRO), x)
    f = lambda q, k, v, n: qvg_attention(q, k, v, n, implementation="pallas_tpu", interpret=False)
    return f, (sd((_B, 64, _KH, _D), BF16), kt, vt, sd((_B,), jnp.int32))


for _s in (8192, 32768):
    _case("qvg", f"qvg_attention_span_{_s // 1024}k")(functools.partial(_qvg_attention, _s))


def _wkv(t: int):
    from pallas_kernels.wkv import bi_wkv

    def f(w, u, k, v):
        return jax.grad(lambda kk: bi_wkv(w, u, kk, v, implementation="pallas_tpu", interpret=False)
                        .astype(jnp.float32).sum())(k)

    c = 768  # a ViT-B width; 1024 tokens = 32 x 32 patches
    return f, (sd((c,), jnp.float32), sd((c,), jnp.float32), sd((8, t, c), BF16), sd((8, t, c), BF16))


_case("wkv", "bi_wkv_forward_backward_1k")(functools.partial(_wkv, 1024))
# 64 x 64 patches: the wrapper refuses before compiling, naming the VMEM it would need and the limit.
_case("wkv", "bi_wkv_forward_backward_4k")(functools.partial(_wkv, 4096))
EXPECTED_ERRORS = {"wkv.bi_wkv_forward_backward_4k": r"t=4096 tokens: the TPU kernel would need .* MiB of VMEM"}

# Cases known not to compile, by (case id, generation): the cause, until the kernel is fixed. The compile
# test expects these to fail (strictly: a case that starts compiling must be taken off this table). Empty
# since issue 35's fixes (flash attention, grouped matmul and QVG attention tile by design); the 13 failures
# its survey found (jax 0.10.2, libtpu 0.0.42.1) are in the git history of this table.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}

# HBM temporaries a case may need (MiB, on either generation): a wrapper that reads and writes arrays in
# the layouts XLA:TPU stores them in needs almost none, so a relayout or copy that creeps back (each one
# of these cases once made 256 MiB to 1.4 GiB of them) fails the compile test. The exceptions copy by
# design: flash attention's wrapper moves q, k, v (and out, dO, the gradients) to head-major; Bi-WKV's
# moves k, v and the cotangent to its sequence-major layout and keeps float32 residuals.
TEMP_BUDGET_MIB = 64
TEMP_BUDGETS_MIB = {
    "flash_attention.forward_causal_32k": 512,
    "flash_attention.forward_backward_8k": 192,
    "wkv.bi_wkv_forward_backward_1k": 96,
}


def _on_device(args, device):
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.tree.map(lambda a: sd(a.shape, a.dtype, sharding=sharding), args)


def compile_case(case: Case, topology: str) -> dict:
    """Compiles `case` for one chip of `topology`: {"ok", "seconds", "temp_bytes", "argument_bytes", "error"}."""
    fn, args = case.build()
    args = _on_device(args, tpu_devices(topology)[0])
    t0 = time.perf_counter()
    try:  # tracing runs the wrappers' own shape checks; compile() runs Mosaic and XLA:TPU
        with without_compilation_cache():
            compiled = jax.jit(fn).trace(*args).lower().compile()
    except Exception as e:  # the compiler's own message is the result
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": compiler_verdict(str(e))}
    mem = compiled.memory_analysis()
    return {"ok": True, "seconds": time.perf_counter() - t0, "temp_bytes": int(mem.temp_size_in_bytes),
            "argument_bytes": int(mem.argument_size_in_bytes), "error": None}


@contextlib.contextmanager
def without_compilation_cache():
    """The persistent compilation cache off inside: a TPU executable compiled here cannot be loaded back.

    JAX decides once per process whether the cache is used, so the flag alone does not turn it off
    after a first compile: ``reset_cache`` makes it decide again, on entry and on exit. (With the flag
    alone, a TPU executable was written to the cache and a later compile of it warned that it could not
    read it back.)
    """
    from jax.experimental.compilation_cache import compilation_cache

    cache_on = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", cache_on)
        compilation_cache.reset_cache()


def compiler_verdict(msg: str) -> str:
    """The compiler's verdict in one line: its error code plus the sizes it names (e.g. "size 46.88M and
    limit 32.00M") when it names them."""
    import re

    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()] or ["(no message)"]
    sizes = re.search(r"[Ss]coped allocation with size \S+ and limit \S+", msg)
    return (lines[0] + (" " + sizes.group(0) if sizes else ""))[:300]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES))
    p.add_argument("--only", nargs="*", default=None, help="case ids (or kernel names) to run")
    p.add_argument("--json", type=pathlib.Path, default=None, help="also write the rows here")
    a = p.parse_args(argv)
    rows = []
    for case in CASES:
        if a.only and case.id not in a.only and case.kernel not in a.only:
            continue
        for topo in a.topologies:
            r = {"case": case.id, "topology": topo, **compile_case(case, topo)}
            rows.append(r)
            mem = f"temp {r['temp_bytes'] / 2**20:8.1f} MiB" if r["ok"] else r["error"]
            print(f"{case.id:45s} {topo:8s} {'ok  ' if r['ok'] else 'FAIL'} {r['seconds']:6.1f}s  {mem}", flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        import importlib.metadata
        import platform

        meta = {"jax": jax.__version__, "libtpu": importlib.metadata.version("libtpu"),
                "host": f"{platform.machine()} CPU only, {os.cpu_count()} cores (no TPU: device descriptions)"}
        a.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
