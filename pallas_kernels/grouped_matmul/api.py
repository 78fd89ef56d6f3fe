"""Public grouped matmul: `grouped_matmul(lhs, rhs, group_sizes, ...)` and its transpose `tgmm`.

Dimension legend: `m` rows sorted by group, `k` contraction, `n` output width, `E` groups.

`out[r] = lhs[r] @ rhs[g(r)]` where rows 0..gs[0]-1 belong to group 0, the next gs[1] to group 1,
...; rows past `sum(group_sizes)` give zeros (see `reference`). The dropless MoE layer calls it
with the token-expert assignments sorted by expert.

Implementations: "xla" is the reference `jax.lax.ragged_dot` (native on TPU/GPU; on CPU XLA
densifies it over all groups); "xla_tiled" is `reference.gmm_tiled`, a pure-XLA megablox analogue
(padding per group to a row tile, one batched matmul) that is the fast choice on CPU; "pallas",
"pallas_tpu", "pallas_triton" run the megablox-style kernels of `kernel` (a TPU shell and a
Triton/interpreter shell around the same per-tile math), with a `jax.custom_vjp` whose backward is the
same grouped matmul against rhs^T for d_lhs and the transposed grouped matmul (`tgmm`) for d_rhs.
None = the Pallas kernel on TPU/GPU, "xla" on CPU.

TPU: the kernels fit VMEM by design (grids and per-program blocks in `kernel`'s docstring): the wrapper
lists the (row tile, group) visits, at most Mp / block_m + E - 1 of them (`gmm_visits`, `tgmm_visits`),
as scalar-prefetched SMEM arrays; each program holds one expert's [block_k, block_n] weight tile (never
all E) and one row tile, and the contraction is a grid axis accumulated in a float32 VMEM scratch, so
VMEM does not grow with m, k, n or E. The input-gradient pass reads the weight [E, k, n] in [n, k]
blocks (no HBM transpose). Block sizes default to the largest that fit
`_backend.TPU_BLOCK_VMEM_BUDGET` (`GmmBlockSizes.default`).

Compiled ahead of time with the real TPU compiler for v5e:2x2 and v6e:2x2 (jax 0.10.2, libtpu
0.0.42.1, default block sizes, bf16; `python -m pallas_kernels.aot --only grouped_matmul` has the first
three): an MoE layer of 8 experts, 8192 routed tokens, up projection 2048 -> 5632 forward and
forward+backward and down projection 5632 -> 2048 forward (block 512 x 1024 x 512 / 512 x 512 x 1024);
the largest compiled, forward+backward: 8 experts 4096 -> 14336 and 14336 -> 4096 over 32768 rows
(Mixtral-sized), and 64 experts 2048 -> 1408 over 65536 rows. Triton shell: lowered for GPU, not run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _backend
from pallas_kernels.grouped_matmul import reference as ref
from pallas_kernels.grouped_matmul.config import GmmBlockSizes
from pallas_kernels.grouped_matmul.cost import gmm_cost
from pallas_kernels.grouped_matmul.kernel import gmm_kernel, gmm_tpu_kernel, tgmm_kernel, tgmm_tpu_kernel

__all__ = ["grouped_matmul", "tgmm", "IMPLEMENTATIONS"]

IMPLEMENTATIONS = _backend.IMPLEMENTATIONS + ("xla_tiled",)


def _round_up(x: int, b: int) -> int:
    return -(-x // b) * b


def _resolve(implementation):
    if implementation == "xla_tiled":
        return "xla_tiled"
    if implementation is not None and implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")
    return _backend.resolve_implementation(implementation)


def _offsets(group_sizes):
    gs = group_sizes.astype(jnp.int32)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(gs)])


def _tile_metadata(offsets, num_tiles: int, block_m: int):
    """First group and number of groups each row tile touches (0 for tiles past the total)."""
    ends = offsets[1:]
    total = offsets[-1]
    num_groups = ends.shape[0]
    row0 = jnp.arange(num_tiles, dtype=jnp.int32) * block_m
    row_last = jnp.minimum(row0 + block_m, total) - 1
    first = jnp.searchsorted(ends, row0, side="right").astype(jnp.int32)
    last = jnp.searchsorted(ends, row_last, side="right").astype(jnp.int32)
    count = jnp.where(row0 < total, last - first + 1, 0).astype(jnp.int32)
    return jnp.minimum(first, num_groups - 1), count


def _meta_spec(shape):
    """Triton shell: the whole metadata array as one block (Triton has no SMEM or scalar prefetch)."""
    zeros = (0,) * len(shape)
    return pl.BlockSpec(shape, lambda *idx: zeros)


def _cost_estimate(m, k, n, num_groups, itemsize, block_m):
    cost = gmm_cost(m=m, k=k, n=n, num_groups=num_groups, itemsize=itemsize, block_m=block_m)
    return pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed), transcendentals=0)


def _carry_last_valid(valid, *arrays):
    """Each array with its entries at invalid visits replaced by those of the last valid visit before
    (kept where there is none): an index map then repeats the previous block, and Pallas skips the copy."""
    v = jnp.arange(valid.shape[0], dtype=jnp.int32)
    last = jax.lax.cummax(jnp.where(valid, v, -1))
    src = jnp.where(last >= 0, last, v)
    return tuple(a[src] for a in arrays)


def gmm_visits(group_sizes, m_tiles: int, block_m: int):
    """Row-tile-major visits of the TPU gmm: (group, out tile, row start, row end, lhs tile), each [V] int32.

    V = m_tiles + E - 1 (static). Row tile i is visited once per group it touches (empty groups between
    them included; they add nothing) and once, with an empty row range, when it is past the last group;
    the remaining visits repeat the last row tile with an empty range. A visit with an empty range reads
    the lhs tile and the group of the last visit that had rows (its blocks are not fetched again).
    """
    offsets = _offsets(group_sizes)
    num_groups = group_sizes.shape[0]
    first, count = _tile_metadata(offsets, m_tiles, block_m)
    need = jnp.maximum(count, 1)
    ends = jnp.cumsum(need)
    v = jnp.arange(m_tiles + num_groups - 1, dtype=jnp.int32)
    tile = jnp.minimum(jnp.searchsorted(ends, v, side="right"), m_tiles - 1).astype(jnp.int32)
    r = v - (ends - need)[tile]
    valid = (v < ends[-1]) & (r < count[tile])
    group = jnp.minimum(first[tile] + jnp.where(valid, r, 0), num_groups - 1).astype(jnp.int32)
    start = jnp.where(valid, offsets[group], 0).astype(jnp.int32)
    end = jnp.where(valid, offsets[group + 1], 0).astype(jnp.int32)
    valid = start < end  # empty groups inside a tile's range add nothing either
    group, lhs_tile = _carry_last_valid(valid, group, tile)
    return group, tile, start, end, lhs_tile


def tgmm_visits(group_sizes, m_tiles: int, block_m: int):
    """Group-major visits of the TPU tgmm: (group, row tile, row start, row end), each [V] int32.

    V = m_tiles + E - 1 (static). Group e is visited once per row tile it intersects, an empty group once
    with an empty row range (so its output is written, as zeros); the remaining visits repeat the last
    group with an empty range. A visit with an empty range reads the row tile of the last visit that had
    rows (its blocks are not fetched again).
    """
    offsets = _offsets(group_sizes)
    num_groups = group_sizes.shape[0]
    g_start, g_end = offsets[:-1], offsets[1:]
    first_tile = g_start // block_m
    tiles = jnp.where(g_end > g_start, (g_end - 1) // block_m - first_tile + 1, 0)
    need = jnp.maximum(tiles, 1)
    ends = jnp.cumsum(need)
    v = jnp.arange(m_tiles + num_groups - 1, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(ends, v, side="right"), num_groups - 1).astype(jnp.int32)
    r = v - (ends - need)[group]
    valid = (v < ends[-1]) & (r < tiles[group])
    tile = jnp.minimum(first_tile[group] + jnp.where(valid, r, 0), m_tiles - 1).astype(jnp.int32)
    start = jnp.where(valid, g_start[group], 0).astype(jnp.int32)
    end = jnp.where(valid, g_end[group], 0).astype(jnp.int32)
    (tile,) = _carry_last_valid(valid, tile)
    return group, tile, start, end


def _gmm_tpu(lhs, rhs, group_sizes, bs: GmmBlockSizes, interpret: bool, transpose_rhs: bool):
    """TPU shell of gmm: lhs [m, k] times rhs [E, k, n] (rhs [E, n, k] read transposed when `transpose_rhs`)."""
    m, k = lhs.shape
    num_groups = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    if m == 0:
        return jnp.zeros((0, n), lhs.dtype)
    mp, kp, np_ = _round_up(m, bs.block_m), _round_up(k, bs.block_k), _round_up(n, bs.block_n)
    x = _backend.pad_axis(_backend.pad_axis(lhs, 0, mp), 1, kp)
    w = _backend.pad_axis(_backend.pad_axis(rhs, 1, np_ if transpose_rhs else kp), 2, kp if transpose_rhs else np_)
    m_tiles, k_tiles = mp // bs.block_m, kp // bs.block_k
    visits = gmm_visits(group_sizes, m_tiles, bs.block_m)
    num_visits = visits[0].shape[0]

    def k_tile(v, kt, start, end):  # a visit without rows stays on the last k tile: no new blocks
        return jnp.where(start[v] < end[v], kt, k_tiles - 1)

    def lhs_map(j, v, kt, g, t, start, end, lhs_tile):
        return lhs_tile[v], k_tile(v, kt, start, end)

    def rhs_map(j, v, kt, g, t, start, end, lhs_tile):
        return (g[v], j, k_tile(v, kt, start, end)) if transpose_rhs else (g[v], k_tile(v, kt, start, end), j)

    rhs_block = (None, bs.block_n, bs.block_k) if transpose_rhs else (None, bs.block_k, bs.block_n)
    kernel = functools.partial(gmm_tpu_kernel, num_visits=num_visits, num_k_tiles=k_tiles,
                               transpose_rhs=transpose_rhs)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5,
            grid=(np_ // bs.block_n, num_visits, k_tiles),
            in_specs=[pl.BlockSpec((bs.block_m, bs.block_k), lhs_map), pl.BlockSpec(rhs_block, rhs_map)],
            out_specs=pl.BlockSpec((bs.block_m, bs.block_n), lambda j, v, kt, g, t, *_: (t[v], j)),
            scratch_shapes=[pltpu.VMEM((bs.block_m, bs.block_n), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
        compiler_params=_backend.compiler_params("pallas_tpu",
                                                 dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        interpret=interpret,
        cost_estimate=_cost_estimate(m, k, n, num_groups, lhs.dtype.itemsize, bs.block_m),
        name="grouped_matmul",
    )(*visits, x, w)
    return out[:m, :n]


def _tgmm_tpu(lhs, dy, group_sizes, bs: GmmBlockSizes, interpret: bool):
    m, k = lhs.shape
    n = dy.shape[1]
    num_groups = group_sizes.shape[0]
    if m == 0:
        return jnp.zeros((num_groups, k, n), lhs.dtype)
    mp, kp, np_ = _round_up(m, bs.block_m), _round_up(k, bs.block_k), _round_up(n, bs.block_n)
    x = _backend.pad_axis(_backend.pad_axis(lhs, 0, mp), 1, kp)
    g = _backend.pad_axis(_backend.pad_axis(dy, 0, mp), 1, np_)
    visits = tgmm_visits(group_sizes, mp // bs.block_m, bs.block_m)
    num_visits = visits[0].shape[0]
    out = pl.pallas_call(
        functools.partial(tgmm_tpu_kernel, num_visits=num_visits),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(kp // bs.block_k, np_ // bs.block_n, num_visits),
            in_specs=[pl.BlockSpec((bs.block_m, bs.block_k), lambda a, c, v, grp, t, *_: (t[v], a)),
                      pl.BlockSpec((bs.block_m, bs.block_n), lambda a, c, v, grp, t, *_: (t[v], c))],
            out_specs=pl.BlockSpec((None, bs.block_k, bs.block_n), lambda a, c, v, grp, *_: (grp[v], a, c)),
            scratch_shapes=[pltpu.VMEM((bs.block_k, bs.block_n), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((num_groups, kp, np_), lhs.dtype),
        compiler_params=_backend.compiler_params("pallas_tpu",
                                                 dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=_cost_estimate(m, k, n, num_groups, lhs.dtype.itemsize, bs.block_m),
        name="tgmm",
    )(*visits, x, g)
    return out[:, :k, :n]


def _gmm_triton(lhs, rhs, group_sizes, bs: GmmBlockSizes, impl: str, interpret: bool):
    m, k = lhs.shape
    num_groups, _, n = rhs.shape
    mp, kp, np_ = _round_up(m, bs.block_m), _round_up(k, bs.block_k), _round_up(n, bs.block_n)
    x = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    w = jnp.pad(rhs, ((0, 0), (0, kp - k), (0, np_ - n)))
    offsets = _offsets(group_sizes)
    m_tiles = mp // bs.block_m
    first, count = _tile_metadata(offsets, m_tiles, bs.block_m)
    kernel = functools.partial(gmm_kernel, block_k=bs.block_k, num_k_tiles=kp // bs.block_k)
    with _backend.quiet_triton_deprecation():
        out = pl.pallas_call(
            kernel,
            grid=(m_tiles, np_ // bs.block_n),
            in_specs=[
                _meta_spec((num_groups + 1,)),
                _meta_spec((m_tiles,)),
                _meta_spec((m_tiles,)),
                pl.BlockSpec((bs.block_m, kp), lambda i, j: (i, 0)),
                pl.BlockSpec((num_groups, kp, bs.block_n), lambda i, j: (0, 0, j)),
            ],
            out_specs=pl.BlockSpec((bs.block_m, bs.block_n), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel", "parallel")),
            interpret=interpret,
            cost_estimate=_cost_estimate(m, k, n, num_groups, lhs.dtype.itemsize, bs.block_m),
            name="grouped_matmul",
        )(offsets, first, count, x, w)
    return out[:m, :n]


def _tgmm_triton(lhs, dy, group_sizes, bs: GmmBlockSizes, impl: str, interpret: bool):
    m, k = lhs.shape
    n = dy.shape[1]
    num_groups = group_sizes.shape[0]
    mp, kp, np_ = _round_up(m, bs.block_m), _round_up(k, bs.block_k), _round_up(n, bs.block_n)
    x = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    g = jnp.pad(dy, ((0, mp - m), (0, np_ - n)))
    offsets = _offsets(group_sizes)
    kernel = functools.partial(tgmm_kernel, block_m=bs.block_m)
    with _backend.quiet_triton_deprecation():
        out = pl.pallas_call(
            kernel,
            grid=(num_groups, kp // bs.block_k, np_ // bs.block_n),
            in_specs=[
                _meta_spec((num_groups + 1,)),
                pl.BlockSpec((mp, bs.block_k), lambda e, a, c: (0, a)),
                pl.BlockSpec((mp, bs.block_n), lambda e, a, c: (0, c)),
            ],
            out_specs=pl.BlockSpec((None, bs.block_k, bs.block_n), lambda e, a, c: (e, a, c)),
            out_shape=jax.ShapeDtypeStruct((num_groups, kp, np_), lhs.dtype),
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",) * 3),
            interpret=interpret,
            cost_estimate=_cost_estimate(m, k, n, num_groups, lhs.dtype.itemsize, bs.block_m),
            name="tgmm",
        )(offsets, x, g)
    return out[:, :k, :n]


def _gmm_pallas(lhs, rhs, group_sizes, bs: GmmBlockSizes, impl: str, interpret: bool):
    if impl == "pallas_tpu":
        return _gmm_tpu(lhs, rhs, group_sizes, bs, interpret, transpose_rhs=False)
    return _gmm_triton(lhs, rhs, group_sizes, bs, impl, interpret)


def _tgmm_pallas(lhs, dy, group_sizes, bs: GmmBlockSizes, impl: str, interpret: bool):
    if impl == "pallas_tpu":
        return _tgmm_tpu(lhs, dy, group_sizes, bs, interpret)
    return _tgmm_triton(lhs, dy, group_sizes, bs, impl, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _gmm(lhs, rhs, group_sizes, bs, impl, interpret):
    return _gmm_pallas(lhs, rhs, group_sizes, bs, impl, interpret)


def _gmm_fwd(lhs, rhs, group_sizes, bs, impl, interpret):
    return _gmm(lhs, rhs, group_sizes, bs, impl, interpret), (lhs, rhs, group_sizes)


def _gmm_bwd(bs, impl, interpret, residuals, d_out):
    lhs, rhs, group_sizes = residuals
    d_out = d_out.astype(lhs.dtype)
    if impl == "pallas_tpu":  # reads rhs [E, k, n] as [E, n, k] blocks inside the kernel
        d_lhs = _gmm_tpu(d_out, rhs.astype(lhs.dtype), group_sizes, bs.transposed(), interpret, transpose_rhs=True)
    else:
        d_lhs = _gmm_pallas(d_out, jnp.swapaxes(rhs, 1, 2).astype(lhs.dtype), group_sizes, bs.transposed(),
                            impl, interpret)
    d_rhs = _tgmm_pallas(lhs, d_out, group_sizes, bs, impl, interpret)
    return d_lhs.astype(lhs.dtype), d_rhs.astype(rhs.dtype), None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@functools.partial(jax.jit, static_argnames=("block_sizes", "implementation", "interpret", "tile"))
def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    block_sizes: GmmBlockSizes | None = None,
    implementation: str | None = None,
    interpret: bool | None = None,
    tile: int | None = None,
) -> jax.Array:
    """Grouped matmul `out[r] = lhs[r] @ rhs[group(r)]` over rows sorted by group.

    Args:
      lhs: [m, k] rows sorted by group.
      rhs: [E, k, n] one matrix per group (same dtype as lhs for the Pallas paths).
      group_sizes: [E] int rows per group, summing to at most m.
      block_sizes: Pallas tiling; default `GmmBlockSizes.default(...)`.
      implementation: None | "xla" | "xla_tiled" | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).
      tile: row tile of "xla_tiled" (default chosen from m and E).

    Returns:
      [m, n] in lhs's dtype (float32 accumulation). Differentiable in lhs and rhs.

    Raises:
      ValueError: bad shapes, dtypes, implementation name or block sizes.
    """
    ref.check_gmm_args(lhs, rhs, group_sizes)
    impl = _resolve(implementation)
    if impl == "xla":
        return ref.gmm_reference(lhs, rhs, group_sizes)
    if impl == "xla_tiled":
        return ref.gmm_tiled(lhs, rhs, group_sizes, tile=tile)
    if rhs.dtype != lhs.dtype:
        rhs = rhs.astype(lhs.dtype)
    m, k = lhs.shape
    bs = block_sizes or GmmBlockSizes.default(m=m, k=k, n=rhs.shape[2], implementation=impl,
                                              itemsize=lhs.dtype.itemsize)
    bs.validate(impl)
    bs.transposed().validate(impl)
    return _gmm(lhs, rhs, group_sizes.astype(jnp.int32), bs, impl, _backend.resolve_interpret(interpret))


@functools.partial(jax.jit, static_argnames=("block_sizes", "implementation", "interpret"))
def tgmm(
    lhs: jax.Array,
    dy: jax.Array,
    group_sizes: jax.Array,
    *,
    block_sizes: GmmBlockSizes | None = None,
    implementation: str | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Transposed grouped matmul `out[e] = lhs[rows of e]^T @ dy[rows of e]`: [m, k], [m, n] -> [E, k, n].

    The d_rhs of `grouped_matmul`. Implementations as there ("xla_tiled" uses the reference).
    """
    if lhs.ndim != 2 or dy.ndim != 2 or lhs.shape[0] != dy.shape[0]:
        raise ValueError(f"tgmm expects lhs [m, k] and dy [m, n] with the same m; got {lhs.shape}, {dy.shape}")
    impl = _resolve(implementation)
    if impl in ("xla", "xla_tiled"):
        return ref.tgmm_reference(lhs, dy, group_sizes)
    bs = block_sizes or GmmBlockSizes.default(m=lhs.shape[0], k=lhs.shape[1], n=dy.shape[1], implementation=impl,
                                              itemsize=lhs.dtype.itemsize)
    bs.validate(impl)
    return _tgmm_pallas(lhs, dy.astype(lhs.dtype), group_sizes.astype(jnp.int32), bs, impl,
                        _backend.resolve_interpret(interpret))
