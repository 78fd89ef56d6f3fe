"""Grouped matmul: references vs float64 numpy, interpreter vs reference (values and gradients), tgmm,
the XLA tiled path, the TPU shell's visit lists and VMEM-bounded default tiling, cross-lowering for TPU
and Triton, bad inputs, cost model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.grouped_matmul import (GmmBlockSizes, dense_experts_cost, gmm_cost, gmm_dense_reference,
                                           gmm_reference, gmm_tiled, grouped_matmul, tgmm, tgmm_reference)
from pallas_kernels.grouped_matmul.api import gmm_visits, tgmm_visits

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


# TPU shell: several k and n tiles (the contraction is a grid axis accumulated in VMEM scratch), empty
# groups first, inside and last, a group spanning many row tiles, a row tile holding three groups, rows
# past the total.
TPU_MULTI = (60, 260, 140, [0, 5, 2, 30, 0, 9, 0])  # sum 46 < 60


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-4), (jnp.bfloat16, 3e-2)])
def test_tpu_shell_multi_tile_forward_and_gradients_vs_float64(dtype, tol):
    m, k, n, gs = TPU_MULTI
    x, w = _inputs(m, k, n, len(gs), dtype, seed=9)
    gs = jnp.array(gs)
    proj = jax.random.normal(jax.random.key(10), (m, n))
    f = lambda a, b: grouped_matmul(a, b, gs, implementation="pallas_tpu", interpret=True, block_sizes=TPU_BS)
    out, vjp = jax.vjp(f, x, w)
    assert out.dtype == dtype
    scale = np.sqrt(k)  # products of k unit normals
    np.testing.assert_allclose(np.asarray(out, np.float64) / scale, _numpy_gmm(x, w, gs) / scale, rtol=tol, atol=tol)
    assert np.all(np.asarray(out)[int(gs.sum()):] == 0)
    d_x, d_w = vjp(proj.astype(dtype))
    # d_lhs = proj @ w[g]^T on each group's rows (zero past the total); d_rhs[e] = x_e^T proj_e.
    x64, w64, p64 = (np.asarray(a, np.float64) for a in (x, w, proj.astype(dtype)))
    want_dx = _numpy_gmm(p64, np.swapaxes(w64, 1, 2), gs)
    np.testing.assert_allclose(np.asarray(d_x, np.float64) / np.sqrt(n), want_dx / np.sqrt(n), rtol=tol, atol=tol)
    want_dw = _numpy_tgmm(x64, p64, gs)
    np.testing.assert_allclose(np.asarray(d_w, np.float64) / 6, want_dw / 6, rtol=tol, atol=tol)
    assert np.all(np.asarray(d_w)[[0, 4, 6]] == 0)  # empty groups get exactly zero


@pytest.mark.parametrize("impl, bs", [("pallas_triton", TRITON_BS), ("pallas_tpu", TPU_BS)])
def test_tgmm_kernels_with_empty_groups_and_rows_past_total(impl, bs):
    m, k, n, gs = 45, 140, 130, jnp.array([0, 7, 9, 0, 1, 13, 5, 0])  # sum 35 < 45
    x = jax.random.normal(jax.random.key(11), (m, k))
    dy = jax.random.normal(jax.random.key(12), (m, n))
    got = tgmm(x, dy, gs, implementation=impl, interpret=True, block_sizes=bs)
    np.testing.assert_allclose(got, _numpy_tgmm(x, dy, gs), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("impl, bs", [("pallas_triton", TRITON_BS), ("pallas_tpu", TPU_BS)])
def test_gradients_with_rows_past_the_total(impl, bs):
    m, k, n, gs = CASES[2]
    x, w = _inputs(m, k, n, len(gs), seed=13)
    gs = jnp.array(gs)
    proj = jax.random.normal(jax.random.key(14), (m, n))
    loss = lambda f: lambda a, b: jnp.sum(f(a, b, gs) * proj)
    got = jax.grad(loss(lambda a, b, g: grouped_matmul(a, b, g, implementation=impl, interpret=True,
                                                       block_sizes=bs)), (0, 1))(x, w)
    np.testing.assert_allclose(got[0], _numpy_gmm(proj, np.swapaxes(np.asarray(w), 1, 2), gs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], _numpy_tgmm(x, proj, gs), rtol=1e-5, atol=1e-4)
    assert np.all(np.asarray(got[0])[int(gs.sum()):] == 0)


def _brute_force_pairs(gs, m_tiles, bm):
    """(row tile, group) pairs sharing at least one row, by enumerating rows."""
    pairs, r = set(), 0
    for e, size in enumerate(gs):
        pairs |= {(row // bm, e) for row in range(r, r + size)}
        r += size
    return pairs


@pytest.mark.parametrize("gs, m, bm", [([10, 0, 27, 0], 37, 8), ([0, 0, 0], 16, 8), ([0, 29, 0], 29, 8),
                                       ([3, 0, 0, 4, 1, 0, 8, 0, 0], 40, 8), ([64, 0, 1], 72, 16),
                                       ([5, 3, 2], 24, 8)])
def test_visit_lists_cover_every_pair_once_within_the_static_bound(gs, m, bm):
    m_tiles = -(-m // bm)
    want = _brute_force_pairs(gs, m_tiles, bm)
    offsets = np.concatenate([[0], np.cumsum(gs)])
    for visits, major in ((gmm_visits, 0), (tgmm_visits, 1)):
        arrays = [np.asarray(a) for a in visits(jnp.array(gs, jnp.int32), m_tiles, bm)]
        group, tile, start, end = arrays[:4]
        lhs_tile = arrays[4] if major == 0 else tile  # the row tile whose input blocks are read
        assert group.shape == (m_tiles + len(gs) - 1,)
        real = start < end
        # A visit without rows reads the blocks of the last visit with rows (so no copy is issued).
        for i in np.flatnonzero(~real):
            if real[:i].any():
                j = np.flatnonzero(real[:i])[-1]
                assert lhs_tile[i] == lhs_tile[j] and (major == 1 or group[i] == group[j])
        got = list(zip(tile[real], group[real]))
        assert set(got) == want and len(got) == len(want)
        np.testing.assert_array_equal(start[real], offsets[group[real]])
        np.testing.assert_array_equal(end[real], offsets[group[real] + 1])
        key = (tile, group)[major]
        assert np.all(np.diff(key) >= 0)  # sorted: each output block's visits are consecutive
        assert np.all((0 <= group) & (group < len(gs))) and np.all((0 <= tile) & (tile < m_tiles))
        if major == 0:  # every row tile (also those past the total) is visited, so its output is written
            assert set(tile) == set(range(m_tiles))
        else:  # every group (also the empty ones) is visited, so its gradient is written
            assert set(group) == set(range(len(gs)))


@pytest.mark.parametrize("m, k, n", [(8192, 2048, 5632), (8192, 5632, 2048), (300, 256, 384), (20, 100, 30)])
def test_tpu_default_block_sizes_fit_the_vmem_budget(m, k, n):
    for itemsize in (2, 4):
        bs = GmmBlockSizes.default(m=m, k=k, n=n, implementation="pallas_tpu", itemsize=itemsize)
        bs.validate("pallas_tpu")
        assert bs.tpu_vmem_bytes(itemsize) <= _backend.TPU_BLOCK_VMEM_BUDGET
        # No padding of the weights beyond the 128-lane multiple.
        assert -(-k // 128) * 128 % bs.block_k == 0 and -(-n // 128) * 128 % bs.block_n == 0


@pytest.mark.parametrize("platform", ["tpu", "cuda"], ids=["mosaic", "triton"])  # a bare "tpu" id marks it TPU-only
def test_default_tiling_lowers_forward_and_backward(platform):
    impl = {"tpu": "pallas_tpu", "cuda": "pallas_triton"}[platform]

    def f(x, w, g):
        return jax.value_and_grad(lambda a, b: grouped_matmul(a, b, g, implementation=impl, interpret=False)
                                  .astype(jnp.float32).sum(), (0, 1))(x, w)

    sd = jax.ShapeDtypeStruct
    text = _backend.lower_for(f, sd((1000, 384), jnp.bfloat16), sd((4, 384, 640), jnp.bfloat16),
                              sd((4,), jnp.int32), platform=platform)
    if platform == "tpu":
        assert text.count("tpu_custom_call") == 3
        assert "transpose" not in text.lower()  # the input gradient reads the weight untransposed
    else:
        assert "triton" in text


def test_tpu_shell_with_no_rows():
    x, w, gs = jnp.zeros((0, 20)), jnp.ones((3, 20, 24)), jnp.zeros((3,), jnp.int32)
    f = lambda a, b: grouped_matmul(a, b, gs, implementation="pallas_tpu", interpret=True)
    assert f(x, w).shape == (0, 24)
    d_x, d_w = jax.grad(lambda a, b: f(a, b).sum(), (0, 1))(x, w)
    assert d_x.shape == (0, 20) and np.all(np.asarray(d_w) == 0)
