"""An explicit KV-cache pytree for the decoder LM.

Dimension legend: `L` layers, `b` batch, `S` cache capacity (max tokens),
`k` key/value heads, `d` head dim, `T` tokens appended in one call.

Axis order (`KVCache.layout`, static): "bskd" stores each layer's keys and
values token-major [b, S, k, d]; "bksd" head-major [b, k, S, d]. The maths is
the same; what differs is which reads are contiguous. A decode step reads every
cached key of a head against that head's queries, and XLA's CPU dot over the
strided head axis of "bskd" runs about 6x slower than over "bksd" at 64k tokens
(`python -m pallas_kernels.bench --only decode` measures both in one run), so
the decoder LM's default is "bksd" on CPU. On GPU and TPU the default stays
"bskd", the order the Pallas kernels were tuned on (both orders are supported
by every kernel; no accelerator measurement has chosen between them yet; compiled
for TPU, the decode step writes and reads either order without copying a cache
buffer: `python -m experiments aot lm_1b --decode 32768`).

The cache is a plain NamedTuple, so it passes through `jax.jit`,
`lax.while_loop` and `lax.scan` carries unchanged. One mechanism covers the
three uses the papers need:

  * prefill: an empty cache (lengths 0) and a right-padded prompt block with
    per-sequence `num_valid` tokens,
  * single-token decode: T = 1,
  * multi-token append (speculative verification): T = gamma + 1; rejected
    tokens are rolled back by lowering `lengths` (`truncate`), because entries at
    index >= lengths[b] are never read.

Writes are scatters with out-of-range indices dropped, never clamped, so an
append that does not fit cannot overwrite valid entries.

FFD decoding (`AttentionConfig(decode="ffd")`) also needs the keys of every
full page quantized to low-bit codes (`primitives.ffd`). `init_cache(...,
ffd_page_size=...)` adds those per-layer page slots (`KVCache.pages`,
`primitives.ffd.FFDPages`); the model quantizes each page once, in the call
whose append completes it (`primitives.ffd.update_pages`), instead of
re-quantizing the whole cache every step. Rollback needs nothing more: a page
is quantized again whenever an append completes it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from primitives import ffd
from primitives.attention import KV_LAYOUTS, default_kv_layout, kv_token_axis

__all__ = ["KVCache", "KV_LAYOUTS", "default_kv_layout", "init_cache", "write_tokens", "truncate", "token_major"]


@functools.partial(jax.tree_util.register_dataclass, data_fields=["keys", "values", "lengths", "pages"],
                   meta_fields=["layout"])
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Per-layer keys and values plus the number of valid entries per sequence.

    A pytree whose `layout` is static metadata, so it passes through `jax.jit` and loop carries.

    Attributes:
      keys: tuple of L arrays [b, S, k, d] ("bskd") or [b, k, S, d] ("bksd").
      values: tuple of L arrays, the keys' shape.
      lengths: [b] int32, valid entries per sequence.
      layout: "bskd" or "bksd", the axis order of keys and values.
      pages: None, or a tuple of L `primitives.ffd.FFDPages`: each layer's full pages of keys
        quantized for FFD decoding (`init_cache(..., ffd_page_size=...)`), kept current by the
        model as appends complete pages. Keys written around the model (`replace(keys=...)`) leave
        them stale: rebuild with `primitives.ffd.quantize_key_pages`, or drop them (`pages=None`)
        and FFD quantizes the whole cache at every step.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    lengths: jax.Array
    layout: str = "bskd"
    pages: tuple[ffd.FFDPages, ...] | None = None

    def __post_init__(self):
        kv_token_axis(self.layout)  # validates

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[kv_token_axis(self.layout)]

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def replace(self, **changes) -> "KVCache":
        """A copy with the given fields replaced (e.g. `cache.replace(lengths=...)`)."""
        return dataclasses.replace(self, **changes)


def init_cache(
    *, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int, head_dim: int, dtype=jnp.float32,
    layout: str = "bskd", ffd_page_size: int | None = None, ffd_bits: int = 2, ffd_scan_keys: bool = True,
    ffd_residual_dtype=jnp.float32,
) -> KVCache:
    """An empty cache (all lengths 0) with room for `capacity` tokens per sequence, in `layout`.

    With `ffd_page_size`, also the FFD page slots (`KVCache.pages`, keys quantized to `ffd_bits` bits,
    the residual stored as `ffd_residual_dtype`, with the int8 scan keys of the XLA fast path when
    `ffd_scan_keys`), and the capacity rounded up to
    whole pages, so the dense cache is paged by a reshape, never a copy.
    """
    for name, value in (("num_layers", num_layers), ("batch_size", batch_size), ("capacity", capacity)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value}")
    kv_token_axis(layout)
    if ffd_page_size is not None:
        capacity = -(-capacity // ffd_page_size) * ffd_page_size
    shape = ((batch_size, capacity, num_kv_heads, head_dim) if layout == "bskd"
             else (batch_size, num_kv_heads, capacity, head_dim))
    pages = None
    if ffd_page_size is not None:
        pages = tuple(ffd.init_pages(batch_size, num_kv_heads, capacity, head_dim, page_size=ffd_page_size,
                                     bits=ffd_bits, residual_dtype=ffd_residual_dtype,
                                     scan_keys=ffd_scan_keys) for _ in range(num_layers))
    return KVCache(keys=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                   values=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                   lengths=jnp.zeros((batch_size,), jnp.int32), layout=layout, pages=pages)


def write_tokens(buffer: jax.Array, new: jax.Array, start: jax.Array, *, layout: str = "bskd") -> jax.Array:
    """Writes new[b, j] to token index start[b] + j of buffer; indices past the capacity are dropped.

    Args:
      buffer: [b, S, k, d] ("bskd"; any trailing dims) or [b, k, S, d] ("bksd") cache buffer.
      new: [b, T, k, d] entries to write (token-major, as the projections produce them).
      start: [b] first token index to write per sequence.
      layout: the buffer's axis order.

    Returns:
      The updated buffer, buffer's shape.
    """
    b, t = new.shape[:2]
    cols = start[:, None] + jnp.arange(t)[None, :]  # [b, T]
    if kv_token_axis(layout) == 1:
        return buffer.at[jnp.arange(b)[:, None], cols].set(new.astype(buffer.dtype), mode="drop")
    heads = jnp.arange(buffer.shape[1])[None, :, None]
    return buffer.at[jnp.arange(b)[:, None, None], heads, cols[:, None, :]].set(
        jnp.swapaxes(new, 1, 2).astype(buffer.dtype), mode="drop")


def token_major(x: jax.Array, layout: str) -> jax.Array:
    """One layer's keys or values as [b, S, k, d] (a transpose, i.e. a copy, for "bksd").

    For consumers that only exist in token-major form; the decode paths read both orders natively.
    """
    return x if kv_token_axis(layout) == 1 else jnp.swapaxes(x, 1, 2)


def truncate(cache: KVCache, lengths: jax.Array) -> KVCache:
    """Rolls the cache back to `lengths` [b] (must not exceed the current lengths)."""
    return cache.replace(lengths=jnp.minimum(cache.lengths, lengths.astype(jnp.int32)))
