"""Staged perception -> reasoning RL post-training of a tiny VLM vs merged training at equal rollouts.

Paper: "From Seeing to Thinking: Decoupling Perception and Reasoning Improves Post-Training of
Vision-Language Models" (arXiv 2605.20177). Claim: training visual perception first (RL), then the
reasoning stages, beats merged training on the pooled data with the same steps: +1.5% reasoning
accuracy with 20.8% shorter traces (Qwen3-VL-8B: visual math 51.10 staged vs 49.64 merged).

Setting (spec section 10 (d), the CPU plan, on `experiments.tasks.scenes`): a 3x3 board of shapes
rendered to a 24x24 RGB image, one ViT patch per cell (`models.vlm.VLM`: 1-layer ViT + 2-layer LM).
  * perception (D_perc): "count <colour|any> <shape|any> ?" about the image;
  * visual reasoning (D_vis): "compare <colour> <colour> ?" (which is more, or "same") and
    "count <size> <colour> in row r<k> ?" about the image (perception plus a comparison / filter);
  * textual reasoning (D_text): the same reasoning questions with the scene given as a text caption
    ("red small disc r0 c1 ; ...") instead of the image.
Every response is "<think> TRACE </think> \\boxed ANSWER": the supervised trace lists what is seen
(the cells of the matching objects, or the two colour counts), the RL reward is the recipe's
0.9 * accuracy + 0.1 * format (`algorithms.rl.staged_perception.staged_reward`).

Protocol: a short supervised warm-up on a mix of the three kinds (cached in the workdir; "so that
GRPO has signal"), then from that same model GRPO (n = 5, KL 1e-2, lr 1e-4, AdamW wd 1e-2, grad
clip 1, temperature 1) for `rl_iterations` iterations of `rl_prompts` prompts, split 10 : 40 : 50
% over perception / textual / visual reasoning (the recipe's 90 : 375 : 465 steps), in the stage
orders P->T->V (released recipe), P->V->T (the abstract's enumeration), T->P->V and V->T->P (the
shipped order ablations), against merged training on the union of exactly the same prompts. Held-out
greedy evaluation: accuracy per kind and mean trace length (words inside <think>).

Checks (fixed before the run from the claim; SE = paired standard error over eval items and seeds):
  * required: P->T->V staged beats merged on visual-reasoning accuracy by more than 2 SE;
  * not required: P->V->T beats merged by > 2 SE; P->T->V's traces are shorter than merged's;
    GRPO improved the warm-start model's visual-reasoning accuracy (a signal check).

INFERRED: the task, trace format, model sizes, SFT mix and the iteration split at this scale are
this library's choices (spec 10 (d) sketches them); the perception-filter analogue, the difficulty
curriculum and the SFT-for-perception ablation of the spec's plan are not run here.

Recipe:
    python -m experiments run staged_vlm --preset quick    # ~3 min on 2 CPU cores
    python -m experiments run staged_vlm --preset smoke    # seconds, used by the tests
    python -m experiments run staged_vlm --preset paper    # accelerator scale
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from flax import nnx

from algorithms.rl import grpo
from algorithms.rl import staged_perception as sp
from algorithms.training import Checkpointer, TrainState
from experiments import _plotting as plotting
from experiments import registry, report
from experiments._cache import cached, key_hash
from experiments.checks import Check
from experiments.checks import verdict as verdict_from_checks
from experiments.tasks import scenes
from experiments.tasks.multihop import WordTokenizer
from experiments.tasks.tokenizer import lm_batch
from models.transformer import TransformerConfig
from models.vit import ViTConfig
from models.vlm import VLM, VLMConfig

VERSION = 1
KINDS = {"perception": ("count",), "visual_reasoning": ("compare", "compose"),
         "text_reasoning": ("compare", "compose")}
EVAL_KINDS = ("perception", "visual_reasoning", "text_reasoning")
ORDER_LABEL = {"perception": "P", "text_reasoning": "T", "visual_reasoning": "V"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """staged_vlm settings (every field can be overridden on the command line)."""

    grid: int = 3
    image_size: int = 24
    patch_size: int = 8
    max_objects: int = 5
    # model
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    d_ff: int = 128
    vit_d_model: int = 32
    vit_layers: int = 1
    # supervised warm-up (cached)
    sft_steps: int = 300
    sft_batch: int = 32
    sft_lr: float = 3e-3
    # GRPO
    rl_iterations: int = 100
    split: tuple[float, float, float] = (0.1, 0.4, 0.5)  # perception, text reasoning, visual reasoning
    rl_prompts: int = 16
    group_size: int = 5
    max_new_tokens: int = 16
    temperature: float = 1.0
    rl_lr: float = 1e-4
    weight_decay: float = 1e-2
    kl_coef: float = 1e-2
    clip_eps: float = 0.2
    orders: tuple[tuple[str, ...], ...] = (sp.PAPER_ORDER, sp.ABSTRACT_ORDER,
                                            ("text_reasoning", "perception", "visual_reasoning"),
                                            ("visual_reasoning", "text_reasoning", "perception"))
    seeds: int = 2
    eval_examples: int = 384  # per kind
    checkpoint_every: int = 10
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        if len(self.split) != 3 or any(x <= 0 for x in self.split):
            raise ValueError(f"split: expected 3 positive fractions, got {self.split!r}")
        for o in self.orders:
            if sorted(o) != sorted(sp.STAGES):
                raise ValueError(f"orders: expected permutations of {sp.STAGES}, got {o!r}")
        if sp.PAPER_ORDER not in self.orders:
            raise ValueError(f"orders: must include the recipe's order {sp.PAPER_ORDER} (the required check)")
        if self.rl_iterations < 3 or self.seeds < 1 or self.eval_examples < 1:
            raise ValueError(f"rl_iterations >= 3, seeds >= 1, eval_examples >= 1 expected; got "
                             f"{self.rl_iterations}, {self.seeds}, {self.eval_examples}")

    @property
    def stage_iterations(self) -> dict[str, int]:
        """Iterations per stage: the split of rl_iterations (largest remainders), each >= 1."""
        raw = np.asarray(self.split) / sum(self.split) * self.rl_iterations
        n = np.maximum(np.floor(raw).astype(int), 1)
        for i in np.argsort(-(raw - np.floor(raw))):
            if n.sum() >= self.rl_iterations:
                break
            n[i] += 1
        return dict(zip(sp.PAPER_ORDER, (int(x) for x in n)))


# --- task encoding -----------------------------------------------------------------------------------


def make_tokenizer(grid: int = 3) -> WordTokenizer:
    """The scenes vocabulary plus the response-format words <think>, </think>, \\boxed."""
    return WordTokenizer(list(scenes.make_tokenizer(grid).symbols) + [sp.THINK, sp.END_THINK, sp.BOXED])


def trace(scene: scenes.Scene, q: scenes.Question) -> str:
    """The supervised reasoning trace: what is seen, then the answer follows from it.

    count: the cells "r<row> c<col>" of the matching objects (the answer is their number);
    compose: the cells of the objects of that size and colour in any row (the answer counts those
    in the asked row); compare: "<colour> <n> <other> <m>".
    """
    cells = lambda objs: " ".join(f"r{o.row} c{o.col}" for o in objs)  # noqa: E731
    if q.kind == "count":
        return cells(o for o in scene.objects if (q.colour in ("any", o.colour)) and (q.shape in ("any", o.shape)))
    if q.kind == "compose":
        return cells(o for o in scene.objects if o.colour == q.colour and o.size == q.size)
    if q.kind == "compare":
        n = lambda c: sum(o.colour == c for o in scene.objects)  # noqa: E731
        return f"{q.colour} {n(q.colour)} {q.other} {n(q.other)}"
    raise ValueError(f"q.kind: expected count, compare or compose, got {q.kind!r}")


def response(scene, q) -> str:
    """The full supervised response "<think> trace </think> \\boxed answer"."""
    return " ".join(x for x in (sp.THINK, trace(scene, q), sp.END_THINK, sp.BOXED, scenes.answer(scene, q)) if x)


def prompt_len(c: Config) -> int:
    """P: BOS + the longest prompt (a full caption + the longest question)."""
    return 1 + c.max_objects * 6 + 7


def examples(c: Config, kind: str, n: int, seed: int, tok: WordTokenizer) -> dict:
    """n examples of a stage kind: prompts (image or caption view), answers, SFT batch, images [n, 1, H, W, 3]."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {tuple(KINDS)}, got {kind!r}")
    P = (c.image_size // c.patch_size) ** 2
    raw = scenes.make_batch(n, seed=seed, image_tokens=P, kinds=KINDS[kind], grid=c.grid, image_size=c.image_size,
                            max_objects=c.max_objects)
    prompts, answers, responses = [], [], []
    for s, q in zip(raw["scenes"], raw["questions"]):
        view = scenes.caption(s).replace(" sounds", "") if kind == "text_reasoning" else " ".join([scenes.IMAGE_TOKEN] * P)
        prompts.append(f"{view} {scenes.question_text(q)}")
        answers.append(scenes.answer(s, q))
        responses.append(response(s, q))
    plen = prompt_len(c)
    tokens = np.zeros((n, plen), np.int32)
    lengths = np.zeros((n,), np.int32)
    for i, p in enumerate(prompts):
        ids = [tok.bos_id] + tok.encode(p)
        tokens[i, :len(ids)] = ids
        lengths[i] = len(ids)
    sft = lm_batch(tok, prompts, responses, seq_len=plen + c.max_new_tokens)
    images = raw["images"][:, None].astype(np.float32)
    if kind == "text_reasoning":
        images = np.zeros_like(images)  # no placeholders: the image is ignored
    return {"problems": answers, "tokens": tokens, "lengths": lengths, "images": images, "sft": sft,
            "kinds": [q.kind for q in raw["questions"]]}


def prompt_batch(ex: dict) -> sp.VLMPromptBatch:
    return sp.VLMPromptBatch(ex["problems"], ex["tokens"], ex["lengths"], ex["images"])


def stage_sources(c: Config, tok: WordTokenizer, seed: int) -> dict:
    """stage name -> `stage_iteration -> VLMPromptBatch` (deterministic, disjoint seeds per stage)."""
    return {name: (lambda k, name=name, si=si: prompt_batch(
        examples(c, name, c.rl_prompts, seed=10_000_000 * (si + 1) + 1000 * seed + k, tok=tok)))
        for si, name in enumerate(sp.STAGES)}


def make_model(c: Config, tok: WordTokenizer, seed: int) -> VLM:
    lm = TransformerConfig(vocab_size=tok.vocab_size, d_model=c.d_model, num_layers=c.num_layers,
                           num_heads=c.num_heads, num_kv_heads=max(1, c.num_heads // 2), d_ff=c.d_ff)
    vit = ViTConfig(image_size=c.image_size, patch_size=c.patch_size, channels=3, num_classes=1,
                    d_model=c.vit_d_model, num_heads=2, d_ff=2 * c.vit_d_model, num_layers=c.vit_layers,
                    pooling="mean")
    return VLM(VLMConfig(lm=lm, vit=vit, image_token_id=tok.encode(scenes.IMAGE_TOKEN)[0]), rngs=nnx.Rngs(seed))


# --- phases ------------------------------------------------------------------------------------------


def warm_start(c: Config, tok, workdir: epath.Path):
    """The SFT warm-up (cached in workdir/ckpt/sft_<hash> with orbax): (graphdef, params, losses)."""
    graphdef, params = nnx.split(make_model(c, tok, c.seed), nnx.Param)
    params = nnx.to_pure_dict(params)
    fields = ("grid", "image_size", "patch_size", "max_objects", "d_model", "num_layers", "num_heads", "d_ff",
              "vit_d_model", "vit_layers", "sft_steps", "sft_batch", "sft_lr", "max_new_tokens", "seed")
    key = {f: getattr(c, f) for f in fields} | {"version": VERSION}
    directory = epath.Path(workdir) / "ckpt" / f"sft_{key_hash(key)}"  # ckpt/: not tracked in results/
    like = TrainState(jnp.zeros((), jnp.int32), params, jnp.zeros(()))
    with Checkpointer(directory) as ck:
        if ck.latest_step() is not None:
            state, meta = ck.restore(like)
            return graphdef, state.params, meta["losses"]
    each = max(1, c.sft_batch // 3)

    def batch_fn(i):
        parts = [examples(c, kind, each, seed=5_000_000 + 3 * i + j, tok=tok) for j, kind in enumerate(EVAL_KINDS)]
        cat = lambda f: np.concatenate([p["sft"][f] for p in parts])  # noqa: E731
        return {"inputs": cat("inputs"), "targets": cat("targets"), "loss_mask": cat("loss_mask"),
                "images": np.concatenate([p["images"] for p in parts])}

    if c.sft_steps:
        opt = optax.adamw(c.sft_lr, weight_decay=0.0)
        params, losses = sp.vlm_sft(graphdef, params, batch_fn, steps=c.sft_steps, optimizer=opt,
                                    progress=c.progress)
    else:
        losses = []
    with Checkpointer(directory) as ck:
        ck.save(c.sft_steps, TrainState(jnp.asarray(c.sft_steps, jnp.int32), params, jnp.zeros(())),
                {"losses": losses})
    return graphdef, params, losses


def evaluate(c: Config, graphdef, params, evalsets: dict, tok) -> dict:
    """Greedy accuracy, format rate, trace and response lengths per kind, and per-item correctness."""
    out = {}
    for kind, ex in evalsets.items():
        comps, lens = sp.greedy_completions(graphdef, params, prompt_batch(ex), max_new_tokens=c.max_new_tokens,
                                            stop_tokens=(tok.eos_id,), pad_id=tok.pad_id, chunk=256)
        acc, fmt, think = [], [], []
        for row, n, ans in zip(comps, lens, ex["problems"]):
            words = tok.decode(row[:n]).split()
            acc.append(sp.accuracy_reward(words, ans))
            fmt.append(sp.format_reward(words))
            think.append(words.index(sp.END_THINK) - 1 if fmt[-1] else len(words))
        out[kind] = {"accuracy": float(np.mean(acc)), "format": float(np.mean(fmt)),
                     "trace_length": float(np.mean(think)), "response_length": float(np.mean(lens)),
                     "correct": [int(a) for a in acc]}
    return out


def run_arm(c: Config, name: str, schedule: sp.Schedule, seed: int, graphdef, params, tok, evalsets,
            workdir: epath.Path, optimizer, rl_config: grpo.GRPOConfig) -> dict:
    """One RL run (cached per arm and seed): its evaluation and reward history."""
    def fn():
        prompt_fn = sp.make_prompt_fn(schedule, stage_sources(c, tok, seed), seed=seed)
        t0 = time.perf_counter()
        res = sp.train_staged(graphdef=graphdef, params=params, optimizer=optimizer, config=rl_config,
                              schedule=schedule, prompt_fn=prompt_fn, reward_fn=sp.make_reward_fn(tok), seed=seed,
                              workdir=epath.Path(workdir) / "runs" / f"{name}_s{seed}",
                              checkpoint_every=c.checkpoint_every, progress=c.progress, desc=name,
                              fingerprint=key_hash(key))
        ev = evaluate(c, graphdef, res.state.train.params, evalsets, tok)
        return {"eval": ev, "seconds": time.perf_counter() - t0,
                "history": [{"iteration": h["iteration"], "stage": h["stage"], "reward": h["reward_mean"],
                             "length": h["completion_length"]} for h in res.history]}
    key = {"arm": name, "seed": seed, "schedule": schedule.as_dict(),
           "cfg": dataclasses.asdict(c) | {"progress": 0, "orders": 0, "seeds": 0, "checkpoint_every": 0},
           "version": VERSION}
    return cached(workdir, key, fn)


def order_name(order) -> str:
    return "".join(ORDER_LABEL[s] for s in order)


# --- run, checks, plots -----------------------------------------------------------------------------


def _paired(a: list[int], b: list[int]) -> tuple[float, float]:
    """Mean difference a - b and its paired SE over items."""
    d = np.asarray(a, float) - np.asarray(b, float)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    t_start = time.perf_counter()
    tok = make_tokenizer(c.grid)
    graphdef, params, sft_losses = warm_start(c, tok, workdir)
    evalsets = {k: examples(c, k, c.eval_examples, seed=900_000 + i, tok=tok) for i, k in enumerate(EVAL_KINDS)}
    base = evaluate(c, graphdef, params, evalsets, tok)
    iters = c.stage_iterations
    arms = {order_name(o): sp.staged_schedule(o, iters) for o in c.orders}
    arms["merged"] = sp.merged_schedule(arms[order_name(sp.PAPER_ORDER)])
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(c.rl_lr, weight_decay=c.weight_decay))
    rl_config = grpo.GRPOConfig(group_size=c.group_size, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                                stop_tokens=(tok.eos_id,), pad_id=tok.pad_id, clip_eps=c.clip_eps, kl_coef=c.kl_coef)
    results = {name: [run_arm(c, name, sch, c.seed + s, graphdef, params, tok, evalsets, workdir, optimizer,
                              rl_config)
                      for s in range(c.seeds)] for name, sch in arms.items()}

    def pooled(name, kind, field="correct"):
        return [x for r in results[name] for x in r["eval"][kind][field]]

    def mean_of(name, kind, field):
        return float(np.mean([r["eval"][kind][field] for r in results[name]]))

    summary = {name: {kind: {f: mean_of(name, kind, f) for f in ("accuracy", "format", "trace_length",
                                                                 "response_length")} for kind in EVAL_KINDS}
               for name in arms}
    summary["sft"] = {kind: {f: base[kind][f] for f in ("accuracy", "format", "trace_length", "response_length")}
                      for kind in EVAL_KINDS}
    rollouts = {name: sch.total_iterations * c.rl_prompts * c.group_size for name, sch in arms.items()}
    paper = order_name(sp.PAPER_ORDER)
    diffs = {name: dict(zip(("diff", "se"), _paired(pooled(name, "visual_reasoning"),
                                                     pooled("merged", "visual_reasoning"))))
             for name in arms if name != "merged"}
    perc_diffs = {name: dict(zip(("diff", "se"), _paired(pooled(name, "perception"), pooled("merged", "perception"))))
                  for name in arms if name != "merged"}
    base_corr = [x for _ in range(c.seeds) for x in base["visual_reasoning"]["correct"]]
    best_rl = max(arms, key=lambda n: summary[n]["visual_reasoning"]["accuracy"])
    gain = dict(zip(("diff", "se"), _paired(pooled(best_rl, "visual_reasoning"), base_corr)))
    d = diffs[paper]
    ratio = summary[paper]["visual_reasoning"]["trace_length"] / max(summary["merged"]["visual_reasoning"]["trace_length"], 1e-9)
    checks = [
        Check(f"visual-reasoning accuracy, staged {paper} - merged (equal rollouts)", measured=round(d["diff"], 4),
              paper="+1.5% reasoning accuracy (51.10 vs 49.64 visual math, Qwen3-VL-8B)",
              threshold=f"> 2 SE = {2 * d['se']:.4f}", passed=bool(d["diff"] > 2 * d["se"]),
              note=f"{c.eval_examples} held-out questions x {c.seeds} seed(s), paired SE"),
    ]
    abstract = order_name(sp.ABSTRACT_ORDER)
    if abstract in diffs:
        da = diffs[abstract]
        checks.append(Check(f"visual-reasoning accuracy, staged {abstract} (abstract's order) - merged",
                            measured=round(da["diff"], 4), paper="staged > merged", threshold=f"> 2 SE = {2 * da['se']:.4f}",
                            passed=bool(da["diff"] > 2 * da["se"]), required=False))
    checks += [
        Check(f"trace length, staged {paper} / merged (visual reasoning)", measured=round(ratio, 4),
              paper="0.792 (20.8% shorter)", threshold="< 1", passed=bool(ratio < 1), required=False),
        Check(f"GRPO signal: best RL arm ({best_rl}) - SFT warm start, visual-reasoning accuracy",
              measured=round(gain["diff"], 4), paper="RL improves the base model", threshold=f"> 2 SE = {2 * gain['se']:.4f}",
              passed=bool(gain["diff"] > 2 * gain["se"]), required=False),
    ]
    context = (f"tiny VLM (ViT {c.vit_layers}x{c.vit_d_model} + LM {c.num_layers}x{c.d_model}), SFT warm start "
               f"{c.sft_steps} steps (visual-reasoning acc {base['visual_reasoning']['accuracy']:.3f}), "
               f"{c.rl_iterations} GRPO iterations x {c.rl_prompts} prompts x {c.group_size} samples per arm "
               f"(stages P/T/V {iters['perception']}/{iters['text_reasoning']}/{iters['visual_reasoning']}), "
               f"{c.seeds} seed(s); paper: 8B VLMs, 930 steps x 512 prompts")
    if d["diff"] < -2 * d["se"]:
        cause = (f"merged training beat the {paper} order by {-d['diff']:.3f} (> 2 SE) at this scale: with "
                 f"{c.rl_iterations} GRPO iterations on a {c.num_layers}-layer LM the visual stage of the staged "
                 f"run gets {iters['visual_reasoning']} iterations, and no perception bottleneck is built into the "
                 f"warm start (perception acc {base['perception']['accuracy']:.3f})")
    else:
        cause = (f"at this scale ({c.rl_iterations} GRPO iterations on a {c.num_layers}-layer LM) the stage order "
                 f"moved held-out visual-reasoning accuracy by {d['diff']:+.3f}, within 2 SE ({2 * d['se']:.3f}) of "
                 f"{c.eval_examples} x {c.seeds} paired eval answers")
    text, reproduced = verdict_from_checks(checks, claim="perception-first staged RL beats merged training on "
                                           "visual reasoning at equal rollouts", context=context,
                                           cause=cause, cause_class="scale")
    plots = [_plot(summary, results, arms, workdir)]
    metrics = {
        "accuracy": {n: {k: summary[n][k]["accuracy"] for k in EVAL_KINDS} for n in summary},
        "trace_length": {n: {k: summary[n][k]["trace_length"] for k in EVAL_KINDS} for n in summary},
        "format_rate": {n: {k: summary[n][k]["format"] for k in EVAL_KINDS} for n in summary},
        "visual_reasoning_minus_merged": diffs,
        "perception_minus_merged": perc_diffs,
        "rl_gain_over_sft": dict(gain, arm=best_rl),
        "rollouts_per_arm": rollouts,
        "stage_iterations": iters,
        "sft_final_loss": float(np.mean(sft_losses[-10:])) if sft_losses else None,
        "train_reward_last": {n: float(np.mean([r["history"][-1]["reward"] for r in results[n]])) for n in arms},
        "seconds": time.perf_counter() - t_start,
        "checks": [ch.as_dict() for ch in checks],
    }
    return {"metrics": metrics, "verdict": text, "reproduced": reproduced, "plots": plots,
            "cause": None if reproduced else "scale"}


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column)."""
    acc = metrics["accuracy"]
    paper = order_name(sp.PAPER_ORDER)
    d = metrics["visual_reasoning_minus_merged"][paper]
    tl = metrics["trace_length"]
    ratio = tl[paper]["visual_reasoning"] / max(tl["merged"]["visual_reasoning"], 1e-9)
    return (f"vis. reasoning acc {paper} {acc[paper]['visual_reasoning']:.3f} vs merged "
            f"{acc['merged']['visual_reasoning']:.3f} ({d['diff']:+.3f} +- {d['se']:.3f}); traces x{ratio:.2f}")


def _plot(summary, results, arms, workdir) -> str:
    fig, axes = plotting.subplots(1, 3, figsize=(15, 4))
    names = ["sft"] + list(arms)
    width = 0.8 / len(EVAL_KINDS)
    x = np.arange(len(names))
    for j, kind in enumerate(EVAL_KINDS):
        axes[0].bar(x + (j - 1) * width, [summary[n][kind]["accuracy"] for n in names], width, label=kind)
    axes[0].set_xticks(x, names, rotation=30)
    axes[0].set(ylabel="greedy accuracy (held out)", title="accuracy per stage order and kind")
    axes[0].legend(fontsize=7)
    axes[1].bar(names, [summary[n]["visual_reasoning"]["trace_length"] for n in names], color="tab:gray")
    axes[1].set(ylabel="words inside <think>", title="trace length (visual reasoning)")
    axes[1].tick_params(axis="x", rotation=30)
    for n in arms:
        h = results[n][0]["history"]
        axes[2].plot([r["iteration"] for r in h], [r["reward"] for r in h], label=n, lw=1)
    axes[2].set(xlabel="GRPO iteration", ylabel="train reward (0.9 acc + 0.1 fmt)", title="training reward, seed 0")
    axes[2].legend(fontsize=7)
    return report.savefig(fig, workdir / "staged_vlm.png")


EXPERIMENT = registry.Experiment(
    slug="staged_vlm",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(d_model=16, num_layers=1, num_heads=2, d_ff=32, vit_d_model=8, sft_steps=2,
                                sft_batch=6, rl_iterations=3, rl_prompts=2, group_size=2,
                                orders=(sp.PAPER_ORDER,), eval_examples=4, checkpoint_every=3, progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(d_model=256, num_layers=4, num_heads=8, d_ff=768, vit_d_model=128, vit_layers=4,
                                sft_steps=3000, sft_batch=128, rl_iterations=930, rl_prompts=64, seeds=3,
                                eval_examples=2000, checkpoint_every=50),
    },
    run=run,
)
