"""Quant VideoGen (QVG): 2-bit KV caches for chunk-autoregressive video models.

Dimension legend: ``...`` groups (batch x heads), ``s`` span tokens, ``d`` head dim.

The method has two parts:

  * **the format** (``primitives.residual_quantization``, re-exported here): per (batch, head) group
    of a span, k-means "semantic-aware smoothing" subtracts a shared centroid from similar tokens,
    further k-means stages quantize what is left ("progressive residual quantization"), and the final
    residual is quantized block-wise to 2 or 4 bits with packed codes and fp8 scales. Presets ``QVG``
    (one stage, blocks of 64) and ``QVG_PRO`` (four stages, blocks of 16).
  * **the cache policy** (:class:`ChunkedKVCache`, the paper's Self-Forcing integration): chunks of
    generated frames arrive one at a time; sink and recent chunks stay in full precision, and every
    ``quant_factor`` older chunks are quantized together as one span with their own centroids. Reads
    dequantize the spans on the fly. The cache takes any :class:`Quantizer`, so the baselines
    (``kv_baselines``: RTN, KIVI, QuaRot) run under the identical policy.

Attention that reads a QVG span without dequantizing it into memory is
``pallas_kernels.qvg.qvg_attention``; the k-means assignment kernel is
``pallas_kernels.qvg.kmeans_assign``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> x = jax.random.normal(jax.random.key(0), (1, 2, 256, 64))
    >>> t = qvg_quantize(x, jax.random.key(1), config=QVG)
    >>> round(t.bits_per_element, 3)                      # 2 + 8/64 + 8/64 + 256 * 16 / 256
    18.25

References:
  Xi, Yang et al., "Quant VideoGen: Auto-Regressive Long Video Generation via 2-Bit KV-Cache
    Quantization", arXiv:2602.02958, 2026 (official code: svg-project/Quant-VideoGen).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.compression import kv_baselines as kvb
from primitives.residual_quantization import (QVG, QVG_PRO, QVGConfig, QVGTensor, bits_per_element, dequantize,
                                              qvg_quantize)

__all__ = ["QVGConfig", "QVG", "QVG_PRO", "QVGTensor", "qvg_quantize", "dequantize", "bits_per_element",
           "Quantizer", "qvg_quantizer", "baseline_quantizer", "ChunkPolicy", "ChunkedKVCache"]


# ------------------------------------------------------------------ the chunked KV cache


@dataclasses.dataclass(frozen=True)
class Quantizer:
    """A KV quantization method: ``quantize(x [..., s, d], key, kind) -> stored`` (with ``.nbytes``)
    and ``dequantize(stored) -> [..., s, d]``. ``kind`` is "key" or "value"."""

    name: str
    quantize: callable
    dequantize: callable


def qvg_quantizer(config: QVGConfig = QVG, name: str = "QVG") -> Quantizer:
    """QVG with ``config`` for keys and values alike."""
    return Quantizer(name, lambda x, key, kind: qvg_quantize(x, key, config=config), dequantize)


def baseline_quantizer(method: str, *, bits: int, group_size: int, scale_dtype="float8_e4m3fn",
                       name: str | None = None) -> Quantizer:
    """One of ``kv_baselines.METHODS`` (QuaRot gets random signs from the span's key)."""
    if method not in kvb.METHODS:
        raise ValueError(f"method must be one of {kvb.METHODS}; got {method!r}")
    fn = lambda x, key, kind: kvb.quantize_kv(x, method, kind=kind, bits=bits, group_size=group_size,
                                              scale_dtype=scale_dtype, key=key)
    return Quantizer(name or f"{method}-int{bits}", fn, lambda t: kvb.dequantize(t, jnp.float32))


@dataclasses.dataclass(frozen=True)
class ChunkPolicy:
    """Which chunks of the cache are quantized, and when.

    Attributes:
      quant_factor: chunks per quantized span (the Self-Forcing integration uses 8).
      sink_chunks: the first chunks, never quantized.
      keep_recent_chunks: the newest chunks, kept in full precision until older ones fill a span.
      window_chunks: attention window in chunks (None: all history); a quantized span is released
        only once all of its chunks have left the window.
    """

    quant_factor: int = 8
    sink_chunks: int = 0
    keep_recent_chunks: int = 0
    window_chunks: int | None = None

    def __post_init__(self):
        if self.quant_factor < 1:
            raise ValueError(f"quant_factor must be >= 1; got {self.quant_factor}")
        for name in ("sink_chunks", "keep_recent_chunks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)}")
        if self.window_chunks is not None and self.window_chunks < 1:
            raise ValueError(f"window_chunks must be >= 1 or None; got {self.window_chunks}")


class ChunkedKVCache:
    """One layer's key/value history, chunk by chunk, with spans quantized by a :class:`Quantizer`.

    Host-side bookkeeping over jnp arrays (the span quantization and reads are jitted inside the
    quantizer). Chunks are [..., t, d] (e.g. [batch, heads, tokens of one chunk, head dim]).

    After each :meth:`append`, once ``quant_factor`` consecutive full-precision chunks lie after the
    sink and before the ``keep_recent_chunks`` newest ones, they are quantized as one span (span j
    uses ``fold_in(key, j)``; K and V get different folds). With the defaults (``quant_factor=8``, no
    sink or recent chunks) this is the paper's Self-Forcing schedule: the first 8 chunks stay in full
    precision until chunk 8 arrives, then chunks [0, 8) are quantized together, and so on.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cache = ChunkedKVCache(qvg_quantizer(QVGConfig(num_centroids=8)), ChunkPolicy(quant_factor=2),
        ...                        key=jax.random.key(0))
        >>> for c in range(5):
        ...     cache.append(jnp.ones((1, 2, 16, 64)) * c, jnp.ones((1, 2, 16, 64)))
        >>> cache.layout()
        ['Q0', 'Q0', 'Q1', 'Q1', 'F']
        >>> cache.read()[0].shape
        (1, 2, 80, 64)
    """

    def __init__(self, quantizer: Quantizer, policy: ChunkPolicy = ChunkPolicy(), *, key: jax.Array):
        self.quantizer, self.policy, self.key = quantizer, policy, key
        # Each entry: ("full", k, v) or ("span", span_id, position within the span).
        self._chunks: list[tuple] = []
        self._spans: dict[int, tuple] = {}  # span_id -> (stored k, stored v, tokens per chunk)
        self._first = 0  # index of the oldest chunk still in the window
        self._num_spans = 0

    @property
    def num_chunks(self) -> int:
        """Chunks appended so far (including any that left the window)."""
        return len(self._chunks)

    def layout(self) -> list[str]:
        """Per chunk in the window: "F" full precision, "Q<j>" part of quantized span j."""
        return ["F" if c[0] == "full" else f"Q{c[1]}" for c in self._chunks[self._first:]]

    def append(self, k: jax.Array, v: jax.Array) -> None:
        """Adds one chunk (k, v [..., t, d]) and quantizes a span if one is complete."""
        if k.shape != v.shape or k.ndim < 2:
            raise ValueError(f"k and v must be equal shapes [..., t, d]; got {k.shape} and {v.shape}")
        if self._chunks:
            ref = next((c[1] for c in self._chunks if c[0] == "full"), None)
            if ref is not None and (ref.shape[:-2] != k.shape[:-2] or ref.shape[-1] != k.shape[-1]):
                raise ValueError(f"chunk shape {k.shape} does not match the cache's {ref.shape}")
        self._chunks.append(("full", k, v))
        self._maybe_quantize()
        self._slide_window()

    def _maybe_quantize(self) -> None:
        p = self.policy
        end = len(self._chunks) - p.keep_recent_chunks
        start = max(p.sink_chunks, self._first)
        run = []
        for i in range(start, end):
            if self._chunks[i][0] != "full":
                run = []
                continue
            run.append(i)
            if len(run) == p.quant_factor:
                self._quantize_span(run)
                run = []

    def _quantize_span(self, idx: list[int]) -> None:
        j = self._num_spans
        self._num_spans += 1
        ks = jnp.concatenate([self._chunks[i][1] for i in idx], axis=-2)
        vs = jnp.concatenate([self._chunks[i][2] for i in idx], axis=-2)
        key = jax.random.fold_in(self.key, j)
        stored = (self.quantizer.quantize(ks, jax.random.fold_in(key, 0), "key"),
                  self.quantizer.quantize(vs, jax.random.fold_in(key, 1), "value"),
                  [self._chunks[i][1].shape[-2] for i in idx])
        self._spans[j] = stored
        for pos, i in enumerate(idx):
            self._chunks[i] = ("span", j, pos)

    def _slide_window(self) -> None:
        w = self.policy.window_chunks
        if w is None:
            return
        self._first = max(self._first, len(self._chunks) - w)
        alive = {c[1] for c in self._chunks[self._first:] if c[0] == "span"}
        for j in list(self._spans):
            if j not in alive:
                del self._spans[j]  # every chunk of span j left the window
        for i in range(self._first):
            if self._chunks[i][0] == "full":
                self._chunks[i] = ("dropped",)

    def read(self, dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
        """The keys and values of every chunk in the window, [..., T, d] each, quantized spans
        dequantized (each span once)."""
        if not self._chunks:
            raise ValueError("the cache is empty: append a chunk before reading")
        decoded: dict[int, tuple] = {}
        ks, vs = [], []
        for c in self._chunks[self._first:]:
            if c[0] == "full":
                ks.append(c[1].astype(dtype))
                vs.append(c[2].astype(dtype))
                continue
            j, pos = c[1], c[2]
            if j not in decoded:
                sk, sv, sizes = self._spans[j]
                decoded[j] = (self.quantizer.dequantize(sk).astype(dtype),
                              self.quantizer.dequantize(sv).astype(dtype), np.cumsum([0] + sizes))
            dk, dv, offs = decoded[j]
            ks.append(dk[..., offs[pos]:offs[pos + 1], :])
            vs.append(dv[..., offs[pos]:offs[pos + 1], :])
        return jnp.concatenate(ks, axis=-2), jnp.concatenate(vs, axis=-2)

    @property
    def nbytes(self) -> int:
        """Bytes held: full-precision chunks at their dtype plus every live quantized span."""
        full = sum(c[1].nbytes + c[2].nbytes for c in self._chunks[self._first:] if c[0] == "full")
        return int(full + sum(sk.nbytes + sv.nbytes for sk, sv, _ in self._spans.values()))
