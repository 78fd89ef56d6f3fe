"""KV-cache quantization baselines that QVG is compared with, at equal bits.

Dimension legend: ``...`` groups (batch x heads), ``s`` tokens, ``d`` head dim, ``G`` block size.

* **RTN**: round-to-nearest with per-token blocks of ``G`` channels (``primitives.quantization``).
* **KIVI**: keys per channel (blocks of ``G`` tokens of one channel, since key outliers live in
  fixed channels), values per token; both asymmetric (min/max with a zero point).
* **QuaRot**: multiply by an orthonormal Hadamard matrix along ``d`` (optionally with random signs,
  ``H diag(+-1)``), which spreads outlier channels over all channels, then RTN; reading back
  multiplies by the transpose. Symmetric as in the QVG paper's table, asymmetric as the paper's
  reproducers found much stronger at 2 bits.

Every method returns a stored pytree with ``nbytes`` / ``bits_per_element`` counted from its arrays,
read back with :func:`dequantize`.

Example:
    >>> import jax
    >>> x = jax.random.normal(jax.random.key(0), (2, 64, 32))
    >>> t = quantize_kv(x, "quarot", kind="key", bits=2, group_size=32)
    >>> t.bits_per_element, dequantize(t).shape
    (2.25, (2, 64, 32))

References:
  Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", arXiv:2402.02750, 2024.
  Ashkboos et al., "QuaRot: Outlier-Free 4-Bit Inference in Rotated LLMs", arXiv:2404.00456, 2024.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from primitives import quantization as qz

__all__ = ["METHODS", "RotatedTensor", "hadamard", "quantize_kv", "dequantize"]

METHODS = ("rtn", "rtn_asym", "kivi", "quarot", "quarot_asym")


def hadamard(d: int) -> np.ndarray:
    """The orthonormal Sylvester-Hadamard matrix of size ``d`` (a power of two), float32, symmetric."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"d must be a power of two for a Hadamard rotation; got d={d}")
    return (scipy.linalg.hadamard(d, dtype=np.float64) / np.sqrt(d)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class RotatedTensor:
    """QuaRot storage: the RTN-quantized rotated tensor and the (not stored per tensor) rotation.

    ``rotation`` [d, d] is shared by the whole cache (it is generated from a seed), so it is not
    counted in ``nbytes``.
    """

    quantized: qz.QuantizedTensor
    rotation: jax.Array

    @property
    def nbytes(self) -> int:
        return self.quantized.nbytes

    @property
    def bits_per_element(self) -> float:
        return self.quantized.bits_per_element


jax.tree_util.register_dataclass(RotatedTensor, data_fields=["quantized", "rotation"], meta_fields=[])


def quantize_kv(x: jax.Array, method: str, *, kind: str, bits: int, group_size: int,
                scale_dtype="float8_e4m3fn", key: jax.Array | None = None):
    """Quantizes keys or values ``x`` [..., s, d] with one of :data:`METHODS`.

    Args:
      x: [..., s, d] float.
      method: "rtn" / "rtn_asym" (per-token blocks), "kivi", "quarot" / "quarot_asym".
      kind: "key" or "value" (only KIVI treats them differently).
      bits: 2, 4 or 8.
      group_size: G (KIVI keys: tokens per block, which must divide s; otherwise channels, dividing d).
      scale_dtype: storage dtype of scales and zero points (fp8 E4M3 as QVG, for equal accounting).
      key: for QuaRot, random signs of the rotation (None: the plain Hadamard matrix).

    Returns:
      A ``QuantizedTensor`` (RTN, KIVI) or a :class:`RotatedTensor` (QuaRot).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if kind not in ("key", "value"):
        raise ValueError(f"kind must be 'key' or 'value'; got {kind!r}")
    if x.ndim < 2:
        raise ValueError(f"x must be [..., s, d]; got shape {x.shape}")
    common = dict(bits=bits, group_size=group_size, scale_dtype=scale_dtype)
    if method in ("rtn", "rtn_asym"):
        return qz.quantize(x, axis=-1, scheme="asymmetric" if method == "rtn_asym" else "symmetric", **common)
    if method == "kivi":
        return qz.quantize(x, axis=-2 if kind == "key" else -1, scheme="asymmetric", **common)
    rot = jnp.asarray(hadamard(x.shape[-1]))
    if key is not None:
        signs = jax.random.rademacher(key, (x.shape[-1],), dtype=jnp.float32)
        rot = signs[:, None] * rot  # diag(signs) H: still orthonormal.
    rotated = jnp.matmul(x.astype(jnp.float32), rot, precision=jax.lax.Precision.HIGHEST)
    scheme = "asymmetric" if method == "quarot_asym" else "symmetric"
    return RotatedTensor(qz.quantize(rotated, axis=-1, scheme=scheme, **common), rot)


def dequantize(t, dtype=None) -> jax.Array:
    """Reads back what :func:`quantize_kv` stored (float32 by default for QuaRot, else the original dtype)."""
    if isinstance(t, RotatedTensor):
        out = jnp.matmul(qz.dequantize(t.quantized, jnp.float32), t.rotation.T, precision=jax.lax.Precision.HIGHEST)
        return out.astype(t.quantized.dtype if dtype is None else dtype)
    if isinstance(t, qz.QuantizedTensor):
        return qz.dequantize(t, dtype)
    raise ValueError(f"t must be a QuantizedTensor or RotatedTensor; got {type(t).__name__}")
