"""Record recall: look a record up by its key and copy its value span, as token ids (Vegas).

A long-context associative-recall and copy task. The context first lists records ``KEY v_1 .. v_L``
(distinct keys, values uniform over a large value range), then asks for some of them again:
``QUERY KEY`` must be followed by that record's ``v_1 .. v_L``. Answering the first value is
associative recall, the rest is copying, so a two-layer model solves it with an induction head,
and its decoding attends to a small, moving, content-dependent part of a long cache: the setting
in which the KV subset a self-speculative drafter reads decides its acceptance.

Token ids (``K`` = num_keys, ``V`` = num_values): 0 PAD, 1 QUERY, 2 .. 2+K-1 keys,
2+K .. 2+K+V-1 values; ``vocab_size = 2 + K + V``.

``batch`` gives training sequences (records fill ``record_fraction`` of the context, queries the
rest) in the ``lm_batch`` convention with the loss on the answers and on the QUERY markers that
follow them (the queried keys themselves are random). ``prompts`` gives decoding prompts: records
filling the whole context, then ``QUERY KEY``; the reference continuation is that record's values.

Example:
    >>> task = RecordRecallTask(value_len=4, context_len=64)
    >>> b = task.batch(0, batch_size=2)
    >>> b["inputs"].shape, float(b["loss_mask"].sum(1).min()) > 0
    ((2, 63), True)
    >>> p = task.prompts(0, batch_size=2, context_len=100)
    >>> p["prompts"].shape, p["answers"].shape
    ((2, 100), (2, 4))
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["RecordRecallTask"]


@dataclasses.dataclass(frozen=True)
class RecordRecallTask:
    """Records ``KEY v_1..v_L`` then queries ``QUERY KEY v_1..v_L``; see the module docstring.

    Attributes:
      value_len: L, values per record.
      context_len: training sequence length.
      record_fraction: share of a training context holding records (the rest holds queries).
      num_keys: key id range (at least the records of the longest context used).
      num_values: value id range (large, so a value rarely repeats inside one context).
      seed: fixes the data.
    """

    value_len: int = 8
    context_len: int = 512
    record_fraction: float = 0.6
    num_keys: int = 512
    num_values: int = 8192
    seed: int = 0

    query_id = 1

    def __post_init__(self):
        for name in ("value_len", "context_len", "num_keys", "num_values"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        if not 0 < self.record_fraction < 1:
            raise ValueError(f"record_fraction: expected a value in (0, 1), got {self.record_fraction}")
        if self._records(self.context_len, self.record_fraction) < 1:
            raise ValueError(f"context_len: expected room for one record and one query of value_len="
                             f"{self.value_len}, got {self.context_len}")

    @property
    def key_start(self) -> int:
        return 2

    @property
    def value_start(self) -> int:
        return 2 + self.num_keys

    @property
    def vocab_size(self) -> int:
        return 2 + self.num_keys + self.num_values

    def _records(self, length: int, fraction: float) -> int:
        return min(int(fraction * length) // (self.value_len + 1), self.num_keys)

    def _records_block(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        keys = self.key_start + rng.choice(self.num_keys, n, replace=False)
        values = self.value_start + rng.integers(0, self.num_values, (n, self.value_len))
        return keys, values

    def batch(self, step: int, *, batch_size: int) -> dict[str, np.ndarray]:
        """Training batch of ``step``: int32 ``inputs`` / ``targets`` [b, t-1], float32 ``loss_mask``."""
        rng = np.random.default_rng([self.seed, step])
        t, L = self.context_len, self.value_len
        n = self._records(t, self.record_fraction)
        tokens = np.zeros((batch_size, t), np.int32)
        mask = np.zeros((batch_size, t), np.float32)  # on the token being predicted
        for i in range(batch_size):
            keys, values = self._records_block(rng, n)
            seq = list(np.concatenate([keys[:, None], values], axis=1).ravel())
            answer = []
            while len(seq) < t:
                j = int(rng.integers(n))
                start = len(seq)
                seq += [self.query_id, int(keys[j])] + values[j].tolist()
                answer += [start] + list(range(start + 2, start + 2 + L))  # QUERY marker and the values
            tokens[i] = seq[:t]
            a = np.asarray([p for p in answer if 0 < p < t])
            mask[i, a] = 1.0
            mask[i, n * (L + 1)] = 0.0  # the first QUERY follows the records, not an answer
        return {"tokens": tokens, "inputs": tokens[:, :-1].copy(), "targets": tokens[:, 1:].copy(),
                "loss_mask": mask[:, 1:].copy()}

    def prompts(self, step: int, *, batch_size: int, context_len: int) -> dict[str, np.ndarray]:
        """Decoding prompts of exactly ``context_len`` tokens: records, padding, then ``QUERY KEY``.

        Returns ``prompts`` [b, context_len] int32 and ``answers`` [b, L], the asked record's values.
        The records fill the context up to the final query (the first slots repeat a filler record's
        key when ``context_len - 2`` is not a multiple of ``L + 1``).
        """
        rng = np.random.default_rng([self.seed, 1_000_003, step])
        L = self.value_len
        n = min((context_len - 2) // (L + 1), self.num_keys)
        if n < 1:
            raise ValueError(f"context_len: expected at least {L + 3}, got {context_len}")
        out = np.zeros((batch_size, context_len), np.int32)
        answers = np.zeros((batch_size, L), np.int32)
        for i in range(batch_size):
            keys, values = self._records_block(rng, n)
            body = np.concatenate([keys[:, None], values], axis=1).ravel()
            pad = context_len - 2 - body.size
            j = int(rng.integers(n))
            lead = self.value_start + rng.integers(0, self.num_values, pad)  # loose values before the records
            out[i] = np.concatenate([lead, body, [self.query_id, keys[j]]])
            answers[i] = values[j]
        return {"prompts": out, "answers": answers}
