"""Scripted tool-calling agents of graded skill for MCP-Persona (the experiment's subjects).

An agent executes a task's `tasks.Step` plan through a `harness.ToolSession` (a real MCP client). It
never sees the checkpoints; what it knows is what the instruction says (the plan's literal values,
`tasks.Surface` values *as written*, the unsupported options the instruction asks for) and what
the server returns (results, the tool schemas from ``tools/list``, and structured tool errors).
Skill levels, lowest first (`SKILLS`):

* ``guesser``: does not use lookups for ids: every fuzzified id (`tasks.Ref` with a
  ``guess_range``) is a uniform guess; writes values as the instruction does; no error handling.
* ``literal``: resolves ids from earlier results, but passes values as written (text "15 results"
  for a number, 200 for a limit of at most 50, the unsupported option); no error handling.
* ``syntactic``: as ``literal``, then repairs type, schema and boundary errors from the error's
  hint (parse the number, drop the unknown argument, clamp to the bound), up to 2 repairs a step;
  gives up on semantic errors.
* ``expert``: conforms every call to the listed JSON schema *before* sending it (so syntactic
  injections cause no failed call), and repairs semantic errors (moved account -> its new id,
  calendar conflict -> first free full hour after the blocking event, followers-only post -> follow
  the author then retry), up to 3 repairs a step.
* ``oracle``: the canonical values (no injected surface forms, no unsupported options) plus the
  expert's semantic repairs; reaches every checkpoint of every task (tested), so it validates the
  tasks.

Inferred: the paper evaluates LLMs; these scripted agents (and their skills) are ours.
"""

from __future__ import annotations

import random
import re
from typing import Any, Mapping

from algorithms.agents.mcp_persona import tasks as tk

__all__ = ["SKILLS", "ScriptedAgent", "make_agent", "conform", "repair_syntactic", "next_full_hour"]

SKILLS = ("guesser", "literal", "syntactic", "expert", "oracle")


def _set_path(args: dict, path: str, value: Any) -> dict:
    """A copy of ``args`` with ``path`` ("name" or "name.index") set to ``value``."""
    out = {k: (list(v) if isinstance(v, list) else v) for k, v in args.items()}
    head, _, idx = path.partition(".")
    if idx:
        out[head][int(idx)] = value
    else:
        out[head] = value
    return out


def _coerce(value: Any, expected: Any) -> Any:
    """``value`` converted to the JSON type ``expected`` ("integer", "number", "boolean", "string",
    "array"); None when there is no sensible conversion."""
    if expected == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            m = re.search(r"-?\d+", value)
            return int(m.group()) if m else None
        return None
    if expected == "number":
        if isinstance(value, str):
            m = re.search(r"-?\d+(\.\d+)?", value)
            return float(m.group()) if m else None
        return None
    if expected == "boolean" and isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
        return value.lower() in ("true", "yes")
    if expected == "string" and isinstance(value, (int, float)):
        return str(value)
    if expected == "array":
        return [value]
    return None


def repair_syntactic(args: Mapping[str, Any], error: Mapping[str, Any]) -> dict | None:
    """Repairs ``args`` from a type_mismatch / schema_violation / boundary error's hint; None if it
    cannot (a missing argument, an unknown code)."""
    hint, code, kind = error.get("hint", {}), error.get("code", ""), error.get("type")
    args = dict(args)
    if kind == "type_mismatch" and "argument" in hint and hint["argument"] != "(arguments)":
        fixed = _coerce(hint.get("got"), hint.get("expected"))
        return None if fixed is None else _set_path(args, hint["argument"], fixed)
    if kind == "schema_violation":
        if code == "unexpected_argument":
            return {k: v for k, v in args.items() if k not in hint.get("unexpected", [])}
        if code == "not_in_enum" and hint.get("allowed"):
            return _set_path(args, hint["argument"], hint["allowed"][0])
        return None
    if kind == "boundary" and "argument" in hint:
        for kw in ("maximum", "minimum"):
            if kw in hint:
                return _set_path(args, hint["argument"], hint[kw])
        if "maxLength" in hint and isinstance(hint.get("got"), str):
            return _set_path(args, hint["argument"], hint["got"][: hint["maxLength"]])
    return None


def conform(args: Mapping[str, Any], schema: Mapping[str, Any]) -> dict:
    """``args`` made to fit a tool's JSON input schema: unknown arguments dropped, values coerced to
    the declared type, numbers clamped into ``[minimum, maximum]`` (what a schema-reading agent does)."""
    props = schema.get("properties", {})
    out = {}
    for k, v in args.items():
        if k not in props:
            continue
        p = props[k]
        t = p.get("type")
        ok_type = {"integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
                   "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
                   "string": lambda x: isinstance(x, str), "boolean": lambda x: isinstance(x, bool),
                   "array": lambda x: isinstance(x, list)}.get(t, lambda x: True)
        if not ok_type(v):
            c = _coerce(v, t)
            v = v if c is None else c
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if "maximum" in p:
                v = min(v, p["maximum"])
            if "minimum" in p:
                v = max(v, p["minimum"])
        out[k] = v
    return out


def next_full_hour(t: str) -> str:
    """The first full hour at or after ``t`` (``YYYY-MM-DDTHH:MM``), same day assumed."""
    day, hm = t.split("T")
    h, m = map(int, hm.split(":"))
    return f"{day}T{h + (m > 0):02d}:00"


class ScriptedAgent:
    """A scripted agent of one of `SKILLS` (see module docstring)."""

    def __init__(self, skill: str):
        if skill not in SKILLS:
            raise ValueError(f"skill must be one of {SKILLS}, got {skill!r}")
        self.name = self.skill = skill
        self.uses_lookups = skill != "guesser"
        self.canonical = skill == "oracle"
        self.schema_aware = skill == "expert"
        self.syntactic_repair = skill in ("syntactic", "expert", "oracle")
        self.semantic_repair = skill in ("expert", "oracle")
        self.max_repairs = {"guesser": 0, "literal": 0, "syntactic": 2, "expert": 3, "oracle": 3}[skill]

    def _value(self, v: Any, mem: Mapping[str, Any], rng: random.Random) -> Any:
        if isinstance(v, tk.Surface):
            return v.canonical if self.canonical else v.surface
        if isinstance(v, tk.Ref):
            if v.guess_range > 0 and not self.uses_lookups:
                g = rng.randint(1, v.guess_range)
                return [g] if v.listy else g
            return v.fn(mem)
        return v

    async def run(self, task: tk.Task, sess, *, seed: int = 0) -> None:
        """Executes the task's plan through ``sess`` (a `harness.ToolSession`)."""
        rng = random.Random(f"{seed}/{self.skill}/{task.task_id}")
        mem: dict[str, Any] = {}
        for step in task.steps:
            try:
                args = {k: self._value(v, mem, rng) for k, v in step.args.items()}
            except (KeyError, IndexError, StopIteration, TypeError):
                continue  # an earlier step failed: this one cannot be formed
            if not self.canonical:
                args.update(step.extra)
            if self.schema_aware and step.tool in sess.schemas:
                args = conform(args, sess.schemas[step.tool])
            for attempt in range(self.max_repairs + 1):
                ok, out = await sess.call(step.tool, args)
                if ok:
                    mem[step.save_as] = out
                    break
                if attempt == self.max_repairs:
                    break
                fixed = await self._repair(args, out, sess)
                if fixed is None:
                    break
                args = fixed

    async def _repair(self, args: dict, error: Mapping[str, Any], sess) -> dict | None:
        kind, hint, code = error.get("type"), error.get("hint", {}), error.get("code")
        if kind in ("type_mismatch", "schema_violation", "boundary"):
            return repair_syntactic(args, error) if self.syntactic_repair else None
        if kind != "semantic" or not self.semantic_repair:
            return None
        if code == "user_moved":
            return _set_path(args, hint["argument"], hint["moved_to"])
        if code == "conflict":
            return _set_path(args, "start", next_full_hour(hint["busy_until"]))
        if code == "not_following":
            ok, _ = await sess.call("social_follow", {"user_id": hint["author_id"]})
            return dict(args) if ok else None
        return None


def make_agent(skill: str) -> ScriptedAgent:
    """The scripted agent of a skill level."""
    return ScriptedAgent(skill)
