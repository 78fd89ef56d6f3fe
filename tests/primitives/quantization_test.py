"""Group-wise quantization reference: rounding rules vs a numpy re-implementation, packing, bounds, sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import quantization as qz

RNG = np.random.default_rng(0)
# Random values with per-row magnitudes and an all-zero half row (exact ties: test_round_half_to_even...).
X = (RNG.standard_normal((6, 64)) * RNG.uniform(0.1, 5.0, (6, 1))).astype(np.float32)
X[5, 32:] = 0.0


def _numpy_codes(x, bits, group_size, scheme):
    """Independent re-implementation of the rounding rules in numpy float32 (IEEE division, np.round = half-even)."""
    f32 = np.float32
    xg = x.astype(f32).reshape(*x.shape[:-1], -1, group_size)
    top = f32(2**bits - 1)
    tiny = np.finfo(np.float32).tiny
    if scheme == "symmetric":
        q = f32(2 ** (bits - 1) - 1)
        s = np.maximum(np.abs(xg).max(-1, keepdims=True) * (f32(1) / q), tiny).astype(f32)
        u = np.clip(np.round(xg * (f32(1) / s)), -q, q) + q
        z = None
    elif scheme == "midrise":
        o = f32(top / 2)
        s = np.maximum(np.abs(xg).max(-1, keepdims=True) * (f32(1) / o), tiny).astype(f32)
        u = np.clip(np.round((xg * (f32(1) / s)).astype(np.float64) + o), 0, top)  # the add exact
        z = None
    else:
        lo = xg.min(-1, keepdims=True)
        s = np.maximum((xg.max(-1, keepdims=True) - lo) * (f32(1) / top), tiny).astype(f32)
        u = np.clip(np.round((xg - lo) * (f32(1) / s)), 0, top)
        z = lo
    return u.astype(np.uint8).reshape(x.shape), s[..., 0], None if z is None else z[..., 0]


@pytest.mark.parametrize("bits", qz.BITS)
@pytest.mark.parametrize("scheme", qz.SCHEMES)
def test_codes_match_numpy_rounding_rules_and_error_is_half_a_step(bits, scheme):
    x = X.copy()
    codes, scale, zero = qz.quantize_codes(jnp.asarray(x), bits=bits, group_size=32, scheme=scheme)
    want_codes, want_scale, want_zero = _numpy_codes(x, bits, 32, scheme)
    np.testing.assert_array_equal(np.asarray(scale), want_scale)
    np.testing.assert_array_equal(np.asarray(codes), want_codes)
    if zero is not None:
        np.testing.assert_array_equal(np.asarray(zero), want_zero)
    top = 2**bits - 1
    hi = 2 * (2 ** (bits - 1) - 1) if scheme == "symmetric" else top  # symmetric never uses code L
    assert int(codes.max()) <= hi and int(codes.min()) >= 0
    # Error bound |x - xhat| <= s / 2 (float64 check), no NaN, and the all-zero group comes back exactly zero
    # for the schemes that represent zero.
    qt = qz.quantize(jnp.asarray(x), bits=bits, group_size=32, scheme=scheme)
    xhat = np.asarray(qz.dequantize(qt))
    np.testing.assert_array_equal(np.asarray(qz.unpack_codes(qt.codes, bits, block=32)), want_codes)
    err = np.abs(xhat.astype(np.float64) - x.astype(np.float64)).reshape(6, 2, 32).max(-1)
    assert np.all(err <= np.asarray(qt.scale, np.float64) / 2 * (1 + 1e-5) + 1e-30)
    assert np.all(np.isfinite(xhat))
    if scheme != "midrise":
        np.testing.assert_array_equal(xhat[5, 32:], 0.0)


def test_round_half_to_even_on_exact_ties():
    # Group max 3 at 8-bit symmetric: s = 3/127, x = k s + s/2 is not exactly representable, so build ties
    # directly: s = 1 (max |x| = 127), x = 0.5, 1.5, 2.5, -0.5, -1.5.
    x = jnp.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 0.0, 3.0]])
    codes, scale, _ = qz.quantize_codes(x, bits=8, group_size=8, scheme="symmetric")
    assert float(scale[0, 0]) == 1.0
    np.testing.assert_array_equal(np.asarray(codes[0], np.int32) - 127, [127, 0, 2, 2, 0, -2, 0, 3])
    # Midrise (2 bits, o = 1.5) at s = 1: x + 1.5 is a tie for every integer x; eagerly and under jit alike.
    x = jnp.array([-2.0, -1.0, 0.0, 1.0, 2.0, 0.5, -0.5, 1.3])
    enc = lambda a: qz.encode(a, jnp.float32(1.0), None, bits=2, scheme="midrise")
    for codes in (enc(x), jax.jit(enc)(x)):
        np.testing.assert_array_equal(np.asarray(codes), [0, 0, 2, 2, 3, 2, 1, 3])


@pytest.mark.parametrize("bits", qz.BITS)
def test_pack_layout_and_round_trip(bits):
    n = 8 // bits
    codes = jnp.asarray(RNG.integers(0, 2**bits, (3, 48)), jnp.uint8)
    for block in (48, 4 * n):
        packed = qz.pack_codes(codes, bits, block=block)
        assert packed.shape == (3, 48 // n) and packed.dtype == jnp.uint8
        np.testing.assert_array_equal(qz.unpack_codes(packed, bits, block=block), codes)
        # Byte j of a block holds elements j + i * block / n in bits [bits i, bits (i + 1)).
        c = np.asarray(codes).reshape(3, 48 // block, n, block // n).astype(np.int64)
        want = sum(c[:, :, i] << (bits * i) for i in range(n)).reshape(3, -1)
        np.testing.assert_array_equal(np.asarray(packed), want)


@pytest.mark.parametrize("bits, scheme, scale_dtype, group", [(2, "symmetric", jnp.float32, 32),
                                                              (4, "asymmetric", jnp.bfloat16, 16),
                                                              (8, "midrise", jnp.float16, 64),
                                                              (4, "asymmetric", jnp.float32, 64)])
def test_bits_per_element_is_the_real_byte_count(bits, scheme, scale_dtype, group):
    qt = qz.quantize(jnp.asarray(X), bits=bits, group_size=group, scheme=scheme, scale_dtype=scale_dtype)
    arrays = [qt.codes, qt.scale] + ([qt.zero] if qt.zero is not None else [])
    real = sum(np.asarray(a).nbytes for a in arrays)
    assert qt.nbytes == real
    per_group = jnp.dtype(scale_dtype).itemsize * (2 if scheme == "asymmetric" else 1)
    assert qt.bits_per_element == pytest.approx(bits + 8 * per_group / group)
    assert qt.scale.dtype == jnp.dtype(scale_dtype)


def test_groups_along_a_non_last_axis_and_pytree():
    x = jnp.asarray(X.reshape(6, 8, 8))  # per-channel groups of 4 tokens (axis 1), KIVI-style keys
    qt = qz.quantize(x, bits=4, group_size=4, axis=1, scheme="asymmetric")
    assert qt.scale.shape == (6, 2, 8) and qt.codes.shape == (6, 8, 4) and qt.pack_block == 8
    codes, s, z = _numpy_codes(np.moveaxis(X.reshape(6, 8, 8), 1, -1), 4, 4, "asymmetric")
    np.testing.assert_array_equal(qz.unpack_codes(qt.codes, 4, block=8), np.moveaxis(codes, -1, 1))
    np.testing.assert_array_equal(np.asarray(qt.scale), np.moveaxis(s, -1, 1))
    xhat = jax.jit(qz.dequantize)(qt)  # QuantizedTensor is a pytree with static metadata
    assert xhat.shape == x.shape and xhat.dtype == x.dtype
    err = np.abs(np.asarray(xhat) - X.reshape(6, 8, 8)).reshape(6, 2, 4, 8).max(2)
    assert np.all(err <= np.asarray(qt.scale) / 2 * (1 + 1e-5) + 1e-30)


def test_bfloat16_input_keeps_dtype_and_zero_group_has_no_nan():
    x = jnp.asarray(X, jnp.bfloat16)
    qt = qz.quantize(x, bits=2, group_size=32, scale_dtype=jnp.bfloat16)
    out = qz.dequantize(qt)
    assert out.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
    assert float(qt.scale[5, 1]) > 0  # clamped at bf16's smallest normal, not 0 (0/0 would be NaN)


@pytest.mark.parametrize("kwargs, match", [
    (dict(bits=3, group_size=32), "bits must be one of"),
    (dict(bits=4, group_size=24), "group_size must divide"),
    (dict(bits=4, group_size=32, scheme="nf4"), "scheme must be one of"),
    (dict(bits=4, group_size=32, axis=2), "axis must index"),
    (dict(bits=4, group_size=32, scale_dtype=jnp.int8), "scale_dtype must be one of"),
    (dict(bits=4, group_size=32, pack_block=6), "pack_block must divide"),
])
def test_bad_inputs_raise_value_error_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        qz.quantize(jnp.asarray(X), **kwargs)


def test_bad_input_types():
    with pytest.raises(ValueError, match="x must be a floating-point array"):
        qz.quantize(jnp.ones((2, 8), jnp.int32), bits=4, group_size=8)
    with pytest.raises(ValueError, match="qt must be a QuantizedTensor"):
        qz.dequantize(jnp.ones((2, 8)))
    with pytest.raises(ValueError, match="pack_block must divide"):
        qz.pack_codes(jnp.zeros((2, 6), jnp.uint8), 2)


@pytest.mark.parametrize("bits, scheme", [(4, "symmetric"), (2, "asymmetric"), (8, "midrise")])
def test_jit_and_eager_give_the_same_bits(bits, scheme):
    # XLA rewrites a division by a constant or by a broadcast scale into a reciprocal multiply under jit
    # only; the rules avoid both. bfloat16-valued inputs put some x / s exactly on rounding ties, where
    # x / s and x * fl(1 / s) round apart (about 0.06% of the codes before the rule).
    ties = np.random.default_rng(1).standard_normal((256, 64)).astype(jnp.bfloat16).astype(np.float32)
    x = jnp.asarray(np.concatenate([X, ties], axis=0))
    f = lambda a: qz.quantize(a, bits=bits, group_size=32, scheme=scheme)
    for a, b in zip(jax.tree.leaves(jax.jit(f)(x)), jax.tree.leaves(f(x)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
