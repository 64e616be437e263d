"""Two real servers on one `opencode.db`: the proxy in front of one never settles what runs in the other.

Liveness is per process (measured on 1.18.33): a tool running in server B is absent from server
A's `/session/status` and `/api/session/active`, while A shows it `running` from the shared
database. Timeline:

1. A runs a v1 and a v2 tool per write-back mode, and is SIGKILLed with its tools: orphans.
2. A restarts; B starts on A's data dir (same database, its own port) and runs a v1 and a v2 tool.
3. Proxies in front of A (`--write-back api`, `--write-back db`) serve views of both; then
   `settle-proxy settle --upstream A` runs on the database while both servers and proxies run.

B's tools must be shown running and written nowhere, B must still run them; the orphans, last
alive before B existed, must still be settled and written. Last, the race of `test_races` runs
its lanes in B while its fetchers read through a `--write-back api` proxy in front of A.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel
from rules import Doubt

from . import opencode_db
from .http_client import get_json, request
from .opencode_server import OpencodeServer, opencode_binary
from .polling import poll
from .proxy_process import ProxyProcess, running, wait_all_decided, write_back_proxies
from .races import RACE_S, Race, Urls, fetcher, lane
from .settle_cli import SettleRun, run_settle
from .turns import (
    RUNTIMES,
    Observed,
    Runtime,
    find_running_tool,
    is_active,
    observe_running,
    payload,
    read_messages,
)

pytestmark = pytest.mark.integration

GRACE_S = 1.0
MODES = ("api", "db")
WRITERS = (*MODES, "offline")
WRITE_TIMEOUT_S = 30.0
Key = tuple[str, Runtime]
Views = dict[Key, list[tuple[dict[str, str], list[dict[str, Any]]]]]


@dataclass(frozen=True)
class Shared:
    """What the timeline left, and what the proxies did with it."""

    first: OpencodeServer
    second: OpencodeServer
    stale: dict[Key, Observed]
    """(mode, runtime): orphaned by the SIGKILL of A, before B existed."""
    live: dict[Runtime, Observed]
    """Running in B all along."""
    proxied: Views
    """(mode, runtime) of a live tool: every view of it through that mode's proxy (headers, messages)."""
    rows_before: opencode_db.Snapshot
    rows_after: opencode_db.Snapshot
    written: dict[Key, list[dict[str, Any]]]
    """The orphans' direct views from A once written back."""
    busy_after: dict[Runtime, bool]
    offline: SettleRun
    """`settle-proxy settle --upstream A` on the shared database."""
    logs: dict[str, str]
    health: dict[str, Any]


@pytest.fixture(scope="module")
def shared(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    root = tmp_path_factory.mktemp("shared-database")
    first = OpencodeServer(opencode_binary(), root, mock_model.base_url)
    second = OpencodeServer(opencode_binary(), root, mock_model.base_url)
    proxies = write_back_proxies(first.url, first.database, root, GRACE_S)
    try:
        stale, live = _orphan_then_share(first, second)
        rows_before = opencode_db.snapshot(first.database)
        with running(proxies.values()):
            proxied = _views_of(proxies, live)
            for (mode, _), observed in stale.items():
                if mode in proxies:
                    read_messages(proxies[mode].url, observed.turn)
            offline = run_settle(first.database, "--upstream", first.url)
            written = _wait_written(first, stale)
            for proxy in proxies.values():  # what the live fetches could have scheduled is decided
                wait_all_decided(proxy.url, within=2 * GRACE_S + 10)
            yield Shared(
                first=first,
                second=second,
                stale=stale,
                live=live,
                proxied=proxied,
                rows_before=rows_before,
                rows_after=opencode_db.snapshot(first.database),
                written=written,
                busy_after={
                    runtime: is_active(second.url, observed.turn) for runtime, observed in live.items()
                },
                offline=offline,
                logs={mode: proxy.log() for mode, proxy in proxies.items()},
                health=get_json(f"{proxies['api'].url}/_settle/health"),
            )
    finally:
        second.stop()
        first.stop()


def _orphan_then_share(
    first: OpencodeServer, second: OpencodeServer
) -> tuple[dict[Key, Observed], dict[Runtime, Observed]]:
    """Steps 1 and 2: A's orphans (per writer and runtime), then B's live tools (per runtime)."""
    first.start()
    stale = _observe(first, [(mode, runtime) for mode in WRITERS for runtime in RUNTIMES])
    first.crash()
    first.restart()
    second.start()
    assert second.database == first.database
    live = _observe(second, [("live", runtime) for runtime in RUNTIMES])
    return stale, {runtime: observed for (_, runtime), observed in live.items()}


def _views_of(proxies: dict[str, ProxyProcess], live: dict[Runtime, Observed]) -> Views:
    """Every live tool through every proxy, a few times over."""
    proxied: Views = {}
    for _ in range(3):
        for mode, proxy in proxies.items():
            for runtime, observed in live.items():
                proxied.setdefault((mode, runtime), []).append(_view(proxy.url, observed))
        time.sleep(0.3)
    return proxied


def _observe(server: OpencodeServer, keys: list[Key]) -> dict[Key, Observed]:
    return observe_running(server.url, server.project, {key: (key[1], f"{key[0]} {key[1]}") for key in keys})


def _view(base_url: str, observed: Observed) -> tuple[dict[str, str], list[dict[str, Any]]]:
    reply = request("GET", f"{base_url}{observed.turn.messages_path}")
    assert reply.status == 200, reply.body[:300]
    return dict(reply.headers.items()), payload(reply.json(), observed.turn.runtime)


def _wait_written(server: OpencodeServer, stale: dict[Key, Observed]) -> dict[Key, list[dict[str, Any]]]:
    def written() -> dict[Key, list[dict[str, Any]]] | None:
        views = {key: read_messages(server.url, observed.turn) for key, observed in stale.items()}
        settled = all(find_running_tool(view, key[1]) is None for key, view in views.items())
        return views if settled else None

    return poll(written, what="the orphans written back", timeout=WRITE_TIMEOUT_S, interval=0.5)


def _tool(messages: list[dict[str, Any]], observed: Observed) -> dict[str, Any]:
    for message in messages:
        items: list[dict[str, Any]] = (
            message["parts"] if observed.turn.runtime == "v1" else message["content"]
        )
        for item in items:
            if item.get("id") == observed.tool_id:
                return item
    raise AssertionError(f"tool {observed.tool_id} not in the view")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_other_servers_live_tools_are_shown_running(shared: Shared, mode: str, runtime: Runtime) -> None:
    observed = shared.live[runtime]
    for headers, messages in shared.proxied[(mode, runtime)]:
        assert "X-Settle-Settled" not in headers
        assert _tool(messages, observed)["state"]["status"] == "running"


@pytest.mark.parametrize("mode", MODES)
def test_the_proxy_says_why_it_left_the_other_servers_tools_open(shared: Shared, mode: str) -> None:
    """One line per message and doubt: too shortly alive before the reading (while the tool had
    just started), or running since after another process on the database started."""
    doubts = {str(Doubt.TOO_RECENT), str(Doubt.ELSEWHERE)}
    for observed in shared.live.values():
        said = [
            line
            for line in shared.logs[mode].splitlines()
            if f"left message {observed.message_id} open: " in line
        ]
        whys = [line.split(" open: ", 1)[1].split(" session=", 1)[0] for line in said]
        assert whys, f"no line says why {observed.message_id} was left open"
        assert set(whys) <= doubts
        assert len(whys) == len(set(whys))


def test_write_back_writes_nothing_into_the_other_servers_sessions(shared: Shared) -> None:
    live_sessions = {observed.session_id for observed in shared.live.values()}
    assert not shared.rows_before.sessions_changed(shared.rows_after) & live_sessions
    for log in shared.logs.values():
        assert not [
            line
            for line in log.splitlines()
            if "wrote back" in line and any(s in line for s in live_sessions)
        ]


def test_the_other_server_still_runs_its_tools(shared: Shared) -> None:
    assert shared.busy_after == {"v1": True, "v2": True}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_tool_orphaned_before_the_other_server_started_is_still_written(
    shared: Shared, mode: str, runtime: Runtime
) -> None:
    observed = shared.stale[(mode, runtime)]
    assert _tool(shared.written[(mode, runtime)], observed)["state"]["status"] == "error"
    assert f"session={observed.session_id}" in shared.logs[mode]


def test_offline_settle_with_upstream_settles_the_orphans_and_leaves_the_other_servers_tools(
    shared: Shared,
) -> None:
    assert shared.offline.code == 10, shared.offline.err
    assert "2 tool call(s) left alone: another process may run them" in shared.offline.out
    for runtime in RUNTIMES:
        observed = shared.stale[("offline", runtime)]
        assert _tool(shared.written[("offline", runtime)], observed)["state"]["status"] == "error"


def test_health_names_the_other_server(shared: Shared) -> None:
    around = shared.health["other_processes"]
    assert around["known"] is True
    assert around["upstream_pids"] == [shared.first.pid]
    assert around["databases"] == [str(Path(shared.first.database).resolve())]
    assert [other["pid"] for other in around["others"]] == [shared.second.pid]


def test_a_race_in_the_other_server_is_never_shown_settled(
    shared: Shared, mock_model: MockModel, tmp_path: Path
) -> None:
    """Every tool here completes normally in B: one settled view, or one tool that B's own view
    shows interrupted (a false write), is a failure."""
    proxy = ProxyProcess(shared.first.url, tmp_path / "race.log", ("--write-back", "api", "--grace", "0.5"))
    race = Race()
    in_b = Urls(shared.second.url, shared.second.url)
    through_a = Urls(shared.second.url, proxy.url)
    lanes = [
        functools.partial(lane, race, in_b, mock_model, runtime, shared.second.project)
        for runtime in RUNTIMES
    ]
    with running([proxy]):
        all_stopped = race.run([*lanes, *[functools.partial(fetcher, race, through_a)] * 3], RACE_S / 2)
    assert all_stopped, "a lane or fetcher did not stop"
    print(f"\nrace in B: {dict(race.counts)}, turns started {len(race.turns)}")
    assert race.errors == [], race.errors[:5]
    assert race.false_settles == [], race.false_settles[:5]
    assert race.counts["proxy fetches showing a live tool"] > 0, "no fetch caught a tool running"
    assert race.counts["turns v1"] > 0
    assert race.counts["turns v2"] > 0
