"""Rubric-guided grading of calculus work and the multi-perspective protocol that evaluates graders.

The paper (spec ``rl_alignment_agents.md`` section 13) grades handwritten calculus quizzes with an
OCR -> LLM pipeline conditioned on the problem, a reference solution and a structured rubric, aggregates
repeated runs with a "max-rule", and evaluates the grader against noisy TA grades. This module is the
offline part of that pipeline: everything except the OCR engine and the LLM.

* **Grading interface** [READ: rubric-guided; INFERRED concrete form, spec 13(b)]. A `GradingItem` holds
  the problem, the reference solution, the rubric (`RubricLine`: id, points, acceptance criterion, the
  answer steps it reads, a machine check) and the answer text. A grader is any callable
  ``grader(item, *, rng) -> Grade`` (the `Grader` protocol); a `Grade` has per-line awards, the total
  (sum of awards clipped to ``[0, max_points]``), feedback lines, the lost rubric lines and a deferral
  flag. `rubric_prompt` writes the structured prompt a real LLM grader would get and
  `parse_grader_json` validates its JSON reply (an award above a line's points is rejected), so a
  remote model plugs in as one more `Grader`; nothing here calls one.
* **Graders** (simulated, with known behaviour): `RubricGrader` parses the answer's steps
  (``label = expression`` lines) with a small exact algebra of terms ``c x^k g(b x^p)``
  (g in {1, sin, cos, exp}, rational coefficients) and awards each rubric line whose check holds;
  unreadable steps (OCR artefacts that do not parse) are treated charitably (award) or strictly (no
  award) and flag the item for deferral; ``flip_rate`` flips a line's award at random (run-to-run
  stochasticity of an LLM). `NoisyGrader` is a total-level rater (a "TA"): ``clip(round(t + bias +
  noise_sd * z), 0, M)`` around the true total ``t``, whose exact score distribution, expected bias and
  expected MAE are available in closed form (`NoisyGrader.score_distribution`).
* **Aggregation** of repeated runs: `aggregate_scores` with the paper's max-rule [READ: "max-rule";
  INFERRED semantics: the maximum over repeated runs / OCR variants, i.e. benefit of the doubt] and the
  alternatives the limitation section says were not compared: min, mean, median, mode, first run.
* **Protocol metrics**: exact and within-tolerance agreement, MAE, mean difference (bias) with a t
  confidence interval (`bias_estimate`, Bonferroni-adjustable), quadratic weighted kappa
  (`quadratic_weighted_kappa`, Cohen's kappa with weights ``(i - j)^2`` over a score grid),
  `agreement_report` (all of these, optionally per group: per problem), `rubric_line_report`
  (per-rubric-line agreement and over/under-award rates), `feedback_correct` (the lost lines named in
  feedback equal the truly lost ones), `deferral_curve`, and `evaluate_graders` (all graders against
  one reference at once: reports, Bonferroni bias intervals, ranking by MAE, reliability).
* **Reliability when the reference is noisy too** [spec 13(d): "Krippendorff's alpha across >= 3
  raters"]: `krippendorff_alpha` (interval or nominal metric, missing ratings allowed) is the main
  statistic: it takes any number of raters, tolerates items graded by only some of them (TAs grade
  subsets in practice) and, with the interval metric, treats point scores as quantities. `icc`
  (Shrout & Fleiss ICC(1,1), ICC(2,1), ICC(3,1)) is given beside it: for complete data ICC(2,1)
  (absolute agreement) is close to interval alpha. `error_variances` (Grubbs' estimator) gives each
  rater's error variance from >= 3 raters without any ground truth (model ``x_gi = t_i + b_g + e_gi``
  with independent errors), which ranks graders when no reference is trusted.

Inferred (not in what the spec read): the rubric format and its checks, the charitable/strict/deferral
policies, the max-rule semantics, the interpretation of "score agreement" as within-tolerance agreement
(the experiment uses +-1 point of 10), and the simulated grader models.

Dimension legend: ``r`` repeated runs, ``n`` graded items, ``g`` graders (raters), ``c`` score
categories.

References:
  Yu, Liu, Mao, Liu, Chen, Xin, Yu, "Evaluating AI Grading on Real-World Handwritten College
  Mathematics: A Large-Scale Study Toward a Benchmark", arXiv:2603.00895 (ICML 2026).
  Krippendorff, "Computing Krippendorff's Alpha-Reliability" (2011). Shrout & Fleiss, "Intraclass
  correlations: uses in assessing rater reliability", Psychological Bulletin 86 (1979). Grubbs, "On
  estimating precision of measuring instruments and product variability", JASA 43 (1948).

Example:
    >>> e = parse_expression("3*x^2*sin(2*x) + x")
    >>> format_expression(derivative(e))
    '1 + 6*x*sin(2*x) + 6*x^2*cos(2*x)'
    >>> quadratic_weighted_kappa([0, 1, 2, 2], [0, 1, 2, 2])
    1.0
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from fractions import Fraction
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
from scipy import special, stats

__all__ = [
    "Term", "Expr", "ExpressionSyntaxError", "parse_expression", "format_expression", "expression",
    "add", "multiply", "scale", "derivative", "antiderivative", "evaluate",
    "RubricLine", "GradingItem", "Grade", "Grader", "make_grade", "parse_answer", "rubric_prompt",
    "parse_grader_json", "RubricGrader", "NoisyGrader",
    "AGGREGATION_RULES", "aggregate_scores",
    "exact_agreement", "within_agreement", "mean_absolute_error", "mean_difference", "BiasEstimate",
    "bias_estimate", "quadratic_weighted_kappa", "agreement_report", "rubric_line_report",
    "feedback_correct", "deferral_curve", "evaluate_graders", "krippendorff_alpha", "icc", "error_variances",
]

FUNCTIONS = ("", "sin", "cos", "exp")  # "" is the constant function 1


# ----------------------------------------------------------------------------------------------
# A small exact algebra: sums of terms c * x^k * g(b * x^p), plus an optional constant of integration.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class Term:
    """One term ``coef * x^power * func(inner_coef * x^inner_power)``; ``func == ""`` means 1.

    The sort order (power, func, inner) is the canonical order of `Expr`; ``coef`` is last so that
    like terms sit together.
    """

    power: int
    func: str
    inner_coef: Fraction
    inner_power: int
    coef: Fraction

    @property
    def key(self) -> tuple:
        return (self.power, self.func, self.inner_coef, self.inner_power)


@dataclasses.dataclass(frozen=True)
class Expr:
    """A canonical sum of `Term` s (like terms merged, zero terms dropped, sorted) and ``+ C`` flag.

    Two expressions are mathematically equal (in this term class) iff they compare equal.
    """

    terms: tuple[Term, ...]
    has_constant: bool = False


class ExpressionSyntaxError(ValueError):
    """The text is not an expression of the supported grammar (e.g. an OCR artefact)."""


def _term(coef, power=0, func="", inner_coef=0, inner_power=0) -> Term:
    if func not in FUNCTIONS:
        raise ValueError(f"func must be one of {FUNCTIONS}, got {func!r}")
    if func == "":
        inner_coef, inner_power = 0, 0
    elif Fraction(inner_coef) == 0:
        raise ValueError(f"inner_coef of {func}(.) must be nonzero, got {inner_coef}")
    if power < 0 or inner_power < 0:
        raise ValueError(f"powers must be >= 0, got power={power}, inner_power={inner_power}")
    return Term(int(power), func, Fraction(inner_coef), int(inner_power), Fraction(coef))


def expression(terms: Sequence[Term | tuple], has_constant: bool = False) -> Expr:
    """The canonical `Expr` of a list of terms (a `Term` or a tuple ``(coef, power, func, b, p)``)."""
    merged: dict[tuple, Fraction] = {}
    for t in terms:
        t = t if isinstance(t, Term) else _term(*t)
        if t.func in ("sin",) and t.inner_coef < 0:  # sin(-u) = -sin(u)
            t = dataclasses.replace(t, coef=-t.coef, inner_coef=-t.inner_coef)
        elif t.func == "cos" and t.inner_coef < 0:  # cos(-u) = cos(u)
            t = dataclasses.replace(t, inner_coef=-t.inner_coef)
        if t.func == "" or t.inner_coef == 0:
            t = dataclasses.replace(t, func="", inner_coef=Fraction(0), inner_power=0)
        merged[t.key] = merged.get(t.key, Fraction(0)) + t.coef
    out = tuple(sorted(Term(*k, c) for k, c in merged.items() if c != 0))
    return Expr(out, bool(has_constant))


def add(a: Expr, b: Expr) -> Expr:
    """``a + b``."""
    return expression(a.terms + b.terms, a.has_constant or b.has_constant)


def scale(a: Expr, c) -> Expr:
    """``c * a`` for a rational ``c`` (the constant flag is kept)."""
    return expression([dataclasses.replace(t, coef=t.coef * Fraction(c)) for t in a.terms], a.has_constant)


def multiply(a: Expr, b: Expr) -> Expr:
    """``a * b``; each product of terms may hold at most one non-constant function.

    Raises:
      ValueError: if two terms with functions meet (``sin(.) * cos(.)`` is outside the term class) or
        an operand carries ``+ C``.
    """
    if a.has_constant or b.has_constant:
        raise ValueError("multiply: operands must not carry a constant of integration (+ C)")
    out = []
    for s in a.terms:
        for t in b.terms:
            if s.func and t.func:
                raise ValueError(f"multiply: product {s.func}(.) * {t.func}(.) is outside the term class")
            f = s if s.func else t
            out.append(Term(s.power + t.power, f.func, f.inner_coef, f.inner_power, s.coef * t.coef))
    return expression(out)


_DERIV = {"sin": (Fraction(1), "cos"), "cos": (Fraction(-1), "sin"), "exp": (Fraction(1), "exp")}


def derivative(a: Expr) -> Expr:
    """``d/dx a`` (power, product and chain rules; the constant of integration vanishes)."""
    out = []
    for t in a.terms:
        if t.power > 0:
            out.append(Term(t.power - 1, t.func, t.inner_coef, t.inner_power, t.coef * t.power))
        if t.func and t.inner_power > 0:
            sign, g = _DERIV[t.func]
            c = t.coef * sign * t.inner_coef * t.inner_power
            out.append(Term(t.power + t.inner_power - 1, g, t.inner_coef, t.inner_power, c))
    return expression(out)


_ANTI = {"sin": (Fraction(-1), "cos"), "cos": (Fraction(1), "sin"), "exp": (Fraction(1), "exp")}


def antiderivative(a: Expr, *, constant: bool = True) -> Expr:
    """An antiderivative of polynomial terms and of ``g(b x)`` terms (no ``x^k g(.)`` products).

    Raises:
      ValueError: for a term outside that class (it would need integration by parts).
    """
    out = []
    for t in a.terms:
        if not t.func:
            out.append(Term(t.power + 1, "", Fraction(0), 0, t.coef / (t.power + 1)))
        elif t.power == 0 and t.inner_power == 1:
            sign, g = _ANTI[t.func]
            out.append(Term(0, g, t.inner_coef, 1, t.coef * sign / t.inner_coef))
        else:
            raise ValueError(f"antiderivative: term {format_expression(expression([t]))!r} is outside "
                             "the supported class (polynomials and g(b*x))")
    return expression(out, constant)


def evaluate(a: Expr, x) -> Fraction:
    """The exact value of a polynomial `Expr` at rational ``x`` (the constant C counts as 0).

    Raises:
      ValueError: if a term holds sin/cos/exp (its value is not rational).
    """
    x = Fraction(x)
    total = Fraction(0)
    for t in a.terms:
        if t.func:
            raise ValueError(f"evaluate: expression holds {t.func}(.); only polynomials evaluate exactly")
        total += t.coef * x ** t.power
    return total


def _fmt_number(c: Fraction) -> str:
    return str(c.numerator) if c.denominator == 1 else f"{c.numerator}/{c.denominator}"


def _fmt_monomial(power: int) -> str:
    return "" if power == 0 else ("x" if power == 1 else f"x^{power}")


def _fmt_term_abs(t: Term) -> str:
    factors = []
    c = abs(t.coef)
    if t.power:
        factors.append(_fmt_monomial(t.power))
    if t.func:
        b = "" if t.inner_coef == 1 else _fmt_number(t.inner_coef) + "*"
        factors.append(f"{t.func}({b}{_fmt_monomial(t.inner_power) or '1'})")
    if c != 1 or not factors:
        factors.insert(0, _fmt_number(c))
    return "*".join(factors)


def format_expression(a: Expr) -> str:
    """The canonical text of an `Expr`, e.g. ``'3/2*x^2 - sin(2*x) + C'`` (what `parse_expression` reads)."""
    parts = []
    for i, t in enumerate(a.terms):
        body = _fmt_term_abs(t)
        if i == 0:
            parts.append(("-" if t.coef < 0 else "") + body)
        else:
            parts.append(("- " if t.coef < 0 else "+ ") + body)
    if a.has_constant:
        parts.append("+ C" if parts else "C")
    return " ".join(parts) if parts else "0"


_TOKEN = re.compile(r"\s*(?:(\d+)|(sin|cos|exp)|(x)|(C)|([-+*/^()]))")


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExpressionSyntaxError(f"unexpected character {text[pos:].lstrip()[:1]!r} at {pos} in {text!r}")
        tokens.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected=None):
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ExpressionSyntaxError(f"expected {expected or 'a token'} at token {self.i} of {self.text!r}, "
                                        f"got {tok!r}")
        self.i += 1
        return tok

    def number(self) -> Fraction:
        tok = self.take()
        if not tok.isdigit():
            raise ExpressionSyntaxError(f"expected a number at token {self.i - 1} of {self.text!r}, got {tok!r}")
        value = Fraction(int(tok))
        if self.peek() == "/":
            self.take("/")
            den = self.take()
            if not den.isdigit() or int(den) == 0:
                raise ExpressionSyntaxError(f"bad denominator {den!r} in {self.text!r}")
            value /= int(den)
        return value

    def monomial(self) -> int:
        self.take("x")
        if self.peek() == "^":
            self.take("^")
            tok = self.take()
            if not tok.isdigit():
                raise ExpressionSyntaxError(f"expected an integer exponent in {self.text!r}, got {tok!r}")
            return int(tok)
        return 1

    def term(self):
        """Returns a Term, or the string "C" for the constant of integration."""
        if self.peek() == "C":
            self.take("C")
            return "C"
        coef, power, func, b, p = Fraction(1), 0, "", Fraction(0), 0
        while True:
            tok = self.peek()
            if tok is not None and tok.isdigit():
                coef *= self.number()
            elif tok == "x":
                power += self.monomial()
            elif tok in ("sin", "cos", "exp"):
                if func:
                    raise ExpressionSyntaxError(f"two functions in one term of {self.text!r}")
                func = self.take()
                self.take("(")
                b = Fraction(1)
                if self.peek() is not None and self.peek().isdigit():
                    b = self.number()
                    self.take("*")
                p = self.monomial()
                self.take(")")
            else:
                raise ExpressionSyntaxError(f"expected a factor at token {self.i} of {self.text!r}, got {tok!r}")
            if self.peek() == "*":
                self.take("*")
                continue
            return Term(power, func, b, p, coef)

    def expression(self) -> Expr:
        terms, constant = [], False
        sign = Fraction(1)
        if self.peek() in ("+", "-"):
            sign = Fraction(-1) if self.take() == "-" else Fraction(1)
        while True:
            t = self.term()
            if t == "C":
                if sign < 0:
                    raise ExpressionSyntaxError(f"'- C' in {self.text!r}; write '+ C'")
                constant = True
            else:
                terms.append(dataclasses.replace(t, coef=t.coef * sign))
            tok = self.peek()
            if tok is None:
                break
            if tok not in ("+", "-"):
                raise ExpressionSyntaxError(f"expected '+' or '-' at token {self.i} of {self.text!r}, got {tok!r}")
            sign = Fraction(-1) if self.take() == "-" else Fraction(1)
        return expression(terms, constant)


def parse_expression(text: str) -> Expr:
    """Parses an expression of the grammar below into its canonical `Expr`.

    Grammar (whitespace free)::

        expr   := ["+" | "-"] term (("+" | "-") term)*
        term   := "C" | factor ("*" factor)*
        factor := NUMBER ["/" NUMBER] | "x" ["^" INT] | FUNC "(" [NUMBER ["/" NUMBER] "*"] "x" ["^" INT] ")"
        FUNC   := "sin" | "cos" | "exp"

    Equivalent forms parse to the same `Expr` (term order, unreduced products ``2*3*x``, fractions
    ``6/4``, factor order ``x^2*3``).

    Raises:
      ExpressionSyntaxError: (a ValueError) naming the position, for text outside the grammar.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ExpressionSyntaxError("empty expression")
    return _Parser(text).expression()


# ----------------------------------------------------------------------------------------------
# Rubrics, items, grades and the grader interface.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RubricLine:
    """One rubric checkpoint.

    Attributes:
      id: the line's name, unique within its rubric (e.g. ``"u'"``, ``"final"``).
      points: the points it awards when its criterion holds (> 0).
      criterion: the acceptance criterion in words (shown in prompts and feedback).
      steps: the labels of the answer steps it reads.
      check: ``check(parsed_steps) -> bool``, the machine form of the criterion over the parsed steps
        (a mapping label -> `Expr`); None for lines only an LLM can judge.
      error_note: the common error that loses this line (feedback text).
    """

    id: str
    points: float
    criterion: str
    steps: tuple[str, ...] = ()
    check: Callable[[Mapping[str, Expr]], bool] | None = dataclasses.field(default=None, compare=False)
    error_note: str = ""


def _validate_rubric(rubric: Sequence[RubricLine], name: str = "rubric") -> None:
    if not rubric:
        raise ValueError(f"{name} must hold at least one RubricLine, got none")
    ids = [line.id for line in rubric]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name} line ids must be unique, got {ids}")
    for line in rubric:
        if not isinstance(line, RubricLine):
            raise TypeError(f"{name} must hold RubricLine records, got {type(line).__name__}")
        if not (math.isfinite(line.points) and line.points > 0):
            raise ValueError(f"{name} line {line.id!r} points must be finite and > 0, got {line.points}")


@dataclasses.dataclass(frozen=True)
class GradingItem:
    """What a grader sees: the problem, the reference solution, the rubric and the answer text.

    Attributes:
      item_id: a unique id (student and problem).
      problem: the problem statement.
      reference_solution: the worked reference solution (text).
      rubric: the rubric lines.
      answer: the answer as the grader reads it (for an AI grader: the OCR text), one
        ``label = expression`` step per line.
      group: the problem's id, for per-item (per-problem) analysis.
    """

    item_id: str
    problem: str
    reference_solution: str
    rubric: tuple[RubricLine, ...]
    answer: str
    group: str = ""

    @property
    def max_points(self) -> float:
        return float(sum(line.points for line in self.rubric))


@dataclasses.dataclass(frozen=True)
class Grade:
    """A grader's output for one item.

    Attributes:
      total: the score, ``sum(awards)`` clipped to ``[0, max_points]`` (or a total-level rater's score).
      awards: per rubric line, in rubric order; None for a total-level rater.
      feedback: feedback lines referring to specific steps.
      lost_lines: ids of the rubric lines not (fully) awarded; None for a total-level rater.
      deferred: whether the grader flags the item for human review (unreadable work).
      confidence: in [0, 1]; the fraction of steps the grader could read (1 for a total-level rater).
    """

    total: float
    awards: tuple[float, ...] | None = None
    feedback: tuple[str, ...] = ()
    lost_lines: tuple[str, ...] | None = None
    deferred: bool = False
    confidence: float = 1.0


class Grader(Protocol):
    """A grader: ``grader(item, *, rng) -> Grade``; ``rng`` drives its run-to-run randomness."""

    def __call__(self, item: GradingItem, *, rng: np.random.Generator) -> Grade: ...


def make_grade(rubric: Sequence[RubricLine], awards: Sequence[float], *, feedback: Sequence[str] = (),
               deferred: bool = False, confidence: float = 1.0) -> Grade:
    """A `Grade` from per-line awards: each award checked against its line, total = sum clipped to the max.

    Raises:
      ValueError: naming the line when an award is outside ``[0, points]`` or not finite, or when the
        number of awards differs from the number of lines.
    """
    _validate_rubric(rubric)
    awards = [float(a) for a in awards]
    if len(awards) != len(rubric):
        raise ValueError(f"awards must have one entry per rubric line ({len(rubric)}), got {len(awards)}")
    for line, a in zip(rubric, awards):
        if not (math.isfinite(a) and 0.0 <= a <= line.points):
            raise ValueError(f"award for rubric line {line.id!r} must lie in [0, {line.points}], got {a}")
    max_points = float(sum(line.points for line in rubric))
    total = min(max(sum(awards), 0.0), max_points)
    lost = tuple(line.id for line, a in zip(rubric, awards) if a < line.points)
    return Grade(total=total, awards=tuple(awards), feedback=tuple(feedback), lost_lines=lost,
                 deferred=bool(deferred), confidence=float(confidence))


def parse_answer(text: str) -> dict[str, str]:
    """The steps of an answer: one ``label = expression`` per non-empty line -> {label: expression text}.

    A line without ``=`` is kept under the label ``"line<i>"`` (it can never satisfy a rubric line).
    """
    if not isinstance(text, str):
        raise TypeError(f"answer must be a str, got {type(text).__name__}")
    steps = {}
    for i, line in enumerate(l for l in text.splitlines() if l.strip()):
        label, sep, expr = line.partition("=")
        steps[label.strip() if sep else f"line{i}"] = expr.strip() if sep else line.strip()
    return steps


def rubric_prompt(item: GradingItem) -> str:
    """The structured, rubric-guided prompt a real LLM grader gets for ``item`` [INFERRED form, spec 13(b)].

    It asks for JSON ``{"awards": {line_id: {"awarded": points, "justification": text}}, "defer": bool}``,
    which `parse_grader_json` validates.
    """
    _validate_rubric(item.rubric, "item.rubric")
    lines = [f"- {line.id} ({line.points:g} pt): {line.criterion}"
             + (f" [reads steps: {', '.join(line.steps)}]" if line.steps else "")
             + (f" Common error: {line.error_note}" if line.error_note else "") for line in item.rubric]
    return "\n".join([
        "You grade a student's handwritten calculus answer (transcribed by OCR; treat OCR artefacts "
        "charitably and set \"defer\": true when work is unreadable).",
        f"Problem: {item.problem}",
        f"Reference solution: {item.reference_solution}",
        f"Rubric (total {item.max_points:g} points):",
        *lines,
        f"Student answer:\n{item.answer}",
        "Reply with JSON only: {\"awards\": {<line id>: {\"awarded\": <points>, \"justification\": <text "
        "citing the step>}}, \"defer\": <true|false>}. Award at most each line's points.",
    ])


def parse_grader_json(text: str, rubric: Sequence[RubricLine]) -> Grade:
    """Validates an LLM grader's JSON reply (see `rubric_prompt`) into a `Grade`.

    Raises:
      ValueError: on malformed JSON, a missing or unknown line id, or an award outside
        ``[0, points]`` (the message names the line).
    """
    _validate_rubric(rubric)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"grader reply must be JSON: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("awards"), dict):
        raise ValueError(f"grader reply must be an object with an 'awards' object, got {str(data)[:80]!r}")
    got = data["awards"]
    ids = [line.id for line in rubric]
    unknown = sorted(set(got) - set(ids))
    missing = [i for i in ids if i not in got]
    if unknown or missing:
        raise ValueError(f"grader reply awards must name exactly the rubric lines {ids}; "
                         f"unknown {unknown}, missing {missing}")
    awards, feedback = [], []
    for line in rubric:
        entry = got[line.id]
        value = entry.get("awarded") if isinstance(entry, dict) else entry
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"award for rubric line {line.id!r} must be a number, got {value!r}")
        awards.append(float(value))
        if isinstance(entry, dict) and entry.get("justification"):
            feedback.append(f"{line.id}: {entry['justification']}")
    return make_grade(rubric, awards, feedback=feedback, deferred=bool(data.get("defer", False)))


@dataclasses.dataclass(frozen=True)
class RubricGrader:
    """A rubric-following grader that parses the answer's steps and runs each line's check.

    Attributes:
      policy: for a line that reads an unreadable step (does not parse): ``"charitable"`` awards it
        (benefit of the doubt, as the paper's prompt asks for OCR artefacts), ``"strict"`` does not.
        Either way the item is flagged ``deferred``. A step that is absent earns nothing.
      flip_rate: probability that a line's award flips (full <-> none) at random in a run: the
        run-to-run stochasticity of an LLM on partial-credit ambiguity.
    """

    policy: str = "charitable"
    flip_rate: float = 0.0

    def __post_init__(self):
        if self.policy not in ("charitable", "strict"):
            raise ValueError(f"policy must be 'charitable' or 'strict', got {self.policy!r}")
        if not 0.0 <= self.flip_rate <= 1.0:
            raise ValueError(f"flip_rate must lie in [0, 1], got {self.flip_rate}")

    def __call__(self, item: GradingItem, *, rng: np.random.Generator) -> Grade:
        steps = parse_answer(item.answer)
        parsed, unreadable = {}, []
        for label, text in steps.items():
            try:
                parsed[label] = parse_expression(text)
            except ExpressionSyntaxError:
                unreadable.append(label)
        awards, feedback = [], []
        for line in item.rubric:
            if line.check is None:
                raise ValueError(f"RubricGrader needs a check on every rubric line; line {line.id!r} has none")
            bad = [s for s in line.steps if s in unreadable]
            absent = [s for s in line.steps if s not in steps]
            if bad:
                ok = self.policy == "charitable"
                note = f"could not read step {', '.join(bad)}; flagged for review"
            elif absent:
                ok, note = False, f"step {', '.join(absent)} missing"
            else:
                try:
                    ok = bool(line.check(parsed))
                except ValueError:  # the step lies outside what the check can compare (e.g. sin * cos)
                    ok = False
                shown = "; ".join(f"{s} = {steps[s]}" for s in line.steps)
                note = f"not met in '{shown}'" + (f" ({line.error_note})" if line.error_note else "")
            if self.flip_rate and rng.random() < self.flip_rate:
                ok = not ok
            awards.append(float(line.points) if ok else 0.0)
            if not ok:
                feedback.append(f"{line.id}: {line.criterion}: {note}")
            elif bad:
                feedback.append(f"{line.id}: {note}")
        confidence = 1.0 - len(unreadable) / max(len(steps), 1)
        return make_grade(item.rubric, awards, feedback=feedback, deferred=bool(unreadable),
                          confidence=confidence)


@dataclasses.dataclass(frozen=True)
class NoisyGrader:
    """A total-level simulated rater of known bias and noise: ``clip(floor(t + bias + noise_sd z + 1/2), 0, M)``.

    ``t`` is the true total (from ``true_score(item)``, an oracle the simulation supplies), ``z`` a
    standard normal, ``M`` the item's maximum; scores are integers (grid step 1).

    Attributes:
      bias: the planted additive bias (points).
      noise_sd: the planted noise standard deviation (points, >= 0).
      true_score: ``item -> true total``.
    """

    bias: float
    noise_sd: float
    true_score: Callable[[GradingItem], float] = dataclasses.field(compare=False, repr=False)

    def __post_init__(self):
        if not (math.isfinite(self.bias) and math.isfinite(self.noise_sd) and self.noise_sd >= 0):
            raise ValueError(f"bias must be finite and noise_sd finite and >= 0, got bias={self.bias}, "
                             f"noise_sd={self.noise_sd}")

    def score_distribution(self, true_total, max_points: int) -> np.ndarray:
        """``P(score = k)`` for ``k = 0..max_points``: shape ``(..., max_points + 1)`` for ``true_total`` ``(...)``."""
        t = np.asarray(true_total, np.float64)[..., None]
        mu = t + self.bias
        k = np.arange(max_points + 1, dtype=np.float64)
        if self.noise_sd == 0:
            s = np.clip(np.floor(mu + 0.5), 0, max_points)
            return (k == s).astype(np.float64)
        upper = np.where(k == max_points, np.inf, k + 0.5)
        lower = np.where(k == 0, -np.inf, k - 0.5)
        return special.ndtr((upper - mu) / self.noise_sd) - special.ndtr((lower - mu) / self.noise_sd)

    def expected_bias(self, true_total, max_points: int) -> np.ndarray:
        """``E[score] - t`` per item (the effective bias after rounding and clipping)."""
        p = self.score_distribution(true_total, max_points)
        return p @ np.arange(max_points + 1) - np.asarray(true_total, np.float64)

    def expected_mae(self, true_total, max_points: int) -> np.ndarray:
        """``E|score - t|`` per item."""
        t = np.asarray(true_total, np.float64)
        p = self.score_distribution(t, max_points)
        return (p * np.abs(np.arange(max_points + 1) - t[..., None])).sum(-1)

    def sample(self, true_total, max_points: int, rng: np.random.Generator) -> np.ndarray:
        """Scores for an array of true totals at once (the same law as ``__call__``)."""
        t = np.asarray(true_total, np.float64)
        s = np.floor(t + self.bias + self.noise_sd * rng.standard_normal(t.shape) + 0.5)
        return np.clip(s, 0, max_points)

    def __call__(self, item: GradingItem, *, rng: np.random.Generator) -> Grade:
        m = item.max_points
        if m != int(m):
            raise ValueError(f"NoisyGrader needs an integer max_points, got {m}")
        return Grade(total=float(self.sample(float(self.true_score(item)), int(m), rng)))


# ----------------------------------------------------------------------------------------------
# Aggregation of repeated runs.
# ----------------------------------------------------------------------------------------------

AGGREGATION_RULES = ("max", "min", "mean", "median", "mode", "first")


def aggregate_scores(scores, rule: str = "max") -> np.ndarray:
    """Aggregates repeated runs per item.

    Args:
      scores: ``(r, n)`` scores of ``r`` runs (or OCR variants) of ``n`` items.
      rule: ``"max"`` (the paper's max-rule [INFERRED semantics]: benefit of the doubt), ``"min"``,
        ``"mean"``, ``"median"``, ``"mode"`` (most frequent score; ties go to the lowest), ``"first"``
        (a single run).

    Returns:
      ``(n,)`` aggregated scores.
    """
    s = np.asarray(scores, np.float64)
    if s.ndim != 2 or s.shape[0] < 1:
        raise ValueError(f"scores must have shape (runs, items) with runs >= 1, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    if rule == "max":
        return s.max(0)
    if rule == "min":
        return s.min(0)
    if rule == "mean":
        return s.mean(0)
    if rule == "median":
        return np.median(s, 0)
    if rule == "first":
        return s[0].copy()
    if rule == "mode":
        out = np.empty(s.shape[1])
        for j in range(s.shape[1]):
            vals, counts = np.unique(s[:, j], return_counts=True)
            out[j] = vals[np.argmax(counts)]  # np.unique sorts, argmax takes the first (lowest) tie
        return out
    raise ValueError(f"rule must be one of {AGGREGATION_RULES}, got {rule!r}")


# ----------------------------------------------------------------------------------------------
# Agreement metrics.
# ----------------------------------------------------------------------------------------------


def _pair(a, b, names=("a", "b")) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"{names[0]} and {names[1]} must be 1-d of equal length, got shapes {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError(f"{names[0]} and {names[1]} must not be empty")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError(f"{names[0]} and {names[1]} must be finite")
    return a, b


def exact_agreement(a, b) -> float:
    """Fraction of items with ``a == b``."""
    a, b = _pair(a, b)
    return float(np.mean(a == b))


def within_agreement(a, b, tolerance: float) -> float:
    """Fraction of items with ``|a - b| <= tolerance`` (``tolerance = 0`` is exact agreement)."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be finite and >= 0, got {tolerance}")
    a, b = _pair(a, b)
    return float(np.mean(np.abs(a - b) <= tolerance + 1e-9))


def mean_absolute_error(a, b) -> float:
    """``mean |a - b|``."""
    a, b = _pair(a, b)
    return float(np.mean(np.abs(a - b)))


def mean_difference(a, b) -> float:
    """``mean (a - b)``: the bias of ``a`` relative to ``b``."""
    a, b = _pair(a, b)
    return float(np.mean(a - b))


@dataclasses.dataclass(frozen=True)
class BiasEstimate:
    """A mean paired difference with its standard error and a t confidence interval ``[lo, hi]``."""

    mean: float
    se: float
    lo: float
    hi: float
    n: int

    def covers(self, value: float) -> bool:
        return self.lo <= value <= self.hi


def bias_estimate(pred, reference, *, confidence: float = 0.95, num_comparisons: int = 1) -> BiasEstimate:
    """The bias ``mean(pred - reference)`` with a t interval, Bonferroni-adjusted for ``num_comparisons``.

    The interval has level ``1 - (1 - confidence) / num_comparisons`` so that ``num_comparisons``
    intervals hold jointly with probability >= ``confidence``. Items are taken as independent.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if num_comparisons < 1:
        raise ValueError(f"num_comparisons must be >= 1, got {num_comparisons}")
    a, b = _pair(pred, reference, ("pred", "reference"))
    if a.size < 2:
        raise ValueError(f"pred needs >= 2 items for a standard error, got {a.size}")
    d = a - b
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    q = float(stats.t.ppf(1 - (1 - confidence) / (2 * num_comparisons), d.size - 1))
    m = float(d.mean())
    return BiasEstimate(mean=m, se=se, lo=m - q * se, hi=m + q * se, n=int(d.size))


def _categories(a, b, categories):
    if categories is None:
        cats = np.unique(np.concatenate([a, b]))
    else:
        cats = np.asarray(categories, np.float64)
        if cats.ndim != 1 or cats.size == 0 or np.any(np.diff(cats) <= 0):
            raise ValueError(f"categories must be a non-empty increasing 1-d sequence, got {categories!r}")
    idx_a = np.searchsorted(cats, a)
    idx_b = np.searchsorted(cats, b)
    for name, x, idx in (("a", a, idx_a), ("b", b, idx_b)):
        ok = (idx < cats.size) & (cats[np.minimum(idx, cats.size - 1)] == x)
        if not np.all(ok):
            raise ValueError(f"{name} holds values outside categories: {np.unique(x[~ok])[:5].tolist()}")
    return cats, idx_a, idx_b


def quadratic_weighted_kappa(a, b, *, categories=None) -> float:
    """Cohen's kappa with quadratic weights ``w_ij = (i - j)^2`` over the score grid.

    ``kappa = 1 - sum(w * O) / sum(w * E)`` with ``O`` the observed joint distribution of
    ``(a, b)`` and ``E`` the product of its marginals. ``i, j`` index ``categories`` (default: the
    sorted distinct values of ``a`` and ``b``, as scikit-learn's ``cohen_kappa_score(...,
    weights="quadratic")``); pass the full grid (e.g. ``0..10``) so weights equal squared score
    differences. When the expected disagreement is 0 (both raters give one and the same score to
    every item) agreement is perfect and 1.0 is returned (scikit-learn returns NaN there).
    """
    a, b = _pair(a, b)
    cats, ia, ib = _categories(a, b, categories)
    c = cats.size
    observed = np.zeros((c, c))
    np.add.at(observed, (ia, ib), 1.0)
    observed /= a.size
    expected = np.outer(observed.sum(1), observed.sum(0))
    i = np.arange(c)
    w = (i[:, None] - i[None, :]).astype(np.float64) ** 2
    den = float((w * expected).sum())
    if den == 0.0:
        return 1.0
    return float(1.0 - (w * observed).sum() / den)


def agreement_report(pred, reference, *, categories=None, tolerance: float = 1.0,
                     groups: Sequence[str] | None = None) -> dict[str, Any]:
    """Exact and within-``tolerance`` agreement, MAE, bias and QWK of ``pred`` vs ``reference``.

    With ``groups`` (one label per item, e.g. the problem id) the same numbers per group are under
    ``"per_group"``.
    """
    a, b = _pair(pred, reference, ("pred", "reference"))
    out = {"n": int(a.size), "exact": exact_agreement(a, b), "within": within_agreement(a, b, tolerance),
           "tolerance": float(tolerance), "mae": mean_absolute_error(a, b), "bias": mean_difference(a, b),
           "qwk": quadratic_weighted_kappa(a, b, categories=categories)}
    if groups is not None:
        g = np.asarray(groups)
        if g.shape != a.shape:
            raise ValueError(f"groups must have one label per item ({a.size}), got shape {g.shape}")
        out["per_group"] = {str(k): agreement_report(a[g == k], b[g == k], categories=categories,
                                                     tolerance=tolerance) for k in np.unique(g)}
    return out


def rubric_line_report(pred_awards: Sequence[Sequence[float]], true_awards: Sequence[Sequence[float]],
                       line_ids: Sequence[Sequence[str]]) -> dict[str, dict[str, float]]:
    """Per-rubric-line analysis: for each line id (over the items whose rubric has it), the rate of
    agreement of the awarded points and the rates of over-award (pred > true) and under-award.

    Args:
      pred_awards, true_awards: per item, the awards in rubric order.
      line_ids: per item, the rubric's line ids (items may use different rubrics).
    """
    if not (len(pred_awards) == len(true_awards) == len(line_ids)):
        raise ValueError(f"pred_awards, true_awards and line_ids must have equal length, got "
                         f"{len(pred_awards)}, {len(true_awards)}, {len(line_ids)}")
    acc: dict[str, list] = {}
    for k, (p, t, ids) in enumerate(zip(pred_awards, true_awards, line_ids)):
        if not (len(p) == len(t) == len(ids)):
            raise ValueError(f"item {k}: pred_awards, true_awards and line_ids lengths differ: "
                             f"{len(p)}, {len(t)}, {len(ids)}")
        for pi, ti, lid in zip(p, t, ids):
            acc.setdefault(lid, []).append((float(pi), float(ti)))
    out = {}
    for lid, pairs in acc.items():
        arr = np.asarray(pairs)
        out[lid] = {"n": int(len(arr)), "agreement": float(np.mean(arr[:, 0] == arr[:, 1])),
                    "over_award": float(np.mean(arr[:, 0] > arr[:, 1])),
                    "under_award": float(np.mean(arr[:, 0] < arr[:, 1])),
                    "true_loss_rate": float(np.mean(arr[:, 1] < arr[:, 1].max()))}
    return out


def feedback_correct(pred_lost: Sequence[Sequence[str]], true_lost: Sequence[Sequence[str]]) -> np.ndarray:
    """Per item, whether the feedback names exactly the truly lost rubric lines (set equality)."""
    if len(pred_lost) != len(true_lost):
        raise ValueError(f"pred_lost and true_lost must have equal length, got {len(pred_lost)} and {len(true_lost)}")
    return np.array([set(p) == set(t) for p, t in zip(pred_lost, true_lost)], bool)


def deferral_curve(correct, confidence, thresholds) -> dict[str, np.ndarray]:
    """Retained fraction and accuracy when items with ``confidence < threshold`` go to a human.

    Args:
      correct: ``(n,)`` bool, whether the grader's score is right (by whatever criterion).
      confidence: ``(n,)`` the grader's confidence.
      thresholds: ``(k,)`` thresholds.

    Returns:
      ``{"threshold": (k,), "retained": (k,), "accuracy": (k,)}``; accuracy is NaN where nothing is retained.
    """
    c = np.asarray(correct, bool)
    conf = np.asarray(confidence, np.float64)
    if c.ndim != 1 or c.shape != conf.shape:
        raise ValueError(f"correct and confidence must be 1-d of equal length, got {c.shape} and {conf.shape}")
    th = np.asarray(thresholds, np.float64).reshape(-1)
    keep = conf[None, :] >= th[:, None]
    retained = keep.mean(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(keep.sum(1) > 0, (keep & c[None]).sum(1) / np.maximum(keep.sum(1), 1), np.nan)
    return {"threshold": th, "retained": retained, "accuracy": accuracy}


def evaluate_graders(scores: Mapping[str, Any], reference, *, categories=None, tolerance: float = 1.0,
                     confidence: float = 0.95, groups: Sequence[str] | None = None) -> dict[str, Any]:
    """The protocol on several graders at once: each grader against ``reference``, ranked, and their reliability.

    Args:
      scores: grader name -> ``(n,)`` scores.
      reference: ``(n,)`` reference scores (the truth in a simulation; TA grades in practice).
      categories: the score grid for QWK (e.g. ``0..10``).
      tolerance: the within-tolerance agreement's tolerance.
      confidence: joint confidence of the bias intervals (Bonferroni over the graders).
      groups: per-item labels for per-group (per-problem) agreement.

    Returns:
      ``{"graders": {name: agreement_report + "bias_ci": [lo, hi], "bias_se"}, "ranking": names by
      increasing MAE, "alpha_interval": Krippendorff's alpha among the graders, "icc21": ICC(2,1) among
      them, "error_variances": {name: Grubbs variance} (>= 3 graders)}``.
    """
    if not scores:
        raise ValueError("scores must name at least one grader, got none")
    names = list(scores)
    out: dict[str, Any] = {"graders": {}}
    for name in names:
        rep = agreement_report(scores[name], reference, categories=categories, tolerance=tolerance, groups=groups)
        est = bias_estimate(scores[name], reference, confidence=confidence, num_comparisons=len(names))
        rep |= {"bias_ci": [est.lo, est.hi], "bias_se": est.se}
        out["graders"][name] = rep
    out["ranking"] = sorted(names, key=lambda k: out["graders"][k]["mae"])
    if len(names) >= 2:
        x = np.stack([np.asarray(scores[k], np.float64) for k in names])
        out["alpha_interval"] = krippendorff_alpha(x, metric="interval")
        out["icc21"] = icc(x.T, kind="ICC(2,1)")
    if len(names) >= 3:
        out["error_variances"] = dict(zip(names, error_variances(x).tolist()))
    return out


# ----------------------------------------------------------------------------------------------
# Reliability among several (noisy) raters.
# ----------------------------------------------------------------------------------------------


def krippendorff_alpha(ratings, *, metric: str = "interval") -> float:
    """Krippendorff's alpha ``1 - D_o / D_e`` over raters with missing ratings.

    Computed from the coincidence matrix: within each unit with ``m_u >= 2`` ratings, every ordered
    pair of ratings by different raters adds ``1 / (m_u - 1)``. ``D_o`` is the coincidence-weighted
    mean of ``delta(c, k)`` and ``D_e`` the same over all pairs of pairable values.

    Args:
      ratings: ``(g, n)`` raters x units, NaN where a rater did not rate a unit.
      metric: ``"interval"`` (``delta = (c - k)^2``) or ``"nominal"`` (``delta = [c != k]``).

    Returns:
      alpha; 1.0 when the pairable values show no variation at all (D_e = 0).
    """
    r = np.asarray(ratings, np.float64)
    if r.ndim != 2:
        raise ValueError(f"ratings must have shape (raters, units), got shape {r.shape}")
    if metric not in ("interval", "nominal"):
        raise ValueError(f"metric must be 'interval' or 'nominal', got {metric!r}")
    m_u = np.sum(~np.isnan(r), axis=0)
    r = r[:, m_u >= 2]
    m_u = m_u[m_u >= 2]
    if r.shape[1] == 0:
        raise ValueError("ratings must have at least one unit rated by >= 2 raters")
    values = np.unique(r[~np.isnan(r)])
    v = values.size
    counts = np.stack([np.sum(r == val, axis=0) for val in values])  # (v, units)
    coinc = (counts[:, None, :] * counts[None, :, :]).astype(np.float64)
    idx = np.arange(v)
    coinc[idx, idx, :] -= counts
    o = (coinc / (m_u - 1)[None, None, :]).sum(-1)  # (v, v)
    n_c = o.sum(1)
    n = n_c.sum()
    if metric == "interval":
        delta = (values[:, None] - values[None, :]) ** 2
    else:
        delta = (values[:, None] != values[None, :]).astype(np.float64)
    d_o = float((o * delta).sum() / n)
    d_e = float((np.outer(n_c, n_c) * delta).sum() / (n * (n - 1)))
    if d_e == 0.0:
        return 1.0
    return 1.0 - d_o / d_e


def icc(ratings, *, kind: str = "ICC(2,1)") -> float:
    """Shrout & Fleiss intraclass correlation of complete ratings ``(n, g)`` (units x raters).

    ``"ICC(1,1)"`` one-way random, ``"ICC(2,1)"`` two-way random absolute agreement (single rater),
    ``"ICC(3,1)"`` two-way mixed consistency, from the two-way ANOVA mean squares.
    """
    x = np.asarray(ratings, np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise ValueError(f"ratings must have shape (units >= 2, raters >= 2), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("ratings must be complete and finite (ICC needs every rater on every unit)")
    n, k = x.shape
    grand = x.mean()
    ss_rows = k * ((x.mean(1) - grand) ** 2).sum()
    ss_cols = n * ((x.mean(0) - grand) ** 2).sum()
    ss_total = ((x - grand) ** 2).sum()
    ss_err = ss_total - ss_rows - ss_cols
    bms = ss_rows / (n - 1)
    jms = ss_cols / (k - 1)
    ems = ss_err / ((n - 1) * (k - 1))
    wms = (ss_cols + ss_err) / (n * (k - 1))
    if kind == "ICC(1,1)":
        return float((bms - wms) / (bms + (k - 1) * wms))
    if kind == "ICC(2,1)":
        return float((bms - ems) / (bms + (k - 1) * ems + k * (jms - ems) / n))
    if kind == "ICC(3,1)":
        return float((bms - ems) / (bms + (k - 1) * ems))
    raise ValueError(f"kind must be 'ICC(1,1)', 'ICC(2,1)' or 'ICC(3,1)', got {kind!r}")


def error_variances(ratings) -> np.ndarray:
    """Each rater's error variance without ground truth (Grubbs' estimator, ``g >= 3`` raters).

    Under ``x_gi = t_i + b_g + e_gi`` with independent errors of variance ``s_g^2``,
    ``Cov(x_g - x_h, x_g - x_k) = s_g^2`` for distinct ``g, h, k``; the estimate of ``s_g^2`` is the mean
    of the sample covariances over all pairs ``h < k`` of the other raters.

    Args:
      ratings: ``(g, n)`` complete ratings, raters x units.

    Returns:
      ``(g,)`` error variances (may be slightly negative for an almost noiseless rater).
    """
    x = np.asarray(ratings, np.float64)
    if x.ndim != 2 or x.shape[0] < 3 or x.shape[1] < 3:
        raise ValueError(f"ratings must have shape (raters >= 3, units >= 3), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("ratings must be complete and finite")
    g = x.shape[0]
    cov = np.cov(x)  # (g, g)
    out = np.empty(g)
    for a in range(g):
        others = [h for h in range(g) if h != a]
        vals = [cov[a, a] - cov[a, h] - cov[a, k] + cov[h, k]
                for i, h in enumerate(others) for k in others[i + 1:]]
        out[a] = np.mean(vals)
    return out
