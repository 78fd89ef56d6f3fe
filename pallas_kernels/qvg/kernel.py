"""QVG kernel bodies (shared by Mosaic TPU, Triton and the interpreter).

`kmeans_assign_kernel` (grid (groups, point blocks)): squared distances of a [bs, d] tile of points
to all k centroids as ``|x|^2 - 2 x.c + |c|^2`` (one matmul; ``|c|^2`` comes precomputed as a
[1, k] row), clamped at 0 like the reference, then the lowest index attaining the minimum, written
as a [bs, 1] int32 column (per-row outputs are columns, which both backends tile).

`qvg_attention_kernel` (grid (batch, kv heads, span splits)): attention of R query rows (the query
heads of one KV head times the query tokens) over one split of a QVG-quantized span, one
`block_k`-token tile at a time with the online softmax. Nothing is dequantized into memory:

  * the centroid part of the keys enters as ``(q C_j^T) onehot(a_j)^T``: ``q C_j^T`` [R, k] is
    computed once per program, and each tile's labels become a one-hot [k, bk] matrix (labels lie
    as [stages, tokens], tokens along the lanes), so the gather is a matmul (no dynamic indexing,
    which neither backend does well);
  * the residual part is unpacked from the packed codes plane by plane (one shift and mask per
    plane, as `kv_quant`): codes lie as [d/n, tokens] (n = 8 / bits codes per byte), so plane i of
    a tile is a [d/n, bk] array whose rows are the channels `api.channel_order` lists; each row's
    group scale (and zero point), stored as [groups, tokens], is broadcast to it with selects, then
    ``(u - offset) s`` or ``u s + z`` exactly as the reference. Keys: ``s += q_i @ plane_i`` with
    q's channels in that order; values: one accumulator [R, d/n] per plane, ``acc_i += p @
    plane_i^T``, with the value centroids' and the output's channels in V's order;
  * for the values, ``p V = p R + sum_j (p onehot(a_j)) C_j``: the kernel accumulates
    ``p onehot(a_j)`` [R, k] with the same online-softmax rescaling as the residual accumulators
    and multiplies by the value centroids once at the end.

Outputs are each split's unnormalized accumulator and per-row (m, l); the wrapper merges the splits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import MASK_VALUE
from pallas_kernels.kv_quant.kernel import unpack_plane
from primitives import quantization as qref


def kmeans_assign_kernel(x_ref, c_ref, cc_ref, o_ref, *, num_centroids: int):
    """x_ref [bs, d], c_ref [kp, d], cc_ref [1, kp] (|c|^2; padded centroids +big) -> o_ref [1, bs] int32.

    The labels come out as a row, points along lanes: a [bs, 1] column block would pad to 128 lanes in
    TPU HBM (128 times the labels' bytes). So the [bs, kp] distances are transposed once and reduced
    along sublanes; the lowest index wins ties, as `jnp.argmin`.
    """
    x = x_ref[...].astype(jnp.float32)
    c = c_ref[...].astype(jnp.float32)
    xx = jnp.sum(x * x, axis=-1, keepdims=True)
    dist = jnp.maximum(xx - 2.0 * jnp.dot(x, c.T, preferred_element_type=jnp.float32) + cc_ref[...], 0.0).T
    kp = c.shape[0]
    row = jax.lax.broadcasted_iota(jnp.int32, dist.shape, 0)  # [kp, bs]
    dist = jnp.where(row < num_centroids, dist, jnp.inf)
    best = jnp.min(dist, axis=0, keepdims=True)
    o_ref[...] = jnp.min(jnp.where(dist == best, row, kp), axis=0, keepdims=True).astype(jnp.int32)


def _residual_planes(c_ref, s_ref, z_ref, tokens, *, bits: int, group_size: int, scheme: str, valid=None):
    """The dequantized residual of one tile, plane by plane: n = 8 / bits float32 [d/n, bk] arrays.

    Refs lie with the tokens along the lanes: codes [d/n, L] uint8 (byte row r holds, in plane i,
    channel ``(r // sub) G + i sub + r % sub`` with ``sub = G / n``: the order `channel_order` gives),
    scales and zero points [d/G, L]. Each byte row's group scale (zero point) is broadcast to the row
    with selects (no gather), then ``(u - offset) s`` / ``u s + z`` as the reference. `valid` [1, bk]
    zeroes the scale (and zero point) of tokens past the length (selects, not a multiply: padding may
    be NaN in the interpreter)."""
    n = 8 // bits
    sub = group_size // n
    dn, bk = c_ref.shape[0], tokens.size
    byte = c_ref[:, tokens].astype(jnp.int32)  # [d/n, bk]
    row = jax.lax.broadcasted_iota(jnp.int32, (dn, bk), 0)

    def per_row(ref):
        out = None
        for gg in range(ref.shape[0]):
            r = ref[pl.ds(gg, 1), tokens].astype(jnp.float32)  # [1, bk]
            if valid is not None:
                r = jnp.where(valid, r, 0.0)
            out = jnp.broadcast_to(r, (dn, bk)) if out is None else jnp.where(row >= gg * sub, r, out)
        return out

    s = per_row(s_ref)
    z = None if z_ref is None else per_row(z_ref)
    return [qref.decode(unpack_plane(byte, i, bits), s, z, bits=bits, scheme=scheme) for i in range(n)]


def _one_hot_t(lab_ref, stage: int, tokens, block_k: int, kp: int) -> jax.Array:
    """[kp, bk] float32: column t is the one-hot of token t's stage-`stage` label (labels [n, L], lanes = tokens)."""
    labels = lab_ref[pl.ds(stage, 1), tokens].astype(jnp.int32)  # [1, bk]
    return (jax.lax.broadcasted_iota(jnp.int32, (kp, block_k), 0) == labels).astype(jnp.float32)


def _dot_t(a: jax.Array, b: jax.Array) -> jax.Array:
    """a [m, k] . b[n, k]^T -> [m, n] float32 (the q k^T form both backends lower)."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _take_cache_refs(refs: list, meta: tuple | None):
    """Pops (labels, centroids, codes, scale, zero) of one of K / V; meta = (bits, G, scheme) or None."""
    lab, cent = refs.pop(0), refs.pop(0)
    if meta is None:
        return lab, cent, None, None, None
    codes, scale = refs.pop(0), refs.pop(0)
    zero = refs.pop(0) if meta[2] == "asymmetric" else None
    return lab, cent, codes, scale, zero


def qvg_attention_kernel(len_ref, q_ref, *refs, k_stages: int, v_stages: int, k_meta: tuple | None, v_meta: tuple | None,
                         block_k: int, split_len: int, scale: float):
    """One (sequence, KV head, span split) program; `split_len` tokens per split, a multiple of `block_k`.

    q_ref [R, d] has its channels in K's `channel_order`; refs: K (labels [n, L] (uint8 / uint16),
    centroids [n, kp, d], [codes [d/n, L] uint8, scale [d/G, L] float32, [zero [d/G, L]]]), the same
    for V (value centroids with their channels in V's `channel_order`), then o [R, d] float32 (in V's
    channel order), m [R, 1], l [R, 1]: the unnormalized partials of this split. meta = (bits,
    group_size, scheme) of a quantized residual, or None when the span stores centroids only."""
    refs = list(refs)
    k_lab, k_cent, k_codes, k_scale, k_zero = _take_cache_refs(refs, k_meta)
    v_lab, v_cent, v_codes, v_scale, v_zero = _take_cache_refs(refs, v_meta)
    o_ref, m_ref, l_ref = refs
    start = pl.program_id(2) * split_len
    length = len_ref[pl.program_id(0)] - start  # valid tokens of this split (may be <= 0)
    rows_q, d = q_ref.shape
    kp, vp = k_cent.shape[1], v_cent.shape[1]
    live_tiles = jnp.clip(jax.lax.div(jnp.maximum(length, 0) + block_k - 1, block_k), 0, split_len // block_k)

    q = q_ref[...].astype(jnp.float32) * scale
    qc = [jnp.dot(q, k_cent[j].astype(jnp.float32).T, preferred_element_type=jnp.float32)
          for j in range(k_stages)]  # [R, kp] each
    k_dn = d if k_meta is None else d * k_meta[0] // 8
    v_dn = d if v_meta is None else d * v_meta[0] // 8
    q_planes = [q_ref[:, pl.ds(c, k_dn)].astype(jnp.float32) * scale for c in range(0, d, k_dn)]

    def body(t, carry):
        m, l, accs, pcs = carry
        offset = pl.multiple_of(t * block_k, block_k)
        tokens = pl.ds(offset, block_k)
        s = None
        for j in range(k_stages):
            part = jnp.dot(qc[j], _one_hot_t(k_lab, j, tokens, block_k, kp), preferred_element_type=jnp.float32)
            s = part if s is None else s + part
        if k_meta is not None:
            planes = _residual_planes(k_codes, k_scale, k_zero, tokens, bits=k_meta[0], group_size=k_meta[1],
                                      scheme=k_meta[2])
            for qi, ki in zip(q_planes, planes):
                s = s + jnp.dot(qi, ki, preferred_element_type=jnp.float32)
        key_pos = offset + jax.lax.broadcasted_iota(jnp.int32, (rows_q, block_k), 1)
        s = jnp.where(key_pos < length, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        l_new = alpha * l + jnp.sum(p, axis=-1, keepdims=True)
        pcs = tuple(alpha * pcs[j] + _dot_t(p, _one_hot_t(v_lab, j, tokens, block_k, vp)) for j in range(v_stages))
        if v_meta is not None:
            valid = offset + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1) < length
            planes = _residual_planes(v_codes, v_scale, v_zero, tokens, bits=v_meta[0], group_size=v_meta[1],
                                      scheme=v_meta[2], valid=valid)
            accs = tuple(alpha * a + _dot_t(p, vi) for a, vi in zip(accs, planes))
        return m_new, l_new, accs, pcs

    v_planes = 0 if v_meta is None else 8 // v_meta[0]
    init = (jnp.full((rows_q, 1), MASK_VALUE, jnp.float32), jnp.zeros((rows_q, 1), jnp.float32),
            tuple(jnp.zeros((rows_q, v_dn), jnp.float32) for _ in range(v_planes)),
            tuple(jnp.zeros((rows_q, vp), jnp.float32) for _ in range(v_stages)))
    m, l, accs, pcs = jax.lax.fori_loop(0, live_tiles, body, init)
    for i in range(max(v_planes, 1)):
        acc = accs[i] if accs else None
        for j in range(v_stages):
            part = jnp.dot(pcs[j], v_cent[j, :, pl.ds(i * v_dn, v_dn)].astype(jnp.float32),
                           preferred_element_type=jnp.float32)
            acc = part if acc is None else acc + part
        o_ref[:, pl.ds(i * v_dn, v_dn)] = acc
    m_ref[...] = m
    l_ref[...] = l
