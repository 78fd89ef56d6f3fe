"""Group-wise integer quantization with packed codes (the reference every quantization kernel is tested against).

A tensor ``x`` is cut into groups of ``G`` consecutive elements along one axis; each group gets its own
scale ``s`` (and, for the asymmetric scheme, a zero point ``z``), and each element an unsigned
``bits``-bit code ``u`` (bits in {2, 4, 8}). With ``L = 2^bits - 1``:

* ``"symmetric"`` (restricted range, zero exactly representable; QVG's default):
  ``Q = 2^(bits-1) - 1``, ``s = max|x| / Q``, ``u = clip(round(x / s), -Q, Q) + Q``, ``xhat = (u - Q) s``.
  Two bits give ternary codes {-1, 0, 1}; eight bits the range [-127, 127]; code ``L`` is unused.
* ``"midrise"`` (all 2^bits levels, zero not representable; FFD's key codes):
  ``o = L / 2``, ``s = max|x| / o``, ``u = clip(round(x / s + o), 0, L)``, ``xhat = (u - o) s``.
* ``"asymmetric"`` (min/max with a zero point; KIVI/QVG's option):
  ``s = (max x - min x) / L``, ``z = min x``, ``u = clip(round((x - z) / s), 0, L)``, ``xhat = u s + z``.

Rounding, defined bit-exactly: every step is IEEE float32 arithmetic in the order written above,
except that both divisions are multiplies by a float32 reciprocal: ``x / s`` is ``x * fl(1/s)`` and the
scale's division by the constant Q, o or L is a multiply by ``fl(1/Q)``. That is what XLA compiles
either division to under ``jit`` (eagerly it divides), so only the multiplies give the same codes
whether or not the caller jits (``encode``). ``x`` is first cast to float32, and ``round`` is
round-half-to-even (``jnp.round``). The scale is computed in float32, clamped to [smallest normal,
largest finite] of ``scale_dtype`` and then *stored* in ``scale_dtype``; codes and zero points are
computed against the stored (rounded) scale, so ``dequantize`` of the stored tensor is exactly what
the codes mean. In float32 storage every element obeys ``|x - xhat| <= s / 2`` up to the float32
roundings of ``fl(1/s)``, of ``x * fl(1/s)`` and of ``xhat``.

Packing: ``n = 8 / bits`` codes share a uint8 byte, always along the *last* axis, in planes: the last
axis is cut into pack blocks of ``B`` elements (default ``B = G`` when groups run along the last axis,
else the whole last axis) and byte ``j`` of a block holds elements ``j, j + B/n, ..., j + (n-1) B/n``
of that block, element ``j + i B/n`` in bits ``[bits i, bits (i+1))``. A kernel therefore unpacks a
tile of bytes with one shift and one mask per plane into ``n`` contiguous slices of the original
axis, without any interleave. With ``B = d`` this is the layout of :mod:`primitives.ffd`.

Memory: ``QuantizedTensor.nbytes`` is the real byte count of codes + scales (+ zero points), and
``bits_per_element = 8 nbytes / x.size = bits + 8 itemsize(scale) / G (x 2 if asymmetric)``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> x = jax.random.normal(jax.random.key(0), (4, 64))
    >>> qt = quantize(x, bits=4, group_size=32)
    >>> qt.codes.shape, qt.codes.dtype, qt.scale.shape
    ((4, 32), dtype('uint8'), (4, 2))
    >>> qt.bits_per_element                                 # 4 bits + one float32 scale per 32
    5.0
    >>> err = jnp.abs(dequantize(qt) - x).reshape(4, 2, 32).max(-1)
    >>> bool(jnp.all(err <= qt.scale / 2 * (1 + 1e-6)))
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primitives.validation import check_finite

__all__ = [
    "BITS",
    "SCHEMES",
    "QuantizedTensor",
    "codes_per_byte",
    "code_levels",
    "pack_codes",
    "unpack_codes",
    "quantize_codes",
    "quantize",
    "dequantize",
    "dequantize_codes",
    "group_stats",
    "scale_and_zero",
    "encode",
    "decode",
]

BITS = (2, 4, 8)
SCHEMES = ("symmetric", "midrise", "asymmetric")
SCALE_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn")


@dataclasses.dataclass(frozen=True)
class QuantizedTensor:
    """Packed codes with their per-group scales (a pytree; everything but the arrays is static).

    Attributes:
      codes: uint8, ``shape`` with the last axis divided by ``8 // bits`` (packed, see module doc).
      scale: ``shape`` with ``axis`` divided by ``group_size``, in the storage dtype of the scales.
      zero: like ``scale`` for the asymmetric scheme, else None.
      bits, group_size, axis (non-negative), scheme, pack_block: the format.
      shape, dtype: the original tensor's shape and dtype name (``dequantize`` returns this dtype).
    """

    codes: jax.Array
    scale: jax.Array
    zero: jax.Array | None
    bits: int
    group_size: int
    axis: int
    scheme: str
    pack_block: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        leaves = [self.codes, self.scale] + ([] if self.zero is None else [self.zero])
        return int(sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in leaves))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def bits_per_element(self) -> float:
        """Stored bits per original element, codes plus scales plus zero points."""
        return 8.0 * self.nbytes / self.size


jax.tree_util.register_dataclass(
    QuantizedTensor,
    data_fields=["codes", "scale", "zero"],
    meta_fields=["bits", "group_size", "axis", "scheme", "pack_block", "shape", "dtype"],
)


def _check_bits(bits: Any) -> int:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}; got bits={bits!r}")
    return int(bits)


def _check_scheme(scheme: Any) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}; got scheme={scheme!r}")
    return scheme


def codes_per_byte(bits: int) -> int:
    """Codes stored in one uint8 byte: 4, 2 or 1."""
    return 8 // _check_bits(bits)


def code_levels(bits: int, scheme: str) -> tuple[float, float]:
    """(offset, scale divisor) of a scheme: ``xhat = (u - offset) s`` and ``s = range / divisor``.

    symmetric: (Q, Q) with Q = 2^(bits-1) - 1; midrise: (L/2, L/2); asymmetric: (0, L) with the
    zero point added separately (``xhat = u s + z``).
    """
    bits, scheme = _check_bits(bits), _check_scheme(scheme)
    top = 2**bits - 1
    if scheme == "symmetric":
        q = 2 ** (bits - 1) - 1
        return float(q), float(q)
    if scheme == "midrise":
        return top / 2.0, top / 2.0
    return 0.0, float(top)


def _check_pack(last: int, bits: int, block: int) -> int:
    n = codes_per_byte(bits)
    if block < 1 or block % n or last % block:
        raise ValueError(
            f"pack_block must divide the last axis ({last}) and be a multiple of {n} (codes per byte at "
            f"{bits} bits); got pack_block={block}"
        )
    return n


def pack_codes(codes: jax.Array, bits: int, *, block: int | None = None) -> jax.Array:
    """Packs unsigned codes [..., m] (values < 2^bits) into uint8 [..., m * bits / 8].

    Byte ``j`` of each ``block``-element block along the last axis (default: the whole axis) holds the
    elements ``j + i * block / n`` for planes ``i = 0..n-1`` in bits ``bits * i``.

    Examples:
      >>> pack_codes(jnp.array([1, 2, 3, 0, 0, 1, 2, 3]), 2).tolist()  # planes [1,2] [3,0] [0,1] [2,3]
      [141, 210]
    """
    m = codes.shape[-1]
    block = m if block is None else int(block)
    n = _check_pack(m, bits, block)
    c = codes.astype(jnp.uint32).reshape(*codes.shape[:-1], m // block, n, block // n)
    shifts = (bits * jnp.arange(n, dtype=jnp.uint32))[:, None]
    packed = jnp.bitwise_or.reduce(c << shifts, axis=-2) if n > 1 else c[..., 0, :]
    return packed.reshape(*codes.shape[:-1], m // n).astype(jnp.uint8)


def unpack_codes(packed: jax.Array, bits: int, *, block: int | None = None) -> jax.Array:
    """Inverse of :func:`pack_codes`: uint8 [..., m / n] -> uint8 codes [..., m]."""
    n = codes_per_byte(bits)
    m = packed.shape[-1] * n
    block = m if block is None else int(block)
    _check_pack(m, bits, block)
    p = packed.astype(jnp.uint32).reshape(*packed.shape[:-1], m // block, 1, block // n)
    shifts = (bits * jnp.arange(n, dtype=jnp.uint32))[:, None]
    codes = (p >> shifts) & (2**bits - 1)
    return codes.reshape(*packed.shape[:-1], m).astype(jnp.uint8)


def _scale_dtype(scale_dtype: Any) -> jnp.dtype:
    try:
        dt = jnp.dtype(scale_dtype)
    except TypeError:
        raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}; got scale_dtype={scale_dtype!r}") from None
    if dt.name not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}; got scale_dtype={dt.name}")
    return dt


def _reciprocal(s: jax.Array) -> jax.Array:
    return jnp.float32(1.0) / s


def reciprocal_divisor(bits: int, scheme: str) -> float:
    """The float32 constant ``fl(1 / divisor)`` that scales are multiplied by (see ``scale_and_zero``)."""
    _, divisor = code_levels(bits, scheme)
    return float(np.float32(1.0) / np.float32(divisor))


def scale_and_zero(hi: jax.Array, lo: jax.Array | None, *, bits: int, scheme: str, scale_dtype=jnp.float32):
    """Stored (scale, zero) from a group's extrema: ``hi = max|x|`` (symmetric, midrise) or
    ``hi = max x``, ``lo = min x`` (asymmetric). float32 in, ``scale_dtype`` out; zero is None unless
    asymmetric. Kernels call this on their own reductions so the scale is bit-identical.

    The range is *multiplied* by the float32 reciprocal of the divisor (``reciprocal_divisor``) rather
    than divided by it: XLA rewrites a division by a compile-time constant into that multiply under
    ``jit`` but not eagerly, so only the multiply gives the same bits everywhere.
    """
    dt = _scale_dtype(scale_dtype)
    tiny, big = jnp.float32(jnp.finfo(dt).tiny), jnp.float32(jnp.finfo(dt).max)
    r = jnp.float32(reciprocal_divisor(bits, scheme))
    if scheme == "asymmetric":
        return jnp.clip((hi - lo) * r, tiny, big).astype(dt), jnp.clip(lo, -big, big).astype(dt)
    return jnp.clip(hi * r, tiny, big).astype(dt), None


def group_stats(xg: jax.Array, *, bits: int, scheme: str, scale_dtype=jnp.float32):
    """Stored (scale, zero) of groups along the last axis of float32 ``xg`` [..., G] -> [..., 1].

    The scale is computed in float32, clamped to the normal range of ``scale_dtype`` and cast to it;
    ``zero`` (asymmetric only, else None) is ``min x`` cast to ``scale_dtype``.
    """
    if scheme == "asymmetric":
        hi, lo = jnp.max(xg, axis=-1, keepdims=True), jnp.min(xg, axis=-1, keepdims=True)
    else:
        hi, lo = jnp.max(jnp.abs(xg), axis=-1, keepdims=True), None
    return scale_and_zero(hi, lo, bits=bits, scheme=scheme, scale_dtype=scale_dtype)


def encode(x: jax.Array, scale: jax.Array, zero: jax.Array | None, *, bits: int, scheme: str,
           round_fn=jnp.round, reciprocal_fn=_reciprocal, dtype=jnp.uint8) -> jax.Array:
    """Codes (unpacked, ``dtype``) of float32 ``x`` given broadcastable stored scale / zero point.

    ``x`` is *multiplied* by the float32 reciprocal of the scale, ``round(x * fl(1 / s))``, not divided
    by it: under ``jit`` XLA rewrites a division by a broadcast scale into that multiply, and eagerly it
    does not, so ``x / s`` gave different codes at rounding ties (0.06% of the codes of a
    bfloat16-valued input) depending on whether the caller jitted. The multiply gives the same bits
    eagerly, under ``jit`` and in the kernels. ``round_fn`` must be round-half-to-even and
    ``reciprocal_fn`` the IEEE float32 ``1 / s``; kernels pass portable equivalents (round from
    ``floor``; a correctly rounded division where ``/`` is approximate).
    """
    offset, _ = code_levels(bits, scheme)
    top = float(2**bits - 1)
    r = reciprocal_fn(jnp.asarray(scale).astype(jnp.float32))
    if scheme == "symmetric":
        u = jnp.clip(round_fn(x * r), -offset, offset) + jnp.float32(offset)
    elif scheme == "midrise":
        # round(y + o) with o = m - 1/2, m = 2^(bits-1) (even), y = x * fl(1/s), the add exact: floor(y) + m,
        # one less on a tie (y an odd integer) so the result is even. Written as `round(y + o)`, XLA
        # fuses the multiply and add into one FMA under jit only, which moved codes at ties.
        y = x * r
        f = jnp.floor(y)
        odd_tie = (f == y) & (f - 2.0 * jnp.floor(f * 0.5) != 0.0)
        u = jnp.clip(f + jnp.float32(offset + 0.5) - odd_tie.astype(jnp.float32), 0.0, top)
    else:
        u = jnp.clip(round_fn((x - zero.astype(jnp.float32)) * r), 0.0, top)
    return u.astype(dtype)


def decode(codes: jax.Array, scale: jax.Array, zero: jax.Array | None, *, bits: int, scheme: str) -> jax.Array:
    """float32 values of unpacked codes given broadcastable scale / zero point."""
    offset, _ = code_levels(bits, scheme)
    u = codes.astype(jnp.float32)
    s = scale.astype(jnp.float32)
    if scheme == "asymmetric":
        return u * s + zero.astype(jnp.float32)
    return (u - jnp.float32(offset)) * s


def _grouped(x: jax.Array, axis: int, group_size: int) -> jax.Array:
    """Moves ``axis`` last and splits it: [..., n_groups, G]."""
    xm = jnp.moveaxis(x, axis, -1)
    return xm.reshape(*xm.shape[:-1], xm.shape[-1] // group_size, group_size)


def _ungrouped(xg: jax.Array, axis: int) -> jax.Array:
    return jnp.moveaxis(xg.reshape(*xg.shape[:-2], xg.shape[-2] * xg.shape[-1]), -1, axis)


def _check_x(x: Any) -> None:
    dt = jnp.result_type(x)
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"x must be a floating-point array; got dtype {dt}")
    check_finite("x", x)  # one inf/NaN would set its group's scale to inf/NaN and wipe the group


def _check_layout(shape, *, bits, group_size, axis, pack_block):
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension; got a scalar")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis must index x of rank {len(shape)}; got axis={axis}")
    axis %= len(shape)
    if group_size < 1 or shape[axis] % group_size:
        raise ValueError(f"group_size must divide x.shape[{axis}]={shape[axis]}; got group_size={group_size}")
    if pack_block is None:
        pack_block = group_size if axis == len(shape) - 1 else shape[-1]
    _check_pack(shape[-1], bits, pack_block)
    return axis, int(pack_block)


def quantize_codes(x: jax.Array, *, bits: int, group_size: int, axis: int = -1, scheme: str = "symmetric",
                   scale_dtype=jnp.float32):
    """Unpacked codes (uint8, x's shape), scale and zero point (axis divided by group_size)."""
    bits, scheme = _check_bits(bits), _check_scheme(scheme)
    _check_x(x)
    axis, _ = _check_layout(x.shape, bits=bits, group_size=group_size, axis=axis, pack_block=None)
    xg = _grouped(x.astype(jnp.float32), axis, group_size)
    scale, zero = group_stats(xg, bits=bits, scheme=scheme, scale_dtype=scale_dtype)
    codes = encode(xg, scale, zero, bits=bits, scheme=scheme)
    squeeze = lambda a: None if a is None else jnp.moveaxis(a[..., 0], -1, axis)
    return _ungrouped(codes, axis), squeeze(scale), squeeze(zero)


def quantize(x: jax.Array, *, bits: int, group_size: int, axis: int = -1, scheme: str = "symmetric",
             scale_dtype=jnp.float32, pack_block: int | None = None) -> QuantizedTensor:
    """Group-wise quantization of ``x`` along ``axis`` with packed codes.

    Args:
      x: any float array.
      bits: 2, 4 or 8.
      group_size: elements per group along ``axis`` (must divide ``x.shape[axis]``).
      axis: the axis along which groups run (e.g. -1: per-token groups of channels; the token axis:
        per-channel groups of tokens as KIVI does for keys).
      scheme: "symmetric", "midrise" or "asymmetric" (see module docstring).
      scale_dtype: storage dtype of scales and zero points: float32, bfloat16, float16 or
        float8_e4m3fn (QVG's choice; its smallest normal 2^-6 floors the scale of small groups).
      pack_block: elements per packing block along the last axis (default: ``group_size`` if ``axis``
        is the last axis, else the whole last axis).

    Returns:
      A :class:`QuantizedTensor`.

    Raises:
      ValueError: naming the argument, for bad options and for a concrete ``x`` holding NaN or
        +-inf (one such entry would wipe its whole group). A traced ``x`` (inside ``jit``) is not
        checked for finiteness.
    """
    bits, scheme = _check_bits(bits), _check_scheme(scheme)
    _check_x(x)
    axis, pack_block = _check_layout(x.shape, bits=bits, group_size=group_size, axis=axis, pack_block=pack_block)
    codes, scale, zero = quantize_codes(x, bits=bits, group_size=group_size, axis=axis, scheme=scheme,
                                        scale_dtype=scale_dtype)
    return QuantizedTensor(
        codes=pack_codes(codes, bits, block=pack_block), scale=scale, zero=zero, bits=bits,
        group_size=int(group_size), axis=axis, scheme=scheme, pack_block=pack_block, shape=tuple(x.shape),
        dtype=jnp.dtype(x.dtype).name)


def dequantize_codes(codes: jax.Array, scale: jax.Array, zero: jax.Array | None, *, bits: int, group_size: int,
                     axis: int, scheme: str) -> jax.Array:
    """float32 values of unpacked ``codes`` with per-group ``scale`` / ``zero`` along ``axis``."""
    axis %= codes.ndim
    cg = _grouped(codes, axis, group_size)
    expand = lambda a: None if a is None else jnp.moveaxis(a, axis, -1)[..., None]
    return _ungrouped(decode(cg, expand(scale), expand(zero), bits=bits, scheme=scheme), axis)


def dequantize(qt: QuantizedTensor, dtype=None) -> jax.Array:
    """The values the codes stand for, in ``dtype`` (default: the original dtype)."""
    if not isinstance(qt, QuantizedTensor):
        raise ValueError(f"qt must be a QuantizedTensor; got {type(qt).__name__}")
    codes = unpack_codes(qt.codes, qt.bits, block=qt.pack_block)
    out = dequantize_codes(codes, qt.scale, qt.zero, bits=qt.bits, group_size=qt.group_size, axis=qt.axis,
                           scheme=qt.scheme)
    return out.astype(qt.dtype if dtype is None else dtype)

