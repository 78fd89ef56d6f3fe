"""Agents, environments and their evaluation.

Modules (import them directly, e.g. `from algorithms.agents import calculus_grading`):
  calculus_grading: rubric-guided grading of calculus work (an exact step parser, rubric lines, the
    grader interface, simulated graders of known bias and noise), max-rule and alternative score
    aggregation, and the multi-perspective evaluation protocol (agreement, quadratic weighted kappa,
    per-item and per-rubric-line analysis, Krippendorff's alpha, ICC, Grubbs error variances).
"""

from algorithms.agents import calculus_grading

__all__ = ["calculus_grading"]
