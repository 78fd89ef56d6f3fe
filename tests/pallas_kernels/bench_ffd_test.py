"""`python -m pallas_kernels.bench --only ffd` at a tiny cache: the row's checks and the speedup's spread."""

from pallas_kernels import bench, device_check


def test_timed_rounds_times_every_callable_once_per_round():
    calls = []
    rounds = device_check.timed_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # one warm-up each, then round-robin
    assert {k: len(v) for k, v in rounds.items()} == {"a": 3, "b": 3}


def test_ffd_row_matches_the_reference_and_reports_the_per_round_spread():
    (row,) = bench.bench_ffd([1024], delta=5.0, repeats=3)
    assert row["same_selection_as_reference"] and row["overflow_pages"] == 0
    assert row["max_abs_diff_vs_reference"] < 1e-4
    pr = row["speedup_vs_fastest_dense_per_round"]
    assert pr["rounds"] == 3 and pr["min"] <= pr["p25"] <= pr["median"] <= pr["p75"] <= pr["max"]
    assert row["fastest_dense"] in row["ms"] and row["fastest_dense"] != "ffd_fast"
    bench._print_ffd([row])  # the table and the spread line print
