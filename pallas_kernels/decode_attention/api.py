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

Compiles for TPU (libtpu 0.0.42.1, batch 8, 32/8 heads, d 128, bf16) up to 256k tokens on v5e and 512k
on v6e (the largest tried); beyond, on v5e the cache alone (K and V: 16.0 GiB at 512k) exceeds the
chip's 16 GiB of HBM (not compiled). (Token-major cache, default tiling `config.decode_default`; with
the 16 splits it had before, 64k failed on v5e and 128k on v6e: Mosaic's scoped VMEM, 32M > 16M and
64M > 32M.)
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _backend
from pallas_kernels._common import Cost
from pallas_kernels.decode_attention.config import DecodeBlockSizes, decode_default
from pallas_kernels.decode_attention.cost import decode_cost
from pallas_kernels.decode_attention.kernel import TileLoader, dense_tile_loader, split_k_decode_kernel
from primitives import attention as attn_ref
from primitives.validation import check_lengths

__all__ = ["decode_attention", "split_k_decode"]


def _check(q, k, v, lengths, kv_layout):
    if q.ndim != 3 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"decode_attention expects q [b, h, d], k and v [{', '.join(kv_layout)}]; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}")
    b, h, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree on batch or head dim")
    kh = attn_ref.kv_tokens_heads(k.shape, kv_layout)[1]
    if h % kh:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({kh})")
    if lengths.shape != (b,):
        raise ValueError(f"lengths must have shape [b]=({b},); got {lengths.shape}")


def _check_lengths_eagerly(jitted):
    """Thin unjitted front: concrete `lengths` must lie in [0, cache capacity] (traced ones pass)."""

    @functools.wraps(jitted)
    def front(q, k, v, lengths, **kwargs):
        if getattr(k, "ndim", None) == 4:
            check_lengths("lengths", lengths, attn_ref.kv_tokens_heads(k.shape, kwargs.get("kv_layout", "bskd"))[0])
        return jitted(q, k, v, lengths, **kwargs)

    return front


@_check_lengths_eagerly
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
      lengths: [b] int, valid cache entries per sequence, in [0, s]. Called eagerly, lengths
        outside [0, s] raise ValueError before the jitted body runs; inside an outer `jit` they
        are traced and not checked (a length above s then reads as the whole cache).
      scale: logit scale (default 1/sqrt(d)).
      block_sizes: tiling; default `config.decode_default(...)` (`DecodeBlockSizes.default`, with more
        splits on TPU so that each program's K and V blocks fit in scoped VMEM).
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
    s, kh = attn_ref.kv_tokens_heads(k.shape, kv_layout)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    impl = _backend.resolve_implementation(implementation)
    lengths = lengths.astype(jnp.int32)

    if impl == "xla":
        out, lse = attn_ref.decode_attention(q, k, v, lengths, scale=scale, return_lse=True, kv_layout=kv_layout)
        if normalize_output:
            return (out, lse) if return_residuals else out
        # Unnormalized form with m = lse, l = 1 satisfies out = o / l and lse = m + log l.
        return (out, (lse, jnp.ones_like(lse))) if return_residuals else out

    cost = decode_cost(batch=b, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d,
                       kv_itemsize=k.dtype.itemsize, q_itemsize=q.dtype.itemsize)
    block_sizes = block_sizes or decode_default(seq_len=s, batch=b, kv_heads=kh, head_dim=d,
                                                itemsize=k.dtype.itemsize, kv_layout=kv_layout, implementation=impl)
    return split_k_decode(q, lengths, (k, v), tile_loader=dense_tile_loader(head_dim=d, kv_layout=kv_layout),
                          kv_layout=kv_layout, block_sizes=block_sizes, implementation=impl, scale=scale,
                          interpret=interpret, cost=cost, name="decode_attention",
                          return_residuals=return_residuals, normalize_output=normalize_output)


def split_k_decode(
    q: jax.Array,
    lengths: jax.Array,
    cache: Sequence[jax.Array],
    *,
    tile_loader: TileLoader,
    kv_layout: str,
    block_sizes: DecodeBlockSizes | None,
    implementation: str,
    scale: float,
    interpret: bool | None,
    cost: Cost,
    name: str,
    return_residuals: bool,
    normalize_output: bool = True,
):
    """The split-K decode shell shared by dense and quantized decode (grid, specs, split merge).

    Args:
      q: [b, h, d] queries.
      lengths: [b] int32 valid entries per sequence.
      cache: the arrays the kernel reads the cache from, each [b, s, k, x] ([b, k, s, x] for
        kv_layout="bksd"; [b, k, x, s] for "bkxs", or [b, k, s] there when x = 1), split along s and
        read whole along k and x (dense: k and v with x = d; quantized: codes, scales (and zero
        points) of K then V). Passed to `tile_loader` in order.
      kv_layout: "bskd", "bksd" or "bkxs" (tokens last, lane-dense on TPU for narrow x; internal: needs
        a transposed `tile_loader`, and block_k a multiple of 128 on TPU, where tokens lie on lanes).
      tile_loader: how the kernel turns a tile of those refs into K and V (`kernel.TileLoader`).
      block_sizes: tiling (default `DecodeBlockSizes.default(...)`); implementation: a resolved
        Pallas implementation ("pallas_tpu" or "pallas_triton").
      cost: the op's cost model, for `pl.CostEstimate`; name: the kernel's name.
      return_residuals, normalize_output: as `decode_attention`.

    Returns:
      As `decode_attention` for the Pallas implementations.
    """
    b, h, d = q.shape
    if kv_layout == "bkxs":
        token_axis, s, kh = -1, cache[0].shape[-1], cache[0].shape[1]
    else:
        token_axis = attn_ref.kv_token_axis(kv_layout)
        s, kh = attn_ref.kv_tokens_heads(cache[0].shape, kv_layout)
    if tile_loader.transposed != (kv_layout == "bkxs"):
        raise ValueError(f"kv_layout='bkxs' goes with a transposed tile loader and only it; got "
                         f"kv_layout={kv_layout!r}, transposed={tile_loader.transposed}")
    impl = implementation
    bs = block_sizes or DecodeBlockSizes.default(seq_len=s, batch=b, implementation=impl)
    bs.validate(impl)
    if kv_layout == "bkxs" and impl == "pallas_tpu" and bs.block_k % 128:
        raise ValueError(f"TPU needs block_k a multiple of 128 when the cache's tokens lie on lanes "
                         f"(kv_layout='bkxs'); got block_k={bs.block_k}")
    g = h // kh
    gp = _backend.padded_rows(g, impl)  # Triton's dot needs >= 16 rows; TPU prefers sublane multiples of 8
    qg = _backend.pad_axis(q.reshape(b, kh, g, d), 2, gp)
    chunk = bs.block_k * bs.num_splits
    sp = max(1, -(-s // chunk)) * chunk  # whole splits; an empty cache (s = 0) still gets one, fully masked
    # Padded keys lie past every length.
    cache = [_backend.pad_axis(a, token_axis % a.ndim, sp) for a in cache]
    split_len = sp // bs.num_splits

    if impl == "pallas_tpu":
        len_spec = pl.BlockSpec(memory_space=pltpu.SMEM)
    else:
        len_spec = pl.BlockSpec((b,), lambda i, j: (0,))
    if kv_layout == "bskd":
        cache_specs = [pl.BlockSpec((None, split_len, kh, a.shape[-1]), lambda i, j: (i, j, 0, 0)) for a in cache]
    elif kv_layout == "bkxs":  # a [b, k, s] array stands for [b, k, 1, s]
        cache_specs = [pl.BlockSpec((None, kh, a.shape[2], split_len), lambda i, j: (i, 0, 0, j)) if a.ndim == 4
                       else pl.BlockSpec((None, kh, split_len), lambda i, j: (i, 0, j)) for a in cache]
    else:
        cache_specs = [pl.BlockSpec((None, kh, split_len, a.shape[-1]), lambda i, j: (i, 0, j, 0)) for a in cache]
    kernel = functools.partial(split_k_decode_kernel, tile_loader=tile_loader, block_k=bs.block_k,
                               split_len=split_len, scale=scale)
    stat_shape = jax.ShapeDtypeStruct((b, bs.num_splits, kh, gp, 1), jnp.float32)
    with _backend.quiet_triton_deprecation():
        o, m, l = pl.pallas_call(
            kernel,
            grid=(b, bs.num_splits),
            in_specs=[len_spec, pl.BlockSpec((None, kh, gp, d), lambda i, j: (i, 0, 0, 0))] + cache_specs,
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
            name=name,
        )(lengths, qg, *cache)

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
