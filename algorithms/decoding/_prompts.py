"""Argument checks shared by the decoding loops (`generate`, `vegas.speculative_generate`).

Dimension legend: `b` batch, `P` padded prompt length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def check_prompts(prompts, prompt_lengths=None, *, max_new_tokens: int) -> tuple[jax.Array, jax.Array, int, int]:
    """Validates a right-padded prompt block and its lengths.

    Args:
      prompts: [b, P] int prompt tokens (array-like).
      prompt_lengths: [b] real prompt lengths in [1, P] (checked when concrete); None = P for every row.
      max_new_tokens: N, must be >= 1.

    Returns:
      (prompts [b, P], prompt_lengths [b] int32, b, P).

    Raises:
      ValueError: naming the argument and the offending shape or values.
    """
    prompts = jnp.asarray(prompts)
    if prompts.ndim != 2:
        raise ValueError(f"prompts must be [b, P]; got shape {prompts.shape}")
    b, p = prompts.shape
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
    if prompt_lengths is None:
        prompt_lengths = jnp.full((b,), p, jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
    if prompt_lengths.shape != (b,):
        raise ValueError(f"prompt_lengths must have shape [b]=({b},); got {prompt_lengths.shape}")
    if not isinstance(prompt_lengths, jax.core.Tracer):
        lengths_np = np.asarray(prompt_lengths)
        if lengths_np.min() < 1 or lengths_np.max() > p:
            raise ValueError(f"prompt_lengths must lie in [1, P={p}]; got {lengths_np.tolist()}")
    return prompts, prompt_lengths, b, p


def resolve_key(key: jax.Array | None, greedy: bool) -> jax.Array:
    """`key`, or a fixed key for a greedy sampler (which draws nothing); a non-greedy one needs a key."""
    if key is None:
        if not greedy:
            raise ValueError("a PRNG key is required for a non-greedy sampler; pass key=")
        key = jax.random.key(0)
    return key
