"""Catalog, registry, CLI and report: errors name what is wrong; the README table is the catalog's."""

import dataclasses
import json
import pathlib
import re

import pytest

from experiments import __main__ as cli
from experiments import catalog, registry, report

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_catalog_has_38_unique_papers_with_valid_fields():
    slugs = [e.slug for e in catalog.CATALOG]
    assert len(slugs) == 38 and len(set(slugs)) == 38
    assert not set(slugs) & set(registry.FOUNDATION)
    for e in catalog.CATALOG:
        assert e.slug.isidentifier() and e.slug == e.slug.lower(), e.slug
        assert e.status in catalog.STATUSES, e
        assert e.area in catalog.AREAS, e
        assert e.arxiv is None or re.fullmatch(r"\d{4}\.\d{4,5}", e.arxiv), e
        assert e.title and e.claim and e.paper_result, e


def test_status_agrees_with_the_code():
    implemented = set(registry.implemented_slugs())
    for e in catalog.CATALOG:
        has_module = e.slug in implemented
        assert has_module == (e.status != "planned"), f"{e.slug}: status {e.status!r}, module exists: {has_module}"
    for slug in registry.FOUNDATION:
        assert slug in implemented


def test_readme_catalog_table_is_generated_from_the_catalog_and_the_results():
    readme = (ROOT / "README.md").read_text()
    assert cli.markdown_table(ROOT / "results") in readme, (
        "README.md's paper table is stale: paste the output of `python -m experiments catalog --markdown`"
    )


def test_every_implemented_paper_has_a_quick_result_with_checks_and_a_headline():
    """The catalog's status and "ours" cell can only be derived when the quick result stores its checks."""
    for e in catalog.CATALOG:
        if e.status == "planned":
            continue
        st = report.paper_status(e, ROOT / "results")
        assert not st.problem, f"{e.slug}: {st.problem}"
        assert st.ours and len(st.ours) <= 400, f"{e.slug}: headline {st.ours!r} (empty or longer than 400 chars)"


def _fake_result(tmp_path, slug, checks, reproduced, cause=None):
    d = tmp_path / slug / "quick"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"slug": slug, "reproduced": reproduced, "cause": cause,
                                               "metrics": {"checks": checks, "x": 0.25}}))


def test_paper_status_is_verified_only_when_every_required_check_passed(tmp_path, monkeypatch):
    import types

    monkeypatch.setattr(report.importlib, "import_module",
                        lambda name: types.SimpleNamespace(headline=lambda m: f"x  {m['x']:.2f}\n"))
    entry = dataclasses.replace(catalog.CATALOG[0], slug="fake", status="implemented")
    ok = {"name": "a", "passed": True, "required": True}
    bad_optional = {"name": "b", "passed": False, "required": False}
    bad = {"name": "c", "passed": False, "required": True}
    assert report.paper_status(entry, tmp_path).status == "implemented"  # no result at all
    _fake_result(tmp_path, "fake", [ok, bad_optional], True)
    st = report.paper_status(entry, tmp_path)
    assert (st.status, st.ours, st.problem) == ("verified", "x 0.25", "")
    (tmp_path / "fake" / "quick" / "result.json").unlink()
    _fake_result(tmp_path / "b", "fake", [ok, bad], False)
    assert report.paper_status(entry, tmp_path / "b").status == "implemented"
    _fake_result(tmp_path / "e", "fake", [ok, bad], False, cause="scale")
    assert report.paper_status(entry, tmp_path / "e").status == "implemented; not reproduced: scale"
    _fake_result(tmp_path / "c", "fake", [ok, bad], True)  # reproduced disagrees with the checks
    st = report.paper_status(entry, tmp_path / "c")
    assert st.status == "implemented" and "disagrees" in st.problem
    _fake_result(tmp_path / "d", "fake", {"a": True}, True)  # not a list of Check records
    st = report.paper_status(entry, tmp_path / "d")
    assert st.status == "implemented" and "no list of claim checks" in st.problem
    planned = dataclasses.replace(entry, status="planned")
    assert report.paper_status(planned, tmp_path).status == "planned"


def test_every_registered_experiment_defines_the_three_presets():
    for slug in registry.implemented_slugs():
        exp = registry.get(slug)
        for preset in registry.PRESETS:
            assert isinstance(exp.config(preset), exp.config_cls)


def test_unknown_slug_and_planned_slug_errors_name_them(monkeypatch):
    with pytest.raises(ValueError, match="unknown experiment slug 'no_such_paper'"):
        registry.get("no_such_paper")
    # Every paper has its module now: a catalog slug whose module is hidden stands in for a planned one.
    slug = catalog.CATALOG[0].slug
    monkeypatch.setattr(registry, "_has_module", lambda s: s != slug)
    with pytest.raises(ValueError, match=f"'{slug}' is in the catalog but not implemented"):
        registry.get(slug)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        registry.get("lm_arithmetic").config("huge")


def test_cli_errors_name_the_slug_preset_and_field(capsys):
    assert cli.main(["run", "no_such_paper"]) == 2
    assert "no_such_paper" in capsys.readouterr().err
    assert cli.main(["run", "lm_arithmetic", "--preset", "huge"]) == 2  # presets are per experiment now
    assert "unknown preset 'huge' for 'lm_arithmetic'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "lm_arithmetic", "--preset", "smoke", "--no-such-field", "3"])
    captured = capsys.readouterr()
    assert "no-such-field" in captured.out + captured.err


def test_cli_list_shows_every_paper(capsys):
    assert cli.main(["list", "--results-dir", str(ROOT / "results")]) == 0
    out = capsys.readouterr().out
    for e in catalog.CATALOG:
        status = report.paper_status(e, ROOT / "results").status
        assert re.search(rf"^{e.slug}\s+{status}\s", out, re.M), e.slug
    assert "lm_arithmetic" in out


def test_cli_override_reaches_the_config(monkeypatch, tmp_path):
    seen = {}

    def fake_run(slug, preset, *, results_dir, config, workdir):
        seen.update(slug=slug, preset=preset, config=config)
        return {"reproduced": True, "verdict": "ok", "wall_s": 0.0}

    monkeypatch.setattr(report, "run_experiment", fake_run)
    monkeypatch.setattr(report, "write_report", lambda d: pathlib.Path(d) / "REPORT.md")
    argv = ["run", "lm_arithmetic", "--preset", "smoke", "--results-dir", str(tmp_path), "--train.num-steps",
            "3", "--task.operations", "+", "-"]
    assert cli.main(argv) == 0
    assert seen["config"].train.num_steps == 3 and seen["config"].task.operations == ("+", "-")
    assert seen["config"].model.d_model == registry.get("lm_arithmetic").config("smoke").model.d_model


def test_cli_overrides_nested_model_fields(monkeypatch, tmp_path):
    """The model section is nested: `--model.d-model 48` changes that field and keeps the preset's others."""
    seen = {}
    monkeypatch.setattr(report, "run_experiment", lambda slug, preset, *, config, **kw: seen.update(config=config)
                        or {"reproduced": True, "verdict": "ok", "wall_s": 0.0})
    monkeypatch.setattr(report, "write_report", lambda d: pathlib.Path(d) / "REPORT.md")
    argv = ["run", "lm_arithmetic", "--preset", "smoke", "--results-dir", str(tmp_path), "--model.d-model", "48"]
    assert cli.main(argv) == 0
    smoke = registry.get("lm_arithmetic").config("smoke")
    assert seen["config"].model == dataclasses.replace(smoke.model, d_model=48)
    assert dataclasses.replace(seen["config"], model=smoke.model) == smoke


def test_report_collects_results(tmp_path):
    fake = {"slug": "lm_arithmetic", "preset": "smoke", "title": "t", "claim": "c", "paper_result": "",
            "config": {}, "metrics": {"acc": 0.5}, "verdict": "half right | ok", "reproduced": False,
            "plots": ["p.png"], "wall_s": 1.0, "environment": {"backend": "cpu", "devices": 1, "jax": "x"}}
    d = tmp_path / "lm_arithmetic" / "smoke"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps(fake))
    text = report.write_report(tmp_path, preset="smoke").read_text()
    assert "half right / ok" in text and "**no**" in text
    assert "![p.png](lm_arithmetic/smoke/p.png)" in text
