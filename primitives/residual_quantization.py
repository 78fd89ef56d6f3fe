"""Progressive residual quantization (the QVG format): k-means smoothing stages, then a packed residual.

Dimension legend: ``...`` independent groups (batch x heads), ``s`` tokens of the span being
quantized, ``d`` head dim, ``k`` centroids, ``n`` stages, ``G`` elements per scale block.

Video KV caches are highly redundant (many tokens are near copies of each other across frames), so
before scalar quantization QVG subtracts a shared vector from similar tokens:

  1. **Semantic-aware smoothing.** k-means (``primitives.kmeans``) on the ``s`` token vectors of
     each group; ``r1_i = x_i - c1[a1_i]``.
  2. **Progressive residual quantization.** Stages ``2..n`` repeat k-means on the residual,
     ``r_{j+1} = r_j - c_j[a_j]``.
  3. The final residual ``R`` is quantized block-wise along ``d`` (``primitives.quantization``;
     symmetric INT2 is ternary {-1, 0, 1}), scales stored as float8 E4M3, codes packed into bytes.

Stored per group: per stage uint8 labels [s] and bfloat16 centroids [k, d]; packed residual codes and
scales. The residual is computed against the *stored* (bfloat16-rounded) centroids, so reading back
``dequant(codes) + sum_j c_j[a_j]`` is exactly what was encoded. Bits per element (``QVGTensor``
counts them from the stored arrays; :func:`bits_per_element` is the closed form)::

    bpe = bits + 8 b_scale / G  (x 2 with a zero point)  + n 8 b_label / d + n k 8 b_centroid / s

e.g. s = 29 640, d = 128, k = 256, G = 64, one stage, fp8 scales, bf16 centroids:
2 + 0.125 + 0.0625 + 0.138 = 2.33 bits, 6.9x smaller than bfloat16.

The chunked KV-cache policy that applies this format to a growing cache, and the baselines, are in
``algorithms.compression.qvg``; attention that reads the format without dequantizing it into memory
is ``pallas_kernels.qvg.qvg_attention``.

Presets: ``QVG`` (one stage, G = 64: the release scripts) and ``QVG_PRO`` (four stages, G = 16).
``residual_bits=None`` drops the residual (centroids only), which the tests use to check that each
stage can only lower the reconstruction error and that ``k >= s`` reconstructs exactly.

Differences from the official code: centroid updates are deterministic segment sums (the official
atomic adds vary from run to run); rounding is half-to-even like the rest of
``primitives.quantization`` (the Triton code rounds half away from zero).

Example:
    >>> import jax, jax.numpy as jnp
    >>> x = jax.random.normal(jax.random.key(0), (2, 4, 128, 64))        # [batch, heads, s, d]
    >>> t = qvg_quantize(x, jax.random.key(1), config=QVGConfig(num_centroids=16))
    >>> t.labels.shape, t.centroids.shape, dequantize(t).shape
    ((1, 2, 4, 128), (1, 2, 4, 16, 64), (2, 4, 128, 64))
    >>> round(t.bits_per_element, 4) == round(bits_per_element(QVGConfig(num_centroids=16), 128, 64), 4)
    True

References:
  Xi, Yang et al., "Quant VideoGen: Auto-Regressive Long Video Generation via 2-Bit KV-Cache
    Quantization", arXiv:2602.02958, 2026 (official code: svg-project/Quant-VideoGen).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from primitives import kmeans as km
from primitives import quantization as qz

__all__ = ["QVGConfig", "QVG", "QVG_PRO", "QVGTensor", "qvg_quantize", "dequantize", "bits_per_element"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class QVGConfig:
    """QVG settings (defaults: the release scripts' one-stage INT2 setting).

    Attributes:
      num_centroids: k per stage and group (at most 65 536; capped at the span length).
      num_stages: k-means stages n >= 1 (1 = smoothing only; QVG-Pro uses 4).
      residual_bits: 2 or 4 (8 allowed) for the final residual, or None to drop it.
      group_size: G, elements per scale block along d.
      scheme: "symmetric" (default) or "asymmetric" residual quantization.
      scale_dtype: storage dtype of the residual scales (float8_e4m3fn as in the paper).
      centroid_dtype: storage dtype of the centroids (bfloat16 as in the paper's accounting).
      kmeans_iters: Lloyd steps per stage (the official scripts use 2 to 100).
      kmeans_tol: stop a stage once fewer than this fraction of labels change.
    """

    num_centroids: int = 256
    num_stages: int = 1
    residual_bits: int | None = 2
    group_size: int = 64
    scheme: str = "symmetric"
    scale_dtype: str = "float8_e4m3fn"
    centroid_dtype: str = "bfloat16"
    kmeans_iters: int = 10
    kmeans_tol: float = 1e-4

    def __post_init__(self):
        if not 1 <= self.num_centroids <= 2**16:
            raise ValueError(f"num_centroids must be in [1, 65536]; got {self.num_centroids}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1; got {self.num_stages}")
        if self.residual_bits is not None and self.residual_bits not in qz.BITS:
            raise ValueError(f"residual_bits must be one of {qz.BITS} or None; got {self.residual_bits}")
        if self.scheme not in ("symmetric", "asymmetric"):
            raise ValueError(f"scheme must be 'symmetric' or 'asymmetric'; got {self.scheme!r}")
        if self.scale_dtype not in qz.SCALE_DTYPES:
            raise ValueError(f"scale_dtype must be one of {qz.SCALE_DTYPES}; got {self.scale_dtype!r}")
        if self.centroid_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"centroid_dtype must be float32, bfloat16 or float16; got {self.centroid_dtype!r}")
        if self.kmeans_iters < 0:
            raise ValueError(f"kmeans_iters must be >= 0; got {self.kmeans_iters}")

    @property
    def label_dtype(self):
        return jnp.uint8 if self.num_centroids <= 256 else jnp.uint16


QVG = QVGConfig()
QVG_PRO = QVGConfig(num_stages=4, group_size=16)


@dataclasses.dataclass(frozen=True)
class QVGTensor:
    """A QVG-quantized span (a pytree; the format fields are static).

    Attributes:
      labels: [n, ..., s] uint8 (uint16 above 256 centroids), stage j's centroid of each token.
      centroids: [n, ..., k, d] in ``config.centroid_dtype``.
      residual: the quantized final residual, or None when ``config.residual_bits`` is None.
      config: the settings it was made with.
      shape, dtype: the original tensor's shape and dtype name.
    """

    labels: jax.Array
    centroids: jax.Array
    residual: qz.QuantizedTensor | None
    config: QVGConfig
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes of every stored array (labels, centroids, residual codes, scales, zero points)."""
        own = sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in (self.labels, self.centroids))
        return int(own + (0 if self.residual is None else self.residual.nbytes))

    @property
    def bits_per_element(self) -> float:
        return 8.0 * self.nbytes / math.prod(self.shape)

    @property
    def compression(self) -> float:
        """Size of a bfloat16 copy over the stored size."""
        return 16.0 / self.bits_per_element


jax.tree_util.register_dataclass(QVGTensor, data_fields=["labels", "centroids", "residual"],
                                 meta_fields=["config", "shape", "dtype"])


def bits_per_element(config: QVGConfig, span_tokens: int, head_dim: int) -> float:
    """Closed-form stored bits per element of a span of ``span_tokens`` tokens of size ``head_dim``."""
    k = min(config.num_centroids, span_tokens)
    n = config.num_stages
    size = lambda dt: jnp.dtype(dt).itemsize
    out = n * 8 * size(config.label_dtype) / head_dim + n * k * 8 * size(config.centroid_dtype) / span_tokens
    if config.residual_bits is not None:
        zero = 2 if config.scheme == "asymmetric" else 1
        out += config.residual_bits + zero * 8 * size(config.scale_dtype) / config.group_size
    return float(out)


def qvg_quantize(x: jax.Array, key: jax.Array, *, config: QVGConfig = QVG) -> QVGTensor:
    """Quantizes every group of ``x`` [..., s, d] with QVG.

    Args:
      x: [..., s, d] float keys or values (e.g. [batch, heads, span tokens, head dim]).
      key: PRNG key for the k-means initializations (stage j uses ``fold_in(key, j)``).
      config: settings; ``QVG`` or ``QVG_PRO`` for the paper's presets.

    Returns:
      A :class:`QVGTensor`; :func:`dequantize` reads it back.
    """
    if x.ndim < 2:
        raise ValueError(f"x must be [..., s, d]; got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x must be a floating-point array; got dtype {x.dtype}")
    d = x.shape[-1]
    if config.residual_bits is not None and d % config.group_size:
        raise ValueError(f"config.group_size must divide the head dim x.shape[-1]={d}; got {config.group_size}")
    return _quantize(x, key, config)


@functools.partial(jax.jit, static_argnums=(2,))
def _quantize(x, key, config: QVGConfig) -> QVGTensor:
    residual = x.astype(jnp.float32)
    labels, centroids = [], []
    for stage in range(config.num_stages):
        res = km.kmeans(residual, jax.random.fold_in(key, stage), num_centroids=config.num_centroids,
                        max_iters=config.kmeans_iters, tol=config.kmeans_tol)
        stored = res.centroids.astype(config.centroid_dtype)
        # Residual against the stored centroids, so that decoding adds back exactly these values.
        residual = residual - _gather(stored.astype(jnp.float32), res.labels)
        labels.append(res.labels.astype(config.label_dtype))
        centroids.append(stored)
    quantized = None
    if config.residual_bits is not None:
        quantized = qz.quantize(residual, bits=config.residual_bits, group_size=config.group_size, axis=-1,
                                scheme=config.scheme, scale_dtype=config.scale_dtype)
    return QVGTensor(jnp.stack(labels), jnp.stack(centroids), quantized, config, tuple(x.shape),
                     jnp.dtype(x.dtype).name)


def dequantize(t: QVGTensor, dtype=None) -> jax.Array:
    """``dequant(residual) + sum_j centroids_j[labels_j]`` in ``dtype`` (default: the original)."""
    if not isinstance(t, QVGTensor):
        raise ValueError(f"t must be a QVGTensor; got {type(t).__name__}")
    out = jnp.zeros(t.shape, jnp.float32) if t.residual is None else qz.dequantize(t.residual, jnp.float32)
    for stage in range(t.labels.shape[0]):
        out = out + _gather(t.centroids[stage].astype(jnp.float32), t.labels[stage])
    return out.astype(t.dtype if dtype is None else dtype)


def _gather(centroids: jax.Array, labels: jax.Array) -> jax.Array:
    """centroids [..., k, d], labels [..., s] -> [..., s, d]."""
    return jnp.take_along_axis(centroids, labels[..., None].astype(jnp.int32), axis=-2)
