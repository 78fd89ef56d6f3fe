"""Split-K decode kernel: interpreter vs reference, split invariance, residuals, cross-lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.decode_attention import DecodeBlockSizes, decode_attention, decode_cost
from primitives import attention as ref


def _inputs(b, h, kh, d, s, dtype=jnp.float32, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(k1, (b, h, d), dtype)
    k = jax.random.normal(k2, (b, s, kh, d), dtype)
    v = jax.random.normal(k3, (b, s, kh, d), dtype)
    return q, k, v


# (impl shell, h, kh, s, lengths, block sizes): lengths and capacities are not block multiples.
CASES = [
    ("pallas_triton", 8, 2, 100, [100, 37, 0], DecodeBlockSizes(block_k=16, num_splits=3)),
    ("pallas_tpu", 4, 4, 70, [1, 70, 64], DecodeBlockSizes(block_k=8, num_splits=2)),
    ("pallas_triton", 6, 1, 50, [50, 5, 33], DecodeBlockSizes(block_k=32, num_splits=1)),
]


@pytest.mark.parametrize("impl, h, kh, s, lengths, bs", CASES)
def test_interpret_matches_reference_f32(impl, h, kh, s, lengths, bs):
    q, k, v = _inputs(3, h, kh, 16, s)
    lengths = jnp.array(lengths)
    want, want_lse = ref.decode_attention(q, k, v, lengths, return_lse=True)
    got, lse = decode_attention(q, k, v, lengths, implementation=impl, interpret=True, block_sizes=bs,
                                return_residuals=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, atol=1e-5)  # -inf rows compare equal
    assert np.all(np.isfinite(np.asarray(got)))


def test_bf16_inputs_with_f32_accumulation():
    q, k, v = _inputs(2, 8, 2, 32, 96, jnp.bfloat16, seed=1)
    lengths = jnp.array([96, 41])
    got = decode_attention(q, k, v, lengths, implementation="pallas_triton", interpret=True,
                           block_sizes=DecodeBlockSizes(block_k=16, num_splits=2))
    want = ref.decode_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), lengths)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.astype(jnp.float32), want, atol=2e-2)


def test_split_count_does_not_change_the_result():
    q, k, v = _inputs(2, 4, 2, 16, 128, seed=2)
    lengths = jnp.array([128, 77])
    outs = [decode_attention(q, k, v, lengths, implementation="pallas_triton", interpret=True,
                             block_sizes=DecodeBlockSizes(block_k=16, num_splits=n)) for n in (1, 2, 8)]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], atol=1e-6)


def test_unnormalized_residuals_recover_output_and_lse():
    q, k, v = _inputs(2, 4, 2, 16, 64, seed=3)
    lengths = jnp.array([64, 10])
    want, want_lse = ref.decode_attention(q, k, v, lengths, return_lse=True)
    for impl in ("pallas_triton", "xla"):
        o, (m, l) = decode_attention(q, k, v, lengths, implementation=impl, interpret=True, normalize_output=False,
                                     return_residuals=True, block_sizes=DecodeBlockSizes(block_k=16, num_splits=2))
        np.testing.assert_allclose(o / l[..., None], want, atol=1e-5)
        np.testing.assert_allclose(m + jnp.log(l), want_lse, atol=1e-5)


def test_xla_path_is_the_reference_and_is_the_cpu_default():
    q, k, v = _inputs(2, 4, 2, 16, 20, seed=4)
    lengths = jnp.array([20, 3])
    assert _backend.resolve_implementation(None) == "xla"  # CPU: the interpreter is slower than XLA
    np.testing.assert_array_equal(decode_attention(q, k, v, lengths), ref.decode_attention(q, k, v, lengths))


def test_bad_inputs_and_configs():
    q, k, v = _inputs(2, 4, 2, 16, 20)
    with pytest.raises(ValueError, match="lengths must have shape"):
        decode_attention(q, k, v, jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match="multiple of KV heads"):
        decode_attention(q[:, :3], k, v, jnp.array([1, 2]))
    with pytest.raises(ValueError, match="power of two"):
        decode_attention(q, k, v, jnp.array([1, 2]), implementation="pallas_triton", interpret=True,
                         block_sizes=DecodeBlockSizes(block_k=24, num_splits=1))
    with pytest.raises(ValueError, match="implementation must be one of"):
        decode_attention(q, k, v, jnp.array([1, 2]), implementation="cuda")


def test_cost_model_counts():
    c = decode_cost(batch=2, kv_len=1000, num_heads=8, num_kv_heads=2, head_dim=64, kv_itemsize=2)
    assert c.flops == 4 * 2 * 8 * 1000 * 64
    assert c.bytes_accessed == 2 * 2 * 1000 * 2 * 64 * 2 + 2 * 2 * 8 * 64 * 4


def test_tpu_default_splits_keep_the_kv_blocks_within_scoped_vmem():
    """Batch 8, 8 bfloat16 KV heads of 128 (`pallas_kernels.aot`'s decode case): token-major blocks pad
    the 8 heads to 16 sublanes, 8 KiB per key for K and V (Mosaic allocated 32.00M for 4096 keys on v5e,
    over its 16M limit), so 32k tokens take 32 splits (8 MiB each) and 256k take 256; head-major blocks
    are dense (4 KiB per key). Other backends keep `DecodeBlockSizes.default`."""
    from pallas_kernels.decode_attention import config

    heads = dict(kv_heads=8, head_dim=128, itemsize=2)
    assert config.tpu_dense_bytes_per_key(kv_layout="bskd", **heads) == 8192
    assert config.tpu_dense_bytes_per_key(kv_layout="bksd", **heads) == 4096
    for s, layout, splits in ((32768, "bskd", 32), (1 << 18, "bskd", 256), (32768, "bksd", 16)):
        bs = config.decode_default(seq_len=s, batch=8, kv_layout=layout, implementation="pallas_tpu", **heads)
        assert bs.num_splits == splits and bs.block_k == 128
        assert s // bs.num_splits * config.tpu_dense_bytes_per_key(kv_layout=layout, **heads) <= \
            _backend.TPU_BLOCK_VMEM_BUDGET
    assert config.decode_default(seq_len=32768, batch=8, kv_layout="bskd", implementation="pallas_triton",
                                 **heads) == DecodeBlockSizes.default(seq_len=32768, batch=8,
                                                                      implementation="pallas_triton")
