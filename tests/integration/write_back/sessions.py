"""The timeline's sessions: the role each one plays, how they are started, and what is read of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import opencode_db
from ..event_tap import EventTap
from ..opencode_server import OpencodeServer
from ..turns import Observed, Runtime, observe_running, send_prompt, wait_turn_done

GRACE_S = 1.0
"""`--grace` of the proxies: long enough for a prompt to make a session active in between."""
SHORT_COMMAND = "for i in $(seq 1 80); do echo tick $i; sleep 0.1; done"
"""A short tool that keeps the server writing (v1 stores its part at every output) for ~8 s:
`settle --upstream` must write while it does, and it asks each session's liveness only after
re-reading that session, so it takes longer than when it asked them all up front."""
TOOL_FAILED = "session.next.tool.failed"
NEXT_PROMPT = "next, briefly"
NEXT_COMMAND = "echo briefly"
"""The next prompt in a written session runs this short command, then the model answers."""

Key = tuple[str, Runtime]
"""(group, runtime): which role a session plays in the timeline."""

STALE: tuple[Key, ...] = (
    ("api", "v1"),
    ("api", "v2"),
    ("db", "v1"),
    ("db", "v2"),
    ("late", "v1"),
    ("late", "v2"),
    ("upstream", "v1"),
    ("upstream", "v2"),
    ("race", "v2"),
    ("race-db", "v2"),
)
"""Sessions running a tool when the server is killed in phase 1."""
RACES: tuple[Key, ...] = (("race", "v2"), ("race-db", "v2"))
"""The replay race, with the writer reading the log through `/sync/history` and from the database."""
DB: tuple[Key, ...] = (("db", "v1"), ("db", "v2"))
WRITTEN: tuple[Key, ...] = (("api", "v1"), ("api", "v2"), *DB)
LIVE: tuple[Key, ...] = (("live", "v1"), ("live", "v2"))
LATE: tuple[Key, ...] = (("late", "v1"), ("late", "v2"))
UPSTREAM: tuple[Key, ...] = (("upstream", "v1"), ("upstream", "v2"))
BUSY: tuple[Key, ...] = (("busy", "v1"), ("busy-2", "v1"), ("busy", "v2"))
OFFLINE: tuple[Key, ...] = (("offline", "v1"), ("offline", "v2"))

Events = list[tuple[int, str, str, Any]]
"""A session's stored event log: (seq, type, id, data)."""


def prompt_of(key: Key) -> str:
    return f"{key[0]} {key[1]}"


def observe(server: OpencodeServer, keys: Sequence[Key]) -> dict[Key, Observed]:
    """A running tool in a session of each role, started together."""
    return observe_running(server.url, server.project, {key: (key[1], prompt_of(key)) for key in keys})


def exports(server: OpencodeServer, sessions: dict[Key, Observed]) -> dict[Key, Any]:
    """`opencode export` of every session, one after another: CLIs started side by side contend for
    the database lock at start-up."""
    return {key: server.export(observed.session_id) for key, observed in sessions.items()}


def stored(server: OpencodeServer, observed: Observed) -> Any:
    """The row that holds the tool: the v1 part row, or the v2 message row (JSON, time_updated)."""
    if observed.turn.runtime == "v1":
        return opencode_db.tool_part(server.database, observed.tool_id)
    return opencode_db.v2_message(server.database, observed.running.message_id)


@dataclass(frozen=True)
class NextTurn:
    """A session once a next prompt (NEXT_PROMPT) in it has finished."""

    messages: list[dict[str, Any]]
    events: Events


def next_turns(server: OpencodeServer, sessions: dict[Key, Observed]) -> dict[Key, NextTurn]:
    """Prompt every session first (the turns overlap), then wait for each to finish."""
    for observed in sessions.values():
        send_prompt(server.url, observed.turn, NEXT_PROMPT)
    return {
        key: NextTurn(
            wait_turn_done(server.url, observed.turn),
            opencode_db.session_events(server.database, observed.session_id),
        )
        for key, observed in sessions.items()
    }


@dataclass(frozen=True)
class Replayed:
    """A v2 session's durable log: as stored (every type), and as `/api/session/{id}/event` replays it."""

    stored: Events
    last_seq: int
    replayed: list[Any]


def replay(server: OpencodeServer, observed: Observed) -> Replayed:
    """Read the stored log, then let the server replay it over SSE up to its last public event."""
    events = opencode_db.session_events(server.database, observed.session_id)
    last_public = [event_id for _, kind, event_id, _ in events if kind.startswith("session.next.")][-1]
    with EventTap(f"{server.url}/api/session/{observed.session_id}/event") as tap:
        tap.wait_for(lambda p: p.get("id") == last_public, what="the replay's last event", timeout=10.0)
        replayed = tap.payloads()
    return Replayed(events, opencode_db.last_seq(server.database, observed.session_id), replayed)
