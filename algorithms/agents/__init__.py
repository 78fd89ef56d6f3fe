"""Agents, environments and their evaluation.

Modules (import them directly, e.g. `from algorithms.agents import calculus_grading`):
  calculus_grading: rubric-guided grading of calculus work (an exact step parser, rubric lines, the
    grader interface, simulated graders of known bias and noise), max-rule and alternative score
    aggregation, and the multi-perspective evaluation protocol (agreement, quadratic weighted kappa,
    per-item and per-rubric-line analysis, Krippendorff's alpha, ICC, Grubbs error variances).
  eelma: effective empowerment of an agent from its logged interactions (InfoNCE bounds with critic
    networks over action and future-state embeddings, the geometric future offset, the read-out) and
    exact effective empowerment by enumeration on small discrete environments.
  mcp_persona: MCP-Persona, simulated personal apps (social feed, messaging, documents, calendar)
    with their state in SQLite, served as tools by a real MCP server (the `mcp` SDK), task generation
    with checkable end states, the client harness and its metrics, scripted agents of graded skill.
"""

from algorithms.agents import calculus_grading, eelma, mcp_persona

__all__ = ["calculus_grading", "eelma", "mcp_persona"]
