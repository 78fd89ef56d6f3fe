"""Faster Flash Decoding (FFD): top-delta page selection over low-bit key codes (the jnp reference).

FFD ("Faster Than Flash: Exploiting Attention Sparsity for Efficient Long-Context Decoding", Liu et
al., ICML 2026; spec: papers/specs/inference_moe.md section 2) speeds up the decode step of attention
over a long cache by reading a 2-bit copy of the keys, skipping pages whose best score is far below a
cheap reference maximum, and attending exactly only to the pages it keeps.

Cache layout (per layer; ``b`` batch, ``s`` cache tokens, ``k`` KV heads, ``g`` query heads per KV
head, ``h = k g`` query heads, ``d`` head dim, ``p`` pages of ``bs`` tokens, ``t`` token in a page):

* the keys of every *full* page are quantized per (page, KV head, channel) with the symmetric scale
  ``S = max_t |K| / o`` (``o = (2^bits - 1) / 2``: 1.5 for 2 bits, 7.5 for 4 bits; clamped at 1e-8)
  and codes ``C = clip(round(K / S + o), 0, 2^bits - 1)`` (round half to even), so the levels are
  ``Khat = (C - o) S`` and ``|K - Khat| <= S / 2``. Codes are packed ``n = 8 / bits`` per byte in
  planes along the channel axis: byte ``j`` holds channels ``j, j + d/n, ..., j + (n-1) d/n`` (plane
  ``i`` in bits ``bits*i ..``), so a kernel multiplies plane ``i`` with a contiguous slice of ``q * S``.
  The residual ``R = K - Khat`` is kept (float32, bfloat16 or float8_e4m3fn, the code's choice);
* the keys of the current, incomplete page stay exact; values are never quantized.

Decode step, in base-2 units (``tau = d^-1/2``):

    shat_j = tau log2(e) ((q * S) . C_j - o sum_d q_d S_d)       # = tau log2(e) q . Khat_j  (scan)
    s_j    = shat_j + tau log2(e) q . R_j                         # refined score of kept pages
    m_ref  = max(max_{j in page 0} shat_j, max_{j in last full page} shat_j)
    keep(page) = any_{heads of the GQA group} max_{j in page} shat_j >= m_ref - delta

and the output is the softmax over the kept pages' refined scores plus the current page's exact
scores. ``delta`` is in log2 units as in the official code (``delta = 5`` keeps pages whose best
weight is at least 2^-5 of the reference); :func:`delta_from_natural` converts the natural-log
reading (``e^-delta``) of the README.

This module is the readable reference: :func:`top_delta_keep` makes exactly the kernel's selection,
:func:`sparse_decode` attends over any page selection (masked, every page computed), and
:func:`ffd_decode` is the two together. The baselines select pages at a given count per (sequence,
KV head): :func:`top_k_keep` (global top-k of the scan maxima: needs all page maxima before any
attention, the synchronization FFD avoids) and :func:`quest_keep` (Quest: upper bounds from
per-page per-channel min/max keys, computed by :mod:`primitives.quest`). :func:`dense_decode` is the exact reference. The fused Pallas
kernel lives in ``pallas_kernels/ffd_decode``.

:func:`fast_ffd_decode` is the XLA (CPU) path: XLA does not fuse bit unpacking into a dot, so it
scans an int8 copy of the dequantized low-bit keys (``FFDCache.scan_keys``, one scale per page) with
one int8 query per head and a proven error bound (:func:`int8_page_maxima`), checks only the
candidate pages with the exact float scan, and attends over the kept pages gathered to a static
capacity; its selection is the reference's.

Example:
    >>> import jax, jax.numpy as jnp
    >>> kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    >>> q = jax.random.normal(kq, (1, 4, 16))                  # 4 query heads, d = 16
    >>> keys = jax.random.normal(kk, (1, 100, 2, 16))          # 2 KV heads, 100 tokens
    >>> values = jax.random.normal(kv, (1, 100, 2, 16))
    >>> cache = build_cache(keys, values, jnp.array([100]), page_size=16)
    >>> cache.codes.shape, cache.current_keys.shape            # 6 full pages, 4 tokens in the last
    ((1, 2, 6, 4, 16), (1, 2, 16, 16))
    >>> out = ffd_decode(q, cache, delta=float("inf"))         # keeps every page: exact attention
    >>> bool(jnp.allclose(out.out, dense_decode(q, keys, values, jnp.array([100])), atol=1e-5))
    True
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from primitives.attention import (AttentionOutput, combine_partials, decode_attention, kv_token_axis,
                                  kv_tokens_heads)
from primitives import quantization, quest

__all__ = [
    "LOG2E",
    "FFDCache",
    "FFDPages",
    "FFDOutput",
    "delta_from_natural",
    "quantize_pages",
    "dequantize_pages",
    "pack_codes",
    "unpack_codes",
    "build_cache",
    "quantize_key_pages",
    "init_pages",
    "update_pages",
    "paged_cache",
    "head_major_pages",
    "scan_scores",
    "page_maxima",
    "reference_threshold",
    "top_delta_keep",
    "top_k_keep",
    "quest_bounds",
    "quest_keep",
    "pages_partial",
    "current_partial",
    "merge_partials",
    "sparse_decode",
    "chunked_page_maxima",
    "GatheredOutput",
    "gathered_decode",
    "int8_page_maxima",
    "scan_candidates",
    "fast_ffd_decode",
    "DecodeProblem",
    "synthetic_problem",
    "ffd_decode",
    "dense_decode",
    "kept_fraction",
    "modeled_bytes",
]

LOG2E = math.log2(math.e)
_RESIDUAL_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn)
_CHUNK_BYTES = 2 << 20  # unpacked float codes per scan chunk: about an L2 cache


class FFDCache(NamedTuple):
    """One layer's FFD key/value cache, head-major (each KV head's pages are contiguous).

    Attributes:
      codes: [b, k, p, d * bits / 8, bs] uint8 packed key codes of every page slot, channel-major
        (:func:`pack_codes` along the channels, then each page's tokens last): a page is a
        ``[d * bits / 8, bs]`` byte matrix (32 x 128 for 2-bit codes of d = 128 in pages of 128, one
        whole TPU uint8 tile; a token-major ``[bs, 32]`` page would pad its 32-byte rows to 128
        lanes), and the kernel's scan is a plain ``(q * S) @ C`` product per packed plane.
      scales: [b, k, p, d] float32 per-page per-channel scales.
      residual: [b, k, p, bs, d] ``K - Khat`` (float32, bfloat16 or float8_e4m3fn).
      values: [b, k, p, bs, d] exact values of the pages.
      current_keys: [b, k, bs, d] exact keys of the incomplete page (tokens ``full_pages * bs`` ..
        ``lengths - 1``; zero beyond).
      current_values: [b, k, bs, d] its values.
      lengths: [b] int32 valid tokens.
      page_min: [b, k, p, d] per-page per-channel key minimum (Quest metadata; the baseline only).
      page_max: [b, k, p, d] per-page per-channel key maximum.
      scan_keys: [b, k, p, bs, d] int8 or None: the dequantized low-bit keys ``Khat`` requantized to
        int8 with one scale per page, ``round(Khat / A)`` with ``A = o max_d S / 127`` (so
        ``|Khat - A scan_keys| <= A / 2``). The operand of the CPU (XLA) scan in
        :func:`fast_ffd_decode`: XLA on CPU does not fuse bit unpacking into a dot, but runs one
        ``int8 x int8`` product per KV head (keys first) about 8x faster than a float32 dense decode
        reads the keys and values. It costs one byte per cached key element on top of the packed
        quarter byte; a fused kernel (GPU/TPU) reads only ``codes`` and never this copy (under
        ``jax.jit`` XLA drops it when unused). None (``build_cache(..., scan_keys=False)``) makes
        :func:`fast_ffd_decode` scan ``codes`` exactly instead.
      scan_scales: [b, k, p] float32 ``A`` per page (None when ``scan_keys`` is None).
      scan_l1: [b, k, p] float32 ``max_t sum_d |scan_keys|`` per page, for the scan's error bound.

    Pages at index >= ``full_pages = lengths // bs`` are not valid and never read.
    """

    codes: jax.Array
    scales: jax.Array
    residual: jax.Array
    values: jax.Array
    current_keys: jax.Array
    current_values: jax.Array
    lengths: jax.Array
    page_min: jax.Array
    page_max: jax.Array
    scan_keys: jax.Array | None = None
    scan_scales: jax.Array | None = None
    scan_l1: jax.Array | None = None

    @property
    def page_size(self) -> int:
        return self.codes.shape[4]

    @property
    def num_pages(self) -> int:
        return self.codes.shape[2]

    @property
    def bits(self) -> int:
        return 8 * self.codes.shape[3] // self.scales.shape[-1]

    @property
    def full_pages(self) -> jax.Array:
        return self.lengths // self.page_size

    @property
    def valid_pages(self) -> jax.Array:
        """[b, p] bool: the page is full and holds cached tokens."""
        return jnp.arange(self.num_pages)[None, :] < self.full_pages[:, None]


class FFDPages(NamedTuple):
    """The quantized keys of one layer's page slots: what an incremental FFD KV cache stores.

    :class:`FFDCache` without the parts a dense KV cache already holds (values and the current page,
    read from it each step by :func:`paged_cache`). The fields are :class:`FFDCache`'s of the same
    names, shaped ``[b, k, p, ...]`` over every page slot of the capacity; a slot is meaningful once
    its page is full (:func:`update_pages` quantizes each page when an append completes it).
    """

    codes: jax.Array
    scales: jax.Array
    residual: jax.Array
    page_min: jax.Array
    page_max: jax.Array
    scan_keys: jax.Array | None = None
    scan_scales: jax.Array | None = None
    scan_l1: jax.Array | None = None

    # Read from the codes and scales, which both tuples hold.
    page_size = FFDCache.page_size
    num_pages = FFDCache.num_pages
    bits = FFDCache.bits


class FFDOutput(NamedTuple):
    """Result of one FFD decode step.

    Attributes:
      out: [b, h, d] attention output (q's dtype).
      lse: [b, h] natural-log logsumexp of the attended scores.
      keep: [b, k, p] bool pages attended (the whole GQA group shares a page).
      threshold: [b, h] ``m_ref - delta`` in log2 units (-inf with no full page).
    """

    out: jax.Array
    lse: jax.Array
    keep: jax.Array
    threshold: jax.Array


def delta_from_natural(delta_natural: float) -> float:
    """Converts a natural-log margin (pages below ``e^-delta`` of the max) to FFD's log2 ``delta``."""
    return float(delta_natural) * LOG2E


def _offset(bits: int) -> float:
    return (2**bits - 1) / 2


def _check_bits(bits: int) -> int:
    if bits not in (2, 4):
        raise ValueError(f"bits must be 2 or 4, got {bits!r}")
    return bits


def pack_codes(codes: jax.Array, bits: int, axis: int = -1) -> jax.Array:
    """Packs integer codes in [0, 2^bits) along ``axis`` into uint8 planes.

    With ``n = 8 // bits`` codes per byte and ``c = d // n`` bytes (``d`` the length of ``axis``),
    byte ``j`` holds channel ``i * c + j`` in bits ``bits * i .. bits * i + bits - 1``
    (``i = 0 .. n-1``).
    """
    per_byte = 8 // _check_bits(bits)
    axis = axis % codes.ndim
    d = codes.shape[axis]
    if d % per_byte:
        raise ValueError(f"axis {axis} ({d}) must be a multiple of {per_byte} to pack {bits}-bit codes")
    planes = codes.astype(jnp.uint8).reshape(codes.shape[:axis] + (per_byte, d // per_byte) + codes.shape[axis + 1:])
    shifts = (jnp.arange(per_byte, dtype=jnp.uint8) * bits).reshape((per_byte,) + (1,) * (codes.ndim - axis))
    return jnp.bitwise_or.reduce(jnp.left_shift(planes, shifts), axis=axis).astype(jnp.uint8)


def unpack_codes(packed: jax.Array, bits: int, axis: int = -1) -> jax.Array:
    """Inverse of :func:`pack_codes`: uint8 codes with ``8 // bits`` times as many channels along ``axis``."""
    per_byte = 8 // _check_bits(bits)
    axis = axis % packed.ndim
    shape, n = packed.shape, packed.shape[-1]
    if n % 4 == 0:
        # Shift whole 32-bit words (4 bytes along the last axis) and keep the low bits of each byte: the
        # same codes, but x86 has no vector shift of 8-bit lanes, so XLA on CPU runs the uint8 form below
        # element by element (about 2x slower on a gathered set of pages). Byte order does not matter:
        # after a shift by at most 8 - bits, each byte's low ``bits`` bits still come from that byte.
        words = jax.lax.bitcast_convert_type(packed.reshape(shape[:-1] + (n // 4, 4)), jnp.uint32)
        shifts = (jnp.arange(per_byte, dtype=jnp.uint32) * bits).reshape((per_byte,) + (1,) * (packed.ndim - axis))
        mask = jnp.uint32(0x01010101 * (2**bits - 1))
        shifted = jnp.bitwise_and(jnp.right_shift(jnp.expand_dims(words, axis), shifts), mask)
        planes = jax.lax.bitcast_convert_type(shifted, jnp.uint8)  # plane axis at `axis`, then [..., n // 4, 4]
        planes = planes.reshape(planes.shape[:-2] + (n,))
    else:
        shifts = (jnp.arange(per_byte, dtype=jnp.uint8) * bits).reshape((per_byte,) + (1,) * (packed.ndim - axis))
        planes = jnp.bitwise_and(jnp.right_shift(jnp.expand_dims(packed, axis), shifts), jnp.uint8(2**bits - 1))
    return planes.reshape(shape[:axis] + (per_byte * shape[axis],) + shape[axis + 1:])


def quantize_pages(pages: jax.Array, bits: int = 2) -> tuple[jax.Array, jax.Array]:
    """Per-page per-channel symmetric quantization of key pages ``[..., bs, d]`` (midrise levels).

    The scale is the maximum over the page's tokens (axis ``-2``) of ``|K|``, divided by ``o``.

    Returns:
      ``(codes uint8 [..., bs, d] unpacked, scales float32 [..., d])``.
    """
    _check_bits(bits)
    x = pages.astype(jnp.float32)
    r = jnp.float32(quantization.reciprocal_divisor(bits, "midrise"))  # fl(1 / o)
    scales = jnp.maximum(jnp.max(jnp.abs(x), axis=-2) * r, 1e-8)
    # round(x / s + o) as `quantization.encode` computes it, multiplies by fl(1/s) and the add exact, so
    # the codes are the same eagerly and under jit (there XLA made x / s + o one FMA).
    codes = quantization.encode(x, scales[..., None, :], None, bits=bits, scheme="midrise")
    return codes, scales


def dequantize_pages(codes: jax.Array, scales: jax.Array, bits: int = 2) -> jax.Array:
    """``Khat = (C - o) S`` for unpacked codes ``[..., bs, d]`` and scales ``[..., d]``."""
    return (codes.astype(jnp.float32) - _offset(bits)) * scales[..., None, :]


def _current_page(x: jax.Array, full: jax.Array, lengths: jax.Array, page_size: int, token_axis: int) -> jax.Array:
    """[b, s, k, d] (token_axis 1) or [b, k, s, d] (2) -> [b, k, bs, d]: tokens ``full * bs .. lengths - 1``
    (zero beyond)."""
    s = x.shape[token_axis]
    if s < page_size:  # a cache shorter than one page: pad it (small)
        widths = [(0, 0)] * 4
        widths[token_axis] = (0, page_size - s)
        x, s = jnp.pad(x, widths), page_size

    # Slice in bounds (padding the whole cache would copy it), then shift the page to the window's front.
    start = jnp.minimum(full * page_size, s - page_size)
    window = _row_windows(x, start, page_size, token_axis)
    pos = jnp.minimum((full * page_size - start)[:, None] + jnp.arange(page_size), page_size - 1)  # [b, bs]
    cur = jax.vmap(lambda w, i: jnp.take(w, i, axis=token_axis - 1))(window, pos)
    if token_axis == 1:
        cur = cur.transpose(0, 2, 1, 3)
    live = full[:, None] * page_size + jnp.arange(page_size)[None, :] < lengths[:, None]
    return jnp.where(live[:, None, :, None], cur, 0)


def _row_windows(x: jax.Array, starts: jax.Array, size: int, axis: int) -> jax.Array:
    """``x[r]``'s tokens ``starts[r] .. starts[r] + size - 1`` along ``axis`` (of ``x``; rows on axis 0), per row.

    One dynamic slice per row (``lax.map``): a batched slice is a gather, and XLA on TPU first copies the
    whole cache into another layout for it.
    """
    return jax.lax.map(lambda a: jax.lax.dynamic_slice_in_dim(a[0], a[1], size, axis=axis - 1), (x, starts))


def build_cache(keys: jax.Array, values: jax.Array, lengths: jax.Array, *, page_size: int = 128,
                bits: int = 2, residual_dtype=jnp.float32, scan_keys: bool = True, layout: str = "bskd") -> FFDCache:
    """Builds the FFD cache of a dense cache (what an FFD-enabled KV cache stores incrementally).

    Args:
      keys: [b, s, k, d] cached keys (entries >= lengths ignored); [b, k, s, d] when layout="bksd".
      values: cached values, keys' shape.
      lengths: [b] int valid tokens per sequence, in [0, s].
      page_size: tokens per page ``bs``.
      bits: key code width, 2 (the paper's default) or 4.
      residual_dtype: storage of ``K - Khat``: float32 (exact refinement), bfloat16 or
        float8_e4m3fn (the code's FP8 residual).
      scan_keys: also store the int8 scan keys (``FFDCache.scan_keys``, one byte per key element,
        with their per-page scale and L1 bound), the operand of the CPU scan of :func:`fast_ffd_decode`.
      layout: the dense cache's axis order, "bskd" or "bksd" (the pages are head-major, so a "bksd"
        cache is paged by a reshape, without a transpose).

    Returns:
      :class:`FFDCache` with ``p = s // page_size`` page slots.
    """
    if keys.ndim != 4 or values.shape != keys.shape:
        raise ValueError(f"keys and values must be [{', '.join(layout)}] of one shape; got {keys.shape}, "
                         f"{values.shape}")
    _check_page_args(page_size, bits, keys.shape[3], residual_dtype)
    pages = quantize_key_pages(head_major_pages(keys, page_size, layout).astype(jnp.float32), bits=bits,
                               residual_dtype=residual_dtype, scan_keys=scan_keys)
    return paged_cache(pages, keys, values, lengths, layout=layout)


def _check_page_args(page_size, bits: int, head_dim: int, residual_dtype) -> None:
    _check_bits(bits)
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    if head_dim % (8 // bits):
        raise ValueError(f"head_dim ({head_dim}) must be a multiple of {8 // bits} for {bits}-bit packing")
    if jnp.dtype(residual_dtype) not in [jnp.dtype(t) for t in _RESIDUAL_DTYPES]:
        raise ValueError(f"residual_dtype must be one of float32, bfloat16, float8_e4m3fn; got {residual_dtype}")


def head_major_pages(x: jax.Array, page_size: int, layout: str = "bskd") -> jax.Array:
    """A dense cache's keys or values as pages: [b, s, k, d] ("bskd") or [b, k, s, d] ("bksd") ->
    [b, k, p, bs, d], ``p = s // page_size`` whole pages (a reshape for "bksd" when ``s`` is a multiple of
    the page size, else a copy)."""
    b, d = x.shape[0], x.shape[3]
    s, kh = kv_tokens_heads(x.shape, layout)
    p = s // page_size
    if kv_token_axis(layout) == 2:
        return x[:, :, : p * page_size].reshape(b, kh, p, page_size, d)
    return x[:, : p * page_size].reshape(b, p, page_size, kh, d).transpose(0, 3, 1, 2, 4)


def quantize_key_pages(pages: jax.Array, *, bits: int = 2, residual_dtype=jnp.float32,
                       scan_keys: bool = True) -> FFDPages:
    """Quantizes key pages ``[b, k, p, bs, d]`` (float32) into :class:`FFDPages` (packed codes, scales,
    residual, Quest bounds and, with ``scan_keys``, the int8 scan keys): the per-page work of
    :func:`build_cache`, shared by :func:`update_pages`."""
    codes, scales = quantize_pages(pages, bits)
    residual = (pages - dequantize_pages(codes, scales, bits)).astype(residual_dtype)
    page_min, page_max = quest_bounds(pages)
    scan = _int8_scan_keys(codes, scales, bits) if scan_keys else (None, None, None)
    packed = pack_codes(jnp.swapaxes(codes, -1, -2), bits, axis=-2)  # channel-major pages [..., d * bits / 8, bs]
    return FFDPages(codes=packed, scales=scales, residual=residual, page_min=page_min, page_max=page_max,
                    scan_keys=scan[0], scan_scales=scan[1], scan_l1=scan[2])


def init_pages(batch: int, kv_heads: int, capacity: int, head_dim: int, *, page_size: int = 128, bits: int = 2,
               residual_dtype=jnp.float32, scan_keys: bool = True) -> FFDPages:
    """Empty :class:`FFDPages` (zeros) for ``capacity // page_size`` page slots, filled by :func:`update_pages`."""
    _check_page_args(page_size, bits, head_dim, residual_dtype)
    shape = (batch, kv_heads, capacity // page_size, page_size, head_dim)
    spec = jax.eval_shape(functools.partial(quantize_key_pages, bits=bits, residual_dtype=residual_dtype,
                                            scan_keys=scan_keys), jax.ShapeDtypeStruct(shape, jnp.float32))
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), spec)


def update_pages(pages: FFDPages, keys: jax.Array, old_lengths: jax.Array, new_lengths: jax.Array, *,
                 max_new_tokens: int, layout: str = "bskd") -> FFDPages:
    """Quantizes the pages an append completed: slots ``old_lengths // bs .. new_lengths // bs - 1``.

    Called after the appended tokens are written to the dense ``keys``. An append of at most ``T``
    tokens completes at most ``T // bs + 1`` pages, all in the window of that many slots starting at
    the page that held ``old_lengths`` (moved back to end at the last slot near the capacity), so only
    that window is read (one dynamic slice per sequence), quantized, and its completed pages written
    back. Pages are quantized from their own tokens only, so the
    result is :func:`build_cache`'s (up to float32 rounding), and a rollback (lowering the lengths) needs no
    undo: a page is quantized again whenever an append completes it.

    Args:
      pages: the layer's :class:`FFDPages` (valid up to ``old_lengths // bs`` pages).
      keys: the dense cache's keys after the append, [b, s, k, d] ("bskd") or [b, k, s, d] ("bksd").
      old_lengths, new_lengths: [b] int valid tokens before and after the append.
      max_new_tokens: static bound ``T`` on ``new_lengths - old_lengths`` (the append's width).
      layout: the dense cache's axis order.

    Returns:
      The updated :class:`FFDPages`.
    """
    b, kh, p, bs, d = pages.codes.shape[0], pages.scales.shape[1], pages.num_pages, pages.page_size, keys.shape[3]
    s, heads = kv_tokens_heads(keys.shape, layout)
    if (heads, s // bs, d) != (kh, p, pages.scales.shape[-1]):
        raise ValueError(f"keys {keys.shape} ({layout}) do not match the pages (scales {pages.scales.shape}, "
                         f"page size {bs})")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    n = min(max_new_tokens // bs + 1, p)
    if n == 0:  # a capacity shorter than one page: no page slot
        return pages
    # The window's first slot, moved back so the window ends by the last slot (it then re-quantizes full
    # pages before ``old_lengths``: the same values).
    first = jnp.minimum(old_lengths // bs, p - n)
    idx = first[:, None] + jnp.arange(n)[None, :]  # [b, n] slots of the window
    bi = jnp.arange(b)[:, None]
    window = _row_windows(keys, first * bs, n * bs, kv_token_axis(layout))  # a dense cache of n pages
    fresh = quantize_key_pages(head_major_pages(window, bs, layout).astype(jnp.float32), bits=pages.bits, residual_dtype=pages.residual.dtype,
                               scan_keys=pages.scan_keys is not None)
    slot = jnp.where(idx < (new_lengths // bs)[:, None], idx, p)[:, None, :]  # [b, 1, n]; p: not full, dropped
    ki = jnp.arange(kh)[None, :, None]

    def put(old, new):  # [b, k, p, ...] <- [b, k, n, ...]
        return None if old is None else old.at[bi[:, :, None], ki, slot].set(new, mode="drop")

    return FFDPages(*(put(o, f) for o, f in zip(pages, fresh)))


def paged_cache(pages: FFDPages, keys: jax.Array, values: jax.Array, lengths: jax.Array, *,
                layout: str = "bskd") -> FFDCache:
    """The :class:`FFDCache` of a dense KV cache whose full pages ``pages`` holds quantized.

    Values are the dense values paged (a reshape for "bksd"; a transposed copy for "bskd"), and the
    current page's exact keys and values are read from the dense cache.

    Args:
      pages: :class:`FFDPages` covering the full pages of ``lengths`` (from :func:`update_pages` or
        :func:`quantize_key_pages`).
      keys, values: the dense cache, [b, s, k, d] ("bskd") or [b, k, s, d] ("bksd").
      lengths: [b] int valid tokens per sequence, in [0, s].
      layout: the dense cache's axis order.
    """
    token_axis = kv_token_axis(layout)
    if keys.ndim != 4 or values.shape != keys.shape:
        raise ValueError(f"keys and values must be [{', '.join(layout)}] of one shape; got {keys.shape}, "
                         f"{values.shape}")
    b, bs = keys.shape[0], pages.page_size
    s, kh = kv_tokens_heads(keys.shape, layout)
    if pages.scales.shape != (b, kh, s // bs, keys.shape[3]):
        raise ValueError(f"pages (scales {pages.scales.shape}, page size {bs}) do not match keys {keys.shape} "
                         f"({layout})")
    lengths = jnp.asarray(lengths, jnp.int32)
    if lengths.shape != (b,):
        raise ValueError(f"lengths must have shape ({b},), got {lengths.shape}")
    full = lengths // bs
    return FFDCache(**pages._asdict(), values=head_major_pages(values, bs, layout),
                    current_keys=_current_page(keys, full, lengths, bs, token_axis),
                    current_values=_current_page(values, full, lengths, bs, token_axis), lengths=lengths)


def _int8_scan_keys(codes: jax.Array, scales: jax.Array, bits: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(scan_keys int8 [..., p, bs, d], scan_scales [..., p], scan_l1 [..., p])`` of unpacked codes.

    ``Khat = (C - o) S`` rounded to the grid ``A = o max_d S / 127``: ``|Khat / A| <= 127``, so the
    clip never binds and ``|Khat - A round(Khat / A)| <= A / 2``.
    """
    khat = dequantize_pages(codes, scales, bits)  # [..., p, bs, d]
    a = _offset(bits) * jnp.max(scales, axis=-1) / 127.0  # [..., p]; scales >= 1e-8, so a > 0
    k8 = jnp.clip(jnp.round(khat / a[..., None, None]), -127, 127).astype(jnp.int8)
    l1 = jnp.max(jnp.sum(jnp.abs(k8.astype(jnp.int32)), axis=-1), axis=-1).astype(jnp.float32)
    return k8, a, l1


def _grouped(q: jax.Array, cache: FFDCache) -> jax.Array:
    b, h, d = q.shape
    kh = cache.scales.shape[1]
    if cache.scales.shape[0] != b or cache.scales.shape[-1] != d:
        raise ValueError(f"q {q.shape} does not match the cache (scales {cache.scales.shape})")
    if h % kh:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({kh})")
    return q.astype(jnp.float32).reshape(b, kh, h // kh, d)


def scan_scores(q: jax.Array, cache: FFDCache) -> jax.Array:
    """Base-2 scan scores ``shat`` [b, k, g, p, bs] from the packed codes (invalid pages included)."""
    qg = _grouped(q, cache)
    tau = LOG2E / math.sqrt(q.shape[-1])
    qs = qg[:, :, :, None] * cache.scales[:, :, None]  # [b, k, g, p, d]
    c = unpack_codes(cache.codes, cache.bits, axis=-2).astype(jnp.float32)  # [b, k, p, d, t]
    dot = jnp.einsum("bkpdt,bkgpd->bkgpt", c, qs)  # codes first: 3x faster on XLA CPU than queries first
    return tau * (dot - _offset(cache.bits) * jnp.sum(qs, axis=-1)[..., None])


def page_maxima(scores: jax.Array, cache: FFDCache) -> jax.Array:
    """Per-head page maxima [b, k, g, p] of token scores [b, k, g, p, bs]; -inf on invalid pages."""
    m = jnp.max(scores, axis=-1)
    return jnp.where(cache.valid_pages[:, None, None, :], m, -jnp.inf)


def reference_threshold(q: jax.Array, cache: FFDCache, delta: float) -> jax.Array:
    """``m_ref - delta`` [b, k, g] from the first and the last full page only (-inf without one)."""
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0 (log2 units; inf keeps all pages), got {delta}")
    b, kh, p = cache.scales.shape[:3]
    if p == 0:  # a cache shorter than one page: no full page to take a reference from
        return jnp.full(_grouped(q, cache).shape[:3], -jnp.inf)
    last = jnp.maximum(cache.full_pages - 1, 0)
    two = jnp.stack([jnp.zeros_like(last), last], axis=1)  # [b, 2] page indices
    flat = (jnp.arange(kh)[None, :, None] * p + two[:, None, :]).reshape(b, 2 * kh)

    def pick(x):  # [b, k, p, ...] -> [b, k, 2, ...]
        return _pages_at(x, flat).reshape((b, kh, 2) + x.shape[3:])

    ref = cache._replace(codes=pick(cache.codes), scales=pick(cache.scales))
    shat = scan_scores(q, ref)  # [b, k, g, 2, bs]
    m_ref = jnp.max(shat, axis=(-2, -1))
    m_ref = jnp.where(cache.full_pages[:, None, None] > 0, m_ref, -jnp.inf)
    return m_ref - delta if math.isfinite(delta) else jnp.full_like(m_ref, -jnp.inf)


def top_delta_keep(q: jax.Array, cache: FFDCache, delta: float) -> tuple[jax.Array, jax.Array]:
    """FFD's selection: ``(keep [b, k, p] bool, threshold [b, h] log2 units)``.

    ``delta`` in log2 units (>= 0, ``inf`` keeps every valid page). The reference maximum is taken
    over the first and the last full page only; a page is kept for the whole GQA group when any of
    its heads reaches the threshold.
    """
    th = reference_threshold(q, cache, delta)  # [b, k, g]
    m = page_maxima(scan_scores(q, cache), cache)  # [b, k, g, p]
    keep = jnp.any(m >= th[..., None], axis=2) & cache.valid_pages[:, None, :]
    return keep, th.reshape(q.shape[0], -1)


def _top_pages(page_scores: jax.Array, valid: jax.Array, num_pages) -> jax.Array:
    """keep [b, k, p]: the ``num_pages`` highest-scoring valid pages per (b, k) (ties: lower index).

    ``num_pages`` is an int or a [b] int array (a budget per sequence); the ranking is
    :func:`primitives.quest.select_pages`.
    """
    if not isinstance(num_pages, (int, float)):
        n = jnp.asarray(num_pages)
        if n.shape != (page_scores.shape[0],):
            raise ValueError(f"num_pages must be an int or have shape ({page_scores.shape[0]},), got {n.shape}")
        num_pages = n[:, None]
    return quest.select_pages(page_scores, num_pages, valid=valid)


def top_k_keep(q: jax.Array, cache: FFDCache, num_pages) -> jax.Array:
    """Baseline: global top-k pages per (b, KV head) by the group's max scan score (needs a full pass)."""
    m = jnp.max(page_maxima(scan_scores(q, cache), cache), axis=2)
    return _top_pages(m, cache.valid_pages[:, None, :], num_pages)


def quest_bounds(pages: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Quest metadata: per-page per-channel min and max over tokens of keys ``[..., bs, d]`` -> ``[..., d]``.

    :func:`primitives.quest.page_bounds` with one page per ``[bs, d]`` block.
    """
    lo, hi = quest.page_bounds(pages, page_size=pages.shape[-2])
    return lo[..., 0, :], hi[..., 0, :]


def quest_keep(q: jax.Array, cache: FFDCache, num_pages) -> jax.Array:
    """Baseline (Quest): top-k pages by the bound ``max_t q.k_t <= sum_d max(q_d min_d, q_d max_d)``.

    The bound is :func:`primitives.quest.page_scores` per query head; a page's score is the max over
    its GQA group.
    """
    qg = _grouped(q, cache)[:, :, :, None]  # [b, k, g, 1, d]
    upper = quest.page_scores(qg, cache.page_min[:, :, None], cache.page_max[:, :, None])  # [b, k, g, p]
    return _top_pages(jnp.max(upper, axis=2), cache.valid_pages[:, None, :], num_pages)


def pages_partial(q: jax.Array, cache: FFDCache, attend: jax.Array, *, use_residual: bool = True) -> AttentionOutput:
    """Softmax partial over the page slots of ``cache`` marked in ``attend`` [b, k, p] (refined scores).

    The slots need not be the cache's own page order: the gathered fast path passes a cache whose
    codes, scales, residual and values hold only the selected pages. Returns ``AttentionOutput(out
    [b, h, d] float32, lse [b, h] natural log, -inf where nothing is attended)``.
    """
    qg = _grouped(q, cache)
    tau = LOG2E / math.sqrt(q.shape[-1])
    scores = scan_scores(q, cache)  # [b, k, g, p, t]
    if use_residual:
        scores = scores + tau * jnp.einsum("bkgd,bkptd->bkgpt", qg, cache.residual.astype(jnp.float32))
    return _masked_partial(q, scores, attend, cache.values)


def _masked_partial(q: jax.Array, scores: jax.Array, attend: jax.Array, values: jax.Array) -> AttentionOutput:
    """Softmax partial of base-2 ``scores`` [b, k, g, p, bs] over the pages marked in ``attend`` [b, k, p]
    with ``values`` [b, k, p, bs, d] (see :func:`pages_partial`)."""
    b, h, d = q.shape
    kh, g, p, bs = scores.shape[1:]
    scores = jnp.where(attend[:, :, None, :, None], scores, -jnp.inf).reshape(b, kh, g, p * bs)
    m = jnp.max(scores, axis=-1, keepdims=True, initial=-jnp.inf)  # initial: no pages (p = 0)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    w = jnp.exp2(scores - m_safe)
    l_pages = jnp.sum(w, axis=-1)
    v_pages = values.astype(jnp.float32).reshape(b, kh, p * bs, d)
    o_pages = jnp.einsum("bkgs,bksd->bkgd", w, v_pages) / jnp.maximum(l_pages, 1e-30)[..., None]
    lse = jnp.where(l_pages > 0, (m_safe[..., 0] + jnp.log2(jnp.maximum(l_pages, 1e-30))) / LOG2E, -jnp.inf)
    return AttentionOutput(o_pages.reshape(b, h, d), lse.reshape(b, h))


def current_partial(q: jax.Array, cache: FFDCache) -> AttentionOutput:
    """Exact attention over the current, incomplete page (``lse = -inf`` when it is empty)."""
    cur = decode_attention(q, cache.current_keys.transpose(0, 2, 1, 3), cache.current_values.transpose(0, 2, 1, 3),
                           cache.lengths - cache.full_pages * cache.page_size, return_lse=True)
    return AttentionOutput(cur.out.astype(jnp.float32), cur.lse)


def merge_partials(q: jax.Array, parts: list[AttentionOutput]) -> AttentionOutput:
    """Log-sum-exp merge of partials over disjoint key sets, output in ``q``'s dtype."""
    merged = combine_partials(jnp.stack([o.out for o in parts]), jnp.stack([o.lse for o in parts]))
    return AttentionOutput(merged.out.astype(q.dtype), merged.lse)


def sparse_decode(q: jax.Array, cache: FFDCache, keep: jax.Array, *, use_residual: bool = True) -> FFDOutput:
    """Attention over the kept pages (refined scores) plus the exact current page.

    Every page is computed and the dropped ones masked: this is the semantics, not the fast path.

    Args:
      q: [b, h, d] queries of the newest tokens.
      cache: the FFD cache.
      keep: [b, k, p] bool pages to attend (invalid pages are ignored).
      use_residual: refine kept pages' scan scores with the residual (False: attend with the
        low-bit keys, the ablation).

    Returns:
      :class:`FFDOutput` (``threshold`` is NaN: no threshold was used).
    """
    b, h, _ = q.shape
    want = (b, cache.scales.shape[1], cache.num_pages)
    if keep.shape != want:
        raise ValueError(f"keep must have shape {want}, got {keep.shape}")
    attend = keep & cache.valid_pages[:, None, :]
    merged = merge_partials(q, [pages_partial(q, cache, attend, use_residual=use_residual), current_partial(q, cache)])
    return FFDOutput(out=merged.out, lse=merged.lse, keep=attend, threshold=jnp.full((b, h), jnp.nan, jnp.float32))


def ffd_decode(q: jax.Array, cache: FFDCache, *, delta: float = 5.0, use_residual: bool = True) -> FFDOutput:
    """One FFD decode step: top-delta selection on the codes, then attention over the kept pages.

    Args:
      q: [b, h, d] queries (``h`` a multiple of the cache's KV heads).
      cache: :class:`FFDCache` from :func:`build_cache`.
      delta: margin in log2 units (5.0 the paper's default, 7.0 "conservative", ``inf`` = dense).
      use_residual: refine kept pages with the residual.

    Returns:
      :class:`FFDOutput`.
    """
    keep, th = top_delta_keep(q, cache, delta)
    return sparse_decode(q, cache, keep, use_residual=use_residual)._replace(threshold=th)


def _default_chunk(cache: FFDCache) -> int:
    b, kh, p, _, bs = cache.codes.shape
    per_page = b * kh * bs * cache.scales.shape[-1] * 4
    chunk = max(1, min(p, _CHUNK_BYTES // max(per_page, 1)))
    while p % chunk:  # a divisor of p, so every chunk is full
        chunk -= 1
    return chunk


def chunked_page_maxima(q: jax.Array, cache: FFDCache, *, chunk_pages: int | None = None) -> jax.Array:
    """Per-head page maxima [b, k, g, p] of the base-2 scan scores, ``chunk_pages`` pages at a time.

    Equals ``page_maxima(scan_scores(q, cache), cache)`` up to float summation order, without a full
    unpacked float copy of the codes (XLA does not fuse the unpacking into the dot, and such a copy
    costs as much as reading dense keys). Codes are unpacked plane by plane (one shift and mask each) and multiplied
    with the matching contiguous channel slice of ``q * scale``.
    """
    b, kh, p, w, bs = cache.codes.shape
    d = q.shape[-1]
    qg = _grouped(q, cache) * (LOG2E / math.sqrt(d))  # [b, k, g, d]
    if p == 0:
        return jnp.zeros((b, kh, qg.shape[2], 0), jnp.float32)
    chunk = _default_chunk(cache) if chunk_pages is None else int(chunk_pages)
    if chunk < 1 or p % chunk:
        raise ValueError(f"chunk_pages must be a positive divisor of the page count {p}; got {chunk_pages}")
    bits, n = cache.bits, 8 // cache.bits
    offset = (2**bits - 1) / 2

    # A fori_loop over page slices rather than lax.map over a moved page axis: measured on XLA CPU at 64k
    # tokens, the lax.map form made fast_ffd_decode ~3 ms slower even where its fallback branch (this
    # scan) is never taken, and it ran 1.5x slower itself.
    def one_chunk(i, m):
        c = jax.lax.dynamic_slice_in_dim(cache.codes, i * chunk, chunk, axis=2)  # [b, k, chunk, w, bs]
        s = jax.lax.dynamic_slice_in_dim(cache.scales, i * chunk, chunk, axis=2)  # [b, k, chunk, d]
        qs = qg[:, :, :, None] * s[:, :, None]  # [b, k, g, chunk, d]
        dot = 0.0
        for j in range(n):
            plane = ((c >> (bits * j)) & (2**bits - 1)).astype(jnp.float32)
            dot = dot + jnp.einsum("bkpct,bkgpc->bkgpt", plane, qs[..., j * w:(j + 1) * w])
        best = jnp.max(dot - offset * jnp.sum(qs, axis=-1)[..., None], axis=-1)  # [b, k, g, chunk]
        return jax.lax.dynamic_update_slice_in_dim(m, best, i * chunk, axis=3)

    m = jax.lax.fori_loop(0, p // chunk, one_chunk, jnp.zeros((b, kh, qg.shape[2], p), jnp.float32))
    return jnp.where(cache.valid_pages[:, None, None, :], m, -jnp.inf)


class GatheredOutput(NamedTuple):
    """Result of :func:`gathered_decode`: ``out`` [b, h, d], ``lse`` [b, h], ``keep`` [b, k, p] pages
    attended, ``overflow`` [b, k] int32 selected pages dropped beyond the capacity."""

    out: jax.Array
    lse: jax.Array
    keep: jax.Array
    overflow: jax.Array


def gathered_decode(q: jax.Array, cache: FFDCache, keep: jax.Array, priority: jax.Array, *, capacity: int,
                    use_residual: bool = True) -> GatheredOutput:
    """The XLA fast path: gather at most ``capacity`` selected pages per (b, KV head), then attend.

    XLA needs static shapes, so the gather has a static ``capacity``; when more pages are selected,
    those with the lowest ``priority`` (e.g. the scan maximum) are dropped and counted in
    ``overflow``. With ``capacity >= `` the selected count the result equals :func:`sparse_decode`.
    Only the gathered pages' codes, scales, residual and values are read.

    Args:
      q: [b, h, d] queries; cache: the FFD cache.
      keep: [b, k, p] bool selected pages; priority: [b, k, p] float, higher is kept first.
      capacity: positive int page budget (clipped at the page count).
      use_residual: refine the gathered pages' scan scores with the residual.
    """
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive int (pages per sequence and KV head), got {capacity!r}")
    cap = min(capacity, cache.num_pages)
    keep = keep & cache.valid_pages[:, None, :]
    none = jnp.zeros(keep.shape[:2], jnp.int32)
    if cap == 0:  # no page slots: only the current page
        cur = current_partial(q, cache)
        return GatheredOutput(cur.out.astype(q.dtype), cur.lse, keep, none)
    _, idx = jax.lax.top_k(jnp.where(keep, priority, -jnp.inf), cap)  # [b, k, cap]: selected first
    picked = jnp.take_along_axis(keep, idx, axis=-1)

    flat = (jnp.arange(keep.shape[1])[None, :, None] * cache.num_pages + idx).reshape(idx.shape[0], -1)

    def gather(x):  # [b, k, p, ...] -> [b, k, cap, ...]
        return _pages_at(x, flat).reshape(idx.shape + x.shape[3:])

    sub = cache._replace(codes=gather(cache.codes), scales=gather(cache.scales), residual=gather(cache.residual),
                         values=gather(cache.values), scan_keys=None, scan_scales=None, scan_l1=None)
    merged = merge_partials(q, [pages_partial(q, sub, picked, use_residual=use_residual), current_partial(q, cache)])
    bi, ki = jnp.arange(keep.shape[0])[:, None, None], jnp.arange(keep.shape[1])[None, :, None]
    attended = jnp.zeros_like(keep).at[bi, ki, idx].max(picked)
    overflow = (jnp.sum(keep, axis=-1) - jnp.sum(picked, axis=-1)).astype(jnp.int32)
    return GatheredOutput(merged.out, merged.lse, attended, overflow)


def int8_page_maxima(q: jax.Array, cache: FFDCache) -> tuple[jax.Array, jax.Array]:
    """Approximate per-head page maxima of the base-2 scan scores with a bound, from the int8 scan.

    The CPU scan of :func:`fast_ffd_decode`. With ``u = tau log2(e) q`` per query head, rounded to
    int8 with one scale ``a = max_d |u_d| / 127`` (``|u_d - a q8_d| <= a / 2``), and the scan keys
    ``|Khat - A k8| <= A / 2`` (:class:`FFDCache`), the scan score ``shat_t = u . Khat_t`` is
    approximated by ``a A (q8 . k8_t)``: one ``int8 x int8 -> int32`` product per KV head over all
    of its tokens (keys first, the order XLA's CPU dot runs fastest; exact, and exact in float32 too
    while ``127^2 d < 2^24``). Per token

        |shat_t - a A (q8 . k8_t)| <= A (a / 2 |k8_t|_1 + |u|_1 / 2),

    and ``|k8_t|_1 <= scan_l1`` of the page, so each page maximum moves by at most that bound; a
    slack of ``1e-3 |u|_1 127 A`` (127 A bounds ``|Khat|``) covers the reference's float32 rounding.

    Args:
      q: [b, h, d] queries.
      cache: an :class:`FFDCache` with ``scan_keys`` (``build_cache(..., scan_keys=True)``).

    Returns:
      ``(m, err)``, both [b, k, g, p] float32: the approximate page maxima (-inf on invalid pages)
      and their error bound.
    """
    if cache.scan_keys is None:
        raise ValueError("cache.scan_keys is None: build the cache with scan_keys=True for the int8 scan")
    b, kh, p, bs, d = cache.scan_keys.shape
    u = _grouped(q, cache) * (LOG2E / math.sqrt(q.shape[-1]))  # [b, k, g, d]
    g = u.shape[2]
    a = jnp.max(jnp.abs(u), axis=-1) / 127.0  # [b, k, g]
    q8 = jnp.clip(jnp.round(u / jnp.where(a > 0, a, 1.0)[..., None]), -127, 127).astype(jnp.int8)
    if g == 1:  # XLA's CPU int8 matrix-vector product converts the keys to int32 first (6x slower): add a zero row
        q8 = jnp.pad(q8, ((0, 0), (0, 0), (0, 1), (0, 0)))
    dot = jnp.einsum("bksd,bkgd->bksg", cache.scan_keys.reshape(b, kh, p * bs, d), q8,
                     preferred_element_type=jnp.int32)[..., :g]  # [b, k, s, g]
    best = jnp.moveaxis(jnp.max(dot.reshape(b, kh, p, bs, g), axis=3), 3, 2).astype(jnp.float32)  # [b, k, g, p]
    scale = cache.scan_scales[:, :, None, :]  # [b, k, 1, p]
    u1 = jnp.sum(jnp.abs(u), axis=-1)[..., None]  # [b, k, g, 1]
    m = a[..., None] * scale * best
    err = scale * (a[..., None] / 2 * cache.scan_l1[:, :, None, :] + u1 * (0.5 + 0.127)) + 1e-5
    return jnp.where(cache.valid_pages[:, None, None, :], m, -jnp.inf), err


def scan_candidates(q: jax.Array, cache: FFDCache, delta: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Pages the int8 scan cannot rule out: a superset of :func:`top_delta_keep`'s selection.

    A page is a candidate when, for some head of its GQA group, the upper bound ``m + err`` of
    :func:`int8_page_maxima` reaches the threshold ``m_ref - delta`` of :func:`reference_threshold`.

    Returns:
      ``(candidates [b, k, p] bool, priority [b, k, p] float32, threshold [b, k, g])``: priority is
      the group's best upper bound (-inf on invalid pages).
    """
    th = reference_threshold(q, cache, delta)  # [b, k, g]
    m, err = int8_page_maxima(q, cache)
    return _candidates(cache, th, m, err) + (th,)


def _candidates(cache: FFDCache, th: jax.Array, m: jax.Array, err: jax.Array) -> tuple[jax.Array, jax.Array]:
    upper = m + err
    cand = jnp.any(upper >= th[..., None], axis=2) & cache.valid_pages[:, None, :]
    return cand, jnp.max(upper, axis=2)


def _pages_at(x: jax.Array, flat: jax.Array) -> jax.Array:
    """Whole pages ``flat`` [b, c] (index ``head * p + page``) of a ``[b, k, p, ...]`` array -> ``[b, c, ...]``.

    One gather over the flattened (b, k, p) axis. float8 is gathered as its bytes: XLA on CPU
    otherwise converts every element to float16 and back around the gather.
    """
    b, kh, p = x.shape[:3]
    fp8 = x.dtype == jnp.float8_e4m3fn
    raw = jax.lax.bitcast_convert_type(x, jnp.uint8) if fp8 else x
    rows = (jnp.arange(b)[:, None] * (kh * p) + flat).reshape(-1)
    out = jnp.take(raw.reshape((b * kh * p,) + x.shape[3:]), rows, axis=0, mode="clip")
    out = out.reshape(flat.shape + x.shape[3:])
    return jax.lax.bitcast_convert_type(out, x.dtype) if fp8 else out


def _keys_scores(q: jax.Array, cache: FFDCache, x: jax.Array) -> jax.Array:
    """Base-2 scores ``tau log2(e) q . x`` [b, k, g, p, bs] of key pages ``x`` [b, k, p, bs, d], keys first
    (the order XLA's CPU dot reads without a transposed copy)."""
    b, kh, p, bs, d = x.shape
    dot = jnp.einsum("bksd,bkgd->bksg", x.astype(jnp.float32).reshape(b, kh, p * bs, d), _grouped(q, cache))
    return LOG2E / math.sqrt(d) * jnp.moveaxis(dot, 3, 2).reshape(b, kh, -1, p, bs)


def _settled(cache: FFDCache, th: jax.Array, m: jax.Array, err: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(sure, unsure)`` [b, k, p]: pages the int8 bounds keep (lower bound ``m - err`` reaches the
    threshold for some head) and pages they leave open (not sure; upper bound reaches it)."""
    valid = cache.valid_pages[:, None, :]
    sure = jnp.any(m - err >= th[..., None], axis=2) & valid
    return sure, jnp.any(m + err >= th[..., None], axis=2) & valid & ~sure


def _sorted_keys_decode(q: jax.Array, cache: FFDCache, keys: jax.Array, th: jax.Array, sure: jax.Array,
                        unsure: jax.Array, priority: jax.Array, capacity: int) -> GatheredOutput:
    """FFD over every page from their exact keys, selection settled by the int8 bounds where they can.

    The pages the int8 bounds keep (``sure``, :func:`_settled`) are kept; the exact scan decides the
    ``unsure`` ones (at most ``capacity`` per sequence, gathered best ``priority`` first); the rest are
    dropped. The kept pages attend with ``q . K``:
    a dense decode step's reads (keys and values) plus the scan, where :func:`_exact_keys_decode`
    also reads the residual.
    """
    b, kh, p = sure.shape
    flat, _, _, _, _, checked = _check_slots(q, cache, unsure, priority, th, capacity)
    keep = sure | jnp.zeros((b, kh * p), bool).at[jnp.arange(b)[:, None], flat].max(checked).reshape(b, kh, p)
    merged = merge_partials(q, [_masked_partial(q, _keys_scores(q, cache, keys), keep, cache.values),
                                current_partial(q, cache)])
    return GatheredOutput(merged.out, merged.lse, keep, jnp.zeros((b, kh), jnp.int32))


def _exact_keys_decode(q: jax.Array, cache: FFDCache, keys: jax.Array, th: jax.Array) -> GatheredOutput:
    """FFD over every page from their exact keys ``keys`` [b, k, p, bs, d] (a float32 residual).

    The scan scores are ``q . K - q . R`` (``Khat = K - R``), two dense products instead of unpacking
    every page's codes (which XLA on CPU does not fuse into a product); the kept pages attend with
    ``q . K``, the refined score. Same selection and output as :func:`ffd_decode` up to float32
    rounding of the scores.
    """
    b, kh = keys.shape[:2]
    exact = _keys_scores(q, cache, keys)
    m = page_maxima(exact - _keys_scores(q, cache, cache.residual), cache)  # [b, k, g, p]
    keep = jnp.any(m >= th[..., None], axis=2) & cache.valid_pages[:, None, :]
    merged = merge_partials(q, [_masked_partial(q, exact, keep, cache.values), current_partial(q, cache)])
    return GatheredOutput(merged.out, merged.lse, keep, jnp.zeros((b, kh), jnp.int32))


def _exact_scan_decode(q, cache, th, capacity, use_residual, chunk_pages) -> GatheredOutput:
    """Exact float scan of every page (chunked unpacking), then :func:`gathered_decode`."""
    m = chunked_page_maxima(q, cache, chunk_pages=chunk_pages)  # [b, k, g, p]
    keep = jnp.any(m >= th[..., None], axis=2)
    return gathered_decode(q, cache, keep, jnp.max(m, axis=2), capacity=capacity, use_residual=use_residual)


def _check_slots(q: jax.Array, cache: FFDCache, pages: jax.Array, priority: jax.Array, th: jax.Array, capacity: int):
    """The exact scan of the ``capacity`` best of ``pages`` [b, k, p] (by ``priority``) of each sequence.

    Returns ``(flat [b, c] slot indices head * p + page, usable [b, c] the slot holds one of pages,
    head [b, c] its KV head, q_slot [b, c, g, d] its queries, shat [b, c, g, bs] its exact base-2 scan
    scores (the reference formula), keep [b, c] its page reaches the threshold for some head)``.
    """
    b, kh, p = pages.shape
    d = q.shape[-1]
    _, flat = jax.lax.top_k(jnp.where(pages, priority, -jnp.inf).reshape(b, kh * p), capacity)  # [b, c]
    usable = jnp.take_along_axis(pages.reshape(b, kh * p), flat, axis=-1)
    head = flat // p
    q_slot = jnp.take_along_axis(_grouped(q, cache), head[:, :, None, None], axis=1)  # [b, c, g, d]
    # The reference scan on a cache of one page per slot, the slot standing in for its KV head.
    slots = cache._replace(codes=_pages_at(cache.codes, flat)[:, :, None],
                           scales=_pages_at(cache.scales, flat)[:, :, None])
    shat = scan_scores(q_slot.reshape(b, -1, d), slots)[:, :, :, 0]  # [b, c, g, bs]
    keep = jnp.any(jnp.max(shat, axis=-1) >= jnp.take_along_axis(th, head[:, :, None], axis=1), axis=-1) & usable
    return flat, usable, head, q_slot, shat, keep


def _candidates_decode(q: jax.Array, cache: FFDCache, cand: jax.Array, priority: jax.Array, th: jax.Array,
                       capacity: int, use_residual: bool) -> GatheredOutput:
    """FFD over the ``capacity`` best candidate pages of each sequence, its KV heads pooled.

    Each page slot ``c`` carries its KV head; its exact scan scores (the reference formula) decide
    the selection, and one softmax per head covers its kept slots' refined scores and its exact
    current page (per-head sums over slots are products with a one-hot [b, c, k] matrix).
    """
    b, kh, p = cand.shape
    bs, d = cache.page_size, q.shape[-1]
    flat, usable, head, q_slot, shat, keep = _check_slots(q, cache, cand, priority, th, capacity)
    qg = _grouped(q, cache)  # [b, k, g, d]
    tau = LOG2E / math.sqrt(d)
    scores = shat
    if use_residual:  # keys first: the order XLA's CPU dot reads without a transposed copy
        res = _pages_at(cache.residual, flat).astype(jnp.float32)
        scores = scores + tau * jnp.swapaxes(jnp.einsum("bctd,bcgd->bctg", res, q_slot), 2, 3)
    scores = jnp.where(keep[:, :, None, None], scores, -jnp.inf)  # [b, c, g, bs]
    one_hot = head[..., None] == jnp.arange(kh)  # [b, c, k]
    cur_len = cache.lengths - cache.full_pages * bs  # [b]
    cur = tau * jnp.einsum("bkgd,bktd->bkgt", qg, cache.current_keys.astype(jnp.float32))
    cur = jnp.where((jnp.arange(bs)[None, :] < cur_len[:, None])[:, None, None, :], cur, -jnp.inf)
    slot_max = jnp.where(one_hot[..., None], jnp.max(scores, axis=-1)[:, :, None, :], -jnp.inf)  # [b, c, k, g]
    top = jnp.maximum(jnp.max(slot_max, axis=1), jnp.max(cur, axis=-1))  # [b, k, g]
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.exp2(scores - jnp.take_along_axis(top, head[:, :, None], axis=1)[..., None])
    w_cur = jnp.exp2(cur - top[..., None])
    values = _pages_at(cache.values, flat).astype(jnp.float32)  # [b, c, bs, d]
    pool = one_hot.astype(jnp.float32)
    total = jnp.einsum("bck,bcg->bkg", pool, jnp.sum(w, axis=-1)) + jnp.sum(w_cur, axis=-1)
    out = jnp.einsum("bck,bcgd->bkgd", pool, jnp.einsum("bcgt,bctd->bcgd", w, values))
    out = out + jnp.einsum("bkgt,bktd->bkgd", w_cur, cache.current_values.astype(jnp.float32))
    out = out / jnp.maximum(total, 1e-30)[..., None]
    lse = jnp.where(total > 0, (top + jnp.log2(jnp.maximum(total, 1e-30))) / LOG2E, -jnp.inf)
    attended = jnp.zeros((b, kh * p), bool).at[jnp.arange(b)[:, None], flat].max(keep).reshape(b, kh, p)
    return GatheredOutput(out.reshape(q.shape).astype(q.dtype), lse.reshape(q.shape[:2]), attended,
                          jnp.zeros((b, kh), jnp.int32))


def fast_ffd_decode(q: jax.Array, cache: FFDCache, *, delta: float = 5.0, capacity: int | None = None,
                    use_residual: bool = True, chunk_pages: int | None = None,
                    keys: jax.Array | None = None, fallback_capacity: int | None = None) -> GatheredOutput:
    """FFD on XLA without the kernel (the CPU path): int8 scan, exact check of candidates, gathered attention.

    Dimension legend: ``b`` batch, ``h = k g`` query heads over ``k`` KV heads, ``p`` pages of ``bs``
    tokens, ``d`` head dim, ``c`` the static page ``capacity``.

    XLA on CPU does not fuse 2-bit unpacking into a dot (an unpacked float scan is as slow as dense
    decode), but an ``int8 x int8`` dot over one-byte keys is fast. So, with ``cache.scan_keys``:

    1. the threshold ``m_ref - delta`` comes from the first and last full page (exact, two pages);
    2. :func:`int8_page_maxima` scans every page with one int8 query per head and returns page
       maxima with a proven error bound; pages whose upper bound reaches the threshold are
       candidates (:func:`scan_candidates`, a superset of the reference selection);
    3. the ``c`` candidates with the best upper bound of each sequence, over all of its KV heads
       (heads keep different numbers of pages, so a shared budget gathers fewer pages than one per
       head), are gathered; their exact float scan scores (the reference formula on the packed
       codes) decide the selection exactly as :func:`top_delta_keep`, and one softmax per head
       covers its kept pages and its exact current page. The gather's size is static, so it is
       compiled at ``c / 16``, ``c / 4`` and ``c`` slots and the step runs the smallest that holds
       the candidates (``lax.switch``): a step with few candidates reads few pages.

    If a sequence has more than ``c`` candidates, the whole call falls back (``lax.cond``, only one
    branch runs) to the exact float scan of every page followed by :func:`gathered_decode` with ``c``
    pages per KV head, so the result never depends on the int8 approximation. Without
    ``scan_keys`` that exact path is the only one. Given the pages' exact ``keys`` (an incremental KV
    cache holds them), the fallback instead scores every page from them (``q . K - q . R``, no
    unpacking) and attends to every kept page: about the cost of a dense decode step, and FFD's
    result whatever the selection's size.

    Args:
      q: [b, h, d] queries; cache: the FFD cache.
      delta: margin in log2 units (``inf`` keeps every valid page).
      capacity: static page budget ``c``: candidate pages gathered per sequence over all its KV heads
        (the exact fallback: per KV head). Default: every page of every KV head.
      use_residual: refine kept pages with the residual.
      chunk_pages: scan chunk of the exact fallback (see :func:`chunked_page_maxima`).
      keys: None, or the exact keys of the page slots [b, k, p, bs, d] (:func:`head_major_pages` of
        the dense cache; the residual must be float32): the exact fallback then scores every page
        from them and keeps every selected page (``use_residual`` must be True).
      fallback_capacity: without ``keys``, the pages per KV head the exact fallback keeps (default
        ``capacity``; ``cache.num_pages`` keeps every selected page: FFD's result always, at the
        cost of unpacking every page on an overflowing step).

    Returns:
      :class:`GatheredOutput`. Same selection as :func:`top_delta_keep`; ``out`` equals
      :func:`ffd_decode` whenever ``capacity`` covers the candidates or ``keys`` is given (else the
      exact fallback keeps at most ``fallback_capacity`` pages per KV head: those with the lowest scan
      maxima are dropped and counted in ``overflow``).
    """
    kh, p = cache.scales.shape[1], cache.num_pages
    cap_in = max(kh * p, 1) if capacity is None else capacity
    if not isinstance(cap_in, int) or cap_in < 1:
        raise ValueError(f"capacity must be a positive int (pages per sequence), got {capacity!r}")
    fallback = cap_in if fallback_capacity is None else fallback_capacity
    if not isinstance(fallback, int) or fallback < 1:
        raise ValueError(f"fallback_capacity must be a positive int (pages per KV head), got {fallback_capacity!r}")
    if keys is not None:
        if keys.shape != cache.residual.shape or cache.residual.dtype != jnp.float32:
            raise ValueError(f"keys must have the pages' shape {cache.residual.shape} with a float32 residual; got "
                             f"keys {keys.shape}, residual {cache.residual.dtype}")
        if not use_residual:
            raise ValueError("keys (the exact-keys fallback) attends with the exact keys: use_residual must be True")
    th = reference_threshold(q, cache, delta)  # [b, k, g]
    if cache.scan_keys is None or p == 0:
        if keys is not None:
            return _exact_keys_decode(q, cache, keys, th)
        return _exact_scan_decode(q, cache, th, fallback, use_residual, chunk_pages)
    m, err = int8_page_maxima(q, cache)
    cand, priority = _candidates(cache, th, m, err)
    cap = min(cap_in, kh * p)
    tiers = sorted({max(1, cap // 16), max(1, cap // 4), cap})  # gathered slots: the smallest that holds them

    def sparse(tier):
        return lambda: _candidates_decode(q, cache, cand, priority, th, tier, use_residual)

    def exact():
        if keys is None:
            return _exact_scan_decode(q, cache, th, fallback, use_residual, chunk_pages)
        # Many pages pass: attend to every kept page from the exact keys (a dense step's reads); the
        # exact scan settles the pages the int8 bounds leave open, or, past ``cap`` of them, every page.
        sure, unsure = _settled(cache, th, m, err)
        return jax.lax.cond(jnp.max(jnp.sum(unsure, axis=(1, 2))) > cap,
                            lambda: _exact_keys_decode(q, cache, keys, th),
                            lambda: _sorted_keys_decode(q, cache, keys, th, sure, unsure, priority, cap))

    most = jnp.max(jnp.sum(cand, axis=(1, 2)))  # candidates of the sequence that has the most
    branch = sum((most > t).astype(jnp.int32) for t in tiers)  # len(tiers): more than the capacity
    return jax.lax.switch(branch, [sparse(t) for t in tiers] + [exact])


class DecodeProblem(NamedTuple):
    """A synthetic decode step: ``q`` [b, h, d], ``keys``/``values`` [b, s, k, d], ``lengths`` [b],
    ``peaked`` [b, k] bool (which KV heads have sink-and-needle attention)."""

    q: jax.Array
    keys: jax.Array
    values: jax.Array
    lengths: jax.Array
    peaked: jax.Array


def synthetic_problem(key: jax.Array, *, batch: int, tokens: int, kv_heads: int, group: int, head_dim: int,
                      page_size: int = 128, peaked_fraction: float = 1.0, needles: int = 4,
                      needle_gap: float = 6.0, sink_gap: float = 8.0, spread: float = 1.0,
                      flat_spread: float = 0.3, head_noise: float = 0.3) -> DecodeProblem:
    """Decode instances with the attention shapes FFD relies on (test and benchmark data).

    Background keys are standard normal and each query head is ``spread * sqrt(d)`` times a unit
    direction shared by its GQA group (plus ``head_noise``), so background logits are about
    ``N(0, spread^2)``. A KV head is *peaked* with probability ``peaked_fraction``: its first four
    tokens form an attention sink (logit raised by ``sink_gap`` nats) and one token in each of
    ``needles`` random pages is raised by ``needle_gap``; a *flat* head has neither and background
    spread ``flat_spread``, so its attention mass is spread over every page.
    """
    if tokens < 2 * page_size:
        raise ValueError(f"tokens must be >= 2 * page_size ({2 * page_size}), got {tokens}")
    ks = jax.random.split(key, 7)
    b, s, kh, g, d = batch, tokens, kv_heads, group, head_dim
    direction = jax.random.normal(ks[0], (b, kh, 1, d))
    heads = direction + head_noise * jax.random.normal(ks[1], (b, kh, g, d))
    heads = heads / jnp.linalg.norm(heads, axis=-1, keepdims=True)
    peaked = jax.random.uniform(ks[2], (b, kh)) < peaked_fraction
    scale = jnp.where(peaked, spread, flat_spread)[..., None, None] * math.sqrt(d)
    q = (scale * heads).reshape(b, kh * g, d)
    keys = jax.random.normal(ks[3], (b, s, kh, d))
    values = jax.random.normal(ks[4], (b, s, kh, d))
    # Planted logits: add c * u to a key, u the group's mean query direction, so q_g . k grows by
    # about c * |q| (u . q_g / |q|); c is set so the mean head's logit grows by the gap.
    u = heads.mean(2)
    u = u / jnp.linalg.norm(u, axis=-1, keepdims=True)  # [b, k, d]
    qnorm = jnp.where(peaked, spread, flat_spread) * math.sqrt(d) / math.sqrt(d)  # logits = q . k / sqrt(d)
    num_pages = s // page_size
    bump = jnp.zeros((b, s, kh))
    bump = bump.at[:, :4].set(jnp.where(peaked, sink_gap, 0.0)[:, None, :])
    pages = jax.vmap(jax.vmap(lambda kk: jax.random.choice(kk, jnp.arange(1, num_pages - 1), (needles,),
                                                           replace=False)))(
        jax.random.split(ks[5], b * kh).reshape(b, kh))  # [b, k, needles] interior pages
    offs = jax.random.randint(ks[6], (b, kh, needles), 0, page_size)
    pos = pages * page_size + offs
    bi = jnp.arange(b)[:, None, None]
    ki = jnp.arange(kh)[None, :, None]
    bump = bump.at[bi, pos, ki].set(jnp.where(peaked, needle_gap, 0.0)[..., None])
    keys = keys + (bump / qnorm[:, None, :])[..., None] * u[:, None]
    return DecodeProblem(q, keys, values, jnp.full((b,), s, jnp.int32), peaked)


def dense_decode(q: jax.Array, keys: jax.Array, values: jax.Array, lengths: jax.Array) -> jax.Array:
    """Exact dense decode attention (the reference FFD approximates)."""
    return decode_attention(q, keys, values, lengths)


def kept_fraction(keep: jax.Array, cache: FFDCache) -> jax.Array:
    """Kept full pages over valid full pages, over the whole batch and all KV heads (0 if none)."""
    valid = jnp.broadcast_to(cache.valid_pages[:, None, :], keep.shape)
    return jnp.sum(keep & valid) / jnp.maximum(jnp.sum(valid), 1)


def modeled_bytes(*, batch: int, tokens: int, kv_heads: int, head_dim: int, page_size: int = 128,
                  bits: int = 2, kept: float = 1.0, kv_bytes: int = 2, residual_bytes: int = 1) -> dict:
    """Bytes one decode step reads: dense (K and V at ``kv_bytes``) against FFD.

    FFD reads every full page's codes and scales, the residual and values of the kept fraction,
    and the current page exactly (at most one page, counted as one full page).
    """
    elems = batch * tokens * kv_heads * head_dim
    dense = 2 * kv_bytes * elems
    pages = tokens // page_size
    scales = batch * pages * kv_heads * head_dim * 4
    current = 2 * kv_bytes * batch * min(page_size, tokens) * kv_heads * head_dim
    ffd = elems * bits / 8 + scales + kept * elems * (residual_bytes + kv_bytes) + current
    return {"dense": float(dense), "ffd": float(ffd), "ratio": float(ffd / dense)}
