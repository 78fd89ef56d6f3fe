"""QVG kernels: k-means assignment and attention over QVG spans vs references, edge cases, cross-lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.qvg import (AssignBlockSizes, QVGAttentionBlockSizes, assign_cost, kmeans_assign,
                                qvg_attention, qvg_attention_cost)
from pallas_kernels.qvg.config import default_splits, tpu_bytes_per_token
from primitives import attention as attn
from primitives import kmeans as km
from primitives import residual_quantization as rq

_quantize = jax.jit(rq.qvg_quantize, static_argnames=("config",))


def _normal(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


# (shell, groups shape, s, d, k, block_s): point counts that are not block multiples, odd k.
ASSIGN_CASES = [("pallas_triton", (2,), 100, 32, 7, 32), ("pallas_tpu", (2, 3), 200, 64, 20, 128)]


@pytest.mark.parametrize("impl, lead, s, d, k, block", ASSIGN_CASES)
def test_kmeans_assign_matches_the_reference_and_brute_force(impl, lead, s, d, k, block):
    x = _normal(lead + (s, d), 0)
    c = _normal(lead + (k, d), 1)
    got = kmeans_assign(x, c, implementation=impl, interpret=True, block_sizes=AssignBlockSizes(block_s=block))
    np.testing.assert_array_equal(got, km.assign(x, c))
    xd, cd = np.asarray(x, np.float64), np.asarray(c, np.float64)
    brute = np.argmin(((xd[..., :, None, :] - cd[..., None, :, :]) ** 2).sum(-1), axis=-1)
    np.testing.assert_array_equal(got, brute)


def test_kmeans_assign_breaks_ties_to_the_lowest_index():
    x = jnp.zeros((1, 16, 16))
    c = jnp.concatenate([jnp.ones((1, 1, 16)), jnp.zeros((1, 3, 16))], axis=1)  # centroids 1..3 all at distance 0
    got = kmeans_assign(x, c, implementation="pallas_tpu", interpret=True, block_sizes=AssignBlockSizes(block_s=128))
    np.testing.assert_array_equal(got, 1)


def _spans(b, kh, s, d, k_cfg, v_cfg, seed=0):
    k = _quantize(_normal((b, kh, s, d), seed), jax.random.key(seed), config=k_cfg)
    v = _quantize(_normal((b, kh, s, d), seed + 1), jax.random.key(seed + 1), config=v_cfg)
    return k, v


QVG_INT2 = rq.QVGConfig(num_centroids=16, group_size=64, kmeans_iters=3)
PRO_INT4 = rq.QVGConfig(num_centroids=12, num_stages=3, residual_bits=4, group_size=32, kmeans_iters=3)
ASYM = rq.QVGConfig(num_centroids=8, residual_bits=4, scheme="asymmetric", group_size=64, kmeans_iters=3)
CENTROIDS_ONLY = rq.QVGConfig(num_centroids=20, num_stages=2, residual_bits=None, kmeans_iters=3)
# QVG-Pro's format (2 bits, 16-channel groups: 4-channel sub-slices), float32 scales and zero points.
PRO_G16 = rq.QVGConfig(num_centroids=8, num_stages=2, group_size=16, scheme="asymmetric", scale_dtype="float32",
                       kmeans_iters=3)

# (shell, b, t, h, kh, s, d, K format, V format, block_k, num_splits, lengths): GQA and MHA, spans that
# are not block or split multiples, per-sequence lengths (one ending inside a split, one empty split),
# multi-stage, asymmetric, 4-channel-group and centroid-only spans; num_splits None = the default.
ATTN_CASES = [
    ("pallas_triton", 2, 3, 4, 2, 100, 64, QVG_INT2, ASYM, 32, None, (100, 37)),
    ("pallas_tpu", 2, 5, 2, 2, 300, 64, PRO_INT4, CENTROIDS_ONLY, 128, 2, (300, 129)),
    ("pallas_triton", 2, 1, 8, 1, 64, 64, CENTROIDS_ONLY, PRO_INT4, 16, None, (1, 64)),
    ("pallas_triton", 1, 2, 4, 2, 150, 64, PRO_G16, PRO_G16, 32, 3, (133,)),
    ("pallas_tpu", 2, 2, 6, 2, 200, 64, ASYM, QVG_INT2, 128, None, (77, 200)),
]


def _dense(q, k, v, n):
    """Independent reference: dequantize with the primitives, then the library's dense attention."""
    kd = jnp.swapaxes(rq.dequantize(k, jnp.float32), 1, 2)
    vd = jnp.swapaxes(rq.dequantize(v, jnp.float32), 1, 2)
    return attn.attention(q, kd, vd, kv_lengths=n, return_lse=True)


@pytest.mark.parametrize("impl, b, t, h, kh, s, d, kf, vf, block, splits, lengths", ATTN_CASES)
def test_qvg_attention_matches_dequantize_then_dense_attention(impl, b, t, h, kh, s, d, kf, vf, block, splits,
                                                               lengths):
    k, v = _spans(b, kh, s, d, kf, vf)
    q = _normal((b, t, h, d), 7)
    n = jnp.asarray(lengths, jnp.int32)
    got, lse = qvg_attention(q, k, v, n, implementation=impl, interpret=True, return_residuals=True,
                             block_sizes=QVGAttentionBlockSizes(block_k=block, num_splits=splits))
    want = _dense(q, k, v, n)
    np.testing.assert_allclose(got, want.out, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(lse, want.lse, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("impl, block", [("pallas_triton", 32), ("pallas_tpu", 128)])
def test_split_count_does_not_change_the_result(impl, block):
    # 1 split vs several (not dividing the span, some past a sequence's length, one past every length).
    s = 3 * block + 5
    k, v = _spans(2, 2, s, 64, PRO_INT4, ASYM, seed=3)
    q = _normal((2, 3, 4, 64), 8)
    n = jnp.asarray([s, block + 9], jnp.int32)
    results = [qvg_attention(q, k, v, n, implementation=impl, interpret=True, return_residuals=True,
                             block_sizes=QVGAttentionBlockSizes(block_k=block, num_splits=ns)) for ns in (1, 2, 3, 8)]
    for out, lse in results[1:]:
        np.testing.assert_allclose(out, results[0][0], atol=2e-6, rtol=1e-6)
        np.testing.assert_allclose(lse, results[0][1], atol=2e-6, rtol=1e-6)
    want = _dense(q, k, v, n)
    np.testing.assert_allclose(results[0][0], want.out, atol=2e-5, rtol=1e-5)


def test_tpu_default_splits_keep_each_programs_blocks_within_the_vmem_budget():
    # The AOT production spans (pallas_kernels.aot): K in QVG's format, V in QVG-Pro's, d = 128.
    rows = [(1, 1), (32, 1), (2, 2), (4, 1), (32, 1), (8, 2)]  # labels, codes, scales of K then V
    per_token = tpu_bytes_per_token(rows)
    assert per_token == 2 * 6 * 32  # every block pads to one sublane tile (32 B a token), double-buffered
    for span, want in ((8192, 1), (32768, 1), (131072, 4), (1 << 20, 32)):
        got = default_splits(seq_len=span, block_k=128, programs=64, implementation="pallas_tpu",
                             bytes_per_token=per_token)
        assert got == want
        assert -(-span // got) * per_token <= _backend.TPU_BLOCK_VMEM_BUDGET
    # Triton: about 128 programs, at most one tile per split.
    assert default_splits(seq_len=4096, block_k=128, programs=8, implementation="pallas_triton",
                          bytes_per_token=per_token) == 16
    assert default_splits(seq_len=100, block_k=32, programs=1, implementation="pallas_triton",
                          bytes_per_token=per_token) == 4


def test_xla_path_is_the_cpu_default_and_empty_sequences_give_zeros():
    k, v = _spans(2, 1, 40, 64, QVG_INT2, QVG_INT2)
    q = _normal((2, 2, 2, 64), 3)
    n = jnp.asarray([0, 40])
    default = qvg_attention(q, k, v, n)
    xla = qvg_attention(q, k, v, n, implementation="xla")
    np.testing.assert_array_equal(default, xla)
    for ns in (1, 2):  # with 2 splits the second holds only padding
        out, lse = qvg_attention(q, k, v, n, implementation="pallas_tpu", interpret=True, return_residuals=True,
                                 block_sizes=QVGAttentionBlockSizes(block_k=128, num_splits=ns))
        np.testing.assert_array_equal(out[0], 0.0)
        assert np.all(np.isneginf(np.asarray(lse[0]))) and np.all(np.isfinite(np.asarray(lse[1])))
        np.testing.assert_allclose(out[1], xla[1], atol=2e-5, rtol=1e-5)


def test_span_attention_merges_with_full_precision_chunks():
    # History = one QVG span + one full-precision chunk: merging the two partial results by their lse
    # equals attention over the concatenation.
    k, v = _spans(1, 2, 64, 64, QVG_INT2, QVG_INT2)
    kf, vf = _normal((1, 16, 2, 64), 4), _normal((1, 16, 2, 64), 5)
    q = _normal((1, 4, 2, 64), 6)
    a_out, a_lse = qvg_attention(q, k, v, implementation="pallas_triton", interpret=True, return_residuals=True,
                                 block_sizes=QVGAttentionBlockSizes(block_k=32))
    b = attn.attention(q, kf, vf, return_lse=True)
    merged = attn.combine_partials(jnp.stack([jnp.swapaxes(a_out, 1, 2), jnp.swapaxes(b.out, 1, 2)]),
                                   jnp.stack([a_lse, b.lse]))
    kd = jnp.concatenate([jnp.swapaxes(rq.dequantize(k, jnp.float32), 1, 2), kf], axis=1)
    vd = jnp.concatenate([jnp.swapaxes(rq.dequantize(v, jnp.float32), 1, 2), vf], axis=1)
    full = attn.attention(q, kd, vd)
    np.testing.assert_allclose(jnp.swapaxes(merged.out, 1, 2), full, atol=2e-5)


def test_bad_inputs_are_named():
    k, v = _spans(1, 2, 32, 64, QVG_INT2, QVG_INT2)
    with pytest.raises(ValueError, match="q must be"):
        qvg_attention(jnp.ones((1, 4, 64)), k, v)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        qvg_attention(jnp.ones((1, 1, 3, 64)), k, v)
    with pytest.raises(ValueError, match="QVGTensor"):
        qvg_attention(jnp.ones((1, 1, 2, 64)), jnp.ones((1, 2, 32, 64)), v)
    with pytest.raises(ValueError, match="code plane"):  # 2 bits of d = 32: 8-channel planes, Triton's dot needs 16
        kp, vp = _spans(1, 2, 32, 32, rq.QVGConfig(num_centroids=4, group_size=16), QVG_INT2.__class__(
            num_centroids=4, group_size=32))
        qvg_attention(jnp.ones((1, 1, 2, 32)), kp, vp, implementation="pallas_triton", interpret=True)
    with pytest.raises(ValueError, match="block_k"):
        QVGAttentionBlockSizes(block_k=48).validate("pallas_triton")
    with pytest.raises(ValueError, match="multiple of 128"):
        QVGAttentionBlockSizes(block_k=32).validate("pallas_tpu")
    with pytest.raises(ValueError, match="TPU needs block_s a multiple of 128"):
        AssignBlockSizes(block_s=64).validate("pallas_tpu")
    with pytest.raises(ValueError, match="num_splits"):
        QVGAttentionBlockSizes(num_splits=0)
    with pytest.raises(ValueError, match="share leading dims"):
        kmeans_assign(jnp.ones((2, 8, 4)), jnp.ones((3, 2, 4)))


def test_cost_model_counts():
    c = assign_cost(groups=2, points=10, centroids=4, dim=8)
    assert c.flops == 2 * (2 * 10 * 4 * 8 + 4 * 10 * 4)
    assert c.bytes_accessed == 2 * ((10 + 4) * 8 * 4 + 40)
    a = qvg_attention_cost(batch=1, query_rows=2, kv_heads=1, span=8, dim=4, stored_bytes=100.0, k_stages=1,
                           v_stages=1, centroids=3, q_itemsize=4)
    assert a.flops == 4 * 2 * 8 * 4 + 2 * (2 * 2 * 8 * 3 + 2 * 2 * 3 * 4) + 8 * 8 * 4
    assert a.bytes_accessed == 100.0 + 2 * 2 * 4 * 4
    a3 = qvg_attention_cost(batch=1, query_rows=2, kv_heads=1, span=8, dim=4, stored_bytes=100.0, k_stages=1,
                            v_stages=1, centroids=3, q_itemsize=4, splits=3)
    assert a3.flops == 4 * 2 * 8 * 4 + 2 * (2 * 2 * 8 * 3 + 3 * 2 * 2 * 3 * 4) + 8 * 8 * 4
    assert a3.bytes_accessed == 100.0 + 2 * 2 * 4 * 4 + 2 * 3 * 2 * (4 + 2) * 4
