"""Quest page selection (`primitives.quest`) against brute force on tiny inputs."""

import jax.numpy as jnp
import numpy as np
import pytest

from primitives import quest


def _brute_bounds(keys, page_size, valid_len):
    """Per-page min/max over the valid keys by a Python loop: keys [n, d] -> [P, d]."""
    n, d = keys.shape
    p = -(-n // page_size)
    lo, hi = np.full((p, d), np.inf), np.full((p, d), -np.inf)
    for t in range(min(n, valid_len)):
        lo[t // page_size] = np.minimum(lo[t // page_size], keys[t])
        hi[t // page_size] = np.maximum(hi[t // page_size], keys[t])
    return lo, hi


def _argsort_keep(scores, n):
    """numpy reference: the n best finite scores (ties: lower index) as a mask."""
    order = np.argsort(-np.where(np.isfinite(scores), scores, -np.inf), kind="stable")
    keep = np.zeros(scores.shape, bool)
    keep[order[:n]] = True
    return keep & np.isfinite(scores)


@pytest.mark.parametrize("n, page_size, valid_len", [(12, 4, 12), (13, 4, 9), (7, 3, 1), (5, 8, 5), (6, 1, 4)])
def test_bounds_are_the_brute_force_min_max_and_bound_every_score(n, page_size, valid_len):
    rng = np.random.default_rng(n * 10 + page_size)
    keys = rng.standard_normal((2, n, 4)).astype(np.float32)  # [k, n, d]
    lo, hi = quest.page_bounds(jnp.asarray(keys), page_size=page_size, valid_len=valid_len)
    p = -(-n // page_size)
    assert lo.shape == hi.shape == (2, p, 4)
    for h in range(2):
        want_lo, want_hi = _brute_bounds(keys[h], page_size, valid_len)
        np.testing.assert_array_equal(lo[h], want_lo)
        np.testing.assert_array_equal(hi[h], want_hi)
    # The bound is >= every true q.k of the page, and equals the max when the page holds one key.
    q = rng.standard_normal((5, 2, 1, 4)).astype(np.float32)  # 5 queries per KV head
    s = np.asarray(quest.page_scores(jnp.asarray(q), lo, hi))  # [5, 2, P]
    for t in range(min(n, valid_len)):
        exact = np.einsum("qkd,kd->qk", q[:, :, 0], keys[:, t])
        assert np.all(s[:, :, t // page_size] >= exact - 1e-5)
    empty = np.arange(p) * page_size >= valid_len
    assert np.all(np.isneginf(s[..., empty])) and np.all(np.isfinite(s[..., ~empty]))
    if page_size == 1:
        exact = np.einsum("qkd,knd->qkn", q[:, :, 0], keys)[..., :valid_len]
        np.testing.assert_allclose(s[..., :valid_len], exact, rtol=1e-5, atol=1e-5)


def test_per_row_valid_len_and_default_match_the_scalar_calls():
    rng = np.random.default_rng(0)
    keys = jnp.asarray(rng.standard_normal((3, 10, 2)).astype(np.float32))
    vl = np.array([10, 4, 7])
    lo, hi = quest.page_bounds(keys, page_size=4, valid_len=jnp.asarray(vl))
    for i in range(3):
        lo_i, hi_i = quest.page_bounds(keys[i], page_size=4, valid_len=int(vl[i]))
        np.testing.assert_array_equal(lo[i], lo_i)
        np.testing.assert_array_equal(hi[i], hi_i)
    # Without valid_len every key counts and the padding of a partial last page does not.
    np.testing.assert_array_equal(quest.page_bounds(keys, page_size=4)[0], quest.page_bounds(keys, page_size=4,
                                                                                           valid_len=10)[0])


@pytest.mark.parametrize("seed", range(4))
def test_selection_equals_a_numpy_argsort_reference(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(-3, 4, (4, 9)).astype(np.float32)  # integer scores: many ties
    scores[rng.random((4, 9)) < 0.2] = -np.inf  # pages without a valid key
    counts = rng.integers(0, 11, 4)
    keep = np.asarray(quest.select_pages(jnp.asarray(scores), jnp.asarray(counts)))
    idx, ok = quest.top_pages(jnp.asarray(scores), 6, jnp.asarray(counts))
    idx, ok = np.asarray(idx), np.asarray(ok)
    for r in range(4):
        want = _argsort_keep(scores[r], counts[r])
        np.testing.assert_array_equal(keep[r], want)
        order = np.argsort(-scores[r], kind="stable")[:6]
        np.testing.assert_array_equal(idx[r], order)
        np.testing.assert_array_equal(ok[r], (np.arange(6) < counts[r]) & np.isfinite(scores[r][order]))
        if counts[r] <= 6:  # the listed pages are the selected ones
            assert set(idx[r][ok[r]].tolist()) == set(np.flatnonzero(want).tolist())
    # A static count and an explicit validity mask.
    valid = rng.random((4, 9)) < 0.7
    keep = np.asarray(quest.select_pages(jnp.asarray(scores), 3, valid=jnp.asarray(valid)))
    for r in range(4):
        masked = np.where(valid[r], scores[r], -np.inf)
        order = np.argsort(-masked, kind="stable")[:3]
        want = np.zeros(9, bool)
        want[order] = True
        np.testing.assert_array_equal(keep[r], want & valid[r])


def test_bad_arguments_are_named():
    keys = jnp.zeros((2, 8, 4))
    with pytest.raises(ValueError, match="page_size"):
        quest.page_bounds(keys, page_size=0)
    with pytest.raises(ValueError, match="keys must be"):
        quest.page_bounds(jnp.zeros(4), page_size=2)
    with pytest.raises(ValueError, match="valid_len must broadcast"):
        quest.page_bounds(keys, page_size=2, valid_len=jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="same shape"):
        quest.page_scores(jnp.zeros(4), jnp.zeros((2, 4)), jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match="share d"):
        quest.page_scores(jnp.zeros(3), jnp.zeros((2, 4)), jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match="num_pages must be >= 0"):
        quest.select_pages(jnp.zeros(4), -1)
    with pytest.raises(ValueError, match="max_pages"):
        quest.top_pages(jnp.zeros(4), 0)
