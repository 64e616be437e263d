"""Phase 2 of the timeline: proxies with `--write-back api` and `--write-back db` fetch their
groups' sessions while an `/event` subscriber listens; live turns are fetched through both; `late`
sessions get a prompt between the two liveness readings; a v2 replay races a prompt (the API
writer in process, against the real server)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamRefused
from proxy.writeback.api_writer import ApiWriter
from proxy.writeback.locks import SessionLocks, default_lock_dir
from proxy.writeback.scheduler import Confirm, Written
from rules import Api, Liveness

from .. import opencode_db
from ..event_tap import EventTap
from ..interposed_upstream import InterposedUpstream, Send
from ..opencode_server import OpencodeServer, directory_header
from ..polling import WaitTimeout, poll
from ..proxy_process import ProxyProcess, running, wait_all_decided, write_back_proxies
from ..turns import Observed, Turn, is_active, read_messages, send_prompt, wait_turn_done
from .restarts import Crashed
from .sessions import GRACE_S, LATE, LIVE, RACES, WRITTEN, Events, Key, observe, stored
from .shapes import is_open, tool_in

WRITE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Race:
    """The API writer appending a `tool.failed` while a prompt lands in the same session."""

    outcome: list[Written] | str
    """What `write` returned, or the error it raised."""
    replays: list[tuple[int, int]]
    """(seq tried, HTTP status) of every `/sync/replay` the writer sent."""
    admitted_seq: int | None
    """Where the prompt sent just before the first replay was admitted (None: never sent)."""
    events: Events
    histories: int
    """How often the writer read the log through `/sync/history`."""


@dataclass(frozen=True)
class Late:
    """A stale session fetched through the db proxy, then prompted before the second reading."""

    active_after_s: float
    """Seconds from the fetch until the server listed the session as active again."""
    stored_before: Any
    stored_after: Any
    events_after: Events


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
    races: dict[Key, Race]


def write_back(server: OpencodeServer, crashed: Crashed, logs: Path) -> WrittenBack:
    """Phase 2: the api and db proxies fetch their groups while an `/event` subscriber listens and
    the live sessions run; the late sessions are prompted between the two readings; the race."""
    live = observe(server, LIVE)
    live_before = {key: stored(server, observed) for key, observed in live.items()}
    proxies = write_back_proxies(server.url, server.database, logs, GRACE_S)
    api, db = proxies["api"], proxies["db"]
    events = EventTap(f"{server.url}/event", directory_header(server.project))
    with running(proxies.values()), events as tap:
        late = {key: _prompt_between_readings(server, db, crashed.stale[key]) for key in LATE}
        for key in WRITTEN:
            _fetch(api.url if key[0] == "api" else db.url, crashed.stale[key].turn)
        _fetch_live(live, (api.url, db.url))
        direct = _wait_written(server, {key: crashed.stale[key] for key in WRITTEN})
        heard = _heard(tap, crashed.stale[("api", "v1")])
        races = {key: asyncio.run(_race(server, crashed.stale[key], key)) for key in RACES}
        _wait_skipped(db, late=[crashed.stale[key] for key in LATE])
        for proxy in (api, db):  # what the live fetches could have scheduled is decided
            wait_all_decided(proxy.url, within=2 * GRACE_S + 10)
        return WrittenBack(
            direct=direct,
            heard=heard,
            logs={"api": api.log(), "db": db.log()},
            live=live,
            live_stored_before=live_before,
            live_stored_after={key: stored(server, observed) for key, observed in live.items()},
            live_direct_after={key: read_messages(server.url, o.turn) for key, o in live.items()},
            late={key: _late_after(server, crashed.stale[key], observed) for key, observed in late.items()},
            races=races,
        )


def _fetch(base_url: str, turn: Turn) -> None:
    reply = read_messages(base_url, turn)
    assert reply, f"{turn.session_id}: empty message view"


def _fetch_live(live: dict[Key, Observed], proxies: Sequence[str]) -> None:
    """Fetch every live session through every proxy a few times."""
    for _ in range(3):
        for observed in live.values():
            for proxy in proxies:
                _fetch(proxy, observed.turn)
        time.sleep(0.2)


def _prompt_between_readings(
    server: OpencodeServer, proxy: ProxyProcess, observed: Observed
) -> tuple[float, Any]:
    """Fetch through the proxy (the first reading: inactive), then prompt at once. Returns how
    many seconds after the fetch the server said the session was active (the second reading comes
    GRACE_S after it), and the stored row as it was before."""
    row = stored(server, observed)
    started = time.monotonic()
    _fetch(proxy.url, observed.turn)
    send_prompt(server.url, observed.turn, "go on")
    poll(
        lambda: True if is_active(server.url, observed.turn) else None,
        what=f"{observed.session_id} active after its prompt",
        timeout=GRACE_S * 4,
        interval=0.02,
    )
    return time.monotonic() - started, row


def _late_after(server: OpencodeServer, observed: Observed, before: tuple[float, Any]) -> Late:
    return Late(
        active_after_s=before[0],
        stored_before=before[1],
        stored_after=stored(server, observed),
        events_after=opencode_db.session_events(server.database, observed.session_id),
    )


def _wait_written(server: OpencodeServer, targets: dict[Key, Observed]) -> dict[Key, list[dict[str, Any]]]:
    """The direct views once no target tool is open any more, or as they are after the timeout
    (the tests then say which one was not written)."""

    def views() -> dict[Key, list[dict[str, Any]]]:
        return {key: read_messages(server.url, observed.turn) for key, observed in targets.items()}

    def all_written() -> dict[Key, list[dict[str, Any]]] | None:
        current = views()
        open_left = [key for key, o in targets.items() if is_open(tool_in(current[key], o))]
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
            lambda p: about_part(p) and not is_open(p["properties"]["part"]),
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


class _PromptFirst(InterposedUpstream):
    """The upstream as the API writer sees it, except that a prompt reaches the session right
    before the writer's first `/sync/replay`: the server appends between the read and the append."""

    def __init__(self, session: aiohttp.ClientSession, origin: URL, observed: Observed) -> None:
        super().__init__(session, origin)
        self._observed = observed
        self.admitted_seq: int | None = None
        self.replays: list[tuple[int, int]] = []
        self.histories = 0

    async def around(self, method: str, path: str, credentials: Credentials, json: Any, send: Send) -> Any:
        self.histories += path == "/sync/history"
        if path != "/sync/replay":
            return await send()
        if self.admitted_seq is None:
            self.admitted_seq = await self._prompt(credentials)
        seq = int(json["events"][0]["seq"])
        try:
            answer = await send()
        except UpstreamRefused as refusal:
            self.replays.append((seq, refusal.status))
            raise
        self.replays.append((seq, 200))
        return answer

    async def _prompt(self, credentials: Credentials) -> int:
        path = f"/api/session/{self._observed.session_id}/prompt"
        answer = await self.send_directly("POST", path, credentials, json={"prompt": {"text": "meanwhile"}})
        return int(answer["data"]["admittedSeq"])


async def _race(server: OpencodeServer, observed: Observed, key: Key) -> Race:
    """The API writer appending while a prompt lands first, reading the log through the API or,
    for `race-db`, from the server's database."""
    origin = URL(server.url)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        upstream = _PromptFirst(session, origin, observed)
        liveness = Liveness(observed.session_id, active=False)
        outcome: list[Written] | str
        try:
            database = server.database if key[0] == "race-db" else None
            writer = ApiWriter(upstream, SessionLocks(default_lock_dir(os.environ)), database=database)
            outcome = await writer.write(
                Api.V2, observed.session_id, Credentials(), {observed.tool_id}, _reading(liveness)
            )
        except UpstreamRefused as refusal:
            outcome = str(refusal)
    if upstream.admitted_seq is not None:
        await asyncio.to_thread(wait_turn_done, server.url, observed.turn)
    events = opencode_db.session_events(server.database, observed.session_id)
    return Race(outcome, upstream.replays, upstream.admitted_seq, events, upstream.histories)


def _reading(liveness: Liveness) -> Confirm:
    async def confirm() -> Liveness:
        return liveness

    return confirm
