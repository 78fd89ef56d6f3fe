"""Acceptance rules of speculative decoding: greedy prefix matching and speculative (rejection) sampling.

Dimension legend: ``g`` draft tokens (gamma), ``v`` vocabulary.

A drafter proposes ``g`` tokens ``x_0..x_{g-1}`` with probabilities ``q_i``; one target pass scores
the ``g + 1`` positions, ``p_0..p_g``. Both rules return ``(a, y)``: the number of accepted drafts
``a`` in [0, g] and the token ``y`` emitted after them (the correction at position ``a``, or the
bonus token when ``a = g``), so one iteration emits ``a + 1`` tokens.

* **Greedy** (temperature 0): accept the longest prefix with ``x_i = argmax p_i``; ``y = argmax p_a``.
  The emitted tokens are exactly those of greedy decoding with the target model.
* **Speculative sampling** (Leviathan et al. 2023; Chen et al. 2023): accept ``x_i`` with probability
  ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection emit ``y ~ norm(max(0, p_a - q_a))``; if all
  are accepted emit ``y ~ p_g``. Every emitted token is distributed exactly as under the target
  model (tested by a chi-square test on the first token).

Example:
    >>> import jax.numpy as jnp
    >>> target = jnp.log(jnp.array([[.1, .9, 0.], [.8, .1, .1], [.2, .2, .6]]))   # p_0, p_1, p_2
    >>> a, y = greedy_accept(jnp.array([1, 2]), target)                            # x_1 = 2 != argmax p_1
    >>> int(a), int(y)
    (1, 0)

References:
  Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023
    (arXiv:2211.17192).
  Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling",
    arXiv:2302.01318, 2023.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["greedy_accept", "speculative_accept"]


def _check(drafts: jax.Array, target: jax.Array) -> None:
    if drafts.ndim != 1 or target.ndim != 2 or target.shape[0] != drafts.shape[0] + 1:
        raise ValueError(f"drafts must be [g] and the target [g + 1, v]; got {drafts.shape} and {target.shape}")


def _first_false(ok: jax.Array) -> jax.Array:
    """Index of the first False in a bool vector, or its length if all True."""
    g = ok.shape[0]
    return jnp.min(jnp.where(ok, g, jnp.arange(g)), initial=g).astype(jnp.int32)


def greedy_accept(drafts: jax.Array, target_logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Greedy verification.

    Args:
      drafts: [g] draft tokens.
      target_logits: [g + 1, v] target logits (or log-probs) at the g + 1 verified positions.

    Returns:
      (accepted drafts a in [0, g], next token argmax target_logits[a]), int32 scalars.
    """
    _check(drafts, target_logits)
    best = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
    a = _first_false(best[:-1] == drafts.astype(jnp.int32))
    return a, best[a]


def speculative_accept(key: jax.Array, drafts: jax.Array, draft_probs: jax.Array,
                       target_probs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Speculative-sampling verification (lossless for any drafter).

    Args:
      key: PRNG key.
      drafts: [g] draft tokens, drawn from ``draft_probs``.
      draft_probs: [g, v] the drafter's distributions q_i (after temperature / top-k / top-p).
      target_probs: [g + 1, v] the target's distributions p_i under the same sampler.

    Returns:
      (accepted drafts a in [0, g], the emitted token y), int32 scalars.
    """
    _check(drafts, target_probs)
    g = drafts.shape[0]
    if draft_probs.shape != (g, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be [g, v]=({g}, {target_probs.shape[1]}); got {draft_probs.shape}")
    k_accept, k_resample = jax.random.split(key)
    idx = jnp.arange(g)
    p_x = target_probs[idx, drafts]
    q_x = draft_probs[idx, drafts]
    u = jax.random.uniform(k_accept, (g,))
    ok = u * q_x < p_x  # u < min(1, p/q) without dividing (q_x > 0 for a sampled draft)
    a = _first_false(ok)
    p_a = target_probs[a]
    q_a = jnp.concatenate([draft_probs, jnp.zeros_like(draft_probs[:1])])[a]  # q_g = 0: bonus token from p_g
    residual = jnp.maximum(p_a - q_a, 0.0)
    mass = residual.sum()
    dist = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_a)  # p == q at a: any draw from p
    # log only where dist > 0: a subnormal floor (log(max(dist, 1e-38))) gave NaN for the zero entries under
    # jit on jaxlib 0.11's CPU backend, and categorical then drew tokens of probability 0.
    logits = jnp.where(dist > 0, jnp.log(jnp.where(dist > 0, dist, 1.0)), -jnp.inf)
    y = jax.random.categorical(k_resample, logits)
    return a, y.astype(jnp.int32)
