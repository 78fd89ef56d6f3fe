r"""Staged perception -> reasoning RL post-training of a VLM (GRPO with images, stage curriculum).

"From Seeing to Thinking" (arXiv 2605.20177) splits post-training by capability into stages, each an
RLVR (GRPO) run started from the previous stage's checkpoint: visual perception -> textual reasoning
-> visual reasoning. The baseline "merged" pools the stages' data into one run of the same total
steps. Reward: ``0.9 * accuracy + 0.1 * format`` on "<think> ... </think> \boxed{...}" responses.

What the code does:
  * rewards: `format_reward`, `accuracy_reward`, `staged_reward`, batched by `make_reward_fn`;
  * GRPO with images: `sample_vlm_rollout` (the multimodal prompt prefilled by `VLM.prefill`, the
    text sampled by `algorithms.decoding.generate`), `vlm_logprobs`, `vlm_update` (clipped surrogate
    + k3 KL, a freeze mask). They live here because `algorithms.rl.grpo` calls `model(tokens)`,
    which cannot pass images; its pure pieces (advantages, sequence assembly, state) are reused;
  * the curriculum: `Stage`, `staged_schedule` / `merged_schedule`, `make_prompt_fn` and
    `train_staged` (orbax checkpoint per iteration, resume mid-stage bit-identically; a stage with
    `trainer="sft"` is the SFT-for-perception ablation);
  * the data recipe: `perception_filter`, `difficulty_order`, `pool_source`, `estimate_pass_rates`;
    `vlm_sft` (warm-up) and `greedy_completions` (evaluation).

INFERRED (the paper and spec leave these open; the spec's section 10 (f) notes the order ambiguity):
  * each stage gets a fresh optimizer and its KL reference is the policy at the stage's start
    (separate EasyR1 runs); merged keeps one optimizer and the initial policy as reference;
  * merged = the multiset union of exactly the staged run's prompts, shuffled, same batch size;
  * the frozen vision tower of the textual stage [READ] is ViT + projector (EasyR1's
    `freeze_vision_tower`), its updates masked to exactly zero;
  * rewards act on whitespace words ("<think>", "</think>", "\boxed" are tokens; the answer is the
    word after the last "\boxed", compared exactly);
  * greedy evaluation (the paper: temperature 0.6, top-p 0.95);
  * `perception_filter`'s thresholds for k-sample pass rates generalise the paper's 0/1 rule;
  * the difficulty order sorts a stage's prompts once by the base model's pass rate (k = 8) and
    visits them in that order (the released script's ``data.shuffle=false`` [READ]);
  * SFT-for-perception trains on the same prompts with the same optimizer and step budget.

Dimension legend: `B` prompts per batch, `G` samples per prompt, `b = B * G` sequences (groups
contiguous), `P` padded prompt length, `N` max new tokens, `n_img` images per prompt, `H, W, c`
image shape, `v` vocabulary.

Spec: /work/shared/papers/specs/rl_alignment_agents.md section 10 ((b) recipe and reward, (d) CPU
plan, (e) tests, (f) stage order).

References:
  Shao et al., "DeepSeekMath" (GRPO), arXiv:2402.03300, 2024.
  "From Seeing to Thinking: Decoupling Perception and Reasoning Improves Post-Training of
    Vision-Language Models", arXiv:2605.20177 (UCSC-VLAA, ICML 2026); code UCSC-VLAA/VLM-CapCurriculum.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from flax import nnx

from algorithms._loop import run_loop
from algorithms.decoding.generate import generate
from algorithms.rl import grpo
from algorithms.training import Checkpointer, TrainState
from primitives import policy_losses
from primitives.sampling import Sampler

__all__ = [
    "THINK", "END_THINK", "BOXED", "STAGES", "PAPER_ORDER", "ABSTRACT_ORDER", "ACC_WEIGHT", "FORMAT_WEIGHT",
    "format_reward", "accuracy_reward", "staged_reward", "make_reward_fn",
    "VLMPromptBatch", "VLMRollout", "StagedState", "StagedResult",
    "Stage", "Schedule", "staged_schedule", "merged_schedule", "make_prompt_fn",
    "vision_mask", "vlm_logprobs", "sample_vlm_rollout", "vlm_update", "train_staged",
    "vlm_sft", "greedy_completions", "TRAINERS",
    "perception_filter", "difficulty_order", "pool_source", "estimate_pass_rates",
]

THINK, END_THINK, BOXED = "<think>", "</think>", "\\boxed"
ACC_WEIGHT, FORMAT_WEIGHT = 0.9, 0.1
STAGES = ("perception", "text_reasoning", "visual_reasoning")
PAPER_ORDER = ("perception", "text_reasoning", "visual_reasoning")  # released recipe (code / README)
ABSTRACT_ORDER = ("perception", "visual_reasoning", "text_reasoning")  # the abstract's enumeration
VISION_KEYS = ("vit", "img_proj1", "img_proj2")
TRAINERS = ("grpo", "sft")


# --- rewards ----------------------------------------------------------------------------------------


def _words(completion: str | Sequence[str]) -> list[str]:
    if isinstance(completion, str):
        return completion.split()
    words = list(completion)
    if any(not isinstance(w, str) for w in words):
        raise TypeError(f"completion: expected a string or a sequence of strings, got {completion!r}")
    return words


def format_reward(completion: str | Sequence[str]) -> float:
    """1.0 iff the completion's words fully match ``<think> .* </think> .* \\boxed X .*``, else 0.0.

    The word-level form of the recipe's regex ``<think>.*</think>.*\\boxed{.*}.*`` (fullmatch): the
    first word is "<think>", a later word is "</think>", and after it comes "\\boxed" followed by
    at least one word (the boxed content). Spec section 10 (b), reward_functions/math.py.

    Examples:
      >>> format_reward("<think> r0 c1 </think> \\\\boxed 1"), format_reward("r0 c1 \\\\boxed 1")
      (1.0, 0.0)
    """
    w = _words(completion)
    if not w or w[0] != THINK:
        return 0.0
    try:
        end = w.index(END_THINK, 1)
    except ValueError:
        return 0.0
    return float(any(w[k] == BOXED and k + 1 < len(w) for k in range(end + 1, len(w))))


def _boxed(words: list[str]) -> str | None:
    """The word after the last "\\boxed" (None if there is none)."""
    for k in range(len(words) - 1, -1, -1):
        if words[k] == BOXED:
            return words[k + 1] if k + 1 < len(words) else None
    return None


def accuracy_reward(completion: str | Sequence[str], answer: str) -> float:
    """1.0 iff the content of the last "\\boxed" equals `answer` (a single word), else 0.0.

    No "\\boxed" (or nothing after it) gives 0 whatever the text says. The format is not required
    (as in the recipe, where accuracy grades the extracted boxed answer only).

    Examples:
      >>> accuracy_reward("<think> </think> \\\\boxed 2", "2"), accuracy_reward("2", "2")
      (1.0, 0.0)
    """
    if not isinstance(answer, str) or len(answer.split()) != 1:
        raise ValueError(f"answer: expected a single word, got {answer!r}")
    return float(_boxed(_words(completion)) == answer)


def staged_reward(completion: str | Sequence[str], answer: str) -> float:
    """The recipe's overall reward ``0.9 * accuracy + 0.1 * format`` (spec section 10 (b))."""
    return ACC_WEIGHT * accuracy_reward(completion, answer) + FORMAT_WEIGHT * format_reward(completion)


def _answer_of(problem: Any) -> str:
    if isinstance(problem, str):
        return problem
    if hasattr(problem, "answer"):
        return problem.answer
    if isinstance(problem, Mapping) and "answer" in problem:
        return problem["answer"]
    raise TypeError(f"problems: expected a str answer or an object with `answer`, got {problem!r}")


def make_reward_fn(tokenizer) -> grpo.RewardFn:
    """The batched reward `(problems, completions [b, N], lengths [b]) -> [b]` of `staged_reward`.

    Args:
      tokenizer: has `decode(ids) -> str` (stops at EOS, joins words with spaces), e.g. a
        `WordTokenizer` whose vocabulary holds THINK, END_THINK and BOXED.

    The problems are answers (str) or objects with an `answer` field.
    """
    return grpo.text_reward(tokenizer, lambda p, text: staged_reward(text, _answer_of(p)))


# --- data records -----------------------------------------------------------------------------------


class VLMPromptBatch(NamedTuple):
    """B image (or text-only) prompts.

    Attributes:
      problems: B per-prompt objects handed to the reward (answers or objects with `.answer`).
      tokens: [B, P] int32 right-padded prompts (BOS included) with image placeholders.
      lengths: [B] int32 real prompt lengths (>= 2; the last prompt token is text).
      images: [B, n_img, H, W, c] float32 (a text-only row has no placeholders; its image is ignored).
    """

    problems: Sequence[Any]
    tokens: np.ndarray
    lengths: np.ndarray
    images: np.ndarray


def _check_prompts(prompts: VLMPromptBatch, name: str = "prompts") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens, lengths, images = np.asarray(prompts.tokens), np.asarray(prompts.lengths), np.asarray(prompts.images)
    B = tokens.shape[0] if tokens.ndim == 2 else None
    if (tokens.ndim != 2 or lengths.shape != (B,) or images.ndim != 5 or images.shape[0] != B
            or len(prompts.problems) != B):
        raise ValueError(f"{name}: expected tokens [B, P], lengths [B], images [B, n_img, H, W, c] and B problems; "
                         f"got {tokens.shape}, {lengths.shape}, {images.shape} and {len(prompts.problems)} problems")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"{name}.tokens: expected integer ids, got dtype {tokens.dtype}")
    if B == 0 or np.any(lengths < 2) or np.any(lengths > tokens.shape[1]):
        raise ValueError(f"{name}.lengths: expected values in [2, P={tokens.shape[1]}], got {lengths.tolist()}")
    return tokens, lengths, images


class VLMRollout(NamedTuple):
    """A `grpo.Rollout` (b = B * G rows, groups contiguous) plus the images of its rows [b, n_img, H, W, c]."""

    rollout: grpo.Rollout
    images: jax.Array


class StagedState(NamedTuple):
    """What a staged run checkpoints: the policy's TrainState and its KL reference params."""

    train: TrainState
    ref_params: Any

    @property
    def params(self):
        return self.train.params


class StagedResult(NamedTuple):
    """Output of `train_staged`: graphdef, final StagedState, logged rows (with "iteration", "stage",
    "stage_iteration"), the iteration the run resumed from (None = fresh)."""

    graphdef: nnx.GraphDef
    state: StagedState
    history: list[dict[str, Any]]
    resumed_from: int | None

    def model(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.state.train.params)


# --- the schedule -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: a prompt source `name`, its iterations, whether the vision tower trains, and its trainer.

    `trainer` is "grpo" (RL, the recipe) or "sft" (supervised steps on the same prompts' reference
    responses: the SFT-for-perception ablation).
    """

    name: str
    iterations: int
    train_vision: bool = True
    trainer: str = "grpo"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Stage.name: expected a non-empty string, got {self.name!r}")
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, (int, np.integer)) \
                or self.iterations < 1:
            raise ValueError(f"Stage.iterations: expected an int >= 1, got {self.iterations!r}")
        if self.trainer not in TRAINERS:
            raise ValueError(f"Stage.trainer: expected one of {TRAINERS}, got {self.trainer!r}")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Stages visited in order; a merged schedule has one stage "merged" drawing from `pooled`.

    Attributes:
      stages: the stages in visiting order (names unique).
      pooled: for merged training, the stages whose prompts are pooled (their iterations sum to the
        merged stage's); empty for a staged schedule.
    """

    stages: tuple[Stage, ...]
    pooled: tuple[Stage, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "pooled", tuple(self.pooled))
        if not self.stages or any(not isinstance(s, Stage) for s in self.stages):
            raise ValueError(f"Schedule.stages: expected a non-empty sequence of Stage, got {self.stages!r}")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"Schedule.stages: expected unique stage names, got {names}")
        if self.pooled:
            total = sum(s.iterations for s in self.pooled)
            if len(self.stages) != 1 or self.stages[0].name != "merged" or self.stages[0].iterations != total:
                raise ValueError(f"Schedule: a merged schedule needs exactly one stage 'merged' with the pooled "
                                 f"iterations ({total}); got {self.stages!r}")
            pnames = [s.name for s in self.pooled]
            if len(set(pnames)) != len(pnames):
                raise ValueError(f"Schedule.pooled: expected unique stage names, got {pnames}")

    @property
    def merged(self) -> bool:
        return bool(self.pooled)

    @property
    def total_iterations(self) -> int:
        return int(sum(s.iterations for s in self.stages))

    @property
    def sources(self) -> tuple[str, ...]:
        """The prompt sources the schedule reads (the pooled ones for merged training)."""
        return tuple(s.name for s in (self.pooled or self.stages))

    def locate(self, iteration: int) -> tuple[int, int]:
        """(stage index, iteration within that stage) of the 0-based global `iteration`."""
        if isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer)) \
                or not 0 <= iteration < self.total_iterations:
            raise ValueError(f"iteration: expected an int in [0, {self.total_iterations}), got {iteration!r}")
        for s, stage in enumerate(self.stages):
            if iteration < stage.iterations:
                return s, int(iteration)
            iteration -= stage.iterations
        raise AssertionError("unreachable")

    def visits(self) -> list[tuple[str, int]]:
        """[(stage name, stage iteration)] for every global iteration, in order."""
        return [(self.stages[s].name, k) for s, k in map(self.locate, range(self.total_iterations))]

    def as_dict(self) -> dict:
        return {"stages": [dataclasses.asdict(s) for s in self.stages],
                "pooled": [dataclasses.asdict(s) for s in self.pooled]}


def staged_schedule(order: Sequence[str], iterations: Mapping[str, int], *,
                    frozen_vision: Sequence[str] = ("text_reasoning",), sft_stages: Sequence[str] = ()) -> Schedule:
    """Stages in `order`, each with `iterations[name]` iterations (the vision tower frozen in `frozen_vision`).

    The stages named in `sft_stages` are trained by SFT instead of GRPO (e.g. `("perception",)` for
    the SFT-for-perception ablation); the others by GRPO.

    Raises:
      ValueError: an empty or repeated order, a stage without an iteration count, or an SFT stage
        outside the order.
    """
    order = tuple(order)
    if not order or len(set(order)) != len(order):
        raise ValueError(f"order: expected distinct stage names, got {order!r}")
    missing = [n for n in order if n not in iterations]
    if missing:
        raise ValueError(f"iterations: expected a count for every stage of the order {order}, missing {missing}")
    extra = [n for n in sft_stages if n not in order]
    if extra:
        raise ValueError(f"sft_stages: expected stages of the order {order}, got {extra}")
    return Schedule(tuple(Stage(n, int(iterations[n]), n not in frozen_vision, "sft" if n in sft_stages else "grpo")
                          for n in order))


def merged_schedule(schedule: Schedule, *, train_vision: bool = True) -> Schedule:
    """Merged training on the union of `schedule`'s stages: one stage, the same total iterations."""
    if schedule.merged:
        raise ValueError("schedule: expected a staged schedule, got a merged one")
    if any(s.trainer != "grpo" for s in schedule.stages):
        raise ValueError("schedule: merged training pools GRPO stages; got an SFT stage")
    return Schedule((Stage("merged", schedule.total_iterations, train_vision),), pooled=schedule.stages)


def _stack_batches(parts: list[tuple[VLMPromptBatch, int]]) -> VLMPromptBatch:
    """Rows `r` of batches, in order, as one batch."""
    shapes = {(np.asarray(b.tokens).shape[1], np.asarray(b.images).shape[1:]) for b, _ in parts}
    if len(shapes) != 1:
        raise ValueError(f"prompt sources: pooled sources must share P and the image shape; got {sorted(shapes)}")
    return VLMPromptBatch(
        problems=[b.problems[r] for b, r in parts],
        tokens=np.stack([np.asarray(b.tokens)[r] for b, r in parts]),
        lengths=np.stack([np.asarray(b.lengths)[r] for b, r in parts]),
        images=np.stack([np.asarray(b.images)[r] for b, r in parts]))


def make_prompt_fn(schedule: Schedule, sources: Mapping[str, Callable[[int], VLMPromptBatch]], *,
                   seed: int = 0) -> Callable[[int], VLMPromptBatch]:
    """`iteration -> VLMPromptBatch` of a schedule.

    Staged: global iteration i in stage s at stage iteration k reads `sources[s.name](k)`.
    Merged: the rows of `sources[p.name](k)` for every pooled stage p and k < p.iterations (exactly
    the staged prompts) are permuted with `seed` and cut into consecutive batches of B rows, so
    both schedules see the same prompts and the same number of rollouts.

    Args:
      schedule: a staged or merged schedule.
      sources: stage name -> `stage_iteration -> VLMPromptBatch` (deterministic; the same B
        for every source).
      seed: the merged shuffle's seed.

    Raises:
      ValueError: a stage without a source, or sources with different batch sizes.
    """
    missing = [n for n in schedule.sources if n not in sources]
    if missing:
        raise ValueError(f"sources: expected a prompt source for every stage {schedule.sources}, missing {missing}")

    @functools.lru_cache(maxsize=None)
    def read(name: str, k: int) -> VLMPromptBatch:
        batch = sources[name](k)
        _check_prompts(batch, f"sources[{name!r}]({k})")
        return batch

    sizes = {n: len(read(n, 0).problems) for n in schedule.sources}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"sources: expected one batch size B for every stage, got {sizes}")
    B = next(iter(sizes.values()))
    if not schedule.merged:
        def prompt_fn(i: int) -> VLMPromptBatch:
            s, k = schedule.locate(i)
            return read(schedule.stages[s].name, k)
        return prompt_fn
    items = [(p.name, k, r) for p in schedule.pooled for k in range(p.iterations) for r in range(B)]
    perm = np.random.default_rng(seed).permutation(len(items))

    def merged_fn(i: int) -> VLMPromptBatch:
        schedule.locate(i)  # range check
        return _stack_batches([(read(n, k), r) for n, k, r in (items[j] for j in perm[i * B:(i + 1) * B])])

    return merged_fn


# --- the data side: perception filter, difficulty curriculum ----------------------------------------


def _rates(x, name: str) -> np.ndarray:
    a = np.asarray(x, np.float64)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"{name}: expected pass rates [n] or [m, n] (m filter models, n samples), got shape "
                         f"{np.shape(x)}")
    if not np.all((a >= 0) & (a <= 1)):
        raise ValueError(f"{name}: expected pass rates in [0, 1], got values in [{a.min()}, {a.max()}]")
    return a


def perception_filter(img_pass, caption_pass, *, img_max: float = 0.0, caption_min: float = 1.0) -> np.ndarray:
    """The perception-data filter: keep a sample iff every filter model fails it from the image but solves it from the caption.

    Spec section 10 (b): keep iff  A_img(Q|I) != A  and  A_cap(Q|C) = A  for *both* filter VLMs
    (the intersection). With 0/1 correctness (one greedy answer per model) the defaults are exactly
    that rule; with k-sample pass rates a sample counts as "failed from the image" when its pass
    rate is <= `img_max` and "solved from the caption" when it is >= `caption_min`.

    Args:
      img_pass: [n] or [m, n] pass rates (or 0/1 correctness) of m filter models answering from the image.
      caption_pass: the same shape, answering from the caption (the image given as text).
      img_max, caption_min: thresholds in [0, 1].

    Returns:
      [n] bool keep mask.

    Example:
      >>> perception_filter([[0, 0, 1, 0], [0, 1, 1, 0]], [[1, 1, 1, 0], [1, 1, 1, 1]]).tolist()
      [True, False, False, False]
    """
    img, cap = _rates(img_pass, "img_pass"), _rates(caption_pass, "caption_pass")
    if img.shape != cap.shape:
        raise ValueError(f"caption_pass: expected the shape of img_pass {img.shape}, got {cap.shape}")
    for name, v in (("img_max", img_max), ("caption_min", caption_min)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name}: expected a value in [0, 1], got {v!r}")
    return np.all((img <= img_max) & (cap >= caption_min), axis=0)


def difficulty_order(pass_rates, *, seed: int = 42, drop_solved: bool = True) -> np.ndarray:
    """The difficulty curriculum: sample indices sorted easy -> hard by pass rate.

    Spec section 10 (b) (the released passK curriculum script): pass_rate = fraction of k base-model
    samples that are correct; sort descending (easy first), shuffle ties with `seed` (42 in the
    recipe), drop pass_rate = 1 samples; training then reads the data in this order.

    Args:
      pass_rates: [n] pass rates in [0, 1].
      seed: the tie shuffle's seed.
      drop_solved: drop the samples with pass rate 1.

    Returns:
      int64 indices into `pass_rates` (pass rate non-increasing along them).

    Example:
      >>> difficulty_order([0.5, 1.0, 0.25, 0.75]).tolist()
      [3, 0, 2]
    """
    rates = np.asarray(pass_rates, np.float64)
    if rates.ndim != 1 or not np.all((rates >= 0) & (rates <= 1)):
        raise ValueError(f"pass_rates: expected a 1-D array of values in [0, 1], got shape {rates.shape} "
                         f"and values {rates.tolist() if rates.size < 20 else '...'}")
    perm = np.random.default_rng(seed).permutation(rates.shape[0])  # ties end up in this random order
    order = perm[np.argsort(-rates[perm], kind="stable")]
    return order[rates[order] < 1.0] if drop_solved else order


def pool_source(pool: VLMPromptBatch, rows: Sequence[int], batch_size: int) -> Callable[[int], VLMPromptBatch]:
    """A stage's prompt source over a pool: stage iteration k reads `pool` rows `rows[k*B:(k+1)*B]`.

    With `rows` from `difficulty_order` the stage visits its prompts easy -> hard (the recipe's
    `data.shuffle=false`); with `np.flatnonzero(perception_filter(...))` it reads only the kept
    samples. Plug the result into `make_prompt_fn(schedule, sources)`.

    Args:
      pool: the candidate prompts (N rows).
      rows: indices into the pool, in visiting order.
      batch_size: B prompts per iteration.

    Returns:
      `k -> VLMPromptBatch` for 0 <= k < len(rows) // B.
    """
    tokens, lengths, images = _check_prompts(pool, "pool")
    rows = np.asarray(rows, np.int64)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    if rows.ndim != 1 or np.any(rows < 0) or np.any(rows >= tokens.shape[0]):
        raise ValueError(f"rows: expected 1-D indices into the pool of {tokens.shape[0]} rows, got shape {rows.shape}")
    n = rows.shape[0] // batch_size

    def source(k: int) -> VLMPromptBatch:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < n:
            raise ValueError(f"k: expected a stage iteration in [0, {n}) ({rows.shape[0]} rows / B={batch_size}), "
                             f"got {k!r}")
        r = rows[k * batch_size:(k + 1) * batch_size]
        return VLMPromptBatch([pool.problems[i] for i in r], tokens[r], lengths[r], images[r])

    return source


def estimate_pass_rates(graphdef: nnx.GraphDef, params: Any, prompts: VLMPromptBatch, key: jax.Array, *, k: int,
                        tokenizer, max_new_tokens: int, stop_tokens: tuple[int, ...] = (), pad_id: int = 0,
                        temperature: float = 1.0, chunk: int = 256) -> np.ndarray:
    """Per-prompt pass rates [B]: the fraction of k sampled completions whose boxed answer is right.

    The difficulty estimate of the curriculum (spec 10 (b): "run the base model k times per sample").
    Samples at `temperature` (top-p 1) in chunks of `chunk` prompts (the last chunk padded to keep
    one compiled shape); `accuracy_reward` grades each completion.
    """
    tokens, lengths, images = _check_prompts(prompts)
    for name, v in (("k", k), ("chunk", chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    B = tokens.shape[0]
    out = []
    for c, s in enumerate(range(0, B, chunk)):
        sl = slice(s, s + chunk)
        t, l, im = tokens[sl], lengths[sl], images[sl]
        pad = chunk - t.shape[0] if B > chunk else 0
        if pad:
            t, l, im = (np.concatenate([x, np.repeat(x[-1:], pad, axis=0)]) for x in (t, l, im))
        rep = lambda x: np.repeat(x, k, axis=0)  # noqa: E731
        o = _sample(graphdef, params, rep(t), rep(l), rep(im), jax.random.fold_in(key, c),
                    sampler=Sampler(temperature=temperature), max_new_tokens=max_new_tokens,
                    stop_tokens=tuple(stop_tokens), pad_id=pad_id)
        comps, lens = np.asarray(o.tokens), np.asarray(o.lengths)
        probs = prompts.problems[sl]
        acc = np.array([accuracy_reward(tokenizer.decode(comps[i, :lens[i]]), _answer_of(probs[i // k]))
                        for i in range(len(probs) * k)], np.float64)
        out.append(acc.reshape(len(probs), k).mean(axis=1))
    return np.concatenate(out)


# --- the VLM policy ---------------------------------------------------------------------------------


def vision_mask(params: Any, *, train_vision: bool, vision_keys: Sequence[str] = VISION_KEYS) -> Any:
    """A pytree like `params` of float32 scalars: 0 on the vision tower when frozen, else 1.

    `params` is a pure dict of the VLM (`nnx.to_pure_dict`); the vision tower is its top-level
    entries `vision_keys` (the ViT and the image projector).
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params: expected a pure dict of the VLM's parameters, got {type(params).__name__}")
    return {k: jax.tree.map(lambda _: jnp.float32(0.0 if (k in vision_keys and not train_vision) else 1.0), v)
            for k, v in params.items()}


def vlm_logprobs(graphdef: nnx.GraphDef, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
                 images: jax.Array, completions: jax.Array, *, temperature: float, pad_id: int = 0,
                 with_entropy: bool = False):
    """Per-token log-probs [b, N] (and entropies) of completions under the VLM, one forward with images.

    The completion is written after each prompt (`grpo.assemble_sequences`); the logits at the
    position before each completion token are scored at `temperature`
    (`policy_losses.token_logprobs`). Placeholders are replaced by image embeddings in the prompt
    only (`VLM.embed`), completion tokens use their token embeddings, as in decoding; the forward
    is `VLM.run_embeddings`.

    Args:
      graphdef, params: the VLM. prompt_tokens [b, P], prompt_lengths [b], images [b, n_img, H, W, c]
        (every prompt row holds n_img * patches placeholders), completions [b, N].
      temperature: the policy's temperature. pad_id: padding id. with_entropy: also return [b, N] entropies.
    """
    tokens, positions = grpo.assemble_sequences(prompt_tokens, prompt_lengths, completions, pad_id=pad_id)
    vlm = nnx.merge(graphdef, params)
    # Only prompt placeholders take image embeddings: a sampled completion token that happens to be
    # a placeholder id was decoded with its token embedding (as in `generate`), so it is scored so.
    in_prompt = jnp.arange(tokens.shape[1])[None, :] < jnp.asarray(prompt_lengths)[:, None]
    x = vlm.embed(jnp.where(in_prompt, tokens, pad_id), images)
    x = jnp.where(in_prompt[..., None], x, jnp.take(vlm.lm.embed[...], tokens, axis=0).astype(x.dtype))
    logits = vlm.run_embeddings(x).logits
    logits = logits[jnp.arange(tokens.shape[0])[:, None], positions - 1]  # [b, N, v]
    logp = policy_losses.token_logprobs(logits, completions, temperature=temperature)
    if not with_entropy:
        return logp
    return logp, policy_losses.entropy_from_logits(logits, temperature=temperature)


@functools.partial(jax.jit, static_argnames=("graphdef", "capacity"))
def _prefill(graphdef, params, tokens, lengths, images, *, capacity):
    return nnx.merge(graphdef, params).prefill(tokens, lengths, images=images, capacity=capacity)


def _sample(graphdef, params, tokens, lengths, images, key, *, sampler: Sampler, max_new_tokens: int,
            stop_tokens: tuple[int, ...], pad_id: int):
    """Prefill the multimodal prompts, then sample the text continuation from the LM's cache."""
    vlm = nnx.merge(graphdef, params)
    placeholders = [i for i in (vlm.config.image_token_id, vlm.config.audio_token_id) if i is not None]
    last = np.take_along_axis(np.asarray(tokens), np.asarray(lengths)[:, None] - 1, axis=1)
    if np.any(np.isin(last, placeholders)):
        raise ValueError("prompts.tokens: the last prompt token of every row must be text, not a placeholder")
    cache, last = _prefill(graphdef, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32),
                           jnp.asarray(images, jnp.float32), capacity=int(tokens.shape[1]) + max_new_tokens)
    return generate(vlm.lm, last, max_new_tokens=max_new_tokens, sampler=sampler, key=key,
                    stop_tokens=stop_tokens, pad_id=pad_id, cache=cache)


def sample_vlm_rollout(graphdef: nnx.GraphDef, params: Any, prompts: VLMPromptBatch, key: jax.Array, *,
                       config: grpo.GRPOConfig, reward_fn: grpo.RewardFn) -> VLMRollout:
    """G completions per image prompt (temperature `config.temperature`), scored by `reward_fn`.

    Returns:
      A `VLMRollout` with b = B * G rows; `old_logp` are the sampling log-probs.
    """
    tokens, lengths, images = _check_prompts(prompts)
    g = config.group_size
    rep = lambda x: np.repeat(x, g, axis=0)  # noqa: E731
    out = _sample(graphdef, params, rep(tokens), rep(lengths), rep(images), key, sampler=config.sampler,
                  max_new_tokens=config.max_new_tokens, stop_tokens=tuple(config.stop_tokens),
                  pad_id=config.pad_id)
    mask = (jnp.arange(config.max_new_tokens)[None, :] < out.lengths[:, None]).astype(jnp.float32)
    problems = [p for p in prompts.problems for _ in range(g)]
    rewards = np.asarray(reward_fn(problems, np.asarray(out.tokens), np.asarray(out.lengths)), np.float32)
    if rewards.shape != (len(problems),):
        raise ValueError(f"reward_fn: expected [b]=({len(problems)},) rewards, got shape {rewards.shape}")
    r = grpo.Rollout(jnp.asarray(rep(tokens), jnp.int32), jnp.asarray(rep(lengths), jnp.int32), out.tokens, mask,
                     out.logprobs, jnp.asarray(rewards.reshape(-1, g)))
    return VLMRollout(r, jnp.asarray(rep(images), jnp.float32))


def _loss(params, graphdef, mb, kl_coef, entropy_coef, config: grpo.UpdateSettings):
    logp, ent = vlm_logprobs(graphdef, params, mb["prompt_tokens"], mb["prompt_lengths"], mb["images"],
                             mb["completions"], temperature=config.temperature, pad_id=config.pad_id,
                             with_entropy=True)
    return grpo.objective(logp, ent, mb, kl_coef, entropy_coef, config)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer", "config"), donate_argnums=(0,))
def _update(state: TrainState, batch: dict, kl_coef, entropy_coef, train_mask, *, graphdef, optimizer, config):
    size = batch["completions"].shape[0] // config.num_minibatches

    def one_step(state, i):
        start = (i % config.num_minibatches) * size
        mb = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size, axis=0), batch)
        (_, metrics), grads = jax.value_and_grad(_loss, has_aux=True)(
            state.params, graphdef, mb, kl_coef, entropy_coef, config)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        updates = jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, train_mask)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), metrics

    state, metrics = jax.lax.scan(one_step, state, jnp.arange(config.num_inner_steps))
    return state, {k: v[0] for k, v in metrics.items()}


_ref_logprobs = jax.jit(vlm_logprobs, static_argnames=("graphdef", "temperature", "pad_id", "with_entropy"))


def vlm_update(state: TrainState, rollout: VLMRollout, advantages: jax.Array, *, graphdef: nnx.GraphDef,
               optimizer: optax.GradientTransformation, config: grpo.GRPOConfig, ref_params: Any = None,
               train_vision: bool = True) -> tuple[TrainState, dict]:
    """`config.num_inner_steps` GRPO optimizer steps on one VLM rollout (jitted, `state` donated).

    Loss = `clipped_surrogate` - entropy_coef * entropy + kl_coef * k3 KL(pi || pi_ref), all
    `masked_mean` over completion tokens. With `train_vision=False` the updates of the vision
    tower (`vision_mask`) are multiplied by exactly 0.

    Args:
      state: the policy's TrainState (params a pure dict of the VLM).
      rollout: from `sample_vlm_rollout`.
      advantages: [B, G] or [B, G, N] constants (e.g. `grpo.grpo_advantage_fn()(rollout.rollout)`).
      graphdef, optimizer, config: as in `grpo.update` (pass the same optimizer object each call).
      ref_params: the KL reference (required when kl_coef > 0).
      train_vision: whether the vision tower is updated.

    Returns:
      (new state, metrics of the first inner step).
    """
    r = rollout.rollout
    b, n = r.completions.shape
    if b % config.num_minibatches:
        raise ValueError(f"config.num_minibatches: expected a divisor of b={b}, got {config.num_minibatches}")
    adv = jnp.asarray(advantages, jnp.float32)
    groups = tuple(r.rewards.shape)
    if adv.shape == groups:
        adv = adv.reshape(b)
    elif adv.shape == groups + (n,):
        adv = adv.reshape(b, n)
    else:
        raise ValueError(f"advantages: expected [B, G]={groups} or [B, G, N]={groups + (n,)}, got {adv.shape}")
    batch = {"prompt_tokens": r.prompt_tokens, "prompt_lengths": r.prompt_lengths, "images": rollout.images,
             "completions": r.completions, "mask": r.mask, "old_logp": r.old_logp, "advantages": adv}
    if config.kl_coef > 0:
        if ref_params is None:
            raise ValueError("ref_params: a reference policy is required when config.kl_coef > 0")
        batch["ref_logp"] = _ref_logprobs(graphdef, ref_params, r.prompt_tokens, r.prompt_lengths, rollout.images,
                                          r.completions, temperature=config.temperature, pad_id=config.pad_id)
    else:
        batch["ref_logp"] = r.old_logp
    mask = vision_mask(state.params, train_vision=train_vision)
    return _update(state, batch, jnp.float32(config.kl_coef), jnp.float32(config.entropy_coef), mask,
                   graphdef=graphdef, optimizer=optimizer, config=grpo.UpdateSettings.of(config))


# --- the staged driver ------------------------------------------------------------------------------


def train_staged(*, graphdef: nnx.GraphDef, params: Any, optimizer: optax.GradientTransformation,
                 config: grpo.GRPOConfig, schedule: Schedule, prompt_fn: Callable[[int], VLMPromptBatch],
                 reward_fn: grpo.RewardFn, seed: int = 0, advantage_fn: grpo.AdvantageFn | None = None,
                 workdir: str | os.PathLike | None = None, checkpoint_every: int = 1, log_every: int = 1,
                 stop_after: int | None = None, progress: bool = True, desc: str = "staged",
                 fingerprint: str | None = None,
                 sft_fn: Callable[[int], Mapping[str, np.ndarray]] | None = None) -> StagedResult:
    """Runs the schedule's GRPO iterations on the VLM, checkpointing (orbax) and resuming from `workdir/ckpt`.

    Global iteration i runs stage `schedule.locate(i)` on `prompt_fn(i)` with the key
    `fold_in(key(seed), i)`. At the first iteration of every stage after the first (staged
    schedules only) the optimizer state is re-initialised and the KL reference becomes the current
    policy (each stage initialises from the previous stage's checkpoint). The checkpoint holds the
    policy, its optimizer state and the reference (a `StagedState`), with the schedule position in
    its metadata; the schedule is part of the fingerprint, so a resumed run continues mid-stage
    exactly where an uninterrupted run would be.

    A stage with `trainer="sft"` runs, at global iteration i, `config.num_inner_steps` supervised
    optimizer steps (the same optimizer, the same vision freeze) on `sft_fn(i)` instead of a GRPO
    rollout + update: the SFT-for-perception ablation at the same iterations and optimizer steps.

    Args:
      graphdef, params: the initial VLM (pure-dict params, e.g. after `vlm_sft`).
      optimizer: optax transformation (the same object across runs shares the compiled update).
      config: GRPO settings (group size, N, temperature, stop tokens, clip, kl_coef, ...).
      schedule: staged or merged (`staged_schedule`, `merged_schedule`).
      prompt_fn: `iteration -> VLMPromptBatch` (`make_prompt_fn`).
      reward_fn: batched reward (`make_reward_fn`).
      seed: sampling seed.
      advantage_fn: `grpo.Rollout -> advantages` (default `grpo.grpo_advantage_fn`).
      workdir: checkpoints go to `workdir/ckpt`; None = no checkpoints.
      checkpoint_every, log_every: in iterations.
      stop_after: stop (as if interrupted) after this many total iterations.
      progress, desc: tqdm bar.
      fingerprint: extra identity of the run's settings (combined with the schedule's).
      sft_fn: `iteration -> {"inputs", "targets", "loss_mask" [b, t-1], "images" [b, n_img, H, W, c]}`
        (the supervised responses of the iteration's prompts); required iff a stage is SFT.

    Returns:
      StagedResult.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule: expected a Schedule, got {type(schedule).__name__}")
    if config.group_size < 2:
        raise ValueError(f"config.group_size: expected >= 2 for group advantages, got {config.group_size}")
    if any(s.trainer == "sft" for s in schedule.stages) and sft_fn is None:
        raise ValueError("sft_fn: required when the schedule has an SFT stage "
                         f"({[s.name for s in schedule.stages if s.trainer == 'sft']})")
    advantage_fn = advantage_fn or grpo.grpo_advantage_fn(normalize_std=config.normalize_std, eps=config.adv_eps)
    base_key = jax.random.key(seed)
    init = grpo.init_state(params, optimizer)
    state0 = StagedState(init, jax.tree.map(jnp.copy, init.params))
    fp = json.dumps({"schedule": schedule.as_dict(), "seed": seed, "config": repr(config), "user": fingerprint},
                    sort_keys=True)

    def step_fn(state: StagedState, i: int):
        s, k = schedule.locate(i)
        stage = schedule.stages[s]
        if k == 0 and s > 0:  # a new stage: start from the previous stage's policy
            p = state.train.params
            state = StagedState(TrainState(state.train.step, p, optimizer.init(p)), jax.tree.map(jnp.copy, p))
        if stage.trainer == "sft":
            train, loss = _sft_update(state.train, _sft_arrays(sft_fn(i), "sft_fn"),
                                      vision_mask(state.train.params, train_vision=stage.train_vision),
                                      graphdef=graphdef, optimizer=optimizer, steps=config.num_inner_steps)
            nan = float("nan")
            return StagedState(train, state.ref_params), {
                "sft_loss": loss, "reward_mean": nan, "informative_groups": nan, "completion_length": nan,
                "stage_index": float(s), "stage_iteration": float(k)}
        rollout = sample_vlm_rollout(graphdef, state.train.params, prompt_fn(i), jax.random.fold_in(base_key, i),
                                     config=config, reward_fn=reward_fn)
        advantages = advantage_fn(rollout.rollout)
        train, metrics = vlm_update(state.train, rollout, advantages, graphdef=graphdef, optimizer=optimizer,
                                    config=config, ref_params=state.ref_params, train_vision=stage.train_vision)
        rewards = np.asarray(rollout.rollout.rewards)
        metrics = dict(metrics, reward_mean=float(rewards.mean()),
                       informative_groups=float((rewards.std(axis=1) > 0).mean()),
                       completion_length=float(np.asarray(rollout.rollout.mask).sum(1).mean()),
                       stage_index=float(s), stage_iteration=float(k))
        return StagedState(train, state.ref_params), metrics

    def meta(done: int) -> dict:
        s, k = schedule.locate(done - 1)
        return {"iteration": done, "stage": schedule.stages[s].name, "stage_index": s, "stage_iterations_done": k + 1}

    def row(done: int, m: dict) -> dict:
        s, k = schedule.locate(done - 1)
        return dict(m, iteration=done, stage=schedule.stages[s].name)

    out = run_loop(
        step_fn, state0, num_steps=schedule.total_iterations, stop_after=stop_after,
        checkpointer=None if workdir is None else Checkpointer(epath.Path(workdir) / "ckpt"),
        checkpoint_every=checkpoint_every, checkpoint_meta=meta, fingerprint=fp, log_every=log_every,
        row_fn=row, progress=progress, desc=desc,
        postfix=lambda r: {"stage": r["stage"], "reward": f"{r['reward_mean']:.3f}"})
    return StagedResult(graphdef, out.state, out.history, out.resumed_from)


# --- supervised warm-up and evaluation --------------------------------------------------------------


def _sft_loss(params, graphdef, batch):
    logits = nnx.merge(graphdef, params)(batch["inputs"], images=batch["images"]).logits
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], axis=-1)[..., 0]
    mask = batch["loss_mask"]
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer"), donate_argnums=(0,))
def _sft_step(state: TrainState, batch, *, graphdef, optimizer):
    loss, grads = jax.value_and_grad(_sft_loss)(state.params, graphdef, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), loss


def _sft_arrays(b: Mapping[str, np.ndarray], name: str = "batch_fn") -> dict:
    missing = [k for k in ("inputs", "targets", "loss_mask", "images") if k not in b]
    if missing:
        raise ValueError(f"{name}: expected keys inputs, targets, loss_mask, images; missing {missing}")
    return {"inputs": jnp.asarray(b["inputs"], jnp.int32), "targets": jnp.asarray(b["targets"], jnp.int32),
            "loss_mask": jnp.asarray(b["loss_mask"], jnp.float32), "images": jnp.asarray(b["images"], jnp.float32)}


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer", "steps"), donate_argnums=(0,))
def _sft_update(state: TrainState, batch, train_mask, *, graphdef, optimizer, steps):
    """`steps` supervised optimizer steps on one batch, updates masked by `train_mask`; (state, first loss)."""
    def one_step(state, _):
        loss, grads = jax.value_and_grad(_sft_loss)(state.params, graphdef, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        updates = jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, train_mask)
        return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), loss

    state, losses = jax.lax.scan(one_step, state, None, length=steps)
    return state, losses[0]


def vlm_sft(graphdef: nnx.GraphDef, params: Any, batch_fn: Callable[[int], Mapping[str, np.ndarray]], *,
            steps: int, optimizer: optax.GradientTransformation, progress: bool = True) -> tuple[Any, list[float]]:
    """Supervised next-token training of the VLM on image prompts (loss on completions only).

    Args:
      graphdef, params: the VLM (pure-dict params).
      batch_fn: `step -> {"inputs" [b, t-1], "targets" [b, t-1], "loss_mask" [b, t-1], "images"
        [b, n_img, H, W, c]}` (an `lm_batch` plus images), deterministic in the step.
      steps: optimizer steps (>= 0).
      optimizer: optax transformation.
      progress: tqdm bar.

    Returns:
      (params, per-step losses).
    """
    from tqdm.auto import tqdm

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps: expected an int >= 0, got {steps!r}")
    state, losses = grpo.init_state(params, optimizer), []
    for i in tqdm(range(steps), desc="vlm sft", disable=not progress, leave=False):
        batch = _sft_arrays(batch_fn(i))
        state, loss = _sft_step(state, batch, graphdef=graphdef, optimizer=optimizer)
        losses.append(loss)
    return state.params, [float(x) for x in jax.device_get(losses)]


def greedy_completions(graphdef: nnx.GraphDef, params: Any, prompts: VLMPromptBatch, *, max_new_tokens: int,
                       stop_tokens: tuple[int, ...] = (), pad_id: int = 0,
                       chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Greedy completions [B, N] and their lengths [B] (stop token included), in chunks of `chunk` rows."""
    tokens, lengths, images = _check_prompts(prompts)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk: expected an int >= 1, got {chunk!r}")
    outs, lens = [], []
    for s in range(0, tokens.shape[0], chunk):
        sl = slice(s, s + chunk)
        t, l, im = tokens[sl], lengths[sl], images[sl]
        pad = chunk - t.shape[0] if tokens.shape[0] > chunk else 0  # keep one compiled shape
        if pad:
            t, l, im = (np.concatenate([x, np.repeat(x[-1:], pad, axis=0)]) for x in (t, l, im))
        o = _sample(graphdef, params, t, l, im, None, sampler=Sampler(), max_new_tokens=max_new_tokens,
                    stop_tokens=tuple(stop_tokens), pad_id=pad_id)
        n = t.shape[0] - pad
        outs.append(np.asarray(o.tokens)[:n])
        lens.append(np.asarray(o.lengths)[:n])
    return np.concatenate(outs), np.concatenate(lens)
