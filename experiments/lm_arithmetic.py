"""Foundation check: the tiny decoder LM learns multi-digit addition.

Trains `models.Transformer` with `algorithms.training.fit` on
`experiments.tasks.ArithmeticTask` problems (answers written least-significant
digit first), then decodes held-out problems greedily with
`algorithms.decoding.generate` and scores exact match. Train and test problems
are disjoint by construction (hash split). Also reports training throughput and
model-FLOPs utilization (MFU) against this machine's own matmul peak measured
in the same run.

Recipe:
    python -m experiments run lm_arithmetic --preset quick    # 2 CPU cores, about 3 minutes
    python -m experiments run lm_arithmetic --preset smoke    # seconds, used by the tests
    python -m experiments run lm_arithmetic --preset paper    # larger model, 4-digit, accelerator

Expected (quick): held-out exact match >= 95%.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Mapping

import numpy as np
from flax import nnx

from algorithms import training
from experiments import _plotting as plotting
from experiments import registry, report
from experiments._lm import LMConfig
from experiments._measure import complete_prompts, matmul_peak_flops, steady_throughput
from experiments.checks import Check
from experiments.checks import verdict as verdict_from_checks
from experiments.tasks import ArithmeticTask
from models import Transformer


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSection:
    """The arithmetic problems (``--task.num-digits 4``)."""

    num_digits: int = 3
    operations: tuple[str, ...] = ("+",)
    reverse_answer: bool = True
    pad_operands: bool = True
    test_fraction: float = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """Training (``--train.num-steps 50``)."""

    batch_size: int = 64
    num_steps: int = 2000
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    log_every: int = 100
    data_parallel: bool = False  # shard the batch over all devices (mesh data=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Greedy exact-match evaluation and the matmul peak for MFU (``--eval.examples 128``)."""

    examples: int = 512
    batch_size: int = 256
    target_accuracy: float = 0.95
    peak_matmul_dim: int = 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """lm_arithmetic settings, in sections overridden on the command line as ``--train.num-steps 50``."""

    task: TaskSection = TaskSection()
    # The model (the vocabulary comes from the task's tokenizer).
    model: LMConfig = LMConfig(d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=384)
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    checkpoint_every: int = 500
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        if self.eval.examples < 1:
            raise registry.ConfigError("eval.examples", f"must be >= 1; got {self.eval.examples}")


# The flat field names the config had before it was split into sections, in their old order: the training
# fingerprint is the old flat repr, so checkpoints written before the split stay valid.
_FLAT_FIELDS = (
    ("num_digits", "task.num_digits"), ("operations", "task.operations"), ("reverse_answer", "task.reverse_answer"),
    ("pad_operands", "task.pad_operands"), ("test_fraction", "task.test_fraction"), ("model", "model"),
    ("batch_size", "train.batch_size"), ("num_steps", "train.num_steps"), ("learning_rate", "train.learning_rate"),
    ("warmup_steps", "train.warmup_steps"), ("weight_decay", "train.weight_decay"),
    ("checkpoint_every", "checkpoint_every"), ("log_every", "train.log_every"),
    ("data_parallel", "train.data_parallel"), ("eval_examples", "eval.examples"),
    ("eval_batch_size", "eval.batch_size"), ("target_accuracy", "eval.target_accuracy"),
    ("peak_matmul_dim", "eval.peak_matmul_dim"), ("seed", "seed"), ("progress", "progress"),
)


def _fingerprint(c: Config) -> str:
    """The training run's fingerprint: the repr of the pre-sections flat config with progress=True
    (``Config(num_digits=3, operations=('+',), ...)``)."""
    return registry.flat_repr(c, _FLAT_FIELDS, replace={"progress": True})


def _task(c: Config) -> ArithmeticTask:
    t = c.task
    return ArithmeticTask(num_digits=t.num_digits, operations=t.operations, reverse_answer=t.reverse_answer,
                          pad_operands=t.pad_operands, test_fraction=t.test_fraction, seed=c.seed)


def exact_match(model: nnx.Module, task: ArithmeticTask, prompts: list[str], *, batch_size: int) -> np.ndarray:
    """Greedy-decodes each prompt and returns a bool array of exact matches."""
    tok = task.tokenizer()
    max_answer = len(str(10 ** task.num_digits * 10 ** task.num_digits)) + 2
    tokens, _ = complete_prompts(model, tok, prompts, max_new_tokens=max_answer, chunk=batch_size)
    return np.array([task.is_correct(p, tok.decode(tokens[j])) for j, p in enumerate(prompts)])


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    hist = metrics["history"]
    steps = f" after {hist[-1]['step']} steps" if hist else ""
    return (f"held-out exact match {metrics['test_exact_match']:.1%} (train {metrics['train_exact_match']:.1%})"
            f"{steps}; {metrics['num_params'] / 1e3:.0f}k params, {metrics['train_tokens_per_s']:,.0f} train "
            f"tokens/s, MFU {metrics['mfu']:.1%}")


def _host_rows(batch: dict) -> dict:
    """This host's rows of the global batch (all of it on one host; see `training.process_rows`)."""
    rows = training.process_rows(len(batch["inputs"]))
    return {k: v[rows] for k, v in batch.items()}


def _optimizer(c: Config) -> training.OptimizerConfig:
    t = c.train
    return training.OptimizerConfig(learning_rate=t.learning_rate, warmup_steps=min(t.warmup_steps, t.num_steps),
                                    total_steps=t.num_steps, weight_decay=t.weight_decay)


def train_step(c: Config):
    """The training step `run` takes, for ``python -m experiments aot lm_arithmetic`` (`experiments.aot`)."""
    from experiments import aot

    task = _task(c)
    return aot.TrainStep(model=c.model.transformer(task.tokenizer().vocab_size), optimizer=_optimizer(c),
                         batch_size=c.train.batch_size, seq_len=task.max_seq_len - 1)


def run(c: Config, workdir: pathlib.Path) -> dict:
    task = _task(c)
    tok = task.tokenizer()
    seq_len = task.max_seq_len
    model_cfg = c.model.transformer(tok.vocab_size)
    opt = _optimizer(c)
    result = training.fit(
        model_fn=lambda rngs: Transformer(model_cfg, rngs=rngs),
        optimizer_config=opt,
        batch_fn=lambda position: _host_rows(task.train_batch(position, batch_size=c.train.batch_size,
                                                              seq_len=seq_len)),
        num_steps=c.train.num_steps,
        workdir=workdir,
        mesh_config=training.MeshConfig(data=-1) if c.train.data_parallel else None,
        seed=c.seed,
        checkpoint_every=c.checkpoint_every,
        log_every=c.train.log_every,
        progress=c.progress,
        desc="lm_arithmetic",
        fingerprint=_fingerprint(c),
    )
    model = result.model()

    test_prompts, _ = task.sample(c.eval.examples, split="test", seed=10_000)
    train_prompts, _ = task.sample(c.eval.examples, split="train", seed=20_000)
    test_acc = float(exact_match(model, task, test_prompts, batch_size=c.eval.batch_size).mean())
    train_acc = float(exact_match(model, task, train_prompts, batch_size=c.eval.batch_size).mean())

    # Throughput and MFU, against the matmul peak measured now on this machine.
    tokens_per_example = seq_len - 1
    examples_per_s = steady_throughput(result.history)
    tokens_per_s = examples_per_s * tokens_per_example
    model_flops = model_cfg.flops_per_token(tokens_per_example) * tokens_per_s
    peak = matmul_peak_flops(c.eval.peak_matmul_dim)
    mfu = model_flops / peak

    plots = [_plot(result.history, workdir)]
    checks = [Check(f"held-out exact match on {len(test_prompts)} unseen {c.task.num_digits}-digit problems", test_acc,
                    paper="a tiny decoder LM learns multi-digit addition (foundation check)",
                    threshold=f">= {c.eval.target_accuracy:g}", passed=test_acc >= c.eval.target_accuracy,
                    note=f"train split {train_acc:.1%}")]
    verdict, reproduced = verdict_from_checks(
        checks, claim="the tiny decoder LM learns multi-digit addition",
        context=(f"After {c.train.num_steps} steps; {tokens_per_s:,.0f} train tokens/s, MFU {mfu:.1%} of the measured "
                 f"{peak / 1e9:.1f} GFLOP/s f32 matmul peak"),
        cause="too few training steps for this preset (scale limit), or a bug when the quick preset fails")
    return {
        "metrics": {
            "test_exact_match": test_acc,
            "train_exact_match": train_acc,
            "final_loss": result.history[-1]["loss"] if result.history else math.nan,
            "train_tokens_per_s": tokens_per_s,
            "model_flops_per_s": model_flops,
            "matmul_peak_flops_per_s": peak,
            "mfu": mfu,
            "num_params": model_cfg.num_params(),
            "resumed_from_step": result.resumed_from if result.resumed_from is not None else -1,
            "history": result.history,
            "checks": [ch.as_dict() for ch in checks],
        },
        "verdict": verdict,
        "reproduced": reproduced,
        "plots": plots,
    }


def _plot(history, workdir: pathlib.Path) -> str:
    steps = [h["step"] for h in history]
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(9, 3.2))
    ax1.plot(steps, [h["loss"] for h in history])
    ax1.set(xlabel="step", ylabel="answer-token loss", yscale="log", title="training loss")
    ax2.plot(steps, [h["token_accuracy"] for h in history])
    ax2.set(xlabel="step", ylabel="answer-token accuracy", ylim=(0, 1.02), title="teacher-forced accuracy")
    return report.savefig(fig, workdir / "training.png")


EXPERIMENT = registry.Experiment(
    slug="lm_arithmetic",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(task=TaskSection(num_digits=2),
                                model=LMConfig(d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=64),
                                train=TrainSection(batch_size=16, num_steps=6, warmup_steps=2, log_every=2),
                                checkpoint_every=3, eval=EvalSection(examples=16, batch_size=16, peak_matmul_dim=128),
                                progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(task=TaskSection(num_digits=4),
                                model=LMConfig(d_model=256, num_layers=4, num_heads=8, num_kv_heads=2, d_ff=768),
                                train=TrainSection(batch_size=256, num_steps=10_000, learning_rate=1e-3,
                                                   data_parallel=True),
                                eval=EvalSection(examples=4096, batch_size=1024, peak_matmul_dim=4096)),
    },
    run=run,
    train_step=train_step,
    claim="A 2-layer decoder LM trained from scratch on CPU reaches >= 95% exact match on held-out "
          "3-digit addition problems within the quick preset.",
)
