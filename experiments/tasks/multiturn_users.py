"""Simulated users with latent intents and noisy feedback over token-sequence transformations (ROSA2).

A problem is a sequence x of ``length`` symbols (from ``num_symbols``) and a latent intent, one of
``intents`` (string transformations, `apply_intent`):

  * ``reverse``: x reversed;  * ``sort``: x sorted ascending;
  * ``shift``: every symbol + 1 (mod num_symbols);  * ``rotate``: x rotated left by one.

Token layout (one token per symbol): PAD 0, BOS 1, EOS 2, SEP 3, AMBIG 4 (the ambiguous instruction,
"transform this"), then one token per intent, then the symbols. A prompt is ``BOS instr x_1..x_L SEP``
and the answer the L output symbols (then EOS in training data).

The user's first instruction is AMBIG (every intent fits) with probability ``ambiguous_rate``, else the
intent's own token (`MultiTurnUsers.first_instructions`). After each answer y the user replies
(`MultiTurnUsers.feedback`):

  * ``correct`` if y equals the intent's output;
  * otherwise with probability ``hint_rate`` a hint naming an intent: the true one with probability
    1 - ``hint_noise``, else one of the other intents uniformly;
  * otherwise ``closer`` if y matches the target at more positions than the previous answer did (0 before
    the first answer) and ``wrong`` if not, the label flipped with probability ``closer_noise``.

Feedback randomness is drawn from ``numpy.random.default_rng([seed, turn])`` (n uniforms per draw), so a
turn's feedback is a function of (seed, turn, answers): a resumed interaction sees the same replies.

INFERRED (the paper uses MATH / MMLU / HumanEval with LLM users): the task family, the feedback kinds
and their noise model are ours, following the spec's CPU plan (section 5(d)).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from algorithms.alignment.rosa2 import CLOSER, CORRECT, HINT, WRONG

__all__ = ["INTENTS", "apply_intent", "MultiTurnUsers", "PAD", "BOS", "EOS", "SEP", "AMBIG"]

INTENTS = ("reverse", "sort", "shift", "rotate")
PAD, BOS, EOS, SEP, AMBIG = 0, 1, 2, 3, 4


def apply_intent(name: str, x: np.ndarray, num_symbols: int) -> np.ndarray:
    """The output of intent ``name`` on symbol sequences x [..., L] (values in [0, num_symbols))."""
    x = np.asarray(x)
    if name == "reverse":
        return x[..., ::-1].copy()
    if name == "sort":
        return np.sort(x, axis=-1)
    if name == "shift":
        return (x + 1) % num_symbols
    if name == "rotate":
        return np.roll(x, -1, axis=-1)
    raise ValueError(f"intent must be one of {INTENTS}; got {name!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiTurnUsers:
    """The task family and the simulated users.

    Attributes:
      num_symbols: symbol alphabet size (>= 2).
      length: L, symbols per sequence (>= 2).
      intents: the intent names (a subset of `INTENTS`, >= 2, distinct).
      ambiguous_rate: probability that the first instruction is the ambiguous one.
      hint_rate: probability that a failure's feedback is a hint.
      hint_noise: probability that a hint names a wrong intent.
      closer_noise: probability that "closer" / "wrong" is flipped.
      intent_probs: the users' intent distribution (None = uniform).
      seed: feedback seed.
    """

    num_symbols: int = 8
    length: int = 5
    intents: tuple[str, ...] = INTENTS
    ambiguous_rate: float = 0.5
    hint_rate: float = 0.3
    hint_noise: float = 0.2
    closer_noise: float = 0.1
    intent_probs: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        if not (isinstance(self.num_symbols, int) and self.num_symbols >= 2):
            raise ValueError(f"num_symbols must be an int >= 2; got {self.num_symbols!r}")
        if not (isinstance(self.length, int) and self.length >= 2):
            raise ValueError(f"length must be an int >= 2; got {self.length!r}")
        if len(self.intents) < 2 or len(set(self.intents)) != len(self.intents) or \
                any(i not in INTENTS for i in self.intents):
            raise ValueError(f"intents must be >= 2 distinct names from {INTENTS}; got {self.intents!r}")
        if not 0 <= self.ambiguous_rate <= 1:
            raise ValueError(f"ambiguous_rate must lie in [0, 1]; got {self.ambiguous_rate!r}")
        if not 0 <= self.hint_rate <= 1:
            raise ValueError(f"hint_rate must lie in [0, 1]; got {self.hint_rate!r}")
        for name in ("hint_noise", "closer_noise"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must lie in [0, 1); got {getattr(self, name)!r}")
        if self.intent_probs is not None:
            p = np.asarray(self.intent_probs, float)
            if p.shape != (len(self.intents),) or (p < 0).any() or not np.isclose(p.sum(), 1.0):
                raise ValueError(f"intent_probs must be {len(self.intents)} non-negative numbers summing to 1; "
                                 f"got {self.intent_probs!r}")

    # --- layout ---------------------------------------------------------------------------------------
    @property
    def num_intents(self) -> int:
        return len(self.intents)

    @property
    def symbol_offset(self) -> int:
        return AMBIG + 1 + self.num_intents

    @property
    def vocab_size(self) -> int:
        return self.symbol_offset + self.num_symbols

    @property
    def prompt_len(self) -> int:
        return self.length + 3

    def intent_token(self, intent: np.ndarray) -> np.ndarray:
        """Instruction tokens of intents [n] (-1 = the ambiguous instruction)."""
        intent = np.asarray(intent)
        if ((intent < -1) | (intent >= self.num_intents)).any():
            raise ValueError(f"intent must lie in [-1, {self.num_intents}); got {intent}")
        return np.where(intent < 0, AMBIG, AMBIG + 1 + intent).astype(np.int32)

    # --- problems ---------------------------------------------------------------------------------------
    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n problems: symbols x [n, L] and latent intents [n]."""
        if not (isinstance(n, (int, np.integer)) and n >= 1):
            raise ValueError(f"n must be an int >= 1; got {n!r}")
        x = rng.integers(0, self.num_symbols, (n, self.length))
        intent = rng.choice(self.num_intents, size=n, p=self.intent_probs)
        return x.astype(np.int32), intent.astype(np.int32)

    def first_instructions(self, intent: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The users' first instructions [n]: -1 (ambiguous) with probability ``ambiguous_rate``, else the intent."""
        intent = np.asarray(intent)
        if intent.ndim != 1 or ((intent < 0) | (intent >= self.num_intents)).any():
            raise ValueError(f"intent must be [n] ids in [0, {self.num_intents}); got {intent}")
        return np.where(rng.random(intent.shape[0]) < self.ambiguous_rate, -1, intent).astype(np.int32)

    def outputs(self, x: np.ndarray) -> np.ndarray:
        """Every intent's output as tokens [n, K, L] (the candidates a normaliser weighs)."""
        x = self._check_x(x)
        return np.stack([apply_intent(name, x, self.num_symbols) for name in self.intents], axis=1) \
            .astype(np.int32) + self.symbol_offset

    def targets(self, x: np.ndarray, intent: np.ndarray) -> np.ndarray:
        """The correct answer tokens [n, L] of problems (x, intent)."""
        out = self.outputs(x)
        intent = np.asarray(intent)
        if intent.shape != (out.shape[0],):
            raise ValueError(f"intent must be [n={out.shape[0]}]; got {intent.shape}")
        return out[np.arange(len(intent)), intent]

    def prompts(self, instruction: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Prompt tokens [n, L + 3]: BOS, instruction token (-1 = AMBIG), the symbols, SEP."""
        x = self._check_x(x)
        instr = self.intent_token(instruction)
        if instr.shape != (x.shape[0],):
            raise ValueError(f"instruction must be [n={x.shape[0]}]; got {instr.shape}")
        n = x.shape[0]
        return np.concatenate([np.full((n, 1), BOS), instr[:, None], x + self.symbol_offset,
                               np.full((n, 1), SEP)], axis=1).astype(np.int32)

    def train_batch(self, batch: int, rng: np.random.Generator, *, ambiguous_fraction: float,
                    intent_weights: Sequence[float] | None = None) -> dict[str, np.ndarray]:
        """A next-token batch (loss on the answer and EOS): explicit intent tokens, AMBIG on a fraction.

        ``intent_weights`` (K non-negative numbers) reweights which intents the training data shows
        (e.g. to leave one under-trained); None = the users' intent distribution.
        """
        if not 0 <= ambiguous_fraction <= 1:
            raise ValueError(f"ambiguous_fraction must lie in [0, 1]; got {ambiguous_fraction!r}")
        x, intent = self.sample(batch, rng)
        if intent_weights is not None:
            w = np.asarray(intent_weights, float)
            if w.shape != (self.num_intents,) or (w < 0).any() or w.sum() <= 0:
                raise ValueError(f"intent_weights must be {self.num_intents} non-negative numbers; got {intent_weights}")
            intent = rng.choice(self.num_intents, size=batch, p=w / w.sum()).astype(np.int32)
        instr = np.where(rng.random(batch) < ambiguous_fraction, -1, intent)
        seq = np.concatenate([self.prompts(instr, x), self.targets(x, intent), np.full((batch, 1), EOS)], axis=1)
        mask = np.zeros((batch, seq.shape[1] - 1), np.float32)
        mask[:, self.prompt_len - 1:] = 1.0
        return {"inputs": seq[:, :-1].astype(np.int32), "targets": seq[:, 1:].astype(np.int32), "loss_mask": mask}

    # --- the user -----------------------------------------------------------------------------------------
    def feedback(self, turn: int, answers: np.ndarray, targets: np.ndarray, intent: np.ndarray,
                 prev_match: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The users' replies to answers [n, L] (tokens): (kind [n], hint [n] (-1 unless HINT), match [n]).

        match = positions where the answer equals the target; kinds are `algorithms.alignment.rosa2`'s
        CORRECT / WRONG / CLOSER / HINT (see the module docstring for the rules and noise).
        """
        answers, targets = np.asarray(answers), np.asarray(targets)
        if answers.ndim != 2 or answers.shape != targets.shape or answers.shape[1] != self.length:
            raise ValueError(f"answers and targets must both be [n, L={self.length}]; got {answers.shape} and "
                             f"{targets.shape}")
        n = answers.shape[0]
        intent, prev_match = np.asarray(intent), np.asarray(prev_match)
        if intent.shape != (n,) or prev_match.shape != (n,):
            raise ValueError(f"intent and prev_match must be [n={n}]; got {intent.shape} and {prev_match.shape}")
        if not (isinstance(turn, (int, np.integer)) and turn >= 0):
            raise ValueError(f"turn must be an int >= 0; got {turn!r}")
        rng = np.random.default_rng([self.seed, int(turn)])
        u_hint, u_noise, u_other, u_flip = (rng.random(n) for _ in range(4))
        match = (answers == targets).sum(-1).astype(np.int32)
        correct = match == self.length
        K = self.num_intents
        is_hint = ~correct & (u_hint < self.hint_rate)
        other = (intent + 1 + np.minimum((u_other * (K - 1)).astype(int), K - 2)) % K  # uniform over the others
        named = np.where(u_noise < self.hint_noise, other, intent)
        closer = (match > prev_match) ^ (u_flip < self.closer_noise)
        kind = np.where(correct, CORRECT, np.where(is_hint, HINT, np.where(closer, CLOSER, WRONG)))
        return kind.astype(np.int32), np.where(is_hint, named, -1).astype(np.int32), match

    def user_fn(self, x: np.ndarray, intent: np.ndarray) -> Callable[[int, np.ndarray, np.ndarray], tuple]:
        """The ``user_fn`` of `algorithms.alignment.rosa2.co_adapt` for problems (x, intent)."""
        targets = self.targets(x, intent)
        return lambda turn, answers, prev_match: self.feedback(turn, answers, targets, intent, prev_match)

    def _check_x(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.length:
            raise ValueError(f"x must be [n, L={self.length}]; got shape {x.shape}")
        if ((x < 0) | (x >= self.num_symbols)).any():
            raise ValueError(f"x must hold symbols in [0, {self.num_symbols})")
        return x
