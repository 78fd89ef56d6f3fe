"""The `python -m experiments` CLI as a user meets it (issue 26): help lists the config fields, bad values
fail with exit code 2 naming the flag, smoke and ad-hoc runs leave tracked files alone, runs with overrides
get their own run directory, every result carries its device count."""

import contextlib
import dataclasses
import io
import json
import math
import pathlib
import shutil
import subprocess

import jax
import pytest

from experiments import __main__ as cli
from experiments import registry, report

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLUG = "lm_arithmetic"  # the cheapest experiment
TINY = ["--train.num-steps", "2", "--eval.examples", "4", "--eval.batch-size", "4"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One plain smoke run through the CLI into a fresh results dir; (results_dir, its stdout)."""
    results = tmp_path_factory.mktemp("results")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["run", SLUG, "--preset", "smoke", "--results-dir", str(results)])
    assert code == 0, out.getvalue()
    return results, out.getvalue()


# ---------------------------------------------------------------- 1. run <slug> --help lists the fields


def test_run_slug_help_lists_the_config_fields(capsys):
    assert cli.main(["run", SLUG, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--preset" in out and "--results-dir" in out  # the run options
    for flag in ("--train.num-steps", "--train.batch-size", "--train.learning-rate", "--seed"):  # the config fields
        assert flag in out, flag


def test_run_help_without_slug_shows_the_run_options(capsys):
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--preset" in out and "config fields" in out


def test_run_without_slug_fails_with_exit_code_2(capsys):
    assert cli.main(["run"]) == 2
    assert "slug" in capsys.readouterr().err


# ---------------------------------------------------------------- 2. reports: only quick updates REPORT.md


def _fake_result(tmp, slug, preset, verdict):
    d = tmp / slug / preset
    d.mkdir(parents=True)
    r = {"slug": slug, "preset": preset, "title": "t", "claim": "c", "paper_result": "", "config": {},
         "metrics": {}, "verdict": verdict, "reproduced": True, "plots": [], "wall_s": 1.0, "devices": 8,
         "environment": {"backend": "cpu", "devices": 8, "jax": "x"}}
    (d / "result.json").write_text(json.dumps(r))


def test_report_md_lists_only_quick_results_and_other_presets_get_their_own(tmp_path):
    _fake_result(tmp_path, SLUG, "quick", "quick verdict")
    _fake_result(tmp_path, SLUG, "smoke", "smoke verdict")
    _fake_result(tmp_path, SLUG, "smoke-0123abcd", "override verdict")
    quick = report.write_report(tmp_path)
    assert quick == tmp_path / "REPORT.md"
    text = quick.read_text()
    assert "quick verdict" in text and "smoke verdict" not in text and "override verdict" not in text
    assert "| 8 |" in text  # the devices column
    smoke = report.write_report(tmp_path, preset="smoke")
    assert smoke == tmp_path / "REPORT-smoke.md"
    assert "smoke verdict" in smoke.read_text() and "quick verdict" not in smoke.read_text()


def test_smoke_run_writes_its_own_report_not_report_md(smoke_run):
    results, out = smoke_run
    assert (results / SLUG / "smoke" / "result.json").exists()
    assert (results / "REPORT-smoke.md").exists()
    assert not (results / "REPORT.md").exists()
    assert "REPORT-smoke.md" in out


def test_ad_hoc_run_writes_no_report_file(tmp_path, capsys):
    assert cli.main(["run", SLUG, "--preset", "smoke", "--results-dir", str(tmp_path), *TINY]) == 0
    assert not list(tmp_path.glob("REPORT*.md"))
    (workdir,) = [p for p in (tmp_path / SLUG).iterdir()]
    assert workdir.name.startswith("smoke-") and (workdir / "summary.md").exists()
    assert str(workdir / "summary.md") in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
@pytest.mark.parametrize("path", ["results/REPORT-smoke.md", f"results/{SLUG}/smoke/result.json",
                                  f"results/{SLUG}/smoke-0123abcd/result.json",
                                  f"results/{SLUG}/quick-0123abcd/summary.md",
                                  f"results/{SLUG}/quick/ckpt/6/x", f"results/{SLUG}/quick/run.log",
                                  "results/smoke-elapsed.json"])
def test_what_smoke_and_ad_hoc_runs_write_in_results_is_git_ignored(path):
    # `git status` stays clean after a smoke or override run in the default results/ directory.
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, check=False)
    assert ignored.returncode == 0, f"{path} is not ignored by .gitignore"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_the_quick_report_stays_tracked():
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", "results/REPORT.md"], cwd=ROOT, check=False)
    assert ignored.returncode == 1


def test_parallel_runs_write_every_result_and_one_report(tmp_path, capsys):
    # `run a,b --jobs 2`: each slug in its own process, its output in run.log, the report once with the elapsed line.
    slugs = [SLUG, "calculus_grading"]
    assert cli.main(["run", ",".join(slugs), "--preset", "smoke", "--jobs", "2", "--results-dir", str(tmp_path)]) == 0
    for slug in slugs:
        result = json.loads((tmp_path / slug / "smoke" / "result.json").read_text())
        assert result["slug"] == slug and result["preset"] == "smoke"
        assert (tmp_path / slug / "smoke" / "run.log").read_text()
    report_md = (tmp_path / "REPORT-smoke.md").read_text()
    assert all(f"[{slug}]" in report_md for slug in slugs)
    assert "Last multi-run command: 2 runs in" in report_md and "`--jobs 2`" in report_md
    assert "2 of 2 runs finished" in capsys.readouterr().out


def test_jobs_below_one_fails_naming_the_flag(tmp_path, capsys):
    assert cli.main(["run", SLUG, "--preset", "smoke", "--jobs", "0", "--results-dir", str(tmp_path)]) == 2
    assert "--jobs must be a whole number >= 1" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- 3. report on a missing directory


def test_report_on_a_missing_results_dir_fails_without_creating_it(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert cli.main(["report", "--results-dir", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err
    assert not missing.exists()


def test_report_without_results_of_the_preset_fails(tmp_path, capsys):
    assert cli.main(["report", "--results-dir", str(tmp_path)]) == 2
    assert "no 'quick' results" in capsys.readouterr().err
    assert not (tmp_path / "REPORT.md").exists()


# ---------------------------------------------------------------- 4. bad values name the flag, exit code 2


@pytest.mark.parametrize("flag, value, message", [
    ("--train.num-steps", "0", "--train.num-steps must be >= 1; got 0"),
    ("--train.batch-size", "0", "--train.batch-size must be >= 1; got 0"),
    ("--train.learning-rate", "nan", "--train.learning-rate must not be NaN"),
    ("--train.learning-rate", "-1", "--train.learning-rate (a learning rate) must be finite and > 0; got -1.0"),
    ("--train.learning-rate", "inf", "--train.learning-rate (a learning rate) must be finite and > 0; got inf"),
])
def test_bad_values_fail_with_exit_code_2_naming_the_flag(flag, value, message, tmp_path, capsys):
    assert cli.main(["run", SLUG, "--preset", "smoke", "--results-dir", str(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "total_steps" not in err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_an_experiments_own_check_names_the_flag_too(tmp_path, capsys):
    # ffd's __post_init__ raises "lm.answer_len must be >= 2 ..."; the CLI (not tyro's box) reports the flag.
    assert cli.main(["run", "ffd", "--preset", "smoke", "--results-dir", str(tmp_path), "--lm.answer-len", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: bad config for 'ffd' [smoke]: --lm.answer-len must be >= 2" in err, err
    assert not list(tmp_path.iterdir())


def test_every_preset_passes_the_shared_checks():
    for slug in registry.implemented_slugs():
        exp = registry.get(slug)
        for preset in exp.presets:  # the three standard presets and any study preset
            registry.check_config(exp.config(preset))


def test_a_study_preset_runs_by_name_without_a_report_and_an_unknown_preset_names_the_choices(
        tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run(slug, preset, *, config, **kw):
        seen.update(slug=slug, preset=preset, config=config)
        return {"reproduced": False, "verdict": "v", "wall_s": 0.0}

    monkeypatch.setattr(report, "run_experiment", fake_run)
    assert cli.main(["run", "nmars", "--preset", "diff_study", "--results-dir", str(tmp_path)]) == 0
    assert seen["preset"] == "diff_study" and seen["config"] == registry.get("nmars").config("diff_study")
    assert not list(tmp_path.glob("REPORT*"))  # a study writes its run directory only
    assert cli.main(["run", SLUG, "--preset", "diff_study", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"unknown preset 'diff_study' for {SLUG!r}; choose from ['paper', 'quick', 'smoke']" in err, err
    assert cli.main(["run", "nmars", "--help"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Presets of 'nmars': "))
    assert {"smoke", "quick", "paper", "diff_study"} == set(line.split(": ", 1)[1].split(", "))


def test_check_config_names_nested_fields_and_the_cli_spells_them_as_flags():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        lr: float = 1e-3
        batch: int = 2

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner = Inner()
        scales: tuple[float, ...] = (1.0,)

    with pytest.raises(registry.ConfigError, match=r"inner\.batch must be >= 1; got 0") as info:
        registry.check_config(Outer(inner=Inner(batch=0)))
    assert registry.cli_flag(info.value.field) == "--inner.batch"
    with pytest.raises(registry.ConfigError, match="scales must not be NaN"):
        registry.check_config(Outer(scales=(1.0, math.nan)))
    # An experiment's own __post_init__ message: field names become flags.
    msg = cli._flag_message(ValueError("warmup_steps must be in [0, total_steps=6]; got 9"), Outer(),)
    assert msg == "warmup_steps must be in [0, total_steps=6]; got 9"  # not fields of Outer: unchanged
    cfg = registry.get(SLUG).config("smoke")
    msg = cli._flag_message(ValueError("warmup_steps must be <= num_steps; got warmup_steps=9"), cfg)
    assert msg == "--train.warmup-steps must be <= --train.num-steps; got --train.warmup-steps=9"


# ---------------------------------------------------------------- 5. overrides after a smoke run just work


def test_override_after_a_smoke_run_gets_its_own_run_directory_and_resumes_there(smoke_run, capsys):
    results, _ = smoke_run
    argv = ["run", SLUG, "--preset", "smoke", "--results-dir", str(results), "--train.num-steps", "3",
            "--eval.examples", "4", "--eval.batch-size", "4"]
    assert cli.main(argv) == 0  # the smoke run's checkpoint has another fingerprint: not touched
    dirs = sorted(p.name for p in (results / SLUG).iterdir())
    assert len(dirs) == 2 and dirs[0] == "smoke" and dirs[1].startswith("smoke-")
    first = json.loads((results / SLUG / dirs[1] / "result.json").read_text())
    assert first["config"]["train"]["num_steps"] == 3 and first["metrics"]["resumed_from_step"] == -1
    capsys.readouterr()
    # The same overrides in another order: the same directory, resumed from its finished checkpoint.
    argv2 = argv[:6] + ["--eval.batch-size", "4", "--eval.examples", "4", "--train.num-steps", "3"]
    assert cli.main(argv2) == 0
    assert sorted(p.name for p in (results / SLUG).iterdir()) == dirs
    again = json.loads((results / SLUG / dirs[1] / "result.json").read_text())
    assert again["metrics"]["resumed_from_step"] == 3
    smoke = registry.get(SLUG).config("smoke")
    assert report.default_workdir(SLUG, "smoke", smoke, results_dir=results) == results / SLUG / "smoke"


# ---------------------------------------------------------------- 6. the device count in every result


def test_result_and_summary_line_carry_the_device_count(smoke_run):
    results, out = smoke_run
    saved = json.loads((results / SLUG / "smoke" / "result.json").read_text())
    assert saved["devices"] == jax.device_count() == saved["environment"]["devices"]
    assert f"on {jax.device_count()} device(s))" in out
    assert f"x{jax.device_count()} device(s)" in (results / SLUG / "smoke" / "summary.md").read_text()
