"""The constructed induction LM: it retrieves with dense decoding at 2k and 8k tokens, its heads attend
where the construction says (read from the verification pass's exact score rows), it is deterministic
and fingerprinted; and the span-copy task's layout."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.decoding import generate
from experiments.tasks.span_copy import SpanCopyTask
from models.induction import NUM_SPECIAL, QUERY, InductionSpec, fingerprint, induction_lm


@pytest.fixture(scope="module")
def plain():
    return induction_lm(InductionSpec())


@pytest.fixture(scope="module")
def records():
    return induction_lm(InductionSpec(record_size=16))


@pytest.mark.parametrize("context_len, batch", [(2048, 4), (8192, 1)])
def test_dense_greedy_copies_the_span(plain, context_len, batch):
    """Acceptance: dense retrieval >= 95% exact match at 2k and 8k (the construction gives 100%)."""
    p = SpanCopyTask().prompts(1, batch_size=batch, context_len=context_len, answer_len=12)
    out = generate(plain, jnp.asarray(p["prompts"]), max_new_tokens=12)
    assert (np.asarray(out.tokens) == p["answers"]).mean() >= 0.95


def test_record_model_copies_across_record_boundaries(records):
    p = SpanCopyTask(record_size=16).prompts(2, batch_size=2, context_len=2048, answer_len=24)
    out = generate(records, jnp.asarray(p["prompts"]), max_new_tokens=24)   # crosses one record boundary
    assert (np.asarray(out.tokens) == p["answers"]).mean() >= 0.95


def _weights(model, prompts):
    """Softmax weights [L, b, h, S] of the last prompt token over the prompt, from the exact score rows."""
    b, t = prompts.shape
    out = model(prompts, cache=model.init_cache(b, t), score_rows=(t - 1,))
    tau = 1.0 / math.sqrt(model.config.resolved_head_dim)
    s, lse = out.intermediates["attn_scores"][:, :, :, 0], out.intermediates["attn_lse"][..., -1]
    return np.asarray(jnp.exp(tau * s - lse[..., None]))


def test_heads_attend_where_the_construction_says(records):
    task = SpanCopyTask(record_size=16)
    p = task.prompts(3, batch_size=2, context_len=512, answer_len=4)
    w = _weights(records, jnp.asarray(p["prompts"]))
    t = p["prompts"].shape[1]
    # The weights are exp(logit - lse) at logits near 521 (previous-token head) and 64 (induction head),
    # where float32's spacing is 6.1e-5 and 7.6e-6: one ulp of difference in lse (it moves with the CPU's
    # vector width and XLA's flags) reads as a weight 1 -+ one spacing. The construction's 20-nat margins put
    # the true weights within 1e-8 of 1; five spacings is the tolerance.
    for row in range(2):
        assert w[0, row, 0, t - 2] > 1 - 5 * 6.1e-5                      # previous-token head: the QUERY token
        assert w[1, row, 0, p["source"][row] + 1] > 1 - 5 * 7.6e-6       # induction head: the token after x
        # record head: uniform over x's record (up to 16 positions from x's earlier occurrence; the last
        # record may be cut by QUERY) and x itself at the end
        rec = np.arange(p["source"][row], min(p["source"][row] + 16, t - 2))
        np.testing.assert_allclose(w[1, row, 1, rec], 1 / (len(rec) + 1), rtol=0.05)
        assert w[1, row, 1, rec].sum() + w[1, row, 1, t - 1] > 1 - 1e-4


def test_construction_is_deterministic_and_fingerprinted(plain):
    assert fingerprint(induction_lm(InductionSpec())) == fingerprint(plain)
    assert fingerprint(induction_lm(InductionSpec(seed=1))) != fingerprint(plain)
    assert len(fingerprint(plain)) == 12


@pytest.mark.parametrize("kwargs, match", [
    ({"vocab_size": 3}, "vocab_size"),
    ({"record_size": -1}, "record_size"),
    ({"code_dim": 100}, "code_dim"),
    ({"head_dim": 32}, "head_dim"),
])
def test_spec_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InductionSpec(**kwargs)


def test_span_copy_layout():
    for R in (0, 8):
        task = SpanCopyTask(vocab_size=600, record_size=R, seed=3)
        p = task.prompts(0, batch_size=3, context_len=300, answer_len=10)
        for row, src, ans in zip(p["prompts"], p["source"], p["answers"]):
            items = row[1:-2]
            assert len(np.unique(items)) == len(items) and items.min() >= NUM_SPECIAL
            assert row[-2] == QUERY and row[-1] == row[src]
            np.testing.assert_array_equal(row[src + 1:src + 11], ans)
            if R:   # x opens a record; records are whole id blocks
                assert (src - 1) % R == 0
                np.testing.assert_array_equal(np.sort(row[src:src + R]) - NUM_SPECIAL,
                                              (row[src] - NUM_SPECIAL) // R * R + np.arange(R))
    with pytest.raises(ValueError, match="distinct items"):
        SpanCopyTask(vocab_size=100).prompts(0, batch_size=1, context_len=200, answer_len=4)
    with pytest.raises(ValueError, match="answer_len"):
        SpanCopyTask().prompts(0, batch_size=1, context_len=8, answer_len=4)
