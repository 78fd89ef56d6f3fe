"""Public grouped matmul: `grouped_matmul(lhs, rhs, group_sizes, ...)` and its transpose `tgmm`.

Dimension legend: `m` rows sorted by group, `k` contraction, `n` output width, `E` groups.

`out[r] = lhs[r] @ rhs[g(r)]` where rows 0..gs[0]-1 belong to group 0, the next gs[1] to group 1,
...; rows past `sum(group_sizes)` give zeros (see `reference`). The dropless MoE layer calls it
with the token-expert assignments sorted by expert.

Implementations: "xla" is the reference `jax.lax.ragged_dot` (native on TPU/GPU; on CPU XLA
densifies it over all groups); "xla_tiled" is `reference.gmm_tiled`, a pure-XLA megablox analogue
(padding per group to a row tile, one batched matmul) that is the fast choice on CPU; "pallas",
"pallas_tpu", "pallas_triton" run the megablox-style kernel (`kernel.gmm_kernel`), with a
`jax.custom_vjp` whose backward is the same kernel on the transposed rhs for d_lhs and the
transposed-grouped-matmul kernel (`kernel.tgmm_kernel`) for d_rhs. None = the Pallas kernel on
TPU/GPU, "xla" on CPU.

TPU note: this shell keeps one column tile of every group's matrix, [E, Kp, block_n], resident in
VMEM (simple, and fine for the model sizes here); very large E * k needs the scalar-prefetch
(megablox) shell that indexes rhs blocks by group id, which is not written yet.
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
from pallas_kernels.grouped_matmul.kernel import gmm_kernel, tgmm_kernel

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


def _meta_spec(impl, shape, grid_rank):
    if impl == "pallas_tpu":
        return pl.BlockSpec(memory_space=pltpu.SMEM)
    zeros = (0,) * len(shape)
    return pl.BlockSpec(shape, lambda *idx: zeros)


def _gmm_pallas(lhs, rhs, group_sizes, bs: GmmBlockSizes, impl: str, interpret: bool):
    m, k = lhs.shape
    num_groups, _, n = rhs.shape
    mp, kp, np_ = _round_up(m, bs.block_m), _round_up(k, bs.block_k), _round_up(n, bs.block_n)
    x = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    w = jnp.pad(rhs, ((0, 0), (0, kp - k), (0, np_ - n)))
    offsets = _offsets(group_sizes)
    m_tiles = mp // bs.block_m
    first, count = _tile_metadata(offsets, m_tiles, bs.block_m)
    cost = gmm_cost(m=m, k=k, n=n, num_groups=num_groups, itemsize=lhs.dtype.itemsize, block_m=bs.block_m)
    kernel = functools.partial(gmm_kernel, block_k=bs.block_k, num_k_tiles=kp // bs.block_k)
    with _backend.quiet_triton_deprecation():
        out = pl.pallas_call(
            kernel,
            grid=(m_tiles, np_ // bs.block_n),
            in_specs=[
                _meta_spec(impl, (num_groups + 1,), 2),
                _meta_spec(impl, (m_tiles,), 2),
                _meta_spec(impl, (m_tiles,), 2),
                pl.BlockSpec((bs.block_m, kp), lambda i, j: (i, 0)),
                pl.BlockSpec((num_groups, kp, bs.block_n), lambda i, j: (0, 0, j)),
            ],
            out_specs=pl.BlockSpec((bs.block_m, bs.block_n), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((mp, np_), lhs.dtype),
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel", "parallel")),
            interpret=interpret,
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=0),
            name="grouped_matmul",
        )(offsets, first, count, x, w)
    return out[:m, :n]


def _tgmm_pallas(lhs, dy, group_sizes, bs: GmmBlockSizes, impl: str, interpret: bool):
    m, k = lhs.shape
    n = dy.shape[1]
    num_groups = group_sizes.shape[0]
    mp, kp, np_ = _round_up(m, bs.block_m), _round_up(k, bs.block_k), _round_up(n, bs.block_n)
    x = jnp.pad(lhs, ((0, mp - m), (0, kp - k)))
    g = jnp.pad(dy, ((0, mp - m), (0, np_ - n)))
    offsets = _offsets(group_sizes)
    cost = gmm_cost(m=m, k=k, n=n, num_groups=num_groups, itemsize=lhs.dtype.itemsize, block_m=bs.block_m)
    kernel = functools.partial(tgmm_kernel, block_m=bs.block_m)
    with _backend.quiet_triton_deprecation():
        out = pl.pallas_call(
            kernel,
            grid=(num_groups, kp // bs.block_k, np_ // bs.block_n),
            in_specs=[
                _meta_spec(impl, (num_groups + 1,), 3),
                pl.BlockSpec((mp, bs.block_k), lambda e, a, c: (0, a)),
                pl.BlockSpec((mp, bs.block_n), lambda e, a, c: (0, c)),
            ],
            out_specs=pl.BlockSpec((None, bs.block_k, bs.block_n), lambda e, a, c: (e, a, c)),
            out_shape=jax.ShapeDtypeStruct((num_groups, kp, np_), lhs.dtype),
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",) * 3),
            interpret=interpret,
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=0),
            name="tgmm",
        )(offsets, x, g)
    return out[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _gmm(lhs, rhs, group_sizes, bs, impl, interpret):
    return _gmm_pallas(lhs, rhs, group_sizes, bs, impl, interpret)


def _gmm_fwd(lhs, rhs, group_sizes, bs, impl, interpret):
    return _gmm(lhs, rhs, group_sizes, bs, impl, interpret), (lhs, rhs, group_sizes)


def _gmm_bwd(bs, impl, interpret, residuals, d_out):
    lhs, rhs, group_sizes = residuals
    d_out = d_out.astype(lhs.dtype)
    d_lhs = _gmm_pallas(d_out, jnp.swapaxes(rhs, 1, 2).astype(lhs.dtype), group_sizes, bs.transposed(), impl,
                        interpret)
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
    bs = block_sizes or GmmBlockSizes.default(m=m, k=k, n=rhs.shape[2], implementation=impl)
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
    bs = block_sizes or GmmBlockSizes.default(m=lhs.shape[0], k=lhs.shape[1], n=dy.shape[1], implementation=impl)
    bs.validate(impl)
    return _tgmm_pallas(lhs, dy.astype(lhs.dtype), group_sizes.astype(jnp.int32), bs, impl,
                        _backend.resolve_interpret(interpret))
