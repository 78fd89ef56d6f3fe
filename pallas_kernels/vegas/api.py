"""Public Vegas ops: `verify_attention(q, k, v, q_positions, rows=...)` and
`sparse_decode_attention(q, k, v, indices, valid, recent_start, lengths, max_recent=...)`.

Dimension legend: `b` batch, `t` verification tokens (gamma + 1), `h` query heads, `kh` KV heads
(h % kh == 0), `S` cache capacity, `d` head dim, `R` kept score rows, `K` index-list length.

`verify_attention` is causal attention of `t` new queries over the whole cache (the queries' own keys
already written), i.e. `primitives.attention.attention(q, k, v, causal=True, q_positions=...)`, that
also returns
  * `lse` [b, h, t]: the float32 logsumexp of the scaled, masked logits of every row, and
  * `scores` [b, h, R, S]: the raw (unscaled) scores ``q . k`` of the rows ``rows`` (static, each in
    [0, t)), float32, ``-inf`` at keys the row cannot see (``j > q_positions[b, r]``).
Vegas turns these into per-key importance (`algorithms.decoding.vegas.key_importance`).

`sparse_decode_attention` is one query per sequence attending to the union of the keys
``indices[b, i]`` where ``valid[b, i]`` and the contiguous range ``[recent_start[b], lengths[b])``.
Indices must be unique; those at or past ``recent_start`` are ignored (the range covers them). The
range must hold at most ``max_recent`` keys (the caller's static bound; a longer range is cut to its
first ``max_recent`` keys). A sequence with nothing to attend gives zeros (and lse -inf).

The "xla" implementation of `sparse_decode_attention` gathers the K listed keys and a `max_recent`
window and attends over those K + max_recent entries only, so it reads O(K) cache rows instead of
O(S); `sparse_decode_reference` is the dense masked attention it is tested against.

Pallas implementations ("pallas", "pallas_tpu", "pallas_triton"; see `kernel.py` for the bodies):

  * `verify_attention`: split-K flash decoding whose query block is the g * t rows of one KV head
    (g = h // kh query heads times t tokens, padded to a multiple of 8 on TPU and to a power of two
    >= 16 on Triton), grid (batch, KV heads, cache splits), causal mask by position, online softmax
    in float32. The R * g score rows are a second small query block; each KV tile also yields their
    raw ``q . k`` tile, written into the [R g, split] score block of the program. The splits' partial
    (out, m, l) are merged by log-sum-exp (`primitives.attention.combine_partials`). A cache that is
    not a multiple of the tiling is zero-padded and masked by position.
  * `sparse_decode_attention`: the gather is done by XLA before the kernel. The wrapper builds the
    same compact [b, K + max_recent, kh, d] buffer as the "xla" path (`_compact_rows`: jnp indexing
    of the K listed rows and the recent window, plus the validity vector), and the Pallas kernel runs
    GQA flash decoding with the validity mask over that buffer, tiled (and split) over the compact
    axis. This design is portable (Triton has no scalar prefetch, TPU has no vector gather) at the
    cost of materializing the K + W gathered rows once. Future work: a TPU variant that
    scalar-prefetches the indices (`PrefetchScalarGridSpec`) and DMAs the listed pages straight from
    the cache, skipping the compact buffer.

On CPU `implementation=None` resolves to "xla" (the interpreter is slower than XLA); on TPU and GPU
it resolves to the Pallas kernel of that backend (`pallas_kernels._backend.resolve_implementation`).

Largest compiled shapes (`pallas_kernels.aot`'s cases, S the cache length):
  * `verify_attention` (t = 5, rows (0, 4)): Compiles for TPU (libtpu 0.0.42.1, batch 8, 32/8 heads,
    d 128, bf16) up to 128k tokens on v5e and 256k on v6e; beyond, HBM: 17.00 GiB of temporaries
    > 15.75 GiB on v5e, 34.05 GiB > 31.25 GiB on v6e. The wrapper's [b, S, kh, d] -> [b, S, kh d]
    reshape of K and V is a relayout copy on TPU (the (8, 128) tiles change planes): as large as the
    cache (1 GiB at 32k), plus the [b, h, R, S] float32 scores. (With the 2 splits the default had
    before `_verify_tpu_bytes_per_key`, 64k failed on both: Mosaic's scoped VMEM, 34M.)
  * `sparse_decode_attention` (K = 2048 listed keys, max_recent 64): Compiles for TPU (libtpu 0.0.42.1,
    batch 8, 32/8 heads, d 128, bf16) up to 256k tokens on v5e and 512k on v6e (the largest tried);
    beyond, on v5e the cache alone (K and V: 16.0 GiB at 512k) exceeds the chip's 16 GiB of HBM (not
    compiled). It reads only the K + max_recent gathered rows, so S costs HBM, not VMEM.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _backend
from pallas_kernels.vegas.config import SparseDecodeBlockSizes, VerifyBlockSizes
from pallas_kernels.vegas.cost import sparse_decode_cost, verify_cost
from pallas_kernels.vegas.kernel import sparse_decode_kernel, verify_kernel
from primitives import attention as attn_ref

__all__ = ["VerifyOutput", "verify_attention", "verify_reference", "sparse_decode_attention",
           "sparse_decode_reference", "sparse_decode_mask"]


class VerifyOutput(NamedTuple):
    """out [b, t, h, d] (q's dtype), lse [b, h, t] float32, scores [b, h, R, S] float32."""

    out: jax.Array
    lse: jax.Array
    scores: jax.Array


def _check_cache(name: str, q_heads: int, d: int, b: int, k: jax.Array, v: jax.Array, kv_layout: str) -> None:
    if k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"{name}: k and v must be [{', '.join(kv_layout)}] of the same shape; got k {k.shape}, "
                         f"v {v.shape}")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"{name}: q and k disagree on batch or head dim; got b={b}, d={d}, k {k.shape}")
    kh = attn_ref.kv_tokens_heads(k.shape, kv_layout)[1]
    if q_heads % kh:
        raise ValueError(f"{name}: query heads ({q_heads}) must be a multiple of KV heads ({kh})")


def _check_rows(rows: tuple[int, ...], t: int) -> tuple[int, ...]:
    rows = tuple(int(r) for r in rows)
    if not rows or any(not 0 <= r < t for r in rows):
        raise ValueError(f"rows must be a non-empty tuple of query rows in [0, t={t}); got {rows}")
    return rows


def verify_reference(q: jax.Array, k: jax.Array, v: jax.Array, q_positions: jax.Array, *,
                     rows: tuple[int, ...], scale: float, kv_layout: str = "bskd") -> VerifyOutput:
    """Dense causal attention (`primitives.attention`) plus the raw score rows, all in float32."""
    b, t, h, d = q.shape
    s, kh = attn_ref.kv_tokens_heads(k.shape, kv_layout)
    res = attn_ref.attention(q, k, v, causal=True, q_positions=q_positions, scale=scale, return_lse=True,
                             kv_layout=kv_layout)
    qr = q[:, list(rows)].astype(jnp.float32).reshape(b, len(rows), kh, h // kh, d)
    raw = jnp.einsum(f"brkgd,{kv_layout}->bkgrs", qr, k.astype(jnp.float32)).reshape(b, h, len(rows), s)
    visible = jnp.arange(s)[None, None, None, :] <= q_positions[:, list(rows)][:, None, :, None]
    return VerifyOutput(res.out, res.lse, jnp.where(visible, raw, -jnp.inf))


def _heads_per_program(kv_heads: int, d: int, implementation: str) -> int:
    """KV heads per grid program: 1, except on TPU when the [keys, d] column block breaks the lane rule."""
    if implementation == "pallas_tpu" and d % 128 and kv_heads > 1:
        return kv_heads  # the block spans all kh * d columns (the full dim), heads looped in the kernel
    return 1


def _check_head_dim(name: str, d: int, implementation: str) -> None:
    if implementation == "pallas_triton" and (not _backend.is_power_of_two(d) or d < 16):
        raise ValueError(f"{name}: Triton needs the head dim d to be a power of two >= 16; got d={d}")


def _verify_heads_per_program(kv_heads: int, implementation: str, kv_layout: str) -> int:
    """KV heads per verify program: 1, except on TPU over a token-major cache, whose [keys, heads, d]
    block must span every KV head (TPU's tiling rule for the second-minor block dim)."""
    return kv_heads if implementation == "pallas_tpu" and kv_layout == "bskd" else 1


def _verify_tpu_bytes_per_key(q, k, rows, impl, kv_layout) -> int:
    """VMEM one cache key takes in a verify program's blocks on TPU, double-buffered: its K and V rows of
    hp heads [hp, d] and its float32 score rows [hp, Rp]. (Batch 8, t 5, 32/8 heads, d 128, 2 score rows,
    one head per program: 1088 bytes; Mosaic's scoped allocation for 32768 keys was 34.00M.)"""
    b, t, h, d = q.shape
    kh = attn_ref.kv_tokens_heads(k.shape, kv_layout)[1]
    hp = _verify_heads_per_program(kh, impl, kv_layout)
    srp = _backend.padded_rows(h // kh * len(rows), impl)
    return 2 * (2 * hp * d * k.dtype.itemsize + hp * srp * 4)


def _split_layout(keys: int, block_k: int, num_splits: int, implementation: str) -> tuple[int, int]:
    """(split_len, padded keys): whole tiles per split; a power of two per split on Triton (block rule)."""
    tiles = max(1, -(-keys // block_k))
    per_split = -(-tiles // num_splits)
    if implementation == "pallas_triton":
        per_split = _backend.next_power_of_two(per_split)
    split_len = per_split * block_k
    return split_len, split_len * num_splits


def _merge_splits(o: jax.Array, m: jax.Array, l: jax.Array):
    """[b, splits, ...] unnormalized partials and stats -> (out [b, ..., d] f32, lse [b, ...]); empty -> 0, -inf."""
    safe_l = jnp.where(l > 0, l, 1.0)
    part = o / safe_l[..., None]
    part_lse = jnp.where(l > 0, m + jnp.log(safe_l), -jnp.inf)
    merged = attn_ref.combine_partials(jnp.moveaxis(part, 1, 0), jnp.moveaxis(part_lse, 1, 0))
    return merged.out, merged.lse


def _scalar_spec(implementation: str, b: int):
    """A per-sequence int32 vector: SMEM on TPU (scalar reads), a whole-array block elsewhere."""
    if implementation == "pallas_tpu":
        return pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.BlockSpec((b,), lambda i, hh, j: (0,))


def _verify_pallas(q, k, v, q_positions, *, rows, scale, bs, impl, interpret, kv_layout) -> VerifyOutput:
    """Pallas shell of `verify_attention` (see `kernel.verify_kernel`)."""
    b, t, h, d = q.shape
    s, kh = attn_ref.kv_tokens_heads(k.shape, kv_layout)
    g, r = h // kh, len(rows)
    n_rows, n_srows = g * t, g * r
    rp, srp = _backend.padded_rows(n_rows, impl), _backend.padded_rows(n_srows, impl)
    hp = _verify_heads_per_program(kh, impl, kv_layout)
    pos = q_positions.astype(jnp.int32)
    # Rows of one KV head, head-major: row gi * t + ti is query head kv * g + gi at token ti.
    qg = _backend.pad_axis(q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, n_rows, d), 2, rp)
    qpos = _backend.pad_axis(jnp.tile(pos, (1, g)), 1, rp, -1)[..., None]  # [b, rp, 1]; padding rows see nothing
    # Score rows: row gi * R + ri is query head kv * g + gi at token rows[ri].
    qs = q[:, list(rows)].reshape(b, r, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, n_srows, d)
    qs = _backend.pad_axis(qs, 2, srp)
    spos = _backend.pad_axis(jnp.tile(pos[:, list(rows)], (1, g)), 1, srp, -1)[..., None]  # [b, Rp, 1]
    n_keys = jnp.clip(jnp.max(pos, axis=1) + 1, 0, s)  # [b]: tiles past the last visible key are skipped
    split_len, sp = _split_layout(s, bs.block_k, bs.num_splits, impl)
    token_axis = attn_ref.kv_token_axis(kv_layout)
    kf = _backend.pad_axis(k, token_axis, sp)  # padded keys are masked by position (>= S)
    vf = _backend.pad_axis(v, token_axis, sp)
    if kv_layout == "bskd":
        kv_spec = pl.BlockSpec((None, split_len, hp, d), lambda i, hh, j: (i, j, hh, 0))
    else:
        kv_spec = pl.BlockSpec((None, hp, split_len, d), lambda i, hh, j: (i, hh, j, 0))

    cost = verify_cost(batch=b, q_len=t, num_heads=h, num_kv_heads=kh, kv_len=s, head_dim=d, score_rows=r,
                       kv_itemsize=k.dtype.itemsize, q_itemsize=q.dtype.itemsize)
    kernel = functools.partial(verify_kernel, block_k=bs.block_k, split_len=split_len, kv_len=s, scale=scale,
                               kv_layout=kv_layout)
    stat = jax.ShapeDtypeStruct((b, bs.num_splits, kh, rp, 1), jnp.float32)
    stat_spec = pl.BlockSpec((None, None, hp, rp, 1), lambda i, hh, j: (i, j, hh, 0, 0))
    with _backend.quiet_triton_deprecation():
        o, m, l, sc = pl.pallas_call(
            kernel,
            grid=(b, kh // hp, bs.num_splits),
            in_specs=[
                _scalar_spec(impl, b),
                pl.BlockSpec((None, hp, rp, d), lambda i, hh, j: (i, hh, 0, 0)),
                pl.BlockSpec((None, rp, 1), lambda i, hh, j: (i, 0, 0)),
                pl.BlockSpec((None, hp, srp, d), lambda i, hh, j: (i, hh, 0, 0)),
                pl.BlockSpec((None, srp, 1), lambda i, hh, j: (i, 0, 0)),
                kv_spec,
                kv_spec,
            ],
            out_specs=[
                pl.BlockSpec((None, None, hp, rp, d), lambda i, hh, j: (i, j, hh, 0, 0)),
                stat_spec,
                stat_spec,
                pl.BlockSpec((None, hp, srp, split_len), lambda i, hh, j: (i, hh, 0, j)),
            ],
            out_shape=[jax.ShapeDtypeStruct((b, bs.num_splits, kh, rp, d), jnp.float32), stat, stat,
                       jax.ShapeDtypeStruct((b, kh, srp, sp), jnp.float32)],
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",) * 3),
            interpret=_backend.resolve_interpret(interpret),
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="vegas_verify_attention",
        )(n_keys, qg, qpos, qs, spos, kf, vf)

    o = o[:, :, :, :n_rows].reshape(b, bs.num_splits, kh, g, t, d)
    m = m[:, :, :, :n_rows, 0].reshape(b, bs.num_splits, kh, g, t)
    l = l[:, :, :, :n_rows, 0].reshape(b, bs.num_splits, kh, g, t)
    out, lse = _merge_splits(o, m, l)  # [b, kh, g, t, d], [b, kh, g, t]
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
    scores = sc[:, :, :n_srows, :s].reshape(b, kh, g, r, s).reshape(b, h, r, s)
    return VerifyOutput(out.astype(q.dtype), lse.reshape(b, h, t), scores)


@functools.partial(jax.jit, static_argnames=("rows", "scale", "implementation", "interpret", "block_sizes",
                                             "kv_layout"))
def verify_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_positions: jax.Array, *,
                     rows: tuple[int, ...] = (0,), scale: float | None = None,
                     implementation: str | None = None, interpret: bool | None = None,
                     block_sizes: VerifyBlockSizes | None = None, kv_layout: str = "bskd") -> VerifyOutput:
    """Causal attention of the verification block with its score rows and logsumexp.

    Args:
      q: [b, t, h, d] queries of the verification tokens.
      k, v: [b, S, kh, d] the cache with these tokens' keys and values written ([b, kh, S, d] when
        kv_layout="bksd").
      q_positions: [b, t] int positions of the queries (key j is visible to row r iff j <= position).
      rows: static query rows whose raw scores are returned (e.g. (0, t - 1)).
      scale: logit scale (default 1/sqrt(d)).
      implementation: None | "xla" (the reference) | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU); unused by "xla".
      block_sizes: Pallas tiling; default `VerifyBlockSizes.default(...)`; unused by "xla".
      kv_layout: "bskd" or "bksd", the cache's axis order, read as stored by both paths.

    Returns:
      VerifyOutput.
    """
    if q.ndim != 4:
        raise ValueError(f"verify_attention: q must be [b, t, h, d]; got shape {q.shape}")
    b, t, h, d = q.shape
    _check_cache("verify_attention", h, d, b, k, v, kv_layout)
    if q_positions.shape != (b, t):
        raise ValueError(f"verify_attention: q_positions must be [b, t]=({b}, {t}); got {q_positions.shape}")
    rows = _check_rows(rows, t)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    impl = _backend.resolve_implementation(implementation)
    if impl == "xla":
        res = verify_reference(q, k, v, q_positions, rows=rows, scale=scale, kv_layout=kv_layout)
        return res._replace(out=res.out.astype(q.dtype))
    _check_head_dim("verify_attention", d, impl)
    s, kh = attn_ref.kv_tokens_heads(k.shape, kv_layout)
    bs = block_sizes or VerifyBlockSizes.default(
        seq_len=s, batch=b, kv_heads=kh, implementation=impl,
        tpu_bytes_per_key=_verify_tpu_bytes_per_key(q, k, rows, impl, kv_layout))
    if not isinstance(bs, VerifyBlockSizes):
        raise ValueError(f"verify_attention: block_sizes must be a VerifyBlockSizes; got {type(bs).__name__}")
    bs.validate(impl)
    return _verify_pallas(q, k, v, q_positions, rows=rows, scale=scale, bs=bs, impl=impl, interpret=interpret,
                          kv_layout=kv_layout)


def _check_sparse(q, k, v, indices, valid, recent_start, lengths, kv_layout):
    if q.ndim != 3:
        raise ValueError(f"sparse_decode_attention: q must be [b, h, d]; got shape {q.shape}")
    b, h, d = q.shape
    _check_cache("sparse_decode_attention", h, d, b, k, v, kv_layout)
    if indices.ndim != 2 or indices.shape[0] != b or valid.shape != indices.shape:
        raise ValueError(f"sparse_decode_attention: indices and valid must be [b, K] with b={b}; got indices "
                         f"{indices.shape}, valid {valid.shape}")
    for name, a in (("recent_start", recent_start), ("lengths", lengths)):
        if a.shape != (b,):
            raise ValueError(f"sparse_decode_attention: {name} must have shape [b]=({b},); got {a.shape}")


def sparse_decode_mask(indices: jax.Array, valid: jax.Array, recent_start: jax.Array, lengths: jax.Array,
                       capacity: int, max_recent: int) -> jax.Array:
    """[b, S] bool: the listed keys below recent_start, plus [recent_start, min(lengths, start + max_recent))."""
    b = indices.shape[0]
    pos = jnp.arange(capacity)[None, :]
    listed = valid & (indices < recent_start[:, None]) & (indices >= 0)
    chosen = jnp.zeros((b, capacity), bool).at[jnp.arange(b)[:, None], indices].max(listed, mode="drop")
    end = jnp.minimum(lengths, recent_start + max_recent)[:, None]
    return chosen | ((pos >= recent_start[:, None]) & (pos < end))


def sparse_decode_reference(q: jax.Array, k: jax.Array, v: jax.Array, indices: jax.Array, valid: jax.Array,
                            recent_start: jax.Array, lengths: jax.Array, *, max_recent: int,
                            scale: float, kv_layout: str = "bskd") -> attn_ref.AttentionOutput:
    """Dense attention over the whole cache with the boolean mask of the attended set (float32)."""
    capacity = attn_ref.kv_tokens_heads(k.shape, kv_layout)[0]
    mask = sparse_decode_mask(indices, valid, recent_start, lengths, capacity, max_recent)
    res = attn_ref.attention(q[:, None], k, v, mask=mask[:, None, None, :], scale=scale, return_lse=True,
                             kv_layout=kv_layout)
    return attn_ref.AttentionOutput(res.out[:, 0], res.lse[..., 0])


def _compact_rows(k, v, indices, valid, recent_start, lengths, *, max_recent: int, kv_layout: str = "bskd"):
    """The K listed cache rows and the max_recent window gathered by XLA (jnp indexing).

    Returns (kg, vg [b, K + W, kh, d], ok [b, K + W] bool): ok drops invalid entries, listed keys at or
    past recent_start (the window covers them) and window slots at or past the length or the capacity.
    A "bksd" cache is gathered along its token axis (only the K + W rows move).
    """
    b, s = k.shape[0], attn_ref.kv_tokens_heads(k.shape, kv_layout)[0]
    rows = jnp.arange(b)[:, None]
    window = recent_start[:, None] + jnp.arange(max_recent)[None, :]
    idx = jnp.concatenate([jnp.clip(indices, 0, s - 1), jnp.clip(window, 0, s - 1)], axis=1)  # [b, K + W]
    ok = jnp.concatenate([valid & (indices >= 0) & (indices < recent_start[:, None]),
                          (window < lengths[:, None]) & (window < s)], axis=1)
    if kv_layout == "bskd":
        return k[rows, idx], v[rows, idx], ok
    heads = jnp.arange(k.shape[1])[None, :, None]
    kg, vg = (jnp.swapaxes(x[rows[:, :, None], heads, idx[:, None, :]], 1, 2) for x in (k, v))
    return kg, vg, ok


def _gathered(q, k, v, indices, valid, recent_start, lengths, *, max_recent: int, scale: float, kv_layout: str):
    """Attention over the K listed keys and a max_recent window, reading only those cache rows."""
    kg, vg, ok = _compact_rows(k, v, indices, valid, recent_start, lengths, max_recent=max_recent,
                               kv_layout=kv_layout)
    res = attn_ref.attention(q[:, None], kg, vg, mask=ok[:, None, None, :], scale=scale, return_lse=True)
    return attn_ref.AttentionOutput(res.out[:, 0], res.lse[..., 0])


def _sparse_pallas(q, k, v, indices, valid, recent_start, lengths, *, max_recent, scale, bs, impl, interpret,
                   kv_layout):
    """Pallas shell of `sparse_decode_attention`: XLA gather, then `kernel.sparse_decode_kernel`."""
    b, h, d = q.shape
    kg, vg, ok = _compact_rows(k, v, indices, valid, recent_start, lengths, max_recent=max_recent,
                               kv_layout=kv_layout)
    kh = kg.shape[2]
    g = h // kh
    gp = _backend.padded_rows(g, impl)
    hp = _heads_per_program(kh, d, impl)
    n = kg.shape[1]
    split_len, np_ = _split_layout(n, bs.block_k, bs.num_splits, impl)
    kf = _backend.pad_axis(kg, 1, np_).reshape(b, np_, kh * d)
    vf = _backend.pad_axis(vg, 1, np_).reshape(b, np_, kh * d)
    okp = _backend.pad_axis(ok.astype(jnp.int32), 1, np_)  # padding rows are invalid
    qg = _backend.pad_axis(q.reshape(b, kh, g, d), 2, gp)

    cost = sparse_decode_cost(batch=b, num_heads=h, num_kv_heads=kh, head_dim=d, num_indices=indices.shape[1],
                              max_recent=max_recent, kv_itemsize=k.dtype.itemsize, q_itemsize=q.dtype.itemsize)
    kernel = functools.partial(sparse_decode_kernel, block_k=bs.block_k, split_len=split_len, head_dim=d,
                               scale=scale)
    stat = jax.ShapeDtypeStruct((b, bs.num_splits, kh, gp, 1), jnp.float32)
    stat_spec = pl.BlockSpec((None, None, hp, gp, 1), lambda i, hh, j: (i, j, hh, 0, 0))
    with _backend.quiet_triton_deprecation():
        o, m, l = pl.pallas_call(
            kernel,
            grid=(b, kh // hp, bs.num_splits),
            in_specs=[
                pl.BlockSpec((None, hp, gp, d), lambda i, hh, j: (i, hh, 0, 0)),
                pl.BlockSpec((None, 1, split_len), lambda i, hh, j: (i, 0, j)),
                pl.BlockSpec((None, split_len, 1), lambda i, hh, j: (i, j, 0)),
                pl.BlockSpec((None, split_len, hp * d), lambda i, hh, j: (i, j, hh)),
                pl.BlockSpec((None, split_len, hp * d), lambda i, hh, j: (i, j, hh)),
            ],
            out_specs=[pl.BlockSpec((None, None, hp, gp, d), lambda i, hh, j: (i, j, hh, 0, 0)), stat_spec,
                       stat_spec],
            out_shape=[jax.ShapeDtypeStruct((b, bs.num_splits, kh, gp, d), jnp.float32), stat, stat],
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",) * 3),
            interpret=_backend.resolve_interpret(interpret),
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="vegas_sparse_decode",
        )(qg, okp[:, None, :], okp[:, :, None], kf, vf)
    out, lse = _merge_splits(o[:, :, :, :g], m[:, :, :, :g, 0], l[:, :, :, :g, 0])  # [b, kh, g(, d)]
    return attn_ref.AttentionOutput(out.reshape(b, h, d), lse.reshape(b, h))


@functools.partial(jax.jit, static_argnames=("max_recent", "scale", "return_lse", "implementation",
                                             "interpret", "block_sizes", "kv_layout"))
def sparse_decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, indices: jax.Array, valid: jax.Array,
                            recent_start: jax.Array, lengths: jax.Array, *, max_recent: int,
                            scale: float | None = None, return_lse: bool = False,
                            implementation: str | None = None, interpret: bool | None = None,
                            block_sizes: SparseDecodeBlockSizes | None = None, kv_layout: str = "bskd"):
    """One query per sequence over a listed key subset plus a contiguous recent range.

    Args:
      q: [b, h, d] queries.
      k, v: [b, S, kh, d] cache ([b, kh, S, d] when kv_layout="bksd").
      indices: [b, K] int32 listed keys (unique; entries >= recent_start are ignored).
      valid: [b, K] bool, which entries of `indices` are used.
      recent_start: [b] first key of the recent range.
      lengths: [b] end (exclusive) of the recent range: the valid cache length.
      max_recent: static bound on the recent range's length.
      scale: logit scale (default 1/sqrt(d)).
      return_lse: also return lse [b, h].
      implementation: None | "xla" (gather, then attention over K + max_recent entries) | "pallas" |
        "pallas_tpu" | "pallas_triton" (the same XLA gather, then the Pallas flash-decode kernel over
        the compact buffer).
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU); unused by "xla".
      block_sizes: Pallas tiling of the compact axis; default `SparseDecodeBlockSizes.default(...)`.
      kv_layout: "bskd" or "bksd", the cache's axis order (both gathered as stored).

    Returns:
      out [b, h, d] in q's dtype (and lse).
    """
    _check_sparse(q, k, v, indices, valid, recent_start, lengths, kv_layout)
    if max_recent < 1:
        raise ValueError(f"sparse_decode_attention: max_recent must be >= 1; got {max_recent}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    impl = _backend.resolve_implementation(implementation)
    indices, recent_start, lengths = (a.astype(jnp.int32) for a in (indices, recent_start, lengths))
    if impl == "xla":
        res = _gathered(q, k, v, indices, valid, recent_start, lengths, max_recent=max_recent, scale=scale,
                        kv_layout=kv_layout)
    else:
        _check_head_dim("sparse_decode_attention", q.shape[-1], impl)
        bs = block_sizes or SparseDecodeBlockSizes.default(num_keys=indices.shape[1] + max_recent, batch=q.shape[0],
                                                           kv_heads=attn_ref.kv_tokens_heads(k.shape, kv_layout)[1],
                                                           implementation=impl)
        if not isinstance(bs, SparseDecodeBlockSizes):
            raise ValueError(f"sparse_decode_attention: block_sizes must be a SparseDecodeBlockSizes; got "
                             f"{type(bs).__name__}")
        bs.validate(impl)
        res = _sparse_pallas(q, k, v, indices, valid.astype(bool), recent_start, lengths, max_recent=max_recent,
                             scale=scale, bs=bs, impl=impl, interpret=interpret, kv_layout=kv_layout)
    out = res.out.astype(q.dtype)
    return (out, res.lse) if return_lse else out
