"""Vegas kernel bodies (one body each for Mosaic TPU, Triton and the interpreter).

Both kernels are split-K flash decoding: grid (batch, KV-head groups, splits). `verify_kernel` reads
the cache as stored, token-major [b, S, kh, d] or head-major [b, kh, S, d] (its blocks are
[split_len, hp, d] or [hp, split_len, d]: merging kh and d into one axis is a relayout copy of the
whole cache on TPU, not a free reshape); `sparse_decode_kernel` reads a compact [keys, kh * d]
buffer. Program (i, hh, j) holds the query rows of `hp` KV heads (verify: hp = 1, except on TPU over
a token-major cache, whose block must span all kh heads; sparse: 1, except on TPU when d is not a
multiple of 128, where the lane rule forces the block to span all kh * d columns), and the j-th
contiguous split of `split_len` keys. Per KV head it walks the split in `block_k`-key tiles with the
shared online-softmax step (`_common.online_softmax_step`, float32 statistics) and
writes the *unnormalized* partial output with the running max m and normalizer l per row; the
wrapper merges the splits by log-sum-exp. No scratch and no cross-program accumulation, so the same
body runs on Triton (no scratch) and TPU (all grid axes "parallel").

Masking always uses `jnp.where` (never a multiply: interpreter padding and unused cache slots may
hold NaN); masked values are zeroed before the p.v matmul.

`verify_kernel` (query rows = the g query heads of a KV head times the t verification tokens,
ordered head-major: row gi * t + ti):
  * row r sees key j iff ``j <= pos[r]`` and ``j < kv_len``; tiles past the batch's last visible
    key (``n_keys[i] = max_r pos[r] + 1``) are skipped by the loop bound;
  * the score rows (the R rows of `rows` for each of the g heads: row gi * R + ri) are a second,
    small query block: for each tile their raw, unscaled ``q . k`` is written into the [R g,
    block_k] tile of the score output, ``-inf`` where not visible. The whole score block is first
    filled with ``-inf``, so skipped tiles read as invisible.

`sparse_decode_kernel` (query rows = the g query heads of a KV head, one token): attention over a
compact buffer of gathered rows (built by XLA before the kernel, see `api.py`) with a per-row
validity vector given twice, as a [1, keys] row (masks the logits) and a [keys, 1] column (zeroes
invalid value rows); invalid rows are masked, so an empty set leaves l = 0.

Layouts inside the kernels (gp / rp / Rp = padded row counts):
  q_ref    [hp, rp, d]      query rows per KV head (verify: g t rows; sparse: g rows)
  qpos_ref [rp, 1] int32    verify: position of each query row (-1 for padding rows)
  qs_ref   [hp, Rp, d]      verify: score-row queries; spos_ref [Rp, 1] their positions
  k_ref    verify: [split_len, hp, d] ("bskd") or [hp, split_len, d] ("bksd"); sparse: [split_len, hp d]
           keys of this split (v_ref the same)
  o_ref    [hp, rp, d] f32  unnormalized partial output; m_ref, l_ref [hp, rp, 1]
  s_ref    [hp, Rp, split_len] f32 verify: raw score rows of this split
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import MASK_VALUE, online_softmax_step

__all__ = ["verify_kernel", "sparse_decode_kernel"]


def _init_stats(rows: int, d: int):
    return (jnp.full((rows, 1), MASK_VALUE, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
            jnp.zeros((rows, d), jnp.float32))


def _tile(ref, hh: int, rows, kv_layout: str) -> jax.Array:
    """Rows ``rows`` of KV head ``hh`` of a verify K/V block: [block_k, d]."""
    return ref[rows, hh, :] if kv_layout == "bskd" else ref[hh, rows, :]


def verify_kernel(nkeys_ref, q_ref, qpos_ref, qs_ref, spos_ref, k_ref, v_ref, o_ref, m_ref, l_ref, s_ref, *,
                  block_k: int, split_len: int, kv_len: int, scale: float, kv_layout: str):
    """Causal attention of the verification rows over one split, plus that split's raw score rows."""
    i = pl.program_id(0)
    j = pl.program_id(2)
    n_keys = nkeys_ref[i]  # last visible key + 1 of this sequence, clipped to [0, kv_len] by the wrapper
    start = j * split_len
    num_tiles = split_len // block_k
    # lax.div (truncating) on a non-negative value: floor division lowers through sign(), which
    # Mosaic TPU cannot lower.
    live_tiles = jnp.minimum(jax.lax.div(jnp.maximum(n_keys - start, 0) + block_k - 1, block_k), num_tiles)
    hp, rp, d = q_ref.shape
    srp = qs_ref.shape[1]
    qpos = qpos_ref[...]  # [rp, 1]
    spos = spos_ref[...]  # [Rp, 1]

    for hh in range(hp):  # static: the KV heads of this program (1 unless TPU's lane rule forces more)
        q = q_ref[hh].astype(jnp.float32) * scale
        qs = qs_ref[hh].astype(jnp.float32)
        s_ref[hh] = jnp.full((srp, split_len), -jnp.inf, jnp.float32)

        def body(tile, carry, hh=hh, q=q, qs=qs):
            m, l, acc = carry
            offset = pl.multiple_of(tile * block_k, block_k)
            k = _tile(k_ref, hh, pl.ds(offset, block_k), kv_layout).astype(jnp.float32)
            v = _tile(v_ref, hh, pl.ds(offset, block_k), kv_layout).astype(jnp.float32)
            first = start + offset
            key = first + jax.lax.broadcasted_iota(jnp.int32, (rp, block_k), 1)
            visible = jnp.logical_and(key <= qpos, key < kv_len)
            score_key = first + jax.lax.broadcasted_iota(jnp.int32, (srp, block_k), 1)
            raw = jnp.dot(qs, k.T, preferred_element_type=jnp.float32)
            s_ref[hh, :, pl.ds(offset, block_k)] = jnp.where(
                jnp.logical_and(score_key <= spos, score_key < kv_len), raw, -jnp.inf)
            row = first + jax.lax.broadcasted_iota(jnp.int32, (block_k, d), 0)
            v = jnp.where(row < n_keys, v, 0.0)
            return online_softmax_step(q, k, v, visible, m, l, acc)

        m, l, acc = jax.lax.fori_loop(0, live_tiles, body, _init_stats(rp, d))
        o_ref[hh] = acc
        m_ref[hh] = m
        l_ref[hh] = l


def sparse_decode_kernel(q_ref, vrow_ref, vcol_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, block_k: int,
                         split_len: int, head_dim: int, scale: float):
    """Attention of one token's query heads over one split of the compact gathered buffer.

    vrow_ref [1, split_len] and vcol_ref [split_len, 1] int32: 1 where the gathered row is in the
    attended set, 0 for invalid list entries, listed keys at or past recent_start, window slots past
    the length and the wrapper's padding.
    """
    num_tiles = split_len // block_k
    hp, gp, d = q_ref.shape

    for hh in range(hp):
        q = q_ref[hh].astype(jnp.float32) * scale
        cols = pl.ds(hh * head_dim, head_dim)

        def body(tile, carry, q=q, cols=cols):
            m, l, acc = carry
            offset = pl.multiple_of(tile * block_k, block_k)
            k = k_ref[pl.ds(offset, block_k), cols]
            v = v_ref[pl.ds(offset, block_k), cols].astype(jnp.float32)
            ok_row = jnp.broadcast_to(vrow_ref[:, pl.ds(offset, block_k)] != 0, (gp, block_k))
            ok_col = jnp.broadcast_to(vcol_ref[pl.ds(offset, block_k), :] != 0, (block_k, d))
            v = jnp.where(ok_col, v, 0.0)
            return online_softmax_step(q, k, v, ok_row, m, l, acc)

        m, l, acc = jax.lax.fori_loop(0, num_tiles, body, _init_stats(gp, d))
        o_ref[hh] = acc
        m_ref[hh] = m
        l_ref[hh] = l
