"""The shared long-context workloads: the fine-tuning batch layout, the perturbation, and a tiny tuned
workload that resumes from its checkpoint."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import _long_context as lc
from experiments.tasks.span_copy import SpanCopyTask
from models.induction import InductionSpec, fingerprint, induction_lm, perturbed

TINY = lc.TuneConfig(record_size=8, steps=2, batch_size=2, context_len=48, answer_len=6)


def test_tune_batch_scores_exactly_the_answer_tokens():
    task = SpanCopyTask(vocab_size=512, record_size=8)
    b = lc._tune_batch(task, TINY, 3)
    assert b["inputs"].shape == (2, 48 + 6 - 1) and b["at"].shape == b["targets"].shape == (2, 6)
    # position at[i] holds the token before answer i: the prompt's last token, then the answers
    np.testing.assert_array_equal(b["inputs"][:, b["at"][0, 1:]], b["targets"][:, :-1])


def test_perturbation_scales_attention_and_keeps_the_embedding():
    model = induction_lm(InductionSpec(vocab_size=512))
    p = perturbed(model, jax.random.key(0), qk_scale=0.5, noise=0.0)
    np.testing.assert_allclose(p.layers[1].attn.wq[...], 0.5 * model.layers[1].attn.wq[...])
    np.testing.assert_array_equal(p.layers[1].attn.wv[...], model.layers[1].attn.wv[...])
    noisy = perturbed(model, jax.random.key(0), noise=0.1)
    np.testing.assert_array_equal(noisy.embed[...], model.embed[...])
    assert fingerprint(noisy) == fingerprint(perturbed(model, jax.random.key(0), noise=0.1)) != fingerprint(p)
    with pytest.raises(ValueError, match="qk_scale"):
        perturbed(model, jax.random.key(0), qk_scale=0.0)


def test_tuned_workload_trains_and_resumes(tmp_path):
    w = lc.build(["tuned"], vocab_size=512, record_size=8, tune=TINY, workdir=tmp_path)["tuned"]
    again = lc.build(["tuned"], vocab_size=512, record_size=8, tune=TINY, workdir=tmp_path)["tuned"]
    assert w.fingerprint == again.fingerprint                  # loaded from the checkpoint, same weights
    assert any(tmp_path.glob("tuned-*")) and "fine-tuned 2 steps" in w.description
    with pytest.raises(ValueError, match="workloads"):
        lc.build(["poem"], vocab_size=512, record_size=8, tune=TINY, workdir=None)
