"""Nested config sections (issue 25, item 6) of every experiment that has them (the `OVERRIDES` keys),
on the command line: a nested override (`--train.num-episodes 2`)
changes that one field and keeps every other preset value, `run <slug> --help` lists the nested flags, and a bad
nested value fails with exit code 2 naming its flag. No experiment runs here (`report.run_experiment` is replaced
by a recorder)."""

import dataclasses
import pathlib

import pytest

from experiments import __main__ as cli
from experiments import registry, report

# slug -> (flag, value, the section, the field, the parsed value, a flag of another section for --help)
OVERRIDES = {
    "spf": ("--train.num-episodes", "2", "train", "num_episodes", 2, "--runtime.widths"),
    "benchmark_game": ("--search.grid-points", "21", "search", "grid_points", 21, "--fig1.fit-iters"),
    "anytime_cmf": ("--power.signals", "0.1 0.2", "power", "signals", (0.1, 0.2), "--oracle.burn-in"),
    "weightclip": ("--train.steps", "40", "train", "steps", 40, "--zoo.num-models"),
    "scm_grpo": ("--reward.w-struct", "0.25", "reward", "w_struct", 0.25, "--sft.clean-fraction"),
    "differential_smoothing": ("--rl.entropy-coefs", "0.05", "rl", "entropy_coefs", (0.05,), "--countdown.max-target"),
    "dem_hec": ("--finetune.steps", "5", "finetune", "steps", 5, "--data.data-dir"),
    "toast": ("--tcs.ratios", "0.7", "tcs", "ratios", (0.7,), "--toast.fc2-ratio"),
    "prim": ("--pruning.retention-mass", "0.8", "pruning", "retention_mass", 0.8, "--eval.max-drop"),
    "ddm_signals": ("--timing.paths", "4000", "timing", "paths", 4000, "--watch-time.num-users"),
    "qvg": ("--quant.num-centroids", "8", "quant", "num_centroids", 8, "--ablate.speeds"),
    "fm_active_learning": ("--al.rounds", "3", "al", "rounds", 3, "--fm.temperature"),
    "nmars": ("--augment.kind", "inferred", "augment", "kind", "inferred", "--rl.max-undos"),
    "gaussian_sup": ("--ptas.eps", "0.9 0.5", "ptas", "eps", (0.9, 0.5), "--hypergraphs.probs"),
    "router_interp": ("--sae.steps", "120", "sae", "steps", 120, "--lm.model.moe.num-experts"),
    "ppm": ("--loss.bandwidth", "0.1", "loss", "bandwidth", 0.1, "--ddpm.diffusion-steps"),
    "staged_vlm": ("--plan.curriculum-k", "3", "plan", "curriculum_k", 3, "--rl.kl-coef"),
    "camp": ("--pref.steps", "5", "pref", "steps", 5, "--world.num-entities"),
    "rosa2": ("--train.steps", "20", "train", "steps", 20, "--rosa.cg-iters"),
    "style_heads": ("--train.num-steps", "20", "train", "num_steps", 20, "--steer.head-counts"),
    "lm_arithmetic": ("--task.operations", "+ -", "task", "operations", ("+", "-"), "--eval.batch-size"),
    "ffd": ("--lm.answer-len", "4", "lm", "answer_len", 4, "--synth.needle-gaps"),
    "online_covering": ("--steiner.requests", "4", "steiner", "requests", 4, "--diamond.levels"),
    "sparse_scaling": ("--train.max-epochs", "3", "train", "max_epochs", 3, "--data.vocab-size"),
    "eelma": ("--model.hidden", "64", "model", "hidden", 64, "--eval.bootstrap"),
    "e2i_vrwkv": ("--train.steps", "5", "train", "steps", 5, "--cost.sizes"),
    "mafe": ("--cem.iterations", "3", "cem", "iterations", 3, "--other.domains"),
    "conformal_pt": ("--sweep.seeds", "16", "sweep", "seeds", 16, "--stability.runs"),
    "ope_mnar": ("--mnar.sample-size", "64", "mnar", "sample_size", 64, "--violation.strengths"),
    "sysr": ("--methods.num-runs", "50", "methods", "num_runs", 50, "--budget.step"),
    "mvprobe": ("--probe.n-probes", "8", "probe", "n_probes", 8, "--train.epochs"),
    "calculus_grading": ("--ai.num-runs", "4", "ai", "num_runs", 4, "--sweep.ocr-rates"),
    "hyper_icl": ("--adapter.steps", "5", "adapter", "steps", 5, "--eval.num-queries"),
    "plmd": ("--train.steps", "5", "train", "steps", 5, "--nav.consult-every"),
    "safethink": ("--monitor.taus", "0.3 0.7", "monitor", "taus", (0.3, 0.7), "--scorer.traces"),
    "moe_rerouting": ("--reroute.rho", "0.25", "reroute", "rho", 0.25, "--sweep.intervals"),
    "vegas": ("--draft.sink", "8", "draft", "sink", 8, "--ablate.variants"),
    "rl_compute_allocation": ("--lm.n-grid", "2 4", "lm", "n_grid", (2, 4), "--bandit.per-problem-splits"),
}


@pytest.fixture
def recorded(monkeypatch):
    """The config `cli.main(["run", ...])` would run, without running it."""
    seen = {}

    def fake_run(slug, preset, *, config, **kw):
        seen["config"] = config
        return {"reproduced": True, "verdict": "ok", "wall_s": 0.0}

    monkeypatch.setattr(report, "run_experiment", fake_run)
    monkeypatch.setattr(report, "write_report", lambda d, **kw: pathlib.Path(d) / "REPORT.md")
    return seen


@pytest.mark.parametrize("slug", sorted(OVERRIDES))
def test_a_nested_override_changes_only_that_field(slug, recorded, tmp_path):
    flag, value, section, field, parsed, _ = OVERRIDES[slug]
    argv = ["run", slug, "--preset", "smoke", "--results-dir", str(tmp_path), flag, *value.split()]
    assert cli.main(argv) == 0
    smoke = registry.get(slug).config("smoke")
    got = recorded["config"]
    assert type(got) is registry.get(slug).config_cls
    assert getattr(getattr(got, section), field) == parsed != getattr(getattr(smoke, section), field)
    assert got == dataclasses.replace(smoke, **{section: dataclasses.replace(getattr(smoke, section),
                                                                             **{field: parsed})})


@pytest.mark.parametrize("slug", sorted(OVERRIDES))
def test_help_lists_the_nested_fields(slug, capsys):
    flag, _, _, _, _, other = OVERRIDES[slug]
    assert cli.main(["run", slug, "--preset", "smoke", "--help"]) == 0
    out = capsys.readouterr().out
    assert flag in out and other in out


@pytest.mark.parametrize("slug, flag, value, message", [
    ("spf", "--train.num-seeds", "0", "--train.num-seeds must be >= 1; got 0"),
    ("spf", "--train.learning-rate", "-1", "--train.learning-rate (a learning rate) must be finite and > 0"),
    ("benchmark_game", "--game.thetas", "1.0", "--game.thetas must name at least two providers; got (1.0,)"),
    ("anytime_cmf", "--null.noises", "cauchy", "--null.noises must be drawn from ('gaussian', 't3', 'exp', "
     "'rademacher'); got ['cauchy']"),
    ("weightclip", "--zoo.holdout-fraction", "0.7", "--zoo.holdout-fraction must be in (0, 0.5); got 0.7"),
    ("weightclip", "--eval.queries", "0", "--eval.queries must be >= 1; got 0"),
    ("differential_smoothing", "--rl.seeds", "0", "--rl.seeds must be >= 1; got 0"),
    ("prim", "--eval.check-fraction", "0.5", "--eval.check-fraction must be one of pruning.fractions=(0.25,); got 0.5"),
    ("toast", "--toast.sparsity", "60", "--toast.sparsity must be one of scwp.sparsities=(50.0,); got 60.0"),
    ("dem_hec", "--eval.severities", "6", "--eval.severities must be ints in 1..5; got (6,)"),
    ("scm_grpo", "--rl.group-size", "1", "--rl.group-size must be >= 2 (GRPO normalises within a group); got 1"),
    ("ddm_signals", "--timing.grid", "1", "--timing.grid must be >= 2 (candidate signal times on [0, H]); got 1"),
    ("qvg", "--eval.gen-frames", "1", "--eval.gen-frames must be >= 2 (the first generated frame never reads the span); got 1"),
    ("fm_active_learning", "--noise.kind", "blur", "--noise.kind must be one of ('symmetric', 'pair'), got 'blur'"),
    ("nmars", "--augment.kind", "random", "--augment.kind must be one of ('inferred', 'diff'); got 'random'"),
    ("gaussian_sup", "--greedy.set-prob", "0", "--greedy.set-prob must be in (0, 1]; got 0.0"),
    ("router_interp", "--interp.min-precision", "1.5", "--interp.min-precision must be in (0, 1], got 1.5"),
    ("ppm", "--data.noises", "laplace", "--data.noises must be a non-empty subset of ('gaussian', 'bimodal'); got "
     "('laplace',)"),
    ("staged_vlm", "--rl.iterations", "2", "--rl.iterations must be >= 3 (one per stage); got 2"),
    ("camp", "--pref.num-samples", "0", "--pref.num-samples must be >= 1; got 0"),
    ("rosa2", "--users.prior-trust", "1.0", "--users.prior-trust must lie in (0, 1); got 1.0"),
    ("style_heads", "--checks.claimed-heads", "3", "--checks.claimed-heads must be one of steer.head_counts=(1, 2); got 3"),
    ("lm_arithmetic", "--train.num-steps", "0", "--train.num-steps must be >= 1; got 0"),
    ("ffd", "--checks.main-delta", "3.0", "--checks.main-delta must be one of synth.deltas (2.0, 5.0); got 3.0"),
    ("online_covering", "--lam", "1", "--lam must be > 1, got 1.0"),
    ("sparse_scaling", "--train.max-epochs", "1", "--train.max-epochs must be >= 2 to measure repetition; got 1"),
    ("eelma", "--data.gamma", "1", "--data.gamma must lie in [0, 1), got 1.0"),
    ("e2i_vrwkv", "--checks.min-gain", "-1", "--checks.min-gain must be >= 0; got -1.0"),
    ("mafe", "--eval.episodes", "1", "--eval.episodes must be >= 2, got 1"),
    ("conformal_pt", "--stability.runs", "1", "--stability.runs must be >= 2; got 1"),
    ("ope_mnar", "--mnar.missing-rate", "1.5", "--mnar.missing-rate must lie in (0, 1), got 1.5"),
    ("sysr", "--budget.step", "0", "--budget.step must be > 0; got 0.0"),
    ("mvprobe", "--probe.layer", "3", "--probe.layer must lie in [0, 2] (zoo.hidden has 2 hidden layers); got 3"),
    ("calculus_grading", "--ai.num-runs", "0", "--ai.num-runs must be >= 1, got 0"),
    ("hyper_icl", "--task.num-demos", "3", "--task.num-demos must be <= task.max_demos=2; got 3"),
    ("plmd", "--data.num-test", "1", "--data.num-test must be >= 2; got 1"),
    ("safethink", "--monitor.tau", "0", "--monitor.tau must lie in (0, 1]; got 0.0"),
    ("safethink", "--eval.prompts", "1", "--eval.prompts must be >= 2; got 1"),
    ("moe_rerouting", "--eval.em-alpha", "1", "--eval.em-alpha must be in (0, 1); got 1.0"),
    ("moe_rerouting", "--retrieval.num-neighbors", "20", "--retrieval.num-neighbors must be <= "
     "retrieval.bank_size=16; got 20"),
    ("vegas", "--draft.main-gamma", "4", "--draft.main-gamma must be one of draft.gammas=(2,); got 4"),
    ("rl_compute_allocation", "--sweep.bp-grid", "32", "--sweep.bp-grid must be <= bandit.num_problems=16; got (32,)"),
    ("rl_compute_allocation", "--bandit.num-answers", "1", "--bandit.num-answers must be >= 2; got 1"),
])
def test_a_bad_nested_value_names_its_flag(slug, flag, value, message, tmp_path, capsys):
    assert cli.main(["run", slug, "--preset", "smoke", "--results-dir", str(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err
    assert f"bad config for {slug!r} [smoke]: {message}" in err, err
    assert not list(tmp_path.iterdir())  # nothing ran


def test_flat_fields_and_repr_give_the_pre_sections_view():
    @dataclasses.dataclass(frozen=True)
    class Train:
        steps: int = 3

    @dataclasses.dataclass(frozen=True)
    class Nested:
        train: Train = Train()
        seed: int = 0
        progress: bool = False

    pairs = (("train_steps", "train.steps"), ("seed", "seed"), ("progress", "progress"))
    c = Nested()
    assert registry.flat_fields(c, pairs) == {"train_steps": 3, "seed": 0, "progress": False}
    assert registry.flat_fields(c, pairs, skip=("progress",)) == {"train_steps": 3, "seed": 0}
    assert registry.flat_repr(c, pairs, replace={"progress": True}) == "Config(train_steps=3, seed=0, progress=True)"
