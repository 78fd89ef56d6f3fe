"""Worlds, personas and tasks of the MCP-Persona reproduction: context generation, task generation with
checkable end states, fuzzification and error-type injection.

* `generate_world` fills a fresh database (a "context tree" in SQLite rows: user -> posts / messages /
  documents / events, cross-links by foreign keys) with the paper's four value strategies (spec
  section 12 (b).2): *enumerate* (cities, groups), *free-form* (document and event titles from
  templates), *random* (which users follow, message, share with whom) and *authentic* (post and
  message bodies sampled from a small built-in list of realistic texts).
* A `Persona` is a user with private state: preferences (``signature``, ``default_visibility``)
  only its own server session can read, plus its direct messages, documents and events.
* `generate_task` samples a template (two per app), fills it from the persona's state and
  *fuzzifies* it: the instruction names people, groups, documents and events only by name, so every
  id must be recovered from the environment with a lookup tool (spec (b).3). The task carries
  checkpoints (final-state assertions, `Checkpoint`) and a `Step` plan the scripted agents execute.
* Error injection (``inject`` = one of the four error types) changes the instruction so that the
  natural first attempt provokes that error from the server: ``type_mismatch`` writes a list size
  as text ("15 results"), ``boundary`` asks for more items than a list tool allows (limit > 50),
  ``schema_violation`` asks for an option the tool does not have (an unknown argument), and
  ``semantic`` changes the state so a well-formed call conflicts with it (the recipient's account
  has moved, the post is followers-only, the slot is taken). The checkpoints always describe the
  correct end state, so the task stays solvable by an agent that reads the server's errors.

Checkpoint scores give the paper's metrics (spec (b).4, inferred definitions): Acc = mean fraction
of satisfied checkpoints, SR-0.8 = fraction of tasks with score >= 0.8 (see `harness.metrics`).

Inferred (the paper's generator is LLM-based and not public): the templates, the injection
mechanisms and the checkpoint language are ours.
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from typing import Any, Callable, Mapping, Sequence

from algorithms.agents.mcp_persona import db as dbm
from algorithms.agents.mcp_persona.server import APPS, ERROR_TYPES

__all__ = ["Checkpoint", "Step", "Task", "Persona", "TEMPLATES", "INJECTIONS", "generate_world", "personas",
           "generate_task", "generate_tasks", "check", "check_bruteforce", "template_app", "Ref", "Surface"]

_FIRST = ["Alex", "Dana", "Kai", "Mira", "Noah", "Priya", "Sam", "Lena", "Omar", "Yuki", "Ines", "Tomas", "Zoe",
          "Ravi", "Elif", "Jonas", "Aiko", "Marco", "Nadia", "Felix"]
_LAST = ["Kim", "Okafor", "Schmidt", "Lopez", "Chen", "Novak", "Haddad", "Berg", "Sato", "Moreau"]
_CITIES = ["Berlin", "Lagos", "Osaka", "Lima", "Toronto", "Pune", "Lyon", "Austin"]  # enumerate
_GROUPS = ["Design Team", "Climbing Club", "Book Circle", "Platform Infra", "Parents Council", "Choir"]
_AUTHENTIC = [  # authentic-style texts (hand written for this library)
    "Anyone up for a sunrise hike on Saturday?", "Finally finished the quarterly report, time for coffee.",
    "The new ramen place on 5th street is worth the queue.", "Reminder: the library closes early today.",
    "Just ran my first 10k in under an hour!", "Looking for recommendations for a sci-fi audiobook.",
    "Our team shipped the new onboarding flow today.", "Rain all week, perfect excuse to bake bread.",
    "Can someone lend me a projector for Friday?", "Photos from the climbing trip are up in the album.",
    "Who else is going to the jazz night on Thursday?", "Tried a new pasta recipe, turned out great.",
]
_MSG_TEXTS = ["Are we still on for lunch?", "Sent you the slides, have a look.", "Thanks for covering for me!",
              "Can you review my draft by Monday?", "The meeting moved to 3pm.", "Happy birthday!!",
              "Did you get the tickets?", "Running ten minutes late, sorry."]
_REPLY_TEXTS = ["Sounds good, see you then.", "Got it, thanks!", "On it, will reply tonight.",
                "Yes, count me in.", "Let me check and get back to you."]
_NEW_POSTS = ["Weekend plan: farmers market and a long walk.", "Grateful for a team that ships.",
              "New blog post on data pipelines is live.", "Learning to play the cello, day 12."]
_DOC_TOPICS = ["Trip plan", "Budget", "Reading list", "Meeting notes", "Project brief", "Recipes"]
_DOC_LINES = ["Book the train tickets.", "Ask Sam about the venue.", "Total so far: 420 EUR.",
              "Follow up with legal next week.", "Add the appendix on metrics."]
_EVENT_TOPICS = ["Sync", "Planning", "Review", "Coffee chat", "Retro", "Workshop"]
_VISIBILITY_WORDS = {"public": "publicly", "followers": "to your followers only"}
_EXTRA_OPTION = {  # schema_violation injection: an option the instruction asks for that the tool lacks
    "msg_send": ("priority", "high", "mark it high priority"),
    "msg_mark_read": ("archive", True, "and archive it"),
    "social_post": ("tags", ["life"], "tag it #life"),
    "social_like": ("reaction", "heart", "use a heart reaction"),
    "doc_share": ("notify", True, "notify them by email"),
    "doc_update": ("append", True, "as an append"),
    "cal_create_event": ("reminder_min", 10, "with a 10-minute reminder"),
    "cal_cancel_event": ("notify_attendees", True, "notifying attendees"),
}


@dataclasses.dataclass(frozen=True)
class Persona:
    """A benchmark user: id, handle, name and its private preferences."""

    user_id: int
    handle: str
    name: str
    preferences: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A final-state assertion: the number of rows of ``table`` matching ``where`` (see `db.where_sql`)
    compares to ``count`` with ``op`` ('==' or '>=')."""

    description: str
    table: str
    where: Mapping[str, Any]
    count: int = 1
    op: str = "=="

    def __post_init__(self):
        if self.op not in ("==", ">="):
            raise ValueError(f"Checkpoint.op must be '==' or '>=', got {self.op!r}")


@dataclasses.dataclass(frozen=True)
class Ref:
    """An argument the instruction does not give: ``fn(memory)`` computes it from earlier results
    (``memory[save_as]`` = a step's result). Fuzzified ids are Refs; a guessing agent replaces them."""

    fn: Callable[[Mapping[str, Any]], Any]
    guess_range: int = 0  # > 0: an id an agent without lookups would guess in [1, guess_range]
    listy: bool = False  # the value is a list of ids (a guess is a one-element list)


@dataclasses.dataclass(frozen=True)
class Surface:
    """An argument as the instruction writes it (``surface``) and its correct JSON value (``canonical``)."""

    surface: Any
    canonical: Any


@dataclasses.dataclass(frozen=True)
class Step:
    """One tool call of a task's plan: arguments (plain values, `Ref` or `Surface`), an optional
    unsupported option the instruction asks for (``extra``: name -> value, the schema_violation
    injection) and ``save_as`` (the memory key of its result)."""

    tool: str
    args: Mapping[str, Any]
    save_as: str = ""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Task:
    """A generated task."""

    task_id: str
    template: str
    app: str
    persona: Persona
    instruction: str
    injected: str  # "none" or one of ERROR_TYPES
    steps: tuple[Step, ...]
    checkpoints: tuple[Checkpoint, ...]
    world_seed: int


# ---------------------------------------------------------------------------------------------
# World generation.
# ---------------------------------------------------------------------------------------------

def _day(d: int) -> str:
    return f"2026-06-{d:02d}"


def generate_world(conn: sqlite3.Connection, seed: int, *, num_users: int = 16, num_personas: int = 4) -> list[Persona]:
    """Fills an empty, migrated database with a random world; returns its personas (users 1..num_personas).

    Args:
      conn: a connection from `db.connect` on an empty database.
      seed: the RNG seed (the same seed gives the same world).
      num_users: users in the world (>= num_personas + 4).
      num_personas: how many users get preferences and rich private state.
    """
    if not 1 <= num_personas <= 4 or num_users < num_personas + 4:
        raise ValueError(f"need 1 <= num_personas <= 4 and num_users >= num_personas + 4; got num_users={num_users}, "
                         f"num_personas={num_personas}")
    if conn.execute("SELECT COUNT(*) FROM users").fetchone()[0]:
        raise ValueError("generate_world: the database already holds users")
    rng = random.Random(seed)
    names = rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], num_users)
    with dbm.transaction(conn):
        for i, name in enumerate(names, 1):
            handle = name.lower().replace(" ", "_")
            conn.execute("INSERT INTO users (id, handle, name, city) VALUES (?, ?, ?, ?)",
                         (i, handle, name, rng.choice(_CITIES)))
        for gi, g in enumerate(rng.sample(_GROUPS, 4), 1):
            conn.execute("INSERT INTO groups (id, name) VALUES (?, ?)", (gi, g))
            members = rng.sample(range(1, num_users + 1), rng.randint(3, 5))
            for u in set(members) | {1 + (gi - 1) % num_personas}:  # every persona is in some group
                conn.execute("INSERT INTO group_members VALUES (?, ?)", (gi, u))
        for p in range(1, num_personas + 1):
            conn.execute("INSERT INTO preferences VALUES (?, 'signature', ?)", (p, f"-- {names[p - 1].split()[0]}"))
            conn.execute("INSERT INTO preferences VALUES (?, 'default_visibility', ?)",
                         (p, rng.choice(["public", "followers"])))
            conn.execute("INSERT INTO preferences VALUES (?, 'pin', ?)", (p, f"{rng.randrange(10 ** 4):04d}"))
        for u in range(1, num_users + 1):
            for v in rng.sample([x for x in range(1, num_users + 1) if x != u], 3):
                conn.execute("INSERT OR IGNORE INTO follows VALUES (?, ?)", (u, v))
            for k in range(rng.randint(1, 3)):
                conn.execute("INSERT INTO posts (author_id, body, visibility, created_at) VALUES (?, ?, ?, ?)",
                             (u, rng.choice(_AUTHENTIC), rng.choice(["public", "public", "followers"]),
                              f"{_day(rng.randint(1, 28))}T{rng.randint(7, 22):02d}:00"))
        n_msgs = num_users * 4
        for k in range(n_msgs):
            s, r = rng.sample(range(1, num_users + 1), 2)
            conn.execute("INSERT INTO messages (sender_id, recipient_id, body, sent_at, read_at) VALUES (?, ?, ?, ?, ?)",
                         (s, r, rng.choice(_MSG_TEXTS), f"2026-05-{1 + k % 28:02d}T09:{k % 60:02d}",
                          None if rng.random() < 0.5 else "2026-05-30T10:00"))
        for u in range(1, num_users + 1):
            for topic in rng.sample(_DOC_TOPICS, 2):
                conn.execute("INSERT INTO documents (owner_id, title, body, updated_at) VALUES (?, ?, ?, ?)",
                             (u, f"{topic} {names[u - 1].split()[0]}", rng.choice(_DOC_LINES), "2026-05-20T10:00"))
        for u in range(1, num_users + 1):
            for d in rng.sample(range(2, 20), 3):
                h = rng.randint(8, 16)
                cur = conn.execute("INSERT INTO events (owner_id, title, start, duration_min) VALUES (?, ?, ?, ?)",
                                   (u, f"{rng.choice(_EVENT_TOPICS)} {d}", f"{_day(d)}T{h:02d}:00",
                                    rng.choice([30, 45, 60])))
                for v in rng.sample([x for x in range(1, num_users + 1) if x != u], 1):
                    conn.execute("INSERT INTO event_invites VALUES (?, ?)", (cur.lastrowid, v))
    return personas(conn, num_personas)


def personas(conn: sqlite3.Connection, num_personas: int) -> list[Persona]:
    """The personas 1..num_personas of a generated world."""
    out = []
    for p in range(1, num_personas + 1):
        u = conn.execute("SELECT handle, name FROM users WHERE id = ?", (p,)).fetchone()
        prefs = {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM preferences WHERE user_id = ?", (p,))}
        out.append(Persona(p, u["handle"], u["name"], prefs))
    return out


# ---------------------------------------------------------------------------------------------
# Templates. Each returns (instruction, steps, checkpoints); it may write setup rows (injections).
# ---------------------------------------------------------------------------------------------

def _list_limit(inject: str, rng: random.Random, default: int = 10) -> tuple[Any, str]:
    """The list-size argument and its instruction text under the type_mismatch / boundary injections."""
    if inject == "type_mismatch":
        n = rng.choice([15, 20, 25])
        return Surface(f"{n} results", n), f" (show '{n} results' per lookup)"
    if inject == "boundary":
        n = rng.choice([100, 200, 500])
        return Surface(n, 50), f" (look through {n} items per lookup)"
    return default, ""


def _extra(tool: str, inject: str) -> tuple[dict, str]:
    if inject != "schema_violation":
        return {}, ""
    name, value, text = _EXTRA_OPTION[tool]
    return {name: value}, f", {text}"


def _other_user(conn, rng, persona_id, *, exclude=()) -> dict:
    rows = dbm.rows(conn, "SELECT id, name, handle FROM users WHERE id != ? AND moved_to IS NULL ORDER BY id",
                    (persona_id,))
    rows = [r for r in rows if r["id"] not in exclude]
    return rng.choice(rows)


def _unique_name(conn, name) -> bool:
    return conn.execute("SELECT COUNT(*) FROM users WHERE lower(name) LIKE ? OR lower(handle) LIKE ?",
                        (f"%{name.lower()}%", f"%{name.lower()}%")).fetchone()[0] == 1


def _user_by_name(mem, key="who"):
    return mem[key]["users"][0]["id"]


def _move_account(conn, uid) -> int:
    """Semantic injection: user ``uid`` migrates to a new account; returns the new id."""
    u = conn.execute("SELECT handle, name, city FROM users WHERE id = ?", (uid,)).fetchone()
    new = conn.execute("INSERT INTO users (handle, name, city) VALUES (?, ?, ?)",
                       (u["handle"] + "_v2", u["name"] + " (new account)", u["city"])).lastrowid
    conn.execute("UPDATE users SET moved_to = ? WHERE id = ?", (new, uid))
    return new


def _t_msg_signed(conn, rng, p: Persona, inject):
    n_users = conn.execute("SELECT COUNT(*) FROM users").fetchone()[0]
    target = _other_user(conn, rng, p.user_id)
    text = rng.choice(_MSG_TEXTS)
    body = f"{text}\n{p.preferences['signature']}"
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("msg_send", inject)
    recipient = target["id"]
    if inject == "semantic":
        recipient = _move_account(conn, target["id"])
    instr = (f"Send {target['name']} the message \"{text}\", signed with your usual signature{etext}{ltext}.")
    steps = (
        Step("find_user", {"query": target["handle"], "limit": limit}, "who"),
        Step("profile_get", {}, "me"),
        Step("msg_send", {"recipient_id": Ref(_user_by_name, n_users),
                          "body": Ref(lambda m: f"{text}\n{m['me']['preferences']['signature']}")}, "sent", extra),
    )
    cps = (Checkpoint("signed message delivered to the (current) account", "messages",
                      {"sender_id": p.user_id, "recipient_id": recipient, "body": body}),
           Checkpoint("exactly one new message sent", "messages",
                      {"sender_id": p.user_id, "read_at": None, "sent_at": "2026-06-01T12:00"}, 1))
    return instr, steps, cps


def _t_msg_reply(conn, rng, p: Persona, inject):
    n_users = conn.execute("SELECT COUNT(*) FROM users").fetchone()[0]
    senders = dbm.rows(conn, "SELECT DISTINCT sender_id FROM messages WHERE recipient_id = ? AND read_at IS NULL "
                       "ORDER BY sender_id", (p.user_id,))
    if not senders:  # make one
        other = _other_user(conn, rng, p.user_id)
        conn.execute("INSERT INTO messages (sender_id, recipient_id, body, sent_at) VALUES (?, ?, ?, ?)",
                     (other["id"], p.user_id, rng.choice(_MSG_TEXTS), "2026-05-31T08:00"))
        senders = [{"sender_id": other["id"]}]
    sid = rng.choice(senders)["sender_id"]
    sender = conn.execute("SELECT id, name, handle FROM users WHERE id = ?", (sid,)).fetchone()
    latest = conn.execute("SELECT MAX(id) FROM messages WHERE sender_id = ? AND recipient_id = ? AND read_at IS NULL",
                          (sid, p.user_id)).fetchone()[0]
    reply = rng.choice(_REPLY_TEXTS)
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("msg_mark_read", inject)
    recipient = sid
    if inject == "semantic":
        recipient = _move_account(conn, sid)
    instr = (f"Reply \"{reply}\" to {sender['name']}'s latest unread message to you, then mark that message "
             f"read{etext}{ltext}.")
    steps = (
        Step("find_user", {"query": sender["handle"], "limit": limit}, "who"),
        Step("msg_list", {"with_user_id": Ref(_user_by_name, n_users), "unread_only": True, "limit": limit}, "inbox"),
        Step("msg_send", {"recipient_id": Ref(_user_by_name, n_users), "body": reply}, "sent"),
        Step("msg_mark_read", {"message_id": Ref(lambda m: m["inbox"]["messages"][0]["id"], 200)}, "read", extra),
    )
    cps = (Checkpoint("reply delivered", "messages", {"sender_id": p.user_id, "recipient_id": recipient,
                                                      "body": reply}),
           Checkpoint("latest unread message marked read", "messages", {"id": latest, "read_at": "NOT NULL"}))
    return instr, steps, cps


def _t_social_post(conn, rng, p: Persona, inject):
    text = rng.choice(_NEW_POSTS)
    vis = p.preferences["default_visibility"]
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("social_post", inject)
    instr = (f"Unless you already posted it (check your recent posts{ltext}), post \"{text}\" with your default "
             f"visibility{etext}.")
    steps = (
        Step("social_user_posts", {"limit": limit}, "mine"),
        Step("profile_get", {}, "me"),
        Step("social_post", {"body": text, "visibility": Ref(lambda m: m["me"]["preferences"]["default_visibility"])},
             "posted", extra),
    )
    cps = (Checkpoint("post published exactly once", "posts", {"author_id": p.user_id, "body": text}),
           Checkpoint("post has the default visibility", "posts",
                      {"author_id": p.user_id, "body": text, "visibility": vis}))
    return instr, steps, cps


def _t_social_like(conn, rng, p: Persona, inject):
    n_posts = conn.execute("SELECT COUNT(*) FROM posts").fetchone()[0]
    n_users = conn.execute("SELECT COUNT(*) FROM users").fetchone()[0]
    followed = {r["followee_id"] for r in dbm.rows(conn, "SELECT followee_id FROM follows WHERE follower_id = ?",
                                                   (p.user_id,))}
    if inject == "semantic":
        pool = [u for u in range(1, n_users + 1) if u != p.user_id and u not in followed]
    else:
        pool = sorted(followed)
    uid = rng.choice(pool)
    who = conn.execute("SELECT id, name, handle FROM users WHERE id = ?", (uid,)).fetchone()
    vis = "followers" if inject == "semantic" else rng.choice(["public", "followers"])
    post = conn.execute("INSERT INTO posts (author_id, body, visibility, created_at) VALUES (?, ?, ?, ?)",
                        (uid, rng.choice(_AUTHENTIC), vis, "2026-05-31T20:00")).lastrowid
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("social_like", inject)
    instr = f"Like {who['name']}'s most recent post{etext}{ltext}."
    steps = (
        Step("find_user", {"query": who["handle"], "limit": limit}, "who"),
        Step("social_user_posts", {"user_id": Ref(_user_by_name, n_users), "limit": limit}, "posts"),
        Step("social_like", {"post_id": Ref(lambda m: m["posts"]["posts"][0]["id"], n_posts)}, "liked", extra),
    )
    cps = (Checkpoint("most recent post liked", "likes", {"user_id": p.user_id, "post_id": post}),
           Checkpoint("no other post liked", "likes", {"user_id": p.user_id}, 1 + conn.execute(
               "SELECT COUNT(*) FROM likes WHERE user_id = ?", (p.user_id,)).fetchone()[0]))
    return instr, steps, cps


def _t_doc_share(conn, rng, p: Persona, inject):
    n_docs = conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
    n_users = conn.execute("SELECT COUNT(*) FROM users").fetchone()[0]
    doc = rng.choice(dbm.rows(conn, "SELECT id, title FROM documents WHERE owner_id = ?", (p.user_id,)))
    target = _other_user(conn, rng, p.user_id)
    role = rng.choice(["viewer", "editor"])
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("doc_share", inject)
    uid = target["id"]
    if inject == "semantic":
        uid = _move_account(conn, target["id"])
    instr = f"Share your document \"{doc['title']}\" with {target['name']} as {role}{etext}{ltext}."
    steps = (
        Step("doc_search", {"query": doc["title"], "limit": limit}, "docs"),
        Step("find_user", {"query": target["handle"], "limit": limit}, "who"),
        Step("doc_share", {"doc_id": Ref(lambda m: m["docs"]["documents"][0]["id"], n_docs),
                           "user_ids": Ref(lambda m: [_user_by_name(m)], n_users, True), "role": role}, "shared", extra),
    )
    cps = (Checkpoint("document shared with the right role", "doc_shares",
                      {"doc_id": doc["id"], "user_id": uid, "role": role}),
           Checkpoint("shared with nobody else", "doc_shares", {"doc_id": doc["id"]}, 1 + conn.execute(
               "SELECT COUNT(*) FROM doc_shares WHERE doc_id = ?", (doc["id"],)).fetchone()[0]))
    return instr, steps, cps


def _t_doc_append(conn, rng, p: Persona, inject):
    n_docs = conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
    doc = rng.choice(dbm.rows(conn, "SELECT id, title, body FROM documents WHERE owner_id = ?", (p.user_id,)))
    line = rng.choice(_DOC_LINES)
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("doc_update", inject)
    instr = f"Add the line \"{line}\" at the end of your document \"{doc['title']}\"{etext}{ltext}."
    doc_ref = Ref(lambda m: m["docs"]["documents"][0]["id"], n_docs)
    steps = (
        Step("doc_search", {"query": doc["title"], "limit": limit}, "docs"),
        Step("doc_get", {"doc_id": doc_ref}, "doc"),
        Step("doc_update", {"doc_id": doc_ref, "body": Ref(lambda m: m["doc"]["document"]["body"] + "\n" + line)},
             "updated", extra),
    )
    cps = (Checkpoint("line appended, old body kept", "documents", {"id": doc["id"], "body": doc["body"] + "\n" + line}),
           Checkpoint("updated exactly once", "documents", {"id": doc["id"], "version": 2}))
    return instr, steps, cps


def _t_cal_schedule(conn, rng, p: Persona, inject):
    groups = dbm.rows(conn, "SELECT g.id, g.name FROM groups g JOIN group_members m ON m.group_id = g.id WHERE "
                      "m.user_id = ? ORDER BY g.id", (p.user_id,))
    if not groups:
        raise ValueError(f"persona {p.user_id} is in no group")
    g = rng.choice(groups)
    members = [r["user_id"] for r in dbm.rows(conn, "SELECT user_id FROM group_members WHERE group_id = ? AND "
                                               "user_id != ? ORDER BY user_id", (g["id"], p.user_id))]
    day = _day(rng.randint(21, 28))  # no generated events there
    hour = rng.randint(9, 15)
    dur = rng.choice([30, 45, 60])
    title = f"{g['name']} {rng.choice(_EVENT_TOPICS)}"
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("cal_create_event", inject)
    start = f"{day}T{hour:02d}:00"
    final_start = start
    if inject == "semantic":  # the slot is taken: a 90-minute block from hour:00
        conn.execute("INSERT INTO events (owner_id, title, start, duration_min) VALUES (?, 'Focus time', ?, 90)",
                     (p.user_id, start))
        final_start = f"{day}T{hour + 2:02d}:00"  # first free full hour after the block
    instr = (f"Schedule \"{title}\" on {day} at {hour:02d}:00 for {dur} minutes (if you are busy then, take the "
             f"first free full hour after it) and invite everyone else in the {g['name']} group{etext}{ltext}.")
    steps = (
        Step("list_group_members", {"group": g["name"], "limit": limit}, "grp"),
        Step("whoami", {}, "self"),
        Step("cal_create_event", {"title": title, "start": start, "duration_min": dur}, "ev", extra),
        Step("cal_invite", {"event_id": Ref(lambda m: m["ev"]["event_id"], 100),
                            "user_ids": Ref(lambda m: [u["id"] for u in m["grp"]["members"]
                                                       if u["id"] != m["self"]["user"]["id"]], 0)}, "inv"),
    )
    ev_where = {"table": "events", "where": {"owner_id": p.user_id, "title": title}}
    cps = (Checkpoint("event created at the right (free) time", "events",
                      {"owner_id": p.user_id, "title": title, "start": final_start, "duration_min": dur}),
           *[Checkpoint(f"member {u} invited", "event_invites", {"event_id": ev_where, "user_id": u})
             for u in members])
    return instr, steps, cps


def _t_cal_cancel(conn, rng, p: Persona, inject):
    ev = rng.choice(dbm.rows(conn, "SELECT id, title, start FROM events WHERE owner_id = ?", (p.user_id,)))
    day = ev["start"][:10]
    limit, ltext = _list_limit(inject, rng)
    extra, etext = _extra("cal_cancel_event", inject)
    n_events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    others = conn.execute("SELECT COUNT(*) FROM events WHERE owner_id = ? AND id != ?", (p.user_id, ev["id"])).fetchone()[0]
    instr = f"Cancel your event \"{ev['title']}\" on {day}{etext}{ltext}."
    steps = (
        Step("cal_list_events", {"date": day, "limit": limit}, "day"),
        Step("cal_cancel_event", {"event_id": Ref(lambda m: next(e["id"] for e in m["day"]["events"]
                                                                 if e["title"] == ev["title"]), n_events)},
             "cancelled", extra),
    )
    cps = (Checkpoint("event cancelled", "events", {"id": ev["id"]}, 0),
           Checkpoint("invites of the event removed", "event_invites", {"event_id": ev["id"]}, 0),
           Checkpoint("your other events kept", "events", {"owner_id": p.user_id}, others))
    return instr, steps, cps


TEMPLATES: dict[str, tuple[str, Callable]] = {
    "msg_signed": ("messaging", _t_msg_signed), "msg_reply": ("messaging", _t_msg_reply),
    "social_post": ("social", _t_social_post), "social_like": ("social", _t_social_like),
    "doc_share": ("documents", _t_doc_share), "doc_append": ("documents", _t_doc_append),
    "cal_schedule": ("calendar", _t_cal_schedule), "cal_cancel": ("calendar", _t_cal_cancel),
}
# Which injections each template supports ("none" = clean task).
INJECTIONS: dict[str, tuple[str, ...]] = {
    t: ("none", "type_mismatch", "boundary", "schema_violation")
       + (("semantic",) if t in ("msg_signed", "msg_reply", "social_like", "doc_share", "cal_schedule") else ())
    for t in TEMPLATES}
assert all(app in APPS for app, _ in TEMPLATES.values())
assert all(set(v) - {"none"} <= set(ERROR_TYPES) for v in INJECTIONS.values())


def template_app(template: str) -> str:
    return TEMPLATES[template][0]


def generate_task(conn: sqlite3.Connection, persona: Persona, template: str, inject: str, seed: int,
                  *, world_seed: int = 0) -> Task:
    """Generates one task in the world ``conn`` (a per-task copy: injections may write setup rows).

    Raises:
      ValueError: unknown ``template`` or an ``inject`` the template does not support.
    """
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {sorted(TEMPLATES)}, got {template!r}")
    if inject not in INJECTIONS[template]:
        raise ValueError(f"inject for template {template!r} must be one of {INJECTIONS[template]}, got {inject!r}")
    rng = random.Random(f"{seed}/{template}/{inject}/{persona.user_id}")
    app, fn = TEMPLATES[template]
    with dbm.transaction(conn):
        instr, steps, cps = fn(conn, rng, persona, inject)
    return Task(f"{template}/{inject}/p{persona.user_id}/s{seed}", template, app, persona, instr, inject,
                tuple(steps), tuple(cps), world_seed)


def generate_tasks(make_world: Callable[[], sqlite3.Connection], personas_: Sequence[Persona], *,
                   seeds: Sequence[int], templates: Sequence[str] | None = None,
                   injects: Sequence[str] | None = None) -> list[tuple[Task, sqlite3.Connection]]:
    """All (template x supported injection x persona x seed) tasks, each with its own world copy from
    ``make_world()`` (a fresh connection to a copy of the base world)."""
    out = []
    for t in templates or TEMPLATES:
        for inj in INJECTIONS[t]:
            if injects is not None and inj not in injects:
                continue
            for p in personas_:
                for s in seeds:
                    conn = make_world()
                    out.append((generate_task(conn, p, t, inj, s), conn))
    return out


# ---------------------------------------------------------------------------------------------
# Checking.
# ---------------------------------------------------------------------------------------------

def check(conn: sqlite3.Connection, checkpoints: Sequence[Checkpoint]) -> list[bool]:
    """Whether each checkpoint holds in the database (SQL ``COUNT(*)``)."""
    out = []
    for cp in checkpoints:
        n = dbm.count_where(conn, cp.table, cp.where)
        out.append(n == cp.count if cp.op == "==" else n >= cp.count)
    return out


def _match_py(conn, row: Mapping[str, Any], where: Mapping[str, Any], tables: dict) -> bool:
    for col, val in where.items():
        x = row[col]
        if val is None:
            ok = x is None
        elif isinstance(val, str) and val == "NOT NULL":
            ok = x is not None
        elif isinstance(val, Mapping):
            ok = any(r["id"] == x and _match_py(conn, r, val["where"], tables) for r in _all(conn, val["table"], tables))
        else:
            ok = x == val
        if not ok:
            return False
    return True


def _all(conn, table, tables):
    if table not in tables:
        tables[table] = [dict(r) for r in conn.execute(f"SELECT * FROM {dbm._table(table)}")]
    return tables[table]


def check_bruteforce(conn: sqlite3.Connection, checkpoints: Sequence[Checkpoint]) -> list[bool]:
    """`check` by reading every row into Python and filtering there (the reference for tests)."""
    tables: dict = {}
    out = []
    for cp in checkpoints:
        n = sum(_match_py(conn, r, cp.where, tables) for r in _all(conn, cp.table, tables))
        out.append(n == cp.count if cp.op == "==" else n >= cp.count)
    return out
