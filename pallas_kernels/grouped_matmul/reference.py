"""References of the grouped matmul (the definition of correctness) and an XLA tiled formulation.

Dimension legend: `m` rows (token-expert assignments sorted by group), `k` contraction width,
`n` output width, `E` groups (experts).

Contract shared by every implementation: `lhs` [m, k] holds the rows of group 0, then group 1, ...
(`group_sizes` [E] int, summing to at most m); `rhs` [E, k, n] one matrix per group; the output
[m, n] has `out[r] = lhs[r] @ rhs[g(r)]` for the group g(r) that row r falls in, and zeros for
rows past `sum(group_sizes)`. Accumulation is float32; the output has lhs's dtype.

  * `gmm_reference`: `jax.lax.ragged_dot` (native on TPU/GPU; on XLA:CPU it is lowered as a
    masked dense contraction over all E groups, i.e. E times the useful FLOPs).
  * `gmm_dense_reference`: the same maths as an explicit masked einsum (an independent check,
    and float64-capable).
  * `tgmm_reference`: the transposed grouped matmul of the backward pass,
    `d_rhs[e] = lhs[rows of e]^T @ dy[rows of e]` -> [E, k, n] (`lax.ragged_dot_general` with a
    ragged contracting dimension).
  * `gmm_tiled`: a pure-XLA megablox analogue: every group is padded to a multiple of `tile` rows,
    each row tile multiplies its one group's matrix (a batched matmul over gathered weights), so
    the FLOPs are those of the real rows plus at most E * tile padding rows instead of E times
    all rows. Differentiable by plain autodiff.

References:
  Gale, Narayanan, Young, Zaharia, "MegaBlocks: Efficient Sparse Training with Mixture-of-Experts",
    arXiv:2211.15841, 2022.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["check_gmm_args", "gmm_reference", "gmm_dense_reference", "tgmm_reference", "gmm_tiled", "group_ids"]


def check_gmm_args(lhs, rhs, group_sizes) -> None:
    """ValueErrors for the shapes and dtypes of a grouped matmul call."""
    if lhs.ndim != 2:
        raise ValueError(f"lhs must be [m, k]; got shape {lhs.shape}")
    if rhs.ndim != 3 or rhs.shape[1] != lhs.shape[1]:
        raise ValueError(f"rhs must be [E, k, n] with k={lhs.shape[1]} (lhs {lhs.shape}); got {rhs.shape}")
    if group_sizes.shape != (rhs.shape[0],):
        raise ValueError(f"group_sizes must have shape [E]=({rhs.shape[0]},); got {group_sizes.shape}")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"group_sizes must be an integer array; got dtype {group_sizes.dtype}")


def group_ids(group_sizes: jax.Array, m: int) -> jax.Array:
    """[m] group of each row (E for rows past the total)."""
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    return jnp.searchsorted(ends, jnp.arange(m, dtype=jnp.int32), side="right").astype(jnp.int32)


def _zero_tail(out, group_sizes):
    total = jnp.sum(group_sizes.astype(jnp.int32))
    return jnp.where(jnp.arange(out.shape[0])[:, None] < total, out, 0)


def gmm_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """`jax.lax.ragged_dot` with float32 accumulation; rows past the total are zero."""
    check_gmm_args(lhs, rhs, group_sizes)
    out = jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32), preferred_element_type=jnp.float32)
    return _zero_tail(out, group_sizes).astype(lhs.dtype)


def gmm_dense_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Masked einsum over all groups (accumulates in float32, or float64 for float64 inputs)."""
    check_gmm_args(lhs, rhs, group_sizes)
    acc = jnp.promote_types(lhs.dtype, jnp.float32)
    onehot = jax.nn.one_hot(group_ids(group_sizes, lhs.shape[0]), rhs.shape[0], dtype=acc)  # [m, E]
    out = jnp.einsum("mk,ekn,me->mn", lhs.astype(acc), rhs.astype(acc), onehot)
    return out.astype(lhs.dtype)


def tgmm_reference(lhs: jax.Array, dy: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Transposed grouped matmul: [m, k], [m, n] -> [E, k, n] with `out[e] = lhs_e^T dy_e`."""
    if lhs.ndim != 2 or dy.ndim != 2 or lhs.shape[0] != dy.shape[0]:
        raise ValueError(f"tgmm expects lhs [m, k] and dy [m, n] with the same m; got {lhs.shape}, {dy.shape}")
    if group_sizes.ndim != 1:
        raise ValueError(f"group_sizes must be [E]; got shape {group_sizes.shape}")
    dims = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([0], [0]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
    out = jax.lax.ragged_dot_general(lhs, dy, group_sizes.astype(jnp.int32), dims,
                                     preferred_element_type=jnp.float32)
    return out.astype(lhs.dtype)


def gmm_tiled(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, tile: int | None = None) -> jax.Array:
    """Grouped matmul in plain XLA with per-group padding to `tile` rows (see the module docstring).

    Args:
      lhs, rhs, group_sizes: as `gmm_reference`.
      tile: rows per tile (default: a power of two near m / (2E), between 8 and 256).
    """
    check_gmm_args(lhs, rhs, group_sizes)
    m, k = lhs.shape
    num_groups = rhs.shape[0]
    if tile is None:
        tile = 1 << max(3, min(8, (max(m // (2 * num_groups), 1)).bit_length() - 1))
    if tile < 1:
        raise ValueError(f"tile must be >= 1; got {tile}")
    gs = group_sizes.astype(jnp.int32)
    padded = (gs + tile - 1) // tile * tile
    starts = jnp.cumsum(gs) - gs
    pstarts = jnp.cumsum(padded) - padded
    num_tiles = -(-m // tile) + num_groups  # static bound: sum ceil(g/tile) <= ceil(m/tile) + E
    rows = num_tiles * tile
    g = group_ids(gs, m)
    gc = jnp.minimum(g, num_groups - 1)
    dest = jnp.where(g < num_groups, pstarts[gc] + jnp.arange(m) - starts[gc], rows)  # rows past the total: dropped
    x = jnp.zeros((rows, k), lhs.dtype).at[dest].set(lhs, mode="drop")
    tile_group = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(num_tiles) * tile, side="right")
    w = jnp.take(rhs, jnp.minimum(tile_group, num_groups - 1), axis=0)  # [T, k, n]
    y = jnp.einsum("tik,tkn->tin", x.reshape(num_tiles, tile, k), w, preferred_element_type=jnp.float32)
    y = y.reshape(rows, -1)
    out = jnp.take(y, jnp.minimum(dest, rows - 1), axis=0)
    return jnp.where((g < num_groups)[:, None], out, 0).astype(lhs.dtype)
