"""The calculus-work generator and the calculus_grading experiment.

The generator's planted truth (errors -> lost rubric lines) is checked against the rubric-following
grader reading the clean answers (two independent routes to the same grade); rewrites must not change
a grade; OCR artefacts behave as documented; the experiment's protocol returns a perfect AI grader as
perfect and rejects bad configs naming the field.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from algorithms.agents import calculus_grading as cg
from experiments import calculus_grading as E
from experiments import registry
from experiments.tasks import calculus_work as cw


@pytest.fixture(scope="module")
def subs():
    return cw.CalculusWorkTask(num_students=120, problems_per_template=2, error_rate=0.35, seed=3).submissions()


def test_rubric_grader_on_clean_answers_recovers_planted_truth(subs):
    grader = cg.RubricGrader(policy="strict")
    rng = np.random.default_rng(0)
    for s in subs:
        g = grader(s.item, rng=rng)
        assert g.awards == s.true_awards, (s.item.answer, s.errors, g.feedback)
        assert g.lost_lines == s.true_lost and not g.deferred
        assert s.true_total == sum(s.true_awards) and s.item.max_points == 10.0
        assert ("final" in s.true_lost) == bool(s.errors)
    # Every applicable error type of every template was planted somewhere.
    planted = {(s.problem.template, e) for s in subs for e in s.errors}
    applicable = {(t, e) for t, errs in cw._ERROR_LINES.items() for e in errs}
    assert planted == applicable


def test_each_error_loses_exactly_its_line():
    rng = np.random.default_rng(1)
    for t in cw.TEMPLATES:
        for _ in range(5):
            prob = cw.make_problem(t, rng)
            clean = cw.write_answer(cw.student_steps(prob, (), rng), rng)
            item = cg.GradingItem("x", prob.statement, prob.reference_solution, prob.rubric, clean)
            assert cg.RubricGrader()(item, rng=rng).total == 10.0
            for e in prob.errors:
                text = cw.write_answer(cw.student_steps(prob, (e,), rng), rng, rewrite_rate=0.0)
                g = cg.RubricGrader()(dataclasses.replace(item, answer=text), rng=rng)
                assert set(g.lost_lines) == {cw.error_line(t, e), "final"}, (t, e, text)


def test_rewrites_are_equivalent():
    rng = np.random.default_rng(2)
    for t in cw.TEMPLATES:
        prob = cw.make_problem(t, rng)
        steps = cw.student_steps(prob, prob.errors[:1], rng)
        for _ in range(10):
            text = cw.write_answer(steps, rng, rewrite_rate=1.0)
            parsed = {k: cg.parse_expression(v) for k, v in cg.parse_answer(text).items()}
            assert parsed == steps, text


def test_ocr_corrupt(subs):
    rng = np.random.default_rng(4)
    texts = [s.item.answer for s in subs[:200]]
    assert [cw.ocr_corrupt(x, rng, step_rate=0.0) for x in texts] == texts
    unreadable = [cg.parse_answer(cw.ocr_corrupt(x, rng, step_rate=1.0, misread_fraction=0.0)) for x in texts]
    fails = [_fails(v) for steps in unreadable for v in steps.values()]
    assert np.mean(fails) > 0.9
    misread = [(cg.parse_answer(x), cg.parse_answer(cw.ocr_corrupt(x, rng, step_rate=1.0, misread_fraction=1.0)))
               for x in texts]
    pairs = [(a[k], b[k]) for a, b in misread for k in a]
    assert np.mean([not _fails(b) for _, b in pairs]) > 0.9
    assert all(a != b for a, b in pairs)
    with pytest.raises(ValueError, match="step_rate must lie in"):
        cw.ocr_corrupt("F = x", rng, step_rate=2.0)


def _fails(text):
    try:
        cg.parse_expression(text)
        return False
    except cg.ExpressionSyntaxError:
        return True


def test_task_bad_input_names_argument():
    with pytest.raises(ValueError, match="template must be one of"):
        cw.make_problem("limit", np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"error_rate must lie in \(0, 1\), got 1.5"):
        cw.CalculusWorkTask(error_rate=1.5)
    prob = cw.make_problem("definite", np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"errors \['sign_slip'\] do not apply"):
        cw.student_steps(prob, ("sign_slip",), np.random.default_rng(0))


def test_experiment_noiseless_ai_grader_is_perfect(tmp_path):
    smoke = E.EXPERIMENT.config("smoke")
    cfg = dataclasses.replace(smoke, ai=dataclasses.replace(smoke.ai, ocr_step_rate=0.0, flip_rate=0.0),
                              quiz=dataclasses.replace(smoke.quiz, num_students=30),
                              sweep=E.SweepSection(ocr_rates=(0.0,)),
                              protocol=dataclasses.replace(smoke.protocol, num_replicates=2))
    out = E.run(cfg, tmp_path)
    m = out["metrics"]
    assert m["ai_vs_truth"]["exact"] == 1.0 and m["ai_vs_truth"]["qwk"] == 1.0
    assert m["feedback_fully_correct"] == 1.0 and m["deferral"]["deferred_rate"] == 0.0
    assert all(v["agreement"] == 1.0 for v in m["per_rubric_line"].values())
    # Every aggregation rule of identical runs equals the truth.
    assert all(b == 0.0 for b in m["aggregation_bias_vs_truth"].values())
    assert isinstance(E.headline(m), str) and "AI vs TA-1" in E.headline(m)
    assert {p for p in out["plots"]} <= {p.name for p in tmp_path.iterdir()}


def test_config_errors_name_the_field():
    with pytest.raises(registry.ConfigError, match="protocol.reference_ta"):
        E.Config(protocol=E.ProtocolSection(reference_ta="TA-9"))
    with pytest.raises(registry.ConfigError, match="ai.aggregation"):
        E.Config(ai=E.AiSection(aggregation="vote"))
    with pytest.raises(registry.ConfigError, match="protocol.graders"):
        E.Config(protocol=E.ProtocolSection(graders=(("TA-1", 0.0, 0.4), ("TA-2", 0.0, 0.4))))
