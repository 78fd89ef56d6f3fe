"""`python -m experiments aot`: a training step compiled ahead of time for a TPU slice (needs libtpu; the
compile test skips without it, saying why)."""

import json

import pytest

from experiments import __main__ as cli
from pallas_kernels import aot as kernel_aot

needs_libtpu = pytest.mark.skipif(not kernel_aot.libtpu_available(),
                                  reason='libtpu is not installed (pip install -e ".[tpu]")')


@needs_libtpu
def test_lm_arithmetic_smoke_step_compiles_for_v5e_and_reports_per_chip_memory(tmp_path, capsys):
    out = tmp_path / "steps.json"
    rc = cli.main(["aot", "lm_arithmetic", "--preset", "smoke", "--topology", "v5e:2x2", "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ok"] and row["fits"] and row["chips"] == 4 and row["mesh"] == [1, 4, 1]
    assert row["batch_size"] == 16 and 0 < row["total_bytes"] < row["hbm_bytes"] == 16 * 2**30
    assert "fits" in capsys.readouterr().out


@needs_libtpu
def test_a_batch_that_does_not_split_over_the_mesh_is_refused_by_name(capsys):
    assert cli.main(["aot", "lm_arithmetic", "--preset", "smoke", "--topology", "v5e:2x2", "--batch", "6"]) == 2
    assert "batch_size 6 does not split over the mesh's data x fsdp = 4" in capsys.readouterr().out


def test_an_experiment_without_a_training_step_is_refused_by_name(capsys, monkeypatch):
    from experiments import aot

    monkeypatch.setattr(aot, "targets", lambda: {"lm_1b": "", "lm_arithmetic": ""})
    assert cli.main(["aot", "toast"]) == 2
    assert "'toast' defines no training step to compile; targets: ['lm_1b', 'lm_arithmetic']" in \
        capsys.readouterr().out


def test_compiling_for_resolves_kernels_for_the_target_platform():
    from pallas_kernels import _backend

    assert _backend.resolve_implementation(None) == "xla" and _backend.resolve_interpret(None)  # CPU here
    with _backend.compiling_for("tpu"):
        assert _backend.target_backend() == "tpu"
        assert _backend.resolve_implementation(None) == "pallas_tpu" and not _backend.resolve_interpret(None)
        with _backend.compiling_for("gpu"):
            assert _backend.resolve_implementation("pallas") == "pallas_triton"
        assert _backend.resolve_implementation("pallas") == "pallas_tpu"
    assert _backend.target_backend() == "cpu"
    with pytest.raises(ValueError, match="platform must be 'tpu', 'gpu' or 'cpu'; got 'TPU'"):
        with _backend.compiling_for("TPU"):
            pass


def test_list_prints_the_targets(capsys, monkeypatch):
    from experiments import aot

    monkeypatch.setattr(aot, "targets", lambda: {"lm_1b": "the 1B LM", "lm_arithmetic": "its step"})
    assert cli.main(["aot", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["lm_1b", "the", "1B", "LM", "lm_arithmetic", "its", "step"]
