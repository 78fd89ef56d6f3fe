"""N-MARS (<UNDO> token): plain SFT vs SFT on augmented traces vs masked SFT vs masked SFT + GRPO.

Tasks (`task.name`):

  * "sort" (default): sort `task.sort_length` numbers drawn from [0, `task.sort_values`),
    one token per number (`experiments.tasks.sorting.SortingTask`). The next
    output depends on what is already written (the smallest remaining number),
    so a wrongly emitted number is detectable from the context.
  * "msd_addition": most-significant-digit-first addition of two zero-padded
    `task.num_digits` numbers (`ArithmeticTask(pad_operands=True)`, e.g.
    "0123+4567=04690"). Our first quick run used it (4 digits): the warm-start
    model already reached 0.994 exact match greedy and sampled, leaving no room
    for corrections, so the default moved to sorting (criterion unchanged).

Pipeline (per seed, same data stream for every arm):

  0. Warm start: a tiny decoder LM (vocabulary V, no <UNDO>) trained by plain
     SFT for `train.base_steps` on clean problems.
  1. Four arms continue from it for `train.sft_steps` more steps:
     (A) plain SFT on clean data. For one shared compilation it runs in the
         extended vocabulary, but <UNDO> is never a target and A is decoded with
         p(UNDO)=0 (`nmars.NoUndoSampler`), which is exactly plain decoding;
     (B) SFT on augmented traces *without* masking (negative control), vocabulary
         V + 1 with a semantically initialised <UNDO> (mean of all embeddings:
         a character vocabulary has no "undo"-like word);
     (C) N-MARS masked SFT (mSFT) on the same augmented traces;
     (D) C followed by `rl.steps` GRPO iterations with the <UNDO> reward
         (`algorithms.rl.nmars.make_reward_fn`).
     Augmented traces (`augment.kind`):
       * "inferred" (the spec's simple variant, quick preset): for
         `augment.fraction` of the rows, the warm-start model's own deviation
         (k in `augment.deviation_lengths`, at a position where its greedy top-1 is
         wrong when there is one) followed by k <UNDO>s and the reference;
       * "diff" (the paper's, Section 3.1, Eq. 2-5): the warm-start model samples
         a completion for every training prompt (temperature
         `augment.sample_temperature`), the sample is aligned to the reference by its
         maximal matching blocks (`difflib`), and each error span is followed by
         one <UNDO> per error token and the reference's correction
         (`nmars.diff_augment_batch`); a correct sample leaves its row clean.
  2. Evaluation on held-out problems: exact match of the rendered output under
     greedy decoding and T=1 sampling, <UNDO> rate, precision (share of <UNDO>s
     that erased a wrong token) and raw-token overhead; C is also decoded with
     <UNDO> forbidden (p(UNDO)=0) to separate "learned to undo" from "learned
     better digits".
  With `seeds=(...)` the whole pipeline runs once per seed (each in
  `workdir/seed_<s>`), and the criterion is judged on the means over seeds,
  reported with per-seed numbers and standard errors.

Success criterion, fixed before the first run: the paper's direction holds when
(i) C's sampled exact match is above A's and above B's, and (ii) D's <UNDO>
precision (sampled) is above C's. Numbers and binomial standard errors are
reported whatever the outcome; seeds are not searched.

Recipe:
    python -m experiments run nmars --preset smoke   # seconds, used by the tests
    python -m experiments run nmars --preset quick   # 2 CPU cores, about 2 minutes
    python -m experiments run nmars --preset diff_study   # the paper's augmentation, 3 seeds (issue 33)
    python -m experiments run nmars --preset paper   # bigger model, longer training, accelerator
    python -m experiments run nmars --preset smoke --augment.kind inferred   # one field of a config section

Config sections (`run nmars --help` lists every field): task, model, train, augment, undo, rl, decode, eval.

The quick preset is small (2 layers, 64 wide, one seed); differences of about
two standard errors or less are within noise.

Observed (quick, sorting, seed 0, 512 held-out lists; greedy / T=1 sampled exact
match): base 0.959 / 0.918, A 0.994 / 0.961, B 0.945 / 0.363, C 0.930 / 0.645
(C with p(UNDO)=0: 0.957 / 0.793), D 0.953 / 0.867. Sampled UNDO precision
B 0.35, C 0.16, D 0.67 (D keeps almost no UNDOs: 0.02 of sequences). Masking
beats no masking and GRPO raises precision, but masked SFT stays below plain SFT.

Issue 33 asked whether that is the spec's simplified augmentation or the 96%-accurate
warm start. The "diff_study" preset answers it: the paper's augmentation (the warm
start's own T=1 samples aligned by diff, Eq. 2-5, every training row), a warm start
of 300 steps (measured before the study: sampled EM 0.50 / 0.42 / 0.48 on seeds
0 / 1 / 2 at 300 steps; 0.41 at 250, 0.60 at 400 on seed 0), 3 seeds, 324 s on
2 CPU cores. Mean sampled EM +- SE over seeds: base 0.469+-0.024, A 0.695+-0.028,
B 0.263+-0.026, C 0.412+-0.037, C with p(UNDO)=0 0.513+-0.021, D 0.577+-0.027; C-A
is -0.285 / -0.320 / -0.244 per seed, C-B +0.150 / +0.105 / +0.191; UNDO precision
C 0.51 (0.16 with the spec's augmentation), D 0.78. So masking still beats no
masking and GRPO still raises precision, and mSFT still loses to plain SFT, on
every seed: the failure survives the paper's augmentation and a weak warm start.
The tiny model neither detects its errors (half of C's UNDOs erase correct tokens)
nor keeps plain SFT's token accuracy when trained on traces full of its own
errors (C without UNDO 0.513 vs A 0.695): cause class "scale" (the method as the
paper writes it, a 2-layer 64-wide model after 600 steps), not "spec".
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
import optax
from flax import nnx

from algorithms import training
from algorithms.rl import grpo
from algorithms.decoding import generate
from algorithms.rl import nmars
from experiments import _plotting as plotting
from experiments import registry, report
from experiments._lm import LMConfig
from experiments._measure import complete_prompts
from experiments.checks import Check
from experiments.checks import verdict as verdict_from_checks
from experiments.tasks import ArithmeticTask, lm_batch, prompt_batch
from experiments.tasks.sorting import SortingTask
from models import Transformer
from primitives.sampling import Sampler

ARMS = ("A_sft", "B_aug_unmasked", "C_msft", "D_msft_grpo")
AUGMENTATIONS = ("inferred", "diff")
BASE_STEPS_WEAK = 300  # warm-start steps whose sampled EM is about 0.5 (measured, see the module docstring)


TASKS = ("sort", "msd_addition")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSection:
    """The problems (``--task.name msd_addition --task.num-digits 4``)."""

    name: str = "sort"  # "sort" (lists of sort_length numbers in [0, sort_values)) or "msd_addition"
    sort_length: int = 8
    sort_values: int = 50
    num_digits: int = 4  # msd_addition: zero-padded operands, answer most significant digit first
    test_fraction: float = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """The warm start (plain SFT from scratch) and the SFT arms A-C continued from it (``--train.sft-steps 300``)."""

    batch: int = 64
    base_steps: int = 1200
    base_lr: float = 3e-3
    sft_steps: int = 600
    sft_lr: float = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class AugmentSection:
    """The augmented traces of arms B and C (``--augment.kind diff``)."""

    kind: str = "inferred"  # "inferred" (spec's simple variant) or "diff" (paper Section 3.1, Eq. 2-5)
    fraction: float = 0.5
    diff_spans: str = "all"  # diff: "all" (paper Eq. 5, every divergence repaired) or "first"
    diff_alignment: str = "diff"  # diff: "diff" (maximal matching blocks, paper Eq. 3) or "prefix" (control)
    sample_temperature: float = 1.0  # diff: temperature of the warm-start samples that are aligned (0 = greedy)
    sample_extra_tokens: int = 2  # diff: sample budget beyond the answer + EOS
    deviation_lengths: tuple[int, ...] = (1, 2, 3)  # inferred: the deviation's length k
    position_mode: str = "hard"  # inferred
    deviation_temperature: float = 1.0  # inferred


@dataclasses.dataclass(frozen=True, kw_only=True)
class UndoSection:
    """The <UNDO> token's initial embedding (``--undo.init zero``)."""

    init: str = "semantic"
    semantic_chars: str = ""  # "" = mean of all embeddings (a char vocabulary has no "undo" word)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLSection:
    """Arm D: GRPO from C with the <UNDO> reward (``--rl.steps 200``)."""

    steps: int = 100
    prompts: int = 16
    group_size: int = 8
    lr: float = 1e-4
    alpha: float = 0.05
    beta: float = 0.05
    max_undos: int = 8
    reward_mode: str = "token"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeSection:
    """Sampling of the GRPO rollouts and of the evaluation (``--decode.temperature 0.7``)."""

    temperature: float = 1.0
    extra_new_tokens: int = 6  # raw budget beyond the answer + EOS, for <UNDO>s and erased tokens


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """The held-out problems (``--eval.problems 1024``)."""

    problems: int = 512
    chunk: int = 512


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """nmars settings, in sections overridden on the command line as ``--augment.kind diff``."""

    task: TaskSection = TaskSection()
    model: LMConfig = LMConfig(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=192)
    train: TrainSection = TrainSection()
    augment: AugmentSection = AugmentSection()
    undo: UndoSection = UndoSection()
    rl: RLSection = RLSection()
    decode: DecodeSection = DecodeSection()
    eval: EvalSection = EvalSection()
    checkpoint: bool = True
    seed: int = 0
    seeds: tuple[int, ...] = ()  # () = one run with `seed`; else the whole pipeline once per seed
    progress: bool = True

    def __post_init__(self):
        err, a = registry.ConfigError, self.augment
        if self.task.name not in TASKS:
            raise err("task.name", f"must be one of {TASKS}; got {self.task.name!r}")
        if a.kind not in AUGMENTATIONS:
            raise err("augment.kind", f"must be one of {AUGMENTATIONS}; got {a.kind!r}")
        if a.diff_spans not in nmars.SPANS:
            raise err("augment.diff_spans", f"must be one of {nmars.SPANS}; got {a.diff_spans!r}")
        if a.diff_alignment not in nmars.ALIGNMENTS:
            raise err("augment.diff_alignment", f"must be one of {nmars.ALIGNMENTS}; got {a.diff_alignment!r}")
        for name in ("sample_temperature", "sample_extra_tokens"):
            if getattr(a, name) < 0:
                raise err(f"augment.{name}", f"must be >= 0; got {getattr(a, name)}")
        if len(set(self.seeds)) != len(self.seeds):
            raise err("seeds", f"must be distinct; got {self.seeds}")


def _task(c: Config):
    """(task, prompt length, answer length, answer characters) of the configured task."""
    if c.task.name == "sort":
        task = SortingTask(length=c.task.sort_length, num_values=c.task.sort_values, test_fraction=c.task.test_fraction,
                           seed=c.seed)
        return task, task.prompt_len, task.answer_len, task.answer_chars
    if c.task.name == "msd_addition":
        task = ArithmeticTask(num_digits=c.task.num_digits, operations=("+",), pad_operands=True,
                              test_fraction=c.task.test_fraction, seed=c.seed)
        return task, 1 + 2 * c.task.num_digits + 2, c.task.num_digits + 1, "0123456789"
    raise registry.ConfigError("task.name", f"must be one of {TASKS}; got {c.task.name!r}")


def _clean_batch(c: Config, task, position: int, seq_len: int):
    prompts, answers = task.sample(c.train.batch, split="train", seed=1_000_000 + position)
    return lm_batch(task.tokenizer(), prompts, answers, seq_len=seq_len), answers


def _opt_config(steps: int, lr: float) -> training.OptimizerConfig:
    return training.OptimizerConfig(learning_rate=lr, warmup_steps=min(100, steps // 5), total_steps=steps,
                                    weight_decay=0.01)


def _sft_optimizer(c: Config) -> training.OptimizerConfig:
    """The optimizer of the SFT arms A-C (N-MARS masked SFT is arm C), continued from the warm start."""
    return _opt_config(c.train.sft_steps, c.train.sft_lr)


def _widths(c: Config, seq_len: int, prompt_len: int, answer_len: int) -> tuple[int, int]:
    """(warm start's, arms') batch widths in tokens (``tokens``; ``inputs`` is one shorter)."""
    aug_len = seq_len + 2 * max(c.augment.deviation_lengths)
    base_len = aug_len  # the warm start's batch width (the quick preset's, kept for its checkpoints)
    if c.augment.kind == "diff":
        aug_len = max(aug_len, _diff_width(c, prompt_len, answer_len))
        base_len = seq_len
    return base_len, aug_len


def train_step(c: Config):
    """The masked-SFT step of the arms (N-MARS mSFT, arm C; A and B take the same compiled step), for
    ``python -m experiments aot nmars`` (`experiments.aot`).

    The model is the warm start's LM with the <UNDO> row added to the vocabulary, the batch ``c.train.batch``
    augmented traces of the arms' width, the loss `fit`'s masked next-token cross-entropy (the mask drops the
    error tokens). The warm-start step before it is the same LM without the <UNDO> row on a batch no wider;
    the GRPO steps after it (arm D) are not `make_train_step` steps.
    """
    from experiments import aot

    task, prompt_len, answer_len, _ = _task(c)
    _, aug_len = _widths(c, task.max_seq_len, prompt_len, answer_len)
    return aot.TrainStep(model=nmars.extend_config(c.model.transformer(task.tokenizer().vocab_size)),
                         optimizer=_sft_optimizer(c), batch_size=c.train.batch, seq_len=aug_len - 1)


def _continue(c, name, step_fn, optimizer, params, batch_fn, steps, workdir, fingerprint) -> dict:
    """SFT continued from `params` with a shared compiled `step_fn` (the arms A/B/C share one compilation).

    Resumes from `workdir/name/ckpt` like `training.fit`: data is drawn by position.
    """
    from tqdm.auto import tqdm

    state = training.TrainState(jnp.zeros((), jnp.int32), jax.tree.map(jnp.copy, params), optimizer.init(params))
    ckpt = training.Checkpointer(workdir / name / "ckpt") if c.checkpoint else None
    history, start = [], 0
    if ckpt is not None and ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)
        if meta.get("fingerprint") != fingerprint:
            ckpt.close()
            raise ValueError(f"the checkpoint in {ckpt.directory} belongs to another run (fingerprint "
                             f"{meta.get('fingerprint')!r}, this run {fingerprint!r}); use a fresh workdir")
        history, start = list(meta["history"]), int(meta["data_position"])
    log_every = max(1, steps // 10)
    try:
        for pos in tqdm(range(start, steps), desc=f"nmars {name}", disable=not c.progress, leave=False):
            state, metrics = step_fn(state, batch_fn(pos))
            if (pos + 1) % log_every == 0 or pos + 1 == steps:
                history.append(dict({k: float(v) for k, v in jax.device_get(metrics).items()}, step=pos + 1))
        if ckpt is not None and start < steps:
            ckpt.save(steps, state, {"data_position": steps, "history": history, "fingerprint": fingerprint})
    finally:
        if ckpt is not None:
            ckpt.close()
    return {"params": state.params, "history": history}


def evaluate(graphdef, params, task, prompts, answers, *, undo_id, sampler, key, max_new_tokens: int,
             prompt_len: int, chunk: int) -> dict:
    """Decodes every prompt once with `sampler`; rendered exact match and <UNDO> metrics."""
    tok = task.tokenizer()
    model = nnx.merge(graphdef, params)
    toks, lens = complete_prompts(model, tok, prompts, max_new_tokens=max_new_tokens, sampler=sampler, key=key,
                                  chunk=chunk, prompt_len=prompt_len)
    refs = [tok.encode(a) for a in answers]
    return nmars.undo_metrics(toks, lens, refs, undo_id=undo_id, eos_id=tok.eos_id)


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    def r(x, d=3):
        return f"{float(x):.{d}f}".removeprefix("0")

    ev = metrics["evals"]
    names = {"A_sft": "SFT", "B_aug_unmasked": "unmasked augmentation", "C_msft": "mSFT", "D_msft_grpo": "mSFT+GRPO"}
    out = "sorting, tiny LM, sampled exact match: " + ", ".join(
        f"{lab} {r(ev[a]['sampled']['exact_match'])}" for a, lab in names.items() if a in ev)
    if "D_msft_grpo" in ev:
        c, d = ev["C_msft"]["sampled"], ev["D_msft_grpo"]["sampled"]
        out += f" (UNDO precision {r(c['precision'], 2)} -> {r(d['precision'], 2)} on {d['num_undo']} UNDOs)"
    if "C_msft_no_undo" in ev:
        out += f"; mSFT decoded without UNDO {r(ev['C_msft_no_undo']['sampled']['exact_match'])}"
    return out


def _diff_width(c: Config, prompt_len: int, answer_len: int) -> int:
    """Widest diff-augmented row: prompt + sample (m) + its <UNDO>s (<= m) + corrections (<= L) + EOS."""
    sample_new = answer_len + 1 + c.augment.sample_extra_tokens
    return prompt_len + 2 * sample_new + answer_len + 1


def _run_seed(c: Config, workdir: epath.Path) -> dict:
    """The whole pipeline (warm start, arms A-D, evaluation) for `c.seed`; returns its evals and logs."""
    task, prompt_len, answer_len, answer_chars = _task(c)
    tok = task.tokenizer()
    seq_len = task.max_seq_len
    base_len, aug_len = _widths(c, seq_len, prompt_len, answer_len)
    max_new = answer_len + 1 + c.decode.extra_new_tokens
    model_cfg = c.model.transformer(tok.vocab_size)
    ext_cfg = nmars.extend_config(model_cfg)
    digit_ids = tok.encode(answer_chars)

    # 0. Warm start on clean data (vocabulary V, no <UNDO>), from a fresh init.
    make = lambda: Transformer(model_cfg, rngs=nnx.Rngs(c.seed))
    base_graphdef, _ = nnx.split(nnx.eval_shape(make), nnx.Param)
    init = jax.jit(lambda: nnx.to_pure_dict(nnx.split(make(), nnx.Param)[1]))()  # one compile, not one per op
    if c.train.base_steps > 0:
        base_opt_cfg = _opt_config(c.train.base_steps, c.train.base_lr)
        base_opt = training.make_optimizer(base_opt_cfg)
        base = _continue(c, "base", training.make_train_step(base_graphdef, base_opt), base_opt, init,
                         lambda pos: {k: v for k, v in _clean_batch(c, task, pos, base_len)[0].items()
                                      if k in ("inputs", "targets", "loss_mask")},
                         c.train.base_steps, workdir,
                         repr(("base", model_cfg, base_opt_cfg, c.train.batch, c.task.name, c.task.num_digits,
                               c.task.sort_length, c.task.sort_values, c.task.test_fraction, c.seed)
                              + ((base_len,) if c.augment.kind == "diff" else ())))
    else:  # smoke only: no warm start (saves a compilation); the arms below still train
        base = {"params": init, "history": [{"loss": float("nan")}]}
    base_params = base["params"]
    base_forward = jax.jit(lambda p, x: nnx.merge(base_graphdef, p)(x).logits)

    # 1. Arms.
    def clean_fn(pos):
        b, _ = _clean_batch(c, task, c.train.base_steps + pos, aug_len)
        return {k: b[k] for k in ("inputs", "targets", "loss_mask")}

    aug_log: dict[int, tuple[int, int, int]] = {}  # position -> (rows, rows with an error span, <UNDO>s)

    def inferred_fn(mask_deviations):
        def batch_fn(pos):
            b, answers = _clean_batch(c, task, c.train.base_steps + pos, seq_len)
            comp_len = np.array([len(a) + 1 for a in answers], np.int32)
            aug = nmars.augment_batch(lambda x: base_forward(base_params, jnp.asarray(x)), b["tokens"],
                                      b["prompt_lengths"], comp_len, undo_id=undo_id,
                                      rng=np.random.default_rng([c.seed, 21, pos]), allowed_ids=digit_ids,
                                      augment_fraction=c.augment.fraction,
                                      deviation_lengths=c.augment.deviation_lengths,
                                      position_mode=c.augment.position_mode,
                                      temperature=c.augment.deviation_temperature,
                                      mask_deviations=mask_deviations, pad_id=tok.pad_id, seq_len=aug_len)
            return {k: aug[k] for k in ("inputs", "targets", "loss_mask")}

        return batch_fn

    # The paper's augmentation (Section 3.1): the warm-start model's own sample for each training prompt,
    # aligned to the reference by diff. B and C see the same traces, so the samples are drawn once.
    base_model = nnx.merge(base_graphdef, base_params)
    sample_new = answer_len + 1 + c.augment.sample_extra_tokens
    base_sampler = Sampler(temperature=c.augment.sample_temperature)
    sample_key = jax.random.key(c.seed + 77)
    drawn: dict[int, tuple] = {}

    def warm_start_samples(pos):
        if pos not in drawn:
            b, answers = _clean_batch(c, task, c.train.base_steps + pos, seq_len)
            out = generate(base_model, jnp.asarray(b["tokens"][:, :prompt_len]),
                           prompt_lengths=jnp.asarray(b["prompt_lengths"]), max_new_tokens=sample_new,
                           sampler=base_sampler, key=jax.random.fold_in(sample_key, pos),
                           stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
            augment = np.random.default_rng([c.seed, 22, pos]).random(c.train.batch) < c.augment.fraction
            drawn[pos] = (b, np.array([len(a) + 1 for a in answers], np.int32), np.asarray(out.tokens),
                          np.asarray(out.lengths), augment)
        return drawn[pos]

    def diff_fn(mask_errors):
        def batch_fn(pos):
            b, comp_len, samples, sample_len, augment = warm_start_samples(pos)
            aug = nmars.diff_augment_batch(b["tokens"], b["prompt_lengths"], comp_len, samples, sample_len,
                                           undo_id=undo_id, eos_id=tok.eos_id, augment=augment,
                                           spans=c.augment.diff_spans, alignment=c.augment.diff_alignment,
                                           mask_errors=mask_errors, pad_id=tok.pad_id, seq_len=aug_len)
            aug_log[pos] = (int(augment.sum()), int((aug["num_undo"] > 0).sum()), int(aug["num_undo"].sum()))
            return {k: aug[k] for k in ("inputs", "targets", "loss_mask")}

        return batch_fn

    aug_fn = diff_fn if c.augment.kind == "diff" else inferred_fn
    semantic = tok.encode(c.undo.semantic_chars) if c.undo.semantic_chars else None
    ext_params, undo_id = nmars.add_undo_token(base_params, init=c.undo.init, semantic_ids=semantic,
                                               key=jax.random.key(c.seed + 5))
    aug_extra = (c.augment.fraction, c.augment.deviation_lengths, c.augment.position_mode,
                 c.augment.deviation_temperature, c.undo.init, c.undo.semantic_chars, c.train.base_steps,
                 c.train.base_lr)
    if c.augment.kind == "diff":
        aug_extra += ("diff", c.augment.diff_spans, c.augment.diff_alignment, c.augment.sample_temperature,
                      c.augment.sample_extra_tokens)
    # A, B and C continue in the extended vocabulary with one shared compiled step. A never sees an
    # <UNDO> target and is decoded with p(UNDO)=0, which is exactly plain SFT decoding (tested).
    ext_graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(ext_cfg, rngs=nnx.Rngs(0))), nnx.Param)
    opt_cfg = _sft_optimizer(c)
    optimizer = training.make_optimizer(opt_cfg)
    step_fn = training.make_train_step(ext_graphdef, optimizer)
    arm_data = {"A_sft": clean_fn, "B_aug_unmasked": aug_fn(False), "C_msft": aug_fn(True)}
    results = {name: _continue(c, name, step_fn, optimizer, ext_params, fn, c.train.sft_steps, workdir,
                               repr((name, ext_cfg, opt_cfg, c.train.batch, c.task.num_digits, c.task.test_fraction,
                                     c.seed) + aug_extra + (c.task.name, c.task.sort_length, c.task.sort_values)))
               for name, fn in arm_data.items()}
    params = {name: r["params"] for name, r in results.items()}
    drawn.clear()

    # (D) GRPO from C.
    def prompt_fn(it):
        prompts, _ = task.sample(c.rl.prompts, split="train", seed=2_000_000 + it)
        b = prompt_batch(tok, prompts, seq_len=prompt_len)
        return grpo.PromptBatch(prompts, b["tokens"], b["prompt_lengths"])

    reward_fn = nmars.make_reward_fn(lambda p: tok.encode(task.answer(p)), undo_id=undo_id, eos_id=tok.eos_id,
                                     alpha=c.rl.alpha, beta=c.rl.beta, max_undos=c.rl.max_undos, mode=c.rl.reward_mode)
    rl_cfg = grpo.GRPOConfig(group_size=c.rl.group_size, max_new_tokens=max_new, temperature=c.decode.temperature,
                             stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
    history = []
    if c.rl.steps > 0:
        rl = grpo.train(graphdef=ext_graphdef, params=params["C_msft"], config=rl_cfg, prompt_fn=prompt_fn,
                        optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adam(c.rl.lr)),
                        reward_fn=reward_fn, num_steps=c.rl.steps, seed=c.seed,
                        workdir=(workdir / "D_grpo") if c.checkpoint else None,
                        checkpoint_every=max(c.rl.steps // 2, 1), log_every=max(1, c.rl.steps // 20),
                        progress=c.progress, desc="nmars grpo",
                        fingerprint=repr(("D", rl_cfg, c.rl.lr, c.rl.steps, c.rl.prompts, c.rl.alpha, c.rl.beta,
                                          c.rl.max_undos, c.rl.reward_mode) + aug_extra
                                         + (c.train.sft_steps, c.train.sft_lr)))
        params["D_msft_grpo"] = rl.state.params
        history = rl.history

    # 2. Evaluation.
    prompts, answers = task.sample(c.eval.problems, split="test", seed=99)
    key = jax.random.key(c.seed + 123)
    kw = dict(key=key, max_new_tokens=max_new, prompt_len=prompt_len, chunk=c.eval.chunk)
    samplers = {"greedy": Sampler(), "sampled": Sampler(temperature=c.decode.temperature)}
    no_undo = {"greedy": nmars.NoUndoSampler(undo_id=undo_id),
               "sampled": nmars.NoUndoSampler(temperature=c.decode.temperature, undo_id=undo_id)}
    # The warm start is decoded through its extended params with p(UNDO)=0: the same tokens as the V-vocab model.
    to_eval = [("base", ext_params, no_undo), ("A_sft", params["A_sft"], no_undo)]
    to_eval += [(n, params[n], samplers) for n in ("B_aug_unmasked", "C_msft", "D_msft_grpo") if n in params]
    to_eval += [("C_msft_no_undo", params["C_msft"], no_undo)]
    evals = {name: {mode: evaluate(ext_graphdef, p, task, prompts, answers, undo_id=undo_id, sampler=s, **kw)
                    for mode, s in ss.items()}
             for name, p, ss in to_eval}
    rows, err_rows, undos = (sum(v[i] for v in aug_log.values()) for i in range(3))
    augmentation = ({"rows": rows, "rows_with_error_span": err_rows, "num_undo": undos,
                     "error_share": err_rows / rows if rows else float("nan"),
                     "undo_per_augmented_row": undos / err_rows if err_rows else float("nan")}
                    if c.augment.kind == "diff" and aug_log else None)
    return {"evals": evals, "num_eval_problems": len(prompts), "undo_id": undo_id, "history": history,
            "train_loss": {n: r["history"][-1]["loss"] for n, r in results.items()},
            "base_train_loss": base["history"][-1]["loss"], "augmentation": augmentation}


def _mean_evals(per_seed: list[dict]) -> dict:
    """The evals dict averaged over seeds (nan-aware for precision), same nesting as one seed's."""
    out = {}
    for arm, modes in per_seed[0].items():
        out[arm] = {}
        for mode, m in modes.items():
            vals = {}
            for k in m:
                xs = np.array([float(s[arm][mode][k]) for s in per_seed])
                vals[k] = float(np.nanmean(xs)) if np.isfinite(xs).any() else float("nan")
            vals["num_undo"] = int(round(vals["num_undo"]))
            out[arm][mode] = vals
    return out


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    if not c.seeds:
        one = _run_seed(c, workdir)
        evals, history = one["evals"], one["history"]
        metrics = {"evals": evals, "num_eval_problems": one["num_eval_problems"], "undo_id": one["undo_id"],
                   "train_loss": one["train_loss"], "base_train_loss": one["base_train_loss"],
                   "rl_reward_first": history[0]["reward_mean"] if history else None,
                   "rl_reward_last": history[-1]["reward_mean"] if history else None}
        if one["augmentation"] is not None:
            metrics["augmentation"] = one["augmentation"]
        verdict, reproduced, checks, cause_class = _verdict(evals, c, one["num_eval_problems"],
                                                            augmentation=one["augmentation"])
    else:
        runs = {s: _run_seed(dataclasses.replace(c, seed=s, seeds=()), workdir / f"seed_{s}") for s in c.seeds}
        per_seed = [r["evals"] for r in runs.values()]
        evals, history = _mean_evals(per_seed), runs[c.seeds[0]]["history"]
        n = runs[c.seeds[0]]["num_eval_problems"]
        metrics = {"evals": evals, "num_eval_problems": n, "seeds": list(c.seeds),
                   "per_seed": {str(s): {"evals": r["evals"], "train_loss": r["train_loss"],
                                         "base_train_loss": r["base_train_loss"], "augmentation": r["augmentation"],
                                         "rl_reward_first": r["history"][0]["reward_mean"] if r["history"] else None,
                                         "rl_reward_last": r["history"][-1]["reward_mean"] if r["history"] else None}
                                for s, r in runs.items()},
                   "undo_id": runs[c.seeds[0]]["undo_id"]}
        verdict, reproduced, checks, cause_class = _verdict_seeds(runs, evals, c, n)
    metrics["checks"] = [ch.as_dict() for ch in checks]
    plots = [_plot(evals, history, workdir)]
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots,
            "cause": cause_class if reproduced is False else None}


def _se(p: float, n: int) -> float:
    return float(np.sqrt(max(p * (1 - p), 1e-12) / n))


def _task_name(c: Config) -> str:
    if c.task.name == "sort":
        return f"sorting {c.task.sort_length} numbers in [0, {c.task.sort_values})"
    return f"MSD-first {c.task.num_digits}-digit addition"


_STUDY = "diff_study"  # the extra preset that runs the paper's augmentation over 3 seeds


def _study_sentence(study: dict | None) -> str:
    """One sentence with the study's mean sampled EM per arm (read from its result.json)."""
    if study is None:
        return (f"the '{_STUDY}' preset (the paper's diff augmentation, weaker warm start, 3 seeds) has no "
                f"committed result yet")
    ev = study["metrics"]["evals"]
    arms = ", ".join(f"{a} {ev[a]['sampled']['exact_match']:.3f}" for a in ("base", "A_sft", "B_aug_unmasked",
                                                                           "C_msft", "C_msft_no_undo") if a in ev)
    return (f"the '{_STUDY}' preset (results/nmars/{_STUDY}/, {study.get('wall_s', float('nan')):.0f} s; the paper's "
            f"diff augmentation of the warm start's own samples, weaker warm start, seeds "
            f"{study['metrics'].get('seeds')}) measured mean sampled EM {arms} and was "
            f"{'reproduced' if study.get('reproduced') else 'not reproduced (cause: ' + str(study.get('cause')) + ')'}")


def _row(evals: dict, arm: str, n: int) -> str:
    g, s = evals[arm]["greedy"], evals[arm]["sampled"]
    txt = (f"{arm}: greedy EM {g['exact_match']:.3f}, sampled EM {s['exact_match']:.3f} "
           f"(+-{_se(s['exact_match'], n):.3f})")
    if s["num_undo"] or g["num_undo"]:
        txt += (f", UNDO rate {s['undo_rate']:.3f}/token ({s['undo_seq_frac']:.2f} of sequences, {s['num_undo']} "
                f"UNDOs), precision {s['precision']:.2f}, overhead {s['overhead']:.3f} (sampled)")
    return txt


def _checks(em: Callable[[str], float], prec: Callable[[str], float], has_rl: bool, note: str) -> list[Check]:
    """The criterion fixed before the first run: C above A and above B on sampled EM; D's precision above C's."""
    ca, cb = em("C_msft") - em("A_sft"), em("C_msft") - em("B_aug_unmasked")
    checks = [
        Check("sampled exact match, masked SFT (C) minus plain SFT (A)", ca, paper="19.3 - 8.8 = +10.5 (GSM8K)",
              threshold="> 0", passed=ca > 0, note=note),
        Check("sampled exact match, masked SFT (C) minus SFT on augmented traces unmasked (B)", cb,
              paper="19.3 - 7.8 = +11.5 (GSM8K)", threshold="> 0", passed=cb > 0, note=note),
    ]
    if has_rl:
        pc, pd = prec("C_msft"), prec("D_msft_grpo")
        checks.append(Check("sampled UNDO precision after GRPO (D)", pd, paper="GRPO rewards effective UNDOs",
                            threshold=f"> masked SFT (C) precision {pc:.2f} (or C has no UNDO)",
                            passed=bool(np.isfinite(pd) and (not np.isfinite(pc) or pd > pc))))
    return checks


_CLAIM = "masked SFT beats SFT and unmasked augmented SFT, and GRPO raises UNDO precision"
_PAPER = ("Paper (Section 4, Table 3 ablation; GSM8K, Llama-3.2-1B): SFT 8.8, SFT on augmented traces 7.8, masked "
          "SFT 19.3; GRPO rewards effective UNDOs (Section 3.3).")


def _finish(checks, parts, cause, cause_class, has_rl):
    verdict, reproduced = verdict_from_checks(checks, claim=_CLAIM, context=" ".join(parts), cause=cause,
                                              cause_class=cause_class)
    if not has_rl:  # the criterion needs the GRPO arm: nothing is decided
        head = f"{'Reproduced' if reproduced else 'Not reproduced'}: {_CLAIM}."
        verdict = "Not decided (no GRPO arm)." + verdict.removeprefix(head)
        reproduced = None
    return verdict, reproduced, checks, (cause_class if reproduced is False else None)


def _diagnosis(em: Callable[[str], float], prec: Callable[[str], float], aug: dict | None) -> str:
    """What the measured numbers say about a failure of C against A (evidence for the cause)."""
    out = []
    if em("C_msft_no_undo") > em("C_msft"):
        out.append(f"C decoded with p(UNDO)=0 samples better ({em('C_msft_no_undo'):.3f}) than with its UNDOs "
                   f"({em('C_msft'):.3f}; precision {prec('C_msft'):.2f}): its UNDOs mostly erase correct tokens")
    else:
        out.append(f"C's UNDOs help it (sampled EM {em('C_msft'):.3f} with them, {em('C_msft_no_undo'):.3f} "
                   f"without; precision {prec('C_msft'):.2f})")
    if em("C_msft_no_undo") < em("A_sft"):
        out.append(f"even without UNDO, C's tokens are worse than A's ({em('C_msft_no_undo'):.3f} vs "
                   f"{em('A_sft'):.3f}): the augmented traces cost it plain accuracy")
    if aug:
        out.append(f"{aug['error_share']:.2f} of the training rows carried an error span "
                   f"({aug['undo_per_augmented_row']:.2f} UNDOs per such row)")
    return "; ".join(out)


def _verdict(evals: dict, c: Config, n: int, *, augmentation: dict | None = None):
    em = lambda arm: evals[arm]["sampled"]["exact_match"]
    prec = lambda arm: evals[arm]["sampled"]["precision"]
    aug_txt = ("the paper's diff alignment of the warm start's own samples (Section 3.1)" if c.augment.kind == "diff"
               else "the spec's inferred simple augmentation (one deviation of the warm start at a hard position)")
    parts = [
        _PAPER,
        f"Ours: {_task_name(c)}, {n} held-out problems, warm start {c.train.base_steps} steps, then "
        f"{c.train.sft_steps} steps per arm on {aug_txt}, GRPO {c.rl.steps} iterations x {c.rl.prompts} x "
        f"{c.rl.group_size} (one seed; +- is the binomial SE).",
        "; ".join(_row(evals, a, n) for a in ["base", *ARMS, "C_msft_no_undo"] if a in evals) + ".",
    ]
    has_rl = "D_msft_grpo" in evals
    if not has_rl:
        parts.append("No GRPO arm ran (rl.steps=0): criterion not evaluated.")
    checks = _checks(em, prec, has_rl, f"SE of a difference about {np.sqrt(2) * _se(em('C_msft'), n):.3f}")
    diag = _diagnosis(em, prec, augmentation)
    if c.augment.kind == "inferred":
        study = report.stored_result("nmars", _STUDY)
        study_ok = bool(study and study.get("reproduced"))
        cause = (f"this preset trains on the spec's inferred augmentation, not the paper's, from a warm start that "
                 f"already samples {em('base'):.3f} exactly (few real error positions): {diag}. To test the "
                 f"paper's recipe, {_study_sentence(study)}")
        # The class follows the study: if the paper's augmentation reproduces, the spec's simplification is
        # the cause; if it fails too, the simplification is not (scale).
        cause_class = "spec" if study_ok else "scale"
        if not study_ok and study is not None:
            cause += ("; the failure survives the paper's augmentation and a weak warm start, so it is not the "
                      "spec's simplification")
    else:
        cause = (f"with the paper's augmentation the tiny model still has not learned when to undo: {diag} "
                 f"(one seed)")
        cause_class = "scale"
    return _finish(checks, parts, cause, cause_class, has_rl)


def _verdict_seeds(runs: dict, evals: dict, c: Config, n: int):
    """The same criterion on the means over seeds, with per-seed numbers and standard errors."""
    seeds = list(runs)
    em = lambda arm: evals[arm]["sampled"]["exact_match"]
    prec = lambda arm: evals[arm]["sampled"]["precision"]

    def per_seed(arm, key="exact_match"):
        return np.array([float(runs[s]["evals"][arm]["sampled"][key]) for s in seeds])

    def sem(x):
        x = x[np.isfinite(x)]
        return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")

    arms = [a for a in ["base", *ARMS, "C_msft_no_undo"] if a in evals]
    seed_rows = []
    for s in seeds:
        ev = runs[s]["evals"]
        txt = ", ".join(f"{a} {ev[a]['sampled']['exact_match']:.3f}+-{_se(ev[a]['sampled']['exact_match'], n):.3f}"
                        for a in arms)
        pr = ", ".join(f"{a} {ev[a]['sampled']['precision']:.2f}" for a in ("B_aug_unmasked", "C_msft", "D_msft_grpo")
                       if a in ev)
        aug = runs[s]["augmentation"]
        extra = (f"; {aug['error_share']:.2f} of training rows with an error span" if aug else "")
        seed_rows.append(f"seed {s}: sampled EM {txt}; UNDO precision {pr}{extra}")
    means = ", ".join(f"{a} {em(a):.3f}+-{sem(per_seed(a)):.3f}" for a in arms)
    has_rl = "D_msft_grpo" in evals
    d_ca = per_seed("C_msft") - per_seed("A_sft")
    d_cb = per_seed("C_msft") - per_seed("B_aug_unmasked")
    note = (f"mean over {len(seeds)} seeds; per-seed C-A {', '.join(f'{x:+.3f}' for x in d_ca)} (SE {sem(d_ca):.3f}), "
            f"C-B {', '.join(f'{x:+.3f}' for x in d_cb)} (SE {sem(d_cb):.3f}); binomial SE of one EM <= "
            f"{_se(0.5, n):.3f}")
    checks = _checks(em, prec, has_rl, note)
    aug_txt = ("the paper's diff alignment of the warm start's own samples (Section 3.1, Eq. 2-5; "
               f"spans={c.augment.diff_spans}, alignment={c.augment.diff_alignment}, sample temperature "
               f"{c.augment.sample_temperature})"
               if c.augment.kind == "diff" else "the spec's inferred simple augmentation")
    parts = [
        _PAPER,
        f"Ours: {_task_name(c)}, {n} held-out problems, warm start {c.train.base_steps} steps, then "
        f"{c.train.sft_steps} steps per arm on {aug_txt}, GRPO {c.rl.steps} iterations x {c.rl.prompts} x "
        f"{c.rl.group_size}, seeds {seeds}.",
        f"Mean sampled EM +- SE over seeds: {means}; mean sampled UNDO precision "
        + ", ".join(f"{a} {prec(a):.2f}" for a in ("B_aug_unmasked", "C_msft", "D_msft_grpo") if a in evals) + ".",
        "; ".join(seed_rows) + ".",
    ]
    augs = [runs[s]["augmentation"] for s in seeds if runs[s]["augmentation"]]
    aug_mean = ({"error_share": float(np.mean([a["error_share"] for a in augs])),
                 "undo_per_augmented_row": float(np.nanmean([a["undo_per_augmented_row"] for a in augs]))}
                if augs else None)
    diag = _diagnosis(em, prec, aug_mean)
    cause = (f"with the paper's augmentation and a warm start that samples {em('base'):.3f} exactly, the tiny model "
             f"still has not learned when to undo (means over {len(seeds)} seeds): {diag}")
    return _finish(checks, parts, cause, "scale", has_rl)


def _plot(evals: dict, history: list, workdir: pathlib.Path) -> str:
    names = list(evals)
    x = np.arange(len(names))
    fig, axes = plotting.subplots(1, 3, figsize=(15, 4))
    for i, mode in enumerate(("greedy", "sampled")):
        axes[0].bar(x + (i - 0.5) * 0.38, [evals[n][mode]["exact_match"] for n in names], 0.38, label=mode)
    axes[0].set_xticks(x, names, rotation=30, fontsize=7)
    axes[0].set(ylabel="rendered exact match", title="accuracy (held-out)")
    axes[0].legend(fontsize=7)
    prec = [evals[n]["sampled"]["precision"] for n in names]
    rate = [evals[n]["sampled"]["undo_seq_frac"] for n in names]
    axes[1].bar(x - 0.19, np.nan_to_num(prec), 0.38, label="UNDO precision")
    axes[1].bar(x + 0.19, rate, 0.38, label="share of sequences with UNDO")
    axes[1].set_xticks(x, names, rotation=30, fontsize=7)
    axes[1].set(title="UNDO usage (T=1 sampling)")
    axes[1].legend(fontsize=7)
    if history:
        axes[2].plot([h["iteration"] for h in history], [h["reward_mean"] for h in history])
    axes[2].set(xlabel="GRPO iteration", ylabel="mean reward", title="D: GRPO reward")
    return report.savefig(fig, workdir / "nmars.png")


EXPERIMENT = registry.Experiment(
    slug="nmars",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(task=TaskSection(sort_length=3, sort_values=8),
                                augment=AugmentSection(kind="diff", fraction=1.0),
                                model=LMConfig(d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32),
                                train=TrainSection(base_steps=0, sft_steps=5, batch=8),
                                rl=RLSection(steps=0, prompts=2, group_size=4), eval=EvalSection(problems=8, chunk=8),
                                checkpoint=False, progress=False, seeds=(0, 1)),
        "quick": lambda: Config(),
        # Issue 33: the paper's augmentation (diff alignment of the warm start's own samples, every row),
        # a weaker warm start (train.base_steps chosen, before the study, so that its sampled EM is about 0.5)
        # and 3 seeds; the criterion is the quick preset's. Over 5 CPU minutes, hence not the quick preset.
        _STUDY: lambda: Config(augment=AugmentSection(kind="diff", fraction=1.0),
                               train=TrainSection(base_steps=BASE_STEPS_WEAK), seeds=(0, 1, 2)),
        "paper": lambda: Config(task=TaskSection(sort_length=16, sort_values=100),
                                model=LMConfig(d_model=128, num_layers=4, num_heads=8, num_kv_heads=2, d_ff=512),
                                train=TrainSection(base_steps=8000, sft_steps=4000, batch=256),
                                rl=RLSection(steps=200, prompts=64), eval=EvalSection(problems=4096, chunk=1024)),
    },
    run=run,
    train_step=train_step,
)
