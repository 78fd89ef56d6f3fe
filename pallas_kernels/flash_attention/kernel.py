"""Flash-attention kernel bodies: forward, dq and dk/dv, each with a TPU grid shell and a loop shell.

Dimension legend: `b` batch, `h` query heads, `kh` KV heads, `g = h // kh` query heads per KV head,
`tp`/`sp` padded query/key lengths, `d` head dim, `bq`/`bk` block_q/block_k. Causal attention aligns
the queries with the end of the keys: query row r sits at position r + offset, offset = kv_len - q_len.

Layouts inside the kernels (the wrapper transposes to head-major and zero-pads every length to its
block multiple): q, o, dO [b, h, tp, d]; k, v, dk, dv [b, kh, sp, d]; lse and delta [b, h, 1, tp]
float32, lane-dense rows (as [b, h, tp, 1] XLA:TPU would pad each to 128 lanes in HBM, 128 times its
size). The dk/dv tiles put keys along rows ([bk, bq] weights) so these rows broadcast as they are; the
forward turns its [bq, 1] statistics into a row, and dq its q block's rows into [bq, 1] columns, once
per q block (`_column_to_row`, `_row_to_column`), so that no kernel transposes a tile per step.

The per-tile math is written once (`_forward_tile`, `_backward_tile` on top of `online_softmax_step`);
the shells only move data (PALLAS.md, "Backend differences"):

* TPU shells (`*_grid_kernel`, "pallas_tpu", also run by the interpreter): the accumulated axis is a
  grid axis marked "arbitrary", the running statistics live in float32 VMEM scratch initialised and
  finalised with `pl.when`, and each program holds one block of each operand, so VMEM does not grow
  with the sequence length.

  - forward, grid (b, h, q_blocks, k_blocks): program (b, h, i, j) holds q block i of head h and key
    block j of its KV head; m, l [bq, 1] and acc [bq, d] accumulate over j.
  - dq, grid (b, h, q_blocks, k_blocks): same blocks plus dO, lse, delta of block i; dq [bq, d]
    accumulates over j (scratch also keeps lse, delta as [bq, 1] columns).
  - dk/dv, grid (b, kh, k_blocks, g, q_blocks): program (b, c, j, r, i) holds key block j of KV head c
    and q block i of query head c * g + r; dk, dv [bk, d] accumulate over (r, i), i.e. over every
    query head of the KV group inside the kernel, so the outputs are written once, in the input dtype,
    and no per-query-head float32 [b, h, s, d] partials ever reach HBM.

  Blocks entirely above the causal diagonal are skipped: no compute (`pl.when`), and their index map
  is clamped to the last (forward, dq) or first (dk/dv) needed block, so the pipeline fetches nothing
  new for them.

* Loop shells (`*_loop_kernel`, "pallas_triton"; Triton cannot accumulate across a grid axis): grid
  (b, h, q_blocks) for the forward and dq, (b, kh, k_blocks) for dk/dv; each program holds the whole
  padded K and V (forward, dq) or the whole padded q, dO, lse, delta of its KV group (dk/dv) and loops
  over tiles, with the causal skip in the loop bounds.

Backward math (P = softmax rows, recomputed tile by tile from lse): dV = P^T dO, dP = dO V^T,
dS = P * (dP - delta) with delta_i = rowsum(dO * O)_i - dlse_i (d lse_i / d s_ij = p_ij, so a
cotangent on the returned logsumexp enters through delta), dQ = scale * dS K, dK = scale * dS^T Q.

VMEM per TPU program is set by the tiles alone (`FlashBlockSizes.tpu_vmem_bytes`; about 8.6 MiB at the
default 512 x 512 bf16 tiles, head_dim 128). Compiled for v5e and v6e (one chip each, bf16, 32 query over
8 KV heads, head_dim 128, causal): the forward at 131072 tokens and forward plus backward at 65536 tokens,
the largest lengths tried (details in `api.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import MASK_VALUE, online_softmax_step

# ---------------------------------------------------------------------------------------------------------
# Block ranges of the causal skip (non-negative integer math: lax.div, since jnp floor division lowers
# through sign(), which Mosaic rejects).


def last_key_block(i, *, block_q: int, block_k: int, offset: int, num_k_blocks: int):
    """Last key block that q block `i` sees under the causal mask (queries at positions r + offset)."""
    return jnp.minimum(jax.lax.div(i * block_q + (offset + block_q - 1), block_k), num_k_blocks - 1)


def first_query_block(j, *, block_q: int, block_k: int, offset: int, num_q_blocks: int):
    """First q block that sees any key of key block `j` under the causal mask."""
    return jnp.minimum(jax.lax.div(jnp.maximum(j * block_k - offset, 0), block_q), num_q_blocks - 1)


# ---------------------------------------------------------------------------------------------------------
# Per-tile math, shared by every shell.


def _valid(q_first, k_first, shape, *, causal: bool, kv_len: int, keys_axis: int = 1):
    """Bool tile, [bq, bk] (keys_axis=1) or [bk, bq] (keys_axis=0): key inside the sequence and (causal) not
    after the query's position."""
    key_pos = k_first + jax.lax.broadcasted_iota(jnp.int32, shape, keys_axis)
    valid = key_pos < kv_len
    if causal:
        q_pos = q_first + jax.lax.broadcasted_iota(jnp.int32, shape, 1 - keys_axis)
        valid = jnp.logical_and(valid, key_pos <= q_pos)
    return valid


def _column_to_row(x):
    """[n, 1] -> [1, n] without a transpose (a masked column sum of the diagonal; portable to Mosaic, Triton
    and the interpreter). Runs once per q block, on the per-row statistics only."""
    n = x.shape[0]
    eye = jax.lax.broadcasted_iota(jnp.int32, (n, n), 0) == jax.lax.broadcasted_iota(jnp.int32, (n, n), 1)
    return jnp.sum(jnp.where(eye, x, 0.0), axis=0, keepdims=True)


def _forward_tile(q, k, v, q_first, k_first, m, l, acc, *, causal: bool, kv_len: int):
    """One key tile of the forward: q [bq, d] float32 pre-scaled, k, v [bk, d]; returns (m, l, acc)."""
    valid = _valid(q_first, k_first, (q.shape[0], k.shape[0]), causal=causal, kv_len=kv_len)
    row_pos = k_first + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0)
    v = jnp.where(row_pos < kv_len, v.astype(jnp.float32), 0.0)
    return online_softmax_step(q, k, v, valid, m, l, acc)


def _forward_finish(m, l, acc):
    """Normalized output [bq, d] and logsumexp as a lane-dense row [1, bq] (-inf on rows that saw no key)."""
    seen = l > 0
    safe_l = jnp.where(seen, l, 1.0)
    lse = _column_to_row(m + jnp.log(safe_l))
    return jnp.where(seen, acc / safe_l, 0.0), jnp.where(_column_to_row(l) > 0, lse, -jnp.inf)


def _forward_init(block_q: int, d: int):
    return (jnp.full((block_q, 1), MASK_VALUE, jnp.float32), jnp.zeros((block_q, 1), jnp.float32),
            jnp.zeros((block_q, d), jnp.float32))


def _row_to_column(x):
    """[1, n] -> [n, 1], the inverse of `_column_to_row` (a masked row sum of the diagonal)."""
    n = x.shape[1]
    eye = jax.lax.broadcasted_iota(jnp.int32, (n, n), 0) == jax.lax.broadcasted_iota(jnp.int32, (n, n), 1)
    return jnp.sum(jnp.where(eye, x, 0.0), axis=1, keepdims=True)


def _backward_tile(q, k, v, do, lse, delta, q_first, k_first, *, causal: bool, kv_len: int, keys_major: bool):
    """One (q tile, key tile) pair of the backward.

    Args:
      q: [bq, d] float32 pre-scaled queries; k, v: [bk, d]; do: [bq, d] float32 output cotangent.
      lse, delta: float32 per-query statistics, rows [1, bq] when `keys_major`, else columns [bq, 1].
      keys_major: orientation of the [.., ..] tiles: [bk, bq] (keys along rows; the dk/dv kernel, whose
        statistics change every step and come as lane-dense rows) or [bq, bk] (the dq kernel, which turns
        its q block's rows into columns once).

    Returns:
      k, v as float32 (v zeroed past kv_len), p (the attention weights) and ds (the cotangent of the scaled
      logits), both [bk, bq] when `keys_major`, else [bq, bk].
    """
    k = k.astype(jnp.float32)
    row_pos = k_first + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0)
    v = jnp.where(row_pos < kv_len, v.astype(jnp.float32), 0.0)
    shape = (k.shape[0], q.shape[0]) if keys_major else (q.shape[0], k.shape[0])
    valid = _valid(q_first, k_first, shape, causal=causal, kv_len=kv_len, keys_axis=0 if keys_major else 1)
    s = jnp.dot(k, q.T, preferred_element_type=jnp.float32) if keys_major else jnp.dot(
        q, k.T, preferred_element_type=jnp.float32)
    p = jnp.where(valid, jnp.exp(s - lse), 0.0)
    dp = jnp.dot(v, do.T, preferred_element_type=jnp.float32) if keys_major else jnp.dot(
        do, v.T, preferred_element_type=jnp.float32)
    return k, v, p, p * (dp - delta)


def _dq_update(q, k, v, do, lse, delta, q_first, k_first, dq, *, causal: bool, kv_len: int):
    """dq += ds k (without the scale, applied once at the end); lse, delta as columns [bq, 1]."""
    k, _, _, ds = _backward_tile(q, k, v, do, lse, delta, q_first, k_first, causal=causal, kv_len=kv_len,
                                 keys_major=False)
    return dq + jnp.dot(ds, k, preferred_element_type=jnp.float32)


def _dkv_update(q, k, v, do, lse, delta, q_first, k_first, dk, dv, *, causal: bool, kv_len: int):
    """dk += ds^T q (q pre-scaled, so dk is complete), dv += p^T dO; lse, delta as rows [1, bq]."""
    _, _, p, ds = _backward_tile(q, k, v, do, lse, delta, q_first, k_first, causal=causal, kv_len=kv_len,
                                 keys_major=True)
    dk = dk + jnp.dot(ds, q, preferred_element_type=jnp.float32)
    dv = dv + jnp.dot(p, do, preferred_element_type=jnp.float32)
    return dk, dv


# ---------------------------------------------------------------------------------------------------------
# Forward.


def _run_where(needed, step) -> None:
    """`step()` in the programs where `needed` (a traced bool) holds, in every program when it is None: a TPU
    shell skips the blocks wholly above the causal diagonal (their index maps fetch nothing new)."""
    if needed is None:
        step()
    else:
        pl.when(needed)(step)


def flash_forward_grid_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref, *, block_q: int,
                              block_k: int, scale: float, causal: bool, q_len: int, kv_len: int):
    """TPU shell: grid (b, h, q_blocks, k_blocks); q_ref [bq, d], k_ref, v_ref [bk, d]; scratch m, l
    [bq, 1] and acc [bq, d] float32."""
    i, j = pl.program_id(2), pl.program_id(3)
    offset = kv_len - q_len

    @pl.when(j == 0)
    def _init():
        m, l, acc = _forward_init(block_q, acc_ref.shape[-1])
        m_ref[...], l_ref[...], acc_ref[...] = m, l, acc

    def step():
        q = q_ref[...].astype(jnp.float32) * scale
        m, l, acc = _forward_tile(q, k_ref[...], v_ref[...], i * block_q + offset, j * block_k, m_ref[...],
                                  l_ref[...], acc_ref[...], causal=causal, kv_len=kv_len)
        m_ref[...], l_ref[...], acc_ref[...] = m, l, acc

    _run_where(j <= last_key_block(i, block_q=block_q, block_k=block_k, offset=offset,
                                   num_k_blocks=pl.num_programs(3)) if causal else None, step)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        o, lse = _forward_finish(m_ref[...], l_ref[...], acc_ref[...])
        o_ref[...] = o.astype(o_ref.dtype)
        lse_ref[...] = lse


def flash_forward_loop_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, block_q: int, block_k: int, scale: float,
                              causal: bool, q_len: int, kv_len: int):
    """Loop shell: grid (b, h, q_blocks); q_ref [bq, d], k_ref, v_ref the whole [sp, d] of the KV head."""
    i = pl.program_id(2)
    q = q_ref[...].astype(jnp.float32) * scale
    q_first = i * block_q + (kv_len - q_len)
    num_tiles = k_ref.shape[0] // block_k
    if causal:
        num_tiles = last_key_block(i, block_q=block_q, block_k=block_k, offset=kv_len - q_len,
                                   num_k_blocks=num_tiles) + 1

    def body(t, carry):
        offset = pl.multiple_of(t * block_k, block_k)
        return _forward_tile(q, k_ref[pl.ds(offset, block_k), :], v_ref[pl.ds(offset, block_k), :], q_first,
                             offset, *carry, causal=causal, kv_len=kv_len)

    m, l, acc = jax.lax.fori_loop(0, num_tiles, body, _forward_init(block_q, q_ref.shape[-1]))
    o, lse = _forward_finish(m, l, acc)
    o_ref[...] = o.astype(o_ref.dtype)
    lse_ref[...] = lse


# ---------------------------------------------------------------------------------------------------------
# dq.


def flash_dq_grid_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, acc_ref, lse_col, delta_col, *,
                         block_q: int, block_k: int, scale: float, causal: bool, q_len: int, kv_len: int):
    """TPU shell: grid (b, h, q_blocks, k_blocks); scratch acc [bq, d] float32 (dq / scale) and the q block's
    lse, delta as columns [bq, 1] (turned from the lane-dense rows once, at the first key block)."""
    i, j = pl.program_id(2), pl.program_id(3)
    offset = kv_len - q_len

    @pl.when(j == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        lse_col[...] = _row_to_column(lse_ref[...])
        delta_col[...] = _row_to_column(delta_ref[...])

    def step():
        q = q_ref[...].astype(jnp.float32) * scale
        acc_ref[...] = _dq_update(q, k_ref[...], v_ref[...], do_ref[...].astype(jnp.float32), lse_col[...],
                                  delta_col[...], i * block_q + offset, j * block_k, acc_ref[...], causal=causal,
                                  kv_len=kv_len)

    _run_where(j <= last_key_block(i, block_q=block_q, block_k=block_k, offset=offset,
                                   num_k_blocks=pl.num_programs(3)) if causal else None, step)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_ref[...] * scale).astype(dq_ref.dtype)


def flash_dq_loop_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, block_q: int, block_k: int,
                         scale: float, causal: bool, q_len: int, kv_len: int):
    """Loop shell: grid (b, h, q_blocks); k_ref, v_ref the whole [sp, d] of the KV head."""
    i = pl.program_id(2)
    q = q_ref[...].astype(jnp.float32) * scale
    do = do_ref[...].astype(jnp.float32)
    lse, delta = _row_to_column(lse_ref[...]), _row_to_column(delta_ref[...])
    q_first = i * block_q + (kv_len - q_len)
    num_tiles = k_ref.shape[0] // block_k
    if causal:
        num_tiles = last_key_block(i, block_q=block_q, block_k=block_k, offset=kv_len - q_len,
                                   num_k_blocks=num_tiles) + 1

    def body(t, acc):
        offset = pl.multiple_of(t * block_k, block_k)
        return _dq_update(q, k_ref[pl.ds(offset, block_k), :], v_ref[pl.ds(offset, block_k), :], do, lse, delta,
                          q_first, offset, acc, causal=causal, kv_len=kv_len)

    acc = jax.lax.fori_loop(0, num_tiles, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (acc * scale).astype(dq_ref.dtype)


# ---------------------------------------------------------------------------------------------------------
# dk, dv.


def flash_dkv_grid_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_acc, dv_acc, *,
                          block_q: int, block_k: int, scale: float, causal: bool, q_len: int, kv_len: int):
    """TPU shell: grid (b, kh, k_blocks, g, q_blocks); scratch dk_acc, dv_acc [bk, d] float32 accumulate
    over the last two axes (every query head of the KV group, every q block)."""
    j, r, i = pl.program_id(2), pl.program_id(3), pl.program_id(4)
    offset = kv_len - q_len

    @pl.when(jnp.logical_and(r == 0, i == 0))
    def _init():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    def step():
        q = q_ref[...].astype(jnp.float32) * scale
        dk, dv = _dkv_update(q, k_ref[...], v_ref[...], do_ref[...].astype(jnp.float32), lse_ref[...],
                             delta_ref[...], i * block_q + offset, j * block_k, dk_acc[...], dv_acc[...],
                             causal=causal, kv_len=kv_len)
        dk_acc[...], dv_acc[...] = dk, dv

    _run_where(i >= first_query_block(j, block_q=block_q, block_k=block_k, offset=offset,
                                      num_q_blocks=pl.num_programs(4)) if causal else None, step)

    @pl.when(jnp.logical_and(r == pl.num_programs(3) - 1, i == pl.num_programs(4) - 1))
    def _finish():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def flash_dkv_loop_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, block_q: int,
                          block_k: int, scale: float, causal: bool, q_len: int, kv_len: int):
    """Loop shell: grid (b, kh, k_blocks); q_ref, do_ref [g, tp, d] and lse_ref, delta_ref [g, 1, tp] hold the
    whole KV group; k_ref, v_ref [bk, d]. Loops over the group's query heads and their q blocks."""
    j = pl.program_id(2)
    offset = kv_len - q_len
    group, num_q_blocks = q_ref.shape[0], q_ref.shape[1] // block_q
    k, v = k_ref[...], v_ref[...]
    first = 0
    if causal:
        first = first_query_block(j, block_q=block_q, block_k=block_k, offset=offset, num_q_blocks=num_q_blocks)

    def head_body(r, carry):
        def body(i, carry):
            rows = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
            q = q_ref[r, rows, :].astype(jnp.float32) * scale
            cols = pl.ds(pl.multiple_of(i * block_q, block_q), block_q)
            return _dkv_update(q, k, v, do_ref[r, rows, :].astype(jnp.float32), lse_ref[r, :, cols],
                               delta_ref[r, :, cols], i * block_q + offset, j * block_k, *carry, causal=causal,
                               kv_len=kv_len)

        return jax.lax.fori_loop(first, num_q_blocks, body, carry)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, group, head_body, (zeros, zeros))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
