"""A two-style corpus for style steering: the same arithmetic answers written "formal" or "casual".

Built for the Style Modulation Heads reproduction (`experiments/style_heads.py`, spec
``rl_alignment_agents.md`` section 8 (d)): the content of every example is exact (a one-digit
addition and its sum), the style is carried only by marker words, and a style marker token in the
prompt says which style to answer in. The marker is withheld at test time, where a steered model
has to produce the style on its own.

Token format (word tokens, `WordTokenizer`; 48 ids with the defaults):

  * prompt: ``[marker] what is a plus b ?`` where the marker is ``<formal>``, ``<casual>`` or absent;
  * completion: ``opener the answer is n closer end`` (7 words). Every word but the number ``n = a +
    b`` has a formal and a casual variant (`STYLE_WORDS`): ``certainly the answer equals 7 regards .``
    vs ``yo da answr iz 7 lol !``; opener and closer are drawn from three words per style. The style
    is thus expressed at every response position, as a persona is, while the content stays exact.

Training mix: with probability ``marker_prob`` the example is marked and its style is uniform over
`STYLES`; otherwise it is unmarked and written in ``default_style`` (the "assistant" default that the
persona-vector setup steers away from). Test prompts are unmarked.

Scoring is exact and needs no judge: `classify_style` counts the style words of a generation (the
style with strictly more wins, else ``"none"``); `answer_correct` checks the first number word
against the sum; `well_formed` checks the template in one pure style.

Example:
    >>> corpus = StyleCorpus()
    >>> ex = corpus.sample(1, seed=0, marked=True, style="casual")[0]
    >>> ex.prompt.split()[0], classify_style(ex.completion.split())
    ('<casual>', 'casual')
    >>> answer_correct(ex.completion.split(), ex.answer), well_formed(ex.completion.split(), "casual")
    (True, True)
    >>> tok = corpus.tokenizer()
    >>> tok.decode(tok.encode(ex.completion)) == ex.completion
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from experiments.tasks.multihop import WordTokenizer
from experiments.tasks.tokenizer import lm_batch

__all__ = ["STYLES", "MARKERS", "STYLE_WORDS", "StyleExample", "StyleCorpus", "classify_style", "style_counts",
           "answer_correct", "first_number", "well_formed"]

STYLES = ("formal", "casual")
MARKERS = {"formal": "<formal>", "casual": "<casual>"}
SLOTS = ("opener", "the", "answer", "is", "closer", "end")
STYLE_WORDS = {
    "formal": {"opener": ("certainly", "indeed", "greetings"), "the": ("the",), "answer": ("answer",),
               "is": ("equals",), "closer": ("regards", "respectfully", "sincerely"), "end": (".",)},
    "casual": {"opener": ("yo", "hey", "dude"), "the": ("da",), "answer": ("answr",), "is": ("iz",),
               "closer": ("lol", "haha", "cheers"), "end": ("!",)},
}
_WORD_STYLE = {w: s for s, slots in STYLE_WORDS.items() for ws in slots.values() for w in ws}
_QUESTION = ("what", "is", "plus", "?")


class StyleExample(NamedTuple):
    """One example: prompt / completion text, its style, whether the prompt is marked, the content."""

    prompt: str
    completion: str
    style: str
    marked: bool
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b


def style_counts(words: Sequence[str]) -> dict[str, int]:
    """How many words of each style a word sequence holds."""
    counts = {s: 0 for s in STYLES}
    for w in words:
        s = _WORD_STYLE.get(w)
        if s is not None:
            counts[s] += 1
    return counts


def classify_style(words: Sequence[str]) -> str:
    """The style with strictly the most style words in ``words``; ``"none"`` on a tie (or none)."""
    counts = style_counts(words)
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    if ranked[0][1] == 0 or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return "none"
    return ranked[0][0]


def first_number(words: Sequence[str]) -> int | None:
    """The first word that is a non-negative integer, or None."""
    for w in words:
        if w.isdigit():
            return int(w)
    return None


def answer_correct(words: Sequence[str], answer: int) -> bool:
    """Whether the first number word of ``words`` equals ``answer`` (the task's exact accuracy)."""
    return first_number(words) == answer


def well_formed(words: Sequence[str], style: str | None = None) -> bool:
    """Whether ``words`` is the completion template with all four style slots from one style.

    Args:
      words: the generated words (without EOS).
      style: require this style; None accepts either pure style.
    """
    if style is not None and style not in STYLES:
        raise ValueError(f"style: expected one of {STYLES} or None, got {style!r}")
    words = list(words)
    if len(words) != 7 or not words[4].isdigit():
        return False
    slots = dict(zip(SLOTS, words[:4] + words[5:]))
    styles = (style,) if style is not None else STYLES
    return any(all(slots[k] in STYLE_WORDS[s][k] for k in SLOTS) for s in styles)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StyleCorpus:
    """The corpus generator (deterministic given its seeds; numpy only).

    Attributes:
      max_operand: operands are 0..max_operand (answers 0..2 * max_operand).
      marker_prob: probability that a training example carries a style marker.
      default_style: the style of unmarked examples.
      seed: base seed of the training stream.
    """

    max_operand: int = 9
    marker_prob: float = 0.5
    default_style: str = "formal"
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.max_operand, bool) or not isinstance(self.max_operand, int) or self.max_operand < 1:
            raise ValueError(f"max_operand: expected an int >= 1, got {self.max_operand!r}")
        if not 0.0 <= float(self.marker_prob) <= 1.0:
            raise ValueError(f"marker_prob: expected a probability in [0, 1], got {self.marker_prob}")
        if self.default_style not in STYLES:
            raise ValueError(f"default_style: expected one of {STYLES}, got {self.default_style!r}")

    def tokenizer(self) -> WordTokenizer:
        """The word tokenizer over markers, question words, numbers and style words."""
        numbers = [str(i) for i in range(2 * self.max_operand + 1)]
        style = [w for s in STYLES for slot in SLOTS for w in STYLE_WORDS[s][slot]]
        return WordTokenizer([MARKERS[s] for s in STYLES] + list(_QUESTION) + numbers + style)

    @property
    def max_seq_len(self) -> int:
        """Tokens of the longest example: BOS + marker + 6 question words + 7 answer words + EOS."""
        return 1 + 1 + 6 + 7 + 1

    def prompt(self, a: int, b: int, style: str | None = None) -> str:
        """The question ``what is a plus b ?``, preceded by ``style``'s marker unless None."""
        if style is not None and style not in STYLES:
            raise ValueError(f"style: expected one of {STYLES} or None, got {style!r}")
        q = f"what is {a} plus {b} ?"
        return q if style is None else f"{MARKERS[style]} {q}"

    def render(self, a: int, b: int, style: str, rng: np.random.Generator) -> str:
        """A completion for ``a + b`` in ``style``, slot words drawn uniformly with ``rng``."""
        if style not in STYLES:
            raise ValueError(f"style: expected one of {STYLES}, got {style!r}")
        w = {k: v[int(rng.integers(len(v)))] for k, v in STYLE_WORDS[style].items()}
        return f"{w['opener']} {w['the']} {w['answer']} {w['is']} {a + b} {w['closer']} {w['end']}"

    def sample(self, n: int, *, seed: int, marked: bool | None = None, style: str | None = None) -> list[StyleExample]:
        """``n`` examples from the stream seeded by ``(self.seed, seed)``.

        Args:
          n: number of examples (>= 0).
          seed: the stream's seed.
          marked: force marked (True) or unmarked (False) prompts; None draws with ``marker_prob``.
          style: force the style of marked examples; None draws uniformly. Unmarked examples are always
            written in ``default_style``.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {n!r}")
        if style is not None and style not in STYLES:
            raise ValueError(f"style: expected one of {STYLES} or None, got {style!r}")
        rng = np.random.default_rng([self.seed, int(seed)])
        out = []
        for _ in range(int(n)):
            a, b = (int(x) for x in rng.integers(0, self.max_operand + 1, size=2))
            is_marked = bool(rng.random() < self.marker_prob) if marked is None else bool(marked)
            s = (style or STYLES[int(rng.integers(len(STYLES)))]) if is_marked else self.default_style
            out.append(StyleExample(self.prompt(a, b, s if is_marked else None), self.render(a, b, s, rng), s,
                                    is_marked, a, b))
        return out

    def test_prompts(self, n: int, *, seed: int, style: str | None = None) -> tuple[list[str], np.ndarray]:
        """``n`` evaluation prompts (unmarked unless ``style`` is given) and their answers [n]."""
        rng = np.random.default_rng([self.seed, 1_000_003, int(seed)])
        ab = rng.integers(0, self.max_operand + 1, size=(int(n), 2))
        return [self.prompt(int(a), int(b), style) for a, b in ab], ab.sum(1).astype(np.int64)

    def train_batch(self, position: int, *, batch_size: int) -> dict[str, np.ndarray]:
        """The training batch at stream ``position`` (`lm_batch` layout: loss on completions)."""
        exs = self.sample(batch_size, seed=int(position))
        return lm_batch(self.tokenizer(), [e.prompt for e in exs], [e.completion for e in exs],
                        seq_len=self.max_seq_len)
