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

Live settle: stale v1 sessions are confirmed by live settle when the proxy's stream comes back
after the crash, and a new turn starts in each at another moment around that confirmation (its
re-read of the message and its reading); a client stream through the proxy must never show a
session idle while its new turn runs, nor a new turn's tool interrupted, and nothing of a new turn
may be written.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel, Plan

from .event_tap import EventTap
from .live_races import (
    DECISIONS,
    LIVE_GRACE_S,
    NEW_TURN_AT,
    decided,
    false_idles,
    false_settles,
    following_more_than,
    prompt_at,
    restart_and_time_the_return,
    stale_v1_sessions,
)
from .opencode_server import OpencodeServer
from .polling import poll
from .proxy_process import ProxyProcess, running, wait_all_decided, write_back_proxies
from .races import (
    RACE_S,
    TURN_TIMEOUT_S,
    Race,
    Urls,
    fetcher,
    interrupted,
    lane,
    messages_body,
    tools_of,
)
from .turns import (
    RUNTIMES,
    Observed,
    Runtime,
    Turn,
    fetch_settled,
    send_prompt,
    start_turn,
    wait_tool_running,
    wait_turn_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FETCHERS = 4


def test_no_live_part_is_ever_shown_settled(
    opencode: OpencodeServer, mock_model: MockModel, other_project: Path, proxy_url: str
) -> None:
    race, urls = Race(), Urls(opencode.url, proxy_url)
    lanes = [
        functools.partial(lane, race, urls, mock_model, runtime, directory)
        for runtime in RUNTIMES
        for directory in (opencode.project, other_project)
    ]
    fetchers = [functools.partial(fetcher, race, urls)] * FETCHERS
    assert race.run(lanes + fetchers, RACE_S), "a lane or fetcher did not stop"
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
        for _, tool in tools_of(messages_body(opencode_url, pending.stale.turn), pending.stale.runtime)
        if tool["id"] != pending.stale.tool_id
    ]


def test_turns_started_while_a_write_back_is_pending_are_never_written(
    opencode: OpencodeServer, mock_model: MockModel, tmp_path: Path
) -> None:
    """A proxy settles a stale session in a view and schedules its write; a new turn starts in the
    session just before, around or after the write's reading. The new turn's tool must never be
    written (nor shown) as failed, whichever mode writes, and it must finish normally."""
    stale = _stale_sessions(opencode, mock_model)
    proxies = write_back_proxies(opencode.url, opencode.database, tmp_path, WRITE_BACK_GRACE_S)
    pendings = [
        Pending(mode, observed, WRITE_BACK_GRACE_S * (0.5 + 0.1 * number), f"again {observed.session_id}")
        for number, (mode, observed) in enumerate(
            (mode, observed) for (mode, _), group in stale.items() for observed in group
        )
    ]
    for pending in pendings:
        mock_model.plan(pending.prompt, Plan(command=NEW_TURN_COMMAND, each_prompt=True))
    with running(proxies.values()):
        for pending in pendings:
            _fetch_then_prompt(proxies[pending.mode].url, opencode.url, pending)
            wait_turn_done(opencode.url, pending.stale.turn, timeout=TURN_TIMEOUT_S)
        for proxy in proxies.values():  # every pending write-back decided (and logged)
            wait_all_decided(proxy.url, within=WRITE_BACK_GRACE_S + 30)
        logs = {mode: proxy.log() for mode, proxy in proxies.items()}
    new_tools = {pending.stale.session_id: _tools_after(opencode.url, pending) for pending in pendings}
    print(f"\npending write-backs: {len(pendings)} sessions, new tools {sum(map(len, new_tools.values()))}")
    assert all(new_tools.values()), "a new turn ran no tool: no race happened"
    false_writes = [
        f"{session}: {tool['id']} {tool['state']}"
        for session, tools in new_tools.items()
        for tool in tools
        if tool["state"]["status"] != "completed" or interrupted(tool)
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
    """Fetch the stale view through the proxy until it settles and schedules the write (a fetch
    within the freshness margin of the crash is left open, and decided afresh on the next), then
    prompt."""
    fetch_settled(proxy_url + pending.stale.turn.messages_path)
    time.sleep(pending.delay_s)
    send_prompt(opencode_url, pending.stale.turn, pending.prompt)


# --- Turns that start while live settle confirms ------------------------------------------------


def test_turns_started_while_live_settle_confirms_are_never_announced_idle(
    opencode: OpencodeServer, mock_model: MockModel, tmp_path: Path
) -> None:
    """Stale v1 sessions, confirmed by live settle once the proxy's stream is back after a crash;
    a new turn starts in each at another moment around its confirmation. No client may be told a
    session is idle while its new turn runs, and no tool of a new turn may be shown or written
    failed; the new turns really straddle the confirmations (some before, some after)."""
    flags = ("--grace", str(LIVE_GRACE_S), "--write-back", "api")
    proxy = ProxyProcess(opencode.url, tmp_path / "live.log", flags)
    news = {n: f"confirming new turn #{n}" for n in range(len(NEW_TURN_AT))}
    for prompt in news.values():
        mock_model.plan(prompt, Plan(command="echo again && sleep 0.5", each_prompt=True))
    failures: list[str] = []
    with running([proxy]):
        poll(following_more_than(proxy, 0), what="the proxy following", timeout=30)
        stale = stale_v1_sessions(opencode, mock_model, proxy.url)
        followed, warm = restart_and_time_the_return(opencode, proxy)
        confirming = followed + LIVE_GRACE_S
        earliest = min(at for at in NEW_TURN_AT if at is not None)
        assert warm < confirming + earliest - 0.2, f"restart took {warm - followed:.1f}s"
        with EventTap(f"{proxy.url}/global/event") as tap:
            threads = [
                prompt_at(
                    None if at is None else confirming + at,
                    proxy,
                    opencode.url,
                    stale[n].turn,
                    news[n],
                    failures=failures,
                )
                for n, at in enumerate(NEW_TURN_AT)
            ]
            for thread in threads:
                thread.join(90)
            for o in stale.values():
                wait_turn_done(opencode.url, o.turn, timeout=TURN_TIMEOUT_S)
            sessions = [o.session_id for o in stale.values()]
            poll(functools.partial(decided, proxy, sessions), what="the proxy's decisions", timeout=30)
            heard = tap.payloads()
        log = proxy.log()
    decisions = {what: sum(marker in line for line in log.splitlines()) for what, marker in DECISIONS.items()}
    print(
        f"\nlive settle race: {len(stale)} sessions, warm {warm - followed:.1f}s after the proxy followed, {decisions}"
    )
    assert failures == [], failures
    false_idle = [f for o in stale.values() for f in false_idles(heard, o.session_id, o.tool_id)]
    assert false_idle == [], false_idle[:5]
    settles = false_settles(opencode, stale, heard, log)
    assert settles == [], settles[:5]
    assert decisions["withdrawn"] + decisions["active"] > 0, (
        "no new turn started while its session was confirmed"
    )
    assert decisions["announced"] > 0, "no settlement was announced: the race proves nothing about it"
