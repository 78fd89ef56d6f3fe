"""Public split-K decode attention: `decode_attention(q, k, v, lengths, ...)`.

Dimension legend: `b` batch, `h` query heads, `k` key/value heads (h % k == 0),
`s` cache capacity, `d` head dim.

Same contract as the reference `primitives.attention.decode_attention`: one
query token per sequence over a KV cache in either of the model's axis orders,
token-major [b, s, k, d] (`kv_layout="bskd"`) or head-major [b, k, s, d]
("bksd"), read as stored (each kernel tile is a [block_k, d] slab of one head
in both), with per-sequence valid lengths; a sequence of length 0 gives zeros (and lse
-inf). The kernel reads each KV head once for its whole group of query heads
(GQA), splits the cache into `num_splits` parts processed in parallel, and
merges the parts with the shared log-sum-exp combine
(`primitives.attention.combine_partials`).

Residuals: with `return_residuals=True` the call also returns the float32
logsumexp [b, h]. With `normalize_output=False` it returns the unnormalized
output and `(m, l)` instead (out_normalized = out / l, lse = m + log l), for
callers that merge further partials themselves.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _backend
from pallas_kernels.decode_attention.config import DecodeBlockSizes
from pallas_kernels.decode_attention.cost import decode_cost
from pallas_kernels.decode_attention.kernel import decode_kernel
from primitives import attention as attn_ref

__all__ = ["decode_attention"]


def _check(q, k, v, lengths, kv_layout):
    token_axis = attn_ref.kv_token_axis(kv_layout)
    if q.ndim != 3 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"decode_attention expects q [b, h, d], k and v [{', '.join(kv_layout)}]; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}")
    b, h, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree on batch or head dim")
    kh = k.shape[3 - token_axis]
    if h % kh:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({kh})")
    if lengths.shape != (b,):
        raise ValueError(f"lengths must have shape [b]=({b},); got {lengths.shape}")


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "return_residuals", "normalize_output",
                                             "implementation", "interpret", "kv_layout"))
def decode_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    lengths: jax.Array,
    *,
    scale: float | None = None,
    block_sizes: DecodeBlockSizes | None = None,
    return_residuals: bool = False,
    normalize_output: bool = True,
    implementation: str | None = None,
    interpret: bool | None = None,
    kv_layout: str = "bskd",
):
    """Attention of one query per sequence over its KV cache.

    Args:
      q: [b, h, d] queries.
      k, v: [b, s, k, d] cached keys and values ([b, k, s, d] when kv_layout="bksd").
      lengths: [b] int, valid cache entries per sequence.
      scale: logit scale (default 1/sqrt(d)).
      block_sizes: tiling; default `DecodeBlockSizes.default(...)`.
      return_residuals: also return lse [b, h] (or (m, l) when not normalized).
      normalize_output: divide by the softmax normalizer (see module docstring).
      implementation: None | "xla" | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).
      kv_layout: "bskd" or "bksd", the axis order of k and v.

    Returns:
      out [b, h, d] in q's dtype; plus lse [b, h] or (m, l) each [b, h] float32.
    """
    _check(q, k, v, lengths, kv_layout)
    b, h, d = q.shape
    token_axis = attn_ref.kv_token_axis(kv_layout)
    s, kh = k.shape[token_axis], k.shape[3 - token_axis]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    impl = _backend.resolve_implementation(implementation)
    lengths = lengths.astype(jnp.int32)

    if impl == "xla":
        out, lse = attn_ref.decode_attention(q, k, v, lengths, scale=scale, return_lse=True, kv_layout=kv_layout)
        if normalize_output:
            return (out, lse) if return_residuals else out
        # Unnormalized form with m = lse, l = 1 satisfies out = o / l and lse = m + log l.
        return (out, (lse, jnp.ones_like(lse))) if return_residuals else out

    bs = block_sizes or DecodeBlockSizes.default(seq_len=s, batch=b, implementation=impl)
    bs.validate(impl)
    g = h // kh
    # Triton's dot needs >= 16 rows; TPU prefers sublane multiples of 8.
    gp = max(16, _backend.next_power_of_two(g)) if impl == "pallas_triton" else -(-g // 8) * 8
    qg = q.reshape(b, kh, g, d)
    if gp != g:
        qg = jnp.pad(qg, ((0, 0), (0, 0), (0, gp - g), (0, 0)))
    chunk = bs.block_k * bs.num_splits
    sp = -(-s // chunk) * chunk
    if sp != s:  # pad the cache to whole splits; padded keys lie past every length
        k, v = (_backend.pad_axis(x, token_axis, sp) for x in (k, v))
    split_len = sp // bs.num_splits

    if impl == "pallas_tpu":
        len_spec = pl.BlockSpec(memory_space=pltpu.SMEM)
    else:
        len_spec = pl.BlockSpec((b,), lambda i, j: (0,))
    cost = decode_cost(batch=b, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d,
                       kv_itemsize=k.dtype.itemsize, q_itemsize=q.dtype.itemsize)
    kernel = functools.partial(decode_kernel, block_k=bs.block_k, split_len=split_len, scale=scale,
                               kv_layout=kv_layout)
    if kv_layout == "bskd":
        kv_spec = pl.BlockSpec((None, split_len, kh, d), lambda i, j: (i, j, 0, 0))
    else:
        kv_spec = pl.BlockSpec((None, kh, split_len, d), lambda i, j: (i, 0, j, 0))
    stat_shape = jax.ShapeDtypeStruct((b, bs.num_splits, kh, gp, 1), jnp.float32)
    with _backend.quiet_triton_deprecation():
        o, m, l = pl.pallas_call(
            kernel,
            grid=(b, bs.num_splits),
            in_specs=[
                len_spec,
                pl.BlockSpec((None, kh, gp, d), lambda i, j: (i, 0, 0, 0)),
                kv_spec,
                kv_spec,
            ],
            out_specs=[
                pl.BlockSpec((None, None, kh, gp, d), lambda i, j: (i, j, 0, 0, 0)),
                pl.BlockSpec((None, None, kh, gp, 1), lambda i, j: (i, j, 0, 0, 0)),
                pl.BlockSpec((None, None, kh, gp, 1), lambda i, j: (i, j, 0, 0, 0)),
            ],
            out_shape=[jax.ShapeDtypeStruct((b, bs.num_splits, kh, gp, d), jnp.float32), stat_shape, stat_shape],
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel", "parallel")),
            interpret=_backend.resolve_interpret(interpret),
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="decode_attention",
        )(lengths, qg, k, v)

    # Drop the padded query rows, then merge the splits: [splits, b, h(, d)].
    o = o[:, :, :, :g].reshape(b, bs.num_splits, h, d)
    m = m[:, :, :, :g, 0].reshape(b, bs.num_splits, h)
    l = l[:, :, :, :g, 0].reshape(b, bs.num_splits, h)
    if not normalize_output:
        m_all = jnp.max(m, axis=1)
        w = jnp.where(l > 0, jnp.exp(m - m_all[:, None]), 0.0)
        o_un = jnp.sum(w[..., None] * o, axis=1).astype(q.dtype)
        l_all = jnp.sum(w * l, axis=1)
        return (o_un, (m_all, l_all)) if return_residuals else o_un
    safe_l = jnp.where(l > 0, l, 1.0)
    part = o / safe_l[..., None]
    part_lse = jnp.where(l > 0, m + jnp.log(safe_l), -jnp.inf)
    merged = attn_ref.combine_partials(jnp.moveaxis(part, 1, 0), jnp.moveaxis(part_lse, 1, 0))
    out = merged.out.astype(q.dtype)
    return (out, merged.lse) if return_residuals else out
