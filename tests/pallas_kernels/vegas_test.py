"""Vegas kernels: references vs float64 numpy, interpreter vs references (verify attention with score rows
and lse; sparse decode over listed keys plus a recent range), empty sets, cross-lowering, bad inputs, costs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.vegas import (SparseDecodeBlockSizes, VerifyBlockSizes, sparse_decode_attention,
                                  sparse_decode_cost, sparse_decode_mask, sparse_decode_reference, verify_attention,
                                  verify_cost, verify_reference)

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}
# Jitted references: one compile per shape instead of dozens of eager op dispatches (keeps the file fast).
_verify_ref = jax.jit(verify_reference, static_argnames=("rows", "scale"))
_sparse_ref = jax.jit(sparse_decode_reference, static_argnames=("max_recent", "scale"))


def _normal(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(dtype)


def _qkv(b, t, h, kh, s, d, dtype=jnp.float32, seed=0):
    return (_normal((b, t, h, d), seed, dtype), _normal((b, s, kh, d), seed + 1, dtype),
            _normal((b, s, kh, d), seed + 2, dtype))


def _f32(*xs):
    return tuple(x.astype(jnp.float32) for x in xs)


def _close_with_infs(got, want, atol, rtol=0.0):
    """Same -inf pattern, finite entries within tolerance, no NaN."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------------------
# References against float64 numpy.


def test_verify_reference_matches_float64_numpy():
    b, t, h, kh, s, d = 2, 3, 4, 2, 9, 8
    q, k, v = _qkv(b, t, h, kh, s, d)
    pos = jnp.array([[5, 6, 7], [-1, 2, 8]])
    rows, scale = (0, 2), 0.3
    got = _verify_ref(q, k, v, pos, rows=rows, scale=scale)
    qn, kn, vn, pn = (np.asarray(x, np.float64) for x in (q, k, v, pos))
    kr, vr = np.repeat(kn, h // kh, axis=2), np.repeat(vn, h // kh, axis=2)
    raw = np.einsum("bthd,bshd->bhts", qn, kr)
    vis = np.arange(s)[None, None, None, :] <= pn[:, None, :, None]
    logits = np.where(vis, raw * scale, -np.inf)
    mx = np.max(logits, -1, keepdims=True)
    p = np.where(vis, np.exp(logits - np.where(np.isfinite(mx), mx, 0)), 0)
    den = p.sum(-1, keepdims=True)
    out = np.einsum("bhts,bshd->bthd", p / np.where(den > 0, den, 1), vr)
    lse = np.where(den[..., 0] > 0, np.log(np.where(den[..., 0] > 0, den[..., 0], 1)) + mx[..., 0], -np.inf)
    np.testing.assert_allclose(got.out, out, atol=1e-5)
    _close_with_infs(got.lse, lse, 1e-5)
    _close_with_infs(got.scores, np.where(vis, raw, -np.inf)[:, :, list(rows)], 1e-5)


def test_sparse_reference_matches_float64_numpy():
    b, h, kh, s, d = 2, 4, 2, 12, 8
    q, k, v = _normal((b, h, d), 0), _normal((b, s, kh, d), 1), _normal((b, s, kh, d), 2)
    idx = jnp.array([[0, 3, 9, 5], [1, 2, 4, 11]])
    valid = jnp.array([[True, True, True, False], [True, False, True, True]])
    start, lengths = jnp.array([8, 6]), jnp.array([11, 12])
    got = _sparse_ref(q, k, v, idx, valid, start, lengths, max_recent=2, scale=0.4)
    keep = np.zeros((b, s), bool)
    keep[0, [0, 3, 8, 9]] = True  # 9 >= start is ignored as a listed key but lies in [8, 10)
    keep[1, [1, 4, 6, 7]] = True  # 11 >= start ignored; the range [6, 8) is cut at max_recent
    np.testing.assert_array_equal(sparse_decode_mask(idx, valid, start, lengths, s, 2), keep)
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = np.einsum("bhd,bshd->bhs", qn, np.repeat(kn, 2, axis=2)) * 0.4
    logits = np.where(keep[:, None], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    out = np.einsum("bhs,bshd->bhd", w / w.sum(-1, keepdims=True), np.repeat(vn, 2, axis=2))
    np.testing.assert_allclose(got.out, out, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# verify_attention: interpreter vs reference.

# (shell, b, t, h, kh, S, d, rows, positions, block sizes, dtype): capacities that are not block multiples,
# GQA and MHA, a row that sees nothing (position -1), a sequence whose rows see everything, several splits.
VERIFY_CASES = [
    ("pallas_triton", 2, 3, 4, 2, 70, 16, (0, 2), [[40, 41, 42], [-1, 67, 69]], VerifyBlockSizes(block_k=16, num_splits=3),
     jnp.float32),
    ("pallas_tpu", 1, 4, 2, 2, 150, 32, (3,), [[130, 131, 132, 133]], VerifyBlockSizes(block_k=128, num_splits=2),
     jnp.float32),
    ("pallas_triton", 2, 2, 4, 1, 50, 32, (1, 0), [[20, 21], [48, 49]], None, jnp.bfloat16),
    ("pallas_tpu", 2, 2, 4, 2, 40, 16, (0, 1), [[9, 10], [38, 39]], VerifyBlockSizes(block_k=128, num_splits=1),
     jnp.bfloat16),
]


@pytest.mark.parametrize("impl, b, t, h, kh, s, d, rows, pos, bs, dtype", VERIFY_CASES)
def test_verify_interpret_matches_reference(impl, b, t, h, kh, s, d, rows, pos, bs, dtype):
    q, k, v = _qkv(b, t, h, kh, s, d, dtype, seed=3)
    pos = jnp.array(pos, jnp.int32)
    got = verify_attention(q, k, v, pos, rows=rows, scale=0.2, implementation=impl, interpret=True, block_sizes=bs)
    want = _verify_ref(*_f32(q, k, v), pos, rows=rows, scale=0.2)
    assert got.out.dtype == dtype and got.lse.dtype == got.scores.dtype == jnp.float32
    assert got.out.shape == (b, t, h, d) and got.lse.shape == (b, h, t) and got.scores.shape == (b, h, len(rows), s)
    tol = TOL[dtype]
    _close_with_infs(got.out, want.out, tol)
    _close_with_infs(got.lse, want.lse, tol)
    # Raw scores are float32 dot products of the (bf16-representable) inputs on both sides.
    _close_with_infs(got.scores, want.scores, 1e-4, rtol=1e-5)


@pytest.mark.parametrize("impl", ["pallas_triton", "pallas_tpu"])
def test_verify_interpret_reads_a_head_major_cache_as_stored(impl):
    """kv_layout="bksd": the kernel reads [b, kh, S, d] blocks (no transposed copy); same result as the
    token-major cache, scores included."""
    q, k, v = _qkv(2, 3, 4, 2, 150, 32, jnp.float32, seed=5)
    pos = jnp.array([[100, 101, 102], [147, 148, 149]], jnp.int32)
    kw = dict(rows=(0, 2), scale=0.2, implementation=impl, interpret=True,
              block_sizes=VerifyBlockSizes(block_k=128 if impl == "pallas_tpu" else 16, num_splits=2))
    got = verify_attention(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), pos, kv_layout="bksd", **kw)
    want = _verify_ref(q, k, v, pos, rows=(0, 2), scale=0.2)
    tol = TOL[jnp.float32]
    _close_with_infs(got.out, want.out, tol)
    _close_with_infs(got.lse, want.lse, tol)
    _close_with_infs(got.scores, want.scores, 1e-4, rtol=1e-5)


def test_verify_row_that_sees_nothing_gives_zeros_and_no_nan():
    q, k, v = _qkv(2, 2, 4, 2, 20, 16, seed=5)
    pos = jnp.array([[-1, -1], [-3, 4]])  # sequence 0 sees nothing at all; sequence 1's first row neither
    got = verify_attention(q, k, v, pos, rows=(0, 1), implementation="pallas_triton", interpret=True,
                           block_sizes=VerifyBlockSizes(block_k=16, num_splits=2))
    for x in got:
        assert not np.isnan(np.asarray(x)).any()
    np.testing.assert_array_equal(got.out[0], 0.0)
    np.testing.assert_array_equal(got.out[1, 0], 0.0)
    assert np.all(np.isneginf(np.asarray(got.lse[0]))) and np.all(np.isneginf(np.asarray(got.lse[1, :, 0])))
    assert np.all(np.isneginf(np.asarray(got.scores[0]))) and np.all(np.isneginf(np.asarray(got.scores[1, :, 0])))
    want = _verify_ref(q, k, v, pos, rows=(0, 1), scale=0.25)
    _close_with_infs(got.out, want.out, 1e-5)
    _close_with_infs(got.scores, want.scores, 1e-5)


def test_verify_xla_path_is_the_reference_and_the_cpu_default():
    q, k, v = _qkv(1, 2, 4, 2, 12, 8, seed=6)
    pos = jnp.array([[10, 11]])
    assert _backend.resolve_implementation(None) == "xla"
    got = verify_attention(q, k, v, pos, rows=(1,))
    want = _verify_ref(q, k, v, pos, rows=(1,), scale=1 / np.sqrt(8))
    for a, w in zip(got, want):
        np.testing.assert_array_equal(a, w)


# ---------------------------------------------------------------------------------------------------------
# sparse_decode_attention: interpreter vs reference.


def _sparse_inputs(b, h, kh, s, d, n_idx, dtype, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _normal((b, h, d), seed, dtype), _normal((b, s, kh, d), seed + 1, dtype), _normal((b, s, kh, d),
                                                                                                   seed + 2, dtype)
    idx = np.stack([rng.permutation(s)[:n_idx] for _ in range(b)]).astype(np.int32)  # unique per row
    valid = rng.random((b, n_idx)) > 0.3
    lengths = rng.integers(s // 2, s + 1, size=b)
    start = np.maximum(lengths - rng.integers(1, 6, size=b), 0)
    # The last sequence attends to nothing: no valid entry and an empty recent range.
    valid[-1] = False
    start[-1] = lengths[-1]
    assert (idx >= start[:, None]).any()  # some listed keys lie in or past the range and must be ignored
    return q, k, v, jnp.asarray(idx), jnp.asarray(valid), jnp.asarray(start, jnp.int32), jnp.asarray(lengths, jnp.int32)


# (shell, b, h, kh, S, d, K, max_recent, block sizes, dtype): compact lengths K + W that are not block multiples.
SPARSE_CASES = [
    ("pallas_triton", 3, 4, 2, 90, 16, 20, 8, SparseDecodeBlockSizes(block_k=16, num_splits=2), jnp.float32),
    ("pallas_tpu", 2, 2, 2, 60, 32, 12, 5, SparseDecodeBlockSizes(block_k=128, num_splits=1), jnp.float32),
    ("pallas_triton", 3, 4, 2, 64, 32, 9, 4, None, jnp.bfloat16),
    ("pallas_tpu", 2, 4, 1, 50, 16, 7, 6, SparseDecodeBlockSizes(block_k=128, num_splits=2), jnp.bfloat16),
]


@pytest.mark.parametrize("impl, b, h, kh, s, d, n_idx, w, bs, dtype", SPARSE_CASES)
def test_sparse_decode_interpret_matches_reference(impl, b, h, kh, s, d, n_idx, w, bs, dtype):
    q, k, v, idx, valid, start, lengths = _sparse_inputs(b, h, kh, s, d, n_idx, dtype, seed=11)
    out, lse = sparse_decode_attention(q, k, v, idx, valid, start, lengths, max_recent=w, scale=0.3,
                                       return_lse=True, implementation=impl, interpret=True, block_sizes=bs)
    want = _sparse_ref(*_f32(q, k, v), idx, valid, start, lengths, max_recent=w, scale=0.3)
    assert out.dtype == dtype and out.shape == (b, h, d) and lse.shape == (b, h)
    _close_with_infs(out, want.out, TOL[dtype])
    _close_with_infs(lse, want.lse, TOL[dtype])
    np.testing.assert_array_equal(out[-1].astype(jnp.float32), 0.0)  # the empty set
    assert np.all(np.isneginf(np.asarray(lse[-1])))


def test_sparse_decode_xla_path_is_the_cpu_default_and_matches_the_kernel():
    q, k, v, idx, valid, start, lengths = _sparse_inputs(2, 4, 2, 40, 16, 6, jnp.float32, seed=12)
    xla = sparse_decode_attention(q, k, v, idx, valid, start, lengths, max_recent=4)
    ker = sparse_decode_attention(q, k, v, idx, valid, start, lengths, max_recent=4, implementation="pallas",
                                  interpret=True)
    np.testing.assert_allclose(ker, xla, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Errors, configs and costs.


def test_bad_inputs_are_named():
    q, k, v = _qkv(2, 3, 4, 2, 20, 16)
    pos = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match=r"q must be \[b, t, h, d\]"):
        verify_attention(q[0], k, v, pos)
    with pytest.raises(ValueError, match=r"rows must be .* in \[0, t=3\); got \(3,\)"):
        verify_attention(q, k, v, pos, rows=(3,), implementation="pallas_triton", interpret=True)
    with pytest.raises(ValueError, match="rows must be a non-empty"):
        verify_attention(q, k, v, pos, rows=())
    with pytest.raises(ValueError, match=r"q_positions must be \[b, t\]"):
        verify_attention(q, k, v, pos[:, :2])
    with pytest.raises(ValueError, match="multiple of KV heads"):
        verify_attention(q[:, :, :3], k, v, pos)
    with pytest.raises(ValueError, match="head dim d to be a power of two >= 16; got d=12"):
        verify_attention(q[..., :12], k[..., :12], v[..., :12], pos, implementation="pallas_triton")
    qd = q[:, 0]
    idx, ok, n = jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 4), bool), jnp.array([5, 6])
    with pytest.raises(ValueError, match=r"q must be \[b, h, d\]"):
        sparse_decode_attention(q, k, v, idx, ok, n, n, max_recent=2)
    with pytest.raises(ValueError, match="indices and valid must be"):
        sparse_decode_attention(qd, k, v, idx, ok[:, :3], n, n, max_recent=2)
    with pytest.raises(ValueError, match=r"recent_start must have shape \[b\]"):
        sparse_decode_attention(qd, k, v, idx, ok, n[:1], n, max_recent=2)
    with pytest.raises(ValueError, match="max_recent must be >= 1; got 0"):
        sparse_decode_attention(qd, k, v, idx, ok, n, n, max_recent=0, implementation="pallas_tpu")
    with pytest.raises(ValueError, match="implementation must be one of"):
        sparse_decode_attention(qd, k, v, idx, ok, n, n, max_recent=2, implementation="cuda")


def test_bad_block_sizes_are_named():
    q, k, v = _qkv(2, 3, 4, 2, 20, 16)
    pos = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match=r"VerifyBlockSizes.block_k: Triton needs a power of two >= 16; got block_k=24"):
        verify_attention(q, k, v, pos, implementation="pallas_triton", block_sizes=VerifyBlockSizes(block_k=24))
    with pytest.raises(ValueError, match=r"VerifyBlockSizes.block_k: TPU needs a multiple of 128.*got block_k=64"):
        verify_attention(q, k, v, pos, implementation="pallas_tpu", block_sizes=VerifyBlockSizes(block_k=64))
    with pytest.raises(ValueError, match=r"SparseDecodeBlockSizes.block_k: Triton .* got block_k=8"):
        SparseDecodeBlockSizes(block_k=8).validate("pallas_triton")
    with pytest.raises(ValueError, match="VerifyBlockSizes.num_splits must be an int >= 1; got num_splits=0"):
        VerifyBlockSizes(num_splits=0)
    with pytest.raises(ValueError, match="SparseDecodeBlockSizes.block_k must be an int >= 1; got block_k=0"):
        SparseDecodeBlockSizes(block_k=0)
    with pytest.raises(ValueError, match="block_sizes must be a SparseDecodeBlockSizes; got VerifyBlockSizes"):
        sparse_decode_attention(q[:, 0], k, v, jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 4), bool),
                                jnp.array([1, 2]), jnp.array([3, 4]), max_recent=2, implementation="pallas_triton",
                                block_sizes=VerifyBlockSizes())


@pytest.mark.parametrize("impl", ["pallas_tpu", "pallas_triton"])
def test_default_block_sizes_are_valid(impl):
    for keys in (1, 15, 100, 4096, 1 << 20):
        for batch, heads in ((1, 1), (4, 8), (64, 8)):
            v = VerifyBlockSizes.default(seq_len=keys, batch=batch, kv_heads=heads, implementation=impl)
            s = SparseDecodeBlockSizes.default(num_keys=keys, batch=batch, kv_heads=heads, implementation=impl)
            for bs in (v, s):
                bs.validate(impl)
                assert 1 <= bs.num_splits <= max(1, -(-keys // bs.block_k))


def test_cost_models_count_the_documented_terms():
    c = verify_cost(batch=2, q_len=5, num_heads=8, num_kv_heads=2, kv_len=1000, head_dim=64, score_rows=2,
                    kv_itemsize=2, q_itemsize=2)
    assert c.flops == 4 * 2 * 8 * 5 * 1000 * 64 + 2 * 2 * 8 * 2 * 1000 * 64
    assert c.bytes_accessed == (2 * 2 * 1000 * 2 * 64 * 2 + (2 * 5 + 2) * 2 * 8 * 64 * 2 + 4 * 2 * 8 * 5
                                + 4 * 2 * 8 * 2 * 1000)
    sc = sparse_decode_cost(batch=2, num_heads=8, num_kv_heads=2, head_dim=64, num_indices=100, max_recent=28,
                            kv_itemsize=2, q_itemsize=2)
    assert sc.flops == 4 * 2 * 8 * 128 * 64
    assert sc.bytes_accessed == 2 * 2 * 128 * 2 * 64 * 2 + 5 * 2 * 100 + 2 * 2 * 8 * 64 * 2
    dense = verify_cost(batch=2, q_len=1, num_heads=8, num_kv_heads=2, kv_len=16384, head_dim=64, score_rows=0,
                        kv_itemsize=2)
    assert sc.bytes_accessed < 0.01 * dense.bytes_accessed  # O(K + W) rows, not O(S)


def test_tpu_verify_default_splits_keep_the_blocks_within_scoped_vmem():
    """`pallas_kernels.aot`'s verify case (batch 8, t 5, 32/8 heads, d 128, bf16, 2 score rows): 1088 bytes of
    VMEM per key (K and V columns and the float32 score rows, double-buffered; Mosaic allocated 34.00M for
    the 32768-key splits of a 64k cache, over v5e's 16M and v6e's 32M). The TPU default splits further
    until a split fits the budget; without the per-key size (and off TPU) the rule is unchanged."""
    from pallas_kernels.vegas import api as vegas_api

    q = jax.ShapeDtypeStruct((8, 5, 32, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((8, 65536, 8, 128), jnp.bfloat16)
    per_key = vegas_api._verify_tpu_bytes_per_key(q, jax.ShapeDtypeStruct((8, 8, 65536, 128), jnp.bfloat16), (0, 4),
                                                  "pallas_tpu", "bksd")  # one KV head per program
    assert per_key == 2 * (2 * 128 * 2 + 8 * 4) == 1088
    plain = VerifyBlockSizes.default(seq_len=65536, batch=8, kv_heads=8, implementation="pallas_tpu")
    assert plain.num_splits == 2 and 65536 // 2 * per_key == 34 * 2**20
    bs = VerifyBlockSizes.default(seq_len=65536, batch=8, kv_heads=8, implementation="pallas_tpu",
                                  tpu_bytes_per_key=per_key)
    assert bs.num_splits == 8 and 65536 // bs.num_splits * per_key <= _backend.TPU_BLOCK_VMEM_BUDGET
    assert VerifyBlockSizes.default(seq_len=65536, batch=8, kv_heads=8, implementation="pallas_triton",
                                    tpu_bytes_per_key=per_key).num_splits == 2
    # A token-major cache: a TPU block [keys, 8, 128] spans every KV head, 8x the bytes per key.
    wide = vegas_api._verify_tpu_bytes_per_key(q, k, (0, 4), "pallas_tpu", "bskd")
    assert wide == 2 * (2 * 8 * 128 * 2 + 8 * 8 * 4)
    bs = VerifyBlockSizes.default(seq_len=65536, batch=8, kv_heads=8, implementation="pallas_tpu",
                                  tpu_bytes_per_key=wide)
    assert 65536 // bs.num_splits * wide <= _backend.TPU_BLOCK_VMEM_BUDGET < 65536 // (bs.num_splits // 2) * wide
