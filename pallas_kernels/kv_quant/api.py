"""Public kv_quant ops: `quantize(x, ...)`, `dequantize(qt, ...)` and
`quantized_decode_attention(q, k, v, lengths, ...)`.

Dimension legend: `b` batch, `h` query heads, `k` key/value heads (h % k == 0), `s` cache capacity,
`d` head dim, `n = 8 / bits` codes per byte, `G` group size.

`quantize` has the contract of `primitives.quantization.quantize` for groups along the last axis
(pack blocks = groups): the Pallas kernel produces bit-identical codes, scales and zero points
(same float32 op order; round-half-even built from floor; on compiled Triton the reciprocal `1 / s` is
an explicit `div.rn.f32`, because Triton's `/` is approximate). `dequantize` is the inverse of that format,
computed with the reference's `(u - offset) * s` / `u * s + z`.

`quantized_decode_attention` is `primitives.attention.decode_attention` over the *dequantized* cache:
K and V are `QuantizedTensor`s of shape [b, s, k, d] quantized along d (each may have its own bits,
group size and scheme); the cache is token-major only (no `kv_layout`: the head-major "bksd" order of
the dense kernel is not supported here). It runs the dense split-K decode shell
(`decode_attention.api.split_k_decode`: same grid, specs, tiling `DecodeBlockSizes` and split merge)
with a dequantizing tile loader (`kernel.quant_tile_loader`): the kernel reads the packed codes and
scales (not a float copy), dequantizes each `block_k`-key tile right before its matmuls, splits the
cache into `num_splits` parts processed in parallel and merges them with
`primitives.attention.combine_partials`. A sequence of length 0
gives zeros (lse -inf). `return_residuals=True` also returns the float32 logsumexp [b, h].

On TPU the kernel views each cache array as [b, k, x, s] ([b, k, s] when x = 1; tokens on lanes, the
shell's "bkxs" layout): XLA:TPU stores a [b, s, k, x] array whose x is narrow (d/n code bytes, d/G scales) with the
token axis minor, so that view is a bitcast, and the kernel's blocks are lane-dense. Read token-major
instead, every array was first copied to a row-major layout that pads x to 128 lanes (2.5 GiB of HBM
temporaries for the 216 MiB cache of `pallas_kernels.aot`'s `quantized_decode_32k`; none now, on v5e
and v6e). The tokens on lanes make TPU's `block_k` a multiple of 128.

Largest compiled shapes (`pallas_kernels.aot`'s formats: a [8, s, 8, 128] bfloat16 cache; K 4-bit
groups of 64 with float32 scales, V 2-bit asymmetric groups of 128 with bfloat16 scales):
  * `quantize` (the keys' format) and `dequantize` (the values' format): on TPU each array is read or
    written in the layout XLA:TPU stores it in (`_token_axis`): the narrow codes and scales tokens-minor,
    the values row-major. Compiled for TPU (libtpu 0.0.42.1, batch 8, 8 KV heads, d 128, bf16) at 512k
    tokens on v5e and v6e with no HBM temporaries; so do 8-bit codes and head_dim 64 at 32k, 32 heads per
    token at 16k, a [32k, 8, 128] float32 input, a head-major [8, 8, 32k, 128] cache and a flat [256k,
    128] one (one row per token: the row-major arrays are viewed without their unit axis, which as a
    second-minor dim made XLA relay them out, 1 GiB and 128 MiB). The row-major kernel they replace on
    TPU (still the Triton one) wrote [rows, d/n] codes and [rows, d/G] scales that XLA then relaid out:
    1.3 GiB (quantize) and 1.4 GiB (dequantize) of temporaries at 32k, and neither compiled past 256k
    tokens on v5e.
  * `quantized_decode_attention`: Compiles for TPU (libtpu 0.0.42.1, batch 8, 32/8 heads, d 128, bf16)
    up to 512k tokens on v5e and 512k on v6e (the survey's largest; no HBM temporaries at all); beyond,
    it still compiles at 2M tokens on v5e and 4M on v6e (13.5 and 27 GiB of packed cache, at most
    384 MiB of temporaries: the split partials), and on v5e the 4M cache alone (27 GiB) exceeds the
    chip's 16 GiB of HBM (not compiled).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import _backend
from pallas_kernels.decode_attention.api import split_k_decode
from pallas_kernels.kv_quant.config import QuantDecodeBlockSizes, QuantizeBlockSizes, quant_decode_default
from pallas_kernels.kv_quant.cost import dequantize_cost, quant_decode_cost, quantize_cost
from pallas_kernels.kv_quant.kernel import (dequantize_kernel, dequantize_tokens_minor_kernel, quant_tile_loader,
                                           quantize_kernel, quantize_tokens_minor_kernel, triton_reciprocal_rn)
from primitives import attention as attn_ref
from primitives import quantization as qref

__all__ = ["quantize", "dequantize", "quantized_decode_attention"]


def _check_kernel_format(*, bits, group_size, last, implementation, what):
    """Sub-slice rules of the kernels: G/n channels per matmul / store."""
    n = 8 // bits
    sub = group_size // n
    if implementation == "pallas_triton" and (not _backend.is_power_of_two(sub) or not _backend.is_power_of_two(last)):
        raise ValueError(f"Triton needs {what} group_size / (8 / bits) and the last dim powers of two; got "
                         f"group_size={group_size}, bits={bits}, last dim={last}")


_MAX_TOKENS_MINOR_ROWS = 32  # Q rows per token of the tokens-minor TPU kernel (each one unrolled)


def _token_axis(shape, impl) -> int | None:
    """The axis the TPU kernels put on lanes, or None for the row-major kernel.

    XLA:TPU lays out an array with a narrow last dim (the d/n code bytes, d/G scales) with a long axis
    minor instead: in the layouts it picked for the shapes tried, the last leading axis whose length is
    a multiple of 128 (the tokens of a [b, s, k, d] cache). The tokens-minor kernels write codes and
    scales as [P, Q, x, L] with that axis L last, so moving it back is a bitcast there, not a
    relayout (which cost 1.3 GiB of temporaries for a 32k-token cache). Shapes without such an axis, or
    with more than `_MAX_TOKENS_MINOR_ROWS` rows per token, take the row-major kernel, whose output XLA
    relays out.
    """
    if impl != "pallas_tpu":
        return None
    for ax in range(len(shape) - 2, -1, -1):
        if shape[ax] % 128 == 0 and shape[ax] > 0:
            return ax if math.prod(shape[ax + 1:-1]) <= _MAX_TOKENS_MINOR_ROWS else None
    return None


def _tokens_minor_dims(shape, ax):
    """[P, L, Q, d] of a [..., d] shape split at token axis `ax`."""
    return math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:-1]), shape[-1]


def _lanes_minor(width: int) -> bool:
    """Whether XLA:TPU keeps an array with this last dim tokens-minor (narrow or unaligned last dim)."""
    return width % 128 != 0


def _tokens_minor_view(a, nb, length, nq, lp):
    """[..., w] -> the kernel's [P, Q, w, Lp] (tokens minor, padded) or [P, Lp, Q, w] (row-major) view;
    row-major with Q = 1 drops the unit axis ([P, Lp, w]): as a second-minor dim XLA:TPU would pad it to a
    full sublane tile, i.e. relay the whole array out."""
    a = a.reshape(nb, length, nq, a.shape[-1])
    if _lanes_minor(a.shape[-1]):
        return _backend.pad_axis(jnp.transpose(a, (0, 2, 3, 1)), 3, lp)
    return _backend.pad_axis(a[:, :, 0] if nq == 1 else a, 1, lp)


def _tokens_minor_array(nb, lp, nq, width, bl, dtype=None):
    """(BlockSpec, ShapeDtypeStruct or None without `dtype`) of one array in `_tokens_minor_view`'s form."""
    if _lanes_minor(width):
        shape, block, index = (nb, nq, width, lp), (None, nq, width, bl), lambda p, t: (p, 0, 0, t)
    elif nq == 1:
        shape, block, index = (nb, lp, width), (None, bl, width), lambda p, t: (p, t, 0)
    else:
        shape, block, index = (nb, lp, nq, width), (None, bl, nq, width), lambda p, t: (p, t, 0, 0)
    return pl.BlockSpec(block, index), None if dtype is None else jax.ShapeDtypeStruct(shape, dtype)


def _from_tokens_minor(o, width, lead, length):
    """Inverse of `_tokens_minor_view`: a kernel output back to [*lead, width]."""
    if _lanes_minor(width):
        return jnp.transpose(o[..., :length], (0, 3, 1, 2)).reshape(*lead, width)
    return o[:, :length].reshape(*lead, width)


def _token_tiling(length, rows, d, block_sizes):
    bs = block_sizes or QuantizeBlockSizes.tokens_minor_default(length=length, rows=rows, last_dim=d)
    if bs.block_rows % 128:
        raise ValueError(f"block_sizes.block_rows must be a multiple of 128 on TPU for a {length}-token axis (tokens "
                         f"lie on lanes); got block_rows={bs.block_rows}")
    return bs.block_rows, -(-length // bs.block_rows) * bs.block_rows


def _row_tiling(rows, block_sizes, impl):
    bs = block_sizes or QuantizeBlockSizes.default(rows=rows, implementation=impl)
    bs.validate(impl)
    return bs, -(-rows // bs.block_rows) * bs.block_rows


@functools.partial(jax.jit, static_argnames=("bits", "group_size", "scheme", "scale_dtype", "block_sizes",
                                             "implementation", "interpret"))
def quantize(
    x: jax.Array,
    *,
    bits: int,
    group_size: int,
    scheme: str = "symmetric",
    scale_dtype=jnp.float32,
    block_sizes: QuantizeBlockSizes | None = None,
    implementation: str | None = None,
    interpret: bool | None = None,
) -> qref.QuantizedTensor:
    """Group-wise quantization along the last axis with packed codes.

    Args:
      x: [..., d] float array (d divisible by group_size).
      bits: 2, 4 or 8.  group_size: channels per group.  scheme: "symmetric" | "midrise" | "asymmetric".
      scale_dtype: float32 | bfloat16 | float16 storage of scales (and zero points).
      block_sizes: row tiling; default `QuantizeBlockSizes.default(...)`.
      implementation: None | "xla" | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).

    Returns:
      `primitives.quantization.QuantizedTensor` (axis = last, pack_block = group_size).
    """
    if x.ndim < 1:
        raise ValueError(f"x must have at least one dimension; got shape {x.shape}")
    qref._check_x(x)
    # Validates bits, scheme, group_size and scale_dtype with the reference's messages.
    qref._check_layout(x.shape, bits=qref._check_bits(bits), group_size=group_size, axis=-1, pack_block=None)
    qref._check_scheme(scheme)
    sdt = qref._scale_dtype(scale_dtype)
    impl = _backend.resolve_implementation(implementation)
    if impl == "xla":
        return qref.quantize(x, bits=bits, group_size=group_size, axis=-1, scheme=scheme, scale_dtype=sdt)

    d = x.shape[-1]
    _check_kernel_format(bits=bits, group_size=group_size, last=d, implementation=impl, what="x's")
    rows = math.prod(x.shape[:-1])
    if rows == 0:  # nothing to tile: the reference returns the empty arrays
        return qref.quantize(x, bits=bits, group_size=group_size, axis=-1, scheme=scheme, scale_dtype=sdt)
    asym = scheme == "asymmetric"
    cost = quantize_cost(elements=rows * d, bits=bits, group_size=group_size, in_itemsize=x.dtype.itemsize,
                         scale_itemsize=sdt.itemsize, asymmetric=asym)
    cost = pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed), transcendentals=0)
    interp = _backend.resolve_interpret(interpret)
    ax = _token_axis(x.shape, impl)
    if ax is not None:
        outs = _quantize_tokens_minor(x, ax, bits=bits, group_size=group_size, scheme=scheme, sdt=sdt,
                                      block_sizes=block_sizes, cost=cost, interpret=interp)
    else:
        outs = _quantize_rows(x, bits=bits, group_size=group_size, scheme=scheme, sdt=sdt, block_sizes=block_sizes,
                              impl=impl, cost=cost, interpret=interp)
    codes, scale = outs[0], outs[1]
    zero = outs[2] if asym else None
    return qref.QuantizedTensor(codes=codes, scale=scale, zero=zero, bits=bits, group_size=group_size,
                                axis=x.ndim - 1, scheme=scheme, pack_block=group_size, shape=tuple(x.shape),
                                dtype=jnp.dtype(x.dtype).name)


def _quantize_tokens_minor(x, ax, *, bits, group_size, scheme, sdt, block_sizes, cost, interpret):
    """TPU: every array in XLA:TPU's layout (narrow ones tokens-on-lanes, see `_token_axis`), as [..., x]."""
    nb, length, nq, d = _tokens_minor_dims(x.shape, ax)
    n, ng = 8 // bits, d // group_size
    bl, lp = _token_tiling(length, nq, d, block_sizes)
    widths = [d // n, ng] + ([ng] if scheme == "asymmetric" else [])
    dtypes = [jnp.uint8, sdt, sdt]
    kernel = functools.partial(quantize_tokens_minor_kernel, bits=bits, group_size=group_size, scheme=scheme,
                               scale_dtype=sdt, values_minor=_lanes_minor(d), codes_minor=_lanes_minor(d // n))
    out_specs, out_shape = zip(*[_tokens_minor_array(nb, lp, nq, w, bl, dt) for w, dt in zip(widths, dtypes)])
    outs = pl.pallas_call(
        kernel,
        grid=(nb, lp // bl),
        in_specs=[_tokens_minor_array(nb, lp, nq, d, bl)[0]],
        out_specs=list(out_specs),
        out_shape=list(out_shape),
        compiler_params=_backend.compiler_params("pallas_tpu", dimension_semantics=("parallel", "parallel")),
        interpret=interpret,
        cost_estimate=cost,
        name="kv_quantize",
    )(_tokens_minor_view(x, nb, length, nq, lp))
    return [_from_tokens_minor(o, w, x.shape[:-1], length) for o, w in zip(outs, widths)]


def _quantize_rows(x, *, bits, group_size, scheme, sdt, block_sizes, impl, cost, interpret):
    """Row-major kernel: [rows, d] tiles in, [rows, d/n] codes and [rows, d/G] scales out, as [..., x]."""
    d = x.shape[-1]
    n, ng = 8 // bits, d // group_size
    rows = math.prod(x.shape[:-1])
    bs, rp = _row_tiling(rows, block_sizes, impl)
    x2 = x.reshape(rows, d)
    if rp != rows:
        x2 = jnp.pad(x2, ((0, rp - rows), (0, 0)))
    asym = scheme == "asymmetric"
    out_shape = [jax.ShapeDtypeStruct((rp, d // n), jnp.uint8), jax.ShapeDtypeStruct((rp, ng), sdt)]
    out_specs = [pl.BlockSpec((bs.block_rows, d // n), lambda r: (r, 0)),
                 pl.BlockSpec((bs.block_rows, ng), lambda r: (r, 0))]
    if asym:
        out_shape.append(jax.ShapeDtypeStruct((rp, ng), sdt))
        out_specs.append(pl.BlockSpec((bs.block_rows, ng), lambda r: (r, 0)))
    reciprocal_fn = triton_reciprocal_rn if impl == "pallas_triton" and not interpret else None
    kernel = functools.partial(quantize_kernel, bits=bits, group_size=group_size, scheme=scheme, scale_dtype=sdt,
                               reciprocal_fn=reciprocal_fn)
    with _backend.quiet_triton_deprecation():
        outs = pl.pallas_call(
            kernel,
            grid=(rp // bs.block_rows,),
            in_specs=[pl.BlockSpec((bs.block_rows, d), lambda r: (r, 0))],
            out_specs=out_specs,
            out_shape=out_shape,
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",)),
            interpret=interpret,
            cost_estimate=cost,
            name="kv_quantize",
        )(x2)
    return [o[:rows].reshape(*x.shape[:-1], o.shape[-1]) for o in outs]


@functools.partial(jax.jit, static_argnames=("dtype", "block_sizes", "implementation", "interpret"))
def dequantize(
    qt: qref.QuantizedTensor,
    *,
    dtype=None,
    block_sizes: QuantizeBlockSizes | None = None,
    implementation: str | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """The values a `QuantizedTensor` stands for (as `primitives.quantization.dequantize`).

    Args:
      qt: a QuantizedTensor. The Pallas kernels need the format `quantize` writes (groups along the
        last axis, pack_block == group_size); "xla" takes any format.
      dtype: output dtype (default: the original dtype, `qt.dtype`).
      block_sizes: row tiling; default `QuantizeBlockSizes.default(...)`.
      implementation: None | "xla" | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).

    Returns:
      [*qt.shape] array in `dtype`.
    """
    if not isinstance(qt, qref.QuantizedTensor):
        raise ValueError(f"qt must be a primitives.quantization.QuantizedTensor; got {type(qt).__name__}")
    out_dtype = jnp.dtype(qt.dtype if dtype is None else dtype)
    impl = _backend.resolve_implementation(implementation)
    if impl == "xla":
        return qref.dequantize(qt, out_dtype)
    nd = len(qt.shape)
    if qt.axis != nd - 1 or qt.pack_block != qt.group_size:
        raise ValueError(f"qt must be quantized along the last axis with pack_block == group_size for the Pallas "
                         f"kernel; got axis={qt.axis} (rank {nd}), pack_block={qt.pack_block}, "
                         f"group_size={qt.group_size}")
    d = qt.shape[-1]
    _check_kernel_format(bits=qt.bits, group_size=qt.group_size, last=d, implementation=impl, what="qt's")
    rows = math.prod(qt.shape[:-1])
    if rows == 0:
        return jnp.zeros(qt.shape, out_dtype)
    asym = qt.scheme == "asymmetric"
    arrays = [qt.codes, qt.scale] + ([qt.zero] if asym else [])
    cost = dequantize_cost(elements=rows * d, bits=qt.bits, group_size=qt.group_size, out_itemsize=out_dtype.itemsize,
                           scale_itemsize=qt.scale.dtype.itemsize, asymmetric=asym)
    call = dict(out_dtype=out_dtype, block_sizes=block_sizes, interpret=_backend.resolve_interpret(interpret),
                cost=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed), transcendentals=0))
    ax = _token_axis(qt.shape, impl)
    if ax is not None:
        return _dequantize_tokens_minor(qt, arrays, ax, **call)
    return _dequantize_rows(qt, arrays, impl=impl, **call)


def _dequantize_tokens_minor(qt, arrays, ax, *, out_dtype, block_sizes, interpret, cost):
    """TPU: codes, scales and values each in XLA:TPU's layout (narrow ones tokens-on-lanes, a bitcast of
    how it stores them; see `_token_axis`)."""
    nb, length, nq, d = _tokens_minor_dims(qt.shape, ax)
    bl, lp = _token_tiling(length, nq, d, block_sizes)
    kernel = functools.partial(dequantize_tokens_minor_kernel, bits=qt.bits, group_size=qt.group_size,
                               scheme=qt.scheme, values_minor=_lanes_minor(d),
                               codes_minor=_lanes_minor(qt.codes.shape[-1]))
    out_spec, out_shape = _tokens_minor_array(nb, lp, nq, d, bl, out_dtype)
    out = pl.pallas_call(
        kernel,
        grid=(nb, lp // bl),
        in_specs=[_tokens_minor_array(nb, lp, nq, a.shape[-1], bl)[0] for a in arrays],
        out_specs=out_spec,
        out_shape=out_shape,
        compiler_params=_backend.compiler_params("pallas_tpu", dimension_semantics=("parallel", "parallel")),
        interpret=interpret,
        cost_estimate=cost,
        name="kv_dequantize",
    )(*[_tokens_minor_view(a, nb, length, nq, lp) for a in arrays])
    return _from_tokens_minor(out, d, qt.shape[:-1], length)


def _dequantize_rows(qt, arrays, *, impl, out_dtype, block_sizes, interpret, cost):
    """Row-major kernel: [rows, x] code and scale tiles in, [rows, d] values out."""
    d = qt.shape[-1]
    rows = math.prod(qt.shape[:-1])
    bs, rp = _row_tiling(rows, block_sizes, impl)
    arrays = [_backend.pad_axis(a.reshape(rows, a.shape[-1]), 0, rp) for a in arrays]
    specs = [pl.BlockSpec((bs.block_rows, a.shape[-1]), lambda r: (r, 0)) for a in arrays]
    kernel = functools.partial(dequantize_kernel, bits=qt.bits, group_size=qt.group_size, scheme=qt.scheme)
    with _backend.quiet_triton_deprecation():
        out = pl.pallas_call(
            kernel,
            grid=(rp // bs.block_rows,),
            in_specs=specs,
            out_specs=pl.BlockSpec((bs.block_rows, d), lambda r: (r, 0)),
            out_shape=jax.ShapeDtypeStruct((rp, d), out_dtype),
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel",)),
            interpret=interpret,
            cost_estimate=cost,
            name="kv_dequantize",
        )(*arrays)
    return out[:rows].reshape(qt.shape)


def _check_cache(name, qt, q):
    if not isinstance(qt, qref.QuantizedTensor):
        raise ValueError(f"{name} must be a primitives.quantization.QuantizedTensor; got {type(qt).__name__}")
    if len(qt.shape) != 4 or qt.axis != 3 or qt.pack_block != qt.group_size:
        raise ValueError(f"{name} must be [b, s, k, d] quantized along d (axis=3) with pack_block == group_size; "
                         f"got shape={qt.shape}, axis={qt.axis}, pack_block={qt.pack_block}, "
                         f"group_size={qt.group_size}")
    b, h, d = q.shape
    if qt.shape[0] != b or qt.shape[3] != d:
        raise ValueError(f"q {q.shape} and {name} {qt.shape} disagree on batch or head dim")
    if h % qt.shape[2]:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({qt.shape[2]}) in {name}")


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "return_residuals", "implementation",
                                             "interpret"))
def quantized_decode_attention(
    q: jax.Array,
    k: qref.QuantizedTensor,
    v: qref.QuantizedTensor,
    lengths: jax.Array,
    *,
    scale: float | None = None,
    block_sizes: QuantDecodeBlockSizes | None = None,
    return_residuals: bool = False,
    implementation: str | None = None,
    interpret: bool | None = None,
):
    """Decode attention of one query per sequence over a group-quantized KV cache.

    Args:
      q: [b, h, d] queries.
      k, v: QuantizedTensor [b, s, k, d] quantized along d (e.g. `quantize(keys, bits=4, group_size=64)`).
      lengths: [b] int, valid cache entries per sequence.
      scale: logit scale (default 1/sqrt(d)).
      block_sizes: tiling (`QuantDecodeBlockSizes` is the dense `DecodeBlockSizes`); default
        `config.quant_decode_default(...)` (the dense default, with more splits on TPU so that each
        program's cache blocks fit in scoped VMEM).
      return_residuals: also return lse [b, h] float32.
      implementation: None | "xla" (dequantize, then the reference) | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).

    Returns:
      out [b, h, d] in q's dtype (and lse [b, h]).
    """
    if q.ndim != 3:
        raise ValueError(f"q must be [b, h, d]; got shape {q.shape}")
    _check_cache("k", k, q)
    _check_cache("v", v, q)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape}, v {v.shape}")
    b, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    if lengths.shape != (b,):
        raise ValueError(f"lengths must have shape [b]=({b},); got {lengths.shape}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    impl = _backend.resolve_implementation(implementation)
    lengths = lengths.astype(jnp.int32)

    if impl == "xla":
        out, lse = attn_ref.decode_attention(q, qref.dequantize(k, jnp.float32), qref.dequantize(v, jnp.float32),
                                             lengths, scale=scale, return_lse=True)
        out = out.astype(q.dtype)
        return (out, lse) if return_residuals else out

    for name, qt in (("k", k), ("v", v)):
        _check_kernel_format(bits=qt.bits, group_size=qt.group_size, last=d, implementation=impl, what=name)
        if impl == "pallas_triton" and qt.group_size // (8 // qt.bits) < 16:
            raise ValueError(f"Triton's dot needs >= 16 channels per sub-slice: {name} group_size / (8 / bits) = "
                             f"{qt.group_size // (8 // qt.bits)} < 16")
    lengths = jnp.clip(lengths, 0, s)  # entries past the capacity do not exist (the reference ignores them too)
    cache = [a for qt in (k, v) for a in (qt.codes, qt.scale) + ((qt.zero,) if qt.scheme == "asymmetric" else ())]
    cost = quant_decode_cost(batch=b, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d, k_bits=k.bits,
                             v_bits=v.bits, k_group=k.group_size, v_group=v.group_size,
                             k_scale_itemsize=k.scale.dtype.itemsize,
                             v_scale_itemsize=v.scale.dtype.itemsize, k_asymmetric=k.scheme == "asymmetric",
                             v_asymmetric=v.scheme == "asymmetric", q_itemsize=q.dtype.itemsize)
    block_sizes = block_sizes or quant_decode_default(seq_len=s, batch=b, cache=cache, implementation=impl)
    # TPU: tokens on lanes. The narrow last dims (d/n codes, d/G scales) would pad to 128 lanes in a
    # row-major tile; TPU already stores such arrays with the token axis minor, so this transpose is a
    # bitcast there, not a copy (a copy per array made ~2.5 GiB of temporaries for a 32k-token cache).
    transposed = impl == "pallas_tpu"
    if transposed:  # [b, s, k, x] -> [b, k, x, s]; [b, k, s] for x = 1 (XLA may store that unit dim anywhere)
        cache = [jnp.transpose(a[..., 0], (0, 2, 1)) if a.shape[3] == 1 else jnp.transpose(a, (0, 2, 3, 1))
                 for a in cache]
    loader = quant_tile_loader(k_meta=(k.bits, k.group_size, k.scheme), v_meta=(v.bits, v.group_size, v.scheme),
                               transposed=transposed)
    return split_k_decode(q, lengths, cache, tile_loader=loader, kv_layout="bkxs" if transposed else "bskd",
                          block_sizes=block_sizes, implementation=impl, scale=scale, interpret=interpret,
                          cost=cost, name="quantized_decode_attention", return_residuals=return_residuals)
