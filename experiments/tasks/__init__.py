"""Synthetic and bundled tasks, generated in-process (nothing downloads).

  * `tokenizer`: `CharTokenizer` (PAD=0, BOS=1, EOS=2, then characters) and the
    shared batch layout, `lm_batch` (loss on completions only) and
    `prompt_batch` (for generation).
  * `arithmetic`: `ArithmeticTask`, `a op b=` problems with `+ - *`, optional
    reversed answers, hash-based disjoint train/test split.
  * `countdown`: `CountdownTask` / `CountdownProblem`, the CountDown numbers game
    with a safe exact verifier, a 0/1 reward and a brute-force solver.
  * `associative_recall`: `AssociativeRecallTask`, multi-query associative
    recall (MQAR) as token ids at any context length.
  * `digits`: `load_digits`, scikit-learn's bundled 8x8 digits as NHWC images.
  * `sorting`: `SortingTask`, sort a list of numbers (one token per number; N-MARS).
  * `multihop`: `MultiHopTask`, k-hop fact verification over a generated knowledge
    base with distractor evidence and its `WordTokenizer` (SCM-GRPO).
  * `moving_shapes`: generated videos and `patchify` / `unpatchify` (QVG); import the
    module (`from experiments.tasks import moving_shapes as ms`).
  * `record_recall`: `RecordRecallTask`, look a record up by its key and copy its value
    span over long contexts (Vegas); import the module.
  * `span_copy`: `SpanCopyTask`, distinct-token span copy (optionally laid out as records) for
    the constructed induction LM `models.induction` (Vegas, FFD); import the module.
  * `shapes`: generated 32x32 images of six shape classes (ToaSt's paper preset); import
    the module.
  * `calculus_work` (AI grading), `question_world` (CAMP), `safety_traces` (SafeThink),
    `style_corpus` (Style Modulation Heads), `text_envs` (EELMA: text gridworld and tool shop, graded
    agents), `light_fields` (E2I-VRWKV: layered scenes rendered to sub-aperture views), `floorplans`
    (PLMD: rooms, doors, objects, ray-cast observations), `floorplan_nav` (PLMD's goal-search agent on
    those maps: A*, frontier exploration, completion-guided goals, success and SPL), `multiturn_users` (ROSA2: simulated users),
    `scenes` (images, audio-like signals and exact-answer questions for the small VLM): import the
    modules.

Every generator is numpy-only and deterministic given its seeds.
"""

from experiments.tasks.arithmetic import ArithmeticTask
from experiments.tasks.associative_recall import AssociativeRecallTask
from experiments.tasks.countdown import CountdownProblem, CountdownTask
from experiments.tasks.digits import load_digits
from experiments.tasks.multihop import MultiHopTask, WordTokenizer
from experiments.tasks.sorting import SortingTask
from experiments.tasks.tokenizer import CharTokenizer, lm_batch, prompt_batch

__all__ = [
    "ArithmeticTask",
    "AssociativeRecallTask",
    "CharTokenizer",
    "CountdownProblem",
    "CountdownTask",
    "MultiHopTask",
    "SortingTask",
    "WordTokenizer",
    "lm_batch",
    "load_digits",
    "prompt_batch",
]
