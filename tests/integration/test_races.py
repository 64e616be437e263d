"""Never a false settle: live turns on the real server, raced by clients fetching through the proxy.

Four lanes (v1 and v2, each in two project directories) run turns back to back, each a fresh
session whose bash tool runs `echo hi` (or sleeps 0.3 s first) and finishes normally. Meanwhile fetchers read every
lane's current session through the proxy in a tight loop (list and single-message routes),
and now and then directly. Every tool here completes normally, so a single proxy response
showing one as settled (the `X-Settle-Settled` header, or a tool in the interrupted shape) is
a false settle; so is the interrupted shape in the server's own view. The test also demands
that fetches really caught tools open, or the race would prove nothing.

Write-back: stale sessions (left by a crash) are settled in a view by `--write-back api` and
`db` proxies, and a new turn starts in each at another moment around the write's reading; no
tool of a new turn may be written (or shown) failed.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .http_client import request
from .mock_model import MockModel, Plan
from .opencode_server import OpencodeServer, directory_header
from .polling import poll
from .proxy_process import ProxyProcess
from .turns import (
    RUNTIMES,
    Observed,
    Runtime,
    Turn,
    read_messages,
    send_prompt,
    start_turn,
    wait_tool_running,
    wait_turn_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RACE_S = 40.0
COMMANDS = ("echo hi", "sleep 0.3; echo hi")
"""Short tools, some just long enough that fetches catch them running as well as finishing."""
FETCHERS = 4
DIRECT_EVERY = 10
"""One fetch in this many also reads the server directly."""
TURN_TIMEOUT_S = 30.0
LANE_POLL_S = 0.25
"""How often a lane asks the server whether its turn is over: the fetchers need the server more."""
SETTLED_HEADER = "x-settle-settled"
OPEN = {"v1": ("pending", "running"), "v2": ("streaming", "running")}
INTERRUPTED = ("Tool execution aborted", "Tool execution interrupted")


@dataclass(frozen=True)
class Urls:
    opencode: str
    proxy: str


@dataclass
class Race:
    """Shared by the lane and fetcher threads; every update holds `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    current: dict[str, Turn] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    false_settles: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def failed(self, into: list[str], what: str) -> None:
        with self.lock:
            into.append(what)


def _items(message: dict[str, Any], runtime: Runtime) -> list[dict[str, Any]]:
    items = message.get("parts", []) if runtime == "v1" else message.get("content", [])
    return [item for item in items if item.get("type") == "tool" and isinstance(item.get("state"), dict)]


def _messages(body: Any, runtime: Runtime) -> list[dict[str, Any]]:
    payload = body if runtime == "v1" else body.get("data")
    return [payload] if isinstance(payload, dict) else list(payload or [])


def _tools(body: Any, runtime: Runtime) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for message in _messages(body, runtime):
        for tool in _items(message, runtime):
            yield message, tool


def _interrupted(tool: dict[str, Any]) -> bool:
    """The shape the proxy (or opencode's own interrupt) gives a tool that did not finish."""
    state = tool["state"]
    error = state.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return state.get("status") == "error" and (
        message in INTERRUPTED or bool(state.get("metadata", {}).get("interrupted"))
    )


def _message_id(message: dict[str, Any], runtime: Runtime) -> str:
    return str(message["info"]["id"] if runtime == "v1" else message["id"])


def _check_proxied(race: Race, proxy_url: str, turn: Turn, path: str) -> list[str]:
    """Fetch `path` through the proxy; record false settles; return the ids of messages with a tool."""
    reply = request("GET", proxy_url + path)
    race.count("proxy fetches")
    if reply.status != 200:
        race.failed(race.errors, f"GET {path} through the proxy -> {reply.status}: {reply.body[:200]!r}")
        return []
    if SETTLED_HEADER in reply.headers:
        race.failed(race.false_settles, f"{path}: {SETTLED_HEADER}: {reply.headers[SETTLED_HEADER]}")
    with_tools = []
    for message, tool in _tools(reply.json(), turn.runtime):
        with_tools.append(_message_id(message, turn.runtime))
        if tool["state"].get("status") in OPEN[turn.runtime]:
            race.count("proxy fetches showing a live tool")
        if _interrupted(tool):
            race.failed(
                race.false_settles, f"{path}: tool {tool.get('id')} shown interrupted: {tool['state']}"
            )
    return with_tools


def _check_direct(race: Race, opencode_url: str, turn: Turn) -> None:
    race.count("direct fetches")
    for _, tool in _tools(_messages_body(opencode_url, turn), turn.runtime):
        if _interrupted(tool):
            race.failed(race.false_settles, f"{turn.session_id}: the server itself stores {tool['state']}")


def _messages_body(base_url: str, turn: Turn) -> Any:
    messages = read_messages(base_url, turn)
    return messages if turn.runtime == "v1" else {"data": messages}


def _fetcher(race: Race, urls: Urls) -> None:
    for round_number in itertools.count():
        if race.stop.is_set():
            return
        with race.lock:
            turns = list(race.current.values())
        for turn in turns:
            try:
                for message_id in _check_proxied(race, urls.proxy, turn, turn.messages_path):
                    _check_proxied(race, urls.proxy, turn, turn.message_path(message_id))
                if round_number % DIRECT_EVERY == 0:
                    _check_direct(race, urls.opencode, turn)
            except Exception as error:  # a failed fetch is recorded, and the race goes on
                race.failed(race.errors, f"fetching {turn.session_id}: {type(error).__name__}: {error}")
        time.sleep(0)


def _active(opencode_url: str, turn: Turn) -> bool:
    if turn.runtime == "v1":
        status = request("GET", f"{opencode_url}/session/status", headers=directory_header(turn.directory))
        entry = status.json().get(turn.session_id)
        return entry is not None and entry.get("type") != "idle"
    return turn.session_id in request("GET", f"{opencode_url}/api/session/active").json()["data"]


def _finished(opencode_url: str, turn: Turn) -> bool | None:
    """True once the session is idle and its tool completed normally (the premise of the race)."""
    tools = [tool for _, tool in _tools(_messages_body(opencode_url, turn), turn.runtime)]
    if _active(opencode_url, turn) or not tools:
        return None
    statuses = [tool["state"]["status"] for tool in tools]
    if statuses != ["completed"]:
        raise AssertionError(f"{turn.runtime} turn {turn.session_id} ended with tool statuses {statuses}")
    return True


def _lane(race: Race, urls: Urls, mock_model: MockModel, runtime: Runtime, directory: Path) -> None:
    lane = f"{runtime} in {directory.name}"
    for number in itertools.count():
        if race.stop.is_set():
            return
        prompt = f"race {lane} #{number}"
        mock_model.plan(prompt, Plan(command=COMMANDS[number % len(COMMANDS)]))
        try:
            turn = start_turn(runtime, urls.proxy, directory, prompt)
            with race.lock:
                race.current[lane] = turn
                race.turns.append(turn)
            poll(
                functools.partial(_finished, urls.opencode, turn),
                what=f"{prompt} to finish",
                timeout=TURN_TIMEOUT_S,
                interval=LANE_POLL_S,
            )
            race.count(f"turns {runtime}")
        except Exception as error:
            race.failed(race.errors, f"{prompt}: {type(error).__name__}: {error}")
            return


def _threads(targets: list[Callable[[], None]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    return threads


def test_no_live_part_is_ever_shown_settled(
    opencode: OpencodeServer, mock_model: MockModel, other_project: Path, proxy_url: str
) -> None:
    race, urls = Race(), Urls(opencode.url, proxy_url)
    lanes = [
        lambda runtime=runtime, directory=directory: _lane(race, urls, mock_model, runtime, directory)
        for runtime in RUNTIMES
        for directory in (opencode.project, other_project)
    ]
    fetchers = [lambda: _fetcher(race, urls)] * FETCHERS
    threads = _threads(lanes + fetchers)
    try:
        race.stop.wait(RACE_S)
    finally:
        race.stop.set()
        for thread in threads:
            thread.join(TURN_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "a lane or fetcher did not stop"
    print(f"\nrace: {dict(race.counts)}, turns started {len(race.turns)}")
    assert race.errors == [], race.errors[:5]
    assert race.false_settles == [], race.false_settles[:5]
    assert race.counts["proxy fetches showing a live tool"] > 0, (
        "no fetch caught a tool running: no race happened"
    )
    assert race.counts["turns v1"] > 0
    assert race.counts["turns v2"] > 0


# --- Turns that start while a write-back is pending ----------------------------------------------

WRITE_BACK_GRACE_S = 1.0
PENDING_SESSIONS = 2
"""Per write-back mode and runtime. One at a time (a 2-core host answers late under more), each
gets its new turn at another moment around the write's reading."""
NEW_TURN_COMMAND = "echo again && sleep 1"


@dataclass(frozen=True)
class Pending:
    """A stale session whose settlement a proxy will write back, and the turn started meanwhile."""

    mode: str
    stale: Observed
    delay_s: float
    prompt: str


def _stale_sessions(
    opencode: OpencodeServer, mock_model: MockModel
) -> dict[tuple[str, Runtime], list[Observed]]:
    """Sessions whose tool a crash left open, per write-back mode and runtime."""
    turns: dict[tuple[str, Runtime], list[Turn]] = {}
    for mode in ("api", "db"):
        for runtime in RUNTIMES:
            for number in range(PENDING_SESSIONS):
                prompt = f"pending {mode} {runtime} #{number}"
                mock_model.plan(prompt, Plan(command="echo hello && sleep 600"))
                turns.setdefault((mode, runtime), []).append(
                    start_turn(runtime, opencode.url, opencode.project, prompt)
                )
    stale = {
        key: [Observed(turn, wait_tool_running(opencode.url, turn)) for turn in group]
        for key, group in turns.items()
    }
    opencode.crash()
    opencode.restart()
    return stale


def _tools_after(opencode_url: str, pending: Pending) -> list[dict[str, Any]]:
    """The tools of the session other than the one the crash left open."""
    return [
        tool
        for _, tool in _tools(_messages_body(opencode_url, pending.stale.turn), pending.stale.runtime)
        if tool["id"] != pending.stale.tool_id
    ]


def test_turns_started_while_a_write_back_is_pending_are_never_written(
    opencode: OpencodeServer, mock_model: MockModel, tmp_path: Path
) -> None:
    """A proxy settles a stale session in a view and schedules its write; a new turn starts in the
    session just before, around or after the write's reading. The new turn's tool must never be
    written (nor shown) as failed, whichever mode writes, and it must finish normally."""
    stale = _stale_sessions(opencode, mock_model)
    grace = ("--grace", str(WRITE_BACK_GRACE_S))
    proxies = {
        "api": ProxyProcess(opencode.url, tmp_path / "api.log", ("--write-back", "api", *grace)),
        "db": ProxyProcess(
            opencode.url, tmp_path / "db.log", ("--write-back", "db", "--db", str(opencode.database), *grace)
        ),
    }
    pendings = [
        Pending(mode, observed, WRITE_BACK_GRACE_S * (0.5 + 0.1 * number), f"again {observed.session_id}")
        for number, (mode, observed) in enumerate(
            (mode, observed) for (mode, _), group in stale.items() for observed in group
        )
    ]
    for pending in pendings:
        mock_model.plan(pending.prompt, Plan(command=NEW_TURN_COMMAND, each_prompt=True))
    try:
        for proxy in proxies.values():
            proxy.start()
        for pending in pendings:
            _fetch_then_prompt(proxies[pending.mode].url, opencode.url, pending)
            wait_turn_done(opencode.url, pending.stale.turn, timeout=TURN_TIMEOUT_S)
        time.sleep(WRITE_BACK_GRACE_S + 1.0)
        logs = {mode: proxy.log() for mode, proxy in proxies.items()}
    finally:
        for proxy in proxies.values():
            proxy.stop()
    new_tools = {pending.stale.session_id: _tools_after(opencode.url, pending) for pending in pendings}
    print(f"\npending write-backs: {len(pendings)} sessions, new tools {sum(map(len, new_tools.values()))}")
    assert all(new_tools.values()), "a new turn ran no tool: no race happened"
    false_writes = [
        f"{session}: {tool['id']} {tool['state']}"
        for session, tools in new_tools.items()
        for tool in tools
        if tool["state"]["status"] != "completed" or _interrupted(tool)
    ]
    written_ids = {tool["id"] for tools in new_tools.values() for tool in tools}
    false_writes += [
        line
        for log in logs.values()
        for line in log.splitlines()
        if "wrote back" in line and any(f"part={i}" in line for i in written_ids)
    ]
    assert false_writes == [], false_writes[:5]


def _fetch_then_prompt(proxy_url: str, opencode_url: str, pending: Pending) -> None:
    """Fetch the stale view through the proxy (it settles and schedules the write), then prompt."""
    reply = request("GET", proxy_url + pending.stale.turn.messages_path)
    assert reply.status == 200
    assert SETTLED_HEADER in reply.headers, f"{pending.stale.session_id}: the stale view was not settled"
    time.sleep(pending.delay_s)
    send_prompt(opencode_url, pending.stale.turn, pending.prompt)
