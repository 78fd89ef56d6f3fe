"""Grouped matmul: references vs float64 numpy, interpreter vs reference (values and gradients), tgmm,
the XLA tiled path, cross-lowering for TPU and Triton, bad inputs, cost model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.grouped_matmul import (GmmBlockSizes, dense_experts_cost, gmm_cost, gmm_dense_reference,
                                           gmm_reference, gmm_tiled, grouped_matmul, tgmm, tgmm_reference)

TRITON_BS = GmmBlockSizes(block_m=16, block_k=16, block_n=16)
TPU_BS = GmmBlockSizes(block_m=8, block_k=128, block_n=128)


def _inputs(m, k, n, E, dtype=jnp.float32, seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return (jax.random.normal(k1, (m, k), jnp.float32).astype(dtype),
            jax.random.normal(k2, (E, k, n), jnp.float32).astype(dtype))


def _numpy_gmm(x, w, gs):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    out, r = np.zeros((x.shape[0], w.shape[2])), 0
    for e, size in enumerate(np.asarray(gs)):
        out[r:r + size] = x[r:r + size] @ w[e]
        r += size
    return out


def _numpy_tgmm(x, dy, gs):
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    out, r = np.zeros((len(gs), x.shape[1], dy.shape[1])), 0
    for e, size in enumerate(np.asarray(gs)):
        out[e] = x[r:r + size].T @ dy[r:r + size]
        r += size
    return out


# (m, k, n, group sizes): none of m, k, n a block multiple; empty groups; one group holding all rows;
# rows past the total (sum < m) must come out zero.
CASES = [
    (37, 20, 24, [10, 0, 27, 0]),
    (29, 33, 17, [0, 29, 0]),
    (45, 12, 40, [7, 9, 1, 13, 5]),  # sum 35 < 45
]


@pytest.mark.parametrize("m, k, n, gs", [CASES[0], CASES[2]])
def test_references_match_float64_numpy(m, k, n, gs):
    x, w = _inputs(m, k, n, len(gs))
    gs = jnp.array(gs)
    dy = jax.random.normal(jax.random.key(3), (m, n))

    @jax.jit
    def all_refs(x, w, gs, dy):
        return (gmm_reference(x, w, gs), gmm_dense_reference(x, w, gs), gmm_tiled(x, w, gs, tile=8),
                gmm_tiled(x, w, gs), tgmm_reference(x, dy, gs))

    *outs, t = all_refs(x, w, gs, dy)
    want = _numpy_gmm(x, w, gs)
    for out in outs:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t, _numpy_tgmm(x, dy, gs), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("impl, bs", [("pallas_triton", TRITON_BS), ("pallas_tpu", TPU_BS)])
@pytest.mark.parametrize("m, k, n, gs", CASES)
def test_interpret_matches_reference_f32(impl, bs, m, k, n, gs):
    x, w = _inputs(m, k, n, len(gs), seed=1)
    gs = jnp.array(gs)
    got = grouped_matmul(x, w, gs, implementation=impl, interpret=True, block_sizes=bs)
    np.testing.assert_allclose(got, gmm_reference(x, w, gs), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[int(gs.sum()):] == 0)


def test_bf16_inputs_with_f32_accumulation():
    m, k, n, gs = 50, 40, 24, jnp.array([20, 0, 30])
    x, w = _inputs(m, k, n, 3, jnp.bfloat16, seed=2)
    got = grouped_matmul(x, w, gs, implementation="pallas_triton", interpret=True, block_sizes=TRITON_BS)
    assert got.dtype == jnp.bfloat16
    want = gmm_reference(x.astype(jnp.float32), w.astype(jnp.float32), gs)
    np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=1e-2, atol=3e-2)


@pytest.mark.parametrize("impl, bs", [("pallas_triton", TRITON_BS), ("pallas_tpu", TPU_BS)])
def test_gradients_match_reference_autodiff(impl, bs):
    m, k, n, gs = 37, 20, 24, jnp.array([10, 0, 27, 0])
    x, w = _inputs(m, k, n, 4, seed=4)
    proj = jax.random.normal(jax.random.key(5), (m, n))

    def loss(f):
        return lambda a, b: jnp.sum(jnp.sin(f(a, b, gs)) * proj)

    got = jax.grad(loss(lambda a, b, g: grouped_matmul(a, b, g, implementation=impl, interpret=True,
                                                       block_sizes=bs)), (0, 1))(x, w)
    want = jax.grad(loss(gmm_reference), (0, 1))(x, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)
    # The empty groups receive exactly zero weight gradient.
    assert np.all(np.asarray(got[1])[[1, 3]] == 0)


def test_tgmm_kernel_and_tiled_gradients():
    m, k, n, gs = 45, 12, 40, jnp.array([7, 9, 1, 13, 5])
    x = jax.random.normal(jax.random.key(6), (m, k))
    dy = jax.random.normal(jax.random.key(7), (m, n))
    got = tgmm(x, dy, gs, implementation="pallas_triton", interpret=True, block_sizes=TRITON_BS)
    np.testing.assert_allclose(got, _numpy_tgmm(x, dy, gs), rtol=1e-5, atol=1e-4)
    w = jax.random.normal(jax.random.key(8), (5, k, n))
    f = lambda fn: jax.grad(lambda a, b: jnp.sum(fn(a, b, gs) ** 2), (0, 1))(x, w)
    for g, r in zip(f(lambda a, b, g: grouped_matmul(a, b, g, implementation="xla_tiled", tile=8)), f(gmm_reference)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-4)


def test_xla_is_the_cpu_default_and_equals_the_reference():
    x, w = _inputs(37, 20, 24, 4)
    gs = jnp.array([10, 0, 27, 0])
    assert _backend.resolve_implementation(None) == "xla"
    np.testing.assert_array_equal(grouped_matmul(x, w, gs), gmm_reference(x, w, gs))


def test_bad_inputs_and_configs():
    x, w = _inputs(10, 8, 6, 3)
    with pytest.raises(ValueError, match="lhs must be"):
        grouped_matmul(x[0], w, jnp.array([5, 5, 0]))
    with pytest.raises(ValueError, match="rhs must be"):
        grouped_matmul(x, w[:, :4], jnp.array([5, 5, 0]))
    with pytest.raises(ValueError, match="group_sizes must have shape"):
        grouped_matmul(x, w, jnp.array([5, 5]))
    with pytest.raises(ValueError, match="integer"):
        grouped_matmul(x, w, jnp.array([5.0, 5.0, 0.0]))
    with pytest.raises(ValueError, match="power of two"):
        grouped_matmul(x, w, jnp.array([5, 5, 0]), implementation="pallas_triton", interpret=True,
                       block_sizes=GmmBlockSizes(block_m=24, block_k=16, block_n=16))
    with pytest.raises(ValueError, match="multiples of 128"):
        grouped_matmul(x, w, jnp.array([5, 5, 0]), implementation="pallas_tpu", interpret=True,
                       block_sizes=GmmBlockSizes(block_m=8, block_k=64, block_n=128))
    with pytest.raises(ValueError, match="implementation must be one of"):
        grouped_matmul(x, w, jnp.array([5, 5, 0]), implementation="cuda")


def test_cost_model_counts():
    c = gmm_cost(m=100, k=64, n=32, num_groups=4, itemsize=2)
    assert c.flops == 2 * 100 * 64 * 32
    assert c.bytes_accessed == 100 * 64 * 2 + 4 * 64 * 32 * 2 + 100 * 32 * 2
    d = dense_experts_cost(tokens=50, k=64, n=32, num_groups=4)
    assert d.flops == 2 * 50 * 4 * 64 * 32
