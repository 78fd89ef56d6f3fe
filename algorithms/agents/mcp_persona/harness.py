"""The MCP client harness of MCP-Persona: connect to the server as an MCP client does, run an agent on a
task, check the end state, and compute the benchmark's metrics.

`connect` opens an ``mcp.Client`` session on a database bound to one user, either in-process over the
SDK's in-memory transport (``transport="memory"``: JSON-RPC over memory streams, legacy initialize
handshake) or over stdio (``transport="stdio"``: the server runs as a subprocess, `stdio_params`).
`ToolSession` wraps the client: it lists the tools (their JSON input schemas) and logs every call.
`run_episode` copies the task's world to a fresh file, connects, lets the agent act, and scores the
checkpoints on the final database. `metrics` aggregates episodes into the paper's three numbers
(spec section 12 (b).4; the definitions are inferred there and here):

* **Acc**: mean over tasks of the fraction of the task's checkpoints satisfied;
* **SR-0.8**: fraction of tasks whose checkpoint fraction is >= 0.8;
* **Exec-Acc**: fraction of tool calls that executed without a tool error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import sqlite3
import sys
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

from mcp import Client, StdioServerParameters

from algorithms.agents.mcp_persona import db as dbm
from algorithms.agents.mcp_persona import tasks as tk
from algorithms.agents.mcp_persona.server import make_server

__all__ = ["ToolCall", "ToolSession", "Episode", "connect", "stdio_params", "run_episode", "metrics",
           "SERVER_SCRIPT"]

SERVER_SCRIPT = pathlib.Path(__file__).with_name("server.py")
_REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def stdio_params(db_path: str | os.PathLike, user: int | str, *, crash_at: str | None = None) -> StdioServerParameters:
    """How an MCP client launches the server over stdio (as a script, for a fast start)."""
    args = [str(SERVER_SCRIPT), "--db", os.fspath(db_path), "--user", str(user)]
    if crash_at:
        args += ["--crash-at", crash_at]
    return StdioServerParameters(command=sys.executable, args=args, cwd=str(_REPO_ROOT))


@contextlib.asynccontextmanager
async def connect(db_path: str | os.PathLike, user: int | str, *, transport: str = "memory",
                  crash_at: str | None = None, read_timeout_seconds: float | None = 30.0) -> AsyncIterator[Client]:
    """An initialised ``mcp.Client`` on the server of ``db_path`` bound to ``user``.

    Args:
      transport: "memory" (in-process server, SDK in-memory transport) or "stdio" (subprocess).
      crash_at: fault injection passed to the server (see `server.make_server`).
    """
    if transport == "memory":
        target: Any = make_server(db_path, user, crash_at=crash_at)
    elif transport == "stdio":
        target = stdio_params(db_path, user, crash_at=crash_at)
    else:
        raise ValueError(f"transport must be 'memory' or 'stdio', got {transport!r}")
    async with Client(target, mode="legacy", read_timeout_seconds=read_timeout_seconds, cache=None) as client:
        yield client


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One logged call: tool, arguments, whether it succeeded, the result or the error dict."""

    tool: str
    arguments: Mapping[str, Any]
    ok: bool
    payload: Mapping[str, Any]


class ToolSession:
    """An agent's view of the server: `schemas` (tool name -> JSON input schema) and `call`."""

    def __init__(self, client: Client):
        self.client = client
        self.log: list[ToolCall] = []
        self.schemas: dict[str, dict] = {}

    async def list_tools(self) -> dict[str, dict]:
        res = await self.client.list_tools()
        self.schemas = {t.name: dict(t.input_schema) for t in res.tools}
        return self.schemas

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> tuple[bool, dict]:
        """Calls ``tool``; returns ``(True, result)`` or ``(False, error dict)``."""
        res = await self.client.call_tool(tool, dict(arguments))
        payload = res.structured_content
        if payload is None:  # a server without structured content: parse the text
            text = res.content[0].text if res.content else "{}"
            payload = {"error": {"type": "unknown", "message": text, "hint": {}}} if res.is_error else json.loads(text)
        ok = not res.is_error
        out = dict(payload) if ok else dict(payload["error"])
        self.log.append(ToolCall(tool, dict(arguments), ok, out))
        return ok, out


@dataclasses.dataclass(frozen=True)
class Episode:
    """An agent's run on a task: the checkpoint outcomes and the call log."""

    task_id: str
    template: str
    app: str
    injected: str
    agent: str
    checkpoints: tuple[bool, ...]
    calls: tuple[ToolCall, ...]

    @property
    def score(self) -> float:
        return sum(self.checkpoints) / len(self.checkpoints)

    @property
    def error_types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.calls:
            if not c.ok:
                out[c.payload.get("type", "unknown")] = out.get(c.payload.get("type", "unknown"), 0) + 1
        return out


async def run_episode(task: tk.Task, world: sqlite3.Connection, agent, episode_db: str | os.PathLike, *,
                      transport: str = "memory", seed: int = 0) -> Episode:
    """Copies ``world`` (the task's database after generation) to ``episode_db``, runs ``agent`` on the
    task through an MCP client session, and checks the checkpoints on the final state."""
    path = pathlib.Path(episode_db)
    for suffix in ("", "-wal", "-shm"):
        pathlib.Path(str(path) + suffix).unlink(missing_ok=True)
    dbm.copy_database(world, path)
    async with connect(path, task.persona.user_id, transport=transport) as client:
        sess = ToolSession(client)
        await sess.list_tools()
        await agent.run(task, sess, seed=seed)
    conn = dbm.connect(path)
    try:
        cps = tuple(tk.check(conn, task.checkpoints))
    finally:
        conn.close()
    return Episode(task.task_id, task.template, task.app, task.injected, agent.name, cps, tuple(sess.log))


def metrics(episodes: Iterable[Episode], *, threshold: float = 0.8) -> dict[str, float]:
    """Acc, SR-0.8 (``threshold``), Exec-Acc, and counts, over ``episodes`` (see module docstring)."""
    eps = list(episodes)
    if not eps:
        raise ValueError("metrics: episodes is empty")
    scores = [e.score for e in eps]
    calls = [c for e in eps for c in e.calls]
    return {"acc": sum(scores) / len(scores), "sr": sum(s >= threshold for s in scores) / len(scores),
            "exec_acc": (sum(c.ok for c in calls) / len(calls)) if calls else float("nan"),
            "any_progress": sum(s > 0 for s in scores) / len(scores), "num_tasks": len(eps), "num_calls": len(calls)}


def group_metrics(episodes: Sequence[Episode], key: str) -> dict[str, dict[str, float]]:
    """`metrics` per value of an Episode attribute (``"app"``, ``"injected"``, ``"agent"``, ``"template"``)."""
    groups: dict[str, list[Episode]] = {}
    for e in episodes:
        groups.setdefault(getattr(e, key), []).append(e)
    return {k: metrics(v) for k, v in sorted(groups.items())}
