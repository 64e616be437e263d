"""Phases 3 and 5 of the timeline: `python -m proxy settle` on the database of the running
server, and on the database of the stopped server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import opencode_db
from ..http_client import request
from ..opencode_server import OpencodeServer
from ..proxy_process import ProxyProcess
from ..settle_cli import SettleRun, run_settle
from ..turns import Observed, Turn, read_messages, wait_turn_done
from .restarts import Crashed
from .sessions import (
    BUSY,
    LATE,
    OFFLINE,
    UPSTREAM,
    Key,
    NextTurn,
    Replayed,
    exports,
    next_turns,
    observe,
    replay,
    stored,
)
from .writers import WrittenBack


@dataclass(frozen=True)
class LiveSettle:
    """Phase 3: `settle` against the database of the running server."""

    refused: SettleRun
    refused_before: opencode_db.Snapshot
    refused_after: opencode_db.Snapshot
    settled: SettleRun
    before: opencode_db.Snapshot
    after: opencode_db.Snapshot
    integrity: str
    busy: dict[Key, Observed]
    busy_done: dict[Key, list[dict[str, Any]]]
    busy_writes: list[float]
    """When (epoch s) the server wrote to the busy sessions: the times its events carry."""
    settle_writes: list[float]
    """When (epoch s) `settle` wrote the upstream group's rows (their `time_updated`)."""
    direct: dict[Key, list[dict[str, Any]]]
    """Direct views of the upstream, live and late groups after `settle --upstream`."""
    server_pid: int
    next_turns: dict[Key, NextTurn]
    """A next prompt in each upstream session right after the settle, without a restart."""


def settle_live(server: OpencodeServer, crashed: Crashed, written: WrittenBack) -> LiveSettle:
    """Phase 3: `settle` refuses while the server runs; `settle --upstream` settles only the
    inactive sessions while short turns make the server write its own parts; then a next prompt in
    the sessions it settled, without a restart."""
    refused_before = opencode_db.snapshot(server.database)
    refused = run_settle(server.database)
    refused_after = opencode_db.snapshot(server.database)
    busy = observe(server, BUSY)
    before = opencode_db.snapshot(server.database)
    settled = run_settle(server.database, "--upstream", server.url)
    busy_done = {key: wait_turn_done(server.url, observed.turn) for key, observed in busy.items()}
    after = opencode_db.snapshot(server.database)
    upstream = {key: crashed.stale[key] for key in UPSTREAM}
    shown = {key: crashed.stale[key] for key in (*UPSTREAM, *LATE)} | written.live
    direct = {key: read_messages(server.url, observed.turn) for key, observed in shown.items()}
    return LiveSettle(
        refused=refused,
        refused_before=refused_before,
        refused_after=refused_after,
        settled=settled,
        before=before,
        after=after,
        integrity=opencode_db.integrity(server.database),
        busy=busy,
        busy_done=busy_done,
        busy_writes=opencode_db.event_times(server.database, [o.session_id for o in busy.values()]),
        settle_writes=sorted(stored(server, observed)[1] / 1000 for observed in upstream.values()),
        direct=direct,
        server_pid=server.pid,
        next_turns=next_turns(server, upstream),
    )


@dataclass(frozen=True)
class Offline:
    """Phase 5: `settle` while the server is stopped, then the server started on the result."""

    stale: dict[Key, Observed]
    exports_before: dict[Key, Any]
    first: SettleRun
    second: SettleRun
    direct: dict[Key, list[dict[str, Any]]]
    replays: dict[Key, Replayed]
    exports_after: dict[Key, Any]
    proxied: dict[Key, Proxied]


@dataclass(frozen=True)
class Proxied:
    """A message list fetched through a proxy without write-back, next to the direct one."""

    settled_header: str | None
    rules_header: str | None
    same_as_direct: bool


def settle_offline(server: OpencodeServer, logs: Path) -> Offline:
    """Phase 5: new stale turns; SIGKILL; `settle` with the server stopped (exit 10, then 0);
    start; both runtimes' direct views, a proxy's view, the v2 event replay, export."""
    stale = observe(server, OFFLINE)
    server.crash()
    exports_before = exports(server, stale)
    first = run_settle(server.database)
    second = run_settle(server.database)
    server.restart()
    plain = ProxyProcess(server.url, logs / "proxy.log")
    try:
        plain.start()
        proxied = {key: _proxied(plain.url, server.url, observed.turn) for key, observed in stale.items()}
    finally:
        plain.stop()
    return Offline(
        stale=stale,
        exports_before=exports_before,
        first=first,
        second=second,
        direct={key: read_messages(server.url, observed.turn) for key, observed in stale.items()},
        replays={key: replay(server, o) for key, o in stale.items() if key[1] == "v2"},
        exports_after=exports(server, stale),
        proxied=proxied,
    )


def _proxied(proxy_url: str, server_url: str, turn: Turn) -> Proxied:
    through, direct = (request("GET", base + turn.messages_path) for base in (proxy_url, server_url))
    assert through.status == direct.status == 200, (through.status, direct.status)
    return Proxied(
        through.headers.get("x-settle-settled"),
        through.headers.get("x-settle-rules"),
        through.json() == direct.json(),
    )
