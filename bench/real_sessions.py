"""The sessions the real-server benchmark reads: seeded through real turns, crashed, and checked.

Each runtime gets a clean session (every tool completed) and a stale one (the same history, then
a tool left `running` by a SIGKILL of opencode and a restart). The turns, the crash and the
restart go through the integration tests' harness (`tests/integration`), which is what the tests
prove against opencode 1.18.33; only the seeding loop and the settled-vs-running check are here.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from proxy.demo.model import MockModel, Plan
from tests.integration.http_client import Reply, request
from tests.integration.opencode_server import OpencodeServer
from tests.integration.polling import poll
from tests.integration.turns import (
    RUNTIMES,
    Runtime,
    Turn,
    is_active,
    send_prompt,
    start_turn,
    tools_of,
    wait_tool_running,
    wait_turn_done,
)

V2_PAGE = "?limit=200"
"""v2 pages its list (200 messages at most, measured: `limit` above 200 is a 400), so the
benchmark asks for the largest page; the seeded sessions stay under 200 messages."""
COMMANDS: dict[Runtime, str] = {"v1": "seq 1 1000", "v2": "seq 1 1900"}
"""Each seeded turn's bash call. v1 keeps a tool's output twice (`state.output` and
`metadata.output`), v2 once, so v2 prints about twice as much to grow by as much per turn."""
MESSAGES_PER_TURN = 3
"""A seeded turn adds a user message, the assistant's tool call and its text answer."""
MAX_TURNS = 60
"""Stops a seeding that does not grow (3 x 60 messages still fits one v2 page)."""
SETTLED_HEADER = "x-settle-settled"
SETTLED_STATUS = "error"
"""What both runtimes' interrupted tool shows, and so what the proxy settles a stale one to."""
_TURN_TIMEOUT_S = 120.0


class NotMeasurable(AssertionError):
    """A scenario does not hold what it claims (a stale tool not settled, a clean list rewritten)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """One message list to fetch; `stale_tool` is the id of the tool the crash left running."""

    name: str
    runtime: Runtime
    path: str
    stale_tool: str | None = None


def list_path(turn: Turn) -> str:
    return turn.messages_path + (V2_PAGE if turn.runtime == "v2" else "")


def get(url: str) -> Reply:
    reply = request("GET", url, timeout=30.0)
    if reply.status != 200:
        raise NotMeasurable(f"GET {url} -> {reply.status}: {reply.body[:300]!r}")
    return reply


def seed(server: OpencodeServer, model: MockModel, list_bytes: int) -> list[Scenario]:
    """Seed a clean and a stale session per runtime, all four at once, then crash the server.

    Returns the scenarios, v1's clean and stale first. Each session takes turns until its list holds
    `list_bytes`; the stale ones then start a turn whose tool sleeps, and the SIGKILL catches
    it running. `restart` is left to the caller (it decides the restarted server's CPUs).
    """
    labels = [(runtime, kind) for runtime in RUNTIMES for kind in ("clean", "stale")]
    for runtime, kind in labels:
        model.plan(_prompt(runtime, kind), Plan(command=COMMANDS[runtime], each_prompt=True))
    with ThreadPoolExecutor(len(labels)) as pool:
        turns = dict(
            zip(
                labels,
                pool.map(lambda label: _grow(server, label[0], label[1], list_bytes), labels),
                strict=True,
            )
        )
    stale = {runtime: turn for (runtime, kind), turn in turns.items() if kind == "stale"}
    for runtime, turn in stale.items():
        model.plan(_prompt(runtime, "final"), Plan(each_prompt=True))
        send_prompt(server.url, turn, _prompt(runtime, "final"))
    running = {
        runtime: str(wait_tool_running(server.url, turn, timeout=_TURN_TIMEOUT_S).tool["id"])
        for runtime, turn in stale.items()
    }
    scenarios = [
        Scenario(
            f"{runtime}-list-{kind}",
            runtime,
            list_path(turn),
            running.get(runtime) if kind == "stale" else None,
        )
        for (runtime, kind), turn in turns.items()
    ]
    server.crash()
    return scenarios


def _prompt(runtime: Runtime, kind: str) -> str:
    return f"bench {runtime} {kind}"


def _grow(server: OpencodeServer, runtime: Runtime, kind: str, list_bytes: int) -> Turn:
    """One session, prompted turn after turn until its list holds `list_bytes`."""
    turn = start_turn(runtime, server.url, server.project, _prompt(runtime, kind))
    for done in range(1, MAX_TURNS + 1):
        _wait_turns(server.url, turn, done)
        size = len(get(server.url + list_path(turn)).body)
        if size >= list_bytes:
            print(f"seeded {runtime} {kind}: {done} turns, {size // 1000} KB", file=sys.stderr, flush=True)
            return turn
        send_prompt(server.url, turn, f"more {done}")
    raise NotMeasurable(f"{runtime} {kind} session under {list_bytes} bytes after {MAX_TURNS} turns")


def _wait_turns(base_url: str, turn: Turn, count: int) -> None:
    """Wait until `count` turns are answered: first their messages, so that a prompt just sent
    is not mistaken for done while the previous answer is still the newest message."""

    def has_messages() -> bool | None:
        body = get(base_url + list_path(turn)).json()
        messages = body if turn.runtime == "v1" else body["data"]
        return True if len(messages) >= MESSAGES_PER_TURN * count else None

    poll(has_messages, what=f"{count} turns in {turn.session_id}", timeout=_TURN_TIMEOUT_S, interval=0.25)
    wait_turn_done(base_url, turn, timeout=_TURN_TIMEOUT_S)
    if is_active(base_url, turn):
        raise NotMeasurable(f"{turn.session_id} still active after its answer")


def check(scenario: Scenario, direct: Reply, proxied: Reply) -> str:
    """Fail unless the pair shows what the scenario measures; return a note for the report.

    Stale: opencode itself shows the tool running and the proxy shows it settled, so the
    proxy's figures include the rewrite. Clean: the proxy passes the list on unchanged.
    """
    if scenario.stale_tool is None:
        if direct.json() != proxied.json() or proxied.headers.get(SETTLED_HEADER):
            raise NotMeasurable(f"{scenario.name}: the proxy changed a clean list")
        return "unchanged"
    status = _tool_status(direct.json(), scenario, "direct")
    if status != "running":
        raise NotMeasurable(f"{scenario.name}: the tool is {status!r} in opencode's own list, not running")
    status = _tool_status(proxied.json(), scenario, "proxy")
    if status != SETTLED_STATUS or int(proxied.headers.get(SETTLED_HEADER, "0")) < 1:
        raise NotMeasurable(f"{scenario.name}: the proxy left the tool {status!r}, not settled")
    return "settled by the proxy"


def _tool_status(body: Any, scenario: Scenario, where: str) -> str:
    messages: list[dict[str, Any]] = body if scenario.runtime == "v1" else body["data"]
    statuses = [
        str(tool["state"]["status"])
        for message in messages
        for tool in tools_of(message, scenario.runtime)[1]
        if tool["id"] == scenario.stale_tool
    ]
    if len(statuses) != 1:
        raise NotMeasurable(f"{scenario.name}: tool {scenario.stale_tool} appears {len(statuses)}x ({where})")
    return statuses[0]
