"""An explicit KV-cache pytree for the decoder LM.

Dimension legend: `L` layers, `b` batch, `S` cache capacity (max tokens),
`k` key/value heads, `d` head dim, `T` tokens appended in one call.

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
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["KVCache", "init_cache", "write_tokens", "truncate"]


class KVCache(NamedTuple):
    """Per-layer keys and values plus the number of valid entries per sequence.

    Attributes:
      keys: tuple of L arrays [b, S, k, d].
      values: tuple of L arrays [b, S, k, d].
      lengths: [b] int32, valid entries per sequence.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    lengths: jax.Array

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]


def init_cache(
    *, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int, head_dim: int, dtype=jnp.float32
) -> KVCache:
    """An empty cache (all lengths 0) with room for `capacity` tokens per sequence."""
    for name, value in (("num_layers", num_layers), ("batch_size", batch_size), ("capacity", capacity)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value}")
    shape = (batch_size, capacity, num_kv_heads, head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
    return KVCache(keys=zeros, values=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                   lengths=jnp.zeros((batch_size,), jnp.int32))


def write_tokens(buffer: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """Writes new[b, j] to buffer[b, start[b] + j]; indices past the capacity are dropped.

    Args:
      buffer: [b, S, ...] cache buffer.
      new: [b, T, ...] entries to write.
      start: [b] first index to write per sequence.

    Returns:
      The updated buffer [b, S, ...].
    """
    b, t = new.shape[:2]
    rows = jnp.arange(b)[:, None]
    cols = start[:, None] + jnp.arange(t)[None, :]
    return buffer.at[rows, cols].set(new.astype(buffer.dtype), mode="drop")


def truncate(cache: KVCache, lengths: jax.Array) -> KVCache:
    """Rolls the cache back to `lengths` [b] (must not exceed the current lengths)."""
    return cache._replace(lengths=jnp.minimum(cache.lengths, lengths.astype(jnp.int32)))
