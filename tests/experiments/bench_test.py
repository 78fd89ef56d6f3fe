"""The benchmark sections run end to end at tiny sizes and report consistent rows (no timing is asserted)."""

import numpy as np

from experiments import bench
from pallas_kernels import bench as kernel_bench


def test_decode_roofline_rows_agree_with_the_reference_and_name_the_fastest():
    res = kernel_bench.bench_decode(token_counts=(256,), shapes=((4, 2, 16),), repeats=1, read_bytes=1 << 20)
    (row,) = res["rows"]
    assert res["layout"] == "bksd"  # the CPU default
    assert row["mbytes"] == 2 * 256 * 2 * 16 * 4 / 1e6
    assert row["fastest_alternative"] in kernel_bench.ALTERNATIVES
    assert max(row["max_abs_err_vs_einsum_bskd"].values()) < 1e-5  # every formulation computes the same thing
    np.testing.assert_allclose(row["library_vs_fastest"], row["ms"]["library"] / row["ms"][row["fastest_alternative"]])


def test_generate_throughput_rows():
    cfg = dict(vocab_size=32, d_model=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=32)
    res = bench.bench_generate(contexts=(64,), new_tokens=(2, 4), repeats=1, model_config=cfg, read_bytes=1 << 20)
    (row,) = res["rows"]
    assert row["kv_mbytes"] == 1 * 2 * 64 * 2 * 16 * 4 / 1e6
    np.testing.assert_allclose(row["x_roofline"], row["ms_per_token"] / row["roofline_ms"])


def test_cli_rejects_unknown_sections(capsys):
    import pytest

    with pytest.raises(SystemExit):
        bench.main(["--only", "decode,nope"])
    assert "unknown sections ['nope']" in capsys.readouterr().err


def test_merged_output_dates_each_section(tmp_path):
    """--only with --out merges into the file; every result key keeps the date it was measured."""
    import json
    import time

    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"old": [1], "dates": {"old": "2020-01-01"}, "date": "2020-01-01"}))
    sections = {"a": lambda args: {"a": [2], "a_extra": 3}, "b": lambda args: {"b": [4]}}
    res = kernel_bench.main(["--only", "a", "--out", str(out)], sections=sections)
    saved = json.loads(out.read_text())
    assert saved == res and saved["old"] == [1] and saved["a"] == [2] and "b" not in saved
    today = time.strftime("%Y-%m-%d")
    assert saved["dates"] == {"old": "2020-01-01", "a": today, "a_extra": today} and saved["date"] == today


def test_ffd_generate_rows():
    """Tiny: 256 tokens in pages of 16; FFD with pages and re-quantizing generate the same tokens (the
    induction LM copies exactly, dense included)."""
    res = bench.bench_ffd_generate(contexts=(256,), new_tokens=(2, 4), repeats=1, page_size=16, vocab_size=512)
    (row,) = res["rows"]
    assert set(row["ms_per_token"]) == {"dense", "ffd_pages", "ffd_requantize"}
    assert row["pages"] == 17  # capacity 256 + 4 rounded up to whole pages
    assert row["same_tokens"] and row["copy_accuracy"]["dense"] == 1.0
    assert len(row["kept_per_layer"]) == 2 and all(0 < k <= 1 for k in row["kept_per_layer"])
    np.testing.assert_allclose(row["vs_dense"]["ffd_pages"], row["ms_per_token"]["ffd_pages"] / row["ms_per_token"]["dense"])
