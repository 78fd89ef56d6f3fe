"""kv_quant kernels: quantize codes bit-exact, dequantize, quantized decode vs reference, cross-lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.kv_quant import (QuantDecodeBlockSizes, QuantizeBlockSizes, dequantize, dequantize_cost,
                                     quant_decode_cost, quantize, quantize_cost, quantized_bytes,
                                     quantized_decode_attention)
from primitives import attention as attn
from primitives import quantization as qz


# Inputs from numpy (free) and references under one jit each: eager op-by-op compiles dominate otherwise.
_ref_quantize = jax.jit(qz.quantize, static_argnames=("bits", "group_size", "axis", "scheme", "scale_dtype",
                                                      "pack_block"))
_ref_dequantize = jax.jit(qz.dequantize, static_argnames=("dtype",))


def _x(shape, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    mag = rng.uniform(0.1, 4.0, shape[:-1] + (1,))
    return jnp.asarray(rng.standard_normal(shape) * mag, dtype)


def _leaves_equal(got, want):
    assert (got.bits, got.group_size, got.axis, got.scheme, got.pack_block, got.shape, got.dtype) == (
        want.bits, want.group_size, want.axis, want.scheme, want.pack_block, want.shape, want.dtype)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32) if a.dtype != jnp.uint8 else a),
                                      np.asarray(b.astype(jnp.float32) if b.dtype != jnp.uint8 else b))


# (shell, x shape, dtype, bits, group, scheme, scale dtype, block_rows): row counts are not block multiples.
QUANT_CASES = [
    ("pallas_triton", (5, 7, 64), jnp.float32, 2, 32, "symmetric", jnp.float32, 16),
    ("pallas_tpu", (3, 50, 128), jnp.bfloat16, 4, 64, "asymmetric", jnp.bfloat16, 32),
    ("pallas_triton", (37, 32), jnp.float32, 8, 16, "midrise", jnp.float16, 16),
    ("pallas_tpu", (9, 64), jnp.float32, 4, 32, "symmetric", jnp.float32, 32),
    # A token axis (a multiple of 128): the TPU kernel's tokens-on-lanes form. Narrow codes and values ...
    ("pallas_tpu", (2, 256, 3, 64), jnp.bfloat16, 4, 32, "asymmetric", jnp.bfloat16, 128),
    # ... and lane-dense ones (8-bit codes of d=128: row-major), the token axis first, not a block multiple.
    ("pallas_tpu", (384, 2, 128), jnp.float32, 8, 32, "symmetric", jnp.float32, 256),
    # One row per token (a head-major [b, k, s, d] cache): the row-major arrays drop the unit axis.
    ("pallas_tpu", (2, 2, 128, 128), jnp.float32, 4, 64, "asymmetric", jnp.bfloat16, 128),
]


@pytest.mark.parametrize("impl, shape, dtype, bits, group, scheme, sdt, rows", QUANT_CASES)
def test_quantize_kernel_is_bit_exact(impl, shape, dtype, bits, group, scheme, sdt, rows):
    x = _x(shape, dtype, seed=bits)
    x = x.at[..., 0, :group].set(0)  # an all-zero group: tiny scale, no NaN
    want = _ref_quantize(x, bits=bits, group_size=group, scheme=scheme, scale_dtype=sdt)
    got = quantize(x, bits=bits, group_size=group, scheme=scheme, scale_dtype=sdt, implementation=impl,
                   interpret=True, block_sizes=QuantizeBlockSizes(block_rows=rows))
    _leaves_equal(got, want)


# (shell, shape, bits, group, scheme, out dtype, block_rows)
DEQUANT_CASES = [
    ("pallas_triton", (3, 11, 64), 2, 64, "asymmetric", jnp.bfloat16, 16),
    ("pallas_tpu", (45, 128), 4, 32, "symmetric", jnp.float32, 32),
    ("pallas_triton", (19, 32), 8, 32, "midrise", jnp.float32, 32),
    ("pallas_tpu", (2, 256, 3, 64), 8, 64, "asymmetric", jnp.bfloat16, 128),  # tokens on lanes
    ("pallas_tpu", (1, 384, 2, 256), 2, 128, "midrise", jnp.float32, 256),  # lane-dense values, padded tokens
    ("pallas_tpu", (3, 256, 128), 8, 64, "symmetric", jnp.float32, 128),  # one row per token, lane-dense codes
]


@pytest.mark.parametrize("impl, shape, bits, group, scheme, out_dtype, rows", DEQUANT_CASES)
def test_dequantize_kernel_matches_reference(impl, shape, bits, group, scheme, out_dtype, rows):
    qt = _ref_quantize(_x(shape, seed=3), bits=bits, group_size=group, scheme=scheme)
    want = _ref_dequantize(qt, jnp.float32)
    got = dequantize(qt, dtype=out_dtype, implementation=impl, interpret=True,
                     block_sizes=QuantizeBlockSizes(block_rows=rows))
    assert got.dtype == out_dtype and got.shape == shape
    # u * s + z may be contracted to an FMA by XLA on one side only: relative 1e-6, not bit-exact.
    tol = 1e-6 if out_dtype == jnp.float32 else 8e-3
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol, atol=tol * float(jnp.abs(want).max()))


def _cache(b, h, s, kh, d, k_fmt, v_fmt, *, dtype=jnp.float32, scale_dtype=jnp.float32, seed=0):
    """(q [b, h, d], quantized keys, quantized values [b, s, kh, d])."""
    rng = np.random.default_rng(seed)
    q, keys, values = (jnp.asarray(rng.standard_normal(shape), dtype)
                       for shape in ((b, h, d), (b, s, kh, d), (b, s, kh, d)))
    kt = _ref_quantize(keys, bits=k_fmt[0], group_size=k_fmt[1], scheme=k_fmt[2], scale_dtype=scale_dtype)
    vt = _ref_quantize(values, bits=v_fmt[0], group_size=v_fmt[1], scheme=v_fmt[2], scale_dtype=scale_dtype)
    return q, kt, vt


@jax.jit
def _reference(q, kt, vt, lengths):
    """Dequantize, then the attention reference, all in float32."""
    f32 = lambda t: qz.dequantize(t, jnp.float32)
    return attn.decode_attention(q.astype(jnp.float32), f32(kt), f32(vt), lengths, return_lse=True)


# (shell, h, kh, d, s, lengths, K format, V format, block sizes, dtype of q / cache / scales); GQA ratios 4,
# 1, 6; capacities and lengths that are not block multiples; length-0 rows; splits 3, 2, 1 (each matching the
# reference is the split-count invariance).
DECODE_CASES = [
    ("pallas_triton", 4, 1, 64, 100, [100, 37, 0], (4, 64, "symmetric"), (2, 64, "asymmetric"),
     QuantDecodeBlockSizes(block_k=16, num_splits=3), jnp.float32),
    ("pallas_tpu", 2, 2, 32, 300, [1, 300, 0], (8, 32, "midrise"), (4, 32, "asymmetric"),
     QuantDecodeBlockSizes(block_k=128, num_splits=2), jnp.bfloat16),  # tokens on lanes: block_k of 128
    ("pallas_tpu", 8, 2, 64, 200, [200, 129, 0], (4, 64, "symmetric"), (2, 64, "asymmetric"),
     QuantDecodeBlockSizes(block_k=128, num_splits=1), jnp.float32),  # two scale rows per head, f32 scales
    ("pallas_tpu", 2, 2, 4, 130, [130, 5, 0], (2, 4, "asymmetric"), (8, 4, "symmetric"),
     QuantDecodeBlockSizes(block_k=128, num_splits=2), jnp.float32),  # one code byte per head: [b, k, s] codes
    ("pallas_triton", 6, 1, 64, 50, [0, 33, 5], (8, 64, "asymmetric"), (4, 64, "midrise"),
     QuantDecodeBlockSizes(block_k=32, num_splits=1), jnp.float32),
]


@pytest.mark.parametrize("impl, h, kh, d, s, lengths, k_fmt, v_fmt, bs, dtype", DECODE_CASES)
def test_quantized_decode_matches_dequantize_then_reference(impl, h, kh, d, s, lengths, k_fmt, v_fmt, bs, dtype):
    q, kt, vt = _cache(len(lengths), h, s, kh, d, k_fmt, v_fmt, dtype=dtype, scale_dtype=dtype, seed=h)
    lengths = jnp.array(lengths)
    want, want_lse = _reference(q, kt, vt, lengths)
    got, lse = quantized_decode_attention(q, kt, vt, lengths, implementation=impl, interpret=True, block_sizes=bs,
                                          return_residuals=True)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-2  # bf16: output rounding only, accumulation is float32
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse, want_lse, atol=1e-5, rtol=1e-5)  # -inf rows compare equal
    assert np.all(np.isfinite(np.asarray(got, np.float32)))
    empty = np.asarray(lengths) == 0
    np.testing.assert_array_equal(np.asarray(got, np.float32)[empty], 0.0)
    assert np.all(np.isneginf(np.asarray(lse)[empty]))


def test_xla_path_is_the_default_and_equals_the_reference():
    assert _backend.resolve_implementation(None) == "xla"
    q, kt, vt = _cache(2, 2, 24, 1, 32, (4, 16, "symmetric"), (4, 16, "symmetric"), seed=10)
    lengths = jnp.array([24, 0])
    want, want_lse = _reference(q, kt, vt, lengths)
    got, lse = quantized_decode_attention(q, kt, vt, lengths, return_residuals=True)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, atol=1e-6)
    x = _x((4, 32))
    _leaves_equal(quantize(x, bits=4, group_size=16), _ref_quantize(x, bits=4, group_size=16))
    np.testing.assert_array_equal(dequantize(kt), _ref_dequantize(kt))


def test_empty_inputs_give_no_nan():
    empty = quantize(jnp.zeros((0, 32)), bits=4, group_size=16, implementation="pallas_triton", interpret=True)
    assert empty.codes.shape == (0, 16) and empty.scale.shape == (0, 2)
    assert dequantize(empty, implementation="pallas_triton", interpret=True).shape == (0, 32)
    # A cache with no slots at all (s = 0) gives zeros and lse -inf.
    _, kt, vt = _cache(2, 2, 0, 1, 32, (8, 32, "symmetric"), (8, 32, "symmetric"))
    out, lse = quantized_decode_attention(jnp.ones((2, 2, 32)), kt, vt, jnp.array([0, 3]), implementation="pallas_tpu",
                                          interpret=True, return_residuals=True,
                                          block_sizes=QuantDecodeBlockSizes(block_k=128, num_splits=1))
    np.testing.assert_array_equal(out, 0.0)
    assert np.all(np.isneginf(np.asarray(lse)))


def test_bad_inputs_and_configs():
    x = _x((4, 64))
    keys = _x((2, 8, 1, 64))
    kt = _ref_quantize(keys, bits=4, group_size=32)
    q, lengths = jnp.ones((2, 2, 64)), jnp.array([8, 3])
    with pytest.raises(ValueError, match="bits must be one of"):
        quantize(x, bits=3, group_size=32)
    with pytest.raises(ValueError, match="group_size must divide"):
        quantize(x, bits=4, group_size=48)
    with pytest.raises(ValueError, match="scheme must be one of"):
        quantize(x, bits=4, group_size=32, scheme="nf4")
    with pytest.raises(ValueError, match="x must be a floating-point array"):
        quantize(jnp.ones((4, 64), jnp.int32), bits=4, group_size=32)
    with pytest.raises(ValueError, match="block_rows a power of two"):
        quantize(x, bits=4, group_size=32, implementation="pallas_triton", interpret=True,
                 block_sizes=QuantizeBlockSizes(block_rows=48))
    with pytest.raises(ValueError, match="block_rows a multiple of 32"):
        quantize(x, bits=4, group_size=32, implementation="pallas_tpu", interpret=True,
                 block_sizes=QuantizeBlockSizes(block_rows=16))
    with pytest.raises(ValueError, match="multiple of 128 on TPU for a 128-token axis"):
        quantize(_x((128, 64)), bits=4, group_size=32, implementation="pallas_tpu", interpret=True,
                 block_sizes=QuantizeBlockSizes(block_rows=32))
    with pytest.raises(ValueError, match="k must be a primitives.quantization.QuantizedTensor"):
        quantized_decode_attention(q, jnp.ones((2, 8, 1, 64)), kt, lengths)
    with pytest.raises(ValueError, match="quantized along d"):
        quantized_decode_attention(q, _ref_quantize(keys, bits=4, group_size=4, axis=1), kt, lengths)
    with pytest.raises(ValueError, match="lengths must have shape"):
        quantized_decode_attention(q, kt, kt, jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match="multiple of KV heads"):
        two_heads = _ref_quantize(_x((2, 8, 2, 64)), bits=4, group_size=32)
        quantized_decode_attention(jnp.ones((2, 3, 64)), two_heads, two_heads, lengths)
    small = _ref_quantize(keys, bits=2, group_size=32)  # 32 / 4 = 8 channels per sub-slice
    with pytest.raises(ValueError, match="Triton's dot needs >= 16"):
        quantized_decode_attention(q, kt, small, lengths, implementation="pallas_triton", interpret=True)
    with pytest.raises(ValueError, match="block_k a power of two"):
        quantized_decode_attention(q, kt, kt, lengths, implementation="pallas_triton", interpret=True,
                                   block_sizes=QuantDecodeBlockSizes(block_k=24, num_splits=1))
    with pytest.raises(ValueError, match="TPU needs block_k a multiple of 128 when the cache's tokens lie on lanes"):
        quantized_decode_attention(q, kt, kt, lengths, implementation="pallas_tpu", interpret=True,
                                   block_sizes=QuantDecodeBlockSizes(block_k=64, num_splits=1))
    with pytest.raises(ValueError, match="pack_block == group_size"):
        dequantize(_ref_quantize(x, bits=4, group_size=32, pack_block=64), implementation="pallas_tpu", interpret=True)
    with pytest.raises(ValueError, match="implementation must be one of"):
        quantize(x, bits=4, group_size=32, implementation="cuda")


def test_cost_model_counts():
    # [1, 4096, 8, 128] keys and values at 4 bits, groups of 64 with float32 scales, 32 query heads.
    elems = 4096 * 8 * 128
    assert quantized_bytes(elements=elems, bits=4, group_size=64, scale_itemsize=4, asymmetric=False) == (
        elems / 2 + elems / 64 * 4)
    kt = jax.eval_shape(lambda a: qz.quantize(a, bits=4, group_size=64, scheme="asymmetric", scale_dtype=jnp.bfloat16),
                        jax.ShapeDtypeStruct((1, 64, 8, 128), jnp.float32))
    assert quantized_bytes(elements=64 * 8 * 128, bits=4, group_size=64, scale_itemsize=2, asymmetric=True) == kt.nbytes
    c = quant_decode_cost(batch=1, kv_len=4096, num_heads=32, num_kv_heads=8, head_dim=128, k_bits=4, v_bits=4,
                          k_group=64, v_group=64, q_itemsize=2)
    assert c.flops == 4 * 32 * 4096 * 128 + 8 * elems
    assert c.bytes_accessed == 2 * (elems / 2 + elems / 64 * 4) + 2 * 32 * 128 * 2
    assert c.projected_seconds(peak_flops=1e15, bandwidth=4.3e12) == pytest.approx(c.bytes_accessed / 4.3e12)
    qc = quantize_cost(elements=elems, bits=8, group_size=128, in_itemsize=2)
    assert qc.bytes_accessed == elems * 2 + elems + elems / 128 * 4
    dc = dequantize_cost(elements=elems, bits=2, group_size=32, out_itemsize=4, scale_itemsize=2, asymmetric=True)
    assert dc.bytes_accessed == elems * 4 + elems / 4 + elems / 32 * 4


def test_tpu_default_splits_keep_the_cache_blocks_within_scoped_vmem():
    """The production case of `pallas_kernels.aot` (batch 8, 32k tokens, 8 KV heads of 128; keys 4-bit
    symmetric, values 2-bit asymmetric with bfloat16 scales). The TPU kernel reads the cache with tokens
    on lanes ([kh, x, split] blocks; [kh, split] for x = 1), so only x (or kh) pads, to a sublane tile:
    8 heads x (64 code bytes + 2 f32 scales padded to 8 rows + 32 code bytes) + 2 x (8 heads of one bf16
    scale or zero point, padded to 16 rows) = 1088 bytes per key (the
    token-major blocks it replaced took 20 KiB, which Mosaic confirmed: 40.00M for 2048 keys). The dense
    default's 16 splits then fit the budget as they are, with block_k 128 (a lane tile). Other backends
    keep the dense default."""
    from pallas_kernels.decode_attention import DecodeBlockSizes
    from pallas_kernels.kv_quant import config

    x = jax.ShapeDtypeStruct((8, 32768, 8, 128), jnp.bfloat16)
    kt = jax.eval_shape(lambda a: qz.quantize(a, bits=4, group_size=64), x)
    vt = jax.eval_shape(lambda a: qz.quantize(a, bits=2, group_size=128, scheme="asymmetric",
                                              scale_dtype=jnp.bfloat16), x)
    cache = [kt.codes, kt.scale, vt.codes, vt.scale, vt.zero]
    assert config.tpu_block_bytes_per_key(cache) == 8 * (64 + 8 * 4 + 32) + 2 * 16 * 2 == 1088
    dense = DecodeBlockSizes.default(seq_len=32768, batch=8, implementation="pallas_tpu")
    assert dense.num_splits == 16
    bs = config.quant_decode_default(seq_len=32768, batch=8, cache=cache, implementation="pallas_tpu")
    assert bs.block_k == 128 and bs.num_splits == 16
    assert 32768 // bs.num_splits * config.tpu_block_bytes_per_key(cache) <= _backend.TPU_BLOCK_VMEM_BUDGET
    # A cache too long for 16 splits gets more: 512k tokens at 1088 bytes need 64 splits of 8192 keys (8.5 MiB).
    long = [jax.ShapeDtypeStruct((8, 1 << 19) + a.shape[2:], a.dtype) for a in cache]
    bs_long = config.quant_decode_default(seq_len=1 << 19, batch=8, cache=long, implementation="pallas_tpu")
    assert bs_long.num_splits == 64
    assert config.quant_decode_default(seq_len=32768, batch=8, cache=cache,
                                       implementation="pallas_triton") == DecodeBlockSizes.default(
        seq_len=32768, batch=8, implementation="pallas_triton")


@pytest.mark.skipif(not __import__("pallas_kernels.aot").aot.libtpu_available(), reason="needs libtpu")
def test_tpu_quantized_decode_reads_the_packed_cache_in_place():
    """Compiled for v5e (a device description; libtpu, no TPU): the cache's narrow arrays are not copied
    to a padded row-major layout before the kernel. XLA's TPU layout of a [b, s, kh, x] array with a small
    x puts the tokens minor, which the kernel's [b, kh, x, s] view is a bitcast of; the token-major
    kernel this replaced made 2.5 GiB of HBM temporaries for this 216 MiB cache."""
    from pallas_kernels import aot

    case = next(c for c in aot.CASES if c.id == "kv_quant.quantized_decode_32k")
    r = aot.compile_case(case, "v5e:2x2")
    assert r["ok"], r["error"]
    assert r["temp_bytes"] <= 64 * 2**20, r["temp_bytes"] / 2**20
