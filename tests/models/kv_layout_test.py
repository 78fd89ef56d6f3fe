"""KV-cache axis order: every path that reads a cache gives the same result for "bskd" and "bksd".

The head-major order ("bksd", [b, k, s, d]) is the token-major one ("bskd", [b, s, k, d]) with axes 1
and 2 swapped; each function below is run on both and compared (the token-major reference is the
definition of correctness, already tested against float64 numpy in the per-module tests).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import kv_cache
from pallas_kernels import _backend
from pallas_kernels.decode_attention import DecodeBlockSizes, decode_attention
from pallas_kernels.vegas import SparseDecodeBlockSizes, sparse_decode_attention, verify_attention
from primitives import attention as ref
from primitives import ffd


def _hm(x):
    return jnp.swapaxes(x, 1, 2)


def _normal(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def test_attention_and_decode_reference_agree_across_layouts():
    q, k, v = _normal((2, 5, 4, 8), 0), _normal((2, 11, 2, 8), 1), _normal((2, 11, 2, 8), 2)
    pos = jnp.array([[6, 7, 8, 9, 10], [2, 3, 4, 5, 6]])
    want = ref.attention(q, k, v, causal=True, q_positions=pos, return_lse=True)
    got = ref.attention(q, _hm(k), _hm(v), causal=True, q_positions=pos, return_lse=True, kv_layout="bksd")
    np.testing.assert_allclose(got.out, want.out, atol=1e-6)
    np.testing.assert_allclose(got.lse, want.lse, atol=1e-6)
    lengths = jnp.array([11, 0])  # an empty cache row: zeros and -inf
    want = ref.decode_attention(q[:, 0], k, v, lengths, return_lse=True)
    got = ref.decode_attention(q[:, 0], _hm(k), _hm(v), lengths, return_lse=True, kv_layout="bksd")
    np.testing.assert_allclose(got.out, want.out, atol=1e-6)
    np.testing.assert_array_equal(np.isneginf(got.lse), np.isneginf(want.lse))
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        ref.attention(q, k, v, kv_layout="bsdk")
    with pytest.raises(ValueError, match=r"k and v must agree"):
        ref.attention(q, _hm(k), v, kv_layout="bksd")


@pytest.mark.parametrize("impl, bs", [("pallas_triton", DecodeBlockSizes(block_k=16, num_splits=3)),
                                      ("pallas_tpu", DecodeBlockSizes(block_k=8, num_splits=2))])
def test_decode_kernel_reads_head_major_cache(impl, bs):
    q, k, v = _normal((3, 8, 16), 3), _normal((3, 70, 2, 16), 4), _normal((3, 70, 2, 16), 5)
    lengths = jnp.array([70, 37, 0])
    want, want_lse = ref.decode_attention(q, k, v, lengths, return_lse=True)
    got, lse = decode_attention(q, _hm(k), _hm(v), lengths, implementation=impl, interpret=True, block_sizes=bs,
                                return_residuals=True, kv_layout="bksd")
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, atol=1e-5)
    xla = decode_attention(q, _hm(k), _hm(v), lengths, kv_layout="bksd")
    np.testing.assert_allclose(xla, want, atol=1e-6)


@pytest.mark.parametrize("platform, impl, marker", [("tpu", "pallas_tpu", "tpu_custom_call"),
                                                     ("cuda", "pallas_triton", "triton")])
def test_decode_kernel_cross_lowers_head_major(platform, impl, marker):
    sd = jax.ShapeDtypeStruct
    f = lambda q, k, v, n: decode_attention(q, k, v, n, implementation=impl, interpret=False, kv_layout="bksd",
                                            block_sizes=DecodeBlockSizes(block_k=128, num_splits=4))
    kv = sd((2, 2, 1024, 128), jnp.bfloat16)
    text = _backend.lower_for(f, sd((2, 8, 128), jnp.bfloat16), kv, kv, sd((2,), jnp.int32), platform=platform)
    assert marker in text.lower()


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_vegas_kernels_agree_across_layouts(impl):
    q, k, v = _normal((2, 3, 4, 16), 6), _normal((2, 40, 2, 16), 7), _normal((2, 40, 2, 16), 8)
    pos = jnp.array([[30, 31, 32], [10, 11, 12]])
    want = verify_attention(q, k, v, pos, rows=(0, 2), implementation=impl, interpret=True)
    got = verify_attention(q, _hm(k), _hm(v), pos, rows=(0, 2), implementation=impl, interpret=True,
                           kv_layout="bksd")
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-5)
    idx = jnp.array([[0, 5, 9, 33], [1, 2, 3, 4]], jnp.int32)
    valid = jnp.array([[True, True, False, True], [True, False, True, True]])
    start, lengths = jnp.array([30, 8]), jnp.array([36, 12])
    bs = None if impl == "xla" else SparseDecodeBlockSizes(block_k=16, num_splits=1)
    want = sparse_decode_attention(q[:, 0], k, v, idx, valid, start, lengths, max_recent=8, implementation=impl,
                                   interpret=True, block_sizes=bs)
    got = sparse_decode_attention(q[:, 0], _hm(k), _hm(v), idx, valid, start, lengths, max_recent=8,
                                  implementation=impl, interpret=True, block_sizes=bs, kv_layout="bksd")
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_ffd_cache_is_the_same_from_either_layout():
    k, v = _normal((2, 100, 2, 16), 9), _normal((2, 100, 2, 16), 10)
    lengths = jnp.array([100, 37])
    want = ffd.build_cache(k, v, lengths, page_size=16)
    got = ffd.build_cache(_hm(k), _hm(v), lengths, page_size=16, layout="bksd")
    for name, a, b in zip(want._fields, got, want):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=name)


def test_write_tokens_and_cache_metadata_across_layouts():
    new = _normal((2, 3, 2, 4), 11)
    start = jnp.array([0, 6])  # the second row's last token falls past the capacity and is dropped
    tm = kv_cache.write_tokens(jnp.zeros((2, 8, 2, 4)), new, start)
    hm = kv_cache.write_tokens(jnp.zeros((2, 2, 8, 4)), new, start, layout="bksd")
    np.testing.assert_array_equal(_hm(hm), tm)
    np.testing.assert_array_equal(tm[1, 6:], new[1, :2])
    cache = kv_cache.init_cache(num_layers=2, batch_size=2, capacity=8, num_kv_heads=2, head_dim=4, layout="bksd")
    assert cache.capacity == 8 and cache.keys[0].shape == (2, 2, 8, 4)
    rolled = jax.jit(kv_cache.truncate)(cache, jnp.array([0, 0]))
    assert rolled.layout == "bksd"
    np.testing.assert_array_equal(kv_cache.token_major(hm, "bksd"), tm)
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        kv_cache.init_cache(num_layers=1, batch_size=1, capacity=4, num_kv_heads=1, head_dim=4, layout="sbkd")
    assert kv_cache.default_kv_layout("cpu") == "bksd" and kv_cache.default_kv_layout("gpu") == "bskd"
