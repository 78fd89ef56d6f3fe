"""Synthetic multi-hop fact verification: k-hop claims over a small random knowledge base.

A stand-in for HoVer-style verification (SUPPORTS / REFUTES, no NEI) that a
tiny transformer can learn on a CPU, used by the SCM-GRPO reproduction
(`experiments/scm_grpo.py`).

Knowledge base. Every problem draws its own world: `num_entities` entities
`e0, e1, ...` and `num_relations` relations `r0, r1, ...`, each relation a
random function of the entities without fixed points (`tails[r, h]` is the
unique tail of `(h, r)`). A fresh world per problem means facts cannot be
memorized across problems: the evidence in the prompt must be read.

Claim. A k-hop claim (k = 2..4 by default) starts at an entity `x0`, composes
k distinct relations `r_1 .. r_k` and names a final entity `y`: "following
r_1, then r_2, ... from x0 reaches y". The gold chain is the walk
`x_1 .. x_k` with `x_i = tails[r_i, x_{i-1}]` (entities distinct).
SUPPORTS: `y = x_k`. REFUTES: `y` is swapped for a near miss that occurs in
the evidence: `x_{k-1}` (one hop short), `x_{k+1}` (one hop too far along the
overshoot fact) or a distractor's tail, so "does y occur at all" is no shortcut
and a chain of the wrong length points at the wrong entity.

Evidence. The k gold facts `(x_{i-1}, r_i, x_i)`, the overshoot fact
`(x_k, r', x_{k+1})` and facts of other entities, `num_facts` facts in all,
shuffled. Each entity heads at most one evidence fact, so the evidence
determines the walk; since every relation is a function the claim's truth in
the world equals its truth on the evidence.

Token format (word tokens, see `WordTokenizer`; 32 ids with the defaults):

  * prompt: each fact as `relation head tail ;` (read "r(h) = t"), then the
    claim in function notation `? y = r_k .. r_1 x0 :` (y = r_k(..r_1(x0)));
  * completion (the compact dependency-graph grammar of
    `algorithms.rl.scm_grpo.parse_compact`): the intermediate conclusions
    `x_1 .. x_k` (one node per hop), then `|` and the verdict `S` (SUPPORTS)
    or `R` (REFUTES), e.g. `e4 e1 e6 | S`: the graph e4 -> e1 -> e6 -> C
    (the claim), depth 3. Allowed nodes are the entities of the evidence.

Example:
    >>> task = MultiHopTask(num_entities=10, num_relations=4, num_facts=6)
    >>> p = task.sample(1, seed=0, hops=2)[0]
    >>> p.hops, len(p.facts), len(p.gold_chain)
    (2, 6, 2)
    >>> task.verify(p) == (p.label == "SUPPORTS")  # brute force over the KB
    True
    >>> task.solve_from_evidence(p) == p.label     # chain following on the evidence only
    True
    >>> tok = task.tokenizer()
    >>> ids = tok.encode(task.target(p))
    >>> tok.decode(ids) == task.target(p)
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from experiments.tasks.tokenizer import SymbolTokenizer

__all__ = ["Fact", "MultiHopProblem", "MultiHopTask", "WordTokenizer", "LABELS", "VERDICT_TOKENS"]

LABELS = ("SUPPORTS", "REFUTES")
VERDICT_TOKENS = {"SUPPORTS": "S", "REFUTES": "R"}


class WordTokenizer(SymbolTokenizer):
    """One token per whitespace-separated symbol of a fixed vocabulary.

    The `SymbolTokenizer` body of `CharTokenizer` (PAD=0, BOS=1, EOS=2,
    `encode`, `decode`, `vocab_size`), so `lm_batch`, `prompt_batch` and
    `grpo.text_reward` work unchanged; `decode` joins symbols with spaces.

    Example:
        >>> tok = WordTokenizer(["e0", "e1", "|", "S"])
        >>> tok.encode("e1 e0 | S")
        [4, 3, 5, 6]
        >>> tok.decode([1, 4, 5, 2, 3])
        'e1 |'
    """

    separator = " "

    def __init__(self, symbols: Sequence[str]):
        symbols = list(symbols)
        if not symbols or any(not isinstance(s, str) or not s or s.split() != [s] for s in symbols):
            raise ValueError(f"symbols: expected non-empty symbols without whitespace, got {symbols!r}")
        repeated = self._repeated(symbols)
        if repeated:
            raise ValueError(f"symbols: expected each symbol once, got repeated {repeated!r}")
        super().__init__(symbols)
        self.symbols = self._symbols

    def _split(self, text: str) -> list[str]:
        return text.split()

    def __repr__(self) -> str:
        return f"WordTokenizer({len(self.symbols)} symbols)"


@dataclasses.dataclass(frozen=True)
class Fact:
    """A knowledge-base fact `(head, relation, tail)` (entity / relation indices)."""

    head: int
    relation: int
    tail: int

    def text(self) -> str:
        """`r h t`, read "r(h) = t" (head and tail adjacent, which a small model reads most easily)."""
        return f"r{self.relation} e{self.head} e{self.tail}"


@dataclasses.dataclass(frozen=True)
class MultiHopProblem:
    """One claim with its world and evidence.

    Attributes:
        tails: [R, E] int table of the world: `tails[r][h]` is the tail of (h, r).
        start: x0, the claim's first entity.
        relations: (r_1, ..., r_k), composed left to right.
        claimed: y, the entity the claim says is reached.
        label: "SUPPORTS" or "REFUTES".
        facts: the evidence in prompt order.
        gold_chain: x_1 .. x_k, the entities reached after each hop (the gold graph's nodes).
    """

    tails: tuple[tuple[int, ...], ...]
    start: int
    relations: tuple[int, ...]
    claimed: int
    label: str
    facts: tuple[Fact, ...]
    gold_chain: tuple[int, ...]

    @property
    def hops(self) -> int:
        """k, the number of relations composed (the target depth d*)."""
        return len(self.relations)

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The node names the output graph may use: the entities that occur in the evidence."""
        return tuple(sorted({f"e{e}" for f in self.facts for e in (f.head, f.tail)}))


@dataclasses.dataclass(frozen=True)
class MultiHopTask:
    """Generator, text format and verifiers of the multi-hop verification task.

    Attributes:
        num_entities: E entities per world.
        num_relations: R relations per world (>= max_hops, relations of a claim are distinct).
        num_facts: evidence facts per prompt (>= max_hops).
        min_hops, max_hops: k is drawn uniformly from min_hops..max_hops.
        seed: base seed; `sample(n, seed=s)` is deterministic in (self.seed, s).
    """

    num_entities: int = 16
    num_relations: int = 6
    num_facts: int = 5
    min_hops: int = 2
    max_hops: int = 4
    seed: int = 0

    def __post_init__(self):
        for name, minimum in (("min_hops", 1), ("max_hops", 1), ("num_entities", 3), ("num_relations", 1),
                              ("num_facts", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
        if self.min_hops > self.max_hops:
            raise ValueError(f"min_hops: expected <= max_hops={self.max_hops}, got {self.min_hops}")
        if self.num_relations < self.max_hops:
            raise ValueError(f"num_relations: expected >= max_hops={self.max_hops}, got {self.num_relations}")
        if self.num_facts < self.max_hops + 1:
            raise ValueError(f"num_facts: expected >= max_hops + 1 = {self.max_hops + 1}, got {self.num_facts}")
        if self.num_entities < self.num_facts + 2:
            raise ValueError(f"num_entities: expected >= num_facts + 2 = {self.num_facts + 2}, got {self.num_entities}")

    # --- vocabulary and lengths ---------------------------------------------------------

    @property
    def symbols(self) -> tuple[str, ...]:
        ents = [f"e{i}" for i in range(self.num_entities)]
        rels = [f"r{i}" for i in range(self.num_relations)]
        return tuple(ents + rels + [";", "?", "=", ":", "|", "S", "R"])

    def tokenizer(self) -> WordTokenizer:
        return WordTokenizer(self.symbols)

    @property
    def max_prompt_len(self) -> int:
        """Tokens of the longest prompt (BOS excluded): 4 per fact + `? y = r_k..r_1 x0 :`."""
        return 4 * self.num_facts + self.max_hops + 5

    def max_target_len(self, extra: int = 0) -> int:
        """Tokens of the longest completion with up to `extra` chain nodes beyond k (EOS excluded)."""
        return self.max_hops + extra + 2

    # --- generation -----------------------------------------------------------------------

    def sample(self, n: int, *, seed: int, hops: int | None = None) -> list[MultiHopProblem]:
        """`n` problems, deterministic in `(self.seed, seed, hops)`; each label with probability 1/2.

        Args:
            n: number of problems.
            seed: selects the draw (use different seeds for train and held-out claims).
            hops: fix k; default uniform in min_hops..max_hops.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {n!r}")
        if hops is not None and not self.min_hops <= hops <= self.max_hops:
            raise ValueError(f"hops: expected None or in [{self.min_hops}, {self.max_hops}], got {hops!r}")
        rng = np.random.default_rng([self.seed, seed, 0 if hops is None else hops])
        out = []
        for _ in range(n):
            k = int(rng.integers(self.min_hops, self.max_hops + 1)) if hops is None else hops
            refute = bool(rng.random() < 0.5)
            problem = None
            while problem is None:  # rejection: chains that revisit an entity
                problem = self._one(rng, k, refute=refute)
            out.append(problem)
        return out

    def _world(self, rng: np.random.Generator) -> np.ndarray:
        e = self.num_entities
        # tails[r, h] uniform over the entities other than h (a random function without fixed points).
        offsets = rng.integers(1, e, size=(self.num_relations, e))
        return (np.arange(e)[None, :] + offsets) % e

    def _one(self, rng: np.random.Generator, k: int, refute: bool) -> MultiHopProblem | None:
        tails = self._world(rng)
        rels = tuple(int(r) for r in rng.permutation(self.num_relations)[:k])
        x = [int(rng.integers(self.num_entities))]
        for r in rels:
            x.append(int(tails[r, x[-1]]))
        ext_rel = int(rng.integers(self.num_relations))  # the walk goes on past x_k (an overshoot fact)
        x_next = int(tails[ext_rel, x[-1]])
        if len(set(x + [x_next])) != len(x) + 1:  # revisiting an entity would make the chain ambiguous
            return None
        gold = [Fact(x[i], rels[i], x[i + 1]) for i in range(k)]
        # Distractors: the overshoot fact, then facts of other heads (each entity heads at most one
        # evidence fact, so the evidence determines the walk).
        used = set(x)
        others = [h for h in rng.permutation(self.num_entities).tolist() if h not in used]
        distractors = [Fact(x[-1], ext_rel, x_next)]
        for h in others[: self.num_facts - k - 1]:
            r = int(rng.integers(self.num_relations))
            distractors.append(Fact(h, r, int(tails[r, h])))
        distractors = distractors[: self.num_facts - k]
        claimed, label = x[-1], "SUPPORTS"
        if refute:
            # Near misses that appear in the evidence: one hop short, one hop too far, a distractor's tail.
            label = "REFUTES"
            pool = sorted({x[-2], x_next} | {f.tail for f in distractors} - {x[-1]})
            claimed = pool[int(rng.integers(len(pool)))]
        facts = gold + distractors
        order = rng.permutation(len(facts))
        facts = [facts[i] for i in order]
        return MultiHopProblem(tails=tuple(tuple(int(v) for v in row) for row in tails), start=x[0], relations=rels,
                               claimed=int(claimed), label=label, facts=tuple(facts),
                               gold_chain=tuple(x[1:]))

    # --- text -------------------------------------------------------------------------------

    def prompt(self, p: MultiHopProblem) -> str:
        """Evidence then claim in function notation, e.g. `r1 e3 e0 ; ... ; ? e9 = r4 r1 e3 :` (e9 = r4(r1(e3)))."""
        evidence = " ".join(f"{f.text()} ;" for f in p.facts)
        claim = ["?", f"e{p.claimed}", "="] + [f"r{r}" for r in reversed(p.relations)] + [f"e{p.start}", ":"]
        return f"{evidence} {' '.join(claim)}"

    def target(self, p: MultiHopProblem, chain: Sequence[int] | None = None) -> str:
        """The compact-grammar completion for `chain` (entities; default the gold chain x_1..x_k)."""
        chain = p.gold_chain if chain is None else chain
        return " ".join([f"e{j}" for j in chain] + ["|", VERDICT_TOKENS[p.label]])

    # --- verifiers --------------------------------------------------------------------------

    def verify(self, p: MultiHopProblem) -> bool:
        """Whether the claim is true in its world (composition of the KB's relation tables)."""
        x = p.start
        for r in p.relations:
            x = p.tails[r][x]
        return x == p.claimed

    def solve_from_evidence(self, p: MultiHopProblem) -> str | None:
        """The label obtained by following the chain through the evidence alone (None if it breaks)."""
        index = {(f.head, f.relation): f.tail for f in p.facts}
        x = p.start
        for r in p.relations:
            if (x, r) not in index:
                return None
            x = index[(x, r)]
        return "SUPPORTS" if x == p.claimed else "REFUTES"

    def gold_walk(self, p: MultiHopProblem) -> tuple[int, ...]:
        """x_1..x_k recomputed from the world table (brute force; equals `p.gold_chain`)."""
        x, out = p.start, []
        for r in p.relations:
            x = p.tails[r][x]
            out.append(x)
        return tuple(out)
