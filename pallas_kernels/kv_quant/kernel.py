"""kv_quant kernel bodies (shared by Mosaic TPU, Triton and the interpreter).

Both kernels work on the packed layout of `primitives.quantization` with groups along the last
(channel) axis and pack blocks equal to the groups: group `gg` of `G` channels occupies bytes
`[gg G/n, (gg+1) G/n)` and plane `i` of those bytes holds channels `gg G + i G/n + [0, G/n)`. Every
tile is therefore handled as `n * d / G` contiguous "sub-slices" of `G/n` channels, read with static
`pl.ds` ref slices: no reshape, concatenate or interleave inside a kernel, which keeps the body
lowerable for both backends.

`quantize_kernel` (grid over row blocks): for each group, reduce its sub-slices to the extrema,
compute the stored scale (and zero point) exactly as the reference does, encode each sub-slice with
a portable round-half-to-even, OR the planes together and store one byte slice.

`dequantize_kernel` (grid over row blocks): unpack each plane of each group with one shift and one
mask, apply `(u - offset) * s` (or `u * s + z`) exactly as the reference, store the sub-slice.

`quantize_tokens_minor_kernel` / `dequantize_tokens_minor_kernel` (TPU, grid (leading blocks, token
blocks), used when the input has a token axis: see `api._token_axis`): the same arithmetic with each
array in the layout XLA:TPU stores it in, tokens on lanes for a narrow last dim ([Q, w, bl] blocks), rows
for a lane-dense one ([bl, Q, w]). Each of a token's Q rows is one [d, bl] tile (transposed once when
read or written row-major), so a group is G sublanes and its extrema a sublane reduction.

Quantized decode has no kernel body of its own: it is the dense split-K decode kernel
(`decode_attention.kernel.split_k_decode_kernel`) with `quant_tile_loader`, which reads one
`block_k`-key tile of one KV head as packed codes and scales, unpacks and dequantizes it
(`(u - offset) * s` or `u * s + z`, s read as a [bk, 1] column) into G/n-channel sub-slices; the
shell sums the logits over K sub-slices, takes the shared online-softmax step and keeps one float32
accumulator per V sub-slice.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.decode_attention.kernel import TileLoader
from primitives import quantization as qref


def round_half_even(y: jax.Array) -> jax.Array:
    """Round half to even from floor (Triton has no lowering for lax.round).

    Equals `jnp.round` on every finite float32: `y - floor(y)` is exact, ties go to the even floor
    or ceiling, and |y| >= 2^23 is already an integer (frac 0).
    """
    f = jnp.floor(y)
    frac = y - f
    f_odd = (f - 2.0 * jnp.floor(f * 0.5)) != 0.0
    up = jnp.logical_or(frac > 0.5, jnp.logical_and(frac == 0.5, f_odd))
    return jnp.where(up, f + 1.0, f)


def triton_reciprocal_rn(s: jax.Array) -> jax.Array:
    """The correctly rounded float32 `1 / s` on compiled Triton (`triton_div_rn`)."""
    return triton_div_rn(jnp.ones_like(s), s)


def triton_div_rn(a: jax.Array, b: jax.Array) -> jax.Array:
    """IEEE (round-to-nearest-even) float32 division on the Triton backend.

    Triton lowers `/` on float32 to PTX `div.full.f32` (about 2 ulp), which would move codes at
    rounding boundaries away from the reference; `div.rn.f32` is the correctly rounded division
    that XLA uses. Compiled Triton only (the interpreter has no inline assembly).
    """
    from jax.experimental.pallas import triton as pltriton

    b = jnp.broadcast_to(b, a.shape)
    (out,) = pltriton.elementwise_inline_asm(
        "div.rn.f32 $0, $1, $2;", args=[a, b], constraints="=r,r,r", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, jnp.float32)])
    return out


def unpack_plane(byte: jax.Array, plane: int, bits: int) -> jax.Array:
    """int32 bytes -> float32 codes of plane `plane`."""
    return ((byte >> (bits * plane)) & (2**bits - 1)).astype(jnp.float32)


def _encode_group(parts, *, axis: int, bits: int, scheme: str, scale_dtype, reciprocal_fn=None):
    """One group's stored (packed int32 codes, scale, zero point) from its n = 8 / bits float32 sub-slices
    (plane i = parts[i]), reduced along `axis` (-1: channels along lanes; 0: along sublanes)."""
    if scheme == "asymmetric":
        hi = functools.reduce(jnp.maximum, [p.max(axis=axis, keepdims=True) for p in parts])
        lo = functools.reduce(jnp.minimum, [p.min(axis=axis, keepdims=True) for p in parts])
    else:
        hi, lo = functools.reduce(jnp.maximum, [jnp.abs(p).max(axis=axis, keepdims=True) for p in parts]), None
    scale, zero = qref.scale_and_zero(hi, lo, bits=bits, scheme=scheme, scale_dtype=scale_dtype)
    div = {} if reciprocal_fn is None else {"reciprocal_fn": reciprocal_fn}
    packed = None
    for i, p in enumerate(parts):
        u = qref.encode(p, scale, zero, bits=bits, scheme=scheme, round_fn=round_half_even, dtype=jnp.int32, **div)
        packed = u if packed is None else packed | (u << (bits * i))
    return packed, scale, zero


def quantize_kernel(x_ref, *refs, bits: int, group_size: int, scheme: str, scale_dtype, reciprocal_fn=None):
    """x_ref [br, d] -> c_ref [br, d/n] uint8, s_ref [br, d/G] (z_ref [br, d/G] if asymmetric).

    `reciprocal_fn`: the correctly rounded float32 `1 / s` for backends whose `/` is approximate
    (None: `/`).
    """
    if scheme == "asymmetric":
        c_ref, s_ref, z_ref = refs
    else:
        (c_ref, s_ref), z_ref = refs, None
    n = 8 // bits
    sub = group_size // n
    br, d = x_ref.shape
    ng = d // group_size
    col = jax.lax.broadcasted_iota(jnp.int32, (br, ng), 1)
    scales = jnp.zeros((br, ng), jnp.float32)
    zeros = jnp.zeros((br, ng), jnp.float32)
    for gg in range(ng):  # static
        parts = [x_ref[:, pl.ds(gg * group_size + i * sub, sub)].astype(jnp.float32) for i in range(n)]
        packed, scale, zero = _encode_group(parts, axis=-1, bits=bits, scheme=scheme, scale_dtype=scale_dtype,
                                            reciprocal_fn=reciprocal_fn)
        c_ref[:, pl.ds(gg * sub, sub)] = packed.astype(c_ref.dtype)
        scales = jnp.where(col == gg, scale.astype(jnp.float32), scales)
        if zero is not None:
            zeros = jnp.where(col == gg, zero.astype(jnp.float32), zeros)
    s_ref[...] = scales.astype(s_ref.dtype)
    if z_ref is not None:
        z_ref[...] = zeros.astype(z_ref.dtype)


def dequantize_kernel(c_ref, s_ref, *refs, bits: int, group_size: int, scheme: str):
    """c_ref [br, d/n] uint8, s_ref [br, d/G] (z_ref [br, d/G] if asymmetric) -> o_ref [br, d]."""
    if scheme == "asymmetric":
        z_ref, o_ref = refs
    else:
        (o_ref,), z_ref = refs, None
    n = 8 // bits
    sub = group_size // n
    ng = o_ref.shape[-1] // group_size
    for gg in range(ng):  # static
        byte = c_ref[:, pl.ds(gg * sub, sub)].astype(jnp.int32)
        s = s_ref[:, pl.ds(gg, 1)]
        z = None if z_ref is None else z_ref[:, pl.ds(gg, 1)]
        for i in range(n):
            xhat = qref.decode(unpack_plane(byte, i, bits), s, z, bits=bits, scheme=scheme)
            o_ref[:, pl.ds(gg * group_size + i * sub, sub)] = xhat.astype(o_ref.dtype)


def _row_tile(ref, qq: int):
    """Row qq of every token of a row-major block: [bl, Q, w] -> [bl, w]; a [bl, w] block is Q = 1."""
    return ref[...] if ref.ndim == 2 else ref[:, qq, :]


def _set_row_tile(ref, qq: int, value):
    if ref.ndim == 2:
        ref[...] = value
    else:
        ref[:, qq, :] = value


def quantize_tokens_minor_kernel(x_ref, *refs, bits: int, group_size: int, scheme: str, scale_dtype,
                                 values_minor: bool, codes_minor: bool):
    """x_ref [bl, Q, d] or, values_minor, [Q, d, bl] -> c_ref [Q, d/n, bl] uint8 or, not codes_minor,
    [bl, Q, d/n]; s_ref [Q, d/G, bl] (z_ref [Q, d/G, bl] if asymmetric).

    The TPU shell's form: the same codes, scales and zero points as `quantize_kernel`, each array read
    or written in the layout XLA:TPU gives it (`api._token_axis`): tokens on lanes for narrow last dims,
    row-major for lane-dense ones. Each of the Q rows of a token is handled as one [d, bl] tile
    (transposed once when read row-major) whose groups are reduced along sublanes.
    """
    if scheme == "asymmetric":
        c_ref, s_ref, z_ref = refs
    else:
        (c_ref, s_ref), z_ref = refs, None
    n = 8 // bits
    sub = group_size // n
    nq, ng, bl = s_ref.shape
    row = jax.lax.broadcasted_iota(jnp.int32, (ng, bl), 0)
    for qq in range(nq):  # static
        xt = x_ref[qq].astype(jnp.float32) if values_minor else _row_tile(x_ref, qq).astype(jnp.float32).T  # [d, bl]
        scales = jnp.zeros((ng, bl), jnp.float32)
        zeros = jnp.zeros((ng, bl), jnp.float32)
        packed_groups = []
        for gg in range(ng):  # static
            parts = [xt[gg * group_size + i * sub: gg * group_size + (i + 1) * sub] for i in range(n)]
            packed, scale, zero = _encode_group(parts, axis=0, bits=bits, scheme=scheme, scale_dtype=scale_dtype)
            if codes_minor:
                c_ref[qq, pl.ds(gg * sub, sub), :] = packed.astype(c_ref.dtype)
            packed_groups.append(packed)
            scales = jnp.where(row == gg, scale.astype(jnp.float32), scales)
            if zero is not None:
                zeros = jnp.where(row == gg, zero.astype(jnp.float32), zeros)
        if not codes_minor:
            _set_row_tile(c_ref, qq, jnp.concatenate(packed_groups, axis=0).T.astype(c_ref.dtype))
        s_ref[qq] = scales.astype(s_ref.dtype)
        if z_ref is not None:
            z_ref[qq] = zeros.astype(z_ref.dtype)


def dequantize_tokens_minor_kernel(c_ref, s_ref, *refs, bits: int, group_size: int, scheme: str,
                                   values_minor: bool, codes_minor: bool):
    """c_ref [Q, d/n, bl] uint8 (or [bl, Q, d/n]), s_ref [Q, d/G, bl] (z_ref) -> o_ref [bl, Q, d] (or
    [Q, d, bl]): `dequantize_kernel` with each array in XLA:TPU's layout, as `quantize_tokens_minor_kernel`."""
    if scheme == "asymmetric":
        z_ref, o_ref = refs
    else:
        (o_ref,), z_ref = refs, None
    n = 8 // bits
    sub = group_size // n
    nq, ng = s_ref.shape[0], s_ref.shape[1]
    for qq in range(nq):  # static
        codes = c_ref[qq].astype(jnp.int32) if codes_minor else _row_tile(c_ref, qq).astype(jnp.int32).T  # [d/n, bl]
        pieces = []
        for gg in range(ng):  # static
            byte = codes[gg * sub:(gg + 1) * sub]
            s = s_ref[qq, pl.ds(gg, 1), :]
            z = None if z_ref is None else z_ref[qq, pl.ds(gg, 1), :]
            pieces += [qref.decode(unpack_plane(byte, i, bits), s, z, bits=bits, scheme=scheme) for i in range(n)]
        values = jnp.concatenate(pieces, axis=0)  # [d, bl]
        if values_minor:
            o_ref[qq] = values.astype(o_ref.dtype)
        else:
            _set_row_tile(o_ref, qq, values.T.astype(o_ref.dtype))


def _head_rows(ref, h: int, rows):
    """[x, bk] of KV head `h` from a [k, x, split] ref, or [1, bk] from a [k, split] ref (x = 1: all heads'
    rows are read, then row `h` is taken in registers, which avoids a one-row load of packed 16-bit rows)."""
    if ref.ndim == 2:
        return ref[:, rows][h:h + 1]
    return ref[h, :, rows]


def dequant_subslices(c_ref, s_ref, z_ref, rows, h: int, *, bits: int, group_size: int, scheme: str,
                      transposed: bool = False):
    """Dequantized float32 sub-slices [bk, G/n] of one tile of one KV head, in channel order.

    c_ref [split, k, d/n] uint8 codes, s_ref (z_ref) [split, k, d/G] scales (zero points); `rows` a
    `pl.ds` of the tile's keys. Sub-slice `gg n + i` holds channels `gg G + i G/n + [0, G/n)`.
    transposed: the refs are [k, d/n, split] and [k, d/G, split] (tokens last, the "bkxs" layout; [k,
    split] where that last dim is 1) and the sub-slices come as [G/n, bk]; the scales of the tile are read once as
    [d/G, bk] (a cast to float32 first, as `qref.decode` does) and broadcast down the sub-slice's
    channels.
    """
    n = 8 // bits
    sub = group_size // n
    x = (c_ref.shape[1] if c_ref.ndim == 3 else 1) if transposed else c_ref.shape[-1]  # d/n code bytes
    ng = x // sub
    if transposed:
        s_all = _head_rows(s_ref, h, rows).astype(jnp.float32)
        z_all = None if z_ref is None else _head_rows(z_ref, h, rows).astype(jnp.float32)
    out = []
    for gg in range(ng):
        if transposed:
            byte = (c_ref[h, pl.ds(gg * sub, sub), rows] if c_ref.ndim == 3 else _head_rows(c_ref, h, rows))
            byte = byte.astype(jnp.int32)
            s = s_all[gg:gg + 1]
            z = None if z_all is None else z_all[gg:gg + 1]
        else:
            byte = c_ref[rows, h, pl.ds(gg * sub, sub)].astype(jnp.int32)
            s = s_ref[rows, h, pl.ds(gg, 1)]
            z = None if z_ref is None else z_ref[rows, h, pl.ds(gg, 1)]
        for i in range(n):
            out.append(qref.decode(unpack_plane(byte, i, bits), s, z, bits=bits, scheme=scheme))
    return tuple(out)


def _load_quantized(cache_refs, h, rows, *, k_meta: tuple, v_meta: tuple, transposed: bool):
    refs = list(cache_refs)
    kc_ref, ks_ref = refs.pop(0), refs.pop(0)
    kz_ref = refs.pop(0) if k_meta[2] == "asymmetric" else None
    vc_ref, vs_ref = refs.pop(0), refs.pop(0)
    vz_ref = refs.pop(0) if v_meta[2] == "asymmetric" else None
    k_bits, k_group, k_scheme = k_meta
    v_bits, v_group, v_scheme = v_meta
    k_parts = dequant_subslices(kc_ref, ks_ref, kz_ref, rows, h, bits=k_bits, group_size=k_group, scheme=k_scheme,
                                transposed=transposed)
    v_parts = dequant_subslices(vc_ref, vs_ref, vz_ref, rows, h, bits=v_bits, group_size=v_group, scheme=v_scheme,
                                transposed=transposed)
    return k_parts, v_parts


def quant_tile_loader(*, k_meta: tuple, v_meta: tuple, transposed: bool = False) -> TileLoader:
    """The dequantizing tile loader of the split-K decode shell.

    Cache refs, in order: K codes, K scales, [K zero points], V codes, V scales, [V zero points], each
    [split, k, x] (token-major "bskd"), or [k, x, split] with `transposed` (the "bkxs" layout the TPU
    path uses: tokens on lanes, so the narrow code, scale and zero-point rows are not padded to 128
    lanes). `k_meta` / `v_meta` = (bits, group_size, scheme). K and V come as sub-slices of G/n
    channels (`dequant_subslices`), [bk, G/n] or, transposed, [G/n, bk].
    """
    return TileLoader(load=functools.partial(_load_quantized, k_meta=k_meta, v_meta=v_meta, transposed=transposed),
                      k_width=k_meta[1] // (8 // k_meta[0]), v_width=v_meta[1] // (8 // v_meta[0]),
                      transposed=transposed)
