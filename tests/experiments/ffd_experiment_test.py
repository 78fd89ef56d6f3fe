"""FFD experiment internals: the FFD-configured copy of a model, the prefill + decode loop against
`generate`, delta = inf equals dense decoding, the checks' fields, and config errors."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.decoding import generate
from experiments import ffd as exp
from experiments.tasks.span_copy import SpanCopyTask
from models.induction import InductionSpec, induction_lm

CONTEXT, ANSWER, PAGE = 100, 6, 16


@pytest.fixture(scope="module")
def record_case():
    model = induction_lm(InductionSpec(vocab_size=512, record_size=16))
    p = SpanCopyTask(vocab_size=512, record_size=16).prompts(0, batch_size=2, context_len=CONTEXT, answer_len=ANSWER)
    prompts = jnp.asarray(p["prompts"])
    first, cache = exp.prefill(model, prompts, ANSWER)
    return model, prompts, p["answers"], first, cache


def test_ffd_copy_has_the_same_weights_and_dense_logits(record_case):
    model, prompts, *_ = record_case
    copy = exp.with_decode(model, "ffd", page_size=PAGE, delta=2.0)
    assert copy.config.attention.decode == "ffd" and copy.config.attention.ffd.page_size == PAGE
    assert model.config.attention.decode == "dense"  # the original is untouched
    np.testing.assert_array_equal(np.asarray(copy(prompts).logits), np.asarray(model(prompts).logits))


def test_decode_loop_equals_generate_and_the_model_retrieves(record_case):
    model, prompts, answers, first, cache = record_case
    tokens, kept = exp.decode(model, first, cache, ANSWER - 1)
    np.testing.assert_array_equal(tokens, np.asarray(generate(model, prompts, max_new_tokens=ANSWER).tokens))
    np.testing.assert_array_equal(tokens, answers)
    assert kept.shape == (ANSWER - 1, model.config.num_layers) and np.all(kept == 1.0)  # dense: everything
    ffd = exp.with_decode(model, "ffd", page_size=PAGE, delta=5.0)
    ffd_tokens, ffd_kept = exp.decode(ffd, first, cache, ANSWER - 1)
    np.testing.assert_array_equal(ffd_tokens, np.asarray(generate(ffd, prompts, max_new_tokens=ANSWER).tokens))
    assert np.all((ffd_kept > 0) & (ffd_kept <= 1))


def test_ffd_with_infinite_delta_keeps_every_page_and_decodes_as_dense(record_case):
    model, _, answers, first, cache = record_case
    ffd = exp.with_decode(model, "ffd", page_size=PAGE, delta=math.inf)
    tokens, kept = exp.decode(ffd, first, cache, ANSWER - 1)
    np.testing.assert_array_equal(tokens, answers)
    np.testing.assert_allclose(kept, 1.0)


def test_checks_have_the_fields_and_judge_the_accuracy_rule():
    c = exp.EXPERIMENT.config("smoke")
    row = lambda acc, kept=0.3: {"accuracy": acc, "agreement": 1.0, "kept": kept, "kept_per_layer": [kept, kept]}
    rows = {"dense": row(1.0, 1.0)}
    for d in c.lm.deltas:
        rows |= {f"ffd d={d:g}": row(1.0), f"top_k d={d:g}": row(0.5), f"quest d={d:g}": row(1.0)}
    rows[f"ffd d={c.checks.main_delta:g}"] = row(0.97)  # 3 points below dense: beyond the 2-point tolerance
    checks = exp.workload_checks(c, "record", {"rows": rows, "dense_accuracy": 1.0})
    for ch in checks:
        assert set(ch.as_dict()) == {"name", "measured", "paper", "threshold", "passed", "note", "required"}
    passed = {ch.name: ch.passed for ch in checks}
    assert passed["dense greedy exact match (precondition)"]
    assert not passed["FFD - dense exact match"]
    assert passed["FFD - top-k exact match at equal kept fraction"]
    assert not passed["FFD - Quest exact match at equal kept fraction"]  # 0.97 < 1.0 at the main delta


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="lm.workloads"):
        exp.Config(lm=exp.LMSection(workloads=("copy", "poem")))
    with pytest.raises(ValueError, match="lm.deltas"):
        exp.Config(lm=exp.LMSection(deltas=(2.0, 7.0)))
    with pytest.raises(ValueError, match="lm.answer_len"):
        exp.Config(lm=exp.LMSection(answer_len=1))
    with pytest.raises(ValueError, match="checks.main_delta"):
        dataclasses.replace(exp.Config(), checks=dataclasses.replace(exp.Config().checks, main_delta=4.0))
