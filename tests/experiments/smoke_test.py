"""Every registered experiment's smoke preset runs end to end and writes its result files."""

import json

import pytest

from experiments import registry, report

# Experiments whose smoke result must carry machine-readable checks (issue 25 item 4). Add a slug
# here, one per line, once its experiment builds its verdict from `experiments.checks.verdict`.
SLUGS_WITH_CHECKS = {
    "ddm_signals",
    "differential_smoothing",
    "lm_arithmetic",
    "moe_rerouting",
    "nmars",
    "ope_mnar",
    "ppm",
    "qvg", "rl_compute_allocation", "router_interp", "scm_grpo", "sparse_scaling", "spf", "sysr",
}
CHECK_KEYS = {"name", "measured", "paper", "threshold", "passed"}


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
    if slug in SLUGS_WITH_CHECKS:
        checks = saved["metrics"].get("checks")
        assert isinstance(checks, list) and checks, f"{slug}: metrics['checks'] is empty or missing"
        for ch in checks:
            assert isinstance(ch, dict) and CHECK_KEYS <= set(ch), f"{slug}: bad check {ch}"
            assert isinstance(ch["passed"], bool)
