"""SQLite state of the MCP-Persona personal applications: schema, migrations, transactions, queries.

The four simulated personal apps of the MCP-Persona reproduction (spec
``papers/specs/rl_alignment_agents.md`` section 12; issue 32 item 2) keep their state in one SQLite
database (Python's ``sqlite3``):

* accounts: ``users`` (public profile; ``moved_to`` points a migrated account to its new id),
  ``groups`` / ``group_members``, and ``preferences`` (each persona's *private* settings);
* social feed: ``posts`` (``public`` or ``followers`` visibility), ``follows``, ``likes``;
* messaging: ``messages`` (direct messages, private to sender and recipient, ``read_at``);
* documents: ``documents`` (private to the owner and the users it is shared with, ``version``),
  ``doc_shares`` (``viewer`` / ``editor``);
* calendar: ``events`` (private to the owner and invitees) and ``event_invites``.

The schema is built by numbered migrations (`MIGRATIONS`) recorded in ``schema_version``; `migrate`
applies the pending ones, each in its own transaction, so a v1 database is upgraded in place without
losing rows. Every write the server does runs inside `transaction` (``BEGIN IMMEDIATE`` ... ``COMMIT``,
``ROLLBACK`` on any exception), and connections use WAL with ``synchronous=FULL`` so a committed write
survives a crash of the process. Times are ``YYYY-MM-DDTHH:MM`` strings (lexicographic = chronological).

Inferred (not in the paper): the concrete tables and columns, the choice of SQLite for the state of
the paper's "Context-Tree" (User -> Calendar -> Event etc. become rows linked by foreign keys).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import Any, Iterator, Mapping, Sequence

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "connect", "migrate", "schema_version", "transaction", "dump",
           "copy_database", "count_where", "where_sql"]

MIGRATIONS: tuple[str, ...] = (
    # v1: the four apps.
    """
    CREATE TABLE users (id INTEGER PRIMARY KEY, handle TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
                        city TEXT NOT NULL DEFAULT '');
    CREATE TABLE groups (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
    CREATE TABLE group_members (group_id INTEGER NOT NULL REFERENCES groups(id),
                                user_id INTEGER NOT NULL REFERENCES users(id), PRIMARY KEY (group_id, user_id));
    CREATE TABLE posts (id INTEGER PRIMARY KEY, author_id INTEGER NOT NULL REFERENCES users(id),
                        body TEXT NOT NULL, visibility TEXT NOT NULL CHECK (visibility IN ('public', 'followers')),
                        created_at TEXT NOT NULL);
    CREATE TABLE follows (follower_id INTEGER NOT NULL REFERENCES users(id),
                          followee_id INTEGER NOT NULL REFERENCES users(id), PRIMARY KEY (follower_id, followee_id));
    CREATE TABLE likes (user_id INTEGER NOT NULL REFERENCES users(id), post_id INTEGER NOT NULL REFERENCES posts(id),
                        PRIMARY KEY (user_id, post_id));
    CREATE TABLE messages (id INTEGER PRIMARY KEY, sender_id INTEGER NOT NULL REFERENCES users(id),
                           recipient_id INTEGER NOT NULL REFERENCES users(id), body TEXT NOT NULL,
                           sent_at TEXT NOT NULL, read_at TEXT);
    CREATE TABLE documents (id INTEGER PRIMARY KEY, owner_id INTEGER NOT NULL REFERENCES users(id),
                            title TEXT NOT NULL, body TEXT NOT NULL, updated_at TEXT NOT NULL);
    CREATE TABLE doc_shares (doc_id INTEGER NOT NULL REFERENCES documents(id),
                             user_id INTEGER NOT NULL REFERENCES users(id),
                             role TEXT NOT NULL CHECK (role IN ('viewer', 'editor')), PRIMARY KEY (doc_id, user_id));
    CREATE TABLE events (id INTEGER PRIMARY KEY, owner_id INTEGER NOT NULL REFERENCES users(id),
                         title TEXT NOT NULL, start TEXT NOT NULL, duration_min INTEGER NOT NULL);
    CREATE TABLE event_invites (event_id INTEGER NOT NULL REFERENCES events(id),
                                user_id INTEGER NOT NULL REFERENCES users(id), PRIMARY KEY (event_id, user_id));
    """,
    # v2: private preferences, account migration, document versions, indexes.
    """
    CREATE TABLE preferences (user_id INTEGER NOT NULL REFERENCES users(id), key TEXT NOT NULL,
                              value TEXT NOT NULL, PRIMARY KEY (user_id, key));
    ALTER TABLE users ADD COLUMN moved_to INTEGER REFERENCES users(id);
    ALTER TABLE documents ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX messages_by_pair ON messages(recipient_id, sender_id);
    CREATE INDEX events_by_owner ON events(owner_id, start);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def connect(path: str | os.PathLike, *, migrate_to: int | None = SCHEMA_VERSION) -> sqlite3.Connection:
    """Opens (creating if needed) the database at ``path`` and migrates it to ``migrate_to``.

    The connection is in autocommit mode (``isolation_level=None``): writes go through `transaction`.
    WAL journal, ``synchronous=FULL``, foreign keys on, a 10 s busy timeout (several server processes
    may share one file). ``migrate_to=None`` leaves the schema as it is.
    """
    conn = sqlite3.connect(os.fspath(path), isolation_level=None, timeout=10.0, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    if migrate_to is not None:
        migrate(conn, to=migrate_to)
    return conn


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; ``ROLLBACK`` (and re-raise) if the body raises anything."""
    if conn.in_transaction:
        raise RuntimeError("transaction: a transaction is already open on this connection (nesting is not supported)")
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    else:
        conn.execute("COMMIT")


def schema_version(conn: sqlite3.Connection) -> int:
    """The number of migrations applied (0 for an empty database)."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection, *, to: int = SCHEMA_VERSION) -> int:
    """Applies migrations ``schema_version(conn)+1 .. to``, each atomically; returns the new version.

    Raises:
      ValueError: if ``to`` is outside ``[0, SCHEMA_VERSION]`` or below the database's version.
    """
    if not 0 <= to <= SCHEMA_VERSION:
        raise ValueError(f"migrate: to must be in [0, {SCHEMA_VERSION}], got {to}")
    current = schema_version(conn)
    if to < current:
        raise ValueError(f"migrate: database is at version {current}, cannot migrate down to {to}")
    for v in range(current + 1, to + 1):
        with transaction(conn):
            for stmt in (s.strip() for s in MIGRATIONS[v - 1].split(";")):
                if stmt:
                    conn.execute(stmt)
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (v,))
    return to


def dump(conn: sqlite3.Connection) -> list[str]:
    """The whole database as SQL statements (`sqlite3.Connection.iterdump`): equal dumps, equal states."""
    return list(conn.iterdump())


def copy_database(src: sqlite3.Connection, dst_path: str | os.PathLike) -> None:
    """Writes a consistent copy of ``src`` to a new file ``dst_path`` (SQLite online backup)."""
    dst = sqlite3.connect(os.fspath(dst_path))
    try:
        src.backup(dst)
    finally:
        dst.close()


def where_sql(where: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """SQL for a conjunction of column conditions; returns ``(clause, params)``.

    A value is an equality test, ``None`` tests ``IS NULL``, the string ``"NOT NULL"`` tests ``IS NOT
    NULL``, and a mapping ``{"table": T, "where": W}`` tests membership in ``SELECT id FROM T WHERE W``.
    """
    parts, params = [], []
    for col, val in where.items():
        if not col.replace("_", "").isalnum():
            raise ValueError(f"where_sql: bad column name {col!r}")
        if val is None:
            parts.append(f"{col} IS NULL")
        elif isinstance(val, str) and val == "NOT NULL":
            parts.append(f"{col} IS NOT NULL")
        elif isinstance(val, Mapping):
            sub, sub_params = where_sql(val["where"])
            parts.append(f"{col} IN (SELECT id FROM {_table(val['table'])} WHERE {sub})")
            params.extend(sub_params)
        else:
            parts.append(f"{col} = ?")
            params.append(val)
    return (" AND ".join(parts) or "1"), params


def _table(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"bad table name {name!r}")
    return name


def count_where(conn: sqlite3.Connection, table: str, where: Mapping[str, Any]) -> int:
    """``SELECT COUNT(*) FROM table WHERE <where_sql(where)>``."""
    clause, params = where_sql(where)
    return int(conn.execute(f"SELECT COUNT(*) FROM {_table(table)} WHERE {clause}", params).fetchone()[0])


def rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Query rows as plain dicts."""
    return [dict(r) for r in conn.execute(sql, params).fetchall()]
