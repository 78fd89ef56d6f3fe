"""Every registered experiment's smoke preset runs end to end and writes its result files."""

import json

import pytest

from experiments import registry, report


@pytest.mark.parametrize("slug", registry.implemented_slugs())
def test_smoke_preset_runs(slug, tmp_path):
    result = report.run_experiment(slug, "smoke", results_dir=tmp_path)
    workdir = tmp_path / slug / "smoke"
    saved = json.loads((workdir / "result.json").read_text())
    assert saved["slug"] == slug and saved["verdict"]
    assert saved["reproduced"] in (True, False, None)
    for plot in result["plots"]:
        assert (workdir / plot).stat().st_size > 0
    assert (workdir / "summary.md").exists()
