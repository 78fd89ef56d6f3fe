"""FFD's fused scan-select-attend kernel body (shared by TPU, Triton and the interpreter).

Grid: (batch, kv_head, num_splits). Program (i, h, j) takes the query heads of KV head h of
sequence i and the j-th contiguous range of ``pages_per_split`` pages, and for each full page:

1. unpacks the page's 2/4-bit key codes (channel-major ``[d/n, bs]`` bytes, planar packing: plane
   ``c`` holds a contiguous block of channels, so each plane is one ``[gp, d/n] @ [d/n, bs]``
   product), scores every token in base 2 with ``shat = tau log2(e) ((q * S) . C - o sum(q * S))``;
2. keeps the page for the whole group when any head's page maximum reaches its threshold
   (``m_ref - delta``, computed outside from the first and last full pages);
3. only for a kept page (``lax.cond``: on GPU the loads of the residual and value tiles sit inside
   the branch and are skipped for dropped pages), refines the scores with the residual and updates
   the base-2 online softmax (m, l, acc).

It writes the unnormalized partial output, m (log2 units) and l per query row, and one keep flag
per page. Layouts inside the kernel:
  q_ref      [gp, d]           query rows of this KV head (gp = padded group)
  qp_ref     [n, gp, d/n]      the same rows split into the n channel planes of the packing
  th_ref     [gp, 1]           thresholds (log2); padded rows hold +1e30 and never pass
  scales_ref [pps, n, 1, d/n]  per-page per-channel scales, split into planes
(planes come in as separate ref rows because Triton lowers no value slices).
  codes_ref  [pps, d/n, bs]    packed codes, channel-major (n = 8 / bits codes per byte)
  res_ref    [pps, bs, d]      residual K - Khat
  v_ref      [pps, bs, d]      values
  o_ref [gp, d] f32, m_ref, l_ref [gp, 1], keep_ref [pps, 1, 1] int32
On TPU the BlockSpec pipeline prefetches every tile of the split, so skipping saves compute but not
bandwidth there; a manual-DMA variant (memory_space=ANY + make_async_copy) is the TPU follow-up.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import MASK_VALUE  # finite running-max start: exp2(m_old - m_new) stays finite

LOG2E = math.log2(math.e)


def ffd_kernel(len_ref, q_ref, qp_ref, th_ref, scales_ref, codes_ref, res_ref, v_ref, o_ref, m_ref, l_ref, keep_ref, *,
               bits: int, page_size: int, pages_per_split: int, use_residual: bool):
    i = pl.program_id(0)
    j = pl.program_id(2)
    full = jax.lax.div(len_ref[i], page_size)
    first = j * pages_per_split
    live = jnp.clip(full - first, 0, pages_per_split)
    gp, d = q_ref.shape
    per_byte = 8 // bits
    offset = (2**bits - 1) / 2
    tau = LOG2E / math.sqrt(d)
    q = q_ref[...].astype(jnp.float32)
    th = th_ref[...]
    keep_ref[...] = jnp.zeros(keep_ref.shape, jnp.int32)

    def body(t, carry):
        m, l, acc = carry
        codes = codes_ref[t].astype(jnp.int32)  # [dp, bs]
        dot = jnp.zeros((gp, page_size), jnp.float32)
        qs_sum = jnp.zeros((gp, 1), jnp.float32)
        for c in range(per_byte):  # static: the plane of channels c*dp .. (c+1)*dp - 1
            qs = qp_ref[c].astype(jnp.float32) * scales_ref[t, c].astype(jnp.float32)  # [gp, dp]
            plane = jnp.bitwise_and(jnp.right_shift(codes, c * bits), 2**bits - 1).astype(jnp.float32)
            dot = dot + jnp.dot(qs, plane, preferred_element_type=jnp.float32)  # [gp, dp] @ [dp, bs]
            qs_sum = qs_sum + jnp.sum(qs, axis=-1, keepdims=True)
        shat = tau * (dot - offset * qs_sum)  # [gp, bs]
        passes = (jnp.max(shat, axis=-1, keepdims=True) >= th).astype(jnp.float32)
        keep = jnp.max(passes) > 0.0
        keep_ref[t] = jnp.full((1, 1), keep.astype(jnp.int32))

        def attend(carry):
            m, l, acc = carry
            s = shat
            if use_residual:
                r = res_ref[t].astype(jnp.float32)
                s = s + tau * jax.lax.dot_general(q, r, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
            p = jnp.exp2(s - m_new)
            alpha = jnp.exp2(m - m_new)
            v = v_ref[t].astype(jnp.float32)
            return (m_new, alpha * l + jnp.sum(p, axis=-1, keepdims=True),
                    alpha * acc + jnp.dot(p, v, preferred_element_type=jnp.float32))

        return jax.lax.cond(keep, attend, lambda c: c, (m, l, acc))

    init = (jnp.full((gp, 1), MASK_VALUE, jnp.float32), jnp.zeros((gp, 1), jnp.float32),
            jnp.zeros((gp, d), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, live, body, init)
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l
