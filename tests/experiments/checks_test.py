"""Tests of `experiments.checks`: the Check record and the verdict written from checks."""

import json

import pytest

from experiments.checks import Check, verdict


def _check(name="a", passed=True, required=True, measured=1.0):
    return Check(name, measured=measured, paper="x", threshold=">= 1", passed=passed, required=required)


def test_as_dict_has_required_and_plain_bools():
    d = Check("c", measured=2, paper="p", threshold="t", passed=bool(1), required=False).as_dict()
    assert set(d) == {"name", "measured", "paper", "threshold", "passed", "note", "required"}
    assert d["required"] is False and d["passed"] is True
    json.dumps(d)


def test_required_defaults_true_and_line_marks_optional():
    assert _check().required is True
    assert "(not required)" in _check(required=False).line()
    assert "(not required)" not in _check().line()


def test_all_required_pass_reproduces():
    text, ok = verdict([_check("a"), _check("b")], claim="the claim", context="smoke scale")
    assert ok is True
    assert text.startswith("Reproduced: the claim.")
    assert "a: 1 (paper x; pass if >= 1): PASS" in text and "b: 1" in text
    assert text.endswith("smoke scale.")


def test_one_required_failure_does_not_reproduce_and_gives_cause():
    text, ok = verdict([_check("a"), _check("b", passed=False)], claim="c", context="ctx",
                       cause="scale limit")
    assert ok is False
    assert text.startswith("Not reproduced: c.")
    assert "b: 1 (paper x; pass if >= 1): FAIL" in text
    assert text.index("ctx") < text.index("scale limit")
    assert "Cause: scale limit." in text


def test_cause_omitted_when_reproduced():
    text, ok = verdict([_check()], claim="c", cause="a bug")
    assert ok and "a bug" not in text


def test_non_required_failure_does_not_decide():
    text, ok = verdict([_check("a"), _check("diag", passed=False, required=False)], claim="c")
    assert ok is True
    assert "diag" in text and "FAIL (not required)" in text


def test_non_required_pass_does_not_rescue():
    _, ok = verdict([_check("a", passed=False), _check("b", required=False)])
    assert ok is False


def test_numpy_bool_passed():
    np = pytest.importorskip("numpy")
    _, ok = verdict([_check(passed=np.bool_(True))])
    assert ok is True and isinstance(ok, bool)


def test_order_of_checks_kept():
    text, _ = verdict([_check("zeta"), _check("alpha")])
    assert text.index("zeta") < text.index("alpha")


def test_no_required_check_raises():
    with pytest.raises(ValueError, match="required"):
        verdict([_check(required=False)])
    with pytest.raises(ValueError, match="required"):
        verdict([])


def test_rejects_non_check():
    with pytest.raises(TypeError, match="Check"):
        verdict([{"name": "a", "passed": True}])


def test_cause_class_labels_the_cause_and_is_validated():
    text, ok = verdict([_check("a", passed=False)], claim="c", cause="power .89 at T=1000 < .9",
                       cause_class="scale")
    assert not ok and "Cause (scale limit): power .89 at T=1000 < .9." in text
    text, _ = verdict([_check("a", passed=False)], cause="Cause: old prefix", cause_class="check")
    assert "Cause (check stricter than the paper's statement): old prefix." in text
    with pytest.raises(ValueError, match="cause_class must be one of"):
        verdict([_check("a", passed=False)], cause_class="luck")
