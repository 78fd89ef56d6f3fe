"""Vegas selection math and the speculative acceptance rules: dense references, invariants, chi-square."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from algorithms.decoding import vegas
from primitives import speculative as spec


def _rows(seed=0, L=2, H=4, R=2, N=64, d=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, H, R, d)).astype(np.float32)
    k = rng.standard_normal((L, H, N, d)).astype(np.float32)
    return jnp.asarray(q), jnp.asarray(k)


def test_weight_importance_is_the_mean_softmax_row_of_a_dense_reference():
    q, k = _rows()
    scale = 0.25
    s = jnp.einsum("lhrd,lhnd->lhrn", q, k)
    lse = jax.nn.logsumexp(scale * s, axis=-1)
    m = vegas.key_importance(s, lse, scale=scale)
    dense = np.asarray(jax.nn.softmax(scale * np.asarray(s, np.float64), axis=-1)).mean(axis=(1, 2))
    np.testing.assert_allclose(m, dense, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m.sum(-1), 1.0, rtol=1e-5)  # each row's weights sum to 1 over all keys


def test_masked_keys_get_zero_weight_and_logit_mode_averages_visible_scores():
    q, k = _rows(1)
    s = jnp.einsum("lhrd,lhnd->lhrn", q, k).at[..., 50:].set(-jnp.inf)
    lse = jax.nn.logsumexp(0.25 * s, axis=-1)
    m = vegas.key_importance(s, lse, scale=0.25)
    assert float(m[..., 50:].max()) == 0.0
    logit = vegas.key_importance(s, lse, scale=0.25, mode="logit")
    np.testing.assert_allclose(logit[..., :50], np.asarray(s)[..., :50].mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)


def test_score_rows_edge_cases():
    assert vegas.score_rows(5) == (0, 4)
    assert vegas.score_rows(1) == (0,)
    assert vegas.score_rows(3, "all") == (0, 1, 2)
    assert vegas.score_rows(4, "last_accepted", accepted=2) == (2,)
    with pytest.raises(ValueError, match="accepted"):
        vegas.score_rows(4, "last_accepted")


@pytest.mark.parametrize("seqlen,valid,ratio,mn,mx,want", [
    (1000, 995, 0.05, 16, None, 50), (1000, 995, 0.01, 16, None, 16), (1000, 995, 0.5, 16, 100, 100),
    (1000, 10, 0.05, 16, None, 10), (100, 100, 1.0, 0, None, 100),
])
def test_budget_clamps(seqlen, valid, ratio, mn, mx, want):
    assert int(vegas.sparse_budget(seqlen, valid, ratio=ratio, min_tokens=mn, max_tokens=mx)) == want


@pytest.mark.parametrize("valid_len,budget", [(90, 10), (5, 10), (64, 64), (100, 0)])
def test_selection_invariants(valid_len, budget):
    rng = np.random.default_rng(2)
    m = jnp.asarray(rng.random((3, 100)).astype(np.float32))
    idx, ok = vegas.select_keys(m, valid_len, budget, max_budget=64)
    for row in range(3):
        chosen = np.asarray(idx[row])[np.asarray(ok[row])]
        assert len(chosen) == min(budget, valid_len, 64)
        assert len(set(chosen.tolist())) == len(chosen) and np.all(chosen < valid_len)
        rest = np.setdiff1d(np.arange(valid_len), chosen)
        if len(chosen) and len(rest):
            assert np.asarray(m[row])[chosen].min() >= np.asarray(m[row])[rest].max()


def test_draft_step_reads_exactly_budget_plus_recent_keys():
    m = jnp.asarray(np.random.default_rng(3).random((2, 128)).astype(np.float32))
    idx, ok = vegas.select_keys(m, 100, 12, max_budget=16)
    recent0 = 3  # accepted tokens + bonus after valid_len
    for i in range(4):  # draft step i has produced i drafts so far
        mask = vegas.draft_key_mask(idx, ok, 100, 100 + recent0 + i, 128)
        assert mask.shape == (2, 128)
        np.testing.assert_array_equal(mask.sum(-1), 12 + recent0 + i)
        assert bool(mask[:, 100:100 + recent0 + i].all())


def test_streaming_and_quest_drafters_keep_the_budget():
    keep = vegas.streaming_keep(100, 20, 128, sink=4)
    assert int(keep.sum()) == 20 and bool(keep[:4].all()) and bool(keep[84:100].all()) and not bool(keep[100:].any())
    rng = np.random.default_rng(4)
    keys = jnp.asarray(rng.standard_normal((128, 2, 16)).astype(np.float32))
    q = jnp.asarray(rng.standard_normal((4, 16)).astype(np.float32))
    lo, hi = vegas.page_bounds(keys, 100, 16)
    kept = vegas.quest_keep(q, lo, hi, 100, 32, page_size=16, capacity=128)
    assert int(kept.sum()) <= 32 and not bool(kept[100:].any())
    # The bound is an upper bound of every key's score in the page (Quest's premise).
    qg = np.asarray(q).reshape(2, 2, 16)
    scores = np.einsum("kgd,nkd->nkg", qg, np.asarray(keys))[:96].reshape(6, 16, 2, 2).max(axis=1)
    bound = np.maximum(qg[None] * np.asarray(lo)[:6, :, None], qg[None] * np.asarray(hi)[:6, :, None]).sum(-1)
    assert np.all(bound >= scores - 1e-5)


@pytest.mark.parametrize("layout", ["bskd", "bksd"])
def test_quest_drafter_reads_either_cache_layout_and_lists_the_quest_keep_pages(layout):
    from models.kv_cache import KVCache

    rng = np.random.default_rng(7)
    L, b, n, kh, g, d, ps = 2, 3, 40, 2, 2, 8, 4
    keys = rng.standard_normal((L, b, n, kh, d)).astype(np.float32)  # token-major
    valid_len = jnp.asarray([40, 23, 9], jnp.int32)
    budget = jnp.asarray([8, 6, 5], jnp.int32)
    stored = [jnp.asarray(k if layout == "bskd" else np.swapaxes(k, 1, 2)) for k in keys]
    cache = KVCache(keys=stored, values=stored, lengths=valid_len, layout=layout)
    info = vegas.VerifyInfo(None, None, (0,), None, valid_len, valid_len, budget, cache)
    drafter = vegas.QuestDrafter(vegas.Budget(ratio=0.25, min_tokens=1), page_size=ps)
    selection = drafter.refresh(info, scale=1.0)
    q = jnp.asarray(rng.standard_normal((b, kh * g, d)).astype(np.float32))
    for layer in range(L):
        idx, ok = drafter.select(selection, layer, q, jnp.asarray(keys[layer]))
        for r in range(b):
            lo, hi = vegas.page_bounds(jnp.asarray(keys[layer, r]), int(valid_len[r]), ps)
            want = vegas.quest_keep(q[r], lo, hi, int(valid_len[r]), int(budget[r]), page_size=ps, capacity=n)
            got = np.zeros(n, bool)
            got[np.asarray(idx[r])[np.asarray(ok[r])]] = True
            np.testing.assert_array_equal(got, want)


def test_greedy_acceptance_is_the_longest_matching_prefix():
    logits = jnp.asarray(np.random.default_rng(5).standard_normal((5, 10)).astype(np.float32))
    best = np.asarray(jnp.argmax(logits, -1))
    a, y = spec.greedy_accept(jnp.asarray(best[:4]), logits)
    assert (int(a), int(y)) == (4, best[4])  # all accepted: the bonus token
    drafts = best[:4].copy()
    drafts[2] = (drafts[2] + 1) % 10
    a, y = spec.greedy_accept(jnp.asarray(drafts), logits)
    assert (int(a), int(y)) == (2, best[2])


def test_speculative_sampling_first_token_follows_the_target_distribution():
    # Tiny vocabulary, fixed target p and a different drafter q; chi-square over 20 000 seeds.
    rng = np.random.default_rng(6)
    p = jax.nn.softmax(jnp.asarray(rng.standard_normal((3, 8)) * 1.5, jnp.float32))
    q = jax.nn.softmax(jnp.asarray(rng.standard_normal((2, 8)) * 1.5, jnp.float32))
    n = 20_000

    def one(key):
        kd, ka = jax.random.split(key)
        drafts = jax.random.categorical(kd, jnp.log(q))  # [2]
        a, y = spec.speculative_accept(ka, drafts, q, p)
        return jnp.where(a > 0, drafts[0], y), a

    first, accepted = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), n))  # compiled, as in decoding
    counts = np.bincount(np.asarray(first), minlength=8)
    probs = np.asarray(p[0], np.float64)
    expected = probs / probs.sum() * n
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # Acceptance of the first draft has probability sum_x min(p, q).
    rate = float(np.mean(np.asarray(accepted) > 0))
    want = float(jnp.minimum(p[0], q[0]).sum())
    assert abs(rate - want) < 4 * np.sqrt(want * (1 - want) / n)


def test_a_rejected_draft_is_replaced_only_by_a_token_the_residual_allows():
    # Tokens with q >= p have zero residual (p - q)+ and must never be drawn after a rejection. Under jit on
    # jaxlib 0.11's CPU backend a subnormal floor in the resampling logits turned them into NaN and drew them.
    p = jnp.array([[0.5, 0.3, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = jnp.array([[0.1, 0.1, 0.4, 0.4]])
    n = 4000
    keys = jax.random.split(jax.random.key(3), n)
    drafts = jax.random.categorical(jax.random.key(4), jnp.log(q[0]), shape=(n, 1))
    a, y = jax.jit(jax.vmap(spec.speculative_accept, in_axes=(0, 0, None, None)))(keys, drafts, q, p)
    rejected = np.asarray(a) == 0
    assert 0.2 * n < rejected.sum() < n  # the draft is rejected often
    assert set(np.asarray(y)[rejected].tolist()) <= {0, 1}  # residual (.4, .2, 0, 0) / .6


def test_identical_drafter_accepts_everything():
    p = jax.nn.softmax(jnp.asarray(np.random.default_rng(7).standard_normal((4, 8)), jnp.float32))
    drafts = jnp.array([1, 2, 3])
    a, _ = spec.speculative_accept(jax.random.key(1), drafts, p[:3], p)
    assert int(a) == 3


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="drafts must be"):
        spec.greedy_accept(jnp.zeros(3, jnp.int32), jnp.zeros((3, 5)))
    with pytest.raises(ValueError, match="draft_probs"):
        spec.speculative_accept(jax.random.key(0), jnp.zeros(2, jnp.int32), jnp.zeros((3, 5)), jnp.zeros((3, 5)))
    with pytest.raises(ValueError, match="ratio"):
        vegas.sparse_budget(10, 10, ratio=0.0)
