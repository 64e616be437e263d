"""Read `opencode.db` as an observer: read-only, one short connection per read.

`settle-proxy settle` refuses while any other process holds the database open, and the test
process would be one: nothing here keeps a connection beyond the call that needs it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

_BUSY_TIMEOUT_S = 5.0

TABLES: dict[str, str] = {
    "part": "SELECT id, session_id, data FROM part",
    "message": "SELECT id, session_id, data FROM message",
    "session_message": "SELECT id, session_id, data FROM session_message",
    "event": "SELECT id, aggregate_id, data FROM event",
    "event_sequence": "SELECT aggregate_id, aggregate_id, seq FROM event_sequence",
}
"""What a snapshot keeps of each table opencode's write-back touches: (key, session, content)."""


@contextmanager
def reading(database: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection that is closed again when the block ends."""
    with closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_S)) as db:
        yield db


def rows(database: Path, sql: str, *parameters: Any) -> list[tuple[Any, ...]]:
    """The rows of one query."""
    with reading(database) as db:
        return list(db.execute(sql, parameters).fetchall())


def integrity(database: Path) -> str:
    """`PRAGMA integrity_check`: "ok", or the problems SQLite found."""
    return "\n".join(str(row[0]) for row in rows(database, "PRAGMA integrity_check"))


def tool_part(database: Path, part_id: str) -> tuple[Any, int]:
    """A v1 tool part row: its stored JSON and `time_updated`."""
    ((data, updated),) = rows(database, "SELECT data, time_updated FROM part WHERE id = ?", part_id)
    return orjson.loads(data), int(updated)


def v2_message(database: Path, message_id: str) -> tuple[Any, int]:
    """A v2 `session_message` row: its stored JSON and `time_updated`."""
    ((data, updated),) = rows(
        database, "SELECT data, time_updated FROM session_message WHERE id = ?", message_id
    )
    return orjson.loads(data), int(updated)


def session_events(database: Path, session_id: str) -> list[tuple[int, str, str, Any]]:
    """The session's durable event log, every type: (seq, type, id, data), by seq."""
    found = rows(
        database, "SELECT seq, type, id, data FROM event WHERE aggregate_id = ? ORDER BY seq", session_id
    )
    return [(int(seq), kind, event_id, orjson.loads(data)) for seq, kind, event_id, data in found]


def event_times(database: Path, sessions: Sequence[str]) -> list[float]:
    """When (epoch seconds, sorted) the sessions' events were written, from the time each carries
    (`time` of v1 part updates, `timestamp` of v2 `session.next.*` events; others carry none)."""
    marks = ",".join("?" * len(sessions))
    found = rows(
        database,
        "SELECT COALESCE(json_extract(data, '$.time'), json_extract(data, '$.timestamp')) FROM event "
        f"WHERE aggregate_id IN ({marks})",
        *sessions,
    )
    return sorted(int(stamp) / 1000 for (stamp,) in found if isinstance(stamp, int))


def last_seq(database: Path, session_id: str) -> int:
    """`event_sequence.seq` of the session: the number the server appends after."""
    ((seq,),) = rows(database, "SELECT seq FROM event_sequence WHERE aggregate_id = ?", session_id)
    return int(seq)


@dataclass(frozen=True)
class Snapshot:
    """The rows write-back may touch, per table: key -> (session, content as stored)."""

    tables: dict[str, dict[str, tuple[str, Any]]]

    def sessions_changed(self, later: Snapshot) -> set[str]:
        """Sessions with a row that `later` changed or added."""
        changed = set()
        for table, before in self.tables.items():
            for key, (session, content) in later.tables[table].items():
                if before.get(key, (session, None))[1] != content:
                    changed.add(session)
        return changed

    def malformed(self) -> list[tuple[str, str]]:
        """(table, key) of every `data` column that is not valid JSON: a half-written row."""
        found = []
        for table, stored in self.tables.items():
            for key, (_, content) in stored.items():
                if isinstance(content, str):
                    try:
                        orjson.loads(content)
                    except orjson.JSONDecodeError:
                        found.append((table, key))
        return found

    def lost_in(self, later: Snapshot) -> list[tuple[str, str]]:
        """(table, key) of every row that `later` no longer has."""
        return [
            (table, key)
            for table, before in self.tables.items()
            for key in before
            if key not in later.tables[table]
        ]


def snapshot(database: Path) -> Snapshot:
    """Every row of the tables in `TABLES`, read in one transaction (a consistent view)."""
    tables: dict[str, dict[str, tuple[str, Any]]] = {}
    with reading(database) as db:
        db.execute("BEGIN")
        for table, sql in TABLES.items():
            tables[table] = {str(key): (str(session), content) for key, session, content in db.execute(sql)}
        db.execute("COMMIT")
    return Snapshot(tables)
