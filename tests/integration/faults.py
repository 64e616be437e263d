"""The write-back fault harness's view of storage (tests/integration/test_write_back_faults.py):
what storage holds for a stale session, read as an observer, and whether the session is as the
crash left it, settled, or torn."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from . import opencode_db
from .expected import V1_MESSAGE_ERROR, V1_PART_ERROR, V2_TOOL_ERROR
from .http_client import Reply, request
from .opencode_server import OpencodeServer
from .turns import Observed, Runtime, Turn

Key = tuple[str, Runtime, int]
"""(group, runtime, index): the role a stale session plays."""


def keys_of(group: str, runtime: Runtime, count: int) -> list[Key]:
    return [(group, runtime, index) for index in range(count)]


@dataclass(frozen=True)
class Stored:
    """What storage holds for one stale session: the rows write-back may change, exactly as
    stored ((data, time_updated) by table), and the session's whole event log."""

    rows: dict[str, tuple[str, int]]
    events: list[tuple[int, str, str, str]]
    """(seq, type, id, data as stored), by seq."""
    last_seq: int
    """`event_sequence.seq` of the session."""


@dataclass(frozen=True)
class Crashed:
    """Phase 1: the stale sessions, and what storage held for them right after the crash."""

    stale: dict[Key, Observed]
    before: dict[str, Stored]
    """Every stale session as the crash left it, by session id."""

    def sessions(self, keys: Sequence[Key]) -> list[Observed]:
        return [self.stale[key] for key in keys]


READ_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 15.0
PASS_TIMEOUT_S = 15.0

PART_UPDATED = "message.part.updated.1"
MESSAGE_UPDATED = "message.updated.1"
TOOL_FAILED = "session.next.tool.failed.1"


def fetch_messages(base_url: str, turn: Turn) -> Reply:
    return request("GET", base_url + turn.messages_path, timeout=REQUEST_TIMEOUT_S)


def read_stored(
    database: Path, sessions: Sequence[Observed], *, busy_timeout: float = READ_TIMEOUT_S
) -> dict[str, Stored]:
    """Every session's rows and log, read in one transaction (one consistent view), on a
    read-only connection of its own (closed again: `settle` refuses while others hold it)."""
    found: dict[str, Stored] = {}
    uri = f"{database.as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=busy_timeout)) as db:
        db.execute("BEGIN")
        for stale in sessions:
            found[stale.session_id] = _stored_one(db, stale)
        db.execute("COMMIT")
    return found


def _stored_one(db: sqlite3.Connection, stale: Observed) -> Stored:
    if stale.runtime == "v1":
        tables = {"part": stale.tool_id, "message": stale.message_id}
    else:
        tables = {"session_message": stale.message_id}
    rows = {}
    for table, row_id in tables.items():
        # Table names are the constants above.
        ((data, updated),) = db.execute(f"SELECT data, time_updated FROM {table} WHERE id = ?", (row_id,))
        rows[table] = (str(data), int(updated))
    events = [
        (int(seq), str(kind), str(event_id), str(data))
        for seq, kind, event_id, data in db.execute(
            "SELECT seq, type, id, data FROM event WHERE aggregate_id = ? ORDER BY seq", (stale.session_id,)
        )
    ]
    ((last,),) = db.execute("SELECT seq FROM event_sequence WHERE aggregate_id = ?", (stale.session_id,))
    return Stored(rows, events, int(last))


def stored_now(server: OpencodeServer, stale: Observed) -> Stored:
    return read_stored(server.database, [stale])[stale.session_id]


def log_problems(database: Path) -> list[str]:
    """Every session whose event seqs are not 0..n without a gap, or whose `event_sequence`
    does not name the last of them: the log as the server keeps it, for the whole database."""
    seqs: dict[str, list[int]] = {}
    for aggregate, seq in opencode_db.rows(database, "SELECT aggregate_id, seq FROM event ORDER BY seq"):
        seqs.setdefault(str(aggregate), []).append(int(seq))
    last = {
        str(a): int(s) for a, s in opencode_db.rows(database, "SELECT aggregate_id, seq FROM event_sequence")
    }
    problems = []
    for aggregate in sorted(set(seqs) | set(last)):
        found = seqs.get(aggregate, [])
        if found != list(range(len(found))):
            problems.append(f"{aggregate}: seqs {found}")
        if last.get(aggregate) != (found[-1] if found else None):
            problems.append(f"{aggregate}: event_sequence {last.get(aggregate)}, log ends at {found[-1:]}")
    return problems


def restale(database: Path, stale: Observed, before: Stored) -> None:
    """Write the v1 part row back to the bytes the crash left, as if it had never been settled.
    (A direct UPDATE is served by the running server at once; the API writer reads the view.)"""
    data, updated = before.rows["part"]
    with contextlib.closing(sqlite3.connect(database, timeout=5.0)) as db:
        db.execute("UPDATE part SET data = ?, time_updated = ? WHERE id = ?", (data, updated, stale.tool_id))
        db.commit()


def state_of(stale: Observed, before: Stored, after: Stored) -> str:
    """What storage shows of the session now: "old" (every row byte for byte as the crash left
    it, nothing appended), "settled" (rows settled and their events appended, together and
    once), or "torn: <why>"."""
    if after.events[: len(before.events)] != before.events:
        return "torn: events that were there changed"
    appended = after.events[len(before.events) :]
    if after.rows == before.rows and not appended and after.last_seq == before.last_seq:
        return "old"
    check = _v1_problems if stale.runtime == "v1" else _v2_problems
    problems = check(stale, before, after, appended)
    return f"torn: {'; '.join(problems)}" if problems else "settled"


def part_state_of(stale: Observed, before: Stored, after: Stored) -> str:
    """The v1 part row alone: "settled part", or "torn: <why>"."""
    ids = {"id": stale.tool_id, "sessionID": stale.session_id, "messageID": stale.message_id}
    part = {**ids, **orjson.loads(after.rows["part"][0])}
    problems = _v1_part_problems(part, orjson.loads(before.rows["part"][0]))
    return f"torn: {'; '.join(problems)}" if problems else "settled part"


def _v1_problems(
    stale: Observed, before: Stored, after: Stored, appended: list[tuple[int, str, str, str]]
) -> list[str]:
    """The part settled, the message closed, and one event for each holding exactly that row."""
    ids = {"sessionID": stale.session_id}
    part = {"id": stale.tool_id, **ids, "messageID": stale.message_id, **orjson.loads(after.rows["part"][0])}
    old_part = orjson.loads(before.rows["part"][0])
    info = {"id": stale.message_id, **ids, **orjson.loads(after.rows["message"][0])}
    old_info = orjson.loads(before.rows["message"][0])
    problems = _v1_part_problems(part, old_part) + _v1_message_problems(info, old_info)
    kinds = sorted(kind for _, kind, _, _ in appended)
    if kinds != sorted([PART_UPDATED, MESSAGE_UPDATED]):
        return [*problems, f"appended {kinds}"]
    for _, kind, _, data in appended:
        event = orjson.loads(data)
        if kind == PART_UPDATED and event.get("part") != part:
            problems.append("the part event does not hold the stored part")
        if kind == MESSAGE_UPDATED and event.get("info") != info:
            problems.append("the message event does not hold the stored message")
    if after.last_seq != appended[-1][0]:
        problems.append(f"event_sequence {after.last_seq}, log ends at {appended[-1][0]}")
    return problems


def _v1_part_problems(part: dict[str, Any], old: dict[str, Any]) -> list[str]:
    state, was = part["state"], old["state"]
    if state.get("status") != "error":
        return [f"part {state.get('status')}"]
    end = state.get("time", {}).get("end")
    settled = {
        **was,
        "status": "error",
        "error": V1_PART_ERROR,
        "metadata": {**was.get("metadata", {}), "interrupted": True},
        "time": {**was["time"], "end": end},
    }
    problems = [] if state == settled else [f"part state {state}"]
    if not isinstance(end, int) or end < was["time"]["start"]:
        problems.append(f"part time.end {end}")
    if {k: v for k, v in part.items() if k not in ("id", "sessionID", "messageID", "state")} != {
        k: v for k, v in old.items() if k != "state"
    }:
        problems.append("part fields other than state changed")
    return problems


def _v1_message_problems(info: dict[str, Any], old: dict[str, Any]) -> list[str]:
    completed = info.get("time", {}).get("completed")
    closed = {**old, "time": {**old["time"], "completed": completed}, "error": V1_MESSAGE_ERROR}
    shown = {k: v for k, v in info.items() if k not in ("id", "sessionID")}
    problems = [] if shown == closed else [f"message {shown}"]
    if not isinstance(completed, int) or completed < old["time"]["created"]:
        problems.append(f"message time.completed {completed}")
    return problems


def _v2_problems(
    stale: Observed, before: Stored, after: Stored, appended: list[tuple[int, str, str, str]]
) -> list[str]:
    """The call settled in the message row, and one `tool.failed` agreeing with it."""
    message, old = (orjson.loads(stored.rows["session_message"][0]) for stored in (after, before))
    index = next(i for i, item in enumerate(old["content"]) if item.get("id") == stale.tool_id)
    item, was = message["content"][index], old["content"][index]
    completed = item.get("time", {}).get("completed")
    settled = {
        **was,
        "state": {**was["state"], "status": "error", "error": V2_TOOL_ERROR},
        "time": {**was["time"], "completed": completed},
    }
    problems = [] if item == settled else [f"call {item}"]
    if not isinstance(completed, int) or completed < was["time"]["ran"]:
        problems.append(f"call time.completed {completed}")
    rest = {**message, "content": [c for i, c in enumerate(message["content"]) if i != index]}
    if rest != {**old, "content": [c for i, c in enumerate(old["content"]) if i != index]}:
        problems.append("the message changed beyond the call")
    if [kind for _, kind, _, _ in appended] != [TOOL_FAILED]:
        return [*problems, f"appended {[kind for _, kind, _, _ in appended]}"]
    event = orjson.loads(appended[0][3])
    expected = {"callID": stale.tool_id, "assistantMessageID": stale.message_id, "timestamp": completed}
    if {k: event.get(k) for k in expected} != expected or event.get("error") != V2_TOOL_ERROR:
        problems.append(f"tool.failed {event} does not match the row")
    if after.last_seq != appended[0][0]:
        problems.append(f"event_sequence {after.last_seq}, log ends at {appended[0][0]}")
    return problems


def _count(events: Sequence[tuple[int, str, str, str]], kind: str, path: tuple[str, ...], target: str) -> int:
    """How many events of `kind` hold `target` at `path` in their data."""
    found = 0
    for _, event_kind, _, data in events:
        value = orjson.loads(data) if event_kind == kind else None
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        found += value == target
    return found


def written_counts(stale: Observed, before: Stored, after: Stored) -> dict[str, int]:
    """The events appended since `before` about the stale tool: per part (v1: its part and its
    message) or per call (v2)."""
    appended = after.events[len(before.events) :]
    if stale.runtime == "v1":
        return {
            "part": _count(appended, PART_UPDATED, ("part", "id"), stale.tool_id),
            "message": _count(appended, MESSAGE_UPDATED, ("info", "id"), stale.message_id),
        }
    return {"call": _count(appended, TOOL_FAILED, ("callID",), stale.tool_id)}
