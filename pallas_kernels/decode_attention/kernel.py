"""Split-K flash-decoding kernel body (shared by TPU, Triton and the interpreter).

One body serves dense and quantized decode: it is parameterized by a `TileLoader`, which says how a
`block_k`-key tile of K and V is read from the cache refs of one split (a plain slice for a dense
cache, `dense_tile_loader`; unpack-and-dequantize for a quantized one, `kv_quant.kernel.
quant_tile_loader`). Everything else (grid, tile loop, masking, the online softmax and the
outputs) is written once here.

Grid: (batch, num_splits). Program (i, j) reads the query heads of sequence i
(all key/value heads, each with its padded group of query heads) and the
j-th contiguous split of its KV cache, loops over `block_k`-key tiles with an
online softmax in float32 (`_common.online_softmax_step`), and writes the
*unnormalized* partial output plus the running max m and sum l per query row.
Tiles past the sequence length are skipped by the loop bound; the last partial
tile is masked with `jnp.where` (never a multiply: padding may hold NaN in the
interpreter).

Layouts inside the kernel:
  q_ref   [k, gp, d]        query heads grouped by KV head (gp = padded group)
  cache refs                this split of each cache array, all KV heads: [split, k, x]
                            (token-major "bskd"), [k, split, x] (head-major "bksd") or
                            [k, x, split] (tokens on lanes, "bkxs"); dense: k_ref, v_ref with x = d
  o_ref   [k, gp, d]  f32   unnormalized partial output
  m_ref, l_ref [k, gp, 1]   per-row statistics ([..., 1] keeps TPU block rules)

A loader may hand K and V over as channel sub-slices (widths `k_width`, `v_width`, dividing d, in
channel order): the query is then sliced to match once per KV head, the logits are the sum of the
sub-slice products and the output keeps one accumulator per V sub-slice, so no tile is ever
concatenated or reshaped inside the kernel (which keeps the body lowerable on both backends).
A *transposed* loader (`TileLoader.transposed`, for the "bkxs" layout) hands them over as [width,
block_k] (tokens on lanes): the logits are then `q @ k_t` and the output update `p @ v_t^T`, the same
math with the contractions on the other axis (`online_softmax_step(..., tokens_last=True)`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._common import MASK_VALUE, online_softmax_step

__all__ = ["TileLoader", "dense_tile_loader", "split_k_decode_kernel"]


@dataclasses.dataclass(frozen=True)
class TileLoader:
    """How the split-K decode kernel reads one tile of K and V.

    Attributes:
      load: `(cache_refs, h, rows) -> (k_parts, v_parts)`: the tile `rows` (a `pl.ds` of `block_k`
        keys within the split) of KV head `h` (a static int), as tuples of channel sub-slices in
        channel order, [block_k, k_width] and [block_k, v_width] each (one element for a plain tile).
      k_width, v_width: channels per K / V sub-slice (the head dim for a plain tile).
      transposed: the sub-slices come as [k_width, block_k] and [v_width, block_k] (tokens on the
        last axis, read from a "bkxs" cache) instead.
    """

    load: Callable
    k_width: int
    v_width: int
    transposed: bool = False


def _load_dense(cache_refs, h, rows, *, kv_layout: str):
    k_ref, v_ref = cache_refs
    if kv_layout == "bskd":
        return (k_ref[rows, h, :],), (v_ref[rows, h, :],)
    return (k_ref[h, rows, :],), (v_ref[h, rows, :],)


def dense_tile_loader(*, head_dim: int, kv_layout: str = "bskd") -> TileLoader:
    """A plain [block_k, d] slice of one head of K and of V (cache refs: k, v)."""
    return TileLoader(load=functools.partial(_load_dense, kv_layout=kv_layout), k_width=head_dim, v_width=head_dim)


def split_k_decode_kernel(len_ref, q_ref, *refs, tile_loader: TileLoader, block_k: int, split_len: int,
                          scale: float):
    """refs: the cache refs `tile_loader` reads, then o_ref, m_ref, l_ref."""
    *cache_refs, o_ref, m_ref, l_ref = refs
    i = pl.program_id(0)
    j = pl.program_id(1)
    length = len_ref[i]
    start = j * split_len
    num_tiles = split_len // block_k
    # lax.div (truncating) on a non-negative value: jnp's floor division lowers
    # through sign(), which Mosaic TPU cannot lower without a device.
    remaining = jnp.maximum(length - start, 0)
    live_tiles = jnp.minimum(jax.lax.div(remaining + block_k - 1, block_k), num_tiles)
    num_kv_heads, gp, d = q_ref.shape
    kw, vw = tile_loader.k_width, tile_loader.v_width
    v_offsets = range(0, d, vw)

    for h in range(num_kv_heads):  # static: each KV head with its query-head group
        if kw == d:
            q = (q_ref[h].astype(jnp.float32) * scale,)
        else:
            q = tuple(q_ref[h, :, pl.ds(c, kw)].astype(jnp.float32) * scale for c in range(0, d, kw))

        def body(t, carry, h=h, q=q):
            m, l, acc = carry
            offset = pl.multiple_of(t * block_k, block_k)
            k_parts, v_parts = tile_loader.load(cache_refs, h, pl.ds(offset, block_k))
            key_pos = start + offset + jax.lax.broadcasted_iota(jnp.int32, (gp, block_k), 1)
            if tile_loader.transposed:
                col_pos = start + offset + jax.lax.broadcasted_iota(jnp.int32, (vw, block_k), 1)
                v_parts = tuple(jnp.where(col_pos < length, vp.astype(jnp.float32), 0.0) for vp in v_parts)
                return online_softmax_step(q, tuple(k_parts), v_parts, key_pos < length, m, l, acc, tokens_last=True)
            row_pos = start + offset + jax.lax.broadcasted_iota(jnp.int32, (block_k, vw), 0)
            v_parts = tuple(jnp.where(row_pos < length, vp.astype(jnp.float32), 0.0) for vp in v_parts)
            return online_softmax_step(q, tuple(k_parts), v_parts, key_pos < length, m, l, acc)

        init = (jnp.full((gp, 1), MASK_VALUE, jnp.float32), jnp.zeros((gp, 1), jnp.float32),
                tuple(jnp.zeros((gp, vw), jnp.float32) for _ in v_offsets))
        m, l, acc = jax.lax.fori_loop(0, live_tiles, body, init)
        if vw == d:
            o_ref[h] = acc[0]
        else:
            for c, a in zip(v_offsets, acc):
                o_ref[h, :, pl.ds(c, vw)] = a
        m_ref[h] = m
        l_ref[h] = l
