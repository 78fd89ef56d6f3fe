"""Sorting lists of small numbers, one token per number, with a hash-based train/test split.

A problem is a list of `length` numbers drawn uniformly with replacement from
[0, `num_values`); the answer is the list sorted in non-decreasing order. Each
number is one character of a private alphabet (number i is `chr(0x100 + i)`), so
the shared `CharTokenizer` (PAD, BOS, EOS, then the alphabet) gives one token
per number, and `=` ends the prompt. `decode_numbers` turns text back into ints.

Sorting is the second CPU task of the N-MARS plan: the next output depends on
the *content* already written (the smallest remaining number), not on its
position, so a model can notice a wrongly emitted number from what is left.

Held-out split: the problem (its numbers joined by commas) is hashed with
blake2b together with the seed; it is a test problem iff the hash, read as a
number in [0, 1), is below `test_fraction`.

Example:
    >>> task = SortingTask(length=4, num_values=10)
    >>> prompt = task.encode_numbers([3, 1, 3, 0]) + "="
    >>> task.decode_numbers(task.answer(prompt))
    [0, 1, 3, 3]
    >>> task.tokenizer().vocab_size
    14
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from experiments.tasks.tokenizer import CharTokenizer

__all__ = ["SortingTask"]

_BASE = 0x100
_SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class SortingTask:
    """Sort `length` numbers from [0, num_values).

    Attributes:
        length: numbers per list (>= 1).
        num_values: numbers are in [0, num_values) (2 to 1000).
        test_fraction: share of all problems held out for the test split.
        seed: fixes the split.
    """

    length: int = 8
    num_values: int = 50
    test_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length: expected an int >= 1, got {self.length!r}")
        if not isinstance(self.num_values, int) or not 2 <= self.num_values <= 1000:
            raise ValueError(f"num_values: expected an int in [2, 1000], got {self.num_values!r}")
        if not 0.0 <= self.test_fraction <= 1.0:
            raise ValueError(f"test_fraction: expected a value in [0, 1], got {self.test_fraction!r}")

    @property
    def alphabet(self) -> str:
        """One character per number, then `=`."""
        return "".join(chr(_BASE + i) for i in range(self.num_values)) + "="

    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer(self.alphabet)

    @property
    def answer_chars(self) -> str:
        """The characters an answer can use (the numbers)."""
        return self.alphabet[:-1]

    @property
    def prompt_len(self) -> int:
        """`[BOS] + numbers + "="`, in tokens."""
        return 1 + self.length + 1

    @property
    def answer_len(self) -> int:
        return self.length

    @property
    def max_seq_len(self) -> int:
        """`[BOS] + prompt + answer + [EOS]`, in tokens."""
        return self.prompt_len + self.length + 1

    def encode_numbers(self, numbers) -> str:
        """Numbers -> text (one character each)."""
        numbers = [int(x) for x in numbers]
        if any(not 0 <= x < self.num_values for x in numbers):
            raise ValueError(f"numbers: expected values in [0, {self.num_values}), got {numbers}")
        return "".join(chr(_BASE + x) for x in numbers)

    def decode_numbers(self, text: str) -> list[int]:
        """Text -> numbers (`=` and unknown characters raise)."""
        out = [ord(ch) - _BASE for ch in text]
        if any(not 0 <= x < self.num_values for x in out):
            raise ValueError(f"text: expected number characters only, got {text!r}")
        return out

    def answer(self, prompt: str) -> str:
        """The sorted list for `prompt` (numbers followed by "=")."""
        if not prompt.endswith("=") or len(prompt) != self.length + 1:
            raise ValueError(f"prompt: expected {self.length} number characters and '=', got {prompt!r}")
        return self.encode_numbers(sorted(self.decode_numbers(prompt[:-1])))

    def is_correct(self, prompt: str, completion: str) -> bool:
        return completion == self.answer(prompt)

    def split_of(self, prompt: str) -> str:
        return self._split(self.decode_numbers(prompt[:-1]))

    def sample(self, n: int, *, split: str, seed: int) -> tuple[list[str], list[str]]:
        """`n` problems of one split, deterministic in `(self.seed, seed)`: (prompts, answers)."""
        if split not in _SPLITS:
            raise ValueError(f"split: expected one of {_SPLITS}, got {split!r}")
        if (split == "test" and self.test_fraction == 0.0) or (split == "train" and self.test_fraction == 1.0):
            raise ValueError(f"split: the {split!r} split is empty with test_fraction={self.test_fraction}")
        rng = np.random.default_rng([self.seed, seed])
        prompts: list[str] = []
        drawn = 0
        while len(prompts) < n:
            for row in rng.integers(0, self.num_values, (max(16, 2 * (n - len(prompts))), self.length)).tolist():
                if len(prompts) < n and self._split(row) == split:
                    prompts.append(self.encode_numbers(row) + "=")
            drawn += 1
            if drawn > 10_000:
                raise RuntimeError(f"could not sample {n} {split!r} problems from {self}")
        return prompts, [self.answer(p) for p in prompts]

    def _split(self, numbers) -> str:
        key = ",".join(str(int(x)) for x in numbers)
        digest = hashlib.blake2b(f"{self.seed}|{key}".encode(), digest_size=8).digest()
        return "test" if int.from_bytes(digest, "big") / 2.0**64 < self.test_fraction else "train"
