"""Integer arithmetic problems as text, with a train/test split fixed by hashing.

A problem is `a op b` with non-negative operands of 1..`num_digits` digits and
`op` in `+`, `-`, `*`. The prompt is `"123+45="`, the answer `"168"`; negative
results of `-` carry a leading minus (`"3-45="` -> `"-42"`). With
`reverse_answer` the answer's digits are written least significant first
(`"168"` -> `"861"`, `"-42"` -> `"-24"`: the sign stays in front), which makes
the carry available when a left-to-right model needs it and is known to help
tiny transformers learn addition (Lee et al., "Teaching Arithmetic to Small
Transformers", arXiv:2307.03381, 2023).

Operands: first a digit count uniform in 1..`num_digits`, then a number
uniform among those with that many digits (one-digit numbers include 0), so
short operands are as frequent as long ones.

Held-out split: the problem string `"a op b"` is hashed with blake2b together
with the seed; it is a test problem iff the hash, read as a number in [0, 1),
is below `test_fraction`. Train and test problems are therefore disjoint by
construction, whatever is sampled, and the split does not depend on Python's
per-process `hash()` salt.

The alphabet is the same for every configuration (`"0123456789+-*="`), so
checkpoints are interchangeable between operation sets.

Example:
    >>> task = ArithmeticTask(num_digits=2, seed=0)
    >>> task.answer("57+68=")
    '125'
    >>> ArithmeticTask(operations=("-",), reverse_answer=True).answer("3-45=")
    '-24'
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np

from experiments.tasks.tokenizer import CharTokenizer, lm_batch

__all__ = ["ArithmeticTask"]

_OPERATIONS = ("+", "-", "*")
_ALPHABET = "0123456789+-*="
_PROMPT_RE = re.compile(r"(\d+)([+\-*])(\d+)=")
_SPLITS = ("train", "test")
# int64 holds 18-digit operands; products are computed with Python ints.
_MAX_DIGITS = 18


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """Integer arithmetic as prompt/answer strings.

    Attributes:
        num_digits: operands have 1..num_digits digits.
        operations: the operations to sample, each of "+", "-", "*".
        reverse_answer: write the answer's digits least significant first.
        pad_operands: zero-pad operands to `num_digits` digits and answers to
            their widest length (`+`: n+1 digits, `-`: n digits after the
            sign, `*`: 2n), so every digit sits at a fixed position; the
            "fixed-width" format of Lee et al. (2023). The split is by value,
            so it is the same with and without padding.
        test_fraction: the fraction of all problems held out for the test split.
        seed: fixes the split and the sampled data.
    """

    num_digits: int = 3
    operations: tuple[str, ...] = ("+",)
    reverse_answer: bool = False
    pad_operands: bool = False
    test_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.num_digits, int) or not 1 <= self.num_digits <= _MAX_DIGITS:
            raise ValueError(
                f"num_digits: expected an int in [1, {_MAX_DIGITS}], got {self.num_digits!r}"
            )
        ops = tuple(self.operations) if not isinstance(self.operations, str) else None
        if (
            not ops
            or any(op not in _OPERATIONS for op in ops)
            or len(set(ops)) != len(ops)
        ):
            raise ValueError(
                f"operations: expected a non-empty tuple of distinct symbols from "
                f"{_OPERATIONS}, got {self.operations!r}"
            )
        object.__setattr__(self, "operations", ops)
        if not 0.0 <= self.test_fraction <= 1.0:
            raise ValueError(f"test_fraction: expected a value in [0, 1], got {self.test_fraction!r}")

    @property
    def alphabet(self) -> str:
        """The characters of prompts and answers: digits, `+-*` and `=`."""
        return _ALPHABET

    def tokenizer(self) -> CharTokenizer:
        """The character tokenizer for this task."""
        return CharTokenizer(self.alphabet)

    @property
    def max_seq_len(self) -> int:
        """The longest `[BOS] + prompt + answer + [EOS]`, in tokens."""
        n = self.num_digits
        answer_len = {"+": n + 1, "-": n + 1, "*": 2 * n}  # "-": sign + n digits
        return 1 + (2 * n + 2) + max(answer_len[op] for op in self.operations) + 1

    def split_of(self, prompt: str) -> str:
        """Returns "test" if the problem in `prompt` is held out, else "train"."""
        a, op, b = _parse(prompt)
        return self._split(f"{a}{op}{b}")

    def answer(self, prompt: str) -> str:
        """The exact answer to `prompt` (e.g. "123+45="), in this task's format.

        Raises:
            ValueError: if `prompt` is not of the form "<digits><op><digits>=".
        """
        a, op, b = _parse(prompt)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        digits = str(abs(value))
        if self.pad_operands:
            digits = digits.zfill(self._answer_digits(op))
        if self.reverse_answer:
            digits = digits[::-1]
        return ("-" if value < 0 else "") + digits

    def _answer_digits(self, op: str) -> int:
        n = self.num_digits
        return {"+": n + 1, "-": n, "*": 2 * n}[op]

    def is_correct(self, prompt: str, completion: str) -> bool:
        """Whether `completion` (surrounding whitespace ignored) is the exact answer."""
        return completion.strip() == self.answer(prompt)

    def sample(self, n: int, *, split: str, seed: int) -> tuple[list[str], list[str]]:
        """Samples `n` problems of one split.

        Problems are drawn with replacement (rejection-sampled until they belong
        to `split`). The draw is deterministic in `(self.seed, seed)`.

        Args:
            n: number of problems.
            split: "train" or "test".
            seed: selects the draw.

        Returns:
            `(prompts, answers)`, two lists of `n` strings.

        Raises:
            ValueError: if `split` is unknown, or empty because `test_fraction` is
                0 (for "test") or 1 (for "train").
        """
        return self._sample(n, split, np.random.default_rng([self.seed, seed]))

    def train_batch(self, step: int, *, batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
        """The training batch of `step`, an `lm_batch` of train problems.

        Deterministic in `(self.seed, step)` (it equals
        `lm_batch(tokenizer, *sample(batch_size, split="train", seed=step), ...)`),
        so a resumed run sees the same data at the same step.

        Args:
            step: the training step.
            batch_size: b.
            seq_len: t, at least `max_seq_len` is always enough.

        Returns:
            The dict of `lm_batch`.
        """
        prompts, answers = self.sample(batch_size, split="train", seed=step)
        return lm_batch(self.tokenizer(), prompts, answers, seq_len=seq_len)

    def _split(self, problem: str) -> str:
        digest = hashlib.blake2b(f"{self.seed}|{problem}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2.0**64
        return "test" if u < self.test_fraction else "train"

    def _sample(self, n: int, split: str, rng: np.random.Generator) -> tuple[list[str], list[str]]:
        if split not in _SPLITS:
            raise ValueError(f"split: expected one of {_SPLITS}, got {split!r}")
        if (split == "test" and self.test_fraction == 0.0) or (
            split == "train" and self.test_fraction == 1.0
        ):
            raise ValueError(
                f"split: the {split!r} split is empty with test_fraction={self.test_fraction}"
            )
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {n!r}")
        low = np.array([0] + [10 ** (k - 1) for k in range(2, self.num_digits + 1)], np.int64)
        high = np.array([10**k for k in range(1, self.num_digits + 1)], np.int64)
        prompts: list[str] = []
        drawn = 0
        while len(prompts) < n:
            m = max(16, 2 * (n - len(prompts)))
            la = rng.integers(0, self.num_digits, m)
            lb = rng.integers(0, self.num_digits, m)
            a = rng.integers(low[la], high[la])
            b = rng.integers(low[lb], high[lb])
            ops = rng.integers(0, len(self.operations), m)
            for ai, opi, bi in zip(a.tolist(), ops.tolist(), b.tolist()):
                op = self.operations[opi]
                if self._split(f"{ai}{op}{bi}") == split and len(prompts) < n:
                    if self.pad_operands:
                        ai, bi = str(ai).zfill(self.num_digits), str(bi).zfill(self.num_digits)
                    prompts.append(f"{ai}{op}{bi}=")
            drawn += m
            if drawn > 1000 * n + 100_000:
                raise RuntimeError(f"could not sample {n} {split!r} problems from {self}")
        return prompts, [self.answer(p) for p in prompts]


def _parse(prompt: str) -> tuple[int, str, int]:
    match = _PROMPT_RE.fullmatch(prompt)
    if match is None:
        raise ValueError(f"prompt: expected '<digits><op><digits>=' with op in +-*, got {prompt!r}")
    return int(match.group(1)), match.group(2), int(match.group(3))
