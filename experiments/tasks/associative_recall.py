"""Multi-query associative recall (MQAR), produced directly as token ids.

MQAR (Arora et al., "Zoology: Measuring and Improving Recall in Efficient
Language Models", arXiv:2312.04927, 2023) tests whether a sequence model can
look things up in its context: the sequence first binds keys to values, then
asks for some of the keys again, and the model must produce each one's value.

Token ids (`K` = num_keys, `V` = num_values, `F` = num_fillers):

    0                      PAD (unused inside a sequence; for callers that pad)
    1                      QUERY marker
    2 .. 2+K-1             keys
    2+K .. 2+K+V-1         values
    2+K+V .. 2+K+V+F-1     fillers (noise)
    vocab_size = 2 + K + V + F

A sequence of length `context_len` is made of

  * `num_pairs` pair blocks `key value` (distinct keys, values drawn with
    replacement),
  * `num_queries` query blocks `QUERY key value`, each asking a different key
    of an earlier pair block (queried keys are drawn without replacement),
  * filler tokens, uniform over the filler range, everywhere else.

Without `scatter` the pair blocks come first and the query blocks are placed at
random among the fillers after them (the Zoology layout). With `scatter` pair
blocks are also placed at random among the fillers, with each query after the
pair it asks about. The key-value bindings thus sit at arbitrary distances from
their queries, up to `context_len`.

Batches use the `lm_batch` convention: `inputs = tokens[:, :-1]`,
`targets = tokens[:, 1:]`. The answer to a query is the target at the query's
key, i.e. `targets[i, query_positions[i, j]] == answers[i, j]`, and `loss_mask`
is 1 exactly there.

Example:
    >>> task = AssociativeRecallTask(num_pairs=2, num_queries=1, context_len=10)
    >>> batch = task.batch(0, batch_size=4)
    >>> batch["tokens"].shape, batch["inputs"].shape, batch["answers"].shape
    ((4, 10), (4, 9), (4, 1))
    >>> bool((batch["loss_mask"].sum(axis=1) == 1).all())
    True
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["AssociativeRecallTask"]


@dataclasses.dataclass(frozen=True)
class AssociativeRecallTask:
    """MQAR sequences of a given length; see the module docstring for the layout.

    Attributes:
        num_pairs: key-value pairs per sequence.
        num_queries: queries per sequence (at most `num_pairs`, distinct keys).
        context_len: the total sequence length (of `tokens`).
        num_keys: size of the key id range (at least `num_pairs`).
        num_values: size of the value id range.
        num_fillers: size of the filler id range.
        scatter: place the pairs at random positions too, not only at the start.
        seed: fixes the data.
    """

    num_pairs: int = 8
    num_queries: int = 4
    context_len: int = 64
    num_keys: int = 64
    num_values: int = 64
    num_fillers: int = 16
    scatter: bool = False
    seed: int = 0

    query_id = 1  # a class constant, not a field

    def __post_init__(self):
        for name in ("num_pairs", "num_queries", "num_keys", "num_values", "num_fillers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if self.num_queries > self.num_pairs:
            raise ValueError(
                f"num_queries: expected at most num_pairs={self.num_pairs} (queried keys "
                f"are distinct), got {self.num_queries}"
            )
        if self.num_pairs > self.num_keys:
            raise ValueError(
                f"num_keys: expected at least num_pairs={self.num_pairs} (keys are "
                f"distinct), got {self.num_keys}"
            )
        needed = 2 * self.num_pairs + 3 * self.num_queries
        if not isinstance(self.context_len, int) or self.context_len < needed:
            raise ValueError(
                f"context_len: expected an int >= {needed} (2 * num_pairs={self.num_pairs} "
                f"+ 3 * num_queries={self.num_queries}), got {self.context_len!r}"
            )

    @property
    def key_start(self) -> int:
        """The first key id."""
        return 2

    @property
    def value_start(self) -> int:
        """The first value id."""
        return 2 + self.num_keys

    @property
    def filler_start(self) -> int:
        """The first filler id."""
        return 2 + self.num_keys + self.num_values

    @property
    def vocab_size(self) -> int:
        """Number of token ids: PAD, QUERY, keys, values and fillers."""
        return 2 + self.num_keys + self.num_values + self.num_fillers

    def batch(self, step: int, *, batch_size: int) -> dict[str, np.ndarray]:
        """The batch of `step`, deterministic in `(self.seed, step)`.

        Args:
            step: the training step (or any index selecting the data).
            batch_size: b.

        Returns:
            A dict (dimension legend: `b` batch, `t` = context_len, `q` =
            num_queries) with int32 `tokens` [b, t], `inputs` [b, t-1],
            `targets` [b, t-1], `answers` [b, q], `query_positions` [b, q]
            (indices into `inputs`, increasing), and float32 `loss_mask`
            [b, t-1].
        """
        if not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"batch_size: expected an int >= 0, got {batch_size!r}")
        rng = np.random.default_rng([self.seed, step])
        b, t, q = batch_size, self.context_len, self.num_queries
        tokens = np.zeros((b, t), np.int32)
        answers = np.zeros((b, q), np.int32)
        query_positions = np.zeros((b, q), np.int32)
        for i in range(b):
            tokens[i], answers[i], query_positions[i] = self._sequence(rng)
        loss_mask = np.zeros((b, t - 1), np.float32)
        np.put_along_axis(loss_mask, query_positions, 1.0, axis=1)
        return {
            "tokens": tokens,
            "inputs": tokens[:, :-1].copy(),
            "targets": tokens[:, 1:].copy(),
            "loss_mask": loss_mask,
            "answers": answers,
            "query_positions": query_positions,
        }

    def _sequence(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p, q, t = self.num_pairs, self.num_queries, self.context_len
        keys = self.key_start + rng.choice(self.num_keys, p, replace=False)
        values = self.value_start + rng.integers(0, self.num_values, p)
        asked = rng.choice(p, q, replace=False)  # which pairs the queries ask about

        # Blocks (is_query, pair index): a fixed prefix, then movable blocks in
        # the order they appear.
        if self.scatter:
            # Random times; a query's time lies between its pair's time and 1.
            pair_time = rng.random(p)
            query_time = pair_time[asked] + (1.0 - pair_time[asked]) * rng.random(q)
            kinds = [(False, j) for j in range(p)] + [(True, j) for j in asked.tolist()]
            order = np.argsort(np.concatenate([pair_time, query_time]), kind="stable")
            prefix, movable = [], [kinds[k] for k in order.tolist()]
        else:
            prefix = [(False, j) for j in range(p)]
            movable = [(True, j) for j in rng.permutation(asked).tolist()]

        # Interleave the movable blocks with the single filler tokens: choose
        # which of the len(movable) + num_fillers slots hold a block. A block
        # in slot s starts after s items, of which the earlier blocks are longer
        # than one token.
        num_free = t - 2 * p - 3 * q
        slots = np.sort(rng.choice(len(movable) + num_free, len(movable), replace=False))
        lengths = np.array([3 if is_query else 2 for is_query, _ in movable], np.int64)
        extra_before = np.concatenate([[0], np.cumsum(lengths - 1)[:-1]])
        starts = 2 * len(prefix) + slots + extra_before

        seq = self.filler_start + rng.integers(0, self.num_fillers, t)
        for k, (_, j) in enumerate(prefix):
            seq[2 * k : 2 * k + 2] = keys[j], values[j]
        answer_list, position_list = [], []
        for start, (is_query, j) in zip(starts.tolist(), movable):
            if is_query:
                seq[start : start + 3] = self.query_id, keys[j], values[j]
                position_list.append(start + 1)  # inputs[start + 1] is the key
                answer_list.append(values[j])
            else:
                seq[start : start + 2] = keys[j], values[j]
        return seq, np.array(answer_list), np.array(position_list)
