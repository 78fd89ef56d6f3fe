"""Scenes of shapes rendered to small images, aligned "audio" tones, and questions with exact answers.

The synthetic multimodal task behind the VLM experiments (spec
/work/shared/papers/specs/rl_alignment_agents.md, section 9 (d) Hyper-ICL: interleaved image-text
in-context learning; section 10 (d) staged perception: perception questions, visual reasoning that
needs perception plus arithmetic, and a text "caption" that states what the image shows).

A scene is a `grid x grid` board; each object sits in its own cell and has a shape (square, disc,
cross), a colour (red, green, blue) and a size (small: radius 2, large: radius 3), and may *sound*.

  * Image [H, W, channels] float32 in [0, 1], H = W = image_size (default 24, grid 3: 8-pixel
    cells). With 3 channels a colour is one channel at full intensity; with 1 channel (grey) the
    colour is an intensity (red 0.4, green 0.7, blue 1.0). Objects are centred in their cell, with a
    seeded jitter of at most one pixel, and never overlap. Optional Gaussian pixel noise.
  * Audio [grid * grid, slot_len] float32: one frame (time slot) per cell in row-major (reading)
    order, i.e. a left-to-right, top-to-bottom scan of the board: the frame of a sounding object
    holds a Hann-windowed tone whose frequency names its colour (red 2, green 4, blue 6 cycles per
    frame); every other frame is silent (plus optional noise). The tones are aligned to the visual
    events: frame k is cell k.
  * Questions (kinds), all answered by exact counting over the object list:
      count         "count <colour|any> <shape|any> ?"                 -> a digit
      compare       "compare <colour> <colour> ?"  (which is more?)     -> a colour or "same"
      compose       "count <size> <colour> in row <r> ?"                -> a digit
      audio_visual  "count sounding <colour|any> ?"  (needs both: which cells sound, their colour)
                                                                        -> a digit
      caption       (text only; section 10's "caption" view) `caption(scene)` lists every object
                    as "<colour> <size> <shape> r<row> c<col> [sounds] ;".
  * Prompts interleave modality placeholders with text: "<image> x P  <audio> x S  question"
    (`make_batch`), where `<image>`/`<audio>` are tokenizer symbols that `models.vlm.VLM` replaces,
    in order, by the image's patch embeddings and the audio's frame embeddings. P and S are given
    by the model (e.g. `VLM.num_image_tokens`).

Tokenized with `experiments.tasks.multihop.WordTokenizer` (PAD 0, BOS 1, EOS 2); batches follow
`experiments.tasks.tokenizer.lm_batch` (loss on the answer and EOS only).

[INFER] The spec asks only for "a tiny conv encoder on 16x16 arrays" or grid cells; shapes,
colours, audio tones and question templates here are this library's choices.

Example:
    >>> rng = np.random.default_rng(0)
    >>> scene = sample_scene(rng, grid=3, max_objects=4)
    >>> render_image(scene).shape, render_audio(scene).shape
    ((24, 24, 3), (9, 16))
    >>> q = Question("count", colour="any", shape="any")
    >>> answer(scene, q) == str(len(scene.objects))
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from experiments.tasks.multihop import WordTokenizer
from experiments.tasks.tokenizer import lm_batch

__all__ = [
    "SHAPES", "COLOURS", "SIZES", "KINDS", "IMAGE_TOKEN", "AUDIO_TOKEN",
    "SceneObject", "Scene", "Question",
    "sample_scene", "render_image", "render_audio", "answer", "question_text", "sample_question",
    "caption", "make_tokenizer", "make_batch",
]

SHAPES = ("square", "disc", "cross")
COLOURS = ("red", "green", "blue")
SIZES = ("small", "large")
KINDS = ("count", "compare", "compose", "audio_visual")
IMAGE_TOKEN = "<image>"
AUDIO_TOKEN = "<audio>"
RADIUS = {"small": 2, "large": 3}
GREY = {"red": 0.4, "green": 0.7, "blue": 1.0}
CYCLES = {"red": 2, "green": 4, "blue": 6}
MAX_GRID = 5


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One object: attributes and its cell (row, col)."""

    shape: str
    colour: str
    size: str
    row: int
    col: int
    sounds: bool = False

    def __post_init__(self):
        for name, value, allowed in (("shape", self.shape, SHAPES), ("colour", self.colour, COLOURS),
                                     ("size", self.size, SIZES)):
            if value not in allowed:
                raise ValueError(f"SceneObject.{name}: expected one of {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Scene:
    """Objects on a grid x grid board (at most one per cell); `jitter`: per object a (dy, dx) in {0, 1}."""

    objects: tuple[SceneObject, ...]
    grid: int = 3
    jitter: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self):
        if not isinstance(self.grid, int) or not 1 <= self.grid <= MAX_GRID:
            raise ValueError(f"Scene.grid: expected an int in [1, {MAX_GRID}], got {self.grid!r}")
        cells = [(o.row, o.col) for o in self.objects]
        for o in self.objects:
            if not (0 <= o.row < self.grid and 0 <= o.col < self.grid):
                raise ValueError(f"Scene.objects: cell ({o.row}, {o.col}) outside the {self.grid}x{self.grid} grid")
        if len(set(cells)) != len(cells):
            raise ValueError(f"Scene.objects: expected at most one object per cell, got cells {cells}")
        if self.jitter is not None and len(self.jitter) != len(self.objects):
            raise ValueError(f"Scene.jitter: expected one offset per object ({len(self.objects)}), "
                             f"got {len(self.jitter)}")


@dataclasses.dataclass(frozen=True)
class Question:
    """A structured question; `question_text` renders it, `answer` answers it exactly.

    Fields used per kind: count (colour, shape: a value or "any"), compare (colour, other),
    compose (size, colour, row), audio_visual (colour or "any").
    """

    kind: str
    colour: str = "any"
    shape: str = "any"
    size: str = "any"
    row: int = 0
    other: str = "any"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Question.kind: expected one of {KINDS}, got {self.kind!r}")
        for name, value, allowed in (("colour", self.colour, COLOURS), ("shape", self.shape, SHAPES),
                                     ("size", self.size, SIZES), ("other", self.other, COLOURS)):
            if value != "any" and value not in allowed:
                raise ValueError(f"Question.{name}: expected 'any' or one of {allowed}, got {value!r}")
        if self.kind == "compare" and (self.colour == "any" or self.other == "any" or self.colour == self.other):
            raise ValueError(f"Question: compare needs two different colours, got {self.colour!r} and {self.other!r}")
        if self.kind == "compose" and (self.size == "any" or self.colour == "any"):
            raise ValueError(f"Question: compose needs a size and a colour, got {self.size!r}, {self.colour!r}")


def _check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: expected an int {rng}, got {value!r}")
    return int(value)


def sample_scene(rng: np.random.Generator, *, grid: int = 3, min_objects: int = 1, max_objects: int = 5,
                 sound_prob: float = 0.5) -> Scene:
    """A random scene: `n ~ U{min_objects..max_objects}` objects in distinct random cells, uniform attributes.

    Raises:
        ValueError: for a grid outside [1, 5], object counts outside [0, grid^2] or min > max, or
            sound_prob outside [0, 1].
    """
    grid = _check_int("grid", grid, 1, MAX_GRID)
    min_objects = _check_int("min_objects", min_objects, 0, grid * grid)
    max_objects = _check_int("max_objects", max_objects, min_objects, grid * grid)
    if not 0.0 <= float(sound_prob) <= 1.0:
        raise ValueError(f"sound_prob: expected a probability in [0, 1], got {sound_prob!r}")
    n = int(rng.integers(min_objects, max_objects + 1))
    cells = rng.permutation(grid * grid)[:n]
    objects, jitter = [], []
    for cell in sorted(cells.tolist()):
        objects.append(SceneObject(shape=SHAPES[rng.integers(len(SHAPES))], colour=COLOURS[rng.integers(len(COLOURS))],
                                   size=SIZES[rng.integers(len(SIZES))], row=cell // grid, col=cell % grid,
                                   sounds=bool(rng.random() < sound_prob)))
        jitter.append((int(rng.integers(2)), int(rng.integers(2))))
    return Scene(tuple(objects), grid=grid, jitter=tuple(jitter))


def _mask(shape: str, r: int) -> np.ndarray:
    """[2r+1, 2r+1] bool footprint of a shape of radius r."""
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    if shape == "square":
        return np.ones_like(yy, bool)
    if shape == "disc":
        return yy ** 2 + xx ** 2 <= r * r
    return (yy == 0) | (xx == 0)  # cross


def render_image(scene: Scene, *, image_size: int = 24, channels: int = 3, noise: float = 0.0,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """Renders the scene to [image_size, image_size, channels] float32 in [0, 1].

    Raises:
        ValueError: if channels is not 1 or 3, if a cell (image_size // grid) is smaller than 8
            pixels (a large shape plus jitter needs 8), or noise < 0 (noise > 0 needs `rng`).
    """
    if channels not in (1, 3):
        raise ValueError(f"channels: expected 1 or 3, got {channels!r}")
    image_size = _check_int("image_size", image_size, 1)
    cell = image_size // scene.grid
    if cell < 2 * RADIUS["large"] + 2:
        raise ValueError(f"image_size: expected >= {(2 * RADIUS['large'] + 2) * scene.grid} for a "
                         f"{scene.grid}x{scene.grid} grid (8-pixel cells), got {image_size}")
    img = np.zeros((image_size, image_size, channels), np.float32)
    jitter = scene.jitter or ((0, 0),) * len(scene.objects)
    for o, (dy, dx) in zip(scene.objects, jitter):
        r = RADIUS[o.size]
        m = _mask(o.shape, r)
        top = o.row * cell + (cell - (2 * r + 2)) // 2 + dy
        left = o.col * cell + (cell - (2 * r + 2)) // 2 + dx
        patch = img[top:top + 2 * r + 1, left:left + 2 * r + 1]
        if channels == 3:
            patch[m, COLOURS.index(o.colour)] = 1.0
        else:
            patch[m, 0] = GREY[o.colour]
    return _add_noise(img, noise, rng)


def _add_noise(x: np.ndarray, noise: float, rng: np.random.Generator | None) -> np.ndarray:
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"noise: expected a finite float >= 0, got {noise!r}")
    if noise > 0:
        if rng is None:
            raise ValueError("rng: a numpy Generator is required when noise > 0")
        x = x + rng.normal(scale=noise, size=x.shape).astype(np.float32)
    return x


def render_audio(scene: Scene, *, slot_len: int = 16, noise: float = 0.0,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """The scene's audio as frames [grid * grid, slot_len] float32 (see the module docstring).

    Raises:
        ValueError: if slot_len < 2 * 6 + 2 = 14 (the blue tone needs 6 cycles per frame, under
            Nyquist) or noise < 0.
    """
    slot_len = _check_int("slot_len", slot_len, 2 * max(CYCLES.values()) + 2)
    frames = np.zeros((scene.grid * scene.grid, slot_len), np.float32)
    t = np.arange(slot_len)
    window = np.sin(np.pi * (t + 0.5) / slot_len) ** 2
    for o in scene.objects:
        if o.sounds:
            frames[o.row * scene.grid + o.col] = window * np.sin(2 * np.pi * CYCLES[o.colour] * t / slot_len)
    return _add_noise(frames, noise, rng)


def _matches(o: SceneObject, q: Question) -> bool:
    return ((q.colour == "any" or o.colour == q.colour) and (q.shape == "any" or o.shape == q.shape)
            and (q.size == "any" or o.size == q.size))


def answer(scene: Scene, q: Question) -> str:
    """The exact answer (a digit, a colour, or "same") of `q` about `scene`."""
    if q.kind == "count":
        return str(sum(_matches(o, q) for o in scene.objects))
    if q.kind == "compose":
        return str(sum(_matches(o, q) and o.row == q.row for o in scene.objects))
    if q.kind == "audio_visual":
        return str(sum(o.sounds and (q.colour == "any" or o.colour == q.colour) for o in scene.objects))
    a = sum(o.colour == q.colour for o in scene.objects)
    b = sum(o.colour == q.other for o in scene.objects)
    return q.colour if a > b else q.other if b > a else "same"


def question_text(q: Question) -> str:
    """The question as words of `make_tokenizer()`'s vocabulary."""
    if q.kind == "count":
        return f"count {q.colour} {q.shape} ?"
    if q.kind == "compare":
        return f"compare {q.colour} {q.other} ?"
    if q.kind == "compose":
        return f"count {q.size} {q.colour} in row r{q.row} ?"
    return f"count sounding {q.colour} ?"


def sample_question(rng: np.random.Generator, scene: Scene, kind: str) -> Question:
    """A random question of `kind` about `scene` (uniform over its template's slots)."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    if kind == "count":
        return Question("count", colour=pick(COLOURS + ("any",)), shape=pick(SHAPES + ("any",)))
    if kind == "compare":
        a, b = rng.choice(len(COLOURS), 2, replace=False)
        return Question("compare", colour=COLOURS[a], other=COLOURS[b])
    if kind == "compose":
        return Question("compose", size=pick(SIZES), colour=pick(COLOURS), row=int(rng.integers(scene.grid)))
    return Question("audio_visual", colour=pick(COLOURS + ("any",)))


def caption(scene: Scene) -> str:
    """The scene as text: "<colour> <size> <shape> r<row> c<col> [sounds] ;" per object, in reading order."""
    return " ".join(f"{o.colour} {o.size} {o.shape} r{o.row} c{o.col}" + (" sounds" if o.sounds else "") + " ;"
                    for o in scene.objects)


def make_tokenizer(grid: int = 3) -> WordTokenizer:
    """The word vocabulary of prompts, captions and answers (placeholders `<image>`, `<audio>` included)."""
    grid = _check_int("grid", grid, 1, MAX_GRID)
    words = ([IMAGE_TOKEN, AUDIO_TOKEN, "count", "compare", "sounding", "sounds", "in", "row", "any", "same",
              "?", ";", "caption", "answer"] + list(COLOURS) + list(SHAPES) + list(SIZES)
             + [str(i) for i in range(grid * grid + 1)] + [f"r{i}" for i in range(grid)]
             + [f"c{i}" for i in range(grid)])
    return WordTokenizer(words)


def make_batch(n: int, *, seed: int, image_tokens: int, audio_tokens: int = 0, kinds: Sequence[str] = KINDS,
               grid: int = 3, image_size: int = 24, channels: int = 3, slot_len: int = 16, seq_len: int | None = None,
               max_objects: int = 5, noise: float = 0.0, with_caption: bool = False) -> dict:
    """n examples: scene images/audio and `lm_batch` token arrays for "<image>*P <audio>*S question" -> answer.

    Kinds cycle through `kinds` (example i has kind kinds[i % len(kinds)]).

    Args:
        n: examples (>= 1).
        seed: numpy seed (deterministic).
        image_tokens: P, placeholders for the image (the VLM's patch count); 0 leaves the image out.
        audio_tokens: S, placeholders for the audio (grid^2 frames, or 0 to leave the audio out).
        kinds: question kinds.
        grid, image_size, channels, slot_len, max_objects, noise: scene and rendering options.
        seq_len: padded length of `tokens` (default: the longest example).
        with_caption: put the caption text before the question (section 10's text view).

    Returns:
        dict with `images` [n, H, W, channels], `audio` [n, grid^2, slot_len] (float32), the
        `lm_batch` arrays (`tokens`, `inputs`, `targets`, `loss_mask`, `prompt_lengths`), `answers`
        (list of str), `questions` (list of Question) and `scenes` (list of Scene).

    Raises:
        ValueError: naming the argument for bad counts, kinds or an audio_tokens other than 0 or grid^2.
    """
    n = _check_int("n", n, 1)
    image_tokens = _check_int("image_tokens", image_tokens, 0)
    audio_tokens = _check_int("audio_tokens", audio_tokens, 0)
    grid = _check_int("grid", grid, 1, MAX_GRID)
    if audio_tokens not in (0, grid * grid):
        raise ValueError(f"audio_tokens: expected 0 or grid^2 = {grid * grid} (one per frame), got {audio_tokens}")
    kinds = tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds: expected a non-empty subset of {KINDS}, got {kinds!r}")
    if "audio_visual" in kinds and audio_tokens == 0:
        raise ValueError("audio_tokens: audio_visual questions need the audio (audio_tokens = grid^2), got 0")
    rng = np.random.default_rng(seed)
    tok = make_tokenizer(grid)
    scenes, questions, prompts, answers, images, audio = [], [], [], [], [], []
    for i in range(n):
        scene = sample_scene(rng, grid=grid, max_objects=max_objects)
        q = sample_question(rng, scene, kinds[i % len(kinds)])
        parts = [IMAGE_TOKEN] * image_tokens + [AUDIO_TOKEN] * audio_tokens
        if with_caption:
            parts.append(caption(scene))
        parts.append(question_text(q))
        scenes.append(scene)
        questions.append(q)
        prompts.append(" ".join(parts))
        answers.append(answer(scene, q))
        images.append(render_image(scene, image_size=image_size, channels=channels, noise=noise, rng=rng))
        audio.append(render_audio(scene, slot_len=slot_len, noise=noise, rng=rng))
    if seq_len is None:
        seq_len = max(len(tok.encode(p)) + len(tok.encode(a)) + 2 for p, a in zip(prompts, answers))
    batch = lm_batch(tok, prompts, answers, seq_len=seq_len)
    batch.update(images=np.stack(images), audio=np.stack(audio), answers=answers, questions=questions,
                 scenes=scenes)
    return batch
