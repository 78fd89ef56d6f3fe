"""Public flash-attention prefill: `flash_attention(q, k, v, ...)`.

Dimension legend: `b` batch, `t` query tokens, `s` key tokens, `h` query heads,
`k` key/value heads (h % k == 0), `d` head dim. Layout [b, t, h, d] like the
reference `primitives.attention.attention` and the model.

Causal attention aligns the queries with the end of the key sequence (query r
sits at position r + s - t), which is ordinary causal self-attention when
t == s and chunked prefill when t < s. Gradients go through `jax.custom_vjp`
whose backward is the VJP of the reference, until a backward kernel exists.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import _backend
from pallas_kernels.flash_attention.config import FlashBlockSizes
from pallas_kernels.flash_attention.cost import flash_cost
from pallas_kernels.flash_attention.kernel import flash_kernel
from primitives import attention as attn_ref

__all__ = ["flash_attention"]


def _reference(q, k, v, *, causal, scale):
    t, s = q.shape[1], k.shape[1]
    res = attn_ref.attention(q, k, v, causal=causal, q_positions=jnp.arange(t) + (s - t), scale=scale,
                             return_lse=True)
    return res.out, res.lse


def _pallas_forward(q, k, v, *, causal, scale, bs, impl, interpret):
    b, t, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = h // kh  # index maps use lax.div: floor division lowers through sign(), which Mosaic rejects
    tp = -(-t // bs.block_q) * bs.block_q
    sp = -(-s // bs.block_k) * bs.block_k
    qt = jnp.pad(jnp.swapaxes(q, 1, 2), ((0, 0), (0, 0), (0, tp - t), (0, 0)))  # [b, h, tp, d]
    kt = jnp.pad(jnp.swapaxes(k, 1, 2), ((0, 0), (0, 0), (0, sp - s), (0, 0)))  # [b, k, sp, d]
    vt = jnp.pad(jnp.swapaxes(v, 1, 2), ((0, 0), (0, 0), (0, sp - s), (0, 0)))
    cost = flash_cost(batch=b, q_len=t, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d,
                      itemsize=q.dtype.itemsize, causal=causal)
    kernel = functools.partial(flash_kernel, block_q=bs.block_q, block_k=bs.block_k, scale=scale, causal=causal,
                               q_len=t, kv_len=s)
    with _backend.quiet_triton_deprecation():
        o, lse = pl.pallas_call(
            kernel,
            grid=(b, h, tp // bs.block_q),
            in_specs=[
                pl.BlockSpec((None, None, bs.block_q, d), lambda bi, hi, i: (bi, hi, i, 0)),
                pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, jax.lax.div(hi, g), 0, 0)),
                pl.BlockSpec((None, None, sp, d), lambda bi, hi, i: (bi, jax.lax.div(hi, g), 0, 0)),
            ],
            out_specs=[
                pl.BlockSpec((None, None, bs.block_q, d), lambda bi, hi, i: (bi, hi, i, 0)),
                pl.BlockSpec((None, None, bs.block_q, 1), lambda bi, hi, i: (bi, hi, i, 0)),
            ],
            out_shape=[jax.ShapeDtypeStruct((b, h, tp, d), q.dtype),
                       jax.ShapeDtypeStruct((b, h, tp, 1), jnp.float32)],
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",) * 3),
            interpret=interpret,
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="flash_attention",
        )(qt, kt, vt)
    return jnp.swapaxes(o[:, :, :t], 1, 2), lse[:, :, :t, 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _flash(q, k, v, causal, scale, bs, impl, interpret):
    return _pallas_forward(q, k, v, causal=causal, scale=scale, bs=bs, impl=impl, interpret=interpret)


def _flash_fwd(q, k, v, causal, scale, bs, impl, interpret):
    return _flash(q, k, v, causal, scale, bs, impl, interpret), (q, k, v)


def _flash_bwd(causal, scale, bs, impl, interpret, residuals, cotangents):
    del bs, impl, interpret
    q, k, v = residuals
    _, vjp = jax.vjp(functools.partial(_reference, causal=causal, scale=scale), q, k, v)
    d_out, d_lse = cotangents
    return vjp((d_out, jnp.where(jnp.isfinite(d_lse), d_lse, 0.0)))


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
    """Multi-head attention over full sequences (prefill), GQA, optional causal mask.

    Args:
      q: [b, t, h, d]; k, v: [b, s, k, d].
      causal: mask keys after each query's position (queries aligned to the end).
      scale: logit scale (default 1/sqrt(d)).
      block_sizes: tiling; default `FlashBlockSizes.default(...)`.
      return_residuals: also return the float32 logsumexp [b, h, t].
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
        bs = block_sizes or FlashBlockSizes.default(q_len=q.shape[1], kv_len=k.shape[1])
        bs.validate(impl)
        out, lse = _flash(q, k, v, causal, scale, bs, impl, _backend.resolve_interpret(interpret))
    return (out, lse) if return_residuals else out
