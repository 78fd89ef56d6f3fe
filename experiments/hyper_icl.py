"""Hyper-ICL at CPU scale: distil a k-shot in-context teacher into a demonstration-free calibrated student.

The spec's small-scale plan (section 9 (d)), text-only (the mechanism is modality-agnostic):

  * Task family ("group selection", an analogue of "the answer is in the query, the demonstrations say
    what to extract"): the vocabulary holds G groups of S symbols; a query is a list of G symbols, one
    of each group in random order, followed by ">"; task g answers with the list's member of group g.
    A demonstration is "x_1 .. x_G > y ;". Only demonstrations say which group is asked for, so without
    them a model can only guess (chance 1/G).
  * A small decoder LM (`models.Transformer`) is pretrained from scratch with `algorithms.training.fit`
    on random tasks with 0..M demonstrations (checkpointed in the workdir, so a rerun reuses it), so
    that it learns to infer the task in context.
  * One task (group `task.target_group`) is distilled: the teacher is the frozen LM with m random
    demonstrations of it before the query; the student reads only "BOS x_1 .. x_G >" and carries the
    Hyper-ICL adapter (`algorithms.alignment.hyper_icl`). Anchors are the residual streams after every
    block at the G + 1 query tokens.
  * Compared on held-out queries without demonstrations: zero-shot (base LM), m-shot ICL (teacher),
    L_sup-only adapter, L2-anchor + lambda L_sup, H-anchor + lambda L_sup (Hyper-ICL), the additive
    value-stream baseline (MimIC/LIVE-style, simplified), and a kappa sweep; each adapter is trained
    `adapter.num_seeds` times (a fresh draw of the `adapter.num_train` training queries, their demonstrations and the
    init), accuracy pooled over seeds.
  * Diagnostic (no check): H-anchor with the anchor on the last query token only (an [INFER] variant
    that tells whether the list tokens' anchors are what hurts).
  * Cost: modeled forward FLOPs per query (`hyper_icl.forward_flops`) and measured latency per query
    of the student (query + adapter) vs the m-shot teacher.

Checks, fixed before the run from the paper's claims (Table 1, Table 4, efficiency):
  * H-anchor beats L_sup-only by more than 2 SE (loss ablation, Table 4: 62.08 vs 57.11);
  * H-anchor beats L2-anchor by more than 2 SE (Table 4: 62.08 vs 59.64);
  * H-anchor is close to m-shot ICL: at least ICL - 0.05 (the paper: above ICL);
  * the student is cheaper than ICL: modeled FLOPs per query below ICL's (paper 0.955 vs 23.4 TFLOPs);
  * precondition (required): demonstrations help, ICL - zero-shot >= 0.2;
  * not required: kappa = 1.0 is not the best kappa (the paper: 1.0 unstable, 0.1 best).
SE of a difference = sqrt(SE_a^2 + SE_b^2), each SE = sqrt(binomial SE^2 + seed SE^2) (the seed SE is
the standard deviation of the per-seed accuracies over sqrt(num_seeds)).

Inferred (beyond the algorithm module's [INFER] list): the task family, the model size, the number of
training queries of the quick preset (a few-shot distillation regime, 64 queries; the paper preset
uses the paper's 1,000), the pretraining recipe.

Recipe:
    python -m experiments run hyper_icl --preset quick    # 2 CPU cores, about 3 minutes
    python -m experiments run hyper_icl --preset smoke    # seconds, used by the tests
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from algorithms import training
from algorithms.alignment import hyper_icl as hi
from experiments import _plotting as plotting
from experiments import registry, report
from experiments._cache import cached
from experiments._lm import LMConfig
from experiments.checks import Check, binomial_se
from experiments.checks import verdict as verdict_from_checks
from models import Transformer

BOS, ARROW, SEP, PAD = 0, 1, 2, 3
_FIRST_SYMBOL = 4
_VERSION = 1  # bump when a cached unit's output changes

PAPER = {
    "title": "Attention Calibration with Hyperbolic Anchor Distillation for Multimodal In-Context Learning",
    "arxiv": "2606.04434",
    "claim": "a low-rank query-gated attention-logit adapter distilled with a Lorentz anchor loss replaces "
             "in-context demonstrations, beating L_sup-only and L2-anchor training and matching ICL at "
             "a fraction of its cost",
    "numbers": "Idefics-9B VQAv2: zero-shot 29.25, 32-shot 56.18, L_sup 57.11, L2-anchor 59.64, "
               "Hyper-ICL 62.08; 0.955 vs 23.364 TFLOPs per query",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSection:
    """The group-selection ICL task (``--task.num-groups 6``)."""

    num_groups: int = 4
    group_size: int = 8
    max_demos: int = 4  # pretraining draws 0..max_demos demonstrations per sequence
    num_demos: int = 4  # the teacher's m
    target_group: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainSection:
    """Pretraining of the base LM (``--pretrain.steps 200``)."""

    steps: int = 1000
    batch_size: int = 64
    learning_rate: float = 3e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdapterSection:
    """Adapter training, spec defaults (``--adapter.steps 100``); `last_token_diagnostic` adds H-anchor with the
    anchor on the last query token only (a diagnostic, [INFER] variant, not a check)."""

    num_train: int = 64
    rank: int = 4
    curvature: float = 0.1
    sup_weight: float = 0.5
    learning_rate: float = 5e-3
    warmup_fraction: float = 0.1
    steps: int = 300
    batch_size: int = 32
    num_seeds: int = 3
    methods: tuple[str, ...] = ("sup", "l2_anchor", "h_anchor", "additive")
    kappa_sweep: tuple[float, ...] = (0.01, 1.0)
    last_token_diagnostic: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Evaluation on held-out queries and the latency measurement (``--eval.num-queries 200``)."""

    num_queries: int = 1000
    latency_batch: int = 256
    latency_repeats: int = 5


# (old flat field, dotted path) in the flat config's field order: the pretrain fingerprint and the adapter units'
# cache keys are built from this view, so runs written before the split into sections stay valid.
_FLAT = (
    ('num_groups', 'task.num_groups'),
    ('group_size', 'task.group_size'),
    ('max_demos', 'task.max_demos'),
    ('num_demos', 'task.num_demos'),
    ('target_group', 'task.target_group'),
    ('model', 'model'),
    ('pretrain_steps', 'pretrain.steps'),
    ('pretrain_batch_size', 'pretrain.batch_size'),
    ('pretrain_learning_rate', 'pretrain.learning_rate'),
    ('num_train', 'adapter.num_train'),
    ('rank', 'adapter.rank'),
    ('curvature', 'adapter.curvature'),
    ('sup_weight', 'adapter.sup_weight'),
    ('learning_rate', 'adapter.learning_rate'),
    ('warmup_fraction', 'adapter.warmup_fraction'),
    ('adapter_steps', 'adapter.steps'),
    ('adapter_batch_size', 'adapter.batch_size'),
    ('num_seeds', 'adapter.num_seeds'),
    ('methods', 'adapter.methods'),
    ('kappa_sweep', 'adapter.kappa_sweep'),
    ('last_token_diagnostic', 'adapter.last_token_diagnostic'),
    ('num_eval', 'eval.num_queries'),
    ('latency_batch', 'eval.latency_batch'),
    ('latency_repeats', 'eval.latency_repeats'),
    ('seed', 'seed'),
    ('progress', 'progress'),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """hyper_icl settings, in sections overridden on the command line as ``--adapter.steps 100``."""

    task: TaskSection = TaskSection()
    model: LMConfig = LMConfig(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128)
    pretrain: PretrainSection = PretrainSection()
    adapter: AdapterSection = AdapterSection()
    eval: EvalSection = EvalSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        _validate(self)

    @property
    def vocab_size(self) -> int:
        return _FIRST_SYMBOL + self.task.num_groups * self.task.group_size

    @property
    def query_len(self) -> int:
        """Tokens of a query (the list and ">"): the anchored positions."""
        return self.task.num_groups + 1


def _validate(c: Config) -> None:
    err, t, a = registry.ConfigError, c.task, c.adapter
    for path in ("task.num_groups", "task.group_size", "task.num_demos", "adapter.num_train", "eval.num_queries",
                 "adapter.num_seeds", "adapter.steps", "adapter.batch_size", "pretrain.steps", "pretrain.batch_size"):
        section, name = path.split(".")
        if getattr(getattr(c, section), name) < 1:
            raise err(path, f"must be >= 1; got {getattr(getattr(c, section), name)}")
    if t.num_groups < 2:
        raise err("task.num_groups", f"must be >= 2; got {t.num_groups}")
    if not 0 <= t.target_group < t.num_groups:
        raise err("task.target_group", f"must be in [0, task.num_groups={t.num_groups}); got {t.target_group}")
    if t.num_demos > t.max_demos:
        raise err("task.num_demos", f"must be <= task.max_demos={t.max_demos}; got {t.num_demos}")
    for m in a.methods:
        if m not in hi.METHODS:
            raise err("adapter.methods", f"must be drawn from {hi.METHODS}; got {m!r}")
    if not {"h_anchor", "sup", "l2_anchor"} <= set(a.methods):
        raise err("adapter.methods", f"must include 'h_anchor', 'sup' and 'l2_anchor' (the checks compare them); "
                                     f"got {a.methods}")


# ----------------------------------------------------------------------------- the task


def sample_queries(rng: np.random.Generator, n: int, c: Config, target: np.ndarray):
    """n query lists [n, G] (one symbol per group, random order) and their answers [n] for groups `target`."""
    G, S = c.task.num_groups, c.task.group_size
    groups = np.argsort(rng.random((n, G)), axis=1)
    lists = _FIRST_SYMBOL + groups * S + rng.integers(0, S, (n, G))
    answers = lists[np.arange(n), np.argmax(groups == np.asarray(target)[:, None], axis=1)]
    return lists, answers


def build_prompts(rng: np.random.Generator, n: int, m: int, c: Config, target: np.ndarray):
    """Prompts "BOS (x > y ;)*m x >" [n, 1 + m (G + 3) + G + 1], answers [n], and the positions
    (in the prompt + answer sequence) of every answer token (m demonstrations, then the query)."""
    pieces, answer_pos, pos = [np.full((n, 1), BOS)], [], 1
    for _ in range(m):
        lists, ys = sample_queries(rng, n, c, target)
        pieces.append(np.concatenate([lists, np.full((n, 1), ARROW), ys[:, None], np.full((n, 1), SEP)], 1))
        answer_pos.append(pos + c.task.num_groups + 1)
        pos += c.task.num_groups + 3
    lists, ys = sample_queries(rng, n, c, target)
    pieces.append(np.concatenate([lists, np.full((n, 1), ARROW)], 1))
    answer_pos.append(pos + c.task.num_groups + 1)
    return np.concatenate(pieces, 1).astype(np.int32), ys.astype(np.int32), answer_pos


def pretrain_batch(position: int, c: Config) -> dict:
    """A next-token batch of random tasks with 0..max_demos demonstrations (right-padded); the loss is
    on every answer token (the first one of a sequence is a guess)."""
    rng = np.random.default_rng([c.seed, 1, position])
    bs = c.pretrain.batch_size
    m = int(rng.integers(0, c.task.max_demos + 1))
    prompts, ys, answer_pos = build_prompts(rng, bs, m, c, rng.integers(0, c.task.num_groups, bs))
    full_len = 1 + (c.task.max_demos + 1) * (c.task.num_groups + 3) - 1
    seq = np.full((bs, full_len), PAD, np.int32)
    seq[:, :prompts.shape[1]] = prompts
    seq[:, prompts.shape[1]] = ys
    mask = np.zeros((bs, full_len - 1), np.float32)
    for p in answer_pos:
        mask[:, p - 1] = 1.0
    return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": mask}


def _pretrain_optimizer(c: Config) -> training.OptimizerConfig:
    return training.OptimizerConfig(learning_rate=c.pretrain.learning_rate,
                                    warmup_steps=min(50, c.pretrain.steps), total_steps=c.pretrain.steps,
                                    weight_decay=0.1)


def train_step(c: Config):
    """The base LM's pretraining step (`pretrain`), for ``python -m experiments aot hyper_icl`` (`experiments.aot`)."""
    from experiments import aot

    return aot.TrainStep(model=c.model.transformer(c.vocab_size), optimizer=_pretrain_optimizer(c),
                         batch_size=c.pretrain.batch_size, seq_len=pretrain_batch(0, c)["inputs"].shape[1])


def pretrain(c: Config, workdir) -> nnx.Module:
    """The base LM, trained once per config (checkpointed in workdir/pretrain; a rerun restores it)."""
    cfg = c.model.transformer(c.vocab_size)
    opt = _pretrain_optimizer(c)
    key = registry.flat_fields(c, [(old, path) for old, path in _FLAT if old in (
        "num_groups", "group_size", "max_demos", "model", "pretrain_steps", "pretrain_batch_size",
        "pretrain_learning_rate", "seed")])
    res = training.fit(model_fn=lambda rngs: Transformer(cfg, rngs=rngs), optimizer_config=opt,
                       batch_fn=lambda position: pretrain_batch(position, c), num_steps=c.pretrain.steps,
                       workdir=None if workdir is None else epath.Path(workdir) / "pretrain",
                       seed=c.seed, checkpoint_every=c.pretrain.steps, log_every=max(1, c.pretrain.steps // 10),
                       progress=c.progress, desc="hyper_icl pretrain", fingerprint=repr(sorted(key.items())))
    return res.model(), res.history


# ----------------------------------------------------------------------------- evaluation


def _accuracy(logits: jax.Array, answers: np.ndarray) -> np.ndarray:
    return np.asarray(jnp.argmax(logits[:, -1], -1)) == answers


@functools.partial(jax.jit, static_argnums=(0,))
def _last_logits(graphdef, state, tokens, params):
    """The last position's logits [b, 1, v], one compiled forward per shape (eager would compile every op)."""
    return hi.forward(nnx.merge(graphdef, state), tokens, params).logits[:, -1:]


@functools.partial(jax.jit, static_argnums=(0, 3))
def _anchors(graphdef, state, prompts, num_query_tokens):
    return hi.teacher_hidden_states(nnx.merge(graphdef, state), prompts, num_query_tokens)


def _predict(model, tokens, params=None, chunk=512):
    graphdef, state = nnx.split(model)
    out = []
    for i in range(0, len(tokens), chunk):
        out.append(np.asarray(_last_logits(graphdef, state, jnp.asarray(tokens[i:i + chunk]), params)))
    return np.concatenate(out)


def _teacher_data(model, c: Config, n: int, seed: int):
    """n target-task queries: student tokens [n, 1 + G + 1], answers [n], teacher prompts, anchors."""
    rng = np.random.default_rng([c.seed, 2, seed])
    target = np.full(n, c.task.target_group)
    prompts, answers, _ = build_prompts(rng, n, c.task.num_demos, c, target)
    student = np.concatenate([np.full((n, 1), BOS, np.int32), prompts[:, -c.query_len:]], 1)
    graphdef, state = nnx.split(model)
    anchors = np.concatenate([np.asarray(_anchors(graphdef, state, jnp.asarray(prompts[i:i + 512]), c.query_len))
                              for i in range(0, n, 512)], axis=1)
    return student, answers, prompts, anchors


def _rate(correct: np.ndarray) -> dict:
    """Accuracy over seeds x queries: {"acc", "se", "per_seed"} (se combines binomial and seed spread)."""
    correct = np.atleast_2d(np.asarray(correct, bool))
    per_seed = correct.mean(axis=1)
    acc = float(correct.mean())
    se = binomial_se(acc, correct.size) ** 2
    if len(per_seed) > 1:
        se += float(np.std(per_seed, ddof=1)) ** 2 / len(per_seed)
    return {"acc": acc, "se": math.sqrt(se), "per_seed": per_seed.tolist()}


def _latency(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column)."""
    a = metrics["accuracy"]
    return (f"no-demo acc: H-anchor {a['h_anchor']['acc']:.1%} vs L_sup {a['sup']['acc']:.1%}, "
            f"L2 {a['l2_anchor']['acc']:.1%}, zero-shot {a['zero_shot']['acc']:.1%}, "
            f"{metrics['num_demos']}-shot ICL {a['icl']['acc']:.1%}; "
            f"{metrics['flops_ratio']:.2f}x ICL FLOPs")


def run(c: Config, workdir: pathlib.Path) -> dict:
    model, pre_history = pretrain(c, workdir)
    cfg = model.config
    eval_student, eval_answers, eval_prompts, _ = _teacher_data(model, c, c.eval.num_queries, seed=10_000)
    acc: dict[str, dict] = {
        "zero_shot": _rate(_accuracy(_predict(model, eval_student), eval_answers)),
        "icl": _rate(_accuracy(_predict(model, eval_prompts), eval_answers)),
    }

    units = [(m, m, c.adapter.curvature, False) for m in c.adapter.methods]
    units += [(f"h_anchor_kappa{k:g}", "h_anchor", k, False) for k in c.adapter.kappa_sweep if k != c.adapter.curvature]
    if c.adapter.last_token_diagnostic:
        units.append(("h_anchor_last_token", "h_anchor", c.adapter.curvature, True))
    histories: dict[str, list] = {}
    for name, method, kappa, last_only in units:
        per_seed, hist = [], None
        for s in range(c.adapter.num_seeds):
            def unit(name=name, method=method, kappa=kappa, last_only=last_only, s=s):
                train_student, train_answers, _, anchors = _teacher_data(model, c, c.adapter.num_train, seed=s)
                if last_only:  # diagnostic: anchor only the answer-predicting position
                    anchors = anchors[:, :, -1:]
                tc = hi.TrainConfig(method=method, rank=c.adapter.rank, curvature=kappa,
                                    sup_weight=c.adapter.sup_weight,
                                    learning_rate=c.adapter.learning_rate, warmup_fraction=c.adapter.warmup_fraction,
                                    num_steps=c.adapter.steps, batch_size=c.adapter.batch_size, seed=s,
                                    progress=c.progress)
                res = hi.train(model, train_student, anchors, train_answers, tc, desc=f"hyper_icl {name} s{s}")
                correct = _accuracy(_predict(model, eval_student, res.params), eval_answers)
                train_correct = _accuracy(_predict(model, train_student, res.params), train_answers)
                return {"correct": correct.astype(int).tolist(), "train_acc": float(train_correct.mean()),
                        "history": res.history[:: max(1, c.adapter.steps // 50)],
                        "num_params": hi.adapter_param_count(res.params)}
            key = {"v": _VERSION, "unit": name, "seed": s,
                   "config": registry.flat_repr(c, _FLAT, replace={"progress": True})}
            out = cached(workdir, key, unit)
            per_seed.append(out["correct"])
            hist = hist or out
        acc[name] = dict(_rate(per_seed), train_acc=hist["train_acc"], num_params=hist["num_params"])
        histories[name] = hist["history"]

    # Cost: modeled FLOPs and measured latency per query, student (query + adapter) vs m-shot ICL.
    student_len, icl_len = eval_student.shape[1], eval_prompts.shape[1]
    flops_student = hi.forward_flops(cfg, student_len, rank=c.adapter.rank)
    flops_icl = hi.forward_flops(cfg, icl_len)
    params = hi.init_adapter(jax.random.key(0), num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                             head_dim=cfg.resolved_head_dim, rank=c.adapter.rank)
    params = dict(params, u_k=params["u_q"])  # a non-zero calibration (cost does not depend on the values)
    graphdef, state = nnx.split(model)
    fwd = jax.jit(lambda st, toks, p: hi.forward(nnx.merge(graphdef, st), toks, p).logits[:, -1])
    nb = min(c.eval.latency_batch, c.eval.num_queries)
    t_student = _latency(fwd, (state, jnp.asarray(eval_student[:nb]), params), c.eval.latency_repeats) / nb
    t_icl = _latency(fwd, (state, jnp.asarray(eval_prompts[:nb]), None), c.eval.latency_repeats) / nb

    def diff(a, b):
        d = acc[a]["acc"] - acc[b]["acc"]
        return d, math.sqrt(acc[a]["se"] ** 2 + acc[b]["se"] ** 2)

    d_sup, se_sup = diff("h_anchor", "sup")
    d_l2, se_l2 = diff("h_anchor", "l2_anchor")
    h, icl, zero = acc["h_anchor"]["acc"], acc["icl"]["acc"], acc["zero_shot"]["acc"]
    checks = [
        Check("demonstrations help (precondition): m-shot ICL - zero-shot accuracy", icl - zero,
              paper="32-shot 56.18 vs zero-shot 29.25 (VQAv2)", threshold=">= 0.2", passed=icl - zero >= 0.2,
              note=f"ICL {icl:.3f}, zero-shot {zero:.3f}, chance {1 / c.task.num_groups:.3f}"),
        Check("H-anchor - L_sup-only accuracy (demo-free)", d_sup, paper="62.08 vs 57.11 (+4.97)",
              threshold=f"> 2 SE = {2 * se_sup:.3f}", passed=d_sup > 2 * se_sup,
              note=f"{h:.3f} vs {acc['sup']['acc']:.3f}"),
        Check("H-anchor - L2-anchor accuracy (demo-free)", d_l2, paper="62.08 vs 59.64 (+2.44)",
              threshold=f"> 2 SE = {2 * se_l2:.3f}", passed=bool(d_l2 > 2 * se_l2),
              note=f"{h:.3f} vs {acc['l2_anchor']['acc']:.3f}"),
        Check("H-anchor student vs m-shot ICL teacher accuracy", h - icl, paper="62.08 vs 56.18 (above ICL)",
              threshold=">= -0.05", passed=h - icl >= -0.05, note=f"{h:.3f} vs {icl:.3f}"),
        Check("student / ICL modeled forward FLOPs per query", flops_student / flops_icl,
              paper="0.955 / 23.364 TFLOPs = 0.041", threshold="< 1", passed=flops_student < flops_icl,
              note=f"{student_len} vs {icl_len} tokens; measured latency ratio {t_student / t_icl:.2f}"),
    ]
    sweep = {c.adapter.curvature: h}
    sweep.update({k: acc[f"h_anchor_kappa{k:g}"]["acc"] for k in c.adapter.kappa_sweep if k != c.adapter.curvature})
    if len(sweep) > 1 and 1.0 in sweep:
        best = max(sweep.values())
        checks.append(Check("kappa = 1.0 is not the best curvature", sweep[1.0],
                            paper="kappa 0.1 best, 1.0 unstable, 0.01 ~ Euclidean", threshold="< best of the sweep",
                            passed=sweep[1.0] < best, required=False,
                            note=", ".join(f"kappa {k:g}: {v:.3f}" for k, v in sorted(sweep.items()))))
    h0 = histories["h_anchor"]
    anchor_left = float(np.mean([r["anchor"] for r in h0[-5:]]) / max(h0[0]["anchor"], 1e-12))
    context = (f"Group-selection ICL task ({c.task.num_groups} groups x {c.task.group_size} symbols), "
               f"{cfg.num_layers}-layer d={cfg.d_model} LM pretrained {c.pretrain.steps} steps; teacher "
               f"{c.task.num_demos}-shot; adapters "
               f"(rank {c.adapter.rank}, {acc['h_anchor']['num_params']} params) trained {c.adapter.steps} steps on "
               f"{c.adapter.num_train} queries, {c.adapter.num_seeds} seeds, evaluated on {c.eval.num_queries} "
               "held-out queries; "
               + "; ".join(f"{k} {v['acc']:.3f}+-{v['se']:.3f}" for k, v in acc.items())
               + f"; latency per query {t_student * 1e6:.1f} us (student) vs {t_icl * 1e6:.1f} us (ICL)")
    verdict, reproduced = verdict_from_checks(
        checks, claim=PAPER["claim"], context=context,
        cause=(f"the H-anchor loss keeps {anchor_left:.0%} of its initial value after training (seed 0): the "
               "teacher's query-token states carry the demonstrations' values (the mu SA(q, K_D, V_D) term of "
               "eq. 2), which a logit-only calibration of a query-only context cannot produce at this scale, so "
               "the anchor's irreducible part competes with L_sup; in this toy task the answer is one attention "
               "choice over the query, which L_sup alone teaches"),
        cause_class="scale")
    plots = [_plot(acc, histories, sweep, c, workdir)]
    return {
        "metrics": {
            "accuracy": acc,
            "num_demos": c.task.num_demos,
            "flops_student": flops_student,
            "flops_icl": flops_icl,
            "flops_ratio": flops_student / flops_icl,
            "latency_student_s": t_student,
            "latency_icl_s": t_icl,
            "latency_ratio": t_student / t_icl,
            "kappa_sweep": {f"{k:g}": v for k, v in sorted(sweep.items())},
            "h_anchor_loss_remaining": anchor_left,
            "pretrain_history": pre_history,
            "adapter_histories": histories,
            "checks": [ch.as_dict() for ch in checks],
        },
        "verdict": verdict,
        "reproduced": reproduced,
        "cause": None if reproduced else "scale",
        "plots": plots,
    }


def _plot(acc, histories, sweep, c: Config, workdir) -> str:
    fig, (ax1, ax2, ax3) = plotting.subplots(1, 3, figsize=(13, 3.4))
    names = [k for k in ("zero_shot", "sup", "l2_anchor", "additive", "h_anchor", "icl") if k in acc]
    ax1.bar(range(len(names)), [acc[k]["acc"] for k in names], yerr=[2 * acc[k]["se"] for k in names],
            color=["C7", "C0", "C1", "C4", "C3", "C2"][:len(names)])
    ax1.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
    ax1.axhline(1 / c.task.num_groups, ls=":", c="k", lw=0.8)
    ax1.set(ylabel="demo-free accuracy (ICL: with demos)", ylim=(0, 1.05), title="accuracy (+-2 SE)")
    for name, hist in histories.items():
        if name in ("sup", "l2_anchor", "h_anchor", "additive"):
            ax2.plot([h["sup"] for h in hist], label=name)
    ax2.set(xlabel=f"step / {max(1, c.adapter.steps // 50)}", ylabel="L_sup (train batch)", yscale="log",
            title="answer cross-entropy, seed 0")
    plotting.legend(ax2, fontsize=7)
    ks = sorted(sweep)
    ax3.plot(ks, [sweep[k] for k in ks], "o-")
    ax3.set(xscale="log", xlabel="kappa", ylabel="H-anchor accuracy", title="curvature sweep")
    return report.savefig(fig, epath.Path(workdir) / "hyper_icl.png")


EXPERIMENT = registry.Experiment(
    slug="hyper_icl",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(task=TaskSection(group_size=3, max_demos=2, num_demos=2),
                                model=LMConfig(d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32),
                                pretrain=PretrainSection(steps=4, batch_size=8),
                                adapter=AdapterSection(num_train=8, steps=3, batch_size=4, num_seeds=1, kappa_sweep=(),
                                                       last_token_diagnostic=False),
                                eval=EvalSection(num_queries=16, latency_batch=8, latency_repeats=1), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(task=TaskSection(num_groups=8, group_size=16, max_demos=16, num_demos=16),
                                model=LMConfig(d_model=256, num_layers=4, num_heads=8, num_kv_heads=2, d_ff=768),
                                pretrain=PretrainSection(steps=20_000, batch_size=256),
                                adapter=AdapterSection(num_train=1000, steps=2000, num_seeds=5,
                                                       kappa_sweep=(0.01, 1.0)),
                                eval=EvalSection(num_queries=10_000)),
    },
    run=run,
    train_step=train_step,
)
