"""FFD dispatcher and gathered fast path: equal to the masked reference whenever the capacity suffices."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.decoding import ffd
from primitives import ffd as ref


def _problem(b=2, kh=2, g=2, d=16, s=160, lengths=(160, 75), page_size=16, bits=2, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (b, kh * g, d))
    keys = jax.random.normal(kk, (b, s, kh, d))
    keys = keys.at[:, 3 * page_size:4 * page_size].add(2.0 * q.reshape(b, kh, g, d).mean(2)[:, None])  # needle
    values = jax.random.normal(kv, (b, s, kh, d))
    lengths = jnp.array(lengths)
    return q, keys, values, lengths, ref.build_cache(keys, values, lengths, page_size=page_size, bits=bits)


PROBLEM = _problem()


@pytest.mark.parametrize("bits, chunk", [(2, 1), (2, 5), (4, None)])
def test_chunked_scan_maxima_equal_the_reference(bits, chunk):
    q, *_, cache = _problem(bits=bits) if bits != 2 else PROBLEM
    want = ref.page_maxima(ref.scan_scores(q, cache), cache)
    got = ref.chunked_page_maxima(q, cache, chunk_pages=chunk)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(np.where(np.isfinite(want), got, 0), np.where(np.isfinite(want), want, 0), atol=1e-5)


@pytest.mark.parametrize("delta", [0.5, 3.0, math.inf])
def test_gathered_equals_reference_when_capacity_suffices(delta):
    q, *_, cache = PROBLEM
    want = ref.ffd_decode(q, cache, delta=delta)
    kept = int(jnp.max(jnp.sum(want.keep, -1)))
    got = ffd.decode(q, cache, delta=delta, capacity=max(kept, 1))
    np.testing.assert_array_equal(got.keep, want.keep)
    np.testing.assert_allclose(got.out, want.out, atol=1e-5)
    np.testing.assert_allclose(got.lse, want.lse, atol=1e-5)
    np.testing.assert_array_equal(got.overflow, 0)
    np.testing.assert_allclose(got.threshold, want.threshold, atol=1e-5)


def test_overflow_drops_the_lowest_pages_and_is_counted():
    q, *_, cache = PROBLEM
    sel = ffd.select_pages(q, cache, delta=math.inf)  # every valid page selected
    got = ffd.gathered_decode(q, cache, sel, capacity=3)
    np.testing.assert_array_equal(got.overflow, np.sum(sel.keep, -1) - np.minimum(np.sum(sel.keep, -1), 3))
    assert np.all(np.sum(got.keep, -1) == np.minimum(np.sum(sel.keep, -1), 3))
    assert not np.any(got.keep & ~sel.keep)
    # The attended pages are the best three by scan maximum, and the output is their exact attention.
    want_keep = ref._top_pages(sel.page_max, cache.valid_pages[:, None, :], 3)
    np.testing.assert_array_equal(got.keep, want_keep)
    np.testing.assert_allclose(got.out, ref.sparse_decode(q, cache, want_keep).out, atol=1e-5)


@pytest.mark.parametrize("selector, reference", [("top_k", ref.top_k_keep), ("quest", ref.quest_keep)])
def test_budget_selectors_match_the_reference_selectors(selector, reference):
    q, *_, cache = PROBLEM
    n = ffd.pages_for_fraction(cache, 0.3)
    got = ffd.decode(q, cache, selector=selector, num_pages=n, capacity=n)
    want_keep = reference(q, cache, n)
    np.testing.assert_array_equal(got.keep, want_keep)
    np.testing.assert_allclose(got.out, ref.sparse_decode(q, cache, want_keep).out, atol=1e-5)


def test_fast_ffd_decode_is_the_reference_selection_and_output():
    q, *_, cache = PROBLEM
    want = ref.ffd_decode(q, cache, delta=2.0)
    got = ref.fast_ffd_decode(q, cache, delta=2.0)
    np.testing.assert_array_equal(got.keep, want.keep)
    np.testing.assert_allclose(got.out, want.out, atol=1e-5)


def test_all_pages_is_dense_attention_and_every_implementation_agrees():
    q, keys, values, lengths, cache = PROBLEM
    dense = ref.dense_decode(q, keys, values, lengths)
    for impl in ffd.IMPLEMENTATIONS:
        out = ffd.decode(q, cache, delta=math.inf, implementation=impl).out
        np.testing.assert_allclose(out, dense, atol=1e-5, err_msg=impl)
    np.testing.assert_allclose(ffd.decode(q, cache, selector="all").out, dense, atol=1e-5)


def test_empty_and_one_page_caches_give_finite_outputs():
    q, *_, cache = _problem(lengths=(0, 7))  # no full page anywhere
    out = ffd.decode(q, cache, delta=5.0, capacity=2)
    assert np.all(np.isfinite(np.asarray(out.out)))
    np.testing.assert_array_equal(out.out[0], 0.0)
    assert not np.any(out.keep)


def test_bad_arguments_name_themselves():
    q, *_, cache = PROBLEM
    with pytest.raises(ValueError, match="selector must be one of"):
        ffd.decode(q, cache, selector="random")
    with pytest.raises(ValueError, match="needs num_pages"):
        ffd.select_pages(q, cache, selector="top_k")
    with pytest.raises(ValueError, match="implementation must be one of"):
        ffd.decode(q, cache, implementation="cuda")
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        ffd.decode(q, cache, capacity=0)
    with pytest.raises(ValueError, match="chunk_pages must be a positive divisor"):
        ref.chunked_page_maxima(q, cache, chunk_pages=7)
    with pytest.raises(ValueError, match="fraction must be in"):
        ffd.pages_for_fraction(cache, 1.5)
    with pytest.raises(ValueError, match="kernel' fuses"):
        ffd.decode(q, cache, selector="quest", num_pages=2, implementation="kernel")
