"""Machine-readable checks of a paper's claim: what an experiment measured against what the paper says.

An experiment returns its checks in ``metrics["checks"]`` (a list of dicts, see `Check.as_dict`), so
``result.json`` says per claim: the measured value, the paper's value or direction, the threshold
fixed before the run, and whether it passed. An experiment made of several studies returns one `Study`
per study (its checks, the numbers its verdict reports, its metrics and figures); its ``run`` composes them.

Example:
    >>> c = Check("tokens per iteration, Vegas / StreamingLLM", measured=1.31, paper="1.15-1.29x",
    ...           threshold=">= 1.15", passed=1.31 >= 1.15)
    >>> c.as_dict()["passed"], c.line()
    (True, 'tokens per iteration, Vegas / StreamingLLM: 1.31 (paper 1.15-1.29x; pass if >= 1.15): PASS')
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

__all__ = ["Check", "Study", "verdict", "CAUSES", "binomial_se"]

# Why a claim did not reproduce (issue 33): the class an experiment names beside its reason. A run
# returns it as ``run(...)["cause"]`` (None when reproduced); result.json and the README catalog show it.
CAUSES = {
    "scale": "scale limit (method right, setting too small)",
    "check": "check stricter than the paper's statement",
    "bug": "bug in our code",
    "spec": "spec doubtful (the spec's inferred part; the paper says otherwise or nothing)",
}


@dataclasses.dataclass(frozen=True)
class Check:
    """One claim check.

    Attributes:
      name: what is compared (the paper's statement, in a few words).
      measured: the value this run measured.
      paper: the paper's value or direction.
      threshold: the pass rule fixed in advance (text, e.g. ">= 1.15").
      passed: whether ``measured`` meets ``threshold``.
      note: context (workload, setting) or why the check is weak.
      required: whether the check decides the verdict; a non-required check (diagnostic, secondary
        claim) is reported in the sentence and in ``result.json`` but does not decide.
    """

    name: str
    measured: Any
    paper: str
    threshold: str
    passed: bool
    note: str = ""
    required: bool = True

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["passed"] = bool(self.passed)
        d["required"] = bool(self.required)
        return d

    def line(self) -> str:
        m = f"{self.measured:.3g}" if isinstance(self.measured, float) else str(self.measured)
        note = f" [{self.note}]" if self.note else ""
        info = "" if self.required else " (not required)"
        return (f"{self.name}: {m} (paper {self.paper}; pass if {self.threshold}): "
                f"{'PASS' if self.passed else 'FAIL'}{info}{note}")


@dataclasses.dataclass(frozen=True)
class Study:
    """One study of an experiment: what its ``run`` composes into ``result.json`` and the verdict.

    Attributes:
      checks: the study's claim checks, in the order the verdict reports them.
      context: the numbers the verdict reports beside the checks (a sentence or a few).
      metrics: the study's keys of ``result.json``'s metrics.
      plots: file names of the study's figures (as `experiments.report.savefig` returns them).
    """

    checks: list[Check]
    context: str
    metrics: dict
    plots: list[str]


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


def binomial_se(p: float, n: int) -> float:
    """Standard error ``sqrt(p (1 - p) / n)`` of a rate ``p`` measured on ``n`` trials, with ``p`` clamped
    to ``[1/n, 1 - 1/n]`` so that a rate of exactly 0 or 1 still carries the uncertainty of one trial.

    Example:
        >>> round(binomial_se(0.5, 100), 3), round(binomial_se(0.0, 100), 4)
        (0.05, 0.0099)
    """
    if n < 1:
        raise ValueError(f"n must be >= 1; got {n}")
    q = min(max(p, 1 / n), 1 - 1 / n) if n > 1 else 0.5
    return math.sqrt(q * (1 - q) / n)


def verdict(checks: Sequence[Check], *, claim: str = "", context: str = "",
            cause: str = "", cause_class: str | None = None) -> tuple[str, bool]:
    """Writes an experiment's verdict from its checks.

    The run reproduces the claim when every check with ``required=True`` passed; non-required checks
    are listed but do not decide. The sentence is a head ("Reproduced: <claim>" or "Not reproduced:
    <claim>"), each check's `Check.line`, then ``context`` (setting, scale) and, only when not
    reproduced, ``cause`` (scale limit, check stricter than the paper, bug, doubtful spec part).

    Args:
      checks: the run's checks, in the order they should be reported.
      claim: the paper's claim in a few words (the head of the sentence).
      context: the setting and scale of the run, numbers not covered by a check.
      cause: why a failing run failed, with the evidence; written only when not reproduced.
      cause_class: a key of `CAUSES` naming the class of ``cause`` (the run also returns it as
        ``"cause"`` so that result.json and the catalog show it); None when not yet classified.

    Returns:
      ``(sentence, reproduced)``.

    Raises:
      ValueError: if ``checks`` holds no required check (nothing would decide the verdict), or
        ``cause_class`` is not a key of `CAUSES`.

    Example:
        >>> checks = [Check("speedup", measured=1.8, paper="2x", threshold=">= 1.5", passed=True),
        ...           Check("memory ratio", measured=0.9, paper="< 1", threshold="< 0.8",
        ...                 passed=False, required=False)]
        >>> text, ok = verdict(checks, claim="faster decoding", context="smoke scale, 2 seeds")
        >>> ok
        True
        >>> print(text)
        Reproduced: faster decoding. speedup: 1.8 (paper 2x; pass if >= 1.5): PASS; memory ratio: 0.9 (paper < 1; pass if < 0.8): FAIL (not required). smoke scale, 2 seeds.
    """
    checks = list(checks)
    for ch in checks:
        if not isinstance(ch, Check):
            raise TypeError(f"checks must be Check records, got {type(ch).__name__}")
    if cause_class is not None and cause_class not in CAUSES:
        raise ValueError(f"cause_class must be one of {sorted(CAUSES)} or None, got {cause_class!r}")
    required = [ch for ch in checks if ch.required]
    if not required:
        raise ValueError(f"verdict needs at least one required check, got {len(checks)} checks "
                         "none of which is required")
    reproduced = all(bool(ch.passed) for ch in required)
    head = ("Reproduced" if reproduced else "Not reproduced") + (f": {claim.strip()}" if claim.strip() else "")
    parts = [_sentence(head)]
    if checks:
        parts.append(_sentence("; ".join(ch.line() for ch in checks)))
    if context.strip():
        parts.append(_sentence(context))
    text = cause.strip()
    if not reproduced and cause_class:
        if text.lower().startswith("cause") and ":" in text[:60]:
            text = text.split(":", 1)[1].strip()
        label = f"Cause ({CAUSES[cause_class].split(' (')[0]})"
        parts.append(_sentence(f"{label}: {text}" if text else label))
    elif not reproduced and text:
        parts.append(_sentence(text if text.lower().startswith("cause") else f"Cause: {text}"))
    return " ".join(parts), reproduced
