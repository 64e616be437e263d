"""The race harness: lanes that run turns back to back, and fetchers that read the lanes'
current sessions through a proxy (and now and then directly), recording every false settle
(the why: the docstring of tests/integration/test_races.py)."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.demo.model import MockModel, Plan

from .http_client import request
from .opencode_server import directory_header
from .polling import poll
from .turns import Runtime, Turn, read_messages, start_turn

RACE_S = 40.0
"""How long the race of `test_races` runs (the shared-database one runs half as long)."""
COMMANDS = ("echo hi", "sleep 0.3; echo hi")
"""Short tools, some just long enough that fetches catch them running as well as finishing."""
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

    def run(self, workers: Sequence[Callable[[], None]], seconds: float) -> bool:
        """Run each worker (lanes, fetchers) in a thread of its own for `seconds`, then stop and
        join them all; whether every one stopped."""
        threads = [threading.Thread(target=worker, daemon=True) for worker in workers]
        for thread in threads:
            thread.start()
        try:
            self.stop.wait(seconds)
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(TURN_TIMEOUT_S)
        return not any(thread.is_alive() for thread in threads)


def _items(message: dict[str, Any], runtime: Runtime) -> list[dict[str, Any]]:
    items = message.get("parts", []) if runtime == "v1" else message.get("content", [])
    return [item for item in items if item.get("type") == "tool" and isinstance(item.get("state"), dict)]


def _messages(body: Any, runtime: Runtime) -> list[dict[str, Any]]:
    payload = body if runtime == "v1" else body.get("data")
    return [payload] if isinstance(payload, dict) else list(payload or [])


def tools_of(body: Any, runtime: Runtime) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for message in _messages(body, runtime):
        for tool in _items(message, runtime):
            yield message, tool


def interrupted(tool: dict[str, Any]) -> bool:
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
    for message, tool in tools_of(reply.json(), turn.runtime):
        with_tools.append(_message_id(message, turn.runtime))
        if tool["state"].get("status") in OPEN[turn.runtime]:
            race.count("proxy fetches showing a live tool")
        if interrupted(tool):
            race.failed(
                race.false_settles, f"{path}: tool {tool.get('id')} shown interrupted: {tool['state']}"
            )
    return with_tools


def _check_direct(race: Race, opencode_url: str, turn: Turn) -> None:
    race.count("direct fetches")
    for _, tool in tools_of(messages_body(opencode_url, turn), turn.runtime):
        if interrupted(tool):
            race.failed(race.false_settles, f"{turn.session_id}: the server itself stores {tool['state']}")


def messages_body(base_url: str, turn: Turn) -> Any:
    messages = read_messages(base_url, turn)
    return messages if turn.runtime == "v1" else {"data": messages}


def fetcher(race: Race, urls: Urls) -> None:
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
    """True once the session is idle and its tool completed normally (the premise of the race).
    Idle is asked first: messages read before it can still show the tool running a moment before
    the turn ended."""
    if _active(opencode_url, turn):
        return None
    tools = [tool for _, tool in tools_of(messages_body(opencode_url, turn), turn.runtime)]
    if not tools:
        return None
    statuses = [tool["state"]["status"] for tool in tools]
    if statuses != ["completed"]:
        raise AssertionError(f"{turn.runtime} turn {turn.session_id} ended with tool statuses {statuses}")
    return True


def lane(race: Race, urls: Urls, mock_model: MockModel, runtime: Runtime, directory: Path) -> None:
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
