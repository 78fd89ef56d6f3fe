"""Public flash-attention prefill: `flash_attention(q, k, v, ...)`.

Dimension legend: `b` batch, `t` query tokens, `s` key tokens, `h` query heads,
`k` key/value heads (h % k == 0), `d` head dim. Layout [b, t, h, d] like the
reference `primitives.attention.attention` and the model.

Causal attention aligns the queries with the end of the key sequence (query r
sits at position r + s - t), which is ordinary causal self-attention when
t == s and chunked prefill when t < s. Gradients go through `jax.custom_vjp`:
the forward saves (q, k, v, out, lse) and the backward runs two Pallas kernels
(dq; dk and dv summed over each KV group inside the kernel), recomputing the
attention weights tile by tile from lse, so no [h, t, s] tensor is ever stored
(see `kernel.py` for the grids and what each program holds).

Compiled ahead of time by the real TPU compiler on a CPU machine (jax 0.10.2,
libtpu 0.0.42.1, `python -m pallas_kernels.aot --only flash_attention` plus
one-off runs of the same cases at longer lengths): bf16, batch 1, 32 query
heads over 8 KV heads, head_dim 128, causal, default block sizes (512 x 512 on
TPU), on one chip of v5e:2x2 and of v6e:2x2 alike. Largest compiled: the forward
at 131072 tokens (temporaries 1552 MiB) and forward plus backward at 65536
tokens (1280 MiB); the temporaries (head-major copies of q, k, v, out, dO and the
gradients; lse and delta are lane-dense [b, h, 1, t] float32) grow linearly with
the length: forward plus backward 256 / 576 / 1280 MiB at 16k / 32k / 64k.
Larger lengths were not tried.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _backend
from pallas_kernels.flash_attention import kernel as fk
from pallas_kernels.flash_attention.config import FlashBlockSizes
from pallas_kernels.flash_attention.cost import flash_cost
from primitives import attention as attn_ref

__all__ = ["flash_attention"]


def _reference(q, k, v, *, causal, scale):
    t, s = q.shape[1], k.shape[1]
    res = attn_ref.attention(q, k, v, causal=causal, q_positions=jnp.arange(t) + (s - t), scale=scale,
                             return_lse=True)
    return res.out, res.lse


def _head_major(x, length):
    """[b, n, heads, d] -> [b, heads, length, d], zero-padded along n."""
    return _backend.pad_axis(jnp.swapaxes(x, 1, 2), 2, length)


def _rows(x, length):
    """[b, heads, n] float32 -> [b, heads, 1, length], zero-padded (per-row statistics, lane-dense)."""
    return _backend.pad_axis(x.astype(jnp.float32), 2, length)[:, :, None, :]


def _estimate(part, q, k, causal):
    b, t, h, d = q.shape
    c = flash_cost(batch=b, q_len=t, kv_len=k.shape[1], num_heads=h, num_kv_heads=k.shape[2], head_dim=d,
                   itemsize=q.dtype.itemsize, causal=causal, part=part)
    return pl.CostEstimate(flops=int(c.flops), bytes_accessed=int(c.bytes_accessed),
                           transcendentals=int(c.transcendentals))


def _pallas_forward(q, k, v, *, causal, scale, bs, impl, interpret):
    b, t, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = h // kh  # index maps use lax.div: floor division lowers through sign(), which Mosaic rejects
    bq, bk = bs.block_q, bs.block_k
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    nq, nk = tp // bq, sp // bk
    qt, kt, vt = _head_major(q, tp), _head_major(k, sp), _head_major(v, sp)
    static = dict(block_q=bq, block_k=bk, scale=scale, causal=causal, q_len=t, kv_len=s)
    out_shape = [jax.ShapeDtypeStruct((b, h, tp, d), q.dtype), jax.ShapeDtypeStruct((b, h, 1, tp), jnp.float32)]
    if impl == "pallas_tpu":
        def kv_block(bi, hi, i, j):
            if causal:  # blocks above the diagonal repeat the last needed one: nothing new is fetched
                j = jnp.minimum(j, fk.last_key_block(i, block_q=bq, block_k=bk, offset=s - t, num_k_blocks=nk))
            return bi, jax.lax.div(hi, g), j, 0

        q_block = pl.BlockSpec((None, None, bq, d), lambda bi, hi, i, j: (bi, hi, i, 0))
        call = dict(
            grid=(b, h, nq, nk),
            in_specs=[q_block, pl.BlockSpec((None, None, bk, d), kv_block),
                      pl.BlockSpec((None, None, bk, d), kv_block)],
            out_specs=[q_block, pl.BlockSpec((None, None, 1, bq), lambda bi, hi, i, j: (bi, hi, 0, i))],
            scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                            pltpu.VMEM((bq, d), jnp.float32)],
            compiler_params=_backend.compiler_params(
                impl, dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        )
        body = fk.flash_forward_grid_kernel
    else:
        q_block = pl.BlockSpec((None, None, bq, d), lambda bi, hi, i: (bi, hi, i, 0))
        kv_whole = pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, jax.lax.div(hi, g), 0, 0))
        call = dict(
            grid=(b, h, nq),
            in_specs=[q_block, kv_whole, kv_whole],
            out_specs=[q_block, pl.BlockSpec((None, None, 1, bq), lambda bi, hi, i: (bi, hi, 0, i))],
            compiler_params=_backend.compiler_params(impl),
        )
        body = fk.flash_forward_loop_kernel
    with _backend.quiet_triton_deprecation():
        o, lse = pl.pallas_call(functools.partial(body, **static), out_shape=out_shape, interpret=interpret,
                                cost_estimate=_estimate("forward", q, k, causal), name="flash_attention",
                                **call)(qt, kt, vt)
    return jnp.swapaxes(o[:, :, :t], 1, 2), lse[:, :, 0, :t]


def _pallas_backward(q, k, v, do, lse, delta, *, causal, scale, bs, impl, interpret):
    """dq [b, t, h, d], dk, dv [b, s, k, d] in the input dtype. lse, delta: [b, h, t] float32, with delta =
    rowsum(dO * O) minus the lse cotangent."""
    b, t, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = h // kh
    bq, bk = bs.bwd_q, bs.bwd_k
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    nq, nk = tp // bq, sp // bk
    qt, dot_ = _head_major(q, tp), _head_major(do, tp)
    kt, vt = _head_major(k, sp), _head_major(v, sp)
    lse_r, delta_r = _rows(lse, tp), _rows(delta, tp)
    args = (qt, kt, vt, dot_, lse_r, delta_r)
    static = dict(block_q=bq, block_k=bk, scale=scale, causal=causal, q_len=t, kv_len=s)
    dq_shape = jax.ShapeDtypeStruct((b, h, tp, d), q.dtype)
    dkv_shape = [jax.ShapeDtypeStruct((b, kh, sp, d), k.dtype), jax.ShapeDtypeStruct((b, kh, sp, d), v.dtype)]
    if impl == "pallas_tpu":
        def kv_block(bi, hi, i, j):
            if causal:
                j = jnp.minimum(j, fk.last_key_block(i, block_q=bq, block_k=bk, offset=s - t, num_k_blocks=nk))
            return bi, jax.lax.div(hi, g), j, 0

        q_block = pl.BlockSpec((None, None, bq, d), lambda bi, hi, i, j: (bi, hi, i, 0))
        row_block = pl.BlockSpec((None, None, 1, bq), lambda bi, hi, i, j: (bi, hi, 0, i))
        kv_spec = pl.BlockSpec((None, None, bk, d), kv_block)
        dq_call = dict(
            grid=(b, h, nq, nk),
            in_specs=[q_block, kv_spec, kv_spec, q_block, row_block, row_block],
            out_specs=q_block,
            scratch_shapes=[pltpu.VMEM((bq, d), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                            pltpu.VMEM((bq, 1), jnp.float32)],
            compiler_params=_backend.compiler_params(
                impl, dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        )

        def q_index(bi, ci, j, r, i):  # query head ci * g + r of KV head ci, q block i
            if causal:  # q blocks below the first needed one repeat it: nothing new is fetched
                i = jnp.maximum(i, fk.first_query_block(j, block_q=bq, block_k=bk, offset=s - t, num_q_blocks=nq))
            return bi, ci * g + r, i

        def q_block5(*idx):
            bi, hi, i = q_index(*idx)
            return bi, hi, i, 0

        def row_block5(*idx):
            bi, hi, i = q_index(*idx)
            return bi, hi, 0, i

        k_block = pl.BlockSpec((None, None, bk, d), lambda bi, ci, j, r, i: (bi, ci, j, 0))
        q_spec = pl.BlockSpec((None, None, bq, d), q_block5)
        row_spec = pl.BlockSpec((None, None, 1, bq), row_block5)
        dkv_call = dict(
            grid=(b, kh, nk, g, nq),
            in_specs=[q_spec, k_block, k_block, q_spec, row_spec, row_spec],
            out_specs=[k_block, k_block],
            scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32), pltpu.VMEM((bk, d), jnp.float32)],
            compiler_params=_backend.compiler_params(
                impl, dimension_semantics=("parallel", "parallel", "parallel", "arbitrary", "arbitrary")),
        )
        dq_body, dkv_body = fk.flash_dq_grid_kernel, fk.flash_dkv_grid_kernel
    else:
        q_block = pl.BlockSpec((None, None, bq, d), lambda bi, hi, i: (bi, hi, i, 0))
        row_block = pl.BlockSpec((None, None, 1, bq), lambda bi, hi, i: (bi, hi, 0, i))
        kv_whole = pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, jax.lax.div(hi, g), 0, 0))
        dq_call = dict(grid=(b, h, nq), in_specs=[q_block, kv_whole, kv_whole, q_block, row_block, row_block],
                       out_specs=q_block, compiler_params=_backend.compiler_params(impl))
        group = pl.BlockSpec((None, g, tp, d), lambda bi, ci, j: (bi, ci, 0, 0))  # query heads ci*g ... ci*g+g-1
        group_rows = pl.BlockSpec((None, g, 1, tp), lambda bi, ci, j: (bi, ci, 0, 0))
        k_block = pl.BlockSpec((None, None, bk, d), lambda bi, ci, j: (bi, ci, j, 0))
        dkv_call = dict(grid=(b, kh, nk), in_specs=[group, k_block, k_block, group, group_rows, group_rows],
                        out_specs=[k_block, k_block], compiler_params=_backend.compiler_params(impl))
        dq_body, dkv_body = fk.flash_dq_loop_kernel, fk.flash_dkv_loop_kernel
    with _backend.quiet_triton_deprecation():
        dq = pl.pallas_call(functools.partial(dq_body, **static), out_shape=dq_shape, interpret=interpret,
                            cost_estimate=_estimate("dq", q, k, causal), name="flash_attention_dq", **dq_call)(*args)
        dk, dv = pl.pallas_call(functools.partial(dkv_body, **static), out_shape=dkv_shape, interpret=interpret,
                                cost_estimate=_estimate("dkv", q, k, causal), name="flash_attention_dkv",
                                **dkv_call)(*args)
    return (jnp.swapaxes(dq[:, :, :t], 1, 2), jnp.swapaxes(dk[:, :, :s], 1, 2),
            jnp.swapaxes(dv[:, :, :s], 1, 2))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _flash(q, k, v, causal, scale, bs, impl, interpret):
    return _pallas_forward(q, k, v, causal=causal, scale=scale, bs=bs, impl=impl, interpret=interpret)


def _flash_fwd(q, k, v, causal, scale, bs, impl, interpret):
    out, lse = _flash(q, k, v, causal, scale, bs, impl, interpret)
    return (out, lse), (q, k, v, out, lse)


def _flash_bwd(causal, scale, bs, impl, interpret, residuals, cotangents):
    q, k, v, out, lse = residuals
    d_out, d_lse = cotangents
    # d lse_i / d s_ij = p_ij: the lse cotangent enters dS = P * (dP - delta) through delta.
    delta = jnp.einsum("bthd,bthd->bht", d_out.astype(jnp.float32), out.astype(jnp.float32))
    delta = delta - jnp.where(jnp.isfinite(d_lse), d_lse, 0.0)
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)  # rows that saw no key: every weight is masked to 0 anyway
    return _pallas_backward(q, k, v, d_out, lse, delta, causal=causal, scale=scale, bs=bs, impl=impl,
                            interpret=interpret)


_flash.defvjp(_flash_fwd, _flash_bwd)


@functools.partial(jax.jit, static_argnames=("causal", "scale", "block_sizes", "return_residuals",
                                             "implementation", "interpret"))
def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_sizes: FlashBlockSizes | None = None,
    return_residuals: bool = False,
    implementation: str | None = None,
    interpret: bool | None = None,
):
    """Multi-head attention over full sequences (prefill), GQA, optional causal mask, Pallas backward.

    Args:
      q: [b, t, h, d]; k, v: [b, s, k, d].
      causal: mask keys after each query's position (queries aligned to the end).
      scale: logit scale (default 1/sqrt(d)).
      block_sizes: tiling of the forward and backward kernels; default `FlashBlockSizes.default(...)`.
      return_residuals: also return the float32 logsumexp [b, h, t] (differentiable).
      implementation: None | "xla" | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the kernel in the interpreter (None = iff on CPU).

    Returns:
      out [b, t, h, d] (and lse [b, h, t]).
    """
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"flash_attention expects q [b, t, h, d] and k, v [b, s, k, d]; got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})")
    if causal and q.shape[1] > k.shape[1]:
        raise ValueError(f"causal attention needs q_len <= kv_len; got {q.shape[1]} > {k.shape[1]}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    impl = _backend.resolve_implementation(implementation)
    if impl == "xla":
        out, lse = _reference(q, k, v, causal=causal, scale=scale)
    else:
        bs = block_sizes or FlashBlockSizes.default(q_len=q.shape[1], kv_len=k.shape[1], head_dim=q.shape[3],
                                                    itemsize=q.dtype.itemsize, implementation=impl)
        interpret = _backend.resolve_interpret(interpret)
        bs.validate(impl, q_len=q.shape[1], interpret=interpret)
        out, lse = _flash(q, k, v, causal, scale, bs, impl, interpret)
    return (out, lse) if return_residuals else out
