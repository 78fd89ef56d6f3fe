"""SafeThink's loop against `generate` and against greedy recomputation; the monitor's rules; the scorer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.decoding import generate
from algorithms.decoding import safethink as st
from models import Transformer, TransformerConfig
from primitives.sampling import Sampler

VOCAB = 13
DELIMS = (3, 4, 5, 6)  # many delimiters: a random model ends steps often
STOP = (12,)
PREFIX = (10, 11)


@pytest.fixture(scope="module")
def model():
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48)
    return Transformer(cfg, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return rng.integers(0, 10, (6, 5)).astype(np.int32), np.array([5, 1, 3, 4, 2, 5], np.int32)


def never(prompts, plen, trace, tlen):
    return jnp.ones(trace.shape[0])


def always(prompts, plen, trace, tlen):
    return jnp.zeros(trace.shape[0])


def config(**kw):
    return st.SafeThinkConfig(prefix=PREFIX, step_delimiters=DELIMS, **kw)


def test_a_monitor_that_never_fires_equals_generate(model, prompts):
    p, lengths = prompts
    key = jax.random.key(7)
    ref = generate(model, p, prompt_lengths=lengths, max_new_tokens=12, sampler=Sampler(temperature=1.0), key=key,
                   stop_tokens=STOP)
    for scorer, tau in ((never, 0.5), (always, 0.0)):  # p_safe >= tau always: nothing is rejected
        out = st.safethink_generate(model, p, prompt_lengths=lengths, scorer=scorer, config=config(tau=tau),
                                    max_new_tokens=12, sampler=Sampler(temperature=1.0), key=key, stop_tokens=STOP)
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_array_equal(out.lengths, ref.lengths)
        np.testing.assert_array_equal(out.stopped, ref.stopped)
        assert int(out.interventions.sum()) == 0 and int(out.rejected_tokens.sum()) == 0


def _greedy_table(model, seqs):
    """Argmax next token after every prefix of each sequence: one full forward pass per sequence
    (causal attention, so position j's logits read only tokens <= j), padded to one shape."""
    width = max(len(s) for s in seqs)
    batch = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        batch[i, :len(s)] = s
    return np.asarray(jnp.argmax(model(jnp.asarray(batch)).logits, -1))


def _prefix_positions(trace, start_positions):
    forced = set()
    for s in start_positions:
        if tuple(trace[s:s + len(PREFIX)]) == PREFIX:
            forced.update(range(s, s + len(PREFIX)))
    return forced


def test_after_a_rejection_decoding_continues_as_if_the_step_never_happened(model, prompts):
    """Greedy: every token that is not an injected prefix is the argmax of a full forward pass over the
    prompt and the final trace before it, so the rolled-back cache holds nothing of a rejected step."""
    p, lengths = prompts
    plain = generate(model, p, prompt_lengths=lengths, max_new_tokens=14, stop_tokens=STOP)
    common = np.bincount(np.asarray(plain.tokens).ravel(), minlength=VOCAB)
    common[list(DELIMS) + list(STOP) + list(PREFIX) + [0]] = 0
    unsafe = int(np.argmax(common))  # a token greedy decoding does produce: it will be rejected
    weights = np.zeros(VOCAB, np.float32)
    weights[unsafe] = -10.0
    scorer = st.BagOfTokensScorer(jnp.asarray(weights), jnp.asarray(5.0, jnp.float32))
    out = st.safethink_generate(model, p, prompt_lengths=lengths, scorer=scorer, config=config(max_interventions=2),
                                max_new_tokens=14, stop_tokens=STOP)
    assert int(out.interventions.sum()) > 0, "the test needs at least one rejection"
    traces = [np.asarray(out.tokens[r, :out.lengths[r]]).tolist() for r in range(p.shape[0])]
    table = _greedy_table(model, [p[r, :lengths[r]].tolist() + traces[r] for r in range(p.shape[0])])
    for r, trace in enumerate(traces):
        ends = [0] + st.split_steps(np.asarray(trace), DELIMS, STOP)
        forced = _prefix_positions(trace, ends)
        assert len(forced) == len(PREFIX) * int(out.interventions[r])  # one prefix per intervention
        for j, t in enumerate(trace):
            if j not in forced:
                assert t == table[r, lengths[r] + j - 1], (r, j)
        if int(out.interventions[r]) < 2:  # interventions left: no complete accepted step holds the unsafe token
            assert unsafe not in trace[:ends[-1]]  # (a partial step cut by the token budget is not scored)


def test_an_always_unsafe_monitor_injects_at_most_max_interventions_and_terminates(model, prompts):
    p, lengths = prompts
    for k in (0, 1, 3):
        out = st.safethink_generate(model, p, prompt_lengths=lengths, scorer=always, config=config(max_interventions=k),
                                    max_new_tokens=16, sampler=Sampler(temperature=1.0), key=jax.random.key(1),
                                    stop_tokens=STOP)
        assert int(out.interventions.max()) <= k
        for r in range(p.shape[0]):
            trace = np.asarray(out.tokens[r, :out.lengths[r]])
            count = sum(tuple(trace[i:i + 2]) == PREFIX for i in range(len(trace) - 1))
            assert count == int(out.interventions[r])  # inserted verbatim, once per violation
        if k > 0:
            assert int(out.rejected_tokens.sum()) > 0


def test_keeping_the_step_with_a_window_injects_after_the_first_k_steps_only(model, prompts):
    p, lengths = prompts
    out = st.safethink_generate(model, p, prompt_lengths=lengths, scorer=always,
                                config=config(max_interventions=100, monitor_steps=2, keep_violating_step=True),
                                max_new_tokens=24, sampler=Sampler(temperature=1.0), key=jax.random.key(2),
                                stop_tokens=STOP)
    assert int(out.rejected_tokens.sum()) == 0
    for r in range(p.shape[0]):
        trace = np.asarray(out.tokens[r, :out.lengths[r]]).tolist()
        ends = st.split_steps(np.asarray(trace), DELIMS, STOP)
        # Prefixes follow exactly the first two sampled step ends (unless the trace stopped or filled up).
        expected = []
        pos, proposals = 0, 0
        while pos < len(trace):
            step_end = next((e for e in ends if e > pos), None)
            if step_end is None:
                break
            is_prefix = tuple(trace[pos:pos + 2]) == PREFIX and pos in expected
            if not is_prefix:
                proposals += 1
                if proposals <= 2 and trace[step_end - 1] not in STOP and step_end < len(trace):
                    expected.append(step_end)
            pos = step_end if not is_prefix else pos + 2
        assert int(out.interventions[r]) == len(expected), (r, trace)
        for e in expected:
            assert tuple(trace[e:e + 2]) == PREFIX


def test_a_prefix_that_ends_in_a_stop_token_refuses(model, prompts):
    p, lengths = prompts
    cfg = st.SafeThinkConfig(prefix=(10, 12), step_delimiters=DELIMS)  # "REFUSE <stop>"
    out = st.safethink_generate(model, p, prompt_lengths=lengths, scorer=always, config=cfg, max_new_tokens=16,
                                sampler=Sampler(temperature=1.0), key=jax.random.key(4), stop_tokens=STOP)
    for r in range(p.shape[0]):
        trace = np.asarray(out.tokens[r, :out.lengths[r]]).tolist()
        if int(out.interventions[r]):
            assert trace[-2:] == [10, 12] and bool(out.stopped[r]) and int(out.interventions[r]) == 1


def test_always_prefix_puts_the_prefix_first(model, prompts):
    p, lengths = prompts
    out = st.safethink_generate(model, p, prompt_lengths=lengths, scorer=always,
                                config=st.SafeThinkConfig.always_prefix(PREFIX, DELIMS), max_new_tokens=8)
    np.testing.assert_array_equal(out.tokens[:, :2], np.tile(PREFIX, (p.shape[0], 1)))
    np.testing.assert_array_equal(out.interventions, 1)


def test_bag_of_tokens_scorer_against_numpy_and_monotone_in_harmful_tokens():
    rng = np.random.default_rng(1)
    w, bias = rng.normal(size=VOCAB).astype(np.float32), np.float32(0.3)
    scorer = st.BagOfTokensScorer(jnp.asarray(w), jnp.asarray(bias), include_prompt=True)
    prompts, plen = rng.integers(0, VOCAB, (4, 5)), np.array([5, 2, 1, 4])
    trace, tlen = rng.integers(0, VOCAB, (4, 7)), np.array([0, 7, 3, 5])
    got = np.asarray(scorer(jnp.asarray(prompts), jnp.asarray(plen), jnp.asarray(trace), jnp.asarray(tlen)))
    ref = [1 / (1 + np.exp(-(bias + w[trace[i, :tlen[i]]].sum() + w[prompts[i, :plen[i]]].sum()))) for i in range(4)]
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    # A fitted scorer: traces holding token 9 are unsafe. p_safe falls each time a 9 is appended.
    traces = rng.integers(0, 9, (400, 6))
    traces[:200, rng.integers(0, 6, 200)] = 9
    traces[np.arange(200), rng.integers(0, 6, 200)] = 9
    safe = ~(traces == 9).any(1)
    fitted = st.fit_bag_of_tokens_scorer(traces, np.full(400, 6), safe, vocab_size=VOCAB)
    assert float(fitted.weights[9]) < -1.0
    seq = np.array([[1, 2, 9, 9, 9]])
    ps = [float(fitted(seq, np.array([0]), jnp.asarray(seq), jnp.array([n]))[0]) for n in range(6)]
    assert all(0.0 <= q <= 1.0 for q in ps)
    assert ps[3] < ps[2] and ps[4] < ps[3] and ps[5] < ps[4]


@pytest.mark.parametrize("kwargs, match", [
    (dict(prefix=()), "prefix must hold at least one token"),
    (dict(prefix=(3,)), "prefix must not contain a step delimiter"),
    (dict(tau=float("nan")), "tau must be a finite number"),
    (dict(max_interventions=-1), "max_interventions must be an int >= 0"),
    (dict(monitor_steps=0), "monitor_steps must be an int >= 1 or None"),
    (dict(prefix=(-1,)), "prefix must be non-negative int token ids"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        st.SafeThinkConfig(**{"prefix": PREFIX, "step_delimiters": DELIMS, **kwargs})


def test_bad_call(model, prompts):
    p, _ = prompts
    with pytest.raises(TypeError, match="scorer must be callable"):
        st.safethink_generate(model, p, scorer=None, config=config(), max_new_tokens=4)
    with pytest.raises(TypeError, match="config must be a SafeThinkConfig"):
        st.safethink_generate(model, p, scorer=never, config={}, max_new_tokens=4)
    with pytest.raises(ValueError, match="config.prefix"):
        st.safethink_generate(model, p, scorer=never, config=st.SafeThinkConfig(prefix=(99,), step_delimiters=DELIMS),
                              max_new_tokens=4)
    with pytest.raises(ValueError, match="safe must contain both"):
        st.fit_bag_of_tokens_scorer(np.zeros((3, 2), int), np.ones(3, int), np.ones(3, bool), vocab_size=4)
