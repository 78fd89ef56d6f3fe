"""Backend resolution shared by every kernel package.

One place decides, for a public kernel call,

  * which implementation runs (`resolve_implementation`): "xla" (the pure-jnp
    reference), "pallas_tpu" (Mosaic TPU) or "pallas_triton" (Pallas' Triton
    backend on GPU). `implementation=None` means the best available: the Pallas
    kernel for the default backend on TPU/GPU, the XLA reference on CPU (Pallas
    runs on CPU only in the interpreter, which is slower than XLA). "pallas"
    means the Pallas kernel for the default backend; on CPU that is the
    interpreter with the Triton-shaped shell.
  * whether the Pallas kernel is interpreted (`resolve_interpret`): None means
    "interpret iff the default backend is CPU".
  * the compiler parameters (`compiler_params`): their *type* selects the
    backend (`pltpu.CompilerParams` or `pltriton.CompilerParams`); there is no
    `backend=` argument any more. Interpret mode ignores them, so the same call
    carries TPU or Triton parameters while being interpreted, which is what the
    cross-lowering tests rely on.

`compiling_for("tpu")` makes both resolve as if that were the default backend, for compiling
ahead of time on a CPU-only machine for a TPU described by `jax.experimental.topologies`
(`experiments.aot` compiles whole training steps this way).

`lower_for(fn, *args, platform)` lowers a jitted call for "tpu" or "cuda" on a
CPU-only machine: it catches TPU block-shape rules and Triton's power-of-two
and no-scratch rules without the hardware (see PALLAS.md).

What the kernel bodies and cost models share (the `Cost` record, `MASK_VALUE`,
`online_softmax_step`) lives in `pallas_kernels._common`.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Sequence

import jax
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

__all__ = [
    "IMPLEMENTATIONS",
    "compiling_for",
    "target_backend",
    "resolve_implementation",
    "resolve_interpret",
    "compiler_params",
    "is_power_of_two",
    "next_power_of_two",
    "padded_rows",
    "pad_axis",
    "lower_for",
    "quiet_triton_deprecation",
]

IMPLEMENTATIONS = ("xla", "pallas", "pallas_tpu", "pallas_triton")
_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"
# The card a "cuda" lowering targets on a machine without a GPU (`lower_for`): the H100/H200 class
# (compute capability 9.0) this project's GPU runs are lent.
ABSTRACT_GPU = "NVIDIA H100"


_TARGET: list[str] = []  # the innermost `compiling_for` platform, if any


def target_backend() -> str:
    """The backend kernels are resolved for: the `compiling_for` platform, else `jax.default_backend()`."""
    return _TARGET[-1] if _TARGET else jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str):
    """Resolves ``implementation=None`` / ``interpret=None`` as on `platform` ("tpu", "gpu" or "cpu") inside.

    For tracing a program that is compiled for another platform than this process's default (a TPU
    slice's device descriptions on a CPU machine). Kernel wrappers are jitted and cache their traces
    by argument, not by this context: trace them first inside it.
    """
    if platform not in ("tpu", "gpu", "cpu"):
        raise ValueError(f"platform must be 'tpu', 'gpu' or 'cpu'; got {platform!r}")
    _TARGET.append(platform)
    try:
        yield
    finally:
        _TARGET.pop()


def resolve_implementation(implementation: str | None, *, supported: Sequence[str] = ("pallas_tpu", "pallas_triton")) -> str:
    """Maps the user's `implementation=` to "xla", "pallas_tpu" or "pallas_triton".

    Raises:
      ValueError: unknown implementation name.
      NotImplementedError: a Pallas backend this op does not support.
    """
    if implementation is not None and implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")
    backend = target_backend()
    if implementation == "xla":
        return "xla"
    if implementation is None:
        if backend == "tpu" and "pallas_tpu" in supported:
            return "pallas_tpu"
        if backend == "gpu" and "pallas_triton" in supported:
            return "pallas_triton"
        return "xla"
    if implementation == "pallas":
        implementation = "pallas_tpu" if backend == "tpu" else "pallas_triton"
    if implementation not in supported:
        raise NotImplementedError(f"{implementation!r} is not implemented for this op; supported: {list(supported)}")
    return implementation


def resolve_interpret(interpret: bool | None) -> bool:
    """None -> interpret iff the target backend (`target_backend`) is CPU."""
    return target_backend() == "cpu" if interpret is None else bool(interpret)


def compiler_params(
    implementation: str,
    *,
    dimension_semantics: Sequence[str] | None = None,
    vmem_limit_bytes: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
):
    """Backend-typed compiler parameters for `pl.pallas_call`."""
    if implementation == "pallas_tpu":
        return pltpu.CompilerParams(
            dimension_semantics=None if dimension_semantics is None else tuple(dimension_semantics),
            vmem_limit_bytes=vmem_limit_bytes,
        )
    if implementation == "pallas_triton":
        return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    raise ValueError(f"no compiler params for implementation {implementation!r}")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def padded_rows(rows: int, implementation: str) -> int:
    """Padded row count of a `dot` operand: Triton needs a power of two >= 16, TPU a multiple of 8 (sublanes)."""
    if implementation == "pallas_triton":
        return max(16, next_power_of_two(rows))
    return -(-rows // 8) * 8


# Scoped VMEM a kernel's pipelined blocks may take on TPU by default: v5e's scoped limit is 16 MiB (v6e:
# 32 MiB); the rest is left for the other operands and the compiler's scratch.
TPU_BLOCK_VMEM_BUDGET = 12 * 2**20


def tpu_tile_bytes(rows: int, lanes: int, itemsize: int) -> int:
    """VMEM bytes of a [rows, lanes] slab (a block's last two dims) on TPU: tiles of 8 sublanes of 32 bits
    (8 rows of float32, 16 of bfloat16, 32 of uint8) by 128 lanes, so narrow last dims pad to 128."""
    sub = 8 * max(1, 4 // itemsize)
    return -(-rows // sub) * sub * -(-lanes // 128) * 128 * itemsize


def splits_within_vmem(units: int, unit_bytes: int, splits: int, max_splits: int) -> int:
    """`splits` doubled until one split's share of `units` (tokens, pages) of `unit_bytes` VMEM each fits
    `TPU_BLOCK_VMEM_BUDGET`, capped at `max_splits` (>= 1)."""
    while splits < max_splits and -(-units // splits) * unit_bytes > TPU_BLOCK_VMEM_BUDGET:
        splits *= 2
    return max(1, min(splits, max_splits))


def pad_axis(a: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """`a` padded with `value` at the end of `axis` up to `size` (unchanged when already that size)."""
    if a.shape[axis] == size:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return jax.numpy.pad(a, widths, constant_values=value)


@contextlib.contextmanager
def quiet_triton_deprecation():
    """Silences exactly JAX 0.11's Triton-backend deprecation warning (and nothing else)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TRITON_DEPRECATION)
        yield


def lower_for(fn: Callable, *args, platform: str) -> str:
    """Lowers `jax.jit(fn)` for `platform` ("tpu" or "cuda") and returns the module text.

    `args` may be `jax.ShapeDtypeStruct`s. Works on a CPU-only install: without a GPU, a "cuda"
    lowering targets an abstract `ABSTRACT_GPU` (JAX 0.11's Triton lowering reads the card's compute
    capability and otherwise refuses with "No supported GPU devices found").
    """
    target = contextlib.nullcontext()
    if platform == "cuda" and jax.default_backend() != "gpu":
        device = jax.sharding.AbstractDevice(device_kind=ABSTRACT_GPU, num_cores=None, platform="gpu")
        mesh = jax.sharding.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                                         abstract_device=device)  # Auto: no sharding in the types
        target = jax.sharding.use_abstract_mesh(mesh)
    with quiet_triton_deprecation(), target:
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))
    return lowered.as_text()
