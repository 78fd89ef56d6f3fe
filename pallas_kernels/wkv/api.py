"""Public Bi-WKV: `bi_wkv(w, u, k, v, ...)`, the bidirectional WKV of Vision-RWKV.

Dimension legend: `b` batch (any leading dims), `t` tokens, `c` channels. Shapes as the reference
`primitives.linear_attention.bi_wkv`: w, u [c] (already divided by t, used raw), k, v [..., t, c].

Implementations: "xla" = the linear-time primitive (`method="scan"` on CPU, `"associative"` elsewhere
unless `method=` says otherwise); "pallas" / "pallas_tpu" / "pallas_triton" = the chunked two-pass scan
kernel (`kernel.py`); None or "auto" = the kernel on TPU/GPU, the XLA primitive on CPU. Gradients of the
kernel go through `jax.custom_vjp` whose backward is the VJP of the XLA primitive (no backward kernel yet).

TPU limit: a program keeps its [t, 8, 128] blocks of k, v, the output and the left-context normalizer in
VMEM, double-buffered: 32 KiB per token for float32 k and v, 24 KiB for bfloat16 (t = 1024 needs 32 and
24 MiB). Longer sequences raise and point to `implementation="xla"`.

`bi_wkv` forward + backward (gradient in k; c = 768, batch 8, bfloat16 k and v, `pallas_kernels.aot`'s
case): Compiles for TPU (libtpu 0.0.42.1) up to 2048 tokens on v5e and 2048 on v6e; beyond, the wrapper
refuses (t = 4096 would need 96.02 MiB of VMEM, over its 96 MiB cap).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import _backend
from pallas_kernels.wkv.config import WKVBlockSizes
from pallas_kernels.wkv.cost import bi_wkv_cost
from pallas_kernels.wkv.kernel import bi_wkv_kernel
from primitives import linear_attention as la

__all__ = ["bi_wkv"]

_TPU_VMEM_CAP = 96 * 2**20  # stay under v5e/v6e's 128 MiB physical VMEM


def _tpu_vmem_bytes(tp: int, bs: WKVBlockSizes, itemsize: int) -> int:
    tile = bs.sequences
    return 2 * (tp * tile * (2 * itemsize + 8) + 2 * tile * 4)  # double-buffered k, v, o, lse, w, u


def _pallas_forward(w, u, k, v, *, bs, impl, interpret):
    lead, (t, c) = k.shape[:-2], k.shape[-2:]
    nb = 1
    for d in lead:
        nb *= d
    n = nb * c
    tile = bs.sequences
    n_pad = -(-n // tile) * tile
    g = n_pad // tile
    tp = _backend.next_power_of_two(t) if impl == "pallas_triton" else t
    vmem = _tpu_vmem_bytes(tp, bs, k.dtype.itemsize)
    if impl == "pallas_tpu" and vmem > _TPU_VMEM_CAP:
        tile = bs.sequences
        t_max = (_TPU_VMEM_CAP // 2 - 2 * tile * 4) // (tile * (2 * k.dtype.itemsize + 8))  # inverse of the model
        raise ValueError(f"k has t={t} tokens: the TPU kernel would need {vmem / 2**20:.2f} MiB of VMEM (> "
                         f"{_TPU_VMEM_CAP // 2**20} MiB); at most {t_max} tokens fit with "
                         f"sequences={tile} per program; use implementation='xla' for sequences this long")

    def seq_major(x):  # [..., t, c] -> [tp, g, rows, lanes], sequence index = batch row * c + channel
        x = jnp.moveaxis(x.reshape(nb, t, c), 1, 0).reshape(t, n)
        x = jnp.pad(x, ((0, tp - t), (0, n_pad - n)))
        return x.reshape(tp, g, bs.rows, bs.lanes)

    def per_sequence(p):  # [c] -> [g, rows, lanes]
        p = jnp.pad(jnp.tile(p.astype(jnp.float32), nb), (0, n_pad - n))
        return p.reshape(g, bs.rows, bs.lanes)

    cost = bi_wkv_cost(batch=nb, seq_len=t, channels=c, itemsize=k.dtype.itemsize)
    par = pl.BlockSpec((None, bs.rows, bs.lanes), lambda i: (i, 0, 0))
    seq = pl.BlockSpec((tp, None, bs.rows, bs.lanes), lambda i: (0, i, 0, 0))
    out = jax.ShapeDtypeStruct((tp, g, bs.rows, bs.lanes), jnp.float32)
    with _backend.quiet_triton_deprecation():
        y, _ = pl.pallas_call(
            functools.partial(bi_wkv_kernel, seq_len=t, block_t=bs.block_t),
            grid=(g,),
            in_specs=[par, par, seq, seq],
            out_specs=[seq, seq],
            out_shape=[out, out],
            compiler_params=_backend.compiler_params(
                impl, dimension_semantics=("parallel",),
                vmem_limit_bytes=max(vmem + 4 * 2**20, 32 * 2**20) if impl == "pallas_tpu" else None,
                num_warps=max(1, min(4, tile // 32))),
            interpret=interpret,
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="bi_wkv",
        )(per_sequence(w), per_sequence(u), seq_major(k), seq_major(v))
    y = y.reshape(tp, n_pad)[:t, :n].reshape(t, nb, c)
    return jnp.moveaxis(y, 0, 1).reshape(k.shape).astype(v.dtype)


def _xla_method(method: str | None) -> str:
    return method or ("scan" if jax.default_backend() == "cpu" else "associative")


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _bi_wkv_pallas(w, u, k, v, bs, impl, interpret, method):
    return _pallas_forward(w, u, k, v, bs=bs, impl=impl, interpret=interpret)


def _bi_wkv_pallas_fwd(w, u, k, v, bs, impl, interpret, method):
    return _bi_wkv_pallas(w, u, k, v, bs, impl, interpret, method), (w, u, k, v)


def _bi_wkv_pallas_bwd(bs, impl, interpret, method, residuals, d_out):
    del bs, impl, interpret
    _, vjp = jax.vjp(functools.partial(la.bi_wkv, method=_xla_method(method)), *residuals)
    return vjp(d_out)


_bi_wkv_pallas.defvjp(_bi_wkv_pallas_fwd, _bi_wkv_pallas_bwd)


@functools.partial(jax.jit, static_argnames=("block_sizes", "implementation", "interpret", "method"))
def bi_wkv(w: jax.Array, u: jax.Array, k: jax.Array, v: jax.Array, *, block_sizes: WKVBlockSizes | None = None,
           implementation: str | None = None, interpret: bool | None = None, method: str | None = None) -> jax.Array:
    """Bidirectional WKV of Vision-RWKV, linear in the number of tokens.

    ``y_t = softmax_j(logit_tj) . v`` with ``logit_tj = k_j - (|t - j| - 1) w`` for j != t and ``u + k_t``
    for j == t (see `primitives.linear_attention`), per batch row and channel.

    Args:
      w: [c] decay (already divided by t; may be negative).
      u: [c] bonus of the token itself (already divided by t).
      k: [..., t, c] keys.
      v: [..., t, c] values.
      block_sizes: kernel tiling; default `WKVBlockSizes.default(impl, sequences=batch * c)`.
      implementation: None | "auto" (best available) | "xla" | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).
      method: the XLA primitive's formulation ("scan" | "associative"; None = scan on CPU, associative
        elsewhere), used by the "xla" path and by the kernel's backward pass.

    Returns:
      [..., t, c] in the dtype of v (accumulated in float32).
    """
    la._check_wkv_args(w, u, k, v)
    if method is not None and method not in la.METHODS:
        raise ValueError(f"method must be one of {la.METHODS} or None; got {method!r}")
    impl = _backend.resolve_implementation(None if implementation == "auto" else implementation)
    if impl == "xla":
        return la.bi_wkv(w, u, k, v, method=_xla_method(method))
    c = k.shape[-1]
    nb = 1
    for d in k.shape[:-2]:
        nb *= d
    bs = block_sizes or WKVBlockSizes.default(impl, sequences=nb * c)
    bs.validate(impl)
    return _bi_wkv_pallas(w, u, k, v, bs, impl, _backend.resolve_interpret(interpret), method)
