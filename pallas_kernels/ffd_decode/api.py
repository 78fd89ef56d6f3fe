"""Public FFD decode: `ffd_decode(q, cache, delta=..., implementation=..., interpret=...)`.

Dimension legend: ``b`` batch, ``h`` query heads, ``k`` KV heads (``g = h / k``), ``p`` pages of
``bs`` tokens, ``d`` head dim.

Same contract as the reference `primitives.ffd.ffd_decode` (which ``implementation="xla"`` runs):
the threshold ``m_ref - delta`` comes from the first and the last full page (a two-page scan in
jnp), the fused kernel (`kernel.py`) scans, selects and attends the full pages split-K, and the
splits are merged with the exact attention over the current incomplete page by the shared
log-sum-exp combine (`primitives.attention.combine_partials`). Returns `primitives.ffd.FFDOutput`
with the kernel's own keep flags, so a test can check it made the reference's selection.

On TPU the kernel is `ffd_kernel_dma`: the residual and values stay in HBM and only kept pages are
copied in (double-buffered DMAs), so a dropped page costs its codes and scales alone; elsewhere
(Triton, and the interpreter for "pallas_triton") `ffd_kernel` takes every page through its BlockSpecs.
Compiles for TPU (libtpu 0.0.42.1, batch 8, 32/8 heads, d 128, bf16) up to 256k tokens on v5e and 512k
on v6e (the largest tried; pages of 128, bfloat16 residuals, `pallas_kernels.aot`'s case; 1.4 MB of
temporaries: the kernel reads the cache's arrays as they are); beyond, on v5e the cache alone (21.4 GiB
at 512k) exceeds the chip's 16 GiB of HBM (not compiled).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _backend
from pallas_kernels.ffd_decode.config import FFDBlockSizes
from pallas_kernels.ffd_decode.cost import ffd_cost
from pallas_kernels.ffd_decode.kernel import LOG2E, ffd_kernel, ffd_kernel_dma
from primitives import attention as attn_ref
from primitives import ffd as ffd_ref

__all__ = ["ffd_decode"]


def _tpu_page_bytes(cache: ffd_ref.FFDCache) -> int:
    """VMEM bytes one page takes in a program's input blocks on TPU (its codes tile and its row of the
    scales block, double-buffered by the pipeline; the residual and values stay in HBM and are copied
    per kept page)."""
    bs, dp = cache.page_size, cache.codes.shape[3]
    return 2 * (_backend.tpu_tile_bytes(dp, bs, cache.codes.dtype.itemsize)
                + cache.scales.shape[-1] * cache.scales.dtype.itemsize)


@functools.partial(jax.jit, static_argnames=("delta", "use_residual", "block_sizes", "implementation", "interpret"))
def ffd_decode(q: jax.Array, cache: ffd_ref.FFDCache, *, delta: float = 5.0, use_residual: bool = True,
               block_sizes: FFDBlockSizes | None = None, implementation: str | None = None,
               interpret: bool | None = None) -> ffd_ref.FFDOutput:
    """One FFD decode step over an `FFDCache`.

    Args:
      q: [b, h, d] queries of the newest tokens.
      cache: `primitives.ffd.FFDCache` (head-major pages, packed codes).
      delta: threshold margin in log2 units (``inf`` keeps every page).
      use_residual: refine kept pages with the residual.
      block_sizes: number of splits; default `FFDBlockSizes.default(...)`.
      implementation: None | "xla" | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).

    Returns:
      `FFDOutput(out [b, h, d], lse [b, h], keep [b, k, p], threshold [b, h])`.
    """
    b, h, d = q.shape
    kh, p, bs = cache.scales.shape[1], cache.num_pages, cache.page_size
    impl = _backend.resolve_implementation(implementation)
    if impl == "xla":
        return ffd_ref.ffd_decode(q, cache, delta=delta, use_residual=use_residual)
    th = ffd_ref.reference_threshold(q, cache, delta)  # [b, k, g]; validates delta and shapes
    g = h // kh
    cfg = block_sizes or FFDBlockSizes.default(num_pages=p, batch=b, kv_heads=kh,
                                               page_vmem_bytes=_tpu_page_bytes(cache) if impl == "pallas_tpu" else 0)
    cfg.validate(impl, page_size=bs, head_dim=d, bits=cache.bits)
    gp = _backend.padded_rows(g, impl)
    qg = jnp.pad(q.reshape(b, kh, g, d), ((0, 0), (0, 0), (0, gp - g), (0, 0)))
    thp = jnp.pad(th, ((0, 0), (0, 0), (0, gp - g)), constant_values=1e30)[..., None]
    tpu = impl == "pallas_tpu"
    splits = max(1, min(cfg.num_splits, p))
    pps = max(1, -(-p // splits))
    if tpu:  # a split's [pps, d] scales block needs pps a multiple of 8; the last split may run past p
        pps = -(-pps // 8) * 8
        splits = max(1, -(-p // pps))
    pp = pps * splits

    def pad_pages(x, to):  # page axis 2; padded pages lie past every sequence's full pages
        return jnp.pad(x, [(0, 0), (0, 0), (0, to - p)] + [(0, 0)] * (x.ndim - 3))

    def page_block(rows, last):
        return pl.BlockSpec((None, None, pps, rows, last), lambda i, hh, j: (i, hh, j, 0, 0))

    n, dp = 8 // cache.bits, cache.codes.shape[3]
    row = lambda last: pl.BlockSpec((None, None, gp, last), lambda i, hh, j: (i, hh, 0, 0))
    split_row = lambda last: pl.BlockSpec((None, None, None, gp, last), lambda i, hh, j: (i, hh, j, 0, 0))
    kernel_args = dict(bits=cache.bits, page_size=bs, pages_per_split=pps, use_residual=use_residual)
    if tpu:
        # The cache's own arrays (a padded copy would cost a pass over the cache per step; only a cache
        # shorter than one split is padded): residual and values stay in HBM, copied per kept page.
        codes, scales = pad_pages(cache.codes, max(p, pps)), pad_pages(cache.scales, max(p, pps))
        kernel = functools.partial(ffd_kernel_dma, **kernel_args)
        in_hbm = pl.BlockSpec(memory_space=pl.ANY)
        in_specs = [pl.BlockSpec(memory_space=pltpu.SMEM), row(d), row(1),
                    pl.BlockSpec((None, None, pps, d), lambda i, hh, j: (i, hh, j, 0)), page_block(dp, bs),
                    in_hbm, in_hbm]
        args = (cache.lengths, qg, thp, scales, codes, cache.residual, cache.values)
        keep_spec = pl.BlockSpec((None, None, None, 1, pps), lambda i, hh, j: (i, hh, j, 0, 0))
        keep_shape = (b, kh, splits, 1, pps)
        scratch = [pltpu.VMEM((2, bs, d), cache.residual.dtype), pltpu.VMEM((2, bs, d), cache.values.dtype),
                   pltpu.SemaphoreType.DMA((2, 2)), pltpu.SMEM((pps,), jnp.int32)]
    else:
        kernel = functools.partial(ffd_kernel, **kernel_args)
        scales = pad_pages(cache.scales, pp).reshape(b, kh, pp, n, 1, dp)  # channel c * dp + j -> plane c, lane j
        qplanes = qg.reshape(b, kh, gp, n, dp).transpose(0, 1, 3, 2, 4)  # [b, k, n, gp, dp]
        in_specs = [pl.BlockSpec((b,), lambda i, hh, j: (0,)), row(d),
                    pl.BlockSpec((None, None, n, gp, dp), lambda i, hh, j: (i, hh, 0, 0, 0)), row(1),
                    pl.BlockSpec((None, None, pps, n, 1, dp), lambda i, hh, j: (i, hh, j, 0, 0, 0)),
                    page_block(dp, bs), page_block(bs, d), page_block(bs, d)]
        args = (cache.lengths, qg, qplanes, thp, scales, pad_pages(cache.codes, pp), pad_pages(cache.residual, pp),
                pad_pages(cache.values, pp))
        keep_spec = pl.BlockSpec((None, None, None, pps, 1, 1), lambda i, hh, j: (i, hh, j, 0, 0, 0))
        keep_shape = (b, kh, splits, pps, 1, 1)
        scratch = []
    cost = ffd_cost(batch=b, tokens=p * bs, num_heads=h, num_kv_heads=kh, head_dim=d, page_size=bs,
                    bits=cache.bits, residual_itemsize=cache.residual.dtype.itemsize,
                    v_itemsize=cache.values.dtype.itemsize, q_itemsize=q.dtype.itemsize)
    stat = jax.ShapeDtypeStruct((b, kh, splits, gp, 1), jnp.float32)
    with _backend.quiet_triton_deprecation():
        o, m, l, keep = pl.pallas_call(
            kernel,
            grid=(b, kh, splits),
            in_specs=in_specs,
            out_specs=[split_row(d), split_row(1), split_row(1), keep_spec],
            out_shape=[jax.ShapeDtypeStruct((b, kh, splits, gp, d), jnp.float32), stat, stat,
                       jax.ShapeDtypeStruct(keep_shape, jnp.int32)],
            scratch_shapes=scratch,
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",) * 3),
            interpret=_backend.resolve_interpret(interpret),
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="ffd_decode",
        )(*args)

    # Splits -> normalized partials with natural-log lse: [splits, b, h(, d)].
    o = o[:, :, :, :g].transpose(2, 0, 1, 3, 4).reshape(splits, b, h, d)
    m = m[:, :, :, :g, 0].transpose(2, 0, 1, 3).reshape(splits, b, h)
    l = l[:, :, :, :g, 0].transpose(2, 0, 1, 3).reshape(splits, b, h)
    safe_l = jnp.where(l > 0, l, 1.0)
    part = o / safe_l[..., None]
    part_lse = jnp.where(l > 0, (m + jnp.log2(safe_l)) / LOG2E, -jnp.inf)
    cur = attn_ref.decode_attention(q, cache.current_keys.transpose(0, 2, 1, 3),
                                    cache.current_values.transpose(0, 2, 1, 3),
                                    cache.lengths - cache.full_pages * bs, return_lse=True)
    merged = attn_ref.combine_partials(jnp.concatenate([part, cur.out.astype(jnp.float32)[None]]),
                                       jnp.concatenate([part_lse, cur.lse[None]]))
    kept = (keep.reshape(b, kh, pp)[:, :, :p] > 0) & cache.valid_pages[:, None, :]
    return ffd_ref.FFDOutput(out=merged.out.astype(q.dtype), lse=merged.lse, keep=kept,
                             threshold=th.reshape(b, h))
