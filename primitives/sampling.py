"""Token sampling: greedy, temperature, top-k and top-p, as pure functions.

Dimension legend: `...` any leading batch dims, `v` vocabulary.

Every sampler is a pure function `(logits [..., v], key) -> tokens [...]` (int32)
with keyword-only static options; `greedy` ignores the key. The filters
`top_k_logits` / `top_p_logits` return logits with the excluded entries at -inf,
so speculative decoding and RL can read the exact sampling distribution with
`jax.nn.log_softmax`. `Sampler` bundles temperature, top-k and top-p into one
hashable value that `algorithms.decoding.generate` can take as a static
argument and that reports the log-probabilities of the distribution it samples.

References:
  Fan, Lewis, Dauphin, "Hierarchical Neural Story Generation", arXiv:1805.04833, 2018 (top-k).
  Holtzman et al., "The Curious Case of Neural Text Degeneration", arXiv:1904.09751, 2019 (top-p).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from primitives.validation import check_finite, check_int

__all__ = [
    "greedy",
    "temperature_sample",
    "top_k_sample",
    "top_p_sample",
    "top_k_logits",
    "top_p_logits",
    "Sampler",
]


def _check_temperature(temperature: float) -> None:
    check_finite("temperature", temperature)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use greedy for 0); got temperature={temperature}")


def _check_vocab(logits: jax.Array) -> None:
    shape = jnp.shape(logits)
    if len(shape) == 0 or shape[-1] == 0:
        raise ValueError(f"logits must be [..., v] with a non-empty vocabulary v >= 1; got shape {shape}")


def greedy(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """Argmax token (ties go to the lowest id). `key` is accepted and ignored.

    Examples:
      >>> import jax.numpy as jnp
      >>> greedy(jnp.array([[0.0, 2.0, 1.0]]))
      Array([1], dtype=int32)
    """
    del key
    _check_vocab(logits)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def top_k_logits(logits: jax.Array, k: int) -> jax.Array:
    """Keeps the k largest logits per row (ties at the k-th value are all kept); others -> -inf."""
    v = logits.shape[-1]
    if not 1 <= k <= v:
        raise ValueError(f"k must be in [1, vocab={v}]; got k={k}")
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits >= kth, logits, -jnp.inf)


def top_p_logits(logits: jax.Array, p: float) -> jax.Array:
    """Nucleus filter: keeps the smallest set of top tokens whose probability reaches p.

    A token is kept when the probability mass of the tokens strictly more
    likely than it is below p, so the most likely token is always kept.
    """
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1]; got p={p}")
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    sorted_probs = jnp.sort(probs, axis=-1)[..., ::-1]
    # Mass strictly before each sorted position.
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < p
    # Smallest kept probability per row; keep every token at least that likely.
    threshold = jnp.min(jnp.where(keep_sorted, sorted_probs, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(probs >= threshold, logits, -jnp.inf)


def temperature_sample(logits: jax.Array, key: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Samples from softmax(logits / temperature)."""
    _check_temperature(temperature)
    _check_vocab(logits)
    return jax.random.categorical(key, logits.astype(jnp.float32) / temperature, axis=-1).astype(jnp.int32)


def top_k_sample(logits: jax.Array, key: jax.Array, *, k: int, temperature: float = 1.0) -> jax.Array:
    """Samples from the temperature-scaled distribution restricted to the top k tokens."""
    _check_temperature(temperature)
    return temperature_sample(top_k_logits(logits, k), key, temperature=temperature)


def top_p_sample(logits: jax.Array, key: jax.Array, *, p: float, temperature: float = 1.0) -> jax.Array:
    """Samples from the nucleus (top-p) of softmax(logits / temperature)."""
    _check_temperature(temperature)
    scaled = logits.astype(jnp.float32) / temperature
    return jax.random.categorical(key, top_p_logits(scaled, p), axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampler:
    """A hashable sampling rule: temperature, then top-k, then top-p.

    `Sampler()` is greedy (temperature 0). The filters apply in the order
    temperature -> top-k -> top-p, as in most serving stacks.

    Attributes:
      temperature: 0 for greedy, otherwise > 0 (finite; NaN and inf raise ValueError).
      top_k: keep the k most likely tokens (an int >= 1, or None = all).
      top_p: nucleus mass in (0, 1] (None = 1).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        check_finite("temperature", self.temperature)
        if self.top_k is not None:
            check_int("top_k", self.top_k)
        if self.top_p is not None:
            check_finite("top_p", self.top_p)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None; got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None; got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    def filtered_logits(self, logits: jax.Array) -> jax.Array:
        """Logits of the distribution this sampler draws from (-inf = excluded)."""
        _check_vocab(logits)
        x = logits.astype(jnp.float32)
        if self.is_greedy:
            best = jnp.argmax(x, axis=-1)
            return jnp.where(jax.nn.one_hot(best, x.shape[-1], dtype=bool), 0.0, -jnp.inf)
        x = x / self.temperature
        if self.top_k is not None:
            x = top_k_logits(x, min(self.top_k, x.shape[-1]))
        if self.top_p is not None:
            x = top_p_logits(x, self.top_p)
        return x

    def log_probs(self, logits: jax.Array) -> jax.Array:
        """Log-probabilities [..., v] of the sampling distribution."""
        return jax.nn.log_softmax(self.filtered_logits(logits), axis=-1)

    def __call__(self, logits: jax.Array, key: jax.Array) -> jax.Array:
        if self.is_greedy:
            return greedy(logits)
        return jax.random.categorical(key, self.filtered_logits(logits), axis=-1).astype(jnp.int32)
