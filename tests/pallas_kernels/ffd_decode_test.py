"""FFD kernel: interpreter vs the jnp reference (same selection), split invariance, cross-lowering."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ffd_decode import FFDBlockSizes, ffd_cost, ffd_decode
from primitives import ffd as ref


def _problem(b, kh, g, d, s, lengths, page_size, seed=0, bits=2, residual_dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (b, kh * g, d))
    keys = jax.random.normal(kk, (b, s, kh, d))
    keys = keys.at[:, 2 * page_size:3 * page_size].add(2.0 * q.reshape(b, kh, g, d).mean(2)[:, None])  # needle
    values = jax.random.normal(kv, (b, s, kh, d))
    cache = ref.build_cache(keys, values, jnp.array(lengths), page_size=page_size, bits=bits,
                            residual_dtype=residual_dtype)
    return q, keys, values, cache


# (impl shell, kh, g, d, s, lengths, page size, bits, splits): lengths not page multiples.
CASES = [
    ("pallas_triton", 2, 3, 64, 150, [150, 61, 0], 16, 2, 3),
    ("pallas_tpu", 1, 4, 16, 100, [100, 8, 77], 8, 4, 2),
    ("pallas_triton", 2, 1, 64, 96, [96, 95, 40], 16, 2, 1),
    # TPU's manual-DMA shell with pages dropped, a sequence without a full page and splits left empty
    ("pallas_tpu", 2, 2, 64, 150, [150, 61, 0], 16, 2, 4),
]


@pytest.mark.parametrize("impl, kh, g, d, s, lengths, page_size, bits, splits, delta",
                         [case + (delta,) for case, delta in zip(CASES, (2.0, math.inf, 2.0, 0.5))])
def test_interpret_matches_reference_and_makes_the_same_selection(impl, kh, g, d, s, lengths, page_size, bits,
                                                                  splits, delta):
    q, _, _, cache = _problem(3, kh, g, d, s, lengths, page_size, bits=bits)
    want = ref.ffd_decode(q, cache, delta=delta)
    got = ffd_decode(q, cache, delta=delta, implementation=impl, interpret=True,
                     block_sizes=FFDBlockSizes(num_splits=splits))
    np.testing.assert_array_equal(got.keep, want.keep)
    np.testing.assert_allclose(got.out, want.out, atol=1e-5)
    np.testing.assert_allclose(got.lse, want.lse, atol=1e-5)
    assert np.all(np.isfinite(np.asarray(got.out)))


def test_split_count_does_not_change_the_result():
    q, _, _, cache = _problem(1, 2, 2, 64, 160, [100], 16, seed=1)  # 6 full pages: 16 splits leave some empty
    outs = [ffd_decode(q, cache, delta=3.0, implementation="pallas_triton", interpret=True,
                       block_sizes=FFDBlockSizes(num_splits=n)) for n in (1, 4, 16)]
    for o in outs[1:]:
        np.testing.assert_allclose(o.out, outs[0].out, atol=1e-6)
        np.testing.assert_array_equal(o.keep, outs[0].keep)


@pytest.mark.parametrize("impl", ["pallas_triton", "pallas_tpu"])
def test_fp8_residual_and_no_residual_paths_match_reference(impl):
    q, _, _, cache = _problem(1, 1, 2, 64, 48, [40], 16, seed=2, residual_dtype=jnp.float8_e4m3fn)
    for use_residual in (True, False):
        want = ref.ffd_decode(q, cache, delta=4.0, use_residual=use_residual)
        got = ffd_decode(q, cache, delta=4.0, use_residual=use_residual, implementation=impl,
                         interpret=True, block_sizes=FFDBlockSizes(num_splits=2))
        np.testing.assert_array_equal(got.keep, want.keep)
        np.testing.assert_allclose(got.out, want.out, atol=1e-5)


def test_xla_path_is_the_reference_and_the_cpu_default():
    q, _, _, cache = _problem(2, 1, 2, 16, 64, [64, 20], 16, seed=3)
    got = ffd_decode(q, cache, delta=5.0)
    np.testing.assert_allclose(got.out, ref.ffd_decode(q, cache, delta=5.0).out, atol=1e-6)  # jit vs eager


def test_bad_configs_raise():
    q, _, _, cache = _problem(1, 1, 2, 16, 32, [32], 8)
    with pytest.raises(ValueError, match="Triton needs"):
        ffd_decode(q, cache, implementation="pallas_triton", interpret=True)
    with pytest.raises(ValueError, match="num_splits"):
        FFDBlockSizes(num_splits=0)
    with pytest.raises(ValueError, match="delta"):
        ffd_decode(q, cache, delta=-1.0, implementation="pallas_tpu", interpret=True)


def test_cost_model_counts():
    c = ffd_cost(batch=1, tokens=1024, num_heads=8, num_kv_heads=2, head_dim=64, page_size=128, kept=0.25,
                 residual_itemsize=1, v_itemsize=2)
    elems = 1024 * 2 * 64
    assert c.flops == 2 * 8 * 1024 * 64 * (1 + 2 * 0.25)
    assert c.bytes_accessed == elems / 4 + 8 * 2 * 64 * 4 + 0.25 * elems * 3 + 2 * 8 * 64 * 4


def test_tpu_default_splits_keep_a_split_s_pages_within_scoped_vmem():
    """A TPU program holds its split's codes and scales in VMEM (the residual and values stay in HBM).
    At batch 8, 8 KV heads and 524k tokens in pages of 128 (4096 pages), the program-count default (2
    splits) would put 2048 pages' blocks in one program, beyond the scoped-VMEM budget; with the page's
    VMEM given, the default splits until a split's pages fit. Without it (other backends) the default is
    unchanged. (When every page's residual and values were VMEM blocks too, 2 splits at 32k tokens
    already took 20.12 MiB on v5e, limit 16 MiB.)"""
    from pallas_kernels import _backend
    from pallas_kernels.ffd_decode import api, config

    s, pages = 524288, 4096
    sd = jax.ShapeDtypeStruct
    cache = jax.eval_shape(lambda k, v, n: ref.build_cache(k, v, n, page_size=128, residual_dtype=jnp.bfloat16),
                           sd((8, s, 8, 128), jnp.bfloat16), sd((8, s, 8, 128), jnp.bfloat16), sd((8,), jnp.int32))
    plain = config.FFDBlockSizes.default(num_pages=pages, batch=8, kv_heads=8)
    assert plain.num_splits == 2
    per_page = api._tpu_page_bytes(cache)
    assert per_page == 2 * (32 * 128 + 128 * 4)  # codes [32, 128] uint8 + the page's row of [pps, 128] f32 scales
    bs = config.FFDBlockSizes.default(num_pages=pages, batch=8, kv_heads=8, page_vmem_bytes=per_page)
    assert bs.num_splits > plain.num_splits
    assert -(-pages // bs.num_splits) * per_page <= _backend.TPU_BLOCK_VMEM_BUDGET
    assert -(-pages // (bs.num_splits // 2)) * per_page > _backend.TPU_BLOCK_VMEM_BUDGET  # the fewest that fit
