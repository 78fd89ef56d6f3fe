"""Synthetic token "domains" for a tiny LM, and shifted evaluation prompts.

A mixture of text domains over one shared character vocabulary, built so that the domains differ in
their statistics and rules (which is what lets mixture-of-experts routers specialise), plus prompt
families that move away from the training mixture (the test-time shifts of routing-adaptation
papers such as "Rewiring Experts on the Fly", arXiv:2510.14853).

Domains (every document is one domain, a stream of characters cut to the sequence length):

  * ``markov_i`` (i < ``num_markov``): a sparse first-order Markov chain over the letters
    ``a..l``; each letter has ``branching`` possible successors (a random subset, fixed by the
    seed), the first with probability ``p_main``, the rest sharing ``1 - p_main``. Chains share
    the letters but not the transitions.
  * ``markov_rare``: one more chain of the same kind, with a small training weight (the "rare
    domain" shift).
  * ``copy``: problems ``w>w;`` with ``w`` uniform random letters of length ``copy_lengths``.
  * ``arith``: problems ``a+b=c;`` with ``c = a + b`` and operands of ``arith_digits`` digits.

Evaluation families (`DomainTask.eval_examples`), each example a (prompt, continuation) pair:

  * ``in_distribution``: the training domains at training lengths (control);
  * ``unseen_lengths``: copy words of ``eval_copy_lengths`` and 3-digit sums, with a few solved
    examples of the same (longer) kind earlier in the prompt;
  * ``rare_domain``: text of the rare chain;
  * ``interleaved``: one stream alternating copy and arithmetic problems (training streams hold
    one kind);
  * ``distracting_turn``: an unrelated earlier turn (Markov text of another chain) before the
    target stream.

For copy and arithmetic queries the prompt ends at ``>`` / ``=`` and the continuation is the answer
plus ``;`` (deterministic); for Markov text the continuation is the next ``markov_continuation``
characters of the chain (stochastic: exact match is bounded by the chain's entropy, NLL is the
better metric there).

Dimension legend: ``b`` batch, ``t`` tokens, ``P`` prompt block, ``N`` continuation block.

Every generator is numpy-only and deterministic given its seeds.

Example:
    >>> task = DomainTask(seed=0)
    >>> doc = task.document(np.random.default_rng(0), "arith", 20)
    >>> len(doc), set(doc) <= set("0123456789+=;")
    (20, True)
    >>> p, c, d = task.eval_examples("unseen_lengths", 1, seed=1)[0]
    >>> d in ("copy", "arith") and c.endswith(";")
    True
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.tasks.tokenizer import CharTokenizer

__all__ = ["DomainTask", "EVAL_FAMILIES", "LETTERS", "ALPHABET"]

LETTERS = "abcdefghijkl"
ALPHABET = LETTERS + "0123456789" + "+=;>"
EVAL_FAMILIES = ("in_distribution", "unseen_lengths", "rare_domain", "interleaved", "distracting_turn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DomainTask:
    """A mixture of synthetic domains over `ALPHABET` (see the module docstring).

    Attributes:
      num_markov: number of common Markov chains.
      branching: successors per letter in each chain.
      p_main: probability of a letter's first successor.
      markov_weight: training weight of each common chain.
      rare_weight: training weight of the rare chain.
      copy_weight: training weight of the copy domain.
      arith_weight: training weight of the arithmetic domain.
      copy_lengths: (min, max) copy word length in training.
      arith_digits: max operand digits in training.
      eval_copy_lengths: (min, max) copy word length of the unseen-lengths family.
      eval_arith_digits: operand digits of the unseen-lengths family.
      prompt_chars: target prompt length in characters (Markov prompts have exactly this many).
      markov_continuation: continuation length of Markov prompts.
      seed: seed of the chains' transition structure.
    """

    num_markov: int = 4
    branching: int = 2
    p_main: float = 0.8
    markov_weight: float = 0.12
    rare_weight: float = 0.03
    copy_weight: float = 0.22
    arith_weight: float = 0.27
    copy_lengths: tuple[int, int] = (2, 5)
    arith_digits: int = 2
    eval_copy_lengths: tuple[int, int] = (7, 9)
    eval_arith_digits: int = 3
    prompt_chars: int = 32
    markov_continuation: int = 8
    seed: int = 0

    def __post_init__(self):
        if self.num_markov < 1:
            raise ValueError(f"num_markov must be >= 1; got {self.num_markov}")
        if not 1 <= self.branching <= len(LETTERS):
            raise ValueError(f"branching must be in [1, {len(LETTERS)}]; got {self.branching}")
        if not 0.0 < self.p_main <= 1.0:
            raise ValueError(f"p_main must be in (0, 1]; got {self.p_main}")
        for name in ("markov_weight", "rare_weight", "copy_weight", "arith_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)}")
        if sum(self.weights.values()) <= 0:
            raise ValueError("the domain weights must not all be zero")
        for name in ("copy_lengths", "eval_copy_lengths"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (min, max) with 1 <= min <= max; got {(lo, hi)}")
        if self.arith_digits < 1 or self.eval_arith_digits < 1:
            raise ValueError(f"arith digits must be >= 1; got {self.arith_digits}, {self.eval_arith_digits}")
        if self.prompt_chars < 8 or self.markov_continuation < 1:
            raise ValueError(f"prompt_chars must be >= 8 and markov_continuation >= 1; got "
                             f"{self.prompt_chars}, {self.markov_continuation}")

    # ------------------------------------------------------------------ structure
    @property
    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer(ALPHABET)

    @property
    def markov_names(self) -> tuple[str, ...]:
        return tuple(f"markov_{i}" for i in range(self.num_markov)) + ("markov_rare",)

    @property
    def domains(self) -> tuple[str, ...]:
        return self.markov_names + ("copy", "arith")

    @property
    def weights(self) -> dict[str, float]:
        w = {n: self.markov_weight for n in self.markov_names[:-1]}
        w.update(markov_rare=self.rare_weight, copy=self.copy_weight, arith=self.arith_weight)
        return w

    def transitions(self) -> np.ndarray:
        """[num_markov + 1, 12, 12] transition matrices (row = current letter); the last is the rare chain."""
        rng = np.random.default_rng([self.seed, 7919])
        V = len(LETTERS)
        out = np.zeros((self.num_markov + 1, V, V))
        rest = (1.0 - self.p_main) / max(self.branching - 1, 1)
        for d in range(self.num_markov + 1):
            for a in range(V):
                succ = rng.choice(V, size=self.branching, replace=False)
                out[d, a, succ] = rest
                out[d, a, succ[0]] = self.p_main if self.branching > 1 else 1.0
        return out

    # ------------------------------------------------------------------ text
    def _markov(self, rng: np.random.Generator, name: str, n: int, start: str | None = None) -> str:
        trans = self._trans_cache()[self.markov_names.index(name)]
        cur = rng.integers(len(LETTERS)) if start is None else LETTERS.index(start)
        out = []
        for _ in range(n):
            cur = rng.choice(len(LETTERS), p=trans[cur])
            out.append(LETTERS[cur])
        return "".join(out)

    def _trans_cache(self) -> np.ndarray:
        cache = self.__dict__.get("_trans")
        if cache is None:
            cache = self.transitions()
            object.__setattr__(self, "_trans", cache)
        return cache

    @staticmethod
    def _copy_problem(rng: np.random.Generator, lengths: tuple[int, int]) -> tuple[str, str]:
        w = "".join(rng.choice(list(LETTERS), size=int(rng.integers(lengths[0], lengths[1] + 1))))
        return w + ">", w + ";"

    @staticmethod
    def _arith_problem(rng: np.random.Generator, digits: int, *, exact: bool = False) -> tuple[str, str]:
        def operand():
            nd = digits if exact else int(rng.integers(1, digits + 1))
            lo = 0 if nd == 1 else 10 ** (nd - 1)
            return int(rng.integers(lo, 10 ** nd))

        a, b = operand(), operand()
        return f"{a}+{b}=", f"{a + b};"

    def _problem(self, rng, kind: str, *, shifted: bool = False) -> tuple[str, str]:
        if kind == "copy":
            return self._copy_problem(rng, self.eval_copy_lengths if shifted else self.copy_lengths)
        return self._arith_problem(rng, self.eval_arith_digits if shifted else self.arith_digits, exact=shifted)

    def _stream(self, rng, kinds, n_chars: int, *, shifted: bool = False) -> str:
        """Solved problems (kinds cycled, or a single kind) until at least n_chars characters."""
        out, i = "", 0
        while len(out) < n_chars:
            q, a = self._problem(rng, kinds[i % len(kinds)], shifted=shifted)
            out += q + a
            i += 1
        return out

    def document(self, rng: np.random.Generator, domain: str, length: int) -> str:
        """A training document of exactly `length` characters from one domain."""
        if domain not in self.domains:
            raise ValueError(f"domain must be one of {self.domains}; got {domain!r}")
        if length < 1:
            raise ValueError(f"length must be >= 1; got {length}")
        if domain.startswith("markov"):
            return self._markov(rng, domain, length)
        # Start at a random offset into the stream so documents do not all begin with a problem.
        text = self._stream(rng, (domain,), length + 12)
        off = int(rng.integers(0, 12))
        return text[off:off + length]

    def sample_domains(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """[n] domain indices into `domains`, drawn with the training weights."""
        w = np.array([self.weights[d] for d in self.domains], np.float64)
        return rng.choice(len(self.domains), size=n, p=w / w.sum())

    def train_batch(self, position: int, batch_size: int, seq_len: int, *, stream: int = 0) -> dict[str, np.ndarray]:
        """The training batch at `position` (deterministic in (seed, stream, position)).

        Returns:
          `inputs`, `targets` int32 [b, seq_len], `loss_mask` float32 [b, seq_len] (all ones: every
          sequence is BOS + seq_len characters) and `domain` int32 [b] (index into `domains`).
        """
        if batch_size < 1 or seq_len < 2:
            raise ValueError(f"batch_size must be >= 1 and seq_len >= 2; got {batch_size}, {seq_len}")
        rng = np.random.default_rng([self.seed, 1 + stream, position])
        tok = self.tokenizer
        dom = self.sample_domains(rng, batch_size)
        rows = np.zeros((batch_size, seq_len + 1), np.int32)
        for i, d in enumerate(dom):
            rows[i] = [tok.bos_id] + tok.encode(self.document(rng, self.domains[d], seq_len))
        return {"inputs": rows[:, :-1], "targets": rows[:, 1:],
                "loss_mask": np.ones((batch_size, seq_len), np.float32), "domain": dom.astype(np.int32)}

    # ------------------------------------------------------------------ evaluation prompts
    def _query(self, rng, kinds, *, shifted: bool, solved: int, prefix: str = "") -> tuple[str, str, str]:
        """`solved` solved problems (of `kinds`, cycled) then one query of the next kind."""
        text = prefix
        for i in range(solved):
            q, a = self._problem(rng, kinds[i % len(kinds)], shifted=shifted)
            text += q + a
        kind = kinds[solved % len(kinds)]
        q, a = self._problem(rng, kind, shifted=shifted)
        return text + q, a, kind

    def _fill_solved(self, kinds, shifted: bool, budget: int) -> int:
        """How many solved problems fit roughly into `budget` characters."""
        if kinds == ("copy",):
            lo, hi = self.eval_copy_lengths if shifted else self.copy_lengths
            per = (lo + hi) + 3
        elif kinds == ("arith",):
            per = (4 * self.eval_arith_digits + 3) if shifted else (3 * self.arith_digits + 3)
        else:
            per = (sum(self.copy_lengths) + 3 + 3 * self.arith_digits + 3) / 2
        return max(1, int(budget // per) - 1)

    def eval_examples(self, family: str, n: int, *, seed: int) -> list[tuple[str, str, str]]:
        """n (prompt, continuation, domain) triples of an evaluation family (see the module docstring)."""
        if family not in EVAL_FAMILIES:
            raise ValueError(f"family must be one of {EVAL_FAMILIES}; got {family!r}")
        if n < 1:
            raise ValueError(f"n must be >= 1; got {n}")
        rng = np.random.default_rng([self.seed, 101, EVAL_FAMILIES.index(family), seed])
        P, M = self.prompt_chars, self.markov_continuation
        out = []
        for i in range(n):
            if family == "in_distribution":
                dom = (self.markov_names[:-1] + ("copy", "arith"))[i % (self.num_markov + 2)]
            elif family == "rare_domain":
                dom = "markov_rare"
            elif family == "interleaved":
                dom = "mixed"
            elif family == "unseen_lengths":
                dom = ("copy", "arith")[i % 2]
            else:  # distracting_turn: the target is a structured stream or another chain
                dom = ("copy", "arith", "markov")[i % 3]
            if family == "distracting_turn":
                chains = self.markov_names[:-1]
                distractor = chains[int(rng.integers(len(chains)))]
                turn = self._markov(rng, distractor, P // 2) + ";"
                if dom == "markov":
                    others = [c for c in chains if c != distractor] or list(chains)
                    target = others[int(rng.integers(len(others)))]
                    text = self._markov(rng, target, P // 2 + M)
                    out.append((turn + text[:P // 2], text[P // 2:], target))
                else:
                    k = self._fill_solved((dom,), False, P // 2)
                    p, a, _ = self._query(rng, (dom,), shifted=False, solved=k, prefix=turn)
                    out.append((p, a, dom))
                continue
            if dom.startswith("markov"):
                text = self._markov(rng, dom, P + M)
                out.append((text[:P], text[P:], dom))
                continue
            kinds = ("copy", "arith") if dom == "mixed" else (dom,)
            if dom == "mixed" and rng.random() < 0.5:
                kinds = ("arith", "copy")
            shifted = family == "unseen_lengths"
            k = self._fill_solved(kinds, shifted, P)
            p, a, kind = self._query(rng, kinds, shifted=shifted, solved=k)
            out.append((p, a, kind if dom != "mixed" else f"interleaved_{kind}"))
        return out

    def eval_batch(self, examples: list[tuple[str, str, str]], *, prompt_len: int, cont_len: int) -> dict[str, np.ndarray]:
        """Packs examples into one right-padded block `[BOS] + prompt + continuation`.

        Args:
          examples: (prompt, continuation, domain) triples.
          prompt_len: P, the prompt block (BOS included); longer prompts keep their last P - 1 chars.
          cont_len: N, the continuation block; longer continuations are cut.

        Returns:
          `tokens` int32 [b, P + N] (prompt then continuation, contiguous, then PAD),
          `prompt_lengths` int32 [b] (BOS included), `cont_lengths` int32 [b] and `domains` (list).
        """
        tok = self.tokenizer
        b = len(examples)
        tokens = np.full((b, prompt_len + cont_len), tok.pad_id, np.int32)
        pl, cl = np.zeros(b, np.int32), np.zeros(b, np.int32)
        for i, (p, c, _) in enumerate(examples):
            pe = tok.encode(p)[-(prompt_len - 1):]
            ce = tok.encode(c)[:cont_len]
            row = [tok.bos_id] + pe + ce
            tokens[i, :len(row)] = row
            pl[i], cl[i] = 1 + len(pe), len(ce)
        return {"tokens": tokens, "prompt_lengths": pl, "cont_lengths": cl, "domains": [e[2] for e in examples]}
