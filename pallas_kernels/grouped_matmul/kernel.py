"""Grouped-matmul kernel bodies: shared per-tile math, a TPU (Mosaic) shell and a Triton/interpreter shell.

Dimension legend: `m` rows sorted by group, `k` contraction, `n` output width, `E` groups; `bm`, `bk`, `bn`
the blocks of `GmmBlockSizes`; `Mp`, `Kp`, `Np` the dims padded (with zeros, by the wrapper) to block
multiples; `V = Mp / bm + E - 1` the static number of visits (below).

Per-tile math (shared by both shells):
  * `masked_group_dot(x, w, rows, start, end)`: x [bm, bk] @ w [bk, bn] (or w^T with `transpose_rhs`,
    w [bn, bk]), kept only on the rows of one group, float32.
  * `masked_group_tdot(x, dy, rows, start, end)`: x[rows of the group]^T @ dy[rows of the group],
    x [bm, bk], dy [bm, bn] -> [bk, bn] float32.
A row tile that spans a group boundary is multiplied once per group it touches, each product masked to
that group's rows, so the sum over its groups is exact; rows past `sum(group_sizes)` belong to no
group and come out zero.

TPU shell (`gmm_tpu_kernel`, `tgmm_tpu_kernel`): fits VMEM by design. The wrapper lists *visits*, the
(row tile, group) pairs with rows in common, as scalar-prefetched int32 arrays in SMEM
(`pltpu.PrefetchScalarGridSpec`, built by `api.gmm_visits` / `api.tgmm_visits`): `visit_group`,
`visit_tile` and the group's row range `visit_start`, `visit_end` (empty, 0 and 0, for a visit that adds
nothing: a row tile past the last group, an empty group, the padding up to the static count V); gmm adds
`visit_lhs_tile`. Sum over row tiles of the groups each touches is at most Mp / bm + E - 1, hence V. The
BlockSpec index maps read these arrays, so every program holds one expert's tile, never all of them. A
visit without rows computes nothing, and its input index maps repeat the blocks of the last visit with
rows (gmm: at the last k tile), so Pallas issues no copy for it:

  gmm   grid (Np / bn "parallel", V "arbitrary", Kp / bk "arbitrary"), visits row-tile-major.
        Program (j, v, kt) holds lhs [bm, bk] (row tile `visit_lhs_tile[v]`, which is `visit_tile[v]`
        on a visit with rows; k tile kt), rhs [bk, bn] (expert `visit_group[v]`; [bn, bk] of the
        untransposed weight for the input gradient), the output tile [bm, bn] (row tile
        `visit_tile[v]`) and a float32 accumulator [bm, bn] in VMEM scratch, zeroed on a row tile's
        first visit at kt = 0 and written out on its last visit at the last kt.
  tgmm  grid (Kp / bk "parallel", Np / bn "parallel", V "arbitrary"), visits group-major (an empty
        group still gets one visit, so its gradient is written as zeros). Program (a, c, v) holds
        lhs [bm, bk], dy [bm, bn] (row tile `visit_tile[v]`), the output tile [bk, bn] of group
        `visit_group[v]` and a float32 accumulator [bk, bn], zeroed on the group's first visit and
        written on its last.

Triton / interpreter shell (`gmm_kernel`, `tgmm_kernel`; no scalar prefetch or scratch in Triton):
  gmm   grid (Mp / bm, Np / bn). Program (i, j) holds lhs [bm, Kp] and rhs [E, Kp, bn] (every
        group's column tile; GPUs load it through pointers, there is no VMEM to overflow) and loops
        over the groups row tile i touches (`tile_first[i]`, `tile_count[i]`, contiguous because rows
        are sorted by group) and over bk slices of the contraction.
  tgmm  grid (E, Kp / bk, Np / bn). Program (e, a, c) holds x [Mp, bk] and dy [Mp, bn] and loops over
        the row tiles that intersect group e; an empty group writes zeros.
  offsets_ref [E+1] int32 holds the group row offsets (cumulative group sizes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def masked_group_dot(x, w, rows, start, end, *, transpose_rhs: bool = False):
    """One tile of grouped compute: x [bm, bk] @ w [bk, bn] (w [bn, bk] transposed when `transpose_rhs`),
    float32, kept only on the rows in [start, end) (`rows` [bm, bn] absolute row numbers)."""
    contract = (((1,), (1,)) if transpose_rhs else ((1,), (0,)), ((), ()))
    y = jax.lax.dot_general(x, w, contract, preferred_element_type=jnp.float32)
    return jnp.where((rows >= start) & (rows < end), y, 0.0)


def masked_group_tdot(x, dy, rows, start, end):
    """One tile of the transposed grouped matmul: x^T @ dy over the rows in [start, end) only.

    x [bm, bk], dy [bm, bn], rows [bm, bk] absolute row numbers -> [bk, bn] float32. Masks x with
    `jnp.where` (interpreter padding may be NaN, and NaN * 0 is NaN)."""
    x = jnp.where((rows >= start) & (rows < end), x, jnp.zeros_like(x))
    return jax.lax.dot_general(x, dy, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------------------------------
# TPU shell: scalar-prefetched visits, one expert tile per program, contraction as a grid axis.


def _visit_bounds(key_ref, v, num_visits: int):
    """Whether visit v is the first / last of its run of equal `key_ref` values (a row tile or a group)."""
    key = key_ref[v]
    is_first = jnp.logical_or(v == 0, key_ref[jnp.maximum(v - 1, 0)] != key)
    is_last = jnp.logical_or(v == num_visits - 1, key_ref[jnp.minimum(v + 1, num_visits - 1)] != key)
    return is_first, is_last


def gmm_tpu_kernel(group_ref, tile_ref, start_ref, end_ref, lhs_tile_ref, lhs_ref, rhs_ref, out_ref, acc_ref, *,
                   num_visits: int, num_k_tiles: int, transpose_rhs: bool):
    del group_ref, lhs_tile_ref  # used by the index maps only
    v, kt = pl.program_id(1), pl.program_id(2)
    bm, bn = acc_ref.shape
    tile = tile_ref[v]
    start, end = start_ref[v], end_ref[v]
    is_first, is_last = _visit_bounds(tile_ref, v, num_visits)

    @pl.when(jnp.logical_and(is_first, kt == 0))
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(start < end)
    def _accumulate():
        rows = tile * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, bn), 0)
        acc_ref[...] += masked_group_dot(lhs_ref[...], rhs_ref[...], rows, start, end,
                                         transpose_rhs=transpose_rhs)

    @pl.when(jnp.logical_and(is_last, kt == num_k_tiles - 1))
    def _finalise():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def tgmm_tpu_kernel(group_ref, tile_ref, start_ref, end_ref, x_ref, dy_ref, out_ref, acc_ref, *,
                    num_visits: int):
    v = pl.program_id(2)
    bm, bk = x_ref.shape
    start, end = start_ref[v], end_ref[v]
    is_first, is_last = _visit_bounds(group_ref, v, num_visits)

    @pl.when(is_first)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(start < end)
    def _accumulate():
        rows = tile_ref[v] * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, bk), 0)
        acc_ref[...] += masked_group_tdot(x_ref[...], dy_ref[...], rows, start, end)

    @pl.when(is_last)
    def _finalise():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


# ----------------------------------------------------------------------------------------------------
# Triton / interpreter shell: loops inside the kernel, no scratch, no scalar prefetch.


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
        rows = off + jax.lax.broadcasted_iota(jnp.int32, (block_m, bk), 0)
        return acc + masked_group_tdot(x_ref[pl.ds(off, block_m), :], dy_ref[pl.ds(off, block_m), :], rows,
                                       start, end)

    acc = jax.lax.fori_loop(first_tile, last_tile, body, jnp.zeros((bk, bn), jnp.float32))
    out_ref[...] = acc.astype(out_ref.dtype)
