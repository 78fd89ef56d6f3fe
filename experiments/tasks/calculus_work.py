"""Generated graded calculus work: problems, rubrics, student answers with planted errors, OCR noise.

A stand-in for the paper's handwritten quiz answers (spec ``rl_alignment_agents.md`` section 13(d)),
built without sympy from closed forms in the exact term algebra of
:mod:`algorithms.agents.calculus_grading` (terms ``c x^k g(b x^p)``, rational coefficients). Every
problem is worth 10 points. Four templates:

* ``product``: differentiate ``a x^m g(b x)`` (g in sin, cos, exp). Steps ``u'``, ``v'``, ``f'``.
  Rubric: ``u'`` 3 (power rule), ``v'`` 3 (chain factor and sign), ``combine`` 3 (``f' = u'v + uv'``
  with the student's own ``u', v'``: follow-through credit), ``final`` 1 (correct answer).
* ``chain``: differentiate ``a g(b x^p)``. Steps ``inner'``, ``outer'``, ``f'``. Rubric ``inner'`` 3,
  ``outer'`` 3, ``combine`` 3 (``f' = inner' * outer'`` with the student's own steps), ``final`` 1.
* ``definite``: ``int_0^L p(x) dx`` for a polynomial ``p``. Steps ``F``, ``value``. Rubric
  ``antiderivative`` 5, ``evaluation`` 3 (``value = F(L) - F(0)`` with the student's own ``F``),
  ``final`` 2.
* ``indefinite``: ``int a g(b x) dx``. Step ``F``. Rubric ``factor`` 4 (the ``1/b`` substitution
  factor), ``sign`` 3, ``constant`` 2 (``+ C``), ``final`` 1.

Planted errors and the rubric line each one loses (``final`` is lost whenever any error is planted;
the generator re-draws an error variant that would accidentally give the right final answer):

==================  ======================================================================
error type          lost line, by template
==================  ======================================================================
``power_rule``      product ``u'``; chain ``inner'``; definite ``antiderivative``
``chain_rule``      product ``v'`` (inner factor dropped); chain ``combine`` (``f' = outer'``);
                    indefinite ``factor``
``sign_slip``       product ``v'``; chain ``outer'``; indefinite ``sign`` (sin and cos only)
``product_rule``    product ``combine`` (``f' = u'v'``)
``arithmetic``      product and chain ``combine`` (a coefficient off by one); definite
                    ``evaluation`` (value off by 1 or 2)
``dropped_constant`` indefinite ``constant``
==================  ======================================================================

So the true grade of every answer is known exactly from the planted errors (`Submission.true_awards`).
Students differ in ability: an applicable error is planted with probability
``sigmoid(logit(error_rate) - ability_scale * theta)``, ``theta ~ N(0, 1)`` per student. Answers are
written in equivalent but non-canonical forms at rate ``rewrite_rate`` (shuffled terms and factors,
unreduced products ``3*4*x``, unreduced fractions ``6/4``), which a grader must recognise as equal.

`ocr_corrupt` simulates OCR of handwriting: each step is hit with probability ``step_rate`` by one
artefact, a *misread* (a confusable digit, 1<->7, 3<->8, ..., or a lost minus sign: parses into a
different expression) or an *unreadable* glyph (``?``, a dropped ``*``, ``^`` or parenthesis: does not
parse).

Example:
    >>> task = CalculusWorkTask(num_students=3, problems_per_template=1, seed=0)
    >>> subs = task.submissions()
    >>> len(subs), subs[0].item.max_points
    (12, 10.0)
    >>> sorted({s.problem.template for s in subs})
    ['chain', 'definite', 'indefinite', 'product']
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Callable, Mapping

import numpy as np

from algorithms.agents import calculus_grading as cg

__all__ = ["TEMPLATES", "ERROR_TYPES", "Problem", "Submission", "CalculusWorkTask", "make_problem",
           "student_steps", "write_answer", "ocr_corrupt", "error_line"]

TEMPLATES = ("product", "chain", "definite", "indefinite")
ERROR_TYPES = ("power_rule", "chain_rule", "sign_slip", "product_rule", "arithmetic", "dropped_constant")

_ERROR_LINES = {
    "product": {"power_rule": "u'", "chain_rule": "v'", "sign_slip": "v'", "product_rule": "combine",
                "arithmetic": "combine"},
    "chain": {"power_rule": "inner'", "sign_slip": "outer'", "chain_rule": "combine", "arithmetic": "combine"},
    "definite": {"power_rule": "antiderivative", "arithmetic": "evaluation"},
    "indefinite": {"chain_rule": "factor", "sign_slip": "sign", "dropped_constant": "constant"},
}


def error_line(template: str, error: str) -> str:
    """The rubric line that ``error`` loses in ``template`` (besides ``final``)."""
    if template not in _ERROR_LINES:
        raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
    if error not in _ERROR_LINES[template]:
        raise ValueError(f"error {error!r} does not apply to template {template!r}; "
                         f"applicable: {sorted(_ERROR_LINES[template])}")
    return _ERROR_LINES[template][error]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One quiz problem.

    Attributes:
      problem_id: e.g. ``"product-0"``.
      template: one of `TEMPLATES`.
      statement: the problem text.
      reference_steps: ``(label, expression)`` pairs of the reference solution, canonical text.
      rubric: the rubric lines (10 points in all).
      errors: the error types that apply (see the table in the module docstring).
      params: the template's parameters (a, b, m, p, g, L, polynomial, ...).
    """

    problem_id: str
    template: str
    statement: str
    reference_steps: tuple[tuple[str, str], ...]
    rubric: tuple[cg.RubricLine, ...]
    errors: tuple[str, ...]
    params: Mapping = dataclasses.field(compare=False)

    @property
    def reference_solution(self) -> str:
        return "\n".join(f"{k} = {v}" for k, v in self.reference_steps)


@dataclasses.dataclass(frozen=True)
class Submission:
    """A student's answer to a problem with its exactly known grade.

    Attributes:
      item: the `GradingItem` with the clean answer text.
      problem: the problem.
      student: the student's index.
      errors: the planted error types.
      true_awards: per rubric line (rubric order), the true awarded points.
      true_total: their sum.
      true_lost: ids of the lost rubric lines.
    """

    item: cg.GradingItem
    problem: Problem
    student: int
    errors: tuple[str, ...]
    true_awards: tuple[float, ...]
    true_total: float
    true_lost: tuple[str, ...]


def _e(*terms, constant=False) -> cg.Expr:
    return cg.expression(list(terms), constant)


def _fmt(e: cg.Expr) -> str:
    return cg.format_expression(e)


_GPRIME = {"sin": (1, "cos"), "cos": (-1, "sin"), "exp": (1, "exp")}
_GANTI = {"sin": (-1, "cos"), "cos": (1, "sin"), "exp": (1, "exp")}


def _single(e: cg.Expr):
    return e.terms[0] if len(e.terms) == 1 else None


def make_problem(template: str, rng: np.random.Generator, index: int = 0) -> Problem:
    """A random problem of ``template`` with its reference solution and rubric."""
    pid = f"{template}-{index}"
    if template == "product":
        a, m, b = int(rng.integers(2, 7)), int(rng.integers(2, 6)), int(rng.integers(2, 6))
        g = str(rng.choice(["sin", "cos", "exp"]))
        u, v = _e((a, m)), _e((1, 0, g, b, 1))
        f = cg.multiply(u, v)
        du, dv, df = cg.derivative(u), cg.derivative(v), cg.derivative(f)
        rubric = (
            cg.RubricLine("u'", 3, f"u' is the derivative of u = {_fmt(u)} (power rule)", ("u'",),
                          lambda s, du=du: s["u'"] == du, "multiply by the exponent, then lower it by one"),
            cg.RubricLine("v'", 3, f"v' is the derivative of v = {_fmt(v)} (chain factor and sign)", ("v'",),
                          lambda s, dv=dv: s["v'"] == dv, "keep the inner derivative; d/dx cos = -sin"),
            cg.RubricLine("combine", 3, "f' = u'v + uv' with your u' and v' (product rule)", ("u'", "v'", "f'"),
                          lambda s, u=u, v=v: s["f'"] == cg.add(cg.multiply(s["u'"], v), cg.multiply(u, s["v'"])),
                          "the product rule is u'v + uv', not u'v'"),
            cg.RubricLine("final", 1, f"final answer f' = {_fmt(df)}", ("f'",), lambda s, df=df: s["f'"] == df),
        )
        errors = ("power_rule", "chain_rule", "product_rule", "arithmetic") + (("sign_slip",) if g != "exp" else ())
        steps = (("u'", _fmt(du)), ("v'", _fmt(dv)), ("f'", _fmt(df)))
        statement = f"Differentiate f(x) = {_fmt(f)} (u = {_fmt(u)}, v = {_fmt(v)})."
        params = dict(a=a, m=m, b=b, g=g, u=u, v=v, du=du, dv=dv, df=df)
    elif template == "chain":
        a, b, p = int(rng.integers(2, 7)), int(rng.integers(2, 6)), int(rng.integers(2, 5))
        g = str(rng.choice(["sin", "cos", "exp"]))
        f = _e((a, 0, g, b, p))
        sgn, gp = _GPRIME[g]
        d_inner, d_outer = _e((b * p, p - 1)), _e((sgn * a, 0, gp, b, p))
        df = cg.derivative(f)
        rubric = (
            cg.RubricLine("inner'", 3, f"inner' is the derivative of the inner function {b}*x^{p}", ("inner'",),
                          lambda s, d=d_inner: s["inner'"] == d, "power rule on the inner function"),
            cg.RubricLine("outer'", 3, f"outer' = derivative of the outer function at the inner one, "
                          f"{_fmt(d_outer)}", ("outer'",), lambda s, d=d_outer: s["outer'"] == d,
                          "d/dx sin = cos, d/dx cos = -sin"),
            cg.RubricLine("combine", 3, "f' = inner' * outer' with your steps (chain rule)",
                          ("inner'", "outer'", "f'"),
                          lambda s: s["f'"] == cg.multiply(s["inner'"], s["outer'"]),
                          "the chain rule multiplies by the inner derivative"),
            cg.RubricLine("final", 1, f"final answer f' = {_fmt(df)}", ("f'",), lambda s, df=df: s["f'"] == df),
        )
        errors = ("power_rule", "chain_rule", "arithmetic") + (("sign_slip",) if g != "exp" else ())
        steps = (("inner'", _fmt(d_inner)), ("outer'", _fmt(d_outer)), ("f'", _fmt(df)))
        statement = f"Differentiate f(x) = {_fmt(f)}."
        params = dict(a=a, b=b, p=p, g=g, d_inner=d_inner, d_outer=d_outer, df=df)
    elif template == "definite":
        k = int(rng.integers(2, 4))
        powers = sorted(rng.choice(4, size=k, replace=False).tolist())
        if max(powers) == 0:
            powers[-1] = 1
        poly = _e(*[(int(rng.integers(1, 7)), pw) for pw in powers])
        upper = int(rng.integers(2, 4))
        big_f = cg.antiderivative(poly, constant=False)
        value = cg.evaluate(big_f, upper) - cg.evaluate(big_f, 0)
        val_e = _e((value, 0))

        def _eval_ok(s, upper=upper):
            vt = s["value"]
            if any(t.power or t.func for t in vt.terms) or vt.has_constant:
                return False
            return cg.evaluate(vt, 0) == cg.evaluate(s["F"], upper) - cg.evaluate(s["F"], 0)

        rubric = (
            cg.RubricLine("antiderivative", 5, f"F is an antiderivative of {_fmt(poly)} (power rule)", ("F",),
                          lambda s, bf=big_f: dataclasses.replace(s["F"], has_constant=False) == bf,
                          "raise the power by one and divide by the new power"),
            cg.RubricLine("evaluation", 3, f"value = F({upper}) - F(0) with your F", ("F", "value"), _eval_ok,
                          "arithmetic when evaluating F"),
            cg.RubricLine("final", 2, f"final value {_fmt(val_e)}", ("value",), lambda s, ve=val_e: s["value"] == ve),
        )
        errors = ("power_rule", "arithmetic")
        steps = (("F", _fmt(big_f)), ("value", _fmt(val_e)))
        statement = f"Compute the integral of {_fmt(poly)} from 0 to {upper}."
        params = dict(poly=poly, upper=upper, F=big_f, value=value)
    elif template == "indefinite":
        a, b = int(rng.integers(1, 7)), int(rng.integers(2, 6))
        g = str(rng.choice(["sin", "cos", "exp"]))
        sgn, gi = _GANTI[g]
        big_f = _e((Fraction(sgn * a, b), 0, gi, b, 1), constant=True)
        target = big_f.terms[0]

        def _factor_ok(s, t=target):
            x = _single(dataclasses.replace(s["F"], has_constant=False))
            return x is not None and x.key == t.key and abs(x.coef) == abs(t.coef)

        def _sign_ok(s, t=target):
            x = _single(dataclasses.replace(s["F"], has_constant=False))
            return x is not None and x.key == t.key and (x.coef > 0) == (t.coef > 0)

        rubric = (
            cg.RubricLine("factor", 4, f"the substitution factor 1/{b} (|coefficient| {_fmt(_e((abs(target.coef), 0)))})",
                          ("F",), _factor_ok, f"divide by the inner derivative {b}"),
            cg.RubricLine("sign", 3, f"the sign of the antiderivative of {g}", ("F",), _sign_ok,
                          "the antiderivative of sin is -cos"),
            cg.RubricLine("constant", 2, "the constant of integration + C", ("F",), lambda s: s["F"].has_constant,
                          "an indefinite integral needs + C"),
            cg.RubricLine("final", 1, f"final answer {_fmt(big_f)}", ("F",), lambda s, bf=big_f: s["F"] == bf),
        )
        errors = ("chain_rule", "dropped_constant") + (("sign_slip",) if g != "exp" else ())
        steps = (("F", _fmt(big_f)),)
        statement = f"Find the indefinite integral of {_fmt(_e((a, 0, g, b, 1)))}."
        params = dict(a=a, b=b, g=g, F=big_f)
    else:
        raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
    assert sum(line.points for line in rubric) == 10, template
    return Problem(pid, template, statement, steps, rubric, errors, params)


def _off_by(e: cg.Expr, rng: np.random.Generator) -> cg.Expr:
    """``e`` with one coefficient changed by +-1 (a term may vanish)."""
    terms = list(e.terms)
    i = int(rng.integers(len(terms)))
    delta = Fraction(int(rng.choice([-1, 1])))
    terms[i] = dataclasses.replace(terms[i], coef=terms[i].coef + delta)
    return cg.expression(terms, e.has_constant)


def _student_once(problem: Problem, errors: set, rng: np.random.Generator) -> dict[str, cg.Expr]:
    q, t = problem.params, problem.template
    if t == "product":
        a, m, b, g = q["a"], q["m"], q["b"], q["g"]
        du = q["du"]
        if "power_rule" in errors:
            du = _e((a * m, m)) if rng.random() < 0.5 else _e((a, m - 1))
        sgn, gp = _GPRIME[g]
        coef = Fraction(sgn * b)
        if "chain_rule" in errors:
            coef /= b
        if "sign_slip" in errors:
            coef = -coef
        dv = _e((coef, 0, gp, b, 1))
        if "product_rule" in errors:
            df = cg.multiply(du, dv)
        else:
            df = cg.add(cg.multiply(du, q["v"]), cg.multiply(q["u"], dv))
        if "arithmetic" in errors:
            df = _off_by(df, rng)
        return {"u'": du, "v'": dv, "f'": df}
    if t == "chain":
        a, b, p, g = q["a"], q["b"], q["p"], q["g"]
        di = q["d_inner"]
        if "power_rule" in errors:
            di = _e((b * p, p)) if rng.random() < 0.5 else _e((b, p - 1))
        do = q["d_outer"]
        if "sign_slip" in errors:
            do = cg.scale(do, -1)
        df = do if "chain_rule" in errors else cg.multiply(di, do)
        if "arithmetic" in errors:
            df = _off_by(df, rng)
        return {"inner'": di, "outer'": do, "f'": df}
    if t == "definite":
        big_f = q["F"]
        if "power_rule" in errors:
            poly = q["poly"]
            cands = [s for s in poly.terms if s.power >= 1]
            s = cands[int(rng.integers(len(cands)))]
            wrong = (_e((s.coef, s.power + 1)) if rng.random() < 0.5 else _e((s.coef / (s.power + 1), s.power)))
            right = _e((s.coef / (s.power + 1), s.power + 1))
            big_f = cg.add(cg.add(big_f, cg.scale(right, -1)), wrong)
        value = cg.evaluate(big_f, q["upper"]) - cg.evaluate(big_f, 0)
        if "arithmetic" in errors:
            value += int(rng.choice([-2, -1, 1, 2]))
        return {"F": big_f, "value": _e((value, 0))}
    if t == "indefinite":
        a, b, g = q["a"], q["b"], q["g"]
        target = q["F"].terms[0]
        coef = target.coef
        if "chain_rule" in errors:
            coef = coef * b * (b if rng.random() < 0.5 else 1)  # forgot 1/b, or multiplied by b
        if "sign_slip" in errors:
            coef = -coef
        return {"F": _e(dataclasses.replace(target, coef=coef), constant="dropped_constant" not in errors)}
    raise ValueError(f"unknown template {t!r}")


def _final_label(problem: Problem) -> str:
    return {"product": "f'", "chain": "f'", "definite": "value", "indefinite": "F"}[problem.template]


def _reference_final(problem: Problem) -> cg.Expr:
    return cg.parse_expression(dict(problem.reference_steps)[_final_label(problem)])


def student_steps(problem: Problem, errors, rng: np.random.Generator, *, max_tries: int = 50) -> dict[str, cg.Expr]:
    """The student's steps (label -> `Expr`) with ``errors`` planted, follow-through from earlier steps.

    An error variant that would leave the final answer right (e.g. an off-by-one that cancels another
    error) is re-drawn, so that the ``final`` line is lost exactly when some error is planted.
    """
    errors = set(errors)
    bad = errors - set(problem.errors)
    if bad:
        raise ValueError(f"errors {sorted(bad)} do not apply to {problem.problem_id}; applicable: {problem.errors}")
    ref = _reference_final(problem)
    for _ in range(max_tries):
        steps = _student_once(problem, errors, rng)
        if (steps[_final_label(problem)] == ref) == (not errors):
            return steps
    raise RuntimeError(f"could not plant errors {sorted(errors)} in {problem.problem_id} with a wrong final answer")


def _factorizations(n: int) -> list[tuple[int, int]]:
    return [(d, n // d) for d in range(2, int(math.isqrt(n)) + 1) if n % d == 0]


def _write_coef(c: Fraction, rng: np.random.Generator, rate: float) -> str:
    if c.denominator != 1:
        k = int(rng.integers(2, 4)) if rng.random() < rate else 1
        return f"{c.numerator * k}/{c.denominator * k}"
    n = c.numerator
    pairs = _factorizations(n)
    if pairs and rng.random() < rate:
        d, e = pairs[int(rng.integers(len(pairs)))]
        return f"{d}*{e}"
    return str(n)


def _write_term(t: cg.Term, rng: np.random.Generator, rate: float) -> str:
    factors = []
    if t.power:
        factors.append("x" if t.power == 1 else f"x^{t.power}")
    if t.func:
        b = "" if t.inner_coef == 1 else f"{_write_coef(t.inner_coef, rng, 0.0)}*"
        inner = "x" if t.inner_power == 1 else f"x^{t.inner_power}"
        factors.append(f"{t.func}({b}{inner})")
    c = abs(t.coef)
    if c != 1 or not factors:
        factors.insert(0, _write_coef(c, rng, rate))
    if len(factors) > 1 and rng.random() < rate:
        factors = [factors[i] for i in rng.permutation(len(factors))]
    return "*".join(factors)


def write_answer(steps: Mapping[str, cg.Expr], rng: np.random.Generator, *, rewrite_rate: float = 0.3) -> str:
    """The answer text, one ``label = expression`` per step, in equivalent non-canonical forms at ``rewrite_rate``."""
    lines = []
    for label, e in steps.items():
        terms = list(e.terms)
        if len(terms) > 1 and rng.random() < rewrite_rate:
            terms = [terms[i] for i in rng.permutation(len(terms))]
        parts = []
        for i, t in enumerate(terms):
            body = _write_term(t, rng, rewrite_rate)
            parts.append(("-" if t.coef < 0 else "") + body if i == 0 else ("- " if t.coef < 0 else "+ ") + body)
        if e.has_constant:
            parts.append("+ C" if parts else "C")
        lines.append(f"{label} = {' '.join(parts) if parts else '0'}")
    return "\n".join(lines)


_CONFUSABLE = {"0": "8", "1": "7", "2": "7", "3": "8", "4": "9", "5": "6", "6": "5", "7": "1", "8": "3", "9": "4"}


def _misread(expr: str, rng: np.random.Generator) -> str:
    digits = [i for i, ch in enumerate(expr) if ch.isdigit()]
    if digits and rng.random() < 0.8:
        i = digits[int(rng.integers(len(digits)))]
        return expr[:i] + _CONFUSABLE[expr[i]] + expr[i + 1:]
    return expr[1:].lstrip() if expr.startswith("-") else "-" + expr


def _unreadable(expr: str, rng: np.random.Generator) -> str:
    drop = [i for i, ch in enumerate(expr) if ch in "*^()"]
    if drop and rng.random() < 0.5:
        i = drop[int(rng.integers(len(drop)))]
        return expr[:i] + expr[i + 1:]
    i = int(rng.integers(len(expr) + 1))
    return expr[:i] + str(rng.choice(["?", "~", "#"])) + expr[i:]


def ocr_corrupt(text: str, rng: np.random.Generator, *, step_rate: float, misread_fraction: float = 0.5) -> str:
    """OCR artefacts: each step's expression is hit with probability ``step_rate`` by a misread
    (probability ``misread_fraction``) or an unreadable glyph; labels are kept."""
    if not 0.0 <= step_rate <= 1.0:
        raise ValueError(f"step_rate must lie in [0, 1], got {step_rate}")
    if not 0.0 <= misread_fraction <= 1.0:
        raise ValueError(f"misread_fraction must lie in [0, 1], got {misread_fraction}")
    out = []
    for line in text.splitlines():
        label, sep, expr = line.partition(" = ")
        if sep and rng.random() < step_rate:
            expr = _misread(expr, rng) if rng.random() < misread_fraction else _unreadable(expr, rng)
        out.append(f"{label}{sep}{expr}")
    return "\n".join(out)


@dataclasses.dataclass(frozen=True)
class CalculusWorkTask:
    """A generated quiz: ``problems_per_template`` problems of each template, answered by every student.

    Attributes:
      num_students: students (each answers every problem).
      problems_per_template: problems per template.
      error_rate: probability of each applicable error for an average student.
      ability_scale: spread of student ability on the logit scale.
      rewrite_rate: rate of equivalent non-canonical writing.
      seed: the generator's seed (problems and answers are deterministic given it).
    """

    num_students: int = 50
    problems_per_template: int = 1
    error_rate: float = 0.2
    ability_scale: float = 1.0
    rewrite_rate: float = 0.3
    seed: int = 0

    def __post_init__(self):
        if self.num_students < 1 or self.problems_per_template < 1:
            raise ValueError(f"num_students and problems_per_template must be >= 1, got {self.num_students}, "
                             f"{self.problems_per_template}")
        if not 0.0 < self.error_rate < 1.0:
            raise ValueError(f"error_rate must lie in (0, 1), got {self.error_rate}")
        if not 0.0 <= self.rewrite_rate <= 1.0:
            raise ValueError(f"rewrite_rate must lie in [0, 1], got {self.rewrite_rate}")

    def problems(self) -> list[Problem]:
        rng = np.random.default_rng([self.seed, 1])
        return [make_problem(t, rng, i) for i in range(self.problems_per_template) for t in TEMPLATES]

    def submissions(self) -> list[Submission]:
        problems = self.problems()
        rng = np.random.default_rng([self.seed, 2])
        ability = rng.standard_normal(self.num_students)
        logit = math.log(self.error_rate / (1 - self.error_rate))
        out = []
        for s in range(self.num_students):
            p_err = 1.0 / (1.0 + math.exp(-(logit - self.ability_scale * ability[s])))
            for prob in problems:
                errors = tuple(e for e in prob.errors if rng.random() < p_err)
                steps = student_steps(prob, errors, rng)
                answer = write_answer(steps, rng, rewrite_rate=self.rewrite_rate)
                lost = {error_line(prob.template, e) for e in errors} | ({"final"} if errors else set())
                awards = tuple(0.0 if line.id in lost else float(line.points) for line in prob.rubric)
                item = cg.GradingItem(item_id=f"s{s}-{prob.problem_id}", problem=prob.statement,
                                      reference_solution=prob.reference_solution, rubric=prob.rubric,
                                      answer=answer, group=prob.problem_id)
                out.append(Submission(item=item, problem=prob, student=s, errors=errors, true_awards=awards,
                                      true_total=float(sum(awards)),
                                      true_lost=tuple(line.id for line in prob.rubric if line.id in lost)))
        return out
