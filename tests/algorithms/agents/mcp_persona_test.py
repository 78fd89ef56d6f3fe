"""MCP-Persona: SQLite state + migrations, the MCP server through the SDK's client (in-memory and stdio),
error taxonomy and rollback, private state across concurrent sessions, crash durability, task checkers
against brute force, scripted agents and metrics."""

import itertools
import random
import re

import anyio
import mcp_types as types
import pytest

from algorithms.agents.mcp_persona import agents as ag
from algorithms.agents.mcp_persona import db as dbm
from algorithms.agents.mcp_persona import harness as hs
from algorithms.agents.mcp_persona import server as sv
from algorithms.agents.mcp_persona import tasks as tk


@pytest.fixture
def world(tmp_path):
    """A small generated world on disk; returns (path, personas)."""
    path = tmp_path / "world.db"
    conn = dbm.connect(path)
    ps = tk.generate_world(conn, seed=3, num_users=8, num_personas=2)
    conn.close()
    return path, ps


def _dump(path):
    conn = dbm.connect(path)
    try:
        return dbm.dump(conn)
    finally:
        conn.close()


def _valid_calls(conn, me):
    """One valid call per tool (ids taken from the database) and what its result must contain."""
    other = conn.execute("SELECT id FROM users WHERE id != ? AND moved_to IS NULL ORDER BY id LIMIT 1",
                         (me,)).fetchone()[0]
    handle = conn.execute("SELECT handle FROM users WHERE id = ?", (other,)).fetchone()[0]
    group = conn.execute("SELECT g.name FROM groups g JOIN group_members m ON m.group_id = g.id WHERE m.user_id = ?",
                         (me,)).fetchone()[0]
    doc = conn.execute("SELECT id, title FROM documents WHERE owner_id = ? ORDER BY id LIMIT 1", (me,)).fetchone()
    unread = conn.execute("SELECT id FROM messages WHERE recipient_id = ? ORDER BY id LIMIT 1", (me,)).fetchone()
    post = conn.execute("SELECT id FROM posts WHERE visibility = 'public' AND author_id != ? ORDER BY id LIMIT 1",
                        (me,)).fetchone()[0]
    non_followed = conn.execute("SELECT id FROM users WHERE id != ? AND id NOT IN (SELECT followee_id FROM follows "
                                "WHERE follower_id = ?) ORDER BY id LIMIT 1", (me, me)).fetchone()[0]
    ev = conn.execute("SELECT id, start FROM events WHERE owner_id = ? ORDER BY id LIMIT 1", (me,)).fetchone()
    return [
        ("server_info", {}, lambda r: r["user_id"] == me and r["schema_version"] == dbm.SCHEMA_VERSION),
        ("whoami", {}, lambda r: r["user"]["id"] == me),
        ("find_user", {"query": handle}, lambda r: r["users"][0]["id"] == other),
        ("list_group_members", {"group": group}, lambda r: me in [u["id"] for u in r["members"]]),
        ("profile_get", {}, lambda r: set(r["preferences"]) == {"signature", "default_visibility", "pin"}),
        ("msg_send", {"recipient_id": other, "body": "round trip"}, lambda r: r["message_id"] > 0),
        ("msg_list", {"with_user_id": other, "limit": 5}, lambda r: r["messages"][0]["body"] == "round trip"),
        ("msg_mark_read", {"message_id": unread[0]}, lambda r: r["read"] is True),
        ("social_post", {"body": "hello feed", "visibility": "followers"}, lambda r: r["post_id"] > 0),
        ("social_user_posts", {}, lambda r: r["posts"][0]["body"] == "hello feed"),
        ("social_follow", {"user_id": non_followed}, lambda r: r["following"] == non_followed),
        ("social_like", {"post_id": post}, lambda r: r["liked"] == post),
        ("doc_search", {"query": doc["title"]}, lambda r: doc["id"] in [d["id"] for d in r["documents"]]),
        ("doc_get", {"doc_id": doc["id"]}, lambda r: r["your_role"] == "owner"),
        ("doc_create", {"title": "Fresh doc", "body": "x"}, lambda r: r["doc_id"] > 0),
        ("doc_update", {"doc_id": doc["id"], "body": "new body"}, lambda r: r["version"] == 2),
        ("doc_share", {"doc_id": doc["id"], "user_ids": [other], "role": "editor"}, lambda r: r["role"] == "editor"),
        ("cal_list_events", {"date": ev["start"][:10]}, lambda r: ev["id"] in [e["id"] for e in r["events"]]),
        ("cal_create_event", {"title": "RT", "start": "2026-06-27T10:00", "duration_min": 30},
         lambda r: r["event_id"] > 0),
        ("cal_invite", {"event_id": ev["id"], "user_ids": [other]}, lambda r: r["invited"] == [other]),
        ("cal_cancel_event", {"event_id": ev["id"]}, lambda r: r["cancelled"] == ev["id"]),
    ]


# ----------------------------------------------------------------------------------------------
# Database.
# ----------------------------------------------------------------------------------------------


def test_migration_v1_to_v2_keeps_rows_and_adds_columns(tmp_path):
    conn = dbm.connect(tmp_path / "a.db", migrate_to=1)
    assert dbm.schema_version(conn) == 1
    with dbm.transaction(conn):
        conn.execute("INSERT INTO users (id, handle, name) VALUES (1, 'a', 'A'), (2, 'b', 'B')")
        conn.execute("INSERT INTO documents (owner_id, title, body, updated_at) VALUES (1, 't', 'b', 'x')")
    with pytest.raises(Exception):
        conn.execute("SELECT moved_to FROM users")
    assert dbm.migrate(conn) == dbm.SCHEMA_VERSION == 2
    assert dbm.rows(conn, "SELECT id, moved_to FROM users ORDER BY id") == [{"id": 1, "moved_to": None},
                                                                          {"id": 2, "moved_to": None}]
    assert conn.execute("SELECT version FROM documents").fetchone()[0] == 1
    assert dbm.migrate(conn) == 2 and dbm.schema_version(conn) == 2  # idempotent
    with pytest.raises(ValueError, match="to must be"):
        dbm.migrate(conn, to=7)
    with pytest.raises(ValueError, match="cannot migrate down"):
        dbm.migrate(conn, to=1)


def test_transaction_rolls_back_on_error(tmp_path):
    conn = dbm.connect(tmp_path / "a.db")
    with pytest.raises(RuntimeError, match="boom"):
        with dbm.transaction(conn):
            conn.execute("INSERT INTO users (handle, name) VALUES ('a', 'A')")
            raise RuntimeError("boom")
    assert conn.execute("SELECT COUNT(*) FROM users").fetchone()[0] == 0


def test_world_foreign_keys_resolve_and_ids_unique(world):
    path, ps = world
    conn = dbm.connect(path)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert len({p.user_id for p in ps}) == len(ps) and all(p.preferences["signature"] for p in ps)
    # Same seed, same world.
    other = dbm.connect(path.parent / "again.db")
    tk.generate_world(other, seed=3, num_users=8, num_personas=2)
    assert dbm.dump(other) == dbm.dump(conn)


# ----------------------------------------------------------------------------------------------
# Every tool through the SDK's client.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["memory", "stdio"])
def test_every_tool_round_trips_through_the_mcp_client(world, transport):
    path, ps = world
    me = ps[0].user_id
    conn = dbm.connect(path)
    calls = _valid_calls(conn, me)
    conn.close()
    assert {c[0] for c in calls} == set(sv.TOOLS)

    async def main():
        async with hs.connect(path, me, transport=transport) as client:
            listed = (await client.list_tools()).tools
            assert {t.name: t.input_schema for t in listed} == {n: s.schema for n, s in sv.TOOLS.items()}
            for name, args, ok in calls:
                res = await client.call_tool(name, args)
                assert not res.is_error, (name, res.content)
                assert ok(res.structured_content), (name, res.structured_content)
                assert isinstance(res.content[0], types.TextContent)

    anyio.run(main)
    conn = dbm.connect(path)  # the writes are in the file
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE body = 'round trip'").fetchone()[0] == 1
    assert conn.execute("SELECT COUNT(*) FROM documents WHERE title = 'Fresh doc'").fetchone()[0] == 1


# ----------------------------------------------------------------------------------------------
# Errors: the four types, rollback.
# ----------------------------------------------------------------------------------------------

MALFORMED = [
    ("msg_send", {"recipient_id": "5", "body": "x"}, "type_mismatch", "wrong_type"),
    ("msg_list", {"limit": "15 results"}, "type_mismatch", "wrong_type"),
    ("doc_share", {"doc_id": 1, "user_ids": 3, "role": "viewer"}, "type_mismatch", "wrong_type"),
    ("msg_send", {"body": "x"}, "schema_violation", "missing_argument"),
    ("msg_send", {"recipient_id": 3, "body": "x", "priority": "high"}, "schema_violation", "unexpected_argument"),
    ("social_post", {"body": "x", "visibility": "friends"}, "schema_violation", "not_in_enum"),
    ("cal_create_event", {"title": "t", "start": "tomorrow 10am", "duration_min": 30}, "schema_violation",
     "bad_pattern"),
    ("no_such_tool", {}, "schema_violation", "unknown_tool"),
    ("msg_list", {"limit": 200}, "boundary", "out_of_range_maximum"),
    ("msg_send", {"recipient_id": 3, "body": "y" * 501}, "boundary", "out_of_range_maxLength"),
    ("msg_send", {"recipient_id": 0, "body": "x"}, "boundary", "out_of_range_minimum"),
    ("cal_create_event", {"title": "t", "start": "2026-06-20T10:00", "duration_min": 600}, "boundary",
     "out_of_range_maximum"),
    ("cal_create_event", {"title": "t", "start": "2026-02-30T10:00", "duration_min": 30}, "boundary",
     "invalid_datetime"),
    ("doc_share", {"doc_id": 1, "user_ids": [], "role": "viewer"}, "boundary", "out_of_range_minItems"),
    ("msg_send", {"recipient_id": 999, "body": "x"}, "semantic", "not_found"),
    ("msg_send", {"recipient_id": 1, "body": "x"}, "semantic", "self_message"),
]


def test_malformed_calls_get_typed_errors_and_leave_the_database_unchanged(world):
    path, ps = world
    me = ps[0].user_id
    conn = dbm.connect(path)
    my_doc = conn.execute("SELECT id FROM documents WHERE owner_id = ? LIMIT 1", (me,)).fetchone()[0]
    my_ev = conn.execute("SELECT id, start, duration_min FROM events WHERE owner_id = ? LIMIT 1", (me,)).fetchone()
    others = [r[0] for r in conn.execute("SELECT id FROM users WHERE id != ? ORDER BY id", (me,))]
    conn.close()
    cases = [(t, {**a, "doc_id": my_doc} if "doc_id" in a else a, e, c) for t, a, e, c in MALFORMED]
    # Multi-row writes that fail half way: the first row is written, then rolled back.
    cases += [("cal_invite", {"event_id": my_ev["id"], "user_ids": [others[0], 999]}, "semantic", "not_found"),
              ("doc_share", {"doc_id": my_doc, "user_ids": [others[0], me], "role": "viewer"}, "semantic",
               "share_with_owner"),
              ("cal_create_event", {"title": "clash", "start": my_ev["start"], "duration_min": 30}, "semantic",
               "conflict")]
    before = _dump(path)

    async def main():
        async with hs.connect(path, me) as client:
            for tool, args, etype, code in cases:
                res = await client.call_tool(tool, args)
                assert res.is_error, (tool, args)
                err = res.structured_content["error"]
                assert (err["type"], err["code"]) == (etype, code), (tool, args, err)
                assert res.content[0].text.startswith(f"{etype} error: ")
                assert err["message"]

    anyio.run(main)
    assert _dump(path) == before


def test_semantic_errors_carry_recoverable_hints(world):
    path, ps = world
    me = ps[0].user_id
    conn = dbm.connect(path)
    with dbm.transaction(conn):
        moved = 5
        new = tk._move_account(conn, moved)
        stranger = conn.execute("SELECT id FROM users WHERE id NOT IN (SELECT followee_id FROM follows WHERE "
                                "follower_id = ?) AND id != ? LIMIT 1", (me, me)).fetchone()[0]
        hidden = conn.execute("INSERT INTO posts (author_id, body, visibility, created_at) VALUES (?, 'h', "
                              "'followers', 'x')", (stranger,)).lastrowid
        title = conn.execute("SELECT title FROM documents WHERE owner_id = ? LIMIT 1", (me,)).fetchone()[0]
    conn.close()
    out = {}
    conn = dbm.connect(path)
    out["moved"] = sv.call_tool_sync(conn, me, "msg_send", {"recipient_id": moved, "body": "x"})
    out["hidden_list"] = sv.call_tool_sync(conn, me, "social_user_posts", {"user_id": stranger})
    out["hidden"] = sv.call_tool_sync(conn, me, "social_like", {"post_id": hidden})
    out["title"] = sv.call_tool_sync(conn, me, "doc_create", {"title": title, "body": "b"})
    assert out["moved"]["error"]["code"] == "user_moved" and out["moved"]["error"]["hint"]["moved_to"] == new
    assert out["hidden_list"]["result"]["posts"][0]["body"] == "[visible to followers only]"
    assert out["hidden"]["error"]["hint"]["author_id"] == stranger
    assert out["title"]["error"]["code"] == "title_exists"
    # Recovery works: follow, then like.
    assert sv.call_tool_sync(conn, me, "social_follow", {"user_id": stranger})["ok"]
    assert sv.call_tool_sync(conn, me, "social_like", {"post_id": hidden})["ok"]
    assert sv.call_tool_sync(conn, me, "social_like", {"post_id": hidden})["error"]["code"] == "already_liked"


# ----------------------------------------------------------------------------------------------
# Concurrent sessions, private state.
# ----------------------------------------------------------------------------------------------


def test_concurrent_sessions_do_not_see_each_others_private_state(world):
    path, ps = world
    a, b = ps[0].user_id, ps[1].user_id
    seen = {}

    async def session(me, other, tag):
        async with hs.connect(path, me) as client:
            s = hs.ToolSession(client)
            third = 8 if 8 not in (me, other) else 7
            ok1, doc = await s.call("doc_create", {"title": f"secret {tag}", "body": f"private {tag}"})
            ok2, _ = await s.call("msg_send", {"recipient_id": third, "body": f"dm {tag}"})
            ok3, ev = await s.call("cal_create_event", {"title": f"hidden {tag}", "start": "2026-06-28T09:00",
                                                        "duration_min": 30})
            assert ok1 and ok2 and ok3
            await anyio.sleep(0.05)  # let the other session write too
            seen[tag] = {"doc": doc["doc_id"], "event": ev["event_id"], "profile": (await s.call("profile_get", {}))[1]}
            await anyio.sleep(0.05)
            _, docs = await s.call("doc_search", {"query": "secret", "limit": 50})
            _, msgs = await s.call("msg_list", {"limit": 50})
            _, evs = await s.call("cal_list_events", {"date": "2026-06-28"})
            seen[tag] |= {"docs": [d["title"] for d in docs["documents"]], "msgs": [m["body"] for m in msgs["messages"]],
                          "events": [e["title"] for e in evs["events"]]}
            await anyio.sleep(0.1)
            other_tag = "B" if tag == "A" else "A"
            seen[tag]["peek_doc"] = await s.call("doc_get", {"doc_id": seen[other_tag]["doc"]})
            seen[tag]["peek_invite"] = await s.call("cal_invite", {"event_id": seen[other_tag]["event"],
                                                                   "user_ids": [third]})

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(session, a, b, "A")
            tg.start_soon(session, b, a, "B")

    anyio.run(main)
    for tag, me, other in (("A", a, b), ("B", b, a)):
        o = "B" if tag == "A" else "A"
        assert seen[tag]["profile"]["preferences"] == dict(ps[me - 1].preferences)
        assert seen[tag]["docs"] == [f"secret {tag}"]
        assert f"dm {tag}" in seen[tag]["msgs"] and f"dm {o}" not in seen[tag]["msgs"]
        assert seen[tag]["events"] == [f"hidden {tag}"]
        assert seen[tag]["peek_doc"][0] is False and seen[tag]["peek_doc"][1]["code"] == "not_found"
        assert seen[tag]["peek_invite"][0] is False and seen[tag]["peek_invite"][1]["code"] == "not_found"
    assert ps[0].preferences != ps[1].preferences


# ----------------------------------------------------------------------------------------------
# Crash durability (stdio server process killed inside a transaction).
# ----------------------------------------------------------------------------------------------


def test_crash_mid_task_loses_no_committed_write(world):
    path, ps = world
    me = ps[0].user_id
    state = {}

    async def main():
        async with hs.connect(path, me, transport="stdio", crash_at="cal_invite", read_timeout_seconds=20) as client:
            s = hs.ToolSession(client)
            state["pid"] = (await s.call("server_info", {}))[1]["pid"]
            assert (await s.call("msg_send", {"recipient_id": 6, "body": "before crash"}))[0]
            ok, ev = await s.call("cal_create_event", {"title": "durable", "start": "2026-06-26T10:00",
                                                       "duration_min": 30})
            state["event"] = ev["event_id"]
            await s.call("cal_invite", {"event_id": ev["event_id"], "user_ids": [5, 6]})  # server dies here

    with pytest.raises(BaseException) as info:
        anyio.run(main)
    assert "Connection closed" in repr(info.value) or "closed" in repr(info.value).lower()
    import os
    with pytest.raises(ProcessLookupError):  # the server process is gone
        os.kill(state["pid"], 0)
    conn = dbm.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE body = 'before crash'").fetchone()[0] == 1
    assert conn.execute("SELECT title FROM events WHERE id = ?", (state["event"],)).fetchone()[0] == "durable"
    assert conn.execute("SELECT COUNT(*) FROM event_invites WHERE event_id = ?", (state["event"],)).fetchone()[0] == 0
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# ----------------------------------------------------------------------------------------------
# Tasks, checkers, agents, metrics.
# ----------------------------------------------------------------------------------------------


def _tasks(world_path, tmp_path, *, seeds=(0,)):
    base = dbm.connect(world_path)
    ps = tk.personas(base, 2)
    counter = itertools.count()

    def make():
        p = tmp_path / f"task{next(counter)}.db"
        dbm.copy_database(base, p)
        return dbm.connect(p)

    return tk.generate_tasks(make, ps, seeds=seeds)


def test_checkers_match_bruteforce_under_random_writes(world, tmp_path):
    """On the end states of oracle and guesser episodes, then after each of several random writes by
    random users, the SQL checker agrees with the brute-force one."""
    path, ps = world
    pairs = _tasks(path, tmp_path)[::3]
    rng = random.Random(0)
    write_tools = [n for n, s in sv.TOOLS.items() if s.writes]
    n_true = n_false = 0

    async def episode(i, task, conn, skill):
        await hs.run_episode(task, conn, ag.make_agent(skill), tmp_path / f"ck{i}.db")

    for i, (task, conn) in enumerate(pairs):
        anyio.run(episode, i, task, conn, "oracle" if i % 2 == 0 else "guesser")
        end = dbm.connect(tmp_path / f"ck{i}.db")
        for _ in range(5):
            got, ref = tk.check(end, task.checkpoints), tk.check_bruteforce(end, task.checkpoints)
            assert got == ref, task.task_id
            n_true += sum(got)
            n_false += len(got) - sum(got)
            tool = rng.choice(write_tools)
            args = {k: rng.randint(1, 12) if v.get("type") == "integer" else
                    ([rng.randint(1, 12)] if v.get("type") == "array" else
                     rng.choice(v.get("enum", ["x", "Sounds good, see you then."])))
                    for k, v in sv.TOOLS[tool].schema["properties"].items()}
            sv.call_tool_sync(end, rng.randint(1, 8), tool, args)
        end.close()
    assert n_true > 0 and n_false > 0  # both outcomes exercised


def test_checker_scores_every_subset_of_oracle_writes(world, tmp_path):
    """Tiny case: the invites of a scheduling task; applying any subset S of the oracle's invites gives
    exactly 1 + |S| satisfied checkpoints (event + invited members), by SQL and by brute force."""
    path, ps = world
    base = dbm.connect(path)
    dbm.copy_database(base, tmp_path / "t.db")
    conn = dbm.connect(tmp_path / "t.db")
    task = tk.generate_task(conn, ps[0], "cal_schedule", "none", seed=1)
    cp0 = task.checkpoints[0].where
    members = [cp.where["user_id"] for cp in task.checkpoints[1:]]
    assert members
    ev = sv.call_tool_sync(conn, ps[0].user_id, "cal_create_event",
                           {"title": cp0["title"], "start": cp0["start"], "duration_min": cp0["duration_min"]})
    ev_id = ev["result"]["event_id"]
    for r in range(len(members) + 1):
        for subset in itertools.combinations(members, r):
            conn.execute("DELETE FROM event_invites WHERE event_id = ?", (ev_id,))
            for u in subset:
                conn.execute("INSERT INTO event_invites VALUES (?, ?)", (ev_id, u))
            assert sum(tk.check(conn, task.checkpoints)) == 1 + len(subset)
            assert tk.check(conn, task.checkpoints) == tk.check_bruteforce(conn, task.checkpoints)


def test_fuzzified_instructions_name_no_ids_and_templates_cover_apps(world, tmp_path):
    path, _ = world
    pairs = _tasks(path, tmp_path)
    assert {t.app for t, _ in pairs} == set(sv.APPS)
    assert {t.injected for t, _ in pairs} == {"none", *sv.ERROR_TYPES}
    for task, _ in pairs:
        assert not re.search(r"#\d|\bids?\b|_id", task.instruction), task.instruction
        # Something must be recovered from the environment (an id, or a private preference).
        assert any(isinstance(v, tk.Ref) for s in task.steps for v in s.args.values())


def test_agents_of_graded_skill_and_oracle_solves_every_task(world, tmp_path):
    path, _ = world
    pairs = _tasks(path, tmp_path)

    async def main():
        eps = []
        for skill in ag.SKILLS:
            for i, (task, conn) in enumerate(pairs):
                eps.append(await hs.run_episode(task, conn, ag.make_agent(skill), tmp_path / "ep.db"))
        return eps

    eps = anyio.run(main)
    by = {s: hs.metrics([e for e in eps if e.agent == s]) for s in ag.SKILLS}
    assert by["oracle"]["acc"] == 1.0 and by["oracle"]["sr"] == 1.0
    accs = [by[s]["acc"] for s in ("guesser", "literal", "syntactic", "expert")]
    assert accs == sorted(accs) and accs[0] < accs[-1]
    per_type = {s: hs.group_metrics([e for e in eps if e.agent == s], "injected") for s in ag.SKILLS}
    assert per_type["literal"]["none"]["acc"] == 1.0          # lookups suffice on clean tasks
    assert per_type["syntactic"]["semantic"]["acc"] < per_type["syntactic"]["boundary"]["acc"]
    assert per_type["expert"]["type_mismatch"]["exec_acc"] == 1.0  # schema-aware: no failed call
    for m in by.values():
        assert 0 <= m["sr"] <= m["any_progress"] and 0 <= m["acc"] <= 1


def test_metrics_closed_form():
    ok = hs.ToolCall("t", {}, True, {})
    bad = hs.ToolCall("t", {}, False, {"type": "boundary"})
    eps = [hs.Episode("a", "x", "social", "none", "g", (True, True, False, True, True), (ok, bad)),
           hs.Episode("b", "x", "social", "none", "g", (False, False), (bad,)),
           hs.Episode("c", "x", "calendar", "none", "g", (True,), (ok, ok, ok))]
    m = hs.metrics(eps)
    assert m["acc"] == pytest.approx((0.8 + 0 + 1) / 3) and m["sr"] == pytest.approx(2 / 3)
    assert m["exec_acc"] == pytest.approx(4 / 6) and m["any_progress"] == pytest.approx(2 / 3)
    assert hs.group_metrics(eps, "app")["calendar"]["acc"] == 1.0
    assert eps[1].error_types == {"boundary": 1}
    with pytest.raises(ValueError, match="empty"):
        hs.metrics([])


def test_agent_repairs():
    err = {"type": "type_mismatch", "code": "wrong_type", "hint": {"argument": "limit", "expected": "integer",
                                                                    "got": "15 results"}}
    assert ag.repair_syntactic({"limit": "15 results", "q": 1}, err) == {"limit": 15, "q": 1}
    assert ag.repair_syntactic({"a": 1, "x": 2}, {"type": "schema_violation", "code": "unexpected_argument",
                                                  "hint": {"unexpected": ["x"]}}) == {"a": 1}
    assert ag.repair_syntactic({"limit": 200}, {"type": "boundary", "code": "out_of_range_maximum",
                                                "hint": {"argument": "limit", "maximum": 50}}) == {"limit": 50}
    assert ag.repair_syntactic({"ids": [3, "4"]}, {"type": "type_mismatch", "hint": {
        "argument": "ids.1", "expected": "integer", "got": "4"}}) == {"ids": [3, 4]}
    assert ag.repair_syntactic({}, {"type": "schema_violation", "code": "missing_argument", "hint": {}}) is None
    schema = sv.TOOLS["msg_list"].schema
    assert ag.conform({"limit": "200 results", "junk": 1}, schema) == {"limit": 50}
    assert ag.next_full_hour("2026-06-01T11:30") == "2026-06-01T12:00"
    assert ag.next_full_hour("2026-06-01T11:00") == "2026-06-01T11:00"


def test_bad_input_errors(world, tmp_path):
    path, ps = world
    with pytest.raises(ValueError, match="user: no account"):
        sv.make_server(path, "nobody")
    with pytest.raises(ValueError, match="crash_at"):
        sv.make_server(path, 1, crash_at="rm_rf")
    with pytest.raises(ValueError, match="now must"):
        sv.make_server(path, 1, now="noon")
    conn = dbm.connect(path)
    with pytest.raises(ValueError, match="template must be"):
        tk.generate_task(conn, ps[0], "nope", "none", 0)
    with pytest.raises(ValueError, match="inject for template 'doc_append'"):
        tk.generate_task(conn, ps[0], "doc_append", "semantic", 0)
    with pytest.raises(ValueError, match="already holds users"):
        tk.generate_world(conn, 0)
    with pytest.raises(ValueError, match="num_personas"):
        tk.generate_world(dbm.connect(tmp_path / "e.db"), 0, num_users=5, num_personas=3)
    with pytest.raises(ValueError, match="skill must be"):
        ag.make_agent("genius")
    with pytest.raises(ValueError, match="Checkpoint.op"):
        tk.Checkpoint("x", "users", {}, 1, "<")
    with pytest.raises(ValueError, match="bad column"):
        dbm.count_where(conn, "users", {"id; DROP TABLE users": 1})
    with pytest.raises(ValueError, match="type must be"):
        sv.ToolError("oops", "c", "m")

    async def bad_transport():
        async with hs.connect(path, 1, transport="carrier pigeon"):
            pass

    with pytest.raises(ValueError, match="transport must be"):
        anyio.run(bad_transport)
