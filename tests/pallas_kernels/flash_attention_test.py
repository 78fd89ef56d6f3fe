"""Flash-attention prefill: interpreter vs reference (forward and gradients, both shells), cross-lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.flash_attention import FlashBlockSizes, flash_attention, flash_cost
from pallas_kernels.flash_attention import kernel as fk
from primitives import attention as ref


def _inputs(b, t, s, h, kh, d, dtype=jnp.float32, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(k1, (b, t, h, d), dtype), jax.random.normal(k2, (b, s, kh, d), dtype),
            jax.random.normal(k3, (b, s, kh, d), dtype))


def _ref(q, k, v, causal):
    t, s = q.shape[1], k.shape[1]
    return ref.attention(q, k, v, causal=causal, q_positions=jnp.arange(t) + (s - t), return_lse=True)


# Lengths that are not block multiples, GQA ratios 1, 2, 4, chunked prefill (t < s).
CASES = [
    ("pallas_triton", 37, 37, 4, 2, True, FlashBlockSizes(block_q=16, block_k=16)),
    ("pallas_tpu", 20, 45, 4, 1, True, FlashBlockSizes(block_q=8, block_k=16)),
    ("pallas_triton", 24, 50, 2, 2, False, FlashBlockSizes(block_q=16, block_k=32)),
]


@pytest.mark.parametrize("impl, t, s, h, kh, causal, bs", CASES)
def test_forward_matches_reference(impl, t, s, h, kh, causal, bs):
    q, k, v = _inputs(2, t, s, h, kh, 16)
    out, lse = flash_attention(q, k, v, causal=causal, block_sizes=bs, implementation=impl, interpret=True,
                               return_residuals=True)
    want = _ref(q, k, v, causal)
    np.testing.assert_allclose(out, want.out, atol=1e-5)
    np.testing.assert_allclose(lse, want.lse, atol=1e-5)


def test_bf16_forward():
    q, k, v = _inputs(1, 40, 40, 4, 2, 32, jnp.bfloat16, seed=1)
    out = flash_attention(q, k, v, causal=True, implementation="pallas_triton", interpret=True,
                          block_sizes=FlashBlockSizes(block_q=16, block_k=16))
    want = _ref(*(x.astype(jnp.float32) for x in (q, k, v)), True).out
    np.testing.assert_allclose(out.astype(jnp.float32), want, atol=2e-2)


def test_gradients_match_reference():
    q, k, v = _inputs(1, 19, 19, 4, 2, 16, seed=2)
    bs = FlashBlockSizes(block_q=16, block_k=16)
    loss = lambda f: lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))
    got = jax.grad(loss(lambda q, k, v: flash_attention(q, k, v, causal=True, block_sizes=bs,
                                                        implementation="pallas_triton", interpret=True)),
                   argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(lambda q, k, v: _ref(q, k, v, True).out), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=2e-5)


def _loss(f, with_lse):
    """A loss of the output (and, with_lse, of the logsumexp too, so the lse cotangent is not zero)."""

    def loss(q, k, v):
        out, lse = f(q, k, v)
        value = jnp.sum(jnp.sin(out.astype(jnp.float32)))
        return value + jnp.sum(jnp.cos(lse)) if with_lse else value

    return loss


# Both shells; causal and not; GQA ratios 1, 2, 4 (kh=4, 2, 1 of h=4); chunked prefill (t < s); lengths that are
# not block multiples; backward tiles that differ from the forward's; an lse cotangent.
GRAD_CASES = [
    ("pallas_tpu", 19, 19, 4, 2, True, FlashBlockSizes(block_q=8, block_k=16), True),
    ("pallas_tpu", 20, 45, 4, 1, True, FlashBlockSizes(block_q=8, block_k=16, block_q_bwd=16, block_k_bwd=8), False),
    ("pallas_tpu", 24, 50, 4, 4, False, FlashBlockSizes(block_q=16, block_k=32), True),
    ("pallas_triton", 20, 45, 4, 1, True, FlashBlockSizes(block_q=16, block_k=16), True),
    ("pallas_triton", 24, 50, 4, 2, False, FlashBlockSizes(block_q=16, block_k=32, block_k_bwd=16), True),
]


@pytest.mark.parametrize("impl, t, s, h, kh, causal, bs, with_lse", GRAD_CASES)
def test_backward_kernels_match_reference(impl, t, s, h, kh, causal, bs, with_lse):
    q, k, v = _inputs(2, t, s, h, kh, 16, seed=3)
    f = lambda q, k, v: flash_attention(q, k, v, causal=causal, block_sizes=bs, implementation=impl, interpret=True,
                                        return_residuals=True)
    r = lambda q, k, v: tuple(_ref(q, k, v, causal))
    got = jax.grad(_loss(f, with_lse), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(_loss(r, with_lse), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        np.testing.assert_allclose(g, w, atol=2e-5, err_msg=f"d{name}")


@pytest.mark.parametrize("impl", ["pallas_tpu", "pallas_triton"])
def test_bf16_backward(impl):
    q, k, v = _inputs(1, 40, 40, 4, 2, 32, jnp.bfloat16, seed=4)
    f = lambda q, k, v: flash_attention(q, k, v, causal=True, implementation=impl, interpret=True,
                                        return_residuals=True, block_sizes=FlashBlockSizes(block_q=16, block_k=16))
    got = jax.grad(_loss(f, True), argnums=(0, 1, 2))(q, k, v)
    up = [x.astype(jnp.float32) for x in (q, k, v)]
    want = jax.grad(_loss(lambda q, k, v: tuple(_ref(q, k, v, True)), True), argnums=(0, 1, 2))(*up)
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == jnp.bfloat16, name
        np.testing.assert_allclose(g.astype(jnp.float32), w, atol=1e-2, rtol=1e-2, err_msg=f"d{name}")


def test_causal_block_ranges():
    """The causal skip's block bounds against brute force over every (query, key) pair."""
    for t, s, bq, bk in [(20, 45, 8, 16), (37, 37, 16, 16), (5, 64, 8, 8), (64, 64, 16, 32)]:
        tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
        nq, nk = tp // bq, sp // bk
        seen = (np.arange(tp)[:, None] + s - t) >= np.arange(sp)[None, :]  # [tp, sp]: key at or before query
        blocks = seen.reshape(nq, bq, nk, bk).any(axis=(1, 3))  # [nq, nk]
        for i in range(nq):
            want = np.nonzero(blocks[i])[0].max()
            got = fk.last_key_block(i, block_q=bq, block_k=bk, offset=s - t, num_k_blocks=nk)
            assert int(got) == want, (t, s, bq, bk, i)
        for j in range(nk):
            want = np.nonzero(blocks[:, j])[0].min()
            got = fk.first_query_block(j, block_q=bq, block_k=bk, offset=s - t, num_q_blocks=nq)
            assert int(got) == want, (t, s, bq, bk, j)


@pytest.mark.parametrize("platform, impl", [("tpu", "pallas_tpu"), ("cuda", "pallas_triton")])
def test_backward_cross_lowers(platform, impl):
    """Forward, dq and dk/dv kernels lower for TPU (Mosaic) and for GPU (Triton) with an lse cotangent."""
    bs = FlashBlockSizes(block_q=128, block_k=128, block_q_bwd=256, block_k_bwd=64)

    def f(q, k, v):
        g = lambda *a: flash_attention(*a, causal=True, implementation=impl, interpret=False, block_sizes=bs,
                                       return_residuals=True)
        return jax.grad(_loss(g, True), argnums=(0, 1, 2))(q, k, v)

    text = _backend.lower_for(f, jax.ShapeDtypeStruct((1, 384, 8, 128), jnp.bfloat16),
                              jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16),
                              jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16), platform=platform)
    assert "flash_attention_dq" in text and "flash_attention_dkv" in text
    if platform == "tpu":
        assert text.count("tpu_custom_call") == 3  # forward, dq, dk/dv
    else:
        assert "triton" in text.lower()


def test_default_block_sizes_fit_tpu_vmem():
    for t in (100, 2048, 32768):
        bs = FlashBlockSizes.default(q_len=t, kv_len=t, head_dim=128, itemsize=2, implementation="pallas_tpu")
        bs.validate("pallas_tpu")
        assert bs.tpu_vmem_bytes(head_dim=128, itemsize=2) <= _backend.TPU_BLOCK_VMEM_BUDGET
        assert bs.block_q <= -(-t // 8) * 8 and bs.block_k <= -(-t // 8) * 8
    triton = FlashBlockSizes.default(q_len=37, kv_len=4096)
    triton.validate("pallas_triton")
    assert (triton.block_q, triton.block_k) == (64, 128)


def test_errors_and_cost():
    q, k, v = _inputs(1, 8, 4, 2, 1, 16)
    with pytest.raises(ValueError, match="q_len <= kv_len"):
        flash_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="power of two"):
        flash_attention(q, k, v, implementation="pallas_triton", block_sizes=FlashBlockSizes(block_q=24, block_k=16))
    with pytest.raises(ValueError, match="block_k_bwd"):
        flash_attention(q, k, v, implementation="pallas_tpu", block_sizes=FlashBlockSizes(block_k_bwd=12))
    with pytest.raises(ValueError, match="block_q_bwd a multiple of 128"):  # compiled for TPU: lane rule
        flash_attention(*_inputs(1, 40, 40, 2, 1, 16), implementation="pallas_tpu", interpret=False,
                        block_sizes=FlashBlockSizes(block_q=128, block_q_bwd=24))
    with pytest.raises(ValueError, match="block_q_bwd must be >= 1"):
        FlashBlockSizes(block_q_bwd=0)
    c = flash_cost(batch=1, q_len=10, kv_len=10, num_heads=2, num_kv_heads=1, head_dim=8, itemsize=2, causal=False)
    assert c.flops == 4 * 2 * 100 * 8
    kw = dict(batch=1, q_len=10, kv_len=10, num_heads=2, num_kv_heads=1, head_dim=8, itemsize=2, causal=True)
    dq, dkv, bwd = (flash_cost(**kw, part=p) for p in ("dq", "dkv", "backward"))
    assert dq.flops == 6 * 2 * 50 * 8 and dkv.flops == 8 * 2 * 50 * 8
    assert bwd.flops == dq.flops + dkv.flops and bwd.bytes_accessed == dq.bytes_accessed + dkv.bytes_accessed
    with pytest.raises(ValueError, match="part must be one of"):
        flash_cost(**kw, part="bwd")
