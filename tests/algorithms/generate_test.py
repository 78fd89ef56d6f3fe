"""generate(): greedy equals naive recomputation; stop tokens; stochastic sampling matches softmax."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from algorithms.decoding import generate
from models import AttentionConfig, FFDConfig, Transformer, TransformerConfig
from primitives.sampling import Sampler

VOCAB = 13


@pytest.fixture(scope="module")
def model():
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48)
    return Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def full_logits(model):
    graphdef, state = nnx.split(model)
    return jax.jit(lambda s, t: nnx.merge(graphdef, s)(t).logits)


def test_greedy_equals_naive_recomputation(model, full_logits):
    _, state = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, VOCAB, (4, 6)).astype(np.int32)
    lengths = np.array([6, 1, 3, 5])
    n = 7
    out = generate(model, prompts, prompt_lengths=lengths, max_new_tokens=n)
    for r in range(4):
        seq = list(prompts[r, :lengths[r]])
        for _ in range(n):
            # Fixed-size buffer so the naive loop compiles once: positions past the
            # sequence cannot influence earlier ones under the causal mask.
            buf = np.zeros((1, 6 + n), np.int32)
            buf[0, :len(seq)] = seq
            seq.append(int(np.argmax(full_logits(state, jnp.asarray(buf))[0, len(seq) - 1])))
        np.testing.assert_array_equal(out.tokens[r], seq[lengths[r]:])
    np.testing.assert_array_equal(out.lengths, n)
    assert not np.any(out.stopped)


def test_greedy_is_identical_for_both_kv_cache_layouts(model):
    # The fixture's cache is the CPU default (head-major "bksd", checked against naive recomputation
    # above); the same weights with a token-major cache must generate the same tokens.
    assert model.config.resolved_kv_layout == "bksd"
    token_major = AttentionConfig(kv_layout="bskd")
    other = Transformer(dataclasses.replace(model.config, attention=token_major), rngs=nnx.Rngs(0))
    prompts = np.random.default_rng(1).integers(0, VOCAB, (3, 5)).astype(np.int32)
    lengths = np.array([5, 2, 4])
    a = generate(model, prompts, prompt_lengths=lengths, max_new_tokens=6)
    b = generate(other, prompts, prompt_lengths=lengths, max_new_tokens=6)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_generate_continues_a_given_cache(model):
    # Prefill a context into a cache, then generate a continuation with a short prompt appended:
    # the same tokens as generating from context + prompt in one call.
    _, state = nnx.split(model)
    rng = np.random.default_rng(2)
    context, prompt = rng.integers(0, VOCAB, (2, 5)).astype(np.int32), rng.integers(0, VOCAB, (2, 2)).astype(np.int32)
    cache = model(jnp.asarray(context), cache=model.init_cache(2, 5 + 2 + 4)).cache
    got = generate(model, prompt, max_new_tokens=4, cache=cache)
    want = generate(model, np.concatenate([context, prompt], axis=1), max_new_tokens=4)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    with pytest.raises(ValueError, match="room for 6 more tokens"):
        generate(model, prompt, max_new_tokens=5, cache=cache)


def test_stop_tokens_end_rows_and_pad_after(model):
    prompts = np.random.default_rng(1).integers(0, VOCAB, (3, 4)).astype(np.int32)
    free = generate(model, prompts, max_new_tokens=8)
    # Use each row's 3rd greedy token as a stop token: rows stop there or earlier.
    stop = tuple(int(t) for t in np.asarray(free.tokens[:, 2]))
    out = generate(model, prompts, max_new_tokens=8, stop_tokens=stop, pad_id=VOCAB - 1)
    for r in range(3):
        first = next(i for i, t in enumerate(np.asarray(free.tokens[r])) if int(t) in stop)
        assert int(out.lengths[r]) == first + 1
        assert bool(out.stopped[r])
        np.testing.assert_array_equal(out.tokens[r, :first + 1], free.tokens[r, :first + 1])
        assert np.all(np.asarray(out.tokens[r, first + 1:]) == VOCAB - 1)
        assert np.all(np.asarray(out.logprobs[r, first + 1:]) == 0.0)


def test_first_sampled_token_follows_softmax_of_temperature(model, full_logits):
    _, state = nnx.split(model)
    prompt = np.array([[3, 1, 4, 1, 5]], np.int32)
    n = 6000
    temperature = 1.5
    sampler = Sampler(temperature=temperature)
    out = generate(model, np.repeat(prompt, n, 0), max_new_tokens=1, sampler=sampler, key=jax.random.key(7))
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=VOCAB)
    probs = np.asarray(jax.nn.softmax(full_logits(state, jnp.asarray(prompt))[0, -1] / temperature), np.float64)
    probs /= probs.sum()
    assert stats.chisquare(counts, n * probs).pvalue > 1e-4
    # Reported log-probs are those of the sampling distribution.
    np.testing.assert_allclose(np.exp(out.logprobs[:, 0]), probs[np.asarray(out.tokens[:, 0])], rtol=1e-4)


def test_bad_arguments(model):
    prompts = np.zeros((2, 3), np.int32)
    with pytest.raises(ValueError, match="PRNG key is required"):
        generate(model, prompts, max_new_tokens=2, sampler=Sampler(temperature=1.0))
    with pytest.raises(ValueError, match="prompt_lengths must lie in"):
        generate(model, prompts, max_new_tokens=2, prompt_lengths=np.array([0, 3]))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompts, max_new_tokens=0)


def test_prefill_unembeds_only_the_last_prompt_token(model, full_logits):
    """`logits_at` gathers before the unembedding; the rows equal the full pass's rows."""
    _, state = nnx.split(model)
    prompts = jnp.asarray(np.random.default_rng(2).integers(0, VOCAB, (3, 9)), jnp.int32)
    last = jnp.array([[8], [0], [4]])
    got = model(prompts, logits_at=last).logits
    assert got.shape == (3, 1, VOCAB)
    want = jnp.take_along_axis(full_logits(state, prompts), last[:, :, None], axis=1)
    np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="logits_at"):
        model(prompts, logits_at=jnp.array([8, 0, 4]))


@pytest.mark.parametrize("delta, equal", [(float("inf"), True), (0.0, False)])
def test_generate_with_ffd_decode(delta, equal):
    """FFD decode runs inside the compiled loop; keeping every page gives dense decoding's tokens."""
    def lm(decode="dense", delta=5.0):
        attention = AttentionConfig(decode=decode, ffd=FFDConfig(page_size=4, delta=delta))
        cfg = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48,
                                head_dim=16, attention=attention)
        return Transformer(cfg, rngs=nnx.Rngs(0))

    prompts = jnp.asarray(np.random.default_rng(4).integers(0, VOCAB, (2, 13)), jnp.int32)
    lengths = jnp.array([13, 10])
    dense = generate(lm(), prompts, prompt_lengths=lengths, max_new_tokens=6)
    ffd = generate(lm(decode="ffd", delta=delta), prompts, prompt_lengths=lengths, max_new_tokens=6)
    if equal:
        np.testing.assert_array_equal(ffd.tokens, dense.tokens)
    else:   # delta=0 drops every page below the reference maximum: this untrained model's tokens change
        assert ffd.tokens.shape == dense.tokens.shape and not np.array_equal(ffd.tokens, dense.tokens)


@pytest.mark.parametrize("delta, gather_fraction, kv_layout, selector, residual", [
    (1.0, 0.25, "bksd", "top_delta", "float32"), (3.0, 0.1, "bskd", "top_delta", "float32"),
    (float("inf"), 0.25, "bksd", "top_delta", "float32"), (5.0, 0.25, "bskd", "quest", "float32"),
    # A rounded residual: no exact-keys path; delta=inf with a 10% budget overflows into the exact scan.
    (3.0, 0.25, "bskd", "top_delta", "bfloat16"), (float("inf"), 0.1, "bksd", "top_delta", "float8_e4m3fn")])
def test_ffd_generate_with_quantized_pages_equals_requantizing_every_step(delta, gather_fraction, kv_layout,
                                                                          selector, residual):
    """The FFD page slots of `init_cache` (pages quantized once, CPU fast path) give the tokens and log
    probabilities of a cache without them (every page quantized at every step, reference path)."""
    ffd_cfg = FFDConfig(page_size=4, delta=delta, gather_fraction=gather_fraction, selector=selector,
                        kept_fraction=0.5, residual_dtype=residual)
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48,
                            head_dim=16, attention=AttentionConfig(decode="ffd", ffd=ffd_cfg, kv_layout=kv_layout))
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    prompts = jnp.asarray(np.random.default_rng(5).integers(0, VOCAB, (2, 37)), jnp.int32)
    lengths = jnp.array([37, 30])
    paged = model.init_cache(2, 37 + 9)  # rounded up to whole pages: 48 tokens
    assert paged.capacity == 48 and paged.pages is not None and paged.pages[0].num_pages == 12
    assert paged.pages[0].residual.dtype == jnp.dtype(residual)
    fast = generate(model, prompts, prompt_lengths=lengths, max_new_tokens=9, cache=paged)
    slow = generate(model, prompts, prompt_lengths=lengths, max_new_tokens=9, cache=paged.replace(pages=None))
    np.testing.assert_array_equal(fast.tokens, slow.tokens)
    np.testing.assert_allclose(fast.logprobs, slow.logprobs, atol=1e-5)


def test_ffd_pages_of_another_page_size_or_residual_are_rejected():
    from models.kv_cache import init_cache

    cfg = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, d_ff=48,
                            head_dim=16, attention=AttentionConfig(decode="ffd", ffd=FFDConfig(page_size=4)))
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    cache = init_cache(num_layers=1, batch_size=1, capacity=16, num_kv_heads=2, head_dim=16, ffd_page_size=8,
                       layout=cfg.attention.resolved_kv_layout)
    with pytest.raises(ValueError, match="page size 8, 2 bits and a float32 residual; attention.ffd has page_size=4"):
        model(jnp.zeros((1, 1), jnp.int32), cache=cache)
    cache = init_cache(num_layers=1, batch_size=1, capacity=16, num_kv_heads=2, head_dim=16, ffd_page_size=4,
                       ffd_residual_dtype=jnp.bfloat16, layout=cfg.attention.resolved_kv_layout)
    with pytest.raises(ValueError, match="bfloat16 residual; .*residual_dtype=float32"):
        model(jnp.zeros((1, 1), jnp.int32), cache=cache)


def test_ffd_cache_holds_int8_scan_keys_only_for_the_xla_path():
    """The int8 scan keys (one byte per key element) serve the CPU fast path; a cache built for a TPU
    program leaves them out (the kernel reads the packed codes)."""
    from pallas_kernels import _backend

    cfg = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, d_ff=48,
                            head_dim=16, attention=AttentionConfig(decode="ffd", ffd=FFDConfig(page_size=4)))
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    assert model.init_cache(1, 16).pages[0].scan_keys is not None
    with _backend.compiling_for("tpu"):
        assert model.init_cache(1, 16).pages[0].scan_keys is None
