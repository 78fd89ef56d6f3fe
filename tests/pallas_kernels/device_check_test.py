"""The device check (`pallas_kernels.device_check`) runs end to end, so a lent GPU is not spent debugging it.

On CPU its dry run compiles nothing for a GPU: the same code at tiny shapes with the kernels interpreted.
The GPU test runs the real check where a GPU is present (skipped here).
"""

import json
import pkgutil

import jax
import pytest

import pallas_kernels
from pallas_kernels import device_check


@pytest.fixture(scope="module")
def dry_run():
    return device_check.run(dry_run=True, log=lambda *_: None)


def test_every_kernel_package_has_a_device_case():
    packages = {m.name for m in pkgutil.iter_modules(pallas_kernels.__path__) if m.ispkg}
    assert packages == {c.kernel for c in device_check.CASES}


def test_dry_run_checks_every_case_and_measures_each_step(dry_run):
    assert [r["case"] for r in dry_run["kernels"]] == [f"{c.kernel}.{c.name}" for c in device_check.CASES]
    failed = {r["case"]: r.get("error", r.get("max_relative_error")) for r in dry_run["kernels"] if not r["passed"]}
    assert not failed
    assert dry_run["all_passed"] and not dry_run["skipped"] and not dry_run["step_errors"]
    ffd = dry_run["ffd"][0]
    assert ffd["same_selection_as_reference"] and 0 < ffd["kept_fraction"] <= 1
    assert {r["layout"] for r in dry_run["decode"]} == {"bskd", "bksd"}
    assert all(r["kernel_vs_xla_relative_error"] < 2e-2 and r["fraction_of_copy_ceiling"] > 0
               for r in dry_run["decode"])
    json.dumps(dry_run)  # the record is plain JSON


def test_every_full_size_program_lowers_for_triton():
    """Triton's rules at the GPU run's own shapes (abstract arguments, nothing allocated)."""
    lowered = device_check.lower_full()
    assert len(lowered) == len(device_check.CASES) + 3
    assert {k: v for k, v in lowered.items() if v != "ok"} == {}


def test_a_failing_case_is_recorded_and_the_run_goes_on():
    def broken(z):
        raise RuntimeError("triton says no")

    row = device_check.check_case(device_check.Case("fake", "broken", broken), device_check.TINY, "pallas_triton",
                                  True, 1)
    assert not row["passed"] and "triton says no" in row["error"]


def test_compare_scales_by_the_reference_and_counts_nonfinite_mismatches():
    import jax.numpy as jnp

    want = (jnp.array([1.0, -4.0, -jnp.inf]), jnp.array([1, 2, 3, 4]))
    got = (jnp.array([1.0, -3.0, -jnp.inf]), jnp.array([1, 2, 0, 4]))
    res = device_check.compare(got, want)
    assert res["relative_errors"] == [0.25, 0.25] and res["nonfinite_mismatches"] == 0
    assert device_check.compare((jnp.array([0.0, 1.0]),), (jnp.array([0.0, jnp.nan]),))["nonfinite_mismatches"] == 1


def test_budget_skips_what_is_left_and_says_so():
    rec = device_check.run(dry_run=True, budget_s=0.0, only=("qvg.kmeans_assign", "ffd"), log=lambda *_: None)
    assert rec["skipped"] == ["qvg.kmeans_assign", "ffd"] and not rec["all_passed"]


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (run: python -m pallas_kernels.device_check)")
def test_compiled_kernels_match_their_references_on_the_gpu():
    rec = device_check.run(log=print)
    assert all(r["passed"] for r in rec["kernels"]), [r for r in rec["kernels"] if not r["passed"]]


def test_report_renders_every_case_step_and_the_layout_verdict(dry_run):
    text = device_check.report(dry_run)
    for case in device_check.CASES:
        assert f"| {case.kernel}.{case.name} | pass |" in text
    assert "## FFD kernel" in text and "## Dense decode kernel" in text
    assert text.count("| bskd |") == text.count("| bksd |") == len(dry_run["decode"]) // 2
    assert "Axis order: the kernel ran faster on" in text


def test_report_of_a_failed_and_cut_short_run_says_so():
    rec = {"device": "NVIDIA H100", "backend": "gpu", "jax": "0.11.2", "date": "2026-12-07", "dry_run": False,
           "implementation": "pallas_triton", "repeats": 5, "ceilings": {}, "skipped": ["decode"],
           "step_errors": {"ffd": "ValueError: boom\ntraceback..."}, "all_passed": False,
           "kernels": [{"case": "wkv.bi_wkv", "passed": False, "error": "CompilationError: smem\nmore"}]}
    text = device_check.report(rec)
    assert "| wkv.bi_wkv | **error** |" in text and "CompilationError: smem" in text and "more" not in text
    assert "Skipped (time budget): decode." in text and "Step `ffd` failed: `ValueError: boom`." in text
    assert "## FFD kernel" not in text and "**False**" in text


def test_layout_verdict_counts_rows_and_takes_the_geometric_mean():
    rows = [{"heads": 32, "kv_heads": 8, "head_dim": 128, "tokens": t, "layout": lay, "kernel_ms": ms}
            for t, lay, ms in ((1, "bskd", 2.0), (1, "bksd", 1.0), (2, "bskd", 1.0), (2, "bksd", 2.0),
                               (3, "bskd", 4.0), (3, "bksd", 1.0))]
    v = device_check.layout_verdict(rows)
    assert v["faster_in"] == {"bskd": 1, "bksd": 2}
    assert abs(v["geomean_bskd_over_bksd"] - 4 ** (1 / 3) * 1.0) < 1e-12  # (2 * 0.5 * 4) ** (1/3)
    assert device_check.layout_verdict(rows[:1]) == {}


def test_report_cli_prints_an_earlier_runs_tables(dry_run, tmp_path, capsys):
    path = tmp_path / "gpu_test.json"
    path.write_text(json.dumps(dry_run))
    out = device_check.main(["--report", str(path)])
    assert out["report"] == device_check.report(dry_run) and "# Device check:" in capsys.readouterr().out
