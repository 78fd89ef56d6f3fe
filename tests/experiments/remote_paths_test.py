"""Remote work directories (gs://...) stay remote: checkpoints, run directories, figures and reports go through
`etils.epath`. Nothing touches the network: the checkpoint manager is faked, and `epath.testing.mock_epath`
redirects the gs:// filesystem into a temporary directory."""

import json

import pytest
from etils import epath
from etils.epath import testing as epath_testing

from algorithms import training
from experiments import _plotting as plotting
from experiments import report
from models import Transformer, TransformerConfig

BUCKET = "gs://bucket"


class _Recorded(Exception):
    pass


def test_checkpointer_keeps_a_gs_directory_remote_and_a_local_one_absolute(monkeypatch, tmp_path):
    seen = []

    class FakeManager:
        def __init__(self, directory, **kwargs):
            seen.append(directory)

    monkeypatch.setattr(training.ocp, "CheckpointManager", FakeManager)
    remote = training.Checkpointer(f"{BUCKET}/run/ckpt")
    assert str(remote.directory) == f"{BUCKET}/run/ckpt" and str(seen[-1]) == f"{BUCKET}/run/ckpt"
    monkeypatch.chdir(tmp_path)
    local = training.Checkpointer("run/ckpt")
    assert str(local.directory) == str(tmp_path / "run" / "ckpt")


def test_fit_hands_a_gs_workdir_to_the_checkpointer_unchanged(monkeypatch):
    seen = []

    def fake_checkpointer(directory, **kwargs):
        seen.append(directory)
        raise _Recorded

    monkeypatch.setattr(training, "Checkpointer", fake_checkpointer)
    with pytest.raises(_Recorded):
        cfg = TransformerConfig(vocab_size=8, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=8)
        training.fit(model_fn=lambda rngs: Transformer(cfg, rngs=rngs), optimizer_config=training.OptimizerConfig(),
                     batch_fn=lambda i: {}, num_steps=1, workdir=f"{BUCKET}/run", progress=False)
    assert [str(d) for d in seen] == [f"{BUCKET}/run/ckpt"]


@pytest.fixture
def fake_bucket(tmp_path):
    """gs://bucket/... is served from tmp_path/bucket/...; local paths pass through."""

    def local(path):
        p = str(path)
        return str(tmp_path / "bucket" / p[len(BUCKET) + 1:]) if p.startswith(BUCKET) else p

    def redirect(fn, path, *args, **kwargs):
        return fn(local(path), *args, **kwargs)

    def glob(fn, pattern):
        found = fn(local(pattern))
        root = str(tmp_path / "bucket")
        return [BUCKET + f[len(root):] if f.startswith(root) else f for f in found]

    fns = {name: redirect for name in ("open", "exists", "isdir", "listdir", "makedirs", "mkdir", "stat")}
    with epath_testing.mock_epath(glob=glob, **fns):
        yield tmp_path / "bucket"


def test_run_directories_figures_and_reports_stay_remote(fake_bucket):
    workdir = report.default_workdir("lm_arithmetic", "smoke", results_dir=f"{BUCKET}/results")
    assert str(workdir) == f"{BUCKET}/results/lm_arithmetic/smoke"
    workdir.mkdir(parents=True, exist_ok=True)
    fig, ax = plotting.subplots(1, 1)
    ax.plot([0, 1], [1, 0])
    assert report.savefig(fig, workdir / "curve.png") == "curve.png"
    local = fake_bucket / "results" / "lm_arithmetic" / "smoke"
    assert (local / "curve.png").read_bytes()[:4] == b"\x89PNG"
    result = {"slug": "lm_arithmetic", "preset": "smoke", "title": "t", "claim": "c", "paper_result": "",
              "metrics": {"x": 1.0}, "verdict": "v", "reproduced": True, "plots": ["curve.png"], "wall_s": 1.0,
              "devices": 1, "environment": {"backend": "cpu", "jax": "0", "devices": 1}}
    (workdir / "result.json").write_text(json.dumps(result))
    path = report.write_report(f"{BUCKET}/results", preset="smoke")
    assert str(path) == f"{BUCKET}/results/REPORT-smoke.md"
    assert "lm_arithmetic" in (fake_bucket / "results" / "REPORT-smoke.md").read_text()
    assert not epath.Path("gs:").exists()  # nothing was written to a local folder named after the bucket
