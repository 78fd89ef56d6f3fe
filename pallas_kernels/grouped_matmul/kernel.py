"""Grouped-matmul kernel bodies (shared by TPU, Triton and the interpreter).

`gmm_kernel` — grid (m_tiles, n_tiles). Program (i, j) owns output tile rows
[i*bm, (i+1)*bm) x columns [j*bn, (j+1)*bn). Group metadata computed in the wrapper says which
groups row tile i touches (`tile_first[i]`, `tile_count[i]`, contiguous because rows are sorted by
group); for each of them the program loops over `block_k` slices of the contraction, multiplies
with that group's matrix (a dynamic index into rhs), and adds the product only on the rows of that
group (`jnp.where` on the row mask, so a tile that spans a group boundary is correct). float32
accumulator; rows past the last group stay zero.

`tgmm_kernel` — grid (E, k_tiles, n_tiles). Program (e, a, c) accumulates
`lhs[rows of e, a-tile]^T @ dy[rows of e, c-tile]` over the row tiles that intersect group e,
masking rows outside it; an empty group writes zeros.

Layouts inside the kernels (wrapper pads every dim to its block multiple with zeros):
  offsets_ref [E+1] int32   group row offsets (cumulative group sizes)
  lhs_ref     [bm, Kp]      gmm: this row tile, whole (padded) contraction
  rhs_ref     [E, Kp, bn]   gmm: every group's matrix, this column tile
  x_ref       [Mp, bk]      tgmm: all rows, this k tile
  dy_ref      [Mp, bn]      tgmm: all rows, this n tile
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def masked_group_dot(x, w, rows, start, end):
    """One tile of grouped compute: x [bm, bk] @ w [bk, bn] kept only on rows in [start, end)."""
    y = jnp.dot(x, w, preferred_element_type=jnp.float32)
    return jnp.where((rows >= start) & (rows < end), y, 0.0)


def gmm_kernel(offsets_ref, first_ref, count_ref, lhs_ref, rhs_ref, out_ref, *, block_k: int, num_k_tiles: int):
    i = pl.program_id(0)
    bm, bn = out_ref.shape
    first = first_ref[i]
    count = count_ref[i]
    rows = i * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 0)

    def group_body(gi, acc):
        g = first + gi
        start = offsets_ref[g]
        end = offsets_ref[g + 1]

        def k_body(kt, acc):
            off = pl.multiple_of(kt * block_k, block_k)
            x = lhs_ref[:, pl.ds(off, block_k)]
            w = rhs_ref[g, pl.ds(off, block_k), :]
            return acc + masked_group_dot(x, w, rows, start, end)

        return jax.lax.fori_loop(0, num_k_tiles, k_body, acc)

    acc = jax.lax.fori_loop(0, count, group_body, jnp.zeros((bm, bn), jnp.float32))
    out_ref[...] = acc.astype(out_ref.dtype)


def tgmm_kernel(offsets_ref, x_ref, dy_ref, out_ref, *, block_m: int):
    e = pl.program_id(0)
    bk, bn = out_ref.shape
    start = offsets_ref[e]
    end = offsets_ref[e + 1]
    # lax.div on non-negative values (jnp floor division lowers through sign(), which Mosaic rejects).
    first_tile = jax.lax.div(start, block_m)
    last_tile = jnp.where(end > start, jax.lax.div(end + block_m - 1, block_m), first_tile)

    def body(t, acc):
        off = pl.multiple_of(t * block_m, block_m)
        x = x_ref[pl.ds(off, block_m), :]
        dy = dy_ref[pl.ds(off, block_m), :]
        rows = off + jax.lax.broadcasted_iota(jnp.int32, (block_m, bk), 0)
        x = jnp.where((rows >= start) & (rows < end), x, jnp.zeros_like(x))
        return acc + jax.lax.dot_general(x, dy, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(first_tile, last_tile, body, jnp.zeros((bk, bn), jnp.float32))
    out_ref[...] = acc.astype(out_ref.dtype)
