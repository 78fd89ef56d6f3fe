"""Vegas experiment internals: the metrics of `measure` on a case with a known answer, the traced budget
sweep on the record workload, and config checks."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.decoding import generate
from experiments import vegas as exp
from experiments.tasks.span_copy import SpanCopyTask
from models.induction import InductionSpec, induction_lm


@pytest.fixture(scope="module")
def record_case():
    model = induction_lm(InductionSpec(vocab_size=512, record_size=8))
    p = SpanCopyTask(vocab_size=512, record_size=8).prompts(0, batch_size=2, context_len=120, answer_len=8)
    prompts = jnp.asarray(p["prompts"])
    return model, prompts, np.asarray(generate(model, prompts, max_new_tokens=8).tokens), p["answers"]


def test_full_budget_accepts_every_draft_and_reads_are_counted(record_case):
    model, prompts, reference, answers = record_case
    np.testing.assert_array_equal(reference, answers)           # the model retrieves
    smoke = exp.EXPERIMENT.config("smoke")
    c = dataclasses.replace(smoke, draft=dataclasses.replace(smoke.draft, min_tokens=4096))
    gamma = 3
    m = exp.measure(c, model, prompts, reference, exp._drafter(c, "streaming", 0.05), gamma)
    assert m["lossless"]
    assert m["tokens_per_iteration"] == gamma + 1          # budget >= cache: drafts equal the target
    np.testing.assert_allclose(m["acceptance_at"], 1.0)
    # plain decoding reads P + i keys for its i-th token; one speculative iteration reads more per token
    # than a draft step would alone, so the modeled speedup of a dense "draft" is below 1
    assert exp._ar_reads(10, 3) == 10 + 11 + 12
    assert 0 < m["modeled_speedup"] < 1


def test_vegas_finds_the_queried_record_and_streaming_does_not(record_case):
    """On the record workload the verification rows point at the whole queried record, so Vegas's drafts
    are accepted inside it; a sink + recent window never contains it."""
    model, prompts, reference, _ = record_case
    c = exp.EXPERIMENT.config("smoke")
    got = {name: exp.measure(c, model, prompts, reference, exp._drafter(c, name, 0.1), 3, ratio=0.1)
           for name in ("vegas", "streaming")}
    assert got["vegas"]["lossless"] and got["streaming"]["lossless"]
    print({k: v["tokens_per_iteration"] for k, v in got.items()})
    assert got["vegas"]["tokens_per_iteration"] > 1.5 * got["streaming"]["tokens_per_iteration"]


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match=r"ablate\.variants must be among .*got unknown \['middle'\]"):
        exp.Config(ablate=exp.AblateSection(variants=("first_last", "middle")))
    with pytest.raises(ValueError, match=r"draft\.main_ratio must be one of draft\.ratios=.*; got 0\.3"):
        exp.Config(draft=exp.DraftSection(main_ratio=0.3))
    with pytest.raises(ValueError, match=r"draft\.main_gamma must be one of draft\.gammas=\(2, 4, 6\); got 3"):
        exp.Config(draft=exp.DraftSection(main_gamma=3))
    with pytest.raises(ValueError, match=r"lm\.workloads must be among .*got unknown \['poem'\]"):
        exp.Config(lm=exp.LMSection(workloads=("copy", "poem")))
    with pytest.raises(ValueError, match=r"ablate\.ratio must be <= max\(draft\.ratios\) = 0\.2; got 0\.5"):
        exp.Config(ablate=exp.AblateSection(ratio=0.5))
    with pytest.raises(ValueError, match=r"decode\.new_tokens must be >= 4"):
        exp.Config(decode=exp.DecodeSection(new_tokens=3))
