"""Machine-readable checks of a paper's claim: what an experiment measured against what the paper says.

An experiment returns its checks in ``metrics["checks"]`` (a list of dicts, see `Check.as_dict`), so
``result.json`` says per claim: the measured value, the paper's value or direction, the threshold
fixed before the run, and whether it passed.

Example:
    >>> c = Check("tokens per iteration, Vegas / StreamingLLM", measured=1.31, paper="1.15-1.29x",
    ...           threshold=">= 1.15", passed=1.31 >= 1.15)
    >>> c.as_dict()["passed"], c.line()
    (True, 'tokens per iteration, Vegas / StreamingLLM: 1.31 (paper 1.15-1.29x; pass if >= 1.15): PASS')
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Check"]


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
    """

    name: str
    measured: Any
    paper: str
    threshold: str
    passed: bool
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["passed"] = bool(self.passed)
        return d

    def line(self) -> str:
        m = f"{self.measured:.3g}" if isinstance(self.measured, float) else str(self.measured)
        note = f" [{self.note}]" if self.note else ""
        return (f"{self.name}: {m} (paper {self.paper}; pass if {self.threshold}): "
                f"{'PASS' if self.passed else 'FAIL'}{note}")
