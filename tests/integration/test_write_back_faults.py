"""Write-back under faults, on the real opencode 1.18.33 (issue 6, item 6): a writer SIGKILLed
in the middle of a db pass leaves every stale tool exactly as it was or fully settled, and two
proxies writing back in front of one server write each part exactly once.

The module has its own server (its own data dir), so the offline `settle`, which settles the
whole database, sees only this module's sessions. One crash makes every stale session the
module needs; then fixtures act in a fixed timeline and record what they saw, and the tests
only assert on those records:

1. `crashed`: stale turns of every group run a bash tool; SIGKILL; start; the rows and event
   logs of every stale session are kept as they were (`before`).
2. `pairs`: two `--write-back db` proxies on the same database, then two `--write-back api`
   proxies, fetch the same stale sessions at the same instant (one barrier for all requests);
   every appended event is counted per part and per call. The api v1 sessions are made stale
   again between trials by writing their part rows back to the bytes the crash left (the
   server has no cache, measured), so one session gives many trials. Then the v1 PATCH race is
   forced in process: two `ApiWriter`s that both read before either PATCHes.
3. `killed`: writers of the kill group are SIGKILLed while a db pass is under way, alternately
   a proxy (`--write-back db --grace 0`, all sessions fetched at once) and the offline
   `settle --upstream`; after each kill the database is checked; then a proxy settles the rest
   and a last `settle --upstream` finds nothing to do.

Landing a kill inside a write transaction, not merely between two: the writer is frozen with
SIGSTOP (every thread stopped, read from /proc), and it is inside a write transaction exactly
when it holds SQLite's WAL write lock, an fcntl lock on byte 120 of `opencode.db-shm` that
/proc/locks lists with its pid. If it holds it and part of the pass (not all) has committed,
it is SIGKILLed while still frozen: the kill provably lands inside a transaction with the pass
half done. Otherwise it is continued (SIGCONT) and sampled again ~0.1 ms later; it runs niced
on the sampler's CPU, so only while the sampler sleeps. What is committed while the writer is
frozen is what a SIGKILL at that instant would leave, so every sample is also a crash point
whose storage is checked (about 1,500 per run, not just the few real kills); the real kill then
shows that storage after it is exactly the storage read while frozen.
A writer that commits a row apart from its event is caught this way (tried: both the kills and
the frozen samples found a settled part without its event or message).

Measured on 1.18.33 (pinned by the tests named):
- Before `SessionLocks` (proxy/writeback/api_writer.py), two api proxies fetching one stale v1 session at
  once PATCHed it twice in 15 of 20 trials here (8 of 20 with less tightly synchronised
  fetches): PATCH is an upsert with no precondition, and both proxies read the part before
  either wrote. Forced in process, both writers PATCH and the server stores both
  (`test_v1_patch_race_premise_and_lock`, premise half). With the lock, 0 of 20
  (`test_two_api_proxies_write_each_v1_part_once`).
- Two api proxies appending the same v2 `tool.failed`: one replay is refused (the seq is
  taken) and its writer's re-read finds the call failed: one event per call.
- The db writer's one `BEGIN IMMEDIATE` transaction per session, re-reading inside it, makes
  two db proxies write each part and each message once; SIGKILL inside it leaves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.writeback.api_writer import ApiWriter
from proxy.writeback.locks import SessionLocks
from rules import Api, Liveness

from . import opencode_db
from .expected import V1_MESSAGE_ERROR, V1_PART_ERROR, V2_TOOL_ERROR
from .http_client import Reply, request
from .mock_model import MockModel
from .opencode_server import REPO_ROOT, OpencodeServer, running_opencode
from .polling import WaitTimeout, poll
from .proxy_process import ProxyProcess
from .turns import Observed, Runtime, Turn, start_turn, wait_tool_running

pytestmark = pytest.mark.integration

KILL_V1 = 5
KILL_V2 = 5
"""The kill group: enough sessions that several kills each find a pass half done."""
PAIR_DB = 2
"""v1 and v2 sessions each that two db proxies fetch at once."""
PAIR_API_V1 = 2
PAIR_API_V2 = 3
API_V1_TRIALS = 20
"""Race trials of two api proxies on a v1 part: the real stale sessions, then made stale again."""
KILL_ROUNDS = ("proxy", "settle", "proxy", "settle", "proxy", "settle")
"""Writers to SIGKILL mid-pass, in turn, while at least two kill-group sessions are left open."""
MIN_LANDED_PER_WRITER = 1
"""Kills that must land inside a transaction, for each writer, or the test proves nothing."""

SAMPLE_INTERVAL_S = 0.0001
WRITER_NICE = 19
"""How long the writer runs between two samples: short against a transaction, so that most
transactions are caught at least once (reading storage at each sample takes longer)."""
KILL_ROUND_TIMEOUT_S = 20.0
READ_TIMEOUT_S = 5.0
SAMPLE_READ_TIMEOUT_S = 0.2
PASS_TIMEOUT_S = 15.0
PROCESS_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 15.0
PATCH_MEET_TIMEOUT_S = 1.0
"""How long a forced-race writer waits at its PATCH for the other writer to arrive there too."""
WAL_WRITE_LOCK_BYTE = 120
"""SQLite's WAL_WRITE_LOCK in the -shm file: held from `BEGIN IMMEDIATE` to commit or rollback."""

PART_UPDATED = "message.part.updated.1"
MESSAGE_UPDATED = "message.updated.1"
TOOL_FAILED = "session.next.tool.failed.1"
WRITE_BACKS_METRIC = "settle_proxy_write_backs_total{"

Key = tuple[str, Runtime, int]
"""(group, runtime, index): the role a stale session plays."""


def _keys(group: str, runtime: Runtime, count: int) -> list[Key]:
    return [(group, runtime, index) for index in range(count)]


KILL: list[Key] = [*_keys("kill", "v1", KILL_V1), *_keys("kill", "v2", KILL_V2)]
PAIR_DB_KEYS: list[Key] = [*_keys("pair-db", "v1", PAIR_DB), *_keys("pair-db", "v2", PAIR_DB)]
PAIR_API_KEYS: list[Key] = [*_keys("pair-api", "v1", PAIR_API_V1), *_keys("pair-api", "v2", PAIR_API_V2)]
STALE: list[Key] = [*KILL, *PAIR_DB_KEYS, *PAIR_API_KEYS]


@dataclass(frozen=True)
class Stored:
    """What storage holds for one stale session: the rows write-back may change, exactly as
    stored ((data, time_updated) by table), and the session's whole event log."""

    rows: dict[str, tuple[str, int]]
    events: list[tuple[int, str, str, str]]
    """(seq, type, id, data as stored), by seq."""
    last_seq: int
    """`event_sequence.seq` of the session."""


# --- storage, read as an observer ---------------------------------------------------------------


def _stored(
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


def _log_problems(database: Path) -> list[str]:
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


def _restale(database: Path, stale: Observed, before: Stored) -> None:
    """Write the v1 part row back to the bytes the crash left, as if it had never been settled.
    (A direct UPDATE is served by the running server at once; the API writer reads the view.)"""
    data, updated = before.rows["part"]
    with contextlib.closing(sqlite3.connect(database, timeout=5.0)) as db:
        db.execute("UPDATE part SET data = ?, time_updated = ? WHERE id = ?", (data, updated, stale.tool_id))
        db.commit()


# --- what a stale session is now: old, settled, or neither ----------------------------------------


def _state(stale: Observed, before: Stored, after: Stored) -> str:
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


def _written_counts(stale: Observed, before: Stored, after: Stored) -> dict[str, int]:
    """The events appended since `before` about the stale tool: per part (v1: its part and its
    message) or per call (v2)."""
    appended = after.events[len(before.events) :]
    if stale.runtime == "v1":
        return {
            "part": _count(appended, PART_UPDATED, ("part", "id"), stale.tool_id),
            "message": _count(appended, MESSAGE_UPDATED, ("info", "id"), stale.message_id),
        }
    return {"call": _count(appended, TOOL_FAILED, ("callID",), stale.tool_id)}


# --- processes ----------------------------------------------------------------------------------


class KillableProxy(ProxyProcess):
    """A proxy process the test can freeze and SIGKILL by its pid."""

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("proxy is not running")
        return self._process.pid

    def kill(self) -> None:
        """SIGKILL (it works on a frozen process too) and reap it."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=PROCESS_TIMEOUT_S)

    def thaw_and_stop(self) -> None:
        """Continue it in case a sample left it frozen, then stop it; idempotent."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGCONT)
        self.stop()


def _environment() -> dict[str, str]:
    """The test's environment without server credentials, as a user would run `settle`."""
    return {name: value for name, value in os.environ.items() if not name.startswith("OPENCODE_SERVER")}


def _settle_command(database: Path, upstream: str) -> list[str]:
    return [sys.executable, "-m", "proxy", "settle", "--db", str(database), "--upstream", upstream]


def _all_threads_stopped(pid: int) -> bool | None:
    """True once every thread of `pid` is stopped; None when the process is gone."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        names = list(tasks.iterdir())
    except FileNotFoundError:
        return None
    for task in names:
        try:
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended
        state = stat[stat.rindex(")") + 2]
        if state in "ZX" and task.name == str(pid):
            return None  # the process has exited
        if state not in "tTZX":  # an exited thread runs nothing either
            return False
    return True


def _freeze(pid: int) -> bool:
    """SIGSTOP and wait until every thread has stopped; False when the process is gone."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while (stopped := _all_threads_stopped(pid)) is False:
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not stop")
        time.sleep(0.0002)
    return stopped is True


def _lock_id(database: Path) -> tuple[int, int]:
    """(device, inode) of `opencode.db-shm`, as /proc/locks names it."""
    status = os.stat(f"{database}-shm")
    return status.st_dev, status.st_ino


def _holds_wal_write_lock(pid: int, shm: tuple[int, int]) -> bool:
    """Whether `pid` holds SQLite's WAL write lock on the database, i.e. is inside a write
    transaction (/proc/locks: `N: POSIX ADVISORY WRITE pid maj:min:inode start end`)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX" or fields[3] != "WRITE" or fields[4] != str(pid):
            continue
        major, minor, inode = fields[5].split(":")
        same_file = (os.makedev(int(major, 16), int(minor, 16)), int(inode)) == shm
        if same_file and int(fields[6]) == WAL_WRITE_LOCK_BYTE:
            return True
    return False


@dataclass(frozen=True)
class Kill:
    """How one attempt to SIGKILL a writer mid-pass went.

    Every sample freezes the writer, and what is committed while it is frozen is exactly what
    a SIGKILL at that instant would leave (SQLite discards the open transaction): so each
    sample is a crash point whose storage is checked, and the real SIGKILL at the end proves
    that equivalence on the last one.
    """

    landed: bool
    """Killed while inside a write transaction, with part of the pass committed."""
    committed: int
    """Sessions of the pass committed when it was killed (or when it ended unkilled)."""
    samples: int
    """Crash points checked: frozen samples whose committed storage was classified."""
    torn_while_frozen: dict[str, str]
    """Sessions seen neither old nor settled at some sample (the first such state seen)."""
    at_kill: dict[str, Stored] | None
    """The targets' storage read while frozen, right before the SIGKILL."""


@contextlib.contextmanager
def _writer_behind_sampler(pid: int) -> Iterator[None]:
    """Let the writer run only while the sampler sleeps: on the sampler's CPU, at the lowest
    priority (threads it starts later inherit both). Otherwise, on a busy machine, the sampler
    is scheduled late and the writer runs a whole pass between two samples (seen: nine
    sessions settled unobserved); the sampler's short sleeps now bound each run of it."""
    own = os.sched_getaffinity(0)
    cpu = {min(own)}
    os.sched_setaffinity(0, cpu)  # the calling thread only
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), WRITER_NICE)
                os.sched_setaffinity(int(task.name), cpu)
        yield
    finally:
        os.sched_setaffinity(0, own)


def _kill_mid_pass(
    pid: int, kill: Callable[[], None], database: Path, targets: list[Observed], before: dict[str, Stored]
) -> Kill:
    """Sample the writer frozen until it is inside a write transaction with part of the pass
    committed, and SIGKILL it right there; give up when the pass is over."""
    with _writer_behind_sampler(pid):
        return _sample_and_kill(pid, kill, database, targets, before)


def _sample_and_kill(
    pid: int, kill: Callable[[], None], database: Path, targets: list[Observed], before: dict[str, Stored]
) -> Kill:
    shm = _lock_id(database)
    samples, busy, torn = 0, 0, dict[str, str]()
    deadline = time.monotonic() + KILL_ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        frozen = _freeze(pid)
        try:
            stored = _stored(database, targets, busy_timeout=SAMPLE_READ_TIMEOUT_S)
        except sqlite3.OperationalError as error:
            # A reader can need a lock the frozen writer holds (it was stopped in the middle of
            # updating the WAL index): let it run on, and sample again.
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            busy += 1
            time.sleep(SAMPLE_INTERVAL_S)
            continue
        samples += frozen
        for stale in targets:
            state = _state(stale, before[stale.session_id], stored[stale.session_id])
            if state not in ("old", "settled"):
                torn.setdefault(stale.session_id, state)
        committed = sum(stored[s.session_id].last_seq > before[s.session_id].last_seq for s in targets)
        if not frozen or committed == len(targets):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            return Kill(False, committed, samples, torn, None)
        if committed >= 1 and _holds_wal_write_lock(pid, shm):
            kill()
            return Kill(True, committed, samples, torn, stored)
        os.kill(pid, signal.SIGCONT)
        time.sleep(SAMPLE_INTERVAL_S)
    raise WaitTimeout(
        f"the writer neither finished nor was caught mid-pass in {KILL_ROUND_TIMEOUT_S}s "
        f"({samples} samples, {busy} unreadable while frozen)"
    )


# --- fetching through proxies -------------------------------------------------------------------


def _fetch(base_url: str, turn: Turn) -> Reply:
    return request("GET", base_url + turn.messages_path, timeout=REQUEST_TIMEOUT_S)


def _fetch_all_at_once(requests: Sequence[tuple[str, Turn]]) -> list[Reply]:
    """Every (proxy, session) fetch released by one barrier, so that the proxies read together."""
    barrier = threading.Barrier(len(requests))

    def fetch(base_url: str, turn: Turn) -> Reply:
        barrier.wait(timeout=REQUEST_TIMEOUT_S)
        return _fetch(base_url, turn)

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        running = [pool.submit(fetch, base_url, turn) for base_url, turn in requests]
        return [future.result() for future in running]


def _write_back_passes(proxy: ProxyProcess) -> float:
    """Write-back passes the proxy has finished (any outcome), from its metrics."""
    reply = request("GET", f"{proxy.url}/_settle/metrics", timeout=REQUEST_TIMEOUT_S)
    assert reply.status == 200, reply.status
    lines = reply.body.decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(WRITE_BACKS_METRIC))


def _fetch_and_wait_written(proxies: Sequence[ProxyProcess], turns: Sequence[Turn]) -> dict[str, int]:
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


# --- phase 1 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Crashed:
    """Phase 1: the stale sessions, and what storage held for them right after the crash."""

    stale: dict[Key, Observed]
    before: dict[str, Stored]
    """Every stale session as the crash left it, by session id."""

    def sessions(self, keys: Sequence[Key]) -> list[Observed]:
        return [self.stale[key] for key in keys]


@pytest.fixture(scope="module")
def server(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    """This module's own server; stopped with all its tools at the end."""
    with running_opencode(tmp_path_factory.mktemp("write-back-faults"), mock_model.base_url) as opencode:
        yield opencode


@pytest.fixture(scope="module")
def crashed(server: OpencodeServer) -> Crashed:
    """Start every turn first (their start-ups overlap), wait for each tool, SIGKILL, start."""
    turns = {key: start_turn(key[1], server.url, server.project, "-".join(map(str, key))) for key in STALE}
    stale = {key: Observed(turn, wait_tool_running(server.url, turn)) for key, turn in turns.items()}
    server.crash()
    server.restart()
    return Crashed(stale, _stored(server.database, list(stale.values())))


# --- phase 2 ------------------------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def pairs(server: OpencodeServer, crashed: Crashed, tmp_path_factory: pytest.TempPathFactory) -> Pairs:
    """Two db proxies, then two api proxies, on the same sessions at once; then the forced race."""
    logs = tmp_path_factory.mktemp("write-back-pairs")
    database = server.database
    db_args = ("--write-back", "db", "--db", str(database), "--grace", "0")
    with _two_proxies(server, logs / "db", db_args) as proxies:
        db_trials = _trials(server, crashed, proxies, PAIR_DB_KEYS)
    with _two_proxies(server, logs / "api", ("--write-back", "api", "--grace", "0")) as proxies:
        api_v2 = _trials(server, crashed, proxies, [k for k in PAIR_API_KEYS if k[1] == "v2"])
        api_v1 = []
        v1_keys = [k for k in PAIR_API_KEYS if k[1] == "v1"]
        for trial in range(API_V1_TRIALS):
            key = v1_keys[trial % len(v1_keys)]
            again = trial >= len(v1_keys)
            if again:
                _restale(database, crashed.stale[key], crashed.before[crashed.stale[key].session_id])
            api_v1 += _trials(server, crashed, proxies, [key], since_now=again, part_only=True)
    v1 = crashed.stale[v1_keys[0]]
    separate = asyncio.run(_forced_race(server, crashed, v1, shared=False, locks=logs / "locks"))
    shared = asyncio.run(_forced_race(server, crashed, v1, shared=True, locks=logs / "locks"))
    result = Pairs(
        db=db_trials,
        api_v2=api_v2,
        api_v1=api_v1,
        race_separate_locks=separate,
        race_shared_lock=shared,
        log_problems=_log_problems(database),
        integrity=opencode_db.integrity(database),
    )
    for name, trials in (("db", db_trials), ("api v2", api_v2), ("api v1", api_v1)):
        counts = [(trial.racing, *trial.counts.values()) for trial in trials]
        print(f"\n{name} pairs (proxies racing, events per part/message/call): {counts}")  # with -s
    print(f"forced v1 race: separate locks {separate}, shared lock {shared}")
    return result


@contextlib.contextmanager
def _two_proxies(server: OpencodeServer, logs: Path, args: Sequence[str]) -> Iterator[list[ProxyProcess]]:
    """Two proxy processes with the same flags in front of the server, stopped at the end."""
    proxies = [ProxyProcess(server.url, Path(f"{logs}-{n}.log"), args) for n in range(2)]
    try:
        for proxy in proxies:
            proxy.start()
        yield proxies
    finally:
        for proxy in proxies:
            proxy.stop()


def _trials(
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
    baseline = _stored(server.database, sessions) if since_now else crashed.before
    racing = _fetch_and_wait_written(proxies, [stale.turn for stale in sessions])
    after = _stored(server.database, sessions)
    return [
        Trial(
            key,
            _written_counts(stale, baseline[stale.session_id], after[stale.session_id]),
            (_part_state if part_only else _state)(
                stale, crashed.before[stale.session_id], after[stale.session_id]
            ),
            racing[stale.session_id],
        )
        for key, stale in zip(keys, sessions, strict=True)
    ]


def _part_state(stale: Observed, before: Stored, after: Stored) -> str:
    """The v1 part row alone: "settled part", or "torn: <why>"."""
    ids = {"id": stale.tool_id, "sessionID": stale.session_id, "messageID": stale.message_id}
    part = {**ids, **orjson.loads(after.rows["part"][0])}
    problems = _v1_part_problems(part, orjson.loads(before.rows["part"][0]))
    return f"torn: {'; '.join(problems)}" if problems else "settled part"


class _PatchTogether(UpstreamApi):
    """The upstream as one of two API writers sees it, except that a v1 PATCH waits (up to
    PATCH_MEET_TIMEOUT_S) until the other writer has reached its PATCH too: the race of two
    proxies that both read the part before either writes, made certain."""

    def __init__(self, session: aiohttp.ClientSession, origin: URL, meeting: _Meeting) -> None:
        super().__init__(session, origin)
        self._meeting = meeting

    async def call(
        self,
        method: str,
        path: str,
        credentials: Credentials,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
    ) -> Any:
        if method == "PATCH":
            await self._meeting.arrive()
        return await super().call(method, path, credentials, params=params, json=json)


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


async def _forced_race(
    server: OpencodeServer, crashed: Crashed, stale: Observed, *, shared: bool, locks: Path
) -> ForcedRace:
    """Make the part stale again, then let two API writers write it at once: with one lock
    directory (two proxies on one host), or with one each (no lock in common)."""
    before = crashed.before[stale.session_id]
    _restale(server.database, stale, before)
    baseline = _stored(server.database, [stale])[stale.session_id]
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
    after = _stored(server.database, [stale])[stale.session_id]
    return ForcedRace(
        patches=meeting.arrived,
        written=[len(result) for result in results],
        part_events=_written_counts(stale, baseline, after)["part"],
    )


# --- phase 3 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One writer started on the kill group's open sessions and SIGKILLed mid-pass (if caught)."""

    writer: str
    targets: int
    """Sessions still open when the round began."""
    kill: Kill
    after_kill: dict[str, Stored]
    """The targets' storage after the SIGKILL (must be `kill.at_kill`: the open transaction left nothing)."""
    integrity: str
    states: dict[str, str]
    """Every kill-group session: "old", "settled" or "torn: <why>"."""
    log_problems: list[str]


@dataclass(frozen=True)
class Killed:
    """Phase 3: the kill rounds, then the kill group after a final pass and a last `settle`."""

    rounds: list[Round]
    final_states: dict[str, str]
    final_counts: dict[str, dict[str, int]]
    final_integrity: str
    final_log_problems: list[str]
    last_settle: tuple[int, str]
    """Exit code and output of `settle --upstream` after the final pass."""
    seconds: float


@pytest.fixture(scope="module")
def killed(
    server: OpencodeServer, crashed: Crashed, pairs: Pairs, tmp_path_factory: pytest.TempPathFactory
) -> Killed:
    """Kill rounds while at least two sessions are open, a final uninterrupted proxy pass, then
    `settle --upstream`. Runs after `pairs`: `settle` settles the whole database."""
    del pairs  # only its order matters: every other stale session is settled by now
    started = time.monotonic()
    logs = tmp_path_factory.mktemp("write-back-kills")
    sessions = crashed.sessions(KILL)
    rounds = []
    for number, writer in enumerate(KILL_ROUNDS):
        open_now = [s for s in sessions if _state(s, crashed.before[s.session_id], _now(server, s)) == "old"]
        if len(open_now) < 2:
            break
        rounds.append(_kill_round(server, crashed, writer, open_now, logs / f"round-{number}.log"))
    _final_pass(server, crashed, sessions, logs / "final.log")
    last = subprocess.run(
        _settle_command(server.database, server.url),
        cwd=REPO_ROOT,
        env=_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=PASS_TIMEOUT_S * 2,
        check=False,
    )
    after = _stored(server.database, sessions)
    result = Killed(
        rounds=rounds,
        final_states={
            s.session_id: _state(s, crashed.before[s.session_id], after[s.session_id]) for s in sessions
        },
        final_counts={
            s.session_id: _written_counts(s, crashed.before[s.session_id], after[s.session_id])
            for s in sessions
        },
        final_integrity=opencode_db.integrity(server.database),
        final_log_problems=_log_problems(server.database),
        last_settle=(last.returncode, last.stdout + last.stderr),
        seconds=time.monotonic() - started,
    )
    print(f"\nkill rounds ({result.seconds:.1f}s): {_report(result)}")  # the figures, with -s
    return result


def _now(server: OpencodeServer, stale: Observed) -> Stored:
    return _stored(server.database, [stale])[stale.session_id]


def _kill_round(
    server: OpencodeServer, crashed: Crashed, writer: str, targets: list[Observed], log: Path
) -> Round:
    database = server.database
    if writer == "proxy":
        kill = _kill_proxy(server, targets, crashed.before, log)
    else:
        kill = _kill_settle(server, targets, crashed.before, log)
    everyone = crashed.sessions(KILL)
    after = _stored(database, everyone)
    return Round(
        writer=writer,
        targets=len(targets),
        kill=kill,
        after_kill={s.session_id: after[s.session_id] for s in targets},
        integrity=opencode_db.integrity(database),
        states={s.session_id: _state(s, crashed.before[s.session_id], after[s.session_id]) for s in everyone},
        log_problems=_log_problems(database),
    )


def _kill_proxy(
    server: OpencodeServer, targets: list[Observed], before: dict[str, Stored], log: Path
) -> Kill:
    """A db proxy with no grace: every session fetched at once schedules its pass at once."""
    proxy = KillableProxy(
        server.url, log, ("--write-back", "db", "--db", str(server.database), "--grace", "0")
    )
    pool = ThreadPoolExecutor(max_workers=len(targets))
    fetches: list[Future[Reply]] = []
    try:
        proxy.start()
        fetches = [pool.submit(_fetch, proxy.url, s.turn) for s in targets]
        return _kill_mid_pass(proxy.pid, proxy.kill, server.database, targets, before)
    finally:
        proxy.thaw_and_stop()
        for fetch in fetches:  # a fetch cut by the kill fails; that is the point
            with contextlib.suppress(Exception):
                fetch.result(timeout=REQUEST_TIMEOUT_S)
        pool.shutdown(wait=True)


def _kill_settle(
    server: OpencodeServer, targets: list[Observed], before: dict[str, Stored], log: Path
) -> Kill:
    """`settle --upstream` as a user runs it next to a live server: it settles every inactive
    session in turn, one transaction each."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            _settle_command(server.database, server.url),
            cwd=REPO_ROOT,
            env=_environment(),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        return _kill_mid_pass(process.pid, process.kill, server.database, targets, before)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=PASS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=PROCESS_TIMEOUT_S)


def _final_pass(server: OpencodeServer, crashed: Crashed, sessions: list[Observed], log: Path) -> None:
    """A proxy nobody kills fetches every session; wait until none is left old (bounded: the
    tests then say which was not settled)."""
    proxy = ProxyProcess(
        server.url, log, ("--write-back", "db", "--db", str(server.database), "--grace", "0")
    )
    try:
        proxy.start()
        for stale in sessions:
            assert _fetch(proxy.url, stale.turn).status == 200

        def none_old() -> bool | None:
            after = _stored(server.database, sessions)
            states = [_state(s, crashed.before[s.session_id], after[s.session_id]) for s in sessions]
            return None if "old" in states else True

        with contextlib.suppress(WaitTimeout):
            poll(none_old, what="the final pass", timeout=PASS_TIMEOUT_S, interval=0.1)
    finally:
        proxy.stop()


# --- 1. SIGKILL mid-pass ------------------------------------------------------------------------


def _report(killed: Killed) -> str:
    return "; ".join(
        f"{r.writer}: {r.targets} open, {'killed in a transaction' if r.kill.landed else 'not caught'} "
        f"with {r.kill.committed} committed, {r.kill.samples} crash points checked"
        for r in killed.rounds
    )


def test_kills_landed_inside_a_transaction_mid_pass(killed: Killed) -> None:
    """The premise: each writer was SIGKILLed inside a write transaction with part of its pass
    committed and part still to do (else the checks below would prove nothing)."""
    for writer in ("proxy", "settle"):
        landed = [r for r in killed.rounds if r.writer == writer and r.kill.landed]
        assert len(landed) >= MIN_LANDED_PER_WRITER, f"{writer}: {_report(killed)}"
        for round_ in landed:
            assert 1 <= round_.kill.committed < round_.targets, _report(killed)


def test_integrity_after_every_kill(killed: Killed) -> None:
    assert [r.integrity for r in killed.rounds] == ["ok"] * len(killed.rounds)
    assert killed.final_integrity == "ok"


def test_every_session_old_or_fully_settled_after_every_kill(killed: Killed) -> None:
    """Never half-written: the rows exactly as the crash left them, or settled together with
    their events, never a settled row without its event or an event without its row; after
    each SIGKILL, and at every frozen sample before it (each one a crash point)."""
    for number, round_ in enumerate(killed.rounds):
        torn = {sid: state for sid, state in round_.states.items() if state not in ("old", "settled")}
        assert torn == {}, f"round {number} ({round_.writer}) after the kill"
        assert round_.kill.torn_while_frozen == {}, f"round {number} ({round_.writer}) while frozen"


def test_the_transaction_open_at_the_kill_left_nothing(killed: Killed) -> None:
    """Storage after the SIGKILL is exactly what was committed while the writer was frozen
    inside its transaction: the open transaction was rolled back, nothing else moved."""
    for round_ in killed.rounds:
        if round_.kill.landed:
            assert round_.after_kill == round_.kill.at_kill, _report(killed)


def test_event_logs_stay_contiguous_after_every_kill(killed: Killed) -> None:
    """Every session's seqs run 0..n without a gap and `event_sequence` names the last."""
    for round_ in killed.rounds:
        assert round_.log_problems == []
    assert killed.final_log_problems == []


def test_a_later_run_settles_the_rest_exactly_once(crashed: Crashed, killed: Killed) -> None:
    """After the kills an uninterrupted pass settles what is left, each part, message and call
    once in all (killed passes included), and `settle` then finds nothing to do."""
    assert set(killed.final_states.values()) == {"settled"}, killed.final_states
    for stale in crashed.sessions(KILL):
        expected = {"part": 1, "message": 1} if stale.runtime == "v1" else {"call": 1}
        assert killed.final_counts[stale.session_id] == expected, stale.session_id
    code, output = killed.last_settle
    assert code == 0, output
    assert "nothing to do" in output


# --- 2. two proxies on one server ---------------------------------------------------------------


def test_two_db_proxies_write_each_part_once(pairs: Pairs) -> None:
    """Both on one database, both fetching at once: one `message.part.updated.1` and one
    `message.updated.1` per v1 part and message, one `tool.failed` per v2 call."""
    assert len(pairs.db) == 2 * PAIR_DB
    assert any(trial.racing == 2 for trial in pairs.db), "premise: the two proxies never raced"
    for trial in pairs.db:
        expected = {"part": 1, "message": 1} if trial.key[1] == "v1" else {"call": 1}
        assert trial.counts == expected, trial
        assert trial.state == "settled", trial


def test_two_api_proxies_append_each_v2_failure_once(pairs: Pairs) -> None:
    """The seq check of `/sync/replay` lets one append through; the other writer's re-read
    finds the call failed."""
    assert any(trial.racing == 2 for trial in pairs.api_v2), "premise: the two proxies never raced"
    assert [trial.counts for trial in pairs.api_v2] == [{"call": 1}] * PAIR_API_V2
    assert {trial.state for trial in pairs.api_v2} == {"settled"}


def test_two_api_proxies_write_each_v1_part_once(pairs: Pairs) -> None:
    """One PATCH per part in every trial (15 of 20 were doubled before `SessionLocks`). The
    API cannot close a v1 message: no `message.updated.1`."""
    assert len(pairs.api_v1) == API_V1_TRIALS
    raced = sum(trial.racing == 2 for trial in pairs.api_v1)
    assert raced >= API_V1_TRIALS // 2, f"premise: the two proxies raced in {raced} trials only"
    assert [trial.counts for trial in pairs.api_v1] == [{"part": 1, "message": 0}] * API_V1_TRIALS
    assert {trial.state for trial in pairs.api_v1} == {"settled part"}


def test_v1_patch_race_premise_and_lock(pairs: Pairs) -> None:
    """Premise: two writers that both read the part before either PATCHes both PATCH, and the
    server stores both (no precondition on PATCH). With a lock directory in common, the second
    re-reads after the first has written and PATCHes nothing."""
    assert pairs.race_separate_locks == ForcedRace(patches=2, written=[1, 1], part_events=2)
    assert pairs.race_shared_lock.patches == 1
    assert sorted(pairs.race_shared_lock.written) == [0, 1]
    assert pairs.race_shared_lock.part_events == 1


def test_pairs_keep_the_database_whole(pairs: Pairs) -> None:
    assert pairs.integrity == "ok"
    assert pairs.log_problems == []
