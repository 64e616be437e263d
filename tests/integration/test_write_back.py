"""End to end: write-back makes the settlement durable in the real opencode 1.18.33, and never
touches a session that is running.

The module has its own server (its own data dir), so the offline `settle`, which settles the
whole database, sees only this module's sessions. Crash/restart cycles are slow, so the module
walks one timeline of phases, each a module-scoped fixture that acts on the server and records
what it saw; the tests only assert on those records and never act, so their order does not
matter and each can fail on its own:

1. `crashed`: stale turns of every group run a bash tool; SIGKILL; `opencode export` while down; start.
2. `written`: proxies with `--write-back api` and `--write-back db` fetch their groups' sessions
   while an `/event` subscriber listens; live turns are fetched through both; `late` sessions get a
   prompt between the two liveness readings; a v2 replay races a prompt (the API writer in
   process, against the real server).
3. `live_settle`: `settle` refuses while the server runs; `settle --upstream` settles only the
   inactive sessions while short turns make the server write its own parts; then a next prompt
   in the sessions it settled, without a restart.
4. `restarted`: SIGKILL and start again: still settled; v2 event replay; export; a next prompt
   (a short command) in each written session.
5. `offline`: new stale turns; SIGKILL; `settle` with the server stopped (exit 10, then 0);
   start; both runtimes' direct views, a proxy's view, the v2 event replay, export.

Measured on 1.18.33 (pinned by the tests named):
- `POST /sync/replay` with a seq already taken, or one leaving a gap, is refused: HTTP 500
  `UnknownError`, nothing stored. A prompt admitted in the session takes the next seq and the
  server appends its own `tool.failed` for the open call right after `prompt.admitted`; so a
  replay racing a prompt is refused, and the writer's re-read finds the call settled by the
  server: one `tool.failed`, no gap (`test_replay_racing_a_prompt_leaves_one_failure`). A
  replay that lands first is not duplicated by the server's next-prompt settle
  (`test_next_prompt_after_write_back_completes`). A replay after the server's own settle would
  be accepted (the server does not check for duplicates): only the writer's check prevents it.
- `POST /sync/history` refuses -1 (400); it returns every event after the given seq for the
  aggregates named and the whole history of all others.
- Rows and events written into opencode.db under the running server are taken up at once: the
  direct view shows them, and a next prompt without a restart continues the log after our
  events (`test_next_prompt_after_settle_under_the_running_server`).
- A prompt sent right after a fetch makes the session active again within ~0.1-0.2 s, well
  inside the grace (`test_session_active_at_second_reading_is_not_written` checks the premise).
- `opencode export <id>` reads the database itself (server up or down, any cwd) and prints the
  v1 store only: a v1 session's unfinished assistant message is NOT left out (it is exported
  with its tool `running`, and after settlement with the settled tool); a v2 session exports
  its info with `messages: []`, before and after settlement (`test_export_*`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi, UpstreamRefused
from proxy.writeback.api_writer import ApiWriter
from proxy.writeback.locks import SessionLocks, default_lock_dir
from proxy.writeback.scheduler import Confirm, Written
from rules import Api, Liveness

from . import opencode_db
from .event_tap import EventTap
from .expected import V1_MESSAGE_ERROR, V1_PART_ERROR, V2_TOOL_ERROR
from .http_client import request
from .mock_model import MockModel, Plan
from .opencode_server import REPO_ROOT, OpencodeServer, directory_header, running_opencode
from .polling import WaitTimeout, poll
from .proxy_process import ProxyProcess
from .turns import (
    RUNTIMES,
    Observed,
    Runtime,
    Turn,
    is_active,
    read_messages,
    send_prompt,
    start_turn,
    wait_tool_running,
    wait_turn_done,
)

pytestmark = pytest.mark.integration

GRACE_S = 1.0
"""`--grace` of the proxies: long enough for a prompt to make a session active in between."""
WRITE_TIMEOUT_S = 20.0
SETTLE_TIMEOUT_S = 60.0
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
)
"""Sessions running a tool when the server is killed in phase 1."""
DB: tuple[Key, ...] = (("db", "v1"), ("db", "v2"))
WRITTEN: tuple[Key, ...] = (("api", "v1"), ("api", "v2"), *DB)
LIVE: tuple[Key, ...] = (("live", "v1"), ("live", "v2"))
LATE: tuple[Key, ...] = (("late", "v1"), ("late", "v2"))
UPSTREAM: tuple[Key, ...] = (("upstream", "v1"), ("upstream", "v2"))
BUSY: tuple[Key, ...] = (("busy", "v1"), ("busy-2", "v1"), ("busy", "v2"))
OFFLINE: tuple[Key, ...] = (("offline", "v1"), ("offline", "v2"))


@dataclass(frozen=True)
class SettleRun:
    """One `python -m proxy settle` run."""

    code: int
    out: str
    err: str
    started: float
    ended: float


# --- phase 1 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Crashed:
    """Phase 1: the sessions whose tool was running at the SIGKILL."""

    stale: dict[Key, Observed]
    exports_before: dict[Key, Any]
    """`opencode export` of the db group while the server was down, before any settlement."""


@pytest.fixture(scope="module")
def server(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    """This module's own server; stopped with all its tools at the end."""
    for key in LATE:
        mock_model.plan(_prompt(key), Plan(each_prompt=True))
    mock_model.plan(NEXT_PROMPT, Plan(command=NEXT_COMMAND, each_prompt=True))
    for key in BUSY:
        mock_model.plan(_prompt(key), Plan(command=SHORT_COMMAND))
    with running_opencode(tmp_path_factory.mktemp("write-back"), mock_model.base_url) as opencode:
        yield opencode


@pytest.fixture(scope="module")
def crashed(server: OpencodeServer) -> Crashed:
    stale = _observe(server, STALE)
    server.crash()
    exports = _exports(server, {key: stale[key] for key in DB})
    server.restart()
    return Crashed(stale, exports)


def _prompt(key: Key) -> str:
    return f"{key[0]} {key[1]}"


def _exports(server: OpencodeServer, sessions: dict[Key, Observed]) -> dict[Key, Any]:
    """`opencode export` of every session, one after another: CLIs started side by side contend for
    the database lock at start-up."""
    return {key: server.export(observed.session_id) for key, observed in sessions.items()}


def _observe(server: OpencodeServer, keys: Sequence[Key]) -> dict[Key, Observed]:
    """Start every turn first (their start-ups overlap), then wait for each tool to run."""
    turns = {key: start_turn(key[1], server.url, server.project, _prompt(key)) for key in keys}
    return {key: Observed(turn, wait_tool_running(server.url, turn)) for key, turn in turns.items()}


# --- phase 2 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Race:
    """The API writer appending a `tool.failed` while a prompt lands in the same session."""

    outcome: list[Written] | str
    """What `write` returned, or the error it raised."""
    replays: list[tuple[int, int]]
    """(seq tried, HTTP status) of every `/sync/replay` the writer sent."""
    admitted_seq: int | None
    """Where the prompt sent just before the first replay was admitted (None: never sent)."""
    events: list[tuple[int, str, str, Any]]


@dataclass(frozen=True)
class Late:
    """A stale session fetched through the db proxy, then prompted before the second reading."""

    active_after_s: float
    """Seconds from the fetch until the server listed the session as active again."""
    stored_before: Any
    stored_after: Any
    events_after: list[tuple[int, str, str, Any]]


@dataclass(frozen=True)
class WrittenBack:
    """Phase 2: what the write-back proxies did, and did not do."""

    direct: dict[Key, list[dict[str, Any]]]
    """The direct views (no proxy) of the api and db groups once written back."""
    heard: list[Any]
    """`/event` payloads about the api group's v1 part."""
    logs: dict[str, str]
    live: dict[Key, Observed]
    live_stored_before: dict[Key, Any]
    live_stored_after: dict[Key, Any]
    live_direct_after: dict[Key, list[dict[str, Any]]]
    late: dict[Key, Late]
    race: Race


@pytest.fixture(scope="module")
def written(
    server: OpencodeServer, crashed: Crashed, tmp_path_factory: pytest.TempPathFactory
) -> WrittenBack:
    logs = tmp_path_factory.mktemp("write-back-proxies")
    live = _observe(server, LIVE)
    live_before = {key: _stored(server, observed) for key, observed in live.items()}
    grace = ("--grace", str(GRACE_S))
    api = ProxyProcess(server.url, logs / "api.log", ("--write-back", "api", *grace))
    db = ProxyProcess(
        server.url, logs / "db.log", ("--write-back", "db", "--db", str(server.database), *grace)
    )
    tap = EventTap(f"{server.url}/event", directory_header(server.project))
    try:
        api.start()
        db.start()
        tap.start()
        late = {key: _prompt_between_readings(server, db, crashed.stale[key]) for key in LATE}
        for key in WRITTEN:
            _fetch(api.url if key[0] == "api" else db.url, crashed.stale[key].turn)
        last_live_fetch = _fetch_live(live, (api.url, db.url))
        direct = _wait_written(server, {key: crashed.stale[key] for key in WRITTEN})
        heard = _heard(tap, crashed.stale[("api", "v1")])
        race = asyncio.run(_race(server, crashed.stale[("race", "v2")]))
        _wait_skipped(db, late=[crashed.stale[key] for key in LATE])
        time.sleep(max(0.0, last_live_fetch + 2 * GRACE_S + 0.5 - time.monotonic()))
        return WrittenBack(
            direct=direct,
            heard=heard,
            logs={"api": api.log(), "db": db.log()},
            live=live,
            live_stored_before=live_before,
            live_stored_after={key: _stored(server, observed) for key, observed in live.items()},
            live_direct_after={key: read_messages(server.url, o.turn) for key, o in live.items()},
            late={key: _late_after(server, crashed.stale[key], observed) for key, observed in late.items()},
            race=race,
        )
    finally:
        tap.stop()
        api.stop()
        db.stop()


def _fetch(base_url: str, turn: Turn) -> None:
    reply = read_messages(base_url, turn)
    assert reply, f"{turn.session_id}: empty message view"


def _fetch_live(live: dict[Key, Observed], proxies: Sequence[str]) -> float:
    """Fetch every live session through every proxy a few times; returns when the last fetch ended."""
    for _ in range(3):
        for observed in live.values():
            for proxy in proxies:
                _fetch(proxy, observed.turn)
        time.sleep(0.2)
    return time.monotonic()


def _stored(server: OpencodeServer, observed: Observed) -> Any:
    """The row that holds the tool: the v1 part row, or the v2 message row (JSON, time_updated)."""
    if observed.turn.runtime == "v1":
        return opencode_db.tool_part(server.database, observed.tool_id)
    return opencode_db.v2_message(server.database, observed.running.message_id)


def _prompt_between_readings(
    server: OpencodeServer, proxy: ProxyProcess, observed: Observed
) -> tuple[float, Any]:
    """Fetch through the proxy (the first reading: inactive), then prompt at once. Returns how
    many seconds after the fetch the server said the session was active (the second reading comes
    GRACE_S after it), and the stored row as it was before."""
    stored = _stored(server, observed)
    started = time.monotonic()
    _fetch(proxy.url, observed.turn)
    send_prompt(server.url, observed.turn, "go on")
    poll(
        lambda: True if is_active(server.url, observed.turn) else None,
        what=f"{observed.session_id} active after its prompt",
        timeout=GRACE_S * 4,
        interval=0.02,
    )
    return time.monotonic() - started, stored


def _late_after(server: OpencodeServer, observed: Observed, before: tuple[float, Any]) -> Late:
    return Late(
        active_after_s=before[0],
        stored_before=before[1],
        stored_after=_stored(server, observed),
        events_after=opencode_db.session_events(server.database, observed.session_id),
    )


def _wait_written(server: OpencodeServer, targets: dict[Key, Observed]) -> dict[Key, list[dict[str, Any]]]:
    """The direct views once no target tool is open any more, or as they are after the timeout
    (the tests then say which one was not written)."""

    def views() -> dict[Key, list[dict[str, Any]]]:
        return {key: read_messages(server.url, observed.turn) for key, observed in targets.items()}

    def all_written() -> dict[Key, list[dict[str, Any]]] | None:
        current = views()
        open_left = [key for key, o in targets.items() if _is_open(_tool_in(current[key], o))]
        return None if open_left else current

    try:
        return poll(all_written, what="write-backs", timeout=WRITE_TIMEOUT_S, interval=0.25)
    except WaitTimeout:
        return views()


def _heard(tap: EventTap, observed: Observed) -> list[Any]:
    """`message.part.updated` payloads about the part, once a settled one arrived (or after a wait)."""

    def about_part(payload: Any) -> bool:
        properties = payload.get("properties") or {}
        return bool(
            payload.get("type") == "message.part.updated"
            and (properties.get("part") or {}).get("id") == observed.tool_id
        )

    with contextlib.suppress(WaitTimeout):
        tap.wait_for(
            lambda p: about_part(p) and not _is_open(p["properties"]["part"]),
            what="the settled part on /event",
            timeout=5.0,
        )
    return [payload for payload in tap.payloads() if about_part(payload)]


def _wait_skipped(proxy: ProxyProcess, late: Sequence[Observed]) -> None:
    """Until the proxy logged its decision on every late session (bounded; the tests check what)."""

    def decided() -> bool | None:
        lines = [line for line in proxy.log().splitlines() if "write-back of" in line or "wrote back" in line]
        return True if all(any(o.session_id in line for line in lines) for o in late) else None

    with contextlib.suppress(WaitTimeout):
        poll(decided, what="the db proxy's decision on the late sessions", timeout=GRACE_S + 10)


class _PromptFirst(UpstreamApi):
    """The upstream as the API writer sees it, except that a prompt reaches the session right
    before the writer's first `/sync/replay`: the server appends between the read and the append."""

    def __init__(self, session: aiohttp.ClientSession, origin: URL, observed: Observed) -> None:
        super().__init__(session, origin)
        self._observed = observed
        self.admitted_seq: int | None = None
        self.replays: list[tuple[int, int]] = []

    async def call(
        self,
        method: str,
        path: str,
        credentials: Credentials,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
    ) -> Any:
        if path != "/sync/replay":
            return await super().call(method, path, credentials, params=params, json=json)
        if self.admitted_seq is None:
            self.admitted_seq = await self._prompt(credentials)
        seq = int(json["events"][0]["seq"])
        try:
            answer = await super().call(method, path, credentials, params=params, json=json)
        except UpstreamRefused as refusal:
            self.replays.append((seq, refusal.status))
            raise
        self.replays.append((seq, 200))
        return answer

    async def _prompt(self, credentials: Credentials) -> int:
        path = f"/api/session/{self._observed.session_id}/prompt"
        answer = await super().call("POST", path, credentials, json={"prompt": {"text": "meanwhile"}})
        return int(answer["data"]["admittedSeq"])


async def _race(server: OpencodeServer, observed: Observed) -> Race:
    origin = URL(server.url)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        upstream = _PromptFirst(session, origin, observed)
        liveness = Liveness(observed.session_id, active=False)
        outcome: list[Written] | str
        try:
            outcome = await ApiWriter(upstream, SessionLocks(default_lock_dir(os.environ))).write(
                Api.V2, observed.session_id, Credentials(), {observed.tool_id}, _reading(liveness)
            )
        except UpstreamRefused as refusal:
            outcome = str(refusal)
    if upstream.admitted_seq is not None:
        await asyncio.to_thread(wait_turn_done, server.url, observed.turn)
    events = opencode_db.session_events(server.database, observed.session_id)
    return Race(outcome, upstream.replays, upstream.admitted_seq, events)


@dataclass(frozen=True)
class NextTurn:
    """A session once a next prompt (NEXT_PROMPT) in it has finished."""

    messages: list[dict[str, Any]]
    events: list[tuple[int, str, str, Any]]


def _next_turns(server: OpencodeServer, sessions: dict[Key, Observed]) -> dict[Key, NextTurn]:
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


# --- phase 3 ------------------------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def live_settle(server: OpencodeServer, crashed: Crashed, written: WrittenBack) -> LiveSettle:
    refused_before = opencode_db.snapshot(server.database)
    refused = _settle_cli(server.database)
    refused_after = opencode_db.snapshot(server.database)
    busy = _observe(server, BUSY)
    before = opencode_db.snapshot(server.database)
    settled = _settle_cli(server.database, "--upstream", server.url)
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
        settle_writes=sorted(_stored(server, observed)[1] / 1000 for observed in upstream.values()),
        direct=direct,
        server_pid=server.pid,
        next_turns=_next_turns(server, upstream),
    )


def _settle_cli(database: Path, *args: str) -> SettleRun:
    """`python -m proxy settle --db DATABASE ARGS` as a user would run it (no server credentials)."""
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("OPENCODE_SERVER")
    }
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "settle", "--db", str(database), *args],
        cwd=REPO_ROOT,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SETTLE_TIMEOUT_S,
        check=False,
    )
    return SettleRun(done.returncode, done.stdout, done.stderr, started, time.time())


# --- phase 4 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    """A v2 session's durable log: as stored (every type), and as `/api/session/{id}/event` replays it."""

    stored: list[tuple[int, str, str, Any]]
    last_seq: int
    replayed: list[Any]


@dataclass(frozen=True)
class Restarted:
    """Phase 4: the written and settled sessions after another SIGKILL and start."""

    direct: dict[Key, list[dict[str, Any]]]
    replays: dict[Key, Replayed]
    exports_after: dict[Key, Any]
    next_turns: dict[Key, NextTurn]
    """A next prompt in each written session, after the restart."""


@pytest.fixture(scope="module")
def restarted(
    server: OpencodeServer, crashed: Crashed, written: WrittenBack, live_settle: LiveSettle
) -> Restarted:
    server.crash()
    server.restart()
    checked = {key: crashed.stale[key] for key in (*WRITTEN, *UPSTREAM)}
    direct = {key: read_messages(server.url, observed.turn) for key, observed in checked.items()}
    replays = {key: _replay(server, observed) for key, observed in checked.items() if key[1] == "v2"}
    exports = _exports(server, {key: crashed.stale[key] for key in (*DB, ("race", "v2"))})
    next_turns = _next_turns(server, {key: crashed.stale[key] for key in WRITTEN})
    return Restarted(direct, replays, exports, next_turns)


def _replay(server: OpencodeServer, observed: Observed) -> Replayed:
    """Read the stored log, then let the server replay it over SSE up to its last public event."""
    stored = opencode_db.session_events(server.database, observed.session_id)
    last_public = [event_id for _, kind, event_id, _ in stored if kind.startswith("session.next.")][-1]
    with EventTap(f"{server.url}/api/session/{observed.session_id}/event") as tap:
        tap.wait_for(lambda p: p.get("id") == last_public, what="the replay's last event", timeout=10.0)
        replayed = tap.payloads()
    return Replayed(stored, opencode_db.last_seq(server.database, observed.session_id), replayed)


# --- phase 5 ------------------------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def offline(
    server: OpencodeServer, restarted: Restarted, tmp_path_factory: pytest.TempPathFactory
) -> Offline:
    stale = _observe(server, OFFLINE)
    server.crash()
    exports_before = _exports(server, stale)
    first = _settle_cli(server.database)
    second = _settle_cli(server.database)
    server.restart()
    plain = ProxyProcess(server.url, tmp_path_factory.mktemp("plain-proxy") / "proxy.log")
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
        replays={key: _replay(server, o) for key, o in stale.items() if key[1] == "v2"},
        exports_after=_exports(server, stale),
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


# --- shapes -------------------------------------------------------------------------------------


def _tools(message: dict[str, Any]) -> list[dict[str, Any]]:
    items = message["parts"] if "parts" in message else message.get("content", [])
    return [item for item in items if item.get("type") == "tool"]


def _tool_in(messages: list[dict[str, Any]], observed: Observed) -> dict[str, Any]:
    """The observed tool in a message list of its runtime (v1 parts, v2 content), by id."""
    found = [tool for message in messages for tool in _tools(message) if tool["id"] == observed.tool_id]
    assert len(found) == 1, f"{observed.tool_id} appears {len(found)} times in {observed.session_id}"
    return found[0]


def _message_in(messages: list[dict[str, Any]], observed: Observed) -> dict[str, Any]:
    """The v1 message (`info`) or v2 message that holds the observed tool."""
    found = [m for m in messages if any(t["id"] == observed.tool_id for t in _tools(m))]
    assert len(found) == 1, f"{observed.tool_id}: {len(found)} messages hold it"
    return found[0]


def _is_open(tool: dict[str, Any]) -> bool:
    return tool["state"]["status"] in ("pending", "streaming", "running")


def _assert_settled(tool: dict[str, Any], observed: Observed) -> None:
    """The shape opencode itself writes for an interrupted call, everything else as it ran."""
    running = observed.running.tool
    state, before = tool["state"], running["state"]
    assert state["status"] == "error", f"{observed.tool_id} is {state['status']}"
    assert state["input"] == before["input"]
    assert {k: v for k, v in tool.items() if k not in ("state", "time")} == {
        k: v for k, v in running.items() if k not in ("state", "time")
    }
    if observed.turn.runtime == "v1":
        assert state["error"] == V1_PART_ERROR
        assert state["metadata"] == {**before["metadata"], "interrupted": True}
        assert state["time"]["start"] == before["time"]["start"]
        assert state["time"]["end"] >= state["time"]["start"]
    else:
        assert state["error"] == V2_TOOL_ERROR
        assert {k: v for k, v in tool["time"].items() if k != "completed"} == running["time"]
        assert tool["time"]["completed"] >= running["time"]["ran"]


def _written_lines(log: str, session_id: str) -> list[str]:
    return [line for line in log.splitlines() if "wrote back" in line and session_id in line]


def _failures(events: list[tuple[int, str, str, Any]], call_id: str) -> list[int]:
    """Seqs of the `tool.failed` events of one call."""
    return [
        seq for seq, kind, _, data in events if kind.startswith(TOOL_FAILED) and data.get("callID") == call_id
    ]


def _assert_contiguous(events: list[tuple[int, str, str, Any]], last_seq: int | None = None) -> None:
    seqs = [seq for seq, _, _, _ in events]
    assert seqs == list(range(len(seqs))), f"seqs not contiguous from 0: {seqs}"
    if last_seq is not None:
        assert last_seq == seqs[-1], f"event_sequence says {last_seq}, the log ends at {seqs[-1]}"


def _assert_replay_consistent(replay: Replayed, observed: Observed) -> None:
    """One `tool.failed` for the call, a gap-free log in step with `event_sequence`, and the SSE
    replay carrying exactly the stored `session.next.*` events in order (ours parses like the rest)."""
    failures = _failures(replay.stored, observed.tool_id)
    assert len(failures) == 1, f"tool.failed stored {len(failures)} times for the call"
    _assert_contiguous(replay.stored, replay.last_seq)
    public = [(seq, kind.rsplit(".", 1)[0], event_id) for seq, kind, event_id, _ in replay.stored]
    public = [entry for entry in public if entry[1].startswith("session.next.")]
    shown = [(p["durable"]["seq"], p["type"], p["id"]) for p in replay.replayed]
    assert shown[: len(public)] == public
    failed = [p for p in replay.replayed if p["type"] == TOOL_FAILED]
    assert [p["data"]["callID"] for p in failed] == [observed.tool_id]
    assert failed[0]["data"]["error"] == V2_TOOL_ERROR


def _with_ids(stored_part: dict[str, Any], observed: Observed) -> dict[str, Any]:
    """A v1 part row's JSON with the ids the row keeps in columns, as the API shows it."""
    ids = {"id": observed.tool_id, "sessionID": observed.session_id, "messageID": observed.running.message_id}
    return {**ids, **stored_part}


# --- 1. --write-back api ------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_api_write_back_settles_the_direct_view(
    runtime: Runtime, crashed: Crashed, written: WrittenBack
) -> None:
    """A fetch through `--write-back api` makes opencode itself store the settled shape."""
    observed = crashed.stale[("api", runtime)]
    _assert_settled(_tool_in(written.direct[("api", runtime)], observed), observed)
    assert _written_lines(written.logs["api"], observed.session_id), "the proxy logged no write"


def test_api_write_back_is_announced_on_event_stream(crashed: Crashed, written: WrittenBack) -> None:
    """v1: the PATCH reaches every client subscribed to `/event` of the session's directory."""
    observed = crashed.stale[("api", "v1")]
    settled = [p["properties"]["part"] for p in written.heard if not _is_open(p["properties"]["part"])]
    assert settled, f"no settled message.part.updated for {observed.tool_id} on /event"
    _assert_settled(settled[-1], observed)


def test_api_v1_message_stays_open_in_storage(crashed: Crashed, written: WrittenBack) -> None:
    """The API has no route to close a v1 message: `time.completed` stays unset (view-only)."""
    observed = crashed.stale[("api", "v1")]
    info = _message_in(written.direct[("api", "v1")], observed)["info"]
    assert "completed" not in info["time"]


# --- 2. --write-back db -------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_db_write_back_settles_the_direct_view(
    runtime: Runtime, crashed: Crashed, written: WrittenBack
) -> None:
    """A fetch through `--write-back db` changes opencode.db under the running server, which
    serves the settled shape at once."""
    observed = crashed.stale[("db", runtime)]
    messages = written.direct[("db", runtime)]
    _assert_settled(_tool_in(messages, observed), observed)
    assert _written_lines(written.logs["db"], observed.session_id), "the proxy logged no write"
    if runtime == "v1":
        info = _message_in(messages, observed)["info"]
        assert info["error"] == V1_MESSAGE_ERROR
        assert info["time"]["completed"] >= info["time"]["created"]


@pytest.mark.parametrize("key", [*WRITTEN, *UPSTREAM], ids="-".join)
def test_settlement_survives_a_restart(
    key: Key, crashed: Crashed, written: WrittenBack, live_settle: LiveSettle, restarted: Restarted
) -> None:
    """After SIGKILL and start, opencode serves exactly the settlement that was written."""
    observed = crashed.stale[key]
    settled_then = (written.direct if key in WRITTEN else live_settle.direct)[key]
    _assert_settled(_tool_in(settled_then, observed), observed)
    assert _tool_in(restarted.direct[key], observed) == _tool_in(settled_then, observed)


@pytest.mark.parametrize("key", [k for k in (*WRITTEN, *UPSTREAM) if k[1] == "v2"], ids="-".join)
def test_v2_event_log_replays_one_failure(key: Key, crashed: Crashed, restarted: Restarted) -> None:
    _assert_replay_consistent(restarted.replays[key], crashed.stale[key])


@pytest.mark.parametrize("key", WRITTEN, ids="-".join)
def test_next_prompt_after_write_back_completes(key: Key, crashed: Crashed, restarted: Restarted) -> None:
    """The session takes a next prompt normally; the settled tool stays settled, and for v2 the
    server's own next-prompt settle appends no second `tool.failed` after ours."""
    _assert_next_turn(restarted.next_turns[key], crashed.stale[key])


def _assert_next_turn(turn: NextTurn, observed: Observed) -> None:
    """The short command ran once and completed, the old tool is as settled, the log is whole."""
    _assert_settled(_tool_in(turn.messages, observed), observed)
    ran = [t for m in turn.messages for t in _tools(m) if t["state"]["input"].get("command") == NEXT_COMMAND]
    assert [tool["state"]["status"] for tool in ran] == ["completed"], "the short command did not run once"
    _assert_contiguous(turn.events)
    if observed.turn.runtime == "v2":
        assert len(_failures(turn.events, observed.tool_id)) == 1


def test_export_db_v1_before_and_after(crashed: Crashed, restarted: Restarted) -> None:
    """Measured: 1.18.33 exports the unfinished v1 message (tool `running`); after settlement the
    export holds the settled tool and the closed message."""
    observed = crashed.stale[("db", "v1")]
    before = _message_in(crashed.exports_before[("db", "v1")]["messages"], observed)
    assert _tool_in([before], observed) == observed.running.tool
    assert "completed" not in before["info"]["time"]
    after = _message_in(restarted.exports_after[("db", "v1")]["messages"], observed)
    _assert_settled(_tool_in([after], observed), observed)
    assert after["info"]["error"] == V1_MESSAGE_ERROR


def test_export_v2_has_no_messages(crashed: Crashed, written: WrittenBack, restarted: Restarted) -> None:
    """Measured: `opencode export` reads only the v1 store. A v2 session exports its info and no
    messages: stale, settled, or (the race session) with a finished answer after the settled tool."""
    observed = crashed.stale[("db", "v2")]
    for export in (crashed.exports_before[("db", "v2")], restarted.exports_after[("db", "v2")]):
        assert export["info"]["id"] == observed.session_id
        assert export["messages"] == []
    answered = [kind for _, kind, _, _ in written.race.events if kind.startswith("session.next.text.ended")]
    assert answered, "premise: the race session holds no finished answer"
    assert restarted.exports_after[("race", "v2")]["messages"] == []


# --- 2b. offline settle with the server stopped ---------------------------------------------------


def test_offline_settle_exit_codes(offline: Offline) -> None:
    assert offline.first.code == 10, offline.first.err or offline.first.out
    assert "settled" in offline.first.out
    assert offline.second.code == 0, offline.second.err or offline.second.out
    assert "nothing to do" in offline.second.out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_offline_settle_shows_in_direct_view(runtime: Runtime, offline: Offline) -> None:
    observed = offline.stale[("offline", runtime)]
    messages = offline.direct[("offline", runtime)]
    _assert_settled(_tool_in(messages, observed), observed)
    if runtime == "v1":
        assert _message_in(messages, observed)["info"]["error"] == V1_MESSAGE_ERROR
    else:
        _assert_replay_consistent(offline.replays[("offline", runtime)], observed)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_offline_settle_leaves_the_proxy_nothing_to_rewrite(runtime: Runtime, offline: Offline) -> None:
    """A proxy without write-back serves the stored v1 view unchanged: storage is consistent. A v2
    message is stored as the server's own `tool.failed` leaves it, without `time.completed` (the
    server closes it on its next step), so the proxy still closes that turn, and only that."""
    proxied = offline.proxied[("offline", runtime)]
    if runtime == "v1":
        assert proxied == Proxied(None, None, same_as_direct=True)
    else:
        assert proxied == Proxied("0", "unfinished-message", same_as_direct=False)


def test_offline_export_before_and_after(offline: Offline) -> None:
    observed = offline.stale[("offline", "v1")]
    before = _message_in(offline.exports_before[("offline", "v1")]["messages"], observed)
    assert _tool_in([before], observed) == observed.running.tool
    after = _message_in(offline.exports_after[("offline", "v1")]["messages"], observed)
    _assert_settled(_tool_in([after], observed), observed)
    assert "completed" in after["info"]["time"]
    assert offline.exports_before[("offline", "v2")]["messages"] == []
    assert offline.exports_after[("offline", "v2")]["messages"] == []


# --- 3. never a running session -----------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_live_session_is_never_written(runtime: Runtime, written: WrittenBack) -> None:
    """A tool really running while both proxies are fetched and the grace has passed: untouched."""
    key = ("live", runtime)
    observed = written.live[key]
    assert written.live_stored_after[key] == written.live_stored_before[key], "the stored row changed"
    assert _tool_in(written.live_direct_after[key], observed) == observed.running.tool
    for log in written.logs.values():
        assert not _written_lines(log, observed.session_id)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_session_active_at_second_reading_is_not_written(
    runtime: Runtime, crashed: Crashed, written: WrittenBack
) -> None:
    """Inactive at the fetch, active again (a new prompt) at the second reading: no write."""
    observed, late = crashed.stale[("late", runtime)], written.late[("late", runtime)]
    assert late.active_after_s < GRACE_S, f"premise: active only after {late.active_after_s:.2f}s"
    skipped = [line for line in written.logs["db"].splitlines() if observed.session_id in line]
    assert any("skipped: the session became active" in line for line in skipped), skipped
    assert not _written_lines(written.logs["db"], observed.session_id)
    if runtime == "v1":
        # v1 never settles the old part itself: the row must be exactly as before the fetch.
        assert late.stored_after == late.stored_before
        assert _with_ids(late.stored_after[0], observed) == observed.running.tool
    else:
        # The server's own prompt settled the call: its failure and no second one.
        assert len(_failures(late.events_after, observed.tool_id)) == 1
        _assert_contiguous(late.events_after)


# --- 4. concurrency and 5. refusal ----------------------------------------------------------------


def test_settle_refuses_while_the_server_runs(live_settle: LiveSettle) -> None:
    run = live_settle.refused
    assert run.code == 3, run.err or run.out
    assert f"pid {live_settle.server_pid}" in run.err
    assert "is open in another process" in run.err, "the refusal does not say how it knew"
    assert live_settle.refused_before.sessions_changed(live_settle.refused_after) == set()


def test_settle_with_upstream_settles_only_inactive_sessions(
    crashed: Crashed, written: WrittenBack, live_settle: LiveSettle
) -> None:
    assert live_settle.settled.code == 10, live_settle.settled.err or live_settle.settled.out
    for key in UPSTREAM:
        _assert_settled(_tool_in(live_settle.direct[key], crashed.stale[key]), crashed.stale[key])
    for key, observed in written.live.items():
        assert _tool_in(live_settle.direct[key], observed) == observed.running.tool
    late_v1 = crashed.stale[("late", "v1")]
    assert _tool_in(live_settle.direct[("late", "v1")], late_v1) == late_v1.running.tool
    upstream = {crashed.stale[key].session_id for key in UPSTREAM}
    busy = {observed.session_id for observed in live_settle.busy.values()}
    changed = live_settle.before.sessions_changed(live_settle.after)
    assert changed - busy == upstream, "rows changed outside the settled and the busy sessions"


@pytest.mark.parametrize("key", UPSTREAM, ids="-".join)
def test_next_prompt_after_settle_under_the_running_server(
    key: Key, crashed: Crashed, live_settle: LiveSettle
) -> None:
    """Rows and events written into the database of a running server are taken up at once: a
    next prompt, without a restart, works and continues the log after our events."""
    _assert_next_turn(live_settle.next_turns[key], crashed.stale[key])


def test_concurrent_writes_keep_the_database_intact(crashed: Crashed, live_settle: LiveSettle) -> None:
    """The server writes its own parts while `settle --upstream` writes: nothing lost or torn."""
    assert live_settle.integrity == "ok"
    assert live_settle.before.lost_in(live_settle.after) == []
    assert live_settle.after.malformed() == []
    first, last = live_settle.busy_writes[0], live_settle.busy_writes[-1]
    for written_at in live_settle.settle_writes:
        assert first < written_at < last, (
            f"premise: settle wrote at {written_at:.3f}, not among the server's writes ({first:.3f}-{last:.3f})"
        )
    for key, messages in live_settle.busy_done.items():
        tool = _tool_in(messages, live_settle.busy[key])
        assert tool["state"]["status"] == "completed", f"{key}: the server's own tool ended {tool['state']}"
    for key in UPSTREAM:
        _assert_old_or_settled(live_settle, crashed.stale[key])


def _assert_old_or_settled(live_settle: LiveSettle, observed: Observed) -> None:
    """The row holding the tool is byte for byte as before, or settled with everything else kept."""
    v1 = observed.turn.runtime == "v1"
    table, row_id = ("part", observed.tool_id) if v1 else ("session_message", observed.running.message_id)
    before = live_settle.before.tables[table][row_id][1]
    after = live_settle.after.tables[table][row_id][1]
    if after == before:
        return
    stored = orjson.loads(after)
    if v1:
        tool = _with_ids(stored, observed)
    else:
        tool = next(item for item in stored["content"] if item.get("id") == observed.tool_id)
    _assert_settled(tool, observed)


# --- the replay race ----------------------------------------------------------------------------


def test_replay_racing_a_prompt_leaves_one_failure(crashed: Crashed, written: WrittenBack) -> None:
    """Measured: a prompt landing between the writer's read and its `/sync/replay` takes that seq;
    the replay is refused (500), the server fails the call itself right after `prompt.admitted`,
    and the writer's re-read sees that and appends nothing: one failure, no gap."""
    observed, race = crashed.stale[("race", "v2")], written.race
    assert race.outcome == [], race.outcome
    assert race.admitted_seq is not None, "the writer never tried to replay"
    assert race.replays[:1] == [(race.admitted_seq, 500)], race.replays
    assert [status for _, status in race.replays] == [500], "the writer appended after the server's settle"
    assert _failures(race.events, observed.tool_id) == [race.admitted_seq + 1]
    _assert_contiguous(race.events)


def _reading(liveness: Liveness) -> Confirm:
    async def confirm() -> Liveness:
        return liveness

    return confirm
