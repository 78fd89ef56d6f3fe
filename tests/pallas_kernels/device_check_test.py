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
