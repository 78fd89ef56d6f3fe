"""Flash-attention prefill: interpreter vs reference (forward and gradients), cross-lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.flash_attention import FlashBlockSizes, flash_attention, flash_cost
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


def test_errors_and_cost():
    q, k, v = _inputs(1, 8, 4, 2, 1, 16)
    with pytest.raises(ValueError, match="q_len <= kv_len"):
        flash_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="power of two"):
        flash_attention(q, k, v, implementation="pallas_triton", block_sizes=FlashBlockSizes(block_q=24, block_k=16))
    c = flash_cost(batch=1, q_len=10, kv_len=10, num_heads=2, num_kv_heads=1, head_dim=8, itemsize=2, causal=False)
    assert c.flops == 4 * 2 * 100 * 8
