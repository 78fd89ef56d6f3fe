"""The MCP-Persona server: the four personal apps as tools of a real MCP server (``mcp`` SDK, lowlevel API).

Run it over stdio (what an MCP client such as `harness.stdio_client_params` launches)::

    python -m algorithms.agents.mcp_persona.server --db PATH --user HANDLE

or as a script, ``python algorithms/agents/mcp_persona/server.py --db PATH --user HANDLE``, which
starts faster (it does not import ``algorithms.agents``, whose other modules import JAX); the
harness launches it that way.

A server process is bound to one account (``--user``, as a real personal MCP server is bound to its
user's token) and to one SQLite file; several processes (sessions of different users) may share the
file. `make_server` builds the same server in-process (tests connect to it with ``mcp.Client``).

Tools (JSON-schema input definitions in `TOOLS`, ``additionalProperties: false``): account
(``whoami``, ``find_user``, ``list_group_members``, ``profile_get``), messaging (``msg_send``,
``msg_list``, ``msg_mark_read``), social feed (``social_post``, ``social_user_posts``,
``social_follow``, ``social_like``), documents (``doc_search``, ``doc_get``, ``doc_create``,
``doc_update``, ``doc_share``), calendar (``cal_list_events``, ``cal_create_event``, ``cal_invite``,
``cal_cancel_event``), and ``server_info``.

Every call is answered either with the result (``structuredContent`` = the result object, text = its
JSON) or with a tool error (``isError: true``) whose ``structuredContent`` is ``{"error": {"type",
"code", "message", "hint"}}`` and whose text starts ``"<type> error: "``. The error types are the
paper's four (spec section 12 (b).1): ``type_mismatch`` (a JSON value of the wrong type),
``schema_violation`` (missing or unknown argument, value outside an enum or pattern),
``boundary`` (a length, count or number outside the allowed range) and ``semantic`` (a well-formed
call that conflicts with the state: unknown or invisible entity, calendar conflict, migrated
account, followers-only post, duplicate). The arguments are validated against the tool's schema
*inside* the call's transaction and every write of a call runs in that one transaction, so any error
leaves the database exactly as it was (a partial multi-row write is rolled back).

Inferred (not in the paper): the concrete tools, schemas, limits, the visibility rules, the error
codes and the classification of JSON-schema keywords into the four error types.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sqlite3
import sys
from typing import Any, Callable

import anyio
import jsonschema
import mcp_types as types
from mcp.server import Server

if __package__:
    from . import db as dbm
else:  # run as a script (``python .../server.py``): skips importing the parent packages (fast start)
    import db as dbm  # type: ignore[no-redef]

__all__ = ["ERROR_TYPES", "TOOLS", "APPS", "ToolError", "ToolSpec", "call_tool_sync", "make_server",
           "classify_schema_error", "resolve_user", "main"]

ERROR_TYPES = ("type_mismatch", "schema_violation", "boundary", "semantic")
APPS = ("messaging", "social", "documents", "calendar")
DEFAULT_NOW = "2026-06-01T12:00"

_TYPE_KEYWORDS = {"type"}
_SCHEMA_KEYWORDS = {"required", "additionalProperties", "enum", "const", "pattern", "format", "uniqueItems"}
_BOUNDARY_KEYWORDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                      "minItems", "maxItems"}


class ToolError(Exception):
    """A tool error of one of `ERROR_TYPES`, with a machine-readable ``code`` and ``hint``."""

    def __init__(self, type_: str, code: str, message: str, hint: dict | None = None):
        if type_ not in ERROR_TYPES:
            raise ValueError(f"ToolError: type must be one of {ERROR_TYPES}, got {type_!r}")
        super().__init__(message)
        self.type, self.code, self.message, self.hint = type_, code, message, dict(hint or {})

    def as_dict(self) -> dict:
        return {"type": self.type, "code": self.code, "message": self.message, "hint": self.hint}


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """One tool: name, app, description, JSON input schema and ``fn(ctx, args) -> result dict``."""

    name: str
    app: str
    description: str
    schema: dict
    fn: Callable[["_Ctx", dict], dict]
    writes: bool = False


@dataclasses.dataclass
class _Ctx:
    conn: sqlite3.Connection
    user_id: int
    now: str
    crash_at: str | None = None


# ---------------------------------------------------------------------------------------------
# Schema helpers and validation.
# ---------------------------------------------------------------------------------------------

def _obj(props: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


_ID = {"type": "integer", "minimum": 1}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}
_DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
_TIME = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$"}
_KEY_ORDER = {"type": 0, "required": 1, "additionalProperties": 1, "enum": 1, "const": 1, "pattern": 1,
              "format": 1, "uniqueItems": 1}


def classify_schema_error(err: jsonschema.ValidationError) -> ToolError:
    """Maps one JSON-schema validation error to a `ToolError` of the paper's taxonomy.

    ``type`` -> type_mismatch; ``required`` / ``additionalProperties`` / ``enum`` / ``pattern`` ->
    schema_violation; ``minimum`` / ``maximum`` / ``minLength`` / ``maxLength`` / ``minItems`` /
    ``maxItems`` -> boundary. The hint names the argument and the allowed values or range.
    """
    path = ".".join(str(p) for p in err.absolute_path) or "(arguments)"
    kw = err.validator
    sch = err.schema if isinstance(err.schema, dict) else {}
    if kw in _TYPE_KEYWORDS:
        return ToolError("type_mismatch", "wrong_type",
                         f"argument '{path}' must be of type {err.validator_value}, got {type(err.instance).__name__} "
                         f"{err.instance!r}", {"argument": path, "expected": err.validator_value,
                                               "got": err.instance})
    if kw == "required":
        missing = [m for m in err.validator_value if m not in (err.instance or {})]
        return ToolError("schema_violation", "missing_argument", f"missing required argument(s) {missing}",
                         {"missing": missing})
    if kw == "additionalProperties":
        extra = sorted(set(err.instance) - set(sch.get("properties", {})))
        return ToolError("schema_violation", "unexpected_argument",
                         f"unexpected argument(s) {extra}; allowed: {sorted(sch.get('properties', {}))}",
                         {"unexpected": extra, "allowed": sorted(sch.get("properties", {}))})
    if kw in ("enum", "const"):
        allowed = list(err.validator_value) if kw == "enum" else [err.validator_value]
        return ToolError("schema_violation", "not_in_enum", f"argument '{path}' must be one of {allowed}, got "
                         f"{err.instance!r}", {"argument": path, "allowed": allowed, "got": err.instance})
    if kw in _SCHEMA_KEYWORDS:
        return ToolError("schema_violation", f"bad_{kw}", f"argument '{path}' violates {kw} {err.validator_value!r}: "
                         f"got {err.instance!r}", {"argument": path, kw: err.validator_value, "got": err.instance})
    if kw in _BOUNDARY_KEYWORDS:
        return ToolError("boundary", f"out_of_range_{kw}", f"argument '{path}' violates {kw}={err.validator_value}: "
                         f"got {err.instance!r}", {"argument": path, kw: err.validator_value, "got": err.instance})
    return ToolError("schema_violation", f"bad_{kw}", f"argument '{path}': {err.message}", {"argument": path})


def _validate(spec: ToolSpec, args: Any) -> dict:
    if not isinstance(args, dict):
        raise ToolError("type_mismatch", "wrong_type", f"arguments must be an object, got {type(args).__name__}",
                        {"argument": "(arguments)", "expected": "object"})
    errors = list(jsonschema.Draft202012Validator(spec.schema).iter_errors(args))
    if errors:
        err = min(errors, key=lambda e: (_KEY_ORDER.get(e.validator, 2), list(map(str, e.absolute_path))))
        raise classify_schema_error(err)
    out = dict(args)
    for k, p in spec.schema["properties"].items():
        if k not in out and "default" in p:
            out[k] = p["default"]
    return out


# ---------------------------------------------------------------------------------------------
# Visibility and lookups.
# ---------------------------------------------------------------------------------------------

def _user(ctx: _Ctx, uid: int, arg: str = "user_id") -> dict:
    row = ctx.conn.execute("SELECT id, handle, name, city, moved_to FROM users WHERE id = ?", (uid,)).fetchone()
    if row is None:
        raise ToolError("semantic", "not_found", f"{arg}: no user with id {uid}", {"argument": arg})
    return dict(row)


def _active_user(ctx: _Ctx, uid: int, arg: str) -> dict:
    u = _user(ctx, uid, arg)
    if u["moved_to"] is not None:
        raise ToolError("semantic", "user_moved", f"{arg}: account {uid} ({u['handle']}) has moved to account "
                        f"{u['moved_to']}; address the new account", {"argument": arg, "moved_to": u["moved_to"]})
    return u


def _follows(ctx: _Ctx, follower: int, followee: int) -> bool:
    return ctx.conn.execute("SELECT 1 FROM follows WHERE follower_id = ? AND followee_id = ?",
                            (follower, followee)).fetchone() is not None


def _doc(ctx: _Ctx, doc_id: int) -> tuple[dict, str]:
    """The document and the caller's role ('owner' / 'editor' / 'viewer'); not_found if invisible."""
    row = ctx.conn.execute("SELECT * FROM documents WHERE id = ?", (doc_id,)).fetchone()
    if row is not None:
        if row["owner_id"] == ctx.user_id:
            return dict(row), "owner"
        share = ctx.conn.execute("SELECT role FROM doc_shares WHERE doc_id = ? AND user_id = ?",
                                 (doc_id, ctx.user_id)).fetchone()
        if share is not None:
            return dict(row), share["role"]
    raise ToolError("semantic", "not_found", f"doc_id: no document {doc_id} visible to you", {"argument": "doc_id"})


def _visible_event(ctx: _Ctx, event_id: int) -> dict:
    row = ctx.conn.execute(
        "SELECT * FROM events WHERE id = ? AND (owner_id = ? OR id IN (SELECT event_id FROM event_invites "
        "WHERE user_id = ?))", (event_id, ctx.user_id, ctx.user_id)).fetchone()
    if row is None:
        raise ToolError("semantic", "not_found", f"event_id: no event {event_id} visible to you",
                        {"argument": "event_id"})
    return dict(row)


def _minutes(t: str) -> int:
    """``YYYY-MM-DDTHH:MM`` -> minutes since 2000-01-01 (days counted with the proleptic calendar)."""
    import datetime as _dt
    d = _dt.datetime.strptime(t, "%Y-%m-%dT%H:%M")
    return int((d - _dt.datetime(2000, 1, 1)).total_seconds() // 60)


def _fmt_minutes(m: int) -> str:
    import datetime as _dt
    return (_dt.datetime(2000, 1, 1) + _dt.timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M")


def _maybe_crash(ctx: _Ctx, tool: str) -> None:
    """Fault injection (tests): exit the process without cleanup inside the transaction of ``tool``."""
    if ctx.crash_at == tool:
        os._exit(70)


# ---------------------------------------------------------------------------------------------
# Tool implementations: fn(ctx, args) -> dict. Raise ToolError on failure.
# ---------------------------------------------------------------------------------------------

def _whoami(ctx, a):
    return {"user": _user(ctx, ctx.user_id)}


def _server_info(ctx, a):
    return {"pid": os.getpid(), "user_id": ctx.user_id, "schema_version": dbm.schema_version(ctx.conn)}


def _find_user(ctx, a):
    q = f"%{a['query'].strip().lower()}%"
    rows = dbm.rows(ctx.conn, "SELECT id, handle, name, city, moved_to FROM users WHERE lower(name) LIKE ? OR "
                    "lower(handle) LIKE ? ORDER BY id LIMIT ?", (q, q, a["limit"]))
    return {"users": rows}


def _list_group_members(ctx, a):
    g = ctx.conn.execute("SELECT id FROM groups WHERE lower(name) = lower(?)", (a["group"],)).fetchone()
    if g is None:
        raise ToolError("semantic", "not_found", f"group: no group named {a['group']!r}", {"argument": "group"})
    rows = dbm.rows(ctx.conn, "SELECT u.id, u.handle, u.name FROM group_members m JOIN users u ON u.id = m.user_id "
                    "WHERE m.group_id = ? ORDER BY u.id LIMIT ?", (g["id"], a["limit"]))
    return {"members": rows}


def _profile_get(ctx, a):
    rows = ctx.conn.execute("SELECT key, value FROM preferences WHERE user_id = ? ORDER BY key", (ctx.user_id,))
    return {"preferences": {r["key"]: r["value"] for r in rows}}


def _msg_send(ctx, a):
    _active_user(ctx, a["recipient_id"], "recipient_id")
    if a["recipient_id"] == ctx.user_id:
        raise ToolError("semantic", "self_message", "recipient_id: cannot message yourself", {"argument": "recipient_id"})
    cur = ctx.conn.execute("INSERT INTO messages (sender_id, recipient_id, body, sent_at) VALUES (?, ?, ?, ?)",
                           (ctx.user_id, a["recipient_id"], a["body"], ctx.now))
    _maybe_crash(ctx, "msg_send")
    return {"message_id": cur.lastrowid}


def _msg_list(ctx, a):
    sql = ("SELECT id, sender_id, recipient_id, body, sent_at, read_at FROM messages WHERE (sender_id = ? OR "
           "recipient_id = ?)")
    params: list[Any] = [ctx.user_id, ctx.user_id]
    if a.get("with_user_id") is not None:
        sql += " AND (sender_id = ? OR recipient_id = ?)"
        params += [a["with_user_id"], a["with_user_id"]]
    if a.get("unread_only"):
        sql += " AND recipient_id = ? AND read_at IS NULL"
        params.append(ctx.user_id)
    sql += " ORDER BY id DESC LIMIT ?"
    params.append(a["limit"])
    return {"messages": dbm.rows(ctx.conn, sql, params)}


def _msg_mark_read(ctx, a):
    row = ctx.conn.execute("SELECT read_at FROM messages WHERE id = ? AND recipient_id = ?",
                           (a["message_id"], ctx.user_id)).fetchone()
    if row is None:
        raise ToolError("semantic", "not_found", f"message_id: no message {a['message_id']} addressed to you",
                        {"argument": "message_id"})
    ctx.conn.execute("UPDATE messages SET read_at = ? WHERE id = ? AND read_at IS NULL", (ctx.now, a["message_id"]))
    return {"message_id": a["message_id"], "read": True}


def _social_post(ctx, a):
    cur = ctx.conn.execute("INSERT INTO posts (author_id, body, visibility, created_at) VALUES (?, ?, ?, ?)",
                           (ctx.user_id, a["body"], a["visibility"], ctx.now))
    return {"post_id": cur.lastrowid}


def _social_user_posts(ctx, a):
    uid = a.get("user_id", ctx.user_id)
    _user(ctx, uid)
    can_see_all = uid == ctx.user_id or _follows(ctx, ctx.user_id, uid)
    out = []
    for r in dbm.rows(ctx.conn, "SELECT id, author_id, body, visibility, created_at FROM posts WHERE author_id = ? "
                      "ORDER BY id DESC LIMIT ?", (uid, a["limit"])):
        if r["visibility"] == "followers" and not can_see_all:
            r["body"] = "[visible to followers only]"
        out.append(r)
    return {"posts": out}


def _social_follow(ctx, a):
    _active_user(ctx, a["user_id"], "user_id")
    if a["user_id"] == ctx.user_id:
        raise ToolError("semantic", "self_follow", "user_id: cannot follow yourself", {"argument": "user_id"})
    if _follows(ctx, ctx.user_id, a["user_id"]):
        raise ToolError("semantic", "already_following", f"user_id: you already follow user {a['user_id']}",
                        {"argument": "user_id"})
    ctx.conn.execute("INSERT INTO follows (follower_id, followee_id) VALUES (?, ?)", (ctx.user_id, a["user_id"]))
    return {"following": a["user_id"]}


def _social_like(ctx, a):
    row = ctx.conn.execute("SELECT author_id, visibility FROM posts WHERE id = ?", (a["post_id"],)).fetchone()
    if row is None:
        raise ToolError("semantic", "not_found", f"post_id: no post {a['post_id']}", {"argument": "post_id"})
    if (row["visibility"] == "followers" and row["author_id"] != ctx.user_id
            and not _follows(ctx, ctx.user_id, row["author_id"])):
        raise ToolError("semantic", "not_following", f"post_id: post {a['post_id']} is visible to followers of user "
                        f"{row['author_id']} only; follow them first", {"argument": "post_id",
                                                                        "author_id": row["author_id"]})
    if ctx.conn.execute("SELECT 1 FROM likes WHERE user_id = ? AND post_id = ?",
                        (ctx.user_id, a["post_id"])).fetchone():
        raise ToolError("semantic", "already_liked", f"post_id: you already like post {a['post_id']}",
                        {"argument": "post_id"})
    ctx.conn.execute("INSERT INTO likes (user_id, post_id) VALUES (?, ?)", (ctx.user_id, a["post_id"]))
    return {"liked": a["post_id"]}


def _doc_search(ctx, a):
    q = f"%{a['query'].strip().lower()}%"
    rows = dbm.rows(ctx.conn, "SELECT id, owner_id, title, updated_at, version FROM documents WHERE lower(title) LIKE ? "
                    "AND (owner_id = ? OR id IN (SELECT doc_id FROM doc_shares WHERE user_id = ?)) ORDER BY id DESC "
                    "LIMIT ?", (q, ctx.user_id, ctx.user_id, a["limit"]))
    return {"documents": rows}


def _doc_get(ctx, a):
    doc, role = _doc(ctx, a["doc_id"])
    return {"document": doc, "your_role": role}


def _doc_create(ctx, a):
    row = ctx.conn.execute("SELECT id FROM documents WHERE owner_id = ? AND title = ?",
                           (ctx.user_id, a["title"])).fetchone()
    if row is not None:
        raise ToolError("semantic", "title_exists", f"title: you already own a document titled {a['title']!r} "
                        f"(doc_id {row['id']})", {"argument": "title", "doc_id": row["id"]})
    cur = ctx.conn.execute("INSERT INTO documents (owner_id, title, body, updated_at) VALUES (?, ?, ?, ?)",
                           (ctx.user_id, a["title"], a["body"], ctx.now))
    return {"doc_id": cur.lastrowid}


def _doc_update(ctx, a):
    doc, role = _doc(ctx, a["doc_id"])
    if role == "viewer":
        raise ToolError("semantic", "read_only", f"doc_id: you can only view document {a['doc_id']}",
                        {"argument": "doc_id"})
    ctx.conn.execute("UPDATE documents SET body = ?, updated_at = ?, version = version + 1 WHERE id = ?",
                     (a["body"], ctx.now, a["doc_id"]))
    return {"doc_id": a["doc_id"], "version": doc["version"] + 1}


def _doc_share(ctx, a):
    doc, role = _doc(ctx, a["doc_id"])
    if role != "owner":
        raise ToolError("semantic", "not_owner", f"doc_id: only the owner can share document {a['doc_id']}",
                        {"argument": "doc_id"})
    for i, uid in enumerate(a["user_ids"]):  # one row per user; an error on any rolls all back
        _active_user(ctx, uid, f"user_ids.{i}")
        if uid == ctx.user_id:
            raise ToolError("semantic", "share_with_owner", f"user_ids.{i}: you own document {a['doc_id']}",
                            {"argument": f"user_ids.{i}"})
        ctx.conn.execute("INSERT INTO doc_shares (doc_id, user_id, role) VALUES (?, ?, ?) ON CONFLICT (doc_id, user_id) "
                         "DO UPDATE SET role = excluded.role", (a["doc_id"], uid, a["role"]))
        _maybe_crash(ctx, "doc_share")
    return {"doc_id": a["doc_id"], "shared_with": a["user_ids"], "role": a["role"]}


def _cal_list_events(ctx, a):
    rows = dbm.rows(ctx.conn, "SELECT id, owner_id, title, start, duration_min FROM events WHERE start LIKE ? AND "
                    "(owner_id = ? OR id IN (SELECT event_id FROM event_invites WHERE user_id = ?)) ORDER BY start, id "
                    "LIMIT ?", (a["date"] + "T%", ctx.user_id, ctx.user_id, a["limit"]))
    return {"events": rows}


def _cal_create_event(ctx, a):
    try:
        start = _minutes(a["start"])
    except ValueError:
        raise ToolError("boundary", "invalid_datetime", f"start: {a['start']!r} is not a valid date and time",
                        {"argument": "start"}) from None
    end = start + a["duration_min"]
    for ev in dbm.rows(ctx.conn, "SELECT id, title, start, duration_min FROM events WHERE owner_id = ? AND start LIKE ?",
                       (ctx.user_id, a["start"][:10] + "T%")):
        s = _minutes(ev["start"])
        if s < end and start < s + ev["duration_min"]:
            raise ToolError("semantic", "conflict", f"start: overlaps your event {ev['id']} {ev['title']!r} "
                            f"({ev['start']}, {ev['duration_min']} min)",
                            {"argument": "start", "event_id": ev["id"], "busy_until": _fmt_minutes(s + ev["duration_min"])})
    cur = ctx.conn.execute("INSERT INTO events (owner_id, title, start, duration_min) VALUES (?, ?, ?, ?)",
                           (ctx.user_id, a["title"], a["start"], a["duration_min"]))
    return {"event_id": cur.lastrowid}


def _own_event(ctx, event_id):
    ev = _visible_event(ctx, event_id)
    if ev["owner_id"] != ctx.user_id:
        raise ToolError("semantic", "not_owner", f"event_id: you are invited to event {event_id} but do not own it",
                        {"argument": "event_id"})
    return ev


def _cal_invite(ctx, a):
    _own_event(ctx, a["event_id"])
    for i, uid in enumerate(a["user_ids"]):  # one row per user; an error on any rolls all back
        _active_user(ctx, uid, f"user_ids.{i}")
        if uid == ctx.user_id:
            raise ToolError("semantic", "invite_owner", f"user_ids.{i}: you own event {a['event_id']}",
                            {"argument": f"user_ids.{i}"})
        ctx.conn.execute("INSERT OR IGNORE INTO event_invites (event_id, user_id) VALUES (?, ?)", (a["event_id"], uid))
        _maybe_crash(ctx, "cal_invite")
    return {"event_id": a["event_id"], "invited": a["user_ids"]}


def _cal_cancel_event(ctx, a):
    _own_event(ctx, a["event_id"])
    ctx.conn.execute("DELETE FROM event_invites WHERE event_id = ?", (a["event_id"],))
    ctx.conn.execute("DELETE FROM events WHERE id = ?", (a["event_id"],))
    return {"cancelled": a["event_id"]}


_S = {"type": "string"}
TOOLS: dict[str, ToolSpec] = {t.name: t for t in [
    ToolSpec("server_info", "account", "Server process id, bound user and schema version.", _obj({}), _server_info),
    ToolSpec("whoami", "account", "Your own account.", _obj({}), _whoami),
    ToolSpec("find_user", "account", "Search users by name or handle (substring, case-insensitive).",
             _obj({"query": {**_S, "minLength": 1, "maxLength": 80}, "limit": _LIMIT}, ("query",)), _find_user),
    ToolSpec("list_group_members", "account", "Members of a group, by the group's name.",
             _obj({"group": {**_S, "minLength": 1, "maxLength": 80}, "limit": _LIMIT}, ("group",)), _list_group_members),
    ToolSpec("profile_get", "account", "Your private preferences (signature, default visibility, ...).", _obj({}),
             _profile_get),
    ToolSpec("msg_send", "messaging", "Send a direct message.",
             _obj({"recipient_id": _ID, "body": {**_S, "minLength": 1, "maxLength": 500}}, ("recipient_id", "body")),
             _msg_send, True),
    ToolSpec("msg_list", "messaging", "Your direct messages, newest first.",
             _obj({"with_user_id": _ID, "unread_only": {"type": "boolean", "default": False}, "limit": _LIMIT}),
             _msg_list),
    ToolSpec("msg_mark_read", "messaging", "Mark a message addressed to you as read.", _obj({"message_id": _ID},
             ("message_id",)), _msg_mark_read, True),
    ToolSpec("social_post", "social", "Publish a post.",
             _obj({"body": {**_S, "minLength": 1, "maxLength": 280},
                   "visibility": {**_S, "enum": ["public", "followers"]}}, ("body", "visibility")), _social_post, True),
    ToolSpec("social_user_posts", "social", "A user's posts (default: yours), newest first.",
             _obj({"user_id": _ID, "limit": _LIMIT}), _social_user_posts),
    ToolSpec("social_follow", "social", "Follow a user.", _obj({"user_id": _ID}, ("user_id",)), _social_follow, True),
    ToolSpec("social_like", "social", "Like a post.", _obj({"post_id": _ID}, ("post_id",)), _social_like, True),
    ToolSpec("doc_search", "documents", "Your and shared-with-you documents whose title contains the query.",
             _obj({"query": {**_S, "maxLength": 120}, "limit": _LIMIT}, ("query",)), _doc_search),
    ToolSpec("doc_get", "documents", "A document with its body.", _obj({"doc_id": _ID}, ("doc_id",)), _doc_get),
    ToolSpec("doc_create", "documents", "Create a document.",
             _obj({"title": {**_S, "minLength": 1, "maxLength": 120}, "body": {**_S, "maxLength": 20000}},
                  ("title", "body")), _doc_create, True),
    ToolSpec("doc_update", "documents", "Replace a document's body.",
             _obj({"doc_id": _ID, "body": {**_S, "maxLength": 20000}}, ("doc_id", "body")), _doc_update, True),
    ToolSpec("doc_share", "documents", "Share your document with users.",
             _obj({"doc_id": _ID, "user_ids": {"type": "array", "items": _ID, "minItems": 1, "maxItems": 10},
                   "role": {**_S, "enum": ["viewer", "editor"]}}, ("doc_id", "user_ids", "role")), _doc_share, True),
    ToolSpec("cal_list_events", "calendar", "Your events (owned or invited) starting on a date.",
             _obj({"date": _DATE, "limit": _LIMIT}, ("date",)), _cal_list_events),
    ToolSpec("cal_create_event", "calendar", "Create an event on your calendar (no overlaps with your events).",
             _obj({"title": {**_S, "minLength": 1, "maxLength": 80}, "start": _TIME,
                   "duration_min": {"type": "integer", "minimum": 5, "maximum": 480}},
                  ("title", "start", "duration_min")), _cal_create_event, True),
    ToolSpec("cal_invite", "calendar", "Invite users to your event.",
             _obj({"event_id": _ID, "user_ids": {"type": "array", "items": _ID, "minItems": 1, "maxItems": 20}},
                  ("event_id", "user_ids")), _cal_invite, True),
    ToolSpec("cal_cancel_event", "calendar", "Cancel (delete) your event.", _obj({"event_id": _ID}, ("event_id",)),
             _cal_cancel_event, True),
]}


def call_tool_sync(conn: sqlite3.Connection, user_id: int, name: str, arguments: Any, *, now: str = DEFAULT_NOW,
                   crash_at: str | None = None) -> dict:
    """Runs one tool call in one transaction; returns ``{"ok": True, "result": ...}`` or ``{"ok": False,
    "error": ToolError.as_dict()}``. Validation happens inside the transaction; any error rolls back."""
    spec = TOOLS.get(name)
    if spec is None:
        return {"ok": False, "error": ToolError("schema_violation", "unknown_tool", f"unknown tool {name!r}; "
                                                f"available: {sorted(TOOLS)}", {"available": sorted(TOOLS)}).as_dict()}
    ctx = _Ctx(conn, user_id, now, crash_at)
    try:
        with dbm.transaction(conn):
            args = _validate(spec, arguments if arguments is not None else {})
            result = spec.fn(ctx, args)
    except ToolError as e:
        return {"ok": False, "error": e.as_dict()}
    return {"ok": True, "result": result}


def resolve_user(conn: sqlite3.Connection, user: str | int) -> int:
    """The id of the account ``user`` (an id or a handle). Raises ValueError naming it if unknown."""
    row = conn.execute("SELECT id FROM users WHERE id = ? OR handle = ?", (user if str(user).isdigit() else -1,
                                                                           str(user))).fetchone()
    if row is None:
        raise ValueError(f"user: no account with id or handle {user!r} in the database")
    return int(row["id"])


def make_server(db_path: str | os.PathLike, user: str | int, *, now: str = DEFAULT_NOW,
                crash_at: str | None = None) -> Server:
    """The MCP server (``mcp.server.Server``, lowlevel API) of the database at ``db_path``, bound to the
    account ``user`` (id or handle). ``crash_at`` names a tool inside whose first write the process
    exits abruptly (fault injection for the durability test)."""
    if crash_at is not None and crash_at not in TOOLS:
        raise ValueError(f"crash_at must be a tool name, one of {sorted(TOOLS)}; got {crash_at!r}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", now):
        raise ValueError(f"now must look like YYYY-MM-DDTHH:MM, got {now!r}")
    conn = dbm.connect(db_path)
    user_id = resolve_user(conn, user)
    tools = [types.Tool(name=s.name, description=f"[{s.app}] {s.description}", input_schema=s.schema)
             for s in TOOLS.values()]
    lock = anyio.Lock()

    async def on_list_tools(ctx, params):
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx, params):
        async with lock:  # one connection per server: serialise its transactions
            out = call_tool_sync(conn, user_id, params.name, params.arguments, now=now, crash_at=crash_at)
        if out["ok"]:
            return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(out["result"]))],
                                        structured_content=out["result"], is_error=False)
        err = out["error"]
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"{err['type']} error: {err['message']}")],
                                    structured_content={"error": err}, is_error=True)

    return Server("mcp-persona", version="1.0", instructions=f"Personal apps of user {user_id}: messaging, social "
                  "feed, documents, calendar.", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def main(argv: list[str] | None = None) -> None:
    """Command line: serve the database over stdio, bound to one user."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="SQLite file (created and migrated if needed)")
    p.add_argument("--user", required=True, help="the account (id or handle) this server acts for")
    p.add_argument("--now", default=DEFAULT_NOW, help="timestamp written on new rows")
    p.add_argument("--crash-at", default=None, help="fault injection: exit inside this tool's transaction")
    a = p.parse_args(argv)
    server = make_server(a.db, a.user, now=a.now, crash_at=a.crash_at)
    from mcp.server.stdio import stdio_server

    async def run():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main(sys.argv[1:])
