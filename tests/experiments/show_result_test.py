"""`report.show_result`: what the notebooks print from a stored result."""

import json

from experiments import report


def test_prints_the_stored_checks_and_headline(capsys):
    result = report.show_result("safethink")
    out = capsys.readouterr().out
    stored = json.loads((report.REPO_RESULTS / "safethink" / "quick" / "result.json").read_text())
    assert result == stored
    assert out.startswith(f"reproduced: {stored['reproduced']} | cause: {stored['cause']}")
    assert "ours: toy reasoning LM" in out
    assert out.count("PASS") + out.count("FAIL") == len(stored["metrics"]["checks"])


def test_a_missing_result_says_how_to_make_it(tmp_path, capsys):
    assert report.show_result("safethink", results_dir=tmp_path) == {}
    assert "python -m experiments run safethink --preset quick" in capsys.readouterr().out
