"""Two writers at once in front of one server: fetches through two proxies released by one
barrier, and the v1 PATCH race of two in-process API writers forced (the measurements: the
docstring of tests/integration/test_write_back_faults.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from proxy.opencode.client import Credentials
from proxy.writeback.api_writer import ApiWriter
from proxy.writeback.locks import SessionLocks
from rules import Api, Liveness

from . import opencode_db
from .faults import (
    PASS_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    Crashed,
    Key,
    Stored,
    fetch_messages,
    log_problems,
    part_state_of,
    read_stored,
    restale,
    state_of,
    written_counts,
)
from .http_client import Reply, request
from .interposed_upstream import InterposedUpstream, Send
from .opencode_server import OpencodeServer
from .polling import WaitTimeout, poll
from .proxy_process import ProxyProcess
from .turns import Observed, Turn

PATCH_MEET_TIMEOUT_S = 1.0
"""How long a forced-race writer waits at its PATCH for the other writer to arrive there too."""
WRITE_BACKS_METRIC = "settle_proxy_write_backs_total{"


@dataclass(frozen=True)
class Trial:
    """One session fetched through two write-back proxies at once: events appended about its tool."""

    key: Key
    counts: dict[str, int]
    state: str
    racing: int
    """How many of the two proxies went for the tool (settled their view and scheduled a
    write): 2 is a real race, 1 means the other fetched after the write."""


@dataclass(frozen=True)
class ForcedRace:
    """Two in-process API writers that both read a v1 part before either PATCHes."""

    patches: int
    """PATCHes the two writers sent."""
    written: list[int]
    """How many parts each writer reported written."""
    part_events: int
    """`message.part.updated.1` events the server stored for the part."""


def _fetch_all_at_once(requests: Sequence[tuple[str, Turn]]) -> list[Reply]:
    """Every (proxy, session) fetch released by one barrier, so that the proxies read together."""
    barrier = threading.Barrier(len(requests))

    def fetch(base_url: str, turn: Turn) -> Reply:
        barrier.wait(timeout=REQUEST_TIMEOUT_S)
        return fetch_messages(base_url, turn)

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        running = [pool.submit(fetch, base_url, turn) for base_url, turn in requests]
        return [future.result() for future in running]


def _write_back_passes(proxy: ProxyProcess) -> float:
    """Write-back passes the proxy has finished (any outcome), from its metrics."""
    reply = request("GET", f"{proxy.url}/_settle/metrics", timeout=REQUEST_TIMEOUT_S)
    assert reply.status == 200, reply.status
    lines = reply.body.decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(WRITE_BACKS_METRIC))


def fetch_and_wait_written(proxies: Sequence[ProxyProcess], turns: Sequence[Turn]) -> dict[str, int]:
    """Fetch every session through every proxy at once; return when each proxy has finished a
    write-back pass for each response it settled (each one scheduled one). Returns how many
    proxies went for each session (settled its view, so scheduled a write)."""
    passes = {proxy.url: _write_back_passes(proxy) for proxy in proxies}
    fetches = [(proxy.url, turn) for turn in turns for proxy in proxies]
    scheduled = dict.fromkeys(passes, 0)
    racing = {turn.session_id: 0 for turn in turns}
    for (proxy_url, turn), reply in zip(fetches, _fetch_all_at_once(fetches), strict=True):
        assert reply.status == 200, reply.body[:300]
        went = reply.headers.get("x-settle-settled") is not None
        scheduled[proxy_url] += went
        racing[turn.session_id] += went

    def all_done() -> bool | None:
        done = all(_write_back_passes(p) >= passes[p.url] + scheduled[p.url] for p in proxies)
        return True if done else None

    poll(all_done, what="the write-back passes of both proxies", timeout=PASS_TIMEOUT_S, interval=0.05)
    return racing


@contextlib.contextmanager
def two_proxies(server: OpencodeServer, logs: Path, args: Sequence[str]) -> Iterator[list[ProxyProcess]]:
    """Two proxy processes with the same flags in front of the server, stopped at the end."""
    proxies = [ProxyProcess(server.url, Path(f"{logs}-{n}.log"), args) for n in range(2)]
    try:
        for proxy in proxies:
            proxy.start()
        yield proxies
    finally:
        for proxy in proxies:
            proxy.stop()


def run_trials(
    server: OpencodeServer,
    crashed: Crashed,
    proxies: Sequence[ProxyProcess],
    keys: Sequence[Key],
    *,
    since_now: bool = False,
    part_only: bool = False,
) -> list[Trial]:
    """Fetch the sessions through all proxies at once, wait for their passes, count the events
    appended since the crash (or, for a session made stale again, since just now). With
    `part_only` (api v1: the API cannot close the message) only the part row is judged."""
    sessions = crashed.sessions(keys)
    baseline = read_stored(server.database, sessions) if since_now else crashed.before
    racing = fetch_and_wait_written(proxies, [stale.turn for stale in sessions])
    after = _once_written(server, sessions, baseline)
    return [
        Trial(
            key,
            written_counts(stale, baseline[stale.session_id], after[stale.session_id]),
            (part_state_of if part_only else state_of)(
                stale, crashed.before[stale.session_id], after[stale.session_id]
            ),
            racing[stale.session_id],
        )
        for key, stale in zip(keys, sessions, strict=True)
    ]


def _once_written(
    server: OpencodeServer, sessions: Sequence[Observed], baseline: dict[str, Stored]
) -> dict[str, Stored]:
    """What storage holds once every session's rows differ from `baseline` (a write landed); what
    it holds at the deadline otherwise, for the trial to judge. The passes counted in the metric
    are not only this trial's (a client-stream confirmation schedules one of its own), so a pass
    finished is no sign that this trial's write has landed."""

    def changed() -> dict[str, Stored] | None:
        after = read_stored(server.database, sessions)
        landed = all(after[s.session_id].rows != baseline[s.session_id].rows for s in sessions)
        return after if landed else None

    try:
        return poll(changed, what="a write of every session", timeout=PASS_TIMEOUT_S, interval=0.05)
    except WaitTimeout:
        return read_stored(server.database, sessions)


class _PatchTogether(InterposedUpstream):
    """The upstream as one of two API writers sees it, except that a v1 PATCH waits (up to
    PATCH_MEET_TIMEOUT_S) until the other writer has reached its PATCH too: the race of two
    proxies that both read the part before either writes, made certain."""

    def __init__(self, session: aiohttp.ClientSession, origin: URL, meeting: _Meeting) -> None:
        super().__init__(session, origin)
        self._meeting = meeting

    async def around(self, method: str, path: str, credentials: Credentials, json: Any, send: Send) -> Any:
        if method == "PATCH":
            await self._meeting.arrive()
        return await send()


class _Meeting:
    """Where the two writers' PATCHes wait for each other; counts who arrived."""

    def __init__(self) -> None:
        self.arrived = 0
        self._both = asyncio.Event()

    async def arrive(self) -> None:
        self.arrived += 1
        if self.arrived >= 2:
            self._both.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._both.wait(), PATCH_MEET_TIMEOUT_S)


async def forced_race(
    server: OpencodeServer, crashed: Crashed, stale: Observed, *, shared: bool, locks: Path
) -> ForcedRace:
    """Make the part stale again, then let two API writers write it at once: with one lock
    directory (two proxies on one host), or with one each (no lock in common)."""
    before = crashed.before[stale.session_id]
    restale(server.database, stale, before)
    baseline = read_stored(server.database, [stale])[stale.session_id]
    origin = URL(server.url)
    meeting = _Meeting()
    liveness = Liveness(stale.session_id, active=False)

    async def confirm() -> Liveness:
        return liveness

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session:
        writers = [
            ApiWriter(
                _PatchTogether(session, origin, meeting),
                SessionLocks(locks / ("shared" if shared else f"own-{n}")),
            )
            for n in range(2)
        ]
        results = await asyncio.gather(
            *(
                writer.write(Api.V1, stale.session_id, Credentials(), {stale.tool_id}, confirm)
                for writer in writers
            )
        )
    after = read_stored(server.database, [stale])[stale.session_id]
    return ForcedRace(
        patches=meeting.arrived,
        written=[len(result) for result in results],
        part_events=written_counts(stale, baseline, after)["part"],
    )


@dataclass(frozen=True)
class Pairs:
    """Phase 2: two write-back proxies in front of one server, per mode and runtime."""

    db: list[Trial]
    api_v2: list[Trial]
    api_v1: list[Trial]
    race_separate_locks: ForcedRace
    race_shared_lock: ForcedRace
    log_problems: list[str]
    integrity: str


def run_pairs(
    server: OpencodeServer,
    crashed: Crashed,
    logs: Path,
    *,
    db_keys: Sequence[Key],
    api_keys: Sequence[Key],
    api_v1_trials: int,
) -> Pairs:
    """Two db proxies on `db_keys`, then two api proxies on `api_keys` (each v1 session made stale
    again until there were `api_v1_trials` trials), at once; then the forced race."""
    database = server.database
    db_args = ("--write-back", "db", "--db", str(database), "--grace", "0")
    with two_proxies(server, logs / "db", db_args) as proxies:
        db_trials = run_trials(server, crashed, proxies, db_keys)
    with two_proxies(server, logs / "api", ("--write-back", "api", "--grace", "0")) as proxies:
        api_v2 = run_trials(server, crashed, proxies, [k for k in api_keys if k[1] == "v2"])
        api_v1 = []
        v1_keys = [k for k in api_keys if k[1] == "v1"]
        for trial in range(api_v1_trials):
            key = v1_keys[trial % len(v1_keys)]
            again = trial >= len(v1_keys)
            if again:
                restale(database, crashed.stale[key], crashed.before[crashed.stale[key].session_id])
            api_v1 += run_trials(server, crashed, proxies, [key], since_now=again, part_only=True)
    v1 = crashed.stale[v1_keys[0]]
    separate = asyncio.run(forced_race(server, crashed, v1, shared=False, locks=logs / "locks"))
    shared = asyncio.run(forced_race(server, crashed, v1, shared=True, locks=logs / "locks"))
    result = Pairs(
        db=db_trials,
        api_v2=api_v2,
        api_v1=api_v1,
        race_separate_locks=separate,
        race_shared_lock=shared,
        log_problems=log_problems(database),
        integrity=opencode_db.integrity(database),
    )
    for name, trials in (("db", db_trials), ("api v2", api_v2), ("api v1", api_v1)):
        counts = [(trial.racing, *trial.counts.values()) for trial in trials]
        print(f"\n{name} pairs (proxies racing, events per part/message/call): {counts}")  # with -s
    print(f"forced v1 race: separate locks {separate}, shared lock {shared}")
    return result
