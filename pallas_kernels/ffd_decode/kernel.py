"""FFD's fused scan-select-attend kernel: one per-page computation, two data-movement shells.

Grid: (batch, kv_head, num_splits). Program (i, h, j) takes the query heads of KV head h of
sequence i and the j-th contiguous range of ``pages_per_split`` pages, and for each full page:

1. unpacks the page's 2/4-bit key codes (channel-major ``[d/n, bs]`` bytes, planar packing: plane
   ``c`` holds a contiguous block of channels) and scores every token in base 2 with
   ``shat = tau log2(e) ((q * S) . C - o sum(q * S))``;
2. keeps the page for the whole group when any head's page maximum reaches its threshold
   (``m_ref - delta``, computed outside from the first and last full pages);
3. only for a kept page, refines the scores with the residual and updates the base-2 online
   softmax (m, l, acc).

It writes the unnormalized partial output, m (log2 units) and l per query row, and one keep flag
per page. The shells:

* `ffd_kernel` (Triton, and the interpreter for "pallas_triton"): every block comes in through its
  BlockSpec, and the residual and value loads sit inside the kept-page branch (``lax.cond``), so on
  GPU dropped pages are never read. Each plane is one ``[gp, d/n] @ [d/n, bs]`` product, the query
  and the scales split into planes outside (Triton lowers no value slices). Blocks:
    q_ref [gp, d], qp_ref [n, gp, d/n], th_ref [gp, 1] (padded rows hold +1e30 and never pass),
    scales_ref [pps, n, 1, d/n], codes_ref [pps, d/n, bs], res_ref / v_ref [pps, bs, d],
    o_ref [gp, d] f32, m_ref / l_ref [gp, 1], keep_ref [pps, 1, 1] int32.
* `ffd_kernel_dma` (TPU): a BlockSpec pipeline would prefetch every page's residual and value tiles
  whether kept or not, so those two stay in HBM (``memory_space=ANY``). The program first scans all
  of its pages from the codes (in VMEM) and lists the kept ones in SMEM, then walks that list with
  double-buffered DMAs (``make_async_copy``): the first kept page's residual and values are in flight
  during the rest of the scan, page ``n + 1``'s while page ``n`` is attended. A dropped page costs its codes and scales only. The planes are stacked
  along sublanes into one ``[gp, d] @ [d, bs]`` product, so the scales are read as the cache stores
  them (see `ffd_kernel_dma` for its blocks).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels._common import MASK_VALUE  # finite running-max start: exp2(m_old - m_new) stays finite

LOG2E = math.log2(math.e)


def _page_scores(codes_ref, qp_ref, scales_ref, t, *, bits: int, tau: float) -> jax.Array:
    """Base-2 scan scores [gp, bs] of page ``t``: ``tau log2(e) ((q * S) . C - o sum(q * S))`` plane by plane."""
    codes = codes_ref[t].astype(jnp.int32)  # [dp, bs]
    gp, bs = qp_ref.shape[1], codes.shape[-1]
    dot = jnp.zeros((gp, bs), jnp.float32)
    qs_sum = jnp.zeros((gp, 1), jnp.float32)
    for c in range(8 // bits):  # static: the plane of channels c*dp .. (c+1)*dp - 1
        qs = qp_ref[c].astype(jnp.float32) * scales_ref[t, c].astype(jnp.float32)  # [gp, dp]
        plane = jnp.bitwise_and(jnp.right_shift(codes, c * bits), 2**bits - 1).astype(jnp.float32)
        dot = dot + jnp.dot(qs, plane, preferred_element_type=jnp.float32)  # [gp, dp] @ [dp, bs]
        qs_sum = qs_sum + jnp.sum(qs, axis=-1, keepdims=True)
    return tau * (dot - (2**bits - 1) / 2 * qs_sum)


def _page_scores_tpu(codes_ref, q: jax.Array, scales_ref, t, *, bits: int, tau: float) -> jax.Array:
    """`_page_scores` with the planes stacked along sublanes: one ``[gp, d] @ [d, bs]`` product, and the
    scales read as page ``t``'s row of a ``[pps, d]`` block (no lane slices, no per-plane scale rows)."""
    codes = codes_ref[t].astype(jnp.int32)  # [dp, bs]
    planes = [jnp.bitwise_and(jnp.right_shift(codes, c * bits), 2**bits - 1) for c in range(8 // bits)]
    unpacked = jnp.concatenate(planes, axis=0).astype(jnp.float32)  # [d, bs]: channel c * dp + j is row c * dp + j
    qs = q * scales_ref[pl.ds(t, 1), :].astype(jnp.float32)  # [gp, d]
    dot = jnp.dot(qs, unpacked, preferred_element_type=jnp.float32)
    return tau * (dot - (2**bits - 1) / 2 * jnp.sum(qs, axis=-1, keepdims=True))


def _keeps(shat: jax.Array, th: jax.Array) -> jax.Array:
    """Scalar bool: some head's page maximum reaches its threshold."""
    return jnp.max((jnp.max(shat, axis=-1, keepdims=True) >= th).astype(jnp.float32)) > 0.0


def _online_update(carry, s: jax.Array, v: jax.Array):
    """Base-2 online-softmax step over one page: scores s [gp, bs], values v [bs, d] float32."""
    m, l, acc = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp2(s - m_new)
    alpha = jnp.exp2(m - m_new)
    return (m_new, alpha * l + jnp.sum(p, axis=-1, keepdims=True),
            alpha * acc + jnp.dot(p, v, preferred_element_type=jnp.float32))


def _refine(s: jax.Array, q: jax.Array, r: jax.Array, tau: float) -> jax.Array:
    """Refined scores ``s + tau log2(e) q . r`` of a page with residual r [bs, d]."""
    return s + tau * jax.lax.dot_general(q, r.astype(jnp.float32), (((1,), (1,)), ((), ())),
                                         preferred_element_type=jnp.float32)


def _init(gp: int, d: int):
    return (jnp.full((gp, 1), MASK_VALUE, jnp.float32), jnp.zeros((gp, 1), jnp.float32),
            jnp.zeros((gp, d), jnp.float32))


def _live_pages(len_ref, page_size: int, pages_per_split: int):
    """(first page of this program's split, its number of full pages)."""
    full = jax.lax.div(len_ref[pl.program_id(0)], page_size)
    first = pl.program_id(2) * pages_per_split
    return first, jnp.clip(full - first, 0, pages_per_split)


def _write(o_ref, m_ref, l_ref, carry):
    m, l, acc = carry
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def ffd_kernel(len_ref, q_ref, qp_ref, th_ref, scales_ref, codes_ref, res_ref, v_ref, o_ref, m_ref, l_ref, keep_ref, *,
               bits: int, page_size: int, pages_per_split: int, use_residual: bool):
    _, live = _live_pages(len_ref, page_size, pages_per_split)
    gp, d = q_ref.shape
    tau = LOG2E / math.sqrt(d)
    q = q_ref[...].astype(jnp.float32)
    th = th_ref[...]
    keep_ref[...] = jnp.zeros(keep_ref.shape, jnp.int32)

    def body(t, carry):
        shat = _page_scores(codes_ref, qp_ref, scales_ref, t, bits=bits, tau=tau)
        keep = _keeps(shat, th)
        keep_ref[t] = jnp.full((1, 1), keep.astype(jnp.int32))

        def attend(carry):
            s = _refine(shat, q, res_ref[t], tau) if use_residual else shat
            return _online_update(carry, s, v_ref[t].astype(jnp.float32))

        return jax.lax.cond(keep, attend, lambda c: c, carry)

    _write(o_ref, m_ref, l_ref, jax.lax.fori_loop(0, live, body, _init(gp, d)))


def ffd_kernel_dma(len_ref, q_ref, th_ref, scales_ref, codes_ref, res_hbm, v_hbm, o_ref, m_ref, l_ref,
                   keep_ref, res_buf, v_buf, sem, kept_ref, *, bits: int, page_size: int, pages_per_split: int,
                   use_residual: bool):
    """The TPU shell: residual and values [b, k, p, bs, d] stay in HBM and only kept pages are copied.

    Blocks: ``scales_ref`` [pps, d] (the cache's own layout, 128 lanes), ``codes_ref`` [pps, dp, bs],
    ``keep_ref`` [1, pps] (lane-dense: one int32 per page would pad to a 128-lane row each).
    Scratch: ``res_buf`` / ``v_buf`` [2, bs, d] VMEM (two slots), ``sem`` DMA semaphores [2 (residual,
    values), 2 (slot)], ``kept_ref`` [pages_per_split] SMEM int32 (this split's kept pages, in order).
    """
    i, hh = pl.program_id(0), pl.program_id(1)
    first, live = _live_pages(len_ref, page_size, pages_per_split)
    gp, d = q_ref.shape
    tau = LOG2E / math.sqrt(d)
    q = q_ref[...].astype(jnp.float32)
    th = th_ref[...]
    lanes = jax.lax.broadcasted_iota(jnp.int32, keep_ref.shape, 1)

    def copies(idx, slot):  # the DMAs of the idx-th kept page into a buffer slot
        page = first + kept_ref[idx]
        out = [pltpu.make_async_copy(v_hbm.at[i, hh, page], v_buf.at[slot], sem.at[1, slot])]
        if use_residual:
            out.append(pltpu.make_async_copy(res_hbm.at[i, hh, page], res_buf.at[slot], sem.at[0, slot]))
        return out

    def scan(t, carry):  # phase 1: the codes of every page; list the kept ones
        n, flags = carry
        keep = _keeps(_page_scores_tpu(codes_ref, q, scales_ref, t, bits=bits, tau=tau), th)
        kept_ref[n] = t  # overwritten by the next page unless this one is kept

        @pl.when(jnp.logical_and(keep, n == 0))
        def _():  # the first kept page's copies overlap the rest of the scan
            for c in copies(0, 0):
                c.start()

        return n + keep.astype(jnp.int32), jnp.where(lanes == t, keep.astype(jnp.int32), flags)

    n, flags = jax.lax.fori_loop(0, live, scan, (0, jnp.zeros(keep_ref.shape, jnp.int32)))
    keep_ref[...] = flags

    def attend(idx, carry):  # phase 2: kept pages, the next one's copies in flight
        slot = jax.lax.rem(idx, 2)
        for c in copies(idx, slot):
            c.wait()

        @pl.when(idx + 1 < n)
        def _():
            for c in copies(idx + 1, 1 - slot):
                c.start()

        s = _page_scores_tpu(codes_ref, q, scales_ref, kept_ref[idx], bits=bits, tau=tau)  # recomputed: cheap
        if use_residual:
            s = _refine(s, q, res_buf[slot], tau)
        return _online_update(carry, s, v_buf[slot].astype(jnp.float32))

    _write(o_ref, m_ref, l_ref, jax.lax.fori_loop(0, n, attend, _init(gp, d)))
