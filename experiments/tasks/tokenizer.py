"""A character tokenizer and the batch layout shared by the synthetic text tasks.

Every text task (arithmetic, CountDown, ...) is a prompt and a completion made
of a few characters, so one character is one token. Ids 0, 1 and 2 are the
special tokens PAD, BOS and EOS; the alphabet's characters get ids 3, 4, ... in
alphabet order.

Batch layout (dimension legend: `b` batch, `t` = seq_len):

  * `tokens` int32 [b, t]: `[BOS] + prompt + completion + [EOS]`, right-padded
    with PAD.
  * `inputs = tokens[:, :-1]` and `targets = tokens[:, 1:]`, int32 [b, t - 1]:
    next-token prediction pairs (`targets[i, j]` follows `inputs[i, j]`).
  * `loss_mask` float32 [b, t - 1]: 1 exactly where `targets` is a completion
    token or the EOS, so the prompt is context only and padding is ignored.
  * `prompt_lengths` int32 [b]: `1 + len(prompt)` (the BOS is counted), i.e. the
    index in `tokens` of the first completion token.

Example:
    >>> tok = CharTokenizer("0123456789+=")
    >>> tok.encode("1+2=")
    [4, 13, 5, 14]
    >>> batch = lm_batch(tok, ["1+2="], ["3"], seq_len=8)
    >>> batch["tokens"].tolist()
    [[1, 4, 13, 5, 14, 6, 2, 0]]
    >>> batch["loss_mask"].tolist()
    [[0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]]
    >>> tok.decode(batch["tokens"][0])
    '1+2=3'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["SymbolTokenizer", "CharTokenizer", "lm_batch", "prompt_batch"]


class SymbolTokenizer:
    """One token id per symbol of a fixed vocabulary; the body shared by the task tokenizers.

    Ids 0, 1 and 2 are PAD, BOS and EOS; ``symbols[i]`` has id ``i + 3``. A subclass says how text
    splits into symbols (``_split``), how decoded symbols join (``separator``) and how an unknown
    symbol is reported (``_unknown``); ``CharTokenizer`` (one character per token) and
    ``experiments.tasks.multihop.WordTokenizer`` (whitespace-separated words) are the two.

    Attributes:
        pad_id: id 0, right padding.
        bos_id: id 1, begins every sequence.
        eos_id: id 2, ends every completion.
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2
    num_special = 3
    separator = ""

    def __init__(self, symbols: Sequence[str]):
        self._symbols = tuple(symbols)
        self._to_id = {s: i + self.num_special for i, s in enumerate(self._symbols)}

    @staticmethod
    def _repeated(symbols: Iterable[str]) -> list[str]:
        """The symbols that occur more than once, sorted."""
        return sorted(s for s, n in Counter(symbols).items() if n > 1)

    def _split(self, text: str) -> list[str]:
        raise NotImplementedError

    def _unknown(self, symbol: str, text: str) -> str:
        return f"text: unknown symbol {symbol!r} in {text!r}"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._symbols == self._symbols

    def __hash__(self) -> int:
        return hash(self._symbols)

    @property
    def vocab_size(self) -> int:
        """Number of token ids: the 3 special tokens plus one per symbol."""
        return self.num_special + len(self._symbols)

    def encode(self, text: str) -> list[int]:
        """Encodes `text`, one id per symbol, without BOS or EOS.

        Raises:
            ValueError: if a symbol of `text` is not in the vocabulary (naming it).
        """
        try:
            return [self._to_id[s] for s in self._split(text)]
        except KeyError as e:
            raise ValueError(self._unknown(e.args[0], text)) from None

    def decode(self, ids: Iterable[int] | np.ndarray, *, stop_at_eos: bool = True) -> str:
        """Decodes a 1-D sequence of ids back to text (symbols joined by `separator`).

        PAD and BOS are skipped. With `stop_at_eos` decoding stops at the first
        EOS; without it EOS tokens are skipped like PAD.

        Args:
            ids: token ids, e.g. a row of `tokens` or a sampled completion.
            stop_at_eos: stop at the first EOS.

        Returns:
            The text.

        Raises:
            ValueError: if `ids` is not 1-D or holds an id outside [0, vocab_size).
        """
        arr = ids if isinstance(ids, np.ndarray) else np.asarray(list(ids), dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError(f"ids: expected a 1-D sequence, got shape {arr.shape}")
        out = []
        for i in arr.tolist():
            if not isinstance(i, int) or not 0 <= i < self.vocab_size:
                raise ValueError(f"ids: expected integers in [0, {self.vocab_size}), got {i!r}")
            if i == self.eos_id:
                if stop_at_eos:
                    break
                continue
            if i >= self.num_special:
                out.append(self._symbols[i - self.num_special])
        return self.separator.join(out)


class CharTokenizer(SymbolTokenizer):
    """Maps each character of a fixed alphabet to one token id.

    Attributes:
        pad_id: id 0, right padding.
        bos_id: id 1, begins every sequence.
        eos_id: id 2, ends every completion.
        alphabet: the characters in id order (`alphabet[i]` has id `i + 3`).
    """

    def __init__(self, alphabet: str):
        """Builds the tokenizer.

        Args:
            alphabet: the characters to encode, each once.

        Raises:
            ValueError: if `alphabet` is empty or repeats a character.
        """
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError(f"alphabet: expected a non-empty str, got {alphabet!r}")
        repeated = self._repeated(alphabet)
        if repeated:
            raise ValueError(
                f"alphabet: expected each character once, got {alphabet!r} "
                f"with repeated characters {repeated!r}"
            )
        super().__init__(alphabet)
        self.alphabet = alphabet

    def _split(self, text: str) -> list[str]:
        return list(text)

    def _unknown(self, symbol: str, text: str) -> str:
        return (f"text: expected characters from the alphabet {self.alphabet!r}, "
                f"got unknown character {symbol!r} in {text!r}")

    def __repr__(self) -> str:
        return f"CharTokenizer({self.alphabet!r})"


def lm_batch(
    tokenizer: CharTokenizer,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    seq_len: int,
) -> dict[str, np.ndarray]:
    """Builds a next-token-prediction batch with the loss on completions only.

    Args:
        tokenizer: the task's tokenizer.
        prompts: b prompt strings.
        completions: b completion strings (the answers), one per prompt.
        seq_len: t, the padded length of `tokens`.

    Returns:
        A dict with `tokens` [b, t], `inputs` [b, t-1], `targets` [b, t-1]
        (int32), `loss_mask` [b, t-1] (float32) and `prompt_lengths` [b]
        (int32); see the module docstring.

    Raises:
        ValueError: if `prompts` and `completions` differ in length, if
            `seq_len` < 2, or if an example needs more than `seq_len` tokens.
    """
    if len(prompts) != len(completions):
        raise ValueError(
            f"completions: expected one per prompt ({len(prompts)}), got {len(completions)}"
        )
    _check_seq_len(seq_len, minimum=2)
    b = len(prompts)
    tokens = np.full((b, seq_len), tokenizer.pad_id, np.int32)
    loss_mask = np.zeros((b, seq_len - 1), np.float32)
    prompt_lengths = np.zeros((b,), np.int32)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        p = [tokenizer.bos_id] + tokenizer.encode(prompt)
        c = tokenizer.encode(completion) + [tokenizer.eos_id]
        _check_fits(len(p) + len(c), seq_len, prompt + completion)
        tokens[i, : len(p) + len(c)] = p + c
        # targets[j] = tokens[j + 1]: the completion and EOS are the targets at
        # j = len(p) - 1, ..., len(p) + len(c) - 2.
        loss_mask[i, len(p) - 1 : len(p) + len(c) - 1] = 1.0
        prompt_lengths[i] = len(p)
    return {
        "tokens": tokens,
        "inputs": tokens[:, :-1].copy(),
        "targets": tokens[:, 1:].copy(),
        "loss_mask": loss_mask,
        "prompt_lengths": prompt_lengths,
    }


def prompt_batch(
    tokenizer: CharTokenizer, prompts: Sequence[str], *, seq_len: int
) -> dict[str, np.ndarray]:
    """Builds a batch of prompts to generate from.

    Args:
        tokenizer: the task's tokenizer.
        prompts: b prompt strings.
        seq_len: t, the padded length of `tokens`.

    Returns:
        A dict with `tokens` int32 [b, t] (`[BOS] + prompt`, right-padded with
        PAD) and `prompt_lengths` int32 [b] (`1 + len(prompt)`, the position of
        the first generated token).

    Raises:
        ValueError: if `seq_len` < 1 or a prompt needs more than `seq_len` tokens.
    """
    _check_seq_len(seq_len, minimum=1)
    tokens = np.full((len(prompts), seq_len), tokenizer.pad_id, np.int32)
    prompt_lengths = np.zeros((len(prompts),), np.int32)
    for i, prompt in enumerate(prompts):
        p = [tokenizer.bos_id] + tokenizer.encode(prompt)
        _check_fits(len(p), seq_len, prompt)
        tokens[i, : len(p)] = p
        prompt_lengths[i] = len(p)
    return {"tokens": tokens, "prompt_lengths": prompt_lengths}


def _check_seq_len(seq_len: int, *, minimum: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < minimum:
        raise ValueError(f"seq_len: expected an int >= {minimum}, got {seq_len!r}")


def _check_fits(needed: int, seq_len: int, text: str) -> None:
    if needed > seq_len:
        raise ValueError(
            f"seq_len: expected at least {needed} tokens for {text!r} (BOS and EOS "
            f"included), got seq_len={seq_len}"
        )
