"""Agents, environments and their evaluation.

Modules (import them directly, e.g. `from algorithms.agents import calculus_grading`):
  calculus_grading: rubric-guided grading of calculus work (an exact step parser, rubric lines, the
    grader interface, simulated graders of known bias and noise), max-rule and alternative score
    aggregation, and the multi-perspective evaluation protocol (agreement, quadratic weighted kappa,
    per-item and per-rubric-line analysis, Krippendorff's alpha, ICC, Grubbs error variances).
  eelma: effective empowerment of an agent from its logged interactions (InfoNCE bounds with critic
    networks over action and future-state embeddings, the geometric future offset, the read-out) and
    exact effective empowerment by enumeration on small discrete environments.
"""

from algorithms.agents import calculus_grading, eelma

__all__ = ["calculus_grading", "eelma"]
