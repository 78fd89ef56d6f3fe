"""Public Bi-WKV: `bi_wkv(w, u, k, v, ...)`, the bidirectional WKV of Vision-RWKV.

Dimension legend: `b` batch (any leading dims), `t` tokens, `c` channels. Shapes as the reference
`primitives.linear_attention.bi_wkv`: w, u [c] (already divided by t, used raw), k, v [..., t, c].

Implementations: "xla" = the linear-time primitive (`method="scan"` on CPU, `"associative"` elsewhere
unless `method=` says otherwise); "pallas" / "pallas_tpu" / "pallas_triton" = the chunked two-pass scan
kernel (`kernel.py`); None or "auto" = the kernel on TPU/GPU, the XLA primitive on CPU. Gradients of the
kernel go through `jax.custom_vjp`: the forward keeps its float32 output and each token's log-normalizer
(in the kernel's layout) and the backward kernel (`kernel.bi_wkv_backward_kernel`, the same two-pass scan)
returns dk, dv and the per-channel dw, du. Sequences too long for the backward kernel's blocks on TPU
take the VJP of the XLA primitive instead (the same gradients).

TPU limit: a program keeps its [t, 8, 128] blocks of k, v, the output and the left-context normalizer in
VMEM, double-buffered: 32 KiB per token for float32 k and v, 24 KiB for bfloat16 (t = 1024 needs 32 and
24 MiB). Longer sequences raise and point to `implementation="xla"`.

The backward kernel's blocks (k, v and the cotangent; y, Z, dk, dv in float32) take 44 KiB per token of a
1024-sequence tile in bfloat16, so it runs up to 2233 tokens (88 MiB at 2048); longer sequences fall back.

`bi_wkv` forward + backward (gradient in k; c = 768, batch 8, bfloat16 k and v, `pallas_kernels.aot`'s
case): Compiles for TPU (libtpu 0.0.42.1) up to 2048 tokens on v5e and 2048 on v6e; beyond, the wrapper
refuses (t = 4096 would need 96.02 MiB of VMEM, over its 96 MiB cap). HBM temporaries with the backward
kernel: 72 MiB at 1024 tokens and 216 MiB at 2048 (the XLA primitive's VJP took 337 and 673-722 MiB); at
3072 tokens the backward falls back to that VJP (1081 MiB).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import _backend
from pallas_kernels.wkv.config import WKVBlockSizes
from pallas_kernels.wkv.cost import bi_wkv_cost
from pallas_kernels.wkv.kernel import bi_wkv_backward_kernel, bi_wkv_kernel
from primitives import linear_attention as la

__all__ = ["bi_wkv"]

_TPU_VMEM_CAP = 96 * 2**20  # stay under v5e/v6e's 128 MiB physical VMEM


def _tpu_vmem_bytes(tp: int, bs: WKVBlockSizes, itemsize: int) -> int:
    tile = bs.sequences
    return 2 * (tp * tile * (2 * itemsize + 8) + 2 * tile * 4)  # double-buffered k, v, o, lse, w, u


def _tpu_backward_vmem_bytes(tp: int, bs: WKVBlockSizes, itemsize: int, g_itemsize: int) -> int:
    tile = bs.sequences  # double-buffered k, v, g; y, z, dk, dv (float32); w, u, dw, du
    return 2 * (tp * tile * (2 * itemsize + g_itemsize + 16) + 4 * tile * 4)


class _Layout:
    """The kernels' sequence layout: every (batch row, channel) pair one sequence, sequences in tiles of
    [rows, lanes], time-major: [..., t, c] <-> [tp, tiles, rows, lanes] (tp: t, or its next power of two on
    Triton); per-channel parameters [c] <-> [tiles, rows, lanes]."""

    def __init__(self, shape, bs: WKVBlockSizes, impl: str):
        lead, (self.t, self.c) = shape[:-2], shape[-2:]
        self.nb = math.prod(lead)
        self.n = self.nb * self.c
        self.n_pad = -(-self.n // bs.sequences) * bs.sequences
        self.tiles = self.n_pad // bs.sequences
        self.tp = _backend.next_power_of_two(self.t) if impl == "pallas_triton" else self.t
        self.shape, self.bs = tuple(shape), bs

    def seq_major(self, x):
        x = jnp.moveaxis(x.reshape(self.nb, self.t, self.c), 1, 0).reshape(self.t, self.n)
        x = jnp.pad(x, ((0, self.tp - self.t), (0, self.n_pad - self.n)))
        return x.reshape(self.tp, self.tiles, self.bs.rows, self.bs.lanes)

    def from_seq_major(self, y):
        y = y.reshape(self.tp, self.n_pad)[:self.t, :self.n].reshape(self.t, self.nb, self.c)
        return jnp.moveaxis(y, 0, 1).reshape(self.shape)

    def per_sequence(self, p):
        p = jnp.pad(jnp.tile(p.astype(jnp.float32), self.nb), (0, self.n_pad - self.n))
        return p.reshape(self.tiles, self.bs.rows, self.bs.lanes)

    def channel_sums(self, p):  # [tiles, rows, lanes] per sequence -> [c], summed over the batch rows
        return p.reshape(self.n_pad)[:self.n].reshape(self.nb, self.c).sum(0)

    def specs(self):
        bs = self.bs
        par = pl.BlockSpec((None, bs.rows, bs.lanes), lambda i: (i, 0, 0))
        seq = pl.BlockSpec((self.tp, None, bs.rows, bs.lanes), lambda i: (0, i, 0, 0))
        return par, seq


def _compiler_params(impl, vmem, tile):
    return _backend.compiler_params(
        impl, dimension_semantics=("parallel",),
        vmem_limit_bytes=max(vmem + 4 * 2**20, 32 * 2**20) if impl == "pallas_tpu" else None,
        num_warps=max(1, min(4, tile // 32)))


def _pallas_forward(w, u, k, v, *, bs, impl, interpret):
    """(output [..., t, c] in v's dtype, residuals: the float32 output and log-normalizers, kernel layout)."""
    lay = _Layout(k.shape, bs, impl)
    tile = bs.sequences
    vmem = _tpu_vmem_bytes(lay.tp, bs, k.dtype.itemsize)
    if impl == "pallas_tpu" and vmem > _TPU_VMEM_CAP:
        t_max = (_TPU_VMEM_CAP // 2 - 2 * tile * 4) // (tile * (2 * k.dtype.itemsize + 8))  # inverse of the model
        raise ValueError(f"k has t={lay.t} tokens: the TPU kernel would need {vmem / 2**20:.2f} MiB of VMEM (> "
                         f"{_TPU_VMEM_CAP // 2**20} MiB); at most {t_max} tokens fit with "
                         f"sequences={tile} per program; use implementation='xla' for sequences this long")
    cost = bi_wkv_cost(batch=lay.nb, seq_len=lay.t, channels=lay.c, itemsize=k.dtype.itemsize)
    par, seq = lay.specs()
    out = jax.ShapeDtypeStruct((lay.tp, lay.tiles, bs.rows, bs.lanes), jnp.float32)
    with _backend.quiet_triton_deprecation():
        y, z = pl.pallas_call(
            functools.partial(bi_wkv_kernel, seq_len=lay.t, block_t=bs.block_t),
            grid=(lay.tiles,),
            in_specs=[par, par, seq, seq],
            out_specs=[seq, seq],
            out_shape=[out, out],
            compiler_params=_compiler_params(impl, vmem, tile),
            interpret=interpret,
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="bi_wkv",
        )(lay.per_sequence(w), lay.per_sequence(u), lay.seq_major(k), lay.seq_major(v))
    return lay.from_seq_major(y).astype(v.dtype), (y, z)


def _pallas_backward(w, u, k, v, y, z, d_out, *, bs, impl, interpret):
    """dw, du [c], dk, dv [..., t, c] from the forward's float32 output y and log-normalizers z (kernel layout)."""
    lay = _Layout(k.shape, bs, impl)
    vmem = _tpu_backward_vmem_bytes(lay.tp, bs, k.dtype.itemsize, d_out.dtype.itemsize)
    par, seq = lay.specs()
    seq_shape = jax.ShapeDtypeStruct((lay.tp, lay.tiles, bs.rows, bs.lanes), jnp.float32)
    par_shape = jax.ShapeDtypeStruct((lay.tiles, bs.rows, bs.lanes), jnp.float32)
    cost = bi_wkv_cost(batch=lay.nb, seq_len=lay.t, channels=lay.c, itemsize=k.dtype.itemsize)
    with _backend.quiet_triton_deprecation():
        dk, dv, dw, du = pl.pallas_call(
            functools.partial(bi_wkv_backward_kernel, seq_len=lay.t, block_t=bs.block_t),
            grid=(lay.tiles,),
            in_specs=[par, par, seq, seq, seq, seq, seq],
            out_specs=[seq, seq, par, par],
            out_shape=[seq_shape, seq_shape, par_shape, par_shape],
            compiler_params=_compiler_params(impl, vmem, bs.sequences),
            interpret=interpret,
            cost_estimate=pl.CostEstimate(flops=int(2 * cost.flops), bytes_accessed=int(2 * cost.bytes_accessed),
                                          transcendentals=int(2 * cost.transcendentals)),
            name="bi_wkv_backward",
        )(lay.per_sequence(w), lay.per_sequence(u), lay.seq_major(k), lay.seq_major(v), lay.seq_major(d_out), y, z)
    return (lay.channel_sums(dw).astype(w.dtype), lay.channel_sums(du).astype(u.dtype),
            lay.from_seq_major(dk).astype(k.dtype), lay.from_seq_major(dv).astype(v.dtype))


def _xla_method(method: str | None) -> str:
    return method or ("scan" if jax.default_backend() == "cpu" else "associative")


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _bi_wkv_pallas(w, u, k, v, bs, impl, interpret, method):
    return _pallas_forward(w, u, k, v, bs=bs, impl=impl, interpret=interpret)[0]


def _bi_wkv_pallas_fwd(w, u, k, v, bs, impl, interpret, method):
    out, (y, z) = _pallas_forward(w, u, k, v, bs=bs, impl=impl, interpret=interpret)
    return out, (w, u, k, v, y, z)


def _bi_wkv_pallas_bwd(bs, impl, interpret, method, residuals, d_out):
    w, u, k, v, y, z = residuals
    vmem = _tpu_backward_vmem_bytes(y.shape[0], bs, k.dtype.itemsize, d_out.dtype.itemsize)
    if impl == "pallas_tpu" and vmem > _TPU_VMEM_CAP:
        # Longer than the backward kernel's blocks fit: the VJP of the XLA primitive (same gradients).
        _, vjp = jax.vjp(functools.partial(la.bi_wkv, method=_xla_method(method)), w, u, k, v)
        return vjp(d_out)
    return _pallas_backward(w, u, k, v, y, z, d_out, bs=bs, impl=impl, interpret=interpret)


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
