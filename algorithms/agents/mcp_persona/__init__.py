"""MCP-Persona: personal applications on SQLite behind a real MCP server, tasks with checkable end states,
a client harness, the benchmark's metrics, and scripted agents of graded skill.

Wang et al., "Benchmarking LLM Agents on Real-World Personal Applications via Environment Simulation",
arXiv:2606.02470 (ICML 2026); spec ``papers/specs/rl_alignment_agents.md`` section 12; issue 32 item 2.

Modules:
  db: schema, migrations, transactions and queries of the SQLite state.
  server: the MCP server (``mcp`` SDK, stdio or in-process), its tools and the four error types.
  tasks: world and persona generation, task templates, fuzzification, error injection, checkers.
  harness: the MCP client harness (in-memory or stdio), episodes, and Acc / SR-0.8 / Exec-Acc.
  agents: scripted tool-calling agents of graded skill.
"""

import importlib

__all__ = ["agents", "db", "harness", "server", "tasks"]


def __getattr__(name: str):
    # Lazy submodules: ``python -m algorithms.agents.mcp_persona.server`` then runs the server module
    # once (an eager import here would load it twice and make runpy warn).
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
