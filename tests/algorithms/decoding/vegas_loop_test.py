"""The Vegas self-speculative decoding loop on the decoder LM: losslessness, full-budget acceptance,
the verification / draft hooks of `models.Transformer`, and the sampling distribution by chi-square."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
import scipy.special
from scipy import stats

from algorithms.decoding import generate, vegas
from models import SparseDecode, Transformer, TransformerConfig
from primitives.sampling import Sampler

CFG = TransformerConfig(vocab_size=32, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64)


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def prompts():
    tokens = jax.random.randint(jax.random.key(1), (3, 40), 0, CFG.vocab_size)
    return tokens, jnp.array([40, 31, 17], jnp.int32)


@pytest.fixture(scope="module")
def greedy_reference(model, prompts):
    tokens, lengths = prompts
    return np.asarray(generate(model, tokens, max_new_tokens=16, prompt_lengths=lengths).tokens)


SMALL = vegas.Budget(ratio=0.1, min_tokens=3)
DRAFTERS = {
    "vegas": vegas.VegasDrafter(SMALL),
    "vegas_logit_all": vegas.VegasDrafter(SMALL, score_mode="logit", rows="all"),
    "vegas_last_accepted": vegas.VegasDrafter(SMALL, rows="last_accepted"),
    "streaming": vegas.StreamingDrafter(SMALL, sink=2),
    "quest": vegas.QuestDrafter(SMALL, page_size=4),
    "random": vegas.RandomDrafter(vegas.Budget(ratio=0.3, min_tokens=1), seed=3),
}


@pytest.mark.parametrize("name,gamma", [("vegas", 1), ("vegas", 4), ("vegas_logit_all", 3),
                                        ("vegas_last_accepted", 3), ("streaming", 2), ("quest", 3),
                                        ("random", 5)])
def test_greedy_output_equals_plain_greedy_for_any_drafter(model, prompts, greedy_reference, name, gamma):
    tokens, lengths = prompts
    out = vegas.speculative_generate(model, tokens, max_new_tokens=16, drafter=DRAFTERS[name], gamma=gamma,
                                     prompt_lengths=lengths)
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference)
    it = np.asarray(out.iterations)
    assert (np.asarray(out.emitted) >= 15).all() and (np.asarray(out.accepted_at) <= it[:, None]).all()
    # Acceptance at position i needs acceptance at every earlier position.
    assert (np.diff(np.asarray(out.accepted_at), axis=1) <= 0).all()


def test_full_budget_accepts_every_draft(model, prompts, greedy_reference):
    tokens, lengths = prompts
    gamma = 3
    out = vegas.speculative_generate(model, tokens, max_new_tokens=16, drafter=vegas.VegasDrafter(
        vegas.Budget(ratio=1.0, min_tokens=1)), gamma=gamma, prompt_lengths=lengths)
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference)
    it = np.asarray(out.iterations)
    np.testing.assert_array_equal(np.asarray(out.accepted_at), np.repeat(it[:, None], gamma, 1))
    np.testing.assert_array_equal(it, np.full(3, 4))  # 15 tokens after the first, gamma + 1 = 4 per iteration


def _prefilled(model, tokens, n):
    cache = model.init_cache(tokens.shape[0], 64)
    return model(tokens[:, :n], cache=cache).cache


def test_draft_step_with_every_key_listed_equals_the_dense_decode_step(model, prompts):
    tokens, _ = prompts
    cache = _prefilled(model, tokens, 30)
    everything = jnp.broadcast_to(jnp.arange(64, dtype=jnp.int32), (3, 64))
    sparse = SparseDecode(lambda layer, q, keys: (everything, everything < 27), jnp.full((3,), 27), 4)
    dense = model(tokens[:, 30:31], cache=cache).logits
    drafted = model(tokens[:, 30:31], cache=cache, sparse_decode=sparse).logits
    np.testing.assert_allclose(drafted, dense, atol=1e-5)
    # Listing nothing but the recent range changes the step (the hook really restricts the keys).
    none = SparseDecode(lambda layer, q, keys: (everything, everything < 0), jnp.full((3,), 27), 4)
    assert float(jnp.abs(model(tokens[:, 30:31], cache=cache, sparse_decode=none).logits - dense).max()) > 1e-3


def test_verification_hook_returns_softmax_score_rows_and_unchanged_logits(model, prompts):
    tokens, _ = prompts
    cache = _prefilled(model, tokens, 30)
    block = tokens[:, 30:35]
    plain = model(block, cache=cache)
    out = model(block, cache=cache, score_rows=(0, 4))
    np.testing.assert_allclose(out.logits, plain.logits, atol=1e-6)
    scores, lse = out.intermediates["attn_scores"], out.intermediates["attn_lse"]
    assert scores.shape == (2, 3, 4, 2, 64) and lse.shape == (2, 3, 4, 5)
    scale = CFG.resolved_head_dim ** -0.5
    w = jnp.exp(scale * scores - lse[..., jnp.array([0, 4])][..., None])
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert bool(jnp.isneginf(scores[..., 0, 31:]).all()) and bool(jnp.isneginf(scores[..., 1, 35:]).all())
    assert bool(jnp.isfinite(scores[..., 1, :35]).all())


def test_hook_misuse_is_rejected(model, prompts):
    tokens, _ = prompts
    with pytest.raises(ValueError, match="need a KV cache"):
        model(tokens, score_rows=(0,))
    cache = _prefilled(model, tokens, 30)
    sparse = SparseDecode(lambda l, q, k: None, jnp.zeros((3,), jnp.int32), 2)
    with pytest.raises(ValueError, match="one-token"):
        model(tokens[:, 30:32], cache=cache, sparse_decode=sparse)
    with pytest.raises(ValueError, match="gamma"):
        vegas.speculative_generate(model, tokens, max_new_tokens=2, drafter=DRAFTERS["vegas"], gamma=0)
    with pytest.raises(ValueError, match="key"):
        vegas.speculative_generate(model, tokens, max_new_tokens=2, drafter=DRAFTERS["vegas"],
                                   sampler=Sampler(temperature=1.0))
    with pytest.raises(ValueError, match="drafter must define"):
        vegas.speculative_generate(model, tokens, max_new_tokens=2, drafter=object())
    with pytest.raises(ValueError, match="Budget.ratio"):
        vegas.Budget(ratio=0.0)


def test_sampled_tokens_follow_the_target_distribution():
    """Joint law of the first two emitted tokens (the second goes through draft + rejection sampling)."""
    v = 8
    cfg = TransformerConfig(vocab_size=v, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32,
                            init_std=1.0)
    model = Transformer(cfg, rngs=nnx.Rngs(4))
    prompt = jax.random.randint(jax.random.key(5), (1, 12), 0, v)
    n = 6000
    out = vegas.speculative_generate(model, jnp.repeat(prompt, n, 0), max_new_tokens=3, gamma=2,
                                     drafter=vegas.StreamingDrafter(vegas.Budget(ratio=0.1, min_tokens=1), sink=1),
                                     sampler=Sampler(temperature=1.0), key=jax.random.key(6))
    y = np.asarray(out.tokens[:, :2])
    assert int(np.asarray(out.accepted_at).sum()) < int(np.asarray(out.iterations).sum()) * 2  # rejections happen
    seqs = jnp.concatenate([jnp.repeat(prompt, v, 0), jnp.arange(v)[:, None]], axis=1)
    p1 = scipy.special.softmax(np.asarray(model(prompt).logits[0, -1], np.float64))
    p2 = scipy.special.softmax(np.asarray(model(seqs).logits[:, -1], np.float64), axis=-1)  # [y1, y2]
    expected = (p1[:, None] * p2).ravel() * n
    observed = np.bincount(y[:, 0] * v + y[:, 1], minlength=v * v)
    keep = expected > 5  # chi-square validity; pool the rest into one cell
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    exp *= obs.sum() / exp.sum()
    assert stats.chisquare(obs, exp).pvalue > 1e-3


@pytest.mark.parametrize("name", ["vegas", "streaming", "quest"])
def test_traced_budget_ratio_equals_a_drafter_built_with_that_ratio(model, prompts, name):
    """`budget_ratio` below the drafter's static maximum selects exactly what a drafter of that ratio
    selects (same tokens, iterations and reads), and a sweep of ratios reuses one compilation."""
    tokens, lengths = prompts
    make = {"vegas": lambda b: vegas.VegasDrafter(b), "streaming": lambda b: vegas.StreamingDrafter(b, sink=2),
            "quest": lambda b: vegas.QuestDrafter(b, page_size=4)}[name]
    wide = make(vegas.Budget(ratio=0.5, min_tokens=3))
    before = vegas._speculative._cache_size()
    for ratio in (0.1, 0.25):
        got = vegas.speculative_generate(model, tokens, max_new_tokens=12, drafter=wide, gamma=3,
                                         prompt_lengths=lengths, budget_ratio=ratio)
        want = vegas.speculative_generate(model, tokens, max_new_tokens=12, gamma=3, prompt_lengths=lengths,
                                          drafter=make(vegas.Budget(ratio=ratio, min_tokens=3)))
        for field in ("tokens", "iterations", "accepted_at", "kv_read"):
            np.testing.assert_array_equal(np.asarray(getattr(got, field)), np.asarray(getattr(want, field)))
    assert vegas._speculative._cache_size() - before == 3     # one for `wide`, one per narrow drafter
    with pytest.raises(ValueError, match="budget_ratio"):
        vegas.speculative_generate(model, tokens, max_new_tokens=4, drafter=wide, budget_ratio=0.6)
