"""The CountDown numbers game, the verifiable-reward task of small-scale RL papers.

Given a few numbers and a target, write an arithmetic expression that uses each
given number exactly once (as many times as it is given), with `+ - * /` and
parentheses, and evaluates exactly to the target (TinyZero-style CountDown, as
in the DS-GRPO and IsoCompute reproductions: CountDown-3 with numbers in 1..9).

Generation makes every problem solvable: numbers are drawn uniformly from
1..`max_number`, combined by a random binary expression tree with random
operators, and evaluated with exact `fractions.Fraction` arithmetic
(intermediate fractions are allowed); a draw is rejected on division by zero or
when the value is not an integer in 1..`max_target`. The expression is kept as
`CountdownProblem.solution`.

Text format, for a character tokenizer (alphabet `"0123456789+-*/(),>:"`):

  * prompt: the numbers joined by "," then ">" and the target then ":", e.g.
    `"3,7,9>30:"`;
  * completion: just the expression, e.g. `"3*7+9"`; no spaces, no "=".

`verify` parses the expression with a small recursive-descent parser (never
`eval`). Grammar, whitespace allowed between tokens:

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := NUMBER | "(" expr ")"
    NUMBER := "0" | [1-9][0-9]*        (no sign, no leading zeros)

Unary minus is not part of the game and is rejected, as are numbers with
leading zeros (so `"03"` cannot pass for `3`).

`solve` enumerates every expression tree over the numbers and returns the
distinct solutions printed with minimal parentheses (the printer drops a pair
only where the value is unchanged, e.g. `a+(b-c)` prints as `a+b-c`), so it can
count distinct correct solutions for pass@k and diversity metrics.

Held-out split: a problem is a test problem iff a blake2b hash of its *target*
(with the seed) falls below `test_fraction`, so test targets are never seen in
training ("held-out targets").

Example:
    >>> task = CountdownTask()
    >>> problem = CountdownProblem(numbers=(3, 7, 9), target=30, solution="3*7+9")
    >>> task.prompt(problem)
    '3,7,9>30:'
    >>> task.verify(problem, "(9+1)*3"), task.verify(problem, "7*3+9")
    (False, True)
    >>> task.solve(problem)
    ['3*7+9', '7*3+9', '9+3*7', '9+7*3']
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from fractions import Fraction

import numpy as np

from experiments.tasks.tokenizer import CharTokenizer

__all__ = ["CountdownProblem", "CountdownTask"]

_ALPHABET = "0123456789+-*/(),>:"
_OPS = "+-*/"
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3
_SPLITS = ("all", "train", "test")


@dataclasses.dataclass(frozen=True)
class CountdownProblem:
    """One CountDown instance.

    Attributes:
        numbers: the numbers to use, each exactly once, in prompt order.
        target: the value to reach.
        solution: one expression that reaches it (the generating expression).
    """

    numbers: tuple[int, ...]
    target: int
    solution: str


@dataclasses.dataclass(frozen=True)
class CountdownTask:
    """Random solvable CountDown problems, their text format and their checker.

    Attributes:
        num_numbers: how many numbers a problem gives (3 for CountDown-3).
        max_number: numbers are drawn uniformly from 1..max_number.
        max_target: targets are integers in 1..max_target.
        test_fraction: the fraction of targets held out for the test split.
        seed: fixes the split and the sampled problems.
    """

    num_numbers: int = 3
    max_number: int = 9
    max_target: int = 100
    test_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self):
        for name, minimum in (("num_numbers", 2), ("max_number", 1), ("max_target", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
        if not 0.0 <= self.test_fraction <= 1.0:
            raise ValueError(f"test_fraction: expected a value in [0, 1], got {self.test_fraction!r}")

    @property
    def alphabet(self) -> str:
        """The characters of prompts and expressions."""
        return _ALPHABET

    def tokenizer(self) -> CharTokenizer:
        """The character tokenizer for this task."""
        return CharTokenizer(self.alphabet)

    @property
    def max_prompt_len(self) -> int:
        """The longest prompt, in characters."""
        n = self.num_numbers
        return n * len(str(self.max_number)) + (n - 1) + 1 + len(str(self.max_target)) + 1

    @property
    def max_solution_len(self) -> int:
        """The longest minimal-parentheses solution, in characters.

        n numbers, n - 1 operators and at most n - 2 pairs of parentheses (the
        root is never wrapped).
        """
        n = self.num_numbers
        return n * len(str(self.max_number)) + (n - 1) + 2 * (n - 2)

    @property
    def max_seq_len(self) -> int:
        """The longest `[BOS] + prompt + solution + [EOS]`, in tokens."""
        return 1 + self.max_prompt_len + self.max_solution_len + 1

    def split_of(self, problem: CountdownProblem) -> str:
        """Returns "test" if the problem's target is held out, else "train"."""
        digest = hashlib.blake2b(f"{self.seed}|{problem.target}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2.0**64
        return "test" if u < self.test_fraction else "train"

    def sample(self, n: int, *, seed: int, split: str = "all") -> list[CountdownProblem]:
        """Samples `n` solvable problems, deterministically in `(self.seed, seed)`.

        Args:
            n: number of problems.
            seed: selects the draw.
            split: "all" (no filtering), "train" or "test" (held-out targets).

        Returns:
            `n` problems (drawn with replacement).

        Raises:
            ValueError: if `n` is negative or `split` is unknown or empty.
        """
        if split not in _SPLITS:
            raise ValueError(f"split: expected one of {_SPLITS}, got {split!r}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {n!r}")
        if (split == "test" and self.test_fraction == 0.0) or (
            split == "train" and self.test_fraction == 1.0
        ):
            raise ValueError(
                f"split: the {split!r} split is empty with test_fraction={self.test_fraction}"
            )
        rng = np.random.default_rng([self.seed, seed])
        problems: list[CountdownProblem] = []
        tries = 0
        while len(problems) < n:
            tries += 1
            if tries > 10_000 * (n + 10):
                raise RuntimeError(f"could not sample {n} {split!r} problems from {self}")
            numbers = rng.integers(1, self.max_number + 1, self.num_numbers).tolist()
            text, _, value = _random_expression(numbers, rng)
            if value is None or value.denominator != 1 or not 1 <= value <= self.max_target:
                continue
            # Show the numbers in a fresh random order, unrelated to the solution's.
            shown = tuple(numbers[i] for i in rng.permutation(self.num_numbers))
            problem = CountdownProblem(numbers=shown, target=int(value), solution=text)
            if split == "all" or self.split_of(problem) == split:
                problems.append(problem)
        return problems

    def prompt(self, problem: CountdownProblem) -> str:
        """The text prompt, e.g. "3,7,9>30:"."""
        return ",".join(map(str, problem.numbers)) + f">{problem.target}:"

    def verify(self, problem: CountdownProblem, expression: str) -> bool:
        """Whether `expression` solves `problem` exactly.

        It must parse under the module's grammar, use exactly the multiset of
        `problem.numbers`, never divide by zero, and equal `problem.target` in
        exact rational arithmetic.
        """
        parsed = _parse(expression)
        if parsed is None:
            return False
        value, numbers = parsed
        return (
            value is not None
            and Counter(numbers) == Counter(problem.numbers)
            and value == problem.target
        )

    def reward(self, problem: CountdownProblem, completion: str) -> float:
        """1.0 if `completion` (surrounding whitespace ignored) solves `problem`, else 0.0."""
        return 1.0 if self.verify(problem, completion.strip()) else 0.0

    def solve(self, problem: CountdownProblem) -> list[str]:
        """All distinct solutions, printed with minimal parentheses, sorted.

        Brute force over every binary expression tree (all orders, all
        operators); about 7.7k trees for 4 numbers, so keep `num_numbers` <= 5.
        """
        exprs = _all_expressions(problem.numbers)
        return sorted(text for text, value in exprs.items() if value == problem.target)


# --- expression printing ------------------------------------------------------------


def _combine(
    left: tuple[str, int, Fraction | None], op: str, right: tuple[str, int, Fraction | None]
) -> tuple[str, int, Fraction | None]:
    """Joins two (text, precedence, value) nodes with minimal parentheses.

    The left operand is wrapped if it binds more loosely than `op`; the right
    one also when it binds equally and `op` is "-" or "/". Dropping the other
    pairs re-associates `a+(b-c)` as `(a+b)-c`, which has the same exact value.
    A value of None marks a division by zero somewhere inside.
    """
    (lt, lp, lv), (rt, rp, rv) = left, right
    prec = _PRECEDENCE[op]
    if lp < prec:
        lt = f"({lt})"
    if rp < prec or (rp == prec and op in "-/"):
        rt = f"({rt})"
    return lt + op + rt, prec, _apply(op, lv, rv)


def _apply(op: str, a: Fraction | None, b: Fraction | None) -> Fraction | None:
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def _random_expression(numbers: list[int], rng: np.random.Generator) -> tuple[str, int, Fraction | None]:
    """A random tree over `numbers` in order: random split point, random operator."""
    if len(numbers) == 1:
        return str(numbers[0]), _ATOM, Fraction(numbers[0])
    k = int(rng.integers(1, len(numbers)))
    left = _random_expression(numbers[:k], rng)
    right = _random_expression(numbers[k:], rng)
    return _combine(left, _OPS[int(rng.integers(len(_OPS)))], right)


def _all_expressions(numbers: tuple[int, ...]) -> dict[str, Fraction]:
    """Every valid expression using each of `numbers` once: text -> value.

    Dynamic programming over subsets of positions; distinct trees that print
    the same text have the same value, so deduplicating by text is exact.
    """
    n = len(numbers)
    table: dict[int, dict[str, tuple[int, Fraction]]] = {
        1 << i: {str(x): (_ATOM, Fraction(x))} for i, x in enumerate(numbers)
    }
    for mask in sorted(range(1, 1 << n), key=lambda m: bin(m).count("1")):
        if mask in table:
            continue
        out: dict[str, tuple[int, Fraction]] = {}
        left_mask = (mask - 1) & mask
        while left_mask:
            right_mask = mask ^ left_mask
            for lt, (lp, lv) in table[left_mask].items():
                for rt, (rp, rv) in table[right_mask].items():
                    for op in _OPS:
                        text, prec, value = _combine((lt, lp, lv), op, (rt, rp, rv))
                        if value is not None:
                            out[text] = (prec, value)
            left_mask = (left_mask - 1) & mask
        table[mask] = out
    return {text: value for text, (_, value) in table[(1 << n) - 1].items()}


# --- the safe parser ----------------------------------------------------------------


class _ParseError(Exception):
    pass


_DIV_BY_ZERO = object()


def _parse(expression: str) -> tuple[Fraction | None, list[int]] | None:
    """Parses and evaluates `expression`.

    Returns:
        None if it does not parse; otherwise `(value, numbers used)`, with value
        None if it divides by zero.
    """
    if not isinstance(expression, str) or len(expression) > 10_000:
        return None
    tokens = _tokenize(expression)
    if tokens is None:
        return None
    parser = _Parser(tokens)
    try:
        value = parser.expr()
        if parser.pos != len(tokens):
            return None
    except (_ParseError, RecursionError):
        return None
    return (None if value is _DIV_BY_ZERO else value), parser.numbers


def _tokenize(expression: str) -> list[str] | None:
    tokens, i = [], 0
    while i < len(expression):
        c = expression[i]
        if c in " \t\n":
            i += 1
        elif c in "+-*/()":
            tokens.append(c)
            i += 1
        elif "0" <= c <= "9":
            j = i
            while j < len(expression) and "0" <= expression[j] <= "9":
                j += 1
            number = expression[i:j]
            if len(number) > 1 and number[0] == "0":
                return None
            tokens.append(number)
            i = j
        else:
            return None
    return tokens


class _Parser:
    """Recursive descent over the module docstring's grammar, exact arithmetic.

    A division by zero does not stop parsing (a malformed rest must still be
    rejected); it is carried as the `_DIV_BY_ZERO` sentinel.
    """

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise _ParseError
        self.pos += 1
        return token

    def expr(self):
        value = self.term()
        while self._peek() in ("+", "-"):
            op = self._take()
            value = self._binary(op, value, self.term())
        return value

    def term(self):
        value = self.factor()
        while self._peek() in ("*", "/"):
            op = self._take()
            value = self._binary(op, value, self.factor())
        return value

    def factor(self):
        token = self._take()
        if token == "(":
            value = self.expr()
            if self._take() != ")":
                raise _ParseError
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise _ParseError

    @staticmethod
    def _binary(op: str, a, b):
        if a is _DIV_BY_ZERO or b is _DIV_BY_ZERO:
            return _DIV_BY_ZERO
        result = _apply(op, a, b)
        return _DIV_BY_ZERO if result is None else result
