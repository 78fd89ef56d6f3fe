"""QVG and its baselines: exact round trips, monotone stages, byte-counted bits, code ranges, edge cases."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.compression import kv_baselines as kvb
from algorithms.compression import qvg
from primitives import quantization as qz

KEY = jax.random.key(0)


def _clustered(seed=0, groups=2, s=256, d=64, protos=8, noise=0.05, outlier_channels=0):
    """KV-like data: each token is one of a few prototypes plus small noise (video redundancy)."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((groups, protos, d))
    lab = rng.integers(0, protos, (groups, s))
    x = np.take_along_axis(p, lab[..., None], axis=1) + noise * rng.standard_normal((groups, s, d))
    if outlier_channels:
        x[..., :outlier_channels] *= 20.0
    return jnp.asarray(x.astype(np.float32))


def _mse(a, b):
    return float(jnp.mean((a.astype(jnp.float32) - b.astype(jnp.float32)) ** 2))


X = _clustered()


def test_centroids_only_reconstruction_never_gets_worse_with_stages():
    # Stage j uses fold_in(key, j), so the n-stage run extends the (n-1)-stage run; each k-means stage
    # leaves a residual no larger than its input (the mean minimizes the squared distance).
    errs = []
    for n in (1, 2, 3, 4):
        cfg = qvg.QVGConfig(num_centroids=4, num_stages=n, residual_bits=None, centroid_dtype="float32")
        errs.append(_mse(qvg.dequantize(qvg.qvg_quantize(X, KEY, config=cfg)), X))
    assert all(b <= a * (1 + 1e-6) for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < errs[0]


def test_as_many_centroids_as_tokens_without_residual_is_exact():
    x = X[:, :32]
    cfg = qvg.QVGConfig(num_centroids=64, residual_bits=None, centroid_dtype="float32")
    t = qvg.qvg_quantize(x, KEY, config=cfg)
    assert t.centroids.shape == (1, 2, 32, 64)  # capped at s = 32
    np.testing.assert_array_equal(qvg.dequantize(t), x)


def test_adding_back_the_stored_centroids_is_exact_for_a_bfloat16_cache():
    # A bf16 cache minus bf16 centroids is exact in float32 (both have 8-bit significands and the
    # exponents here are close), so the smoothing step loses nothing before residual quantization.
    x = X.astype(jnp.bfloat16)
    cfg = qvg.QVGConfig(num_centroids=8, residual_bits=None)
    t = qvg.qvg_quantize(x, KEY, config=cfg)
    c = jnp.take_along_axis(t.centroids[0].astype(jnp.float32), t.labels[0][..., None].astype(jnp.int32), axis=-2)
    r = x.astype(jnp.float32) - c
    np.testing.assert_array_equal(r + c, x.astype(jnp.float32))


@pytest.mark.parametrize("bits,scheme,lo,hi", [(2, "symmetric", 0, 2), (4, "symmetric", 0, 14),
                                               (2, "asymmetric", 0, 3), (4, "asymmetric", 0, 15)])
def test_residual_codes_are_in_range(bits, scheme, lo, hi):
    cfg = qvg.QVGConfig(num_centroids=8, residual_bits=bits, scheme=scheme, group_size=16)
    t = qvg.qvg_quantize(X, KEY, config=cfg)
    codes = np.asarray(qz.unpack_codes(t.residual.codes, bits, block=t.residual.pack_block))
    assert codes.min() >= lo and codes.max() <= hi
    if bits == 2 and scheme == "symmetric":
        assert set(np.unique(codes)) <= {0, 1, 2}  # ternary {-1, 0, 1}


@pytest.mark.parametrize("cfg,s,d", [
    (qvg.QVG, 256, 64), (qvg.QVG_PRO, 256, 64),
    (qvg.QVGConfig(num_centroids=300, scheme="asymmetric", residual_bits=4, group_size=32), 512, 64),
    (qvg.QVGConfig(num_centroids=64, residual_bits=None, centroid_dtype="float32"), 32, 16),
])
def test_bits_per_element_formula_equals_the_counted_bytes(cfg, s, d):
    x = _clustered(1, groups=3, s=s, d=d)
    t = qvg.qvg_quantize(x, KEY, config=cfg)
    leaves = jax.tree.leaves(t)
    counted = 8 * sum(a.size * a.dtype.itemsize for a in leaves) / x.size
    assert t.bits_per_element == pytest.approx(counted)
    assert qvg.bits_per_element(cfg, s, d) == pytest.approx(counted)


def test_paper_accounting_example():
    # LongCat-scale span (spec): s = 29 640, d = 128, k = 256, G = 64, one stage -> about 2.33 bits, 6.9x.
    bpe = qvg.bits_per_element(qvg.QVG, 29640, 128)
    assert bpe == pytest.approx(2 + 0.125 + 0.0625 + 256 * 16 / 29640)
    assert 16 / bpe == pytest.approx(6.87, abs=0.02)


def test_all_zero_input_gives_zeros_without_nan():
    z = jnp.zeros((2, 64, 64))
    for cfg in (qvg.QVG, qvg.QVG_PRO, dataclasses.replace(qvg.QVG, scheme="asymmetric")):
        out = qvg.dequantize(qvg.qvg_quantize(z, KEY, config=cfg))
        assert not np.any(np.isnan(np.asarray(out)))
        np.testing.assert_array_equal(out, z)


def test_smoothing_beats_round_to_nearest_on_redundant_data_at_the_same_block_size():
    t = qvg.qvg_quantize(X, KEY, config=qvg.QVGConfig(num_centroids=16, group_size=64))
    rtn = kvb.quantize_kv(X, "rtn", kind="key", bits=2, group_size=64)
    assert _mse(qvg.dequantize(t), X) < 0.2 * _mse(kvb.dequantize(rtn), X)


def test_more_stages_and_centroids_lower_the_error_and_raise_the_bits_on_clustered_data():
    x = _clustered(2, protos=32, noise=0.2)
    errs, bpes = [], []
    for k, n in ((4, 1), (16, 1), (16, 2), (16, 4)):
        t = qvg.qvg_quantize(x, KEY, config=qvg.QVGConfig(num_centroids=k, num_stages=n, group_size=16))
        errs.append(_mse(qvg.dequantize(t), x))
        bpes.append(t.bits_per_element)
    assert errs == sorted(errs, reverse=True), errs
    assert bpes == sorted(bpes), bpes


def test_bits_fall_with_longer_spans():
    b = [qvg.bits_per_element(qvg.QVG, s, 128) for s in (1024, 4096, 16384)]
    assert b[0] > b[1] > b[2]


def test_deterministic_and_jittable():
    a = qvg.qvg_quantize(X, KEY)
    b = qvg.qvg_quantize(X, KEY)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(u, v)
    out = jax.jit(qvg.dequantize)(a)
    np.testing.assert_array_equal(out, qvg.dequantize(a))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_stages"):
        qvg.QVGConfig(num_stages=0)
    with pytest.raises(ValueError, match="residual_bits"):
        qvg.QVGConfig(residual_bits=3)
    with pytest.raises(ValueError, match="group_size"):
        qvg.qvg_quantize(jnp.zeros((8, 48)), KEY, config=qvg.QVGConfig(group_size=32))
    with pytest.raises(ValueError, match="method"):
        kvb.quantize_kv(X, "gptq", kind="key", bits=2, group_size=64)
    with pytest.raises(ValueError, match="power of two"):
        kvb.hadamard(24)


# ------------------------------------------------------------------ baselines


def test_hadamard_is_orthonormal_and_symmetric():
    h = kvb.hadamard(64)
    np.testing.assert_allclose(h @ h.T, np.eye(64), atol=1e-6)
    np.testing.assert_array_equal(h, h.T)


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_hadamard_equals_the_sylvester_recursion(d):
    # scipy.linalg.hadamard replaced a hand-built Sylvester recursion; the matrix is the same.
    h = np.ones((1, 1), np.float64)
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    np.testing.assert_array_equal(kvb.hadamard(d), (h / np.sqrt(d)).astype(np.float32))


@pytest.mark.parametrize("method", kvb.METHODS)
def test_eight_bit_baselines_are_nearly_lossless_and_report_their_bits(method):
    t = kvb.quantize_kv(X, method, kind="key", bits=8, group_size=32, scale_dtype="float32",
                        key=jax.random.key(1))
    out = kvb.dequantize(t)
    assert out.shape == X.shape
    assert _mse(out, X) < 1e-3 * float(jnp.mean(X**2))
    zero = 2 if method in ("rtn_asym", "kivi", "quarot_asym") else 1
    assert t.bits_per_element == pytest.approx(8 + zero * 32 / 32)


def test_kivi_quantizes_keys_per_channel_and_values_per_token():
    k = kvb.quantize_kv(X, "kivi", kind="key", bits=2, group_size=32)
    v = kvb.quantize_kv(X, "kivi", kind="value", bits=2, group_size=32)
    assert k.scale.shape == (2, 256 // 32, 64) and v.scale.shape == (2, 256, 64 // 32)


def test_rotation_spreads_outlier_channels():
    x = _clustered(3, outlier_channels=2)
    rtn = _mse(kvb.dequantize(kvb.quantize_kv(x, "rtn", kind="key", bits=4, group_size=64)), x)
    rot = _mse(kvb.dequantize(kvb.quantize_kv(x, "quarot", kind="key", bits=4, group_size=64)), x)
    assert rot < rtn


# ------------------------------------------------------------------ chunked cache policy


def _chunks(n, t=16, d=64, seed=5):
    rng = np.random.default_rng(seed)
    return [(jnp.asarray(rng.standard_normal((1, 2, t, d)).astype(np.float32)),
             jnp.asarray(rng.standard_normal((1, 2, t, d)).astype(np.float32))) for _ in range(n)]


SMALL_CFG = qvg.QVGConfig(num_centroids=8, kmeans_iters=2)
SMALL = qvg.qvg_quantizer(SMALL_CFG)


def test_spans_are_quantized_exactly_at_multiples_of_the_quant_factor():
    cache = qvg.ChunkedKVCache(SMALL, qvg.ChunkPolicy(quant_factor=3), key=KEY)
    layouts = []
    for k, v in _chunks(7):
        cache.append(k, v)
        layouts.append("".join(c[0] if c == "F" else c[1] for c in cache.layout()))
    assert layouts == ["F", "FF", "000", "000F", "000FF", "000111", "000111F"]


def test_reads_are_the_full_chunks_and_the_reference_dequantization_of_each_span():
    chunks = _chunks(5)
    cache = qvg.ChunkedKVCache(SMALL, qvg.ChunkPolicy(quant_factor=2), key=KEY)
    for k, v in chunks:
        cache.append(k, v)
    rk, rv = cache.read()
    for j in range(2):
        span_key = jax.random.fold_in(KEY, j)
        ks = jnp.concatenate([chunks[2 * j][0], chunks[2 * j + 1][0]], axis=-2)
        vs = jnp.concatenate([chunks[2 * j][1], chunks[2 * j + 1][1]], axis=-2)
        ref_k = qvg.dequantize(qvg.qvg_quantize(ks, jax.random.fold_in(span_key, 0), config=SMALL_CFG))
        ref_v = qvg.dequantize(qvg.qvg_quantize(vs, jax.random.fold_in(span_key, 1), config=SMALL_CFG))
        np.testing.assert_array_equal(rk[..., 32 * j:32 * (j + 1), :], ref_k)
        np.testing.assert_array_equal(rv[..., 32 * j:32 * (j + 1), :], ref_v)
    np.testing.assert_array_equal(rk[..., 64:, :], chunks[4][0])  # the newest chunk is untouched


def test_sink_and_recent_chunks_stay_in_full_precision():
    cache = qvg.ChunkedKVCache(SMALL, qvg.ChunkPolicy(quant_factor=2, sink_chunks=1, keep_recent_chunks=2), key=KEY)
    for k, v in _chunks(7):
        cache.append(k, v)
    assert cache.layout() == ["F", "Q0", "Q0", "Q1", "Q1", "F", "F"]
    rk, _ = cache.read()
    np.testing.assert_array_equal(rk[..., :16, :], _chunks(7)[0][0])


def test_a_span_is_released_only_when_all_its_chunks_leave_the_window():
    cache = qvg.ChunkedKVCache(SMALL, qvg.ChunkPolicy(quant_factor=2, window_chunks=3), key=KEY)
    chunks = _chunks(6)
    for k, v in chunks[:4]:
        cache.append(k, v)
    assert cache.layout() == ["Q0", "Q1", "Q1"] and set(cache._spans) == {0, 1}  # span 0 half in the window
    cache.append(*chunks[4])
    assert cache.layout() == ["Q1", "Q1", "F"] and set(cache._spans) == {1}
    assert cache.read()[0].shape == (1, 2, 48, 64)


def test_cache_bytes_and_the_baselines_under_the_same_policy():
    chunks = _chunks(4)
    full_bytes = 2 * chunks[0][0].nbytes
    for quantizer in (SMALL, qvg.baseline_quantizer("kivi", bits=2, group_size=32),
                      qvg.baseline_quantizer("quarot", bits=2, group_size=64)):
        cache = qvg.ChunkedKVCache(quantizer, qvg.ChunkPolicy(quant_factor=2, keep_recent_chunks=1), key=KEY)
        for k, v in chunks:
            cache.append(k, v)
        assert cache.layout() == ["Q0", "Q0", "F", "F"]
        sk, sv, _ = cache._spans[0]
        assert cache.nbytes == 2 * full_bytes + sk.nbytes + sv.nbytes
        rk, rv = cache.read()
        assert rk.shape == rv.shape == (1, 2, 64, 64)
        np.testing.assert_array_equal(rv[..., 32:48, :], chunks[2][1])
