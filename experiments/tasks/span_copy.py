"""Span copy over distinct tokens: ``BOS items.. QUERY x`` -> the tokens that followed ``x`` (Vegas, FFD).

The long-context workload of the constructed induction LM (`models.induction`). Every item token
occurs at most once in a context, so each answer token has exactly one source: after ``QUERY x`` the
answer is the ``answer_len`` items that followed ``x``, and each decode step's attention must land on
one key one step further along the context than the last.

``record_size = R > 0`` arranges the context as records: the items are whole record blocks (record
``r`` = token ids ``NUM_SPECIAL + r R .. + R - 1``, shuffled inside the record, records in random
order, the last one cut at the context end) and ``x`` is the first token of a record, so the answer
walks through that record and on into the next ones. The record LM's record head then attends to
the whole queried record for as long as the copy stays in it: attention that persists across
decode steps.

Token ids: 0 PAD, 1 BOS, 2 QUERY, 3 spare, items from 4 (`models.induction`'s layout).

Example:
    >>> task = SpanCopyTask(vocab_size=512)
    >>> p = task.prompts(0, batch_size=2, context_len=100, answer_len=5)
    >>> p["prompts"].shape, p["answers"].shape, bool((p["prompts"][:, -2] == 2).all())
    ((2, 100), (2, 5), True)
    >>> row = p["prompts"][0]; j = int(p["source"][0])
    >>> bool((row[j + 1:j + 6] == p["answers"][0]).all()) and bool(row[j] == row[-1])
    True
"""

from __future__ import annotations

import dataclasses

import numpy as np

from models.induction import BOS, NUM_SPECIAL, QUERY

__all__ = ["SpanCopyTask"]


@dataclasses.dataclass(frozen=True)
class SpanCopyTask:
    """Distinct-token span copy; see the module docstring.

    Attributes:
      vocab_size: the LM's vocabulary (items are ``NUM_SPECIAL .. vocab_size - 1``).
      record_size: R > 0 lays the context out as records of R tokens; 0 = items in random order.
      seed: fixes the data (``index`` picks a batch).
    """

    vocab_size: int = 16384
    record_size: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.vocab_size <= NUM_SPECIAL + 1:
            raise ValueError(f"vocab_size must be > {NUM_SPECIAL + 1}; got {self.vocab_size}")
        if self.record_size < 0:
            raise ValueError(f"record_size must be >= 0; got {self.record_size}")

    @property
    def num_items(self) -> int:
        return self.vocab_size - NUM_SPECIAL

    def prompts(self, index: int, *, batch_size: int, context_len: int, answer_len: int) -> dict[str, np.ndarray]:
        """Decoding prompts and their answers.

        Returns:
          dict with ``prompts`` [b, P] int32 (``P = context_len``: BOS, ``P - 3`` items, QUERY, x),
          ``answers`` [b, A] int32 and ``source`` [b] int32, the prompt position of x's earlier
          occurrence (the answer is ``prompts[source + 1 : source + 1 + A]``).
        """
        n = context_len - 3
        if answer_len < 1 or n < answer_len + 2:
            raise ValueError(f"context_len={context_len} must leave room for answer_len={answer_len} "
                             f"(context_len >= answer_len + 5, answer_len >= 1)")
        if n > self.num_items:
            raise ValueError(f"context_len={context_len} needs {n} distinct items; vocab_size={self.vocab_size} "
                             f"has {self.num_items}")
        rng = np.random.default_rng([self.seed, index])
        prompts = np.empty((batch_size, context_len), np.int32)
        answers = np.empty((batch_size, answer_len), np.int32)
        source = np.empty((batch_size,), np.int32)
        for row in range(batch_size):
            items, starts = self._items(rng, n)
            starts = starts[starts + answer_len < n]
            j = int(rng.choice(starts))
            prompts[row] = np.concatenate([[BOS], items, [QUERY, items[j]]])
            answers[row] = items[j + 1:j + 1 + answer_len]
            source[row] = j + 1              # BOS shifts item i to prompt position i + 1
        return {"prompts": prompts, "answers": answers, "source": source}

    def _items(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n distinct items and the item indices a query may start from."""
        if not self.record_size:
            return rng.choice(self.num_items, n, replace=False) + NUM_SPECIAL, np.arange(n)
        R = self.record_size
        n_blocks = self.num_items // R
        need = -(-n // R)
        if need > n_blocks:
            raise ValueError(f"{n} items in records of {R} need {need} records; vocab_size={self.vocab_size} "
                             f"has {n_blocks}")
        blocks = rng.choice(n_blocks, need, replace=False)
        items = (NUM_SPECIAL + blocks[:, None] * R + rng.permuted(np.tile(np.arange(R), (need, 1)), axis=1))
        return items.reshape(-1)[:n], np.arange(0, n, R)
