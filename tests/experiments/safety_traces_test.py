"""The SafeThink world: traces compute the right sums, drift at the configured rate, labels and masks line up."""

import math

import numpy as np
import pytest

from experiments.tasks.safety_traces import HARMFUL, SafetyTraceTask

TASK = SafetyTraceTask()


def test_benign_traces_compute_the_chain_and_score_correct():
    data = TASK.sample(50, seed=1, train=False)
    tok = TASK.tokenizer()
    for prompt, trace, answer in zip(data["prompt"], data["trace"], data["answer"]):
        digits = [int(s) for s in prompt[1:1 + TASK.num_operands]]
        assert answer == sum(digits) % 10
        assert trace[-2:] == ["ANS", str(answer)] and not set(trace) & set(HARMFUL)
        ids = tok.encode(" ".join(trace)) + [tok.eos_id]
        assert TASK.score(np.asarray(ids), len(ids), answer) == (False, True)
        assert TASK.score(np.asarray(ids), len(ids), (answer + 1) % 10) == (False, False)


def test_drift_rate_and_where_it_starts():
    n = 2000
    data = TASK.sample(n, seed=2, jailbreak=True)
    rate = np.mean(data["harmful"])
    assert abs(rate - TASK.drift_rate) < 4 * math.sqrt(TASK.drift_rate * (1 - TASK.drift_rate) / n)
    for trace, harmful in zip(data["trace"], data["harmful"]):
        if harmful:
            first = min(i for i, s in enumerate(trace) if s in HARMFUL)
            assert first // 6 in TASK.drift_steps and first % 6 == 0  # drift replaces whole steps
            assert "ANS" not in trace
    assert not any(TASK.sample(500, seed=3, jailbreak=False)["harmful"])  # benign prompts never drift


def test_recovery_traces_put_the_prefix_at_a_step_start_then_stay_benign():
    data = TASK.sample(3000, seed=4)
    rec = [t for t, r in zip(data["trace"], data["recovery"]) if r]
    assert rec
    for trace in rec:
        i = trace.index("WAIT")
        assert trace[i + 1] == "SAFE" and (i == 0 or trace[i - 1] == ";") and not set(trace) & set(HARMFUL)


def test_train_batch_masks_exactly_the_trace_and_eos():
    batch = TASK.train_batch(0, batch_size=8)
    tok = TASK.tokenizer()
    for i in range(8):
        toks = np.concatenate([batch["inputs"][i, :1], batch["targets"][i]])
        n_prompt = list(toks).index(tok.encode("=")[0])  # BOS .. "=" is the prompt
        eos = list(toks).index(tok.eos_id)
        expected = np.zeros(len(batch["targets"][i]))
        expected[n_prompt:eos] = 1
        np.testing.assert_array_equal(batch["loss_mask"][i], expected)


def test_partial_traces_are_labelled_by_harmful_content():
    traces, lengths, safe = TASK.partial_traces(200, seed=5)
    harmful = set(TASK.harmful_ids.tolist())
    for t, n, s in zip(traces, lengths, safe):
        assert s == (not set(t[:n].tolist()) & harmful)
        assert t[n - 1] in set(TASK.delimiter_ids) | {TASK.tokenizer().eos_id}
    assert 0 < safe.mean() < 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_operands=1), "num_operands must be >= 2"),
    (dict(drift_rate=1.5), "drift_rate must lie in"),
    (dict(drift_steps=(9,)), "drift_steps must be"),
])
def test_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SafetyTraceTask(**kwargs)
