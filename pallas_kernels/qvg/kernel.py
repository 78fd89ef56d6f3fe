"""QVG kernel bodies (shared by Mosaic TPU, Triton and the interpreter).

`kmeans_assign_kernel` (grid (groups, point blocks)): squared distances of a [bs, d] tile of points
to all k centroids as ``|x|^2 - 2 x.c + |c|^2`` (one matmul; ``|c|^2`` comes precomputed as a
[1, k] row), clamped at 0 like the reference, then the lowest index attaining the minimum, written
as a [bs, 1] int32 column (per-row outputs are columns, which both backends tile).

`qvg_attention_kernel` (grid (batch, kv heads)): attention of R query rows (the query heads of one
KV head times the query tokens) over a QVG-quantized span, one `block_k`-token tile at a time with
the online softmax. Nothing is dequantized into memory:

  * the centroid part of the keys enters as ``(q C_j^T) onehot(a_j)^T``: ``q C_j^T`` [R, k] is
    computed once per program, and each tile's labels become a one-hot [bk, k] matrix, so the
    gather is a matmul (no dynamic indexing, which neither backend does well);
  * the residual part is unpacked from the packed codes and scales sub-slice by sub-slice exactly
    as `kv_quant` does (one shift and mask per plane, ``(u - offset) s`` or ``u s + z``);
  * for the values, ``p V = p R + sum_j (p onehot(a_j)) C_j``: the kernel accumulates
    ``p onehot(a_j)`` [R, k] with the same online-softmax rescaling as the residual accumulators
    and multiplies by the value centroids once at the end.

Outputs are the unnormalized accumulator and per-row (m, l); the wrapper divides and forms the lse.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import MASK_VALUE
from pallas_kernels.kv_quant.kernel import unpack_plane
from primitives import quantization as qref


def kmeans_assign_kernel(x_ref, c_ref, cc_ref, o_ref, *, num_centroids: int):
    """x_ref [bs, d], c_ref [kp, d], cc_ref [1, kp] (|c|^2; padded centroids +big) -> o_ref [bs, 1] int32."""
    x = x_ref[...].astype(jnp.float32)
    c = c_ref[...].astype(jnp.float32)
    xx = jnp.sum(x * x, axis=-1, keepdims=True)
    dist = jnp.maximum(xx - 2.0 * jnp.dot(x, c.T, preferred_element_type=jnp.float32) + cc_ref[...], 0.0)
    kp = c.shape[0]
    col = jax.lax.broadcasted_iota(jnp.int32, dist.shape, 1)
    dist = jnp.where(col < num_centroids, dist, jnp.inf)
    best = jnp.min(dist, axis=-1, keepdims=True)
    o_ref[...] = jnp.min(jnp.where(dist == best, col, kp), axis=-1, keepdims=True).astype(jnp.int32)


def _residual_subslices(c_ref, s_ref, z_ref, rows, *, bits: int, group_size: int, scheme: str):
    """[(channel offset, float32 [bk, G/n])] of one tile of a packed residual [s, d/n] of one head."""
    n = 8 // bits
    sub = group_size // n
    out = []
    for gg in range(c_ref.shape[-1] // sub):
        byte = c_ref[rows, pl.ds(gg * sub, sub)].astype(jnp.int32)
        s = s_ref[rows, pl.ds(gg, 1)]
        z = None if z_ref is None else z_ref[rows, pl.ds(gg, 1)]
        for i in range(n):
            out.append((gg * group_size + i * sub, qref.decode(unpack_plane(byte, i, bits), s, z, bits=bits,
                                                               scheme=scheme)))
    return out


def _one_hot(lab_ref, stage: int, rows, block_k: int, kp: int) -> jax.Array:
    labels = lab_ref[stage, rows, :].astype(jnp.int32)  # [bk, 1]
    return (labels == jax.lax.broadcasted_iota(jnp.int32, (block_k, kp), 1)).astype(jnp.float32)


def _take_cache_refs(refs: list, meta: tuple | None):
    """Pops (labels, centroids, codes, scale, zero) of one of K / V; meta = (bits, G, scheme) or None."""
    lab, cent = refs.pop(0), refs.pop(0)
    if meta is None:
        return lab, cent, None, None, None
    codes, scale = refs.pop(0), refs.pop(0)
    zero = refs.pop(0) if meta[2] == "asymmetric" else None
    return lab, cent, codes, scale, zero


def qvg_attention_kernel(len_ref, q_ref, *refs, k_stages: int, v_stages: int, k_meta: tuple | None, v_meta: tuple | None,
                         block_k: int, num_tiles: int, scale: float):
    """refs: K (labels [n, sp, 1] uint8, centroids [n, kp, d], [codes [sp, d/n], scale [sp, d/G], [zero]]),
    the same for V, then o [R, d] float32, m [R, 1], l [R, 1]. meta = (bits, group_size, scheme) of a
    quantized residual, or None when the span stores centroids only."""
    refs = list(refs)
    k_lab, k_cent, k_codes, k_scale, k_zero = _take_cache_refs(refs, k_meta)
    v_lab, v_cent, v_codes, v_scale, v_zero = _take_cache_refs(refs, v_meta)
    o_ref, m_ref, l_ref = refs
    length = len_ref[pl.program_id(0)]
    rows_q, d = q_ref.shape
    kp, vp = k_cent.shape[1], v_cent.shape[1]
    live_tiles = jnp.minimum(jax.lax.div(jnp.maximum(length, 0) + block_k - 1, block_k), num_tiles)

    q = q_ref[...].astype(jnp.float32) * scale
    qc = [jnp.dot(q, k_cent[j].astype(jnp.float32).T, preferred_element_type=jnp.float32)
          for j in range(k_stages)]  # [R, kp] each
    k_sub = d if k_meta is None else k_meta[1] // (8 // k_meta[0])
    v_sub = d if v_meta is None else v_meta[1] // (8 // v_meta[0])
    q_subs = [q_ref[:, pl.ds(c, k_sub)].astype(jnp.float32) * scale for c in range(0, d, k_sub)]
    v_offsets = list(range(0, d, v_sub))

    def body(t, carry):
        m, l, accs, pcs = carry
        offset = pl.multiple_of(t * block_k, block_k)
        rows = pl.ds(offset, block_k)
        s = None
        for j in range(k_stages):
            part = jnp.dot(qc[j], _one_hot(k_lab, j, rows, block_k, kp).T, preferred_element_type=jnp.float32)
            s = part if s is None else s + part
        if k_meta is not None:
            for c, kh in _residual_subslices(k_codes, k_scale, k_zero, rows, bits=k_meta[0], group_size=k_meta[1],
                                             scheme=k_meta[2]):
                s = s + jnp.dot(q_subs[c // k_sub], kh.T, preferred_element_type=jnp.float32)
        key_pos = offset + jax.lax.broadcasted_iota(jnp.int32, (rows_q, block_k), 1)
        s = jnp.where(key_pos < length, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        l_new = alpha * l + jnp.sum(p, axis=-1, keepdims=True)
        pcs = tuple(alpha * pcs[j] + jnp.dot(p, _one_hot(v_lab, j, rows, block_k, vp),
                                             preferred_element_type=jnp.float32) for j in range(v_stages))
        accs = list(accs)
        if v_meta is not None:
            row_pos = offset + jax.lax.broadcasted_iota(jnp.int32, (block_k, v_sub), 0)
            for c, vh in _residual_subslices(v_codes, v_scale, v_zero, rows, bits=v_meta[0], group_size=v_meta[1],
                                             scheme=v_meta[2]):
                vh = jnp.where(row_pos < length, vh, 0.0)  # never a multiply: padding may be NaN
                accs[c // v_sub] = alpha * accs[c // v_sub] + jnp.dot(p, vh, preferred_element_type=jnp.float32)
        return m_new, l_new, tuple(accs), pcs

    init = (jnp.full((rows_q, 1), MASK_VALUE, jnp.float32), jnp.zeros((rows_q, 1), jnp.float32),
            tuple(jnp.zeros((rows_q, v_sub), jnp.float32) for _ in v_offsets),
            tuple(jnp.zeros((rows_q, vp), jnp.float32) for _ in range(v_stages)))
    m, l, accs, pcs = jax.lax.fori_loop(0, live_tiles, body, init)
    for c, acc in zip(v_offsets, accs):
        for j in range(v_stages):
            acc = acc + jnp.dot(pcs[j], v_cent[j, :, pl.ds(c, v_sub)].astype(jnp.float32),
                                preferred_element_type=jnp.float32)
        o_ref[:, pl.ds(c, v_sub)] = acc
    m_ref[...] = m
    l_ref[...] = l
