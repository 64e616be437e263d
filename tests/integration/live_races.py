"""The live-settle race of test_races: stale v1 sessions that live settle confirms after a crash,
new turns started around each confirmation, and what a client stream through the proxy heard."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from proxy.demo.model import MockModel, Plan

from .event_tap import EventTap
from .opencode_server import OpencodeServer
from .polling import poll
from .proxy_process import ProxyProcess
from .races import interrupted, messages_body, tools_of
from .turns import Observed, Runtime, Turn, observe_running, send_prompt

LIVE_GRACE_S = 8.0
"""Long enough for the restarted server to warm up before the first new turn (checked below)."""
NEW_TURN_AT: tuple[float | None, ...] = (-1.0, -0.3, -0.1, 0.0, 0.1, 0.3, 1.0, None, None)
"""When each session's new turn starts, relative to when its confirmation starts re-reading the
message (the proxy's stream back, plus the grace period; under load the confirmations of all
sessions take a second or more), or (None) once the proxy has announced its settlement."""
DECISIONS = {
    "withdrawn": "decision=withdrawn",
    "active": "decision=active",
    "announced": "settled orphaned part",
}


FOLLOWING = "following /global/event"
"""What the proxy logs each time its stream (re)connects."""


def followings(proxy: ProxyProcess) -> int:
    return proxy.log().count(FOLLOWING)


def following_more_than(proxy: ProxyProcess, before: int) -> Callable[[], bool | None]:
    return lambda: True if followings(proxy) > before else None


def restart_and_time_the_return(opencode: OpencodeServer, proxy: ProxyProcess) -> tuple[float, float]:
    """Crash and restart the server; when the proxy followed its stream again (its log says so),
    and when the restarted server was warm (both `time.monotonic()`)."""
    before = followings(proxy)
    opencode.crash()
    restarted: list[float] = []

    def restart() -> None:
        opencode.restart()
        restarted.append(time.monotonic())

    restarter = threading.Thread(target=restart)
    restarter.start()
    poll(following_more_than(proxy, before), what="the proxy following again", timeout=90, interval=0.02)
    followed = time.monotonic()
    restarter.join(120)
    assert restarted, "the server did not restart"
    return followed, restarted[0]


def prompt_at(
    moment: float | None,
    proxy: ProxyProcess,
    opencode_url: str,
    turn: Turn,
    prompt: str,
    *,
    failures: list[str],
) -> threading.Thread:
    """Send `prompt` at `moment` (`time.monotonic()`), or once the proxy logged the session settled."""

    def announced() -> bool | None:
        lines = proxy.log().splitlines()
        return (
            True
            if any(DECISIONS["announced"] in line and turn.session_id in line for line in lines)
            else None
        )

    def prompt_then() -> None:
        try:
            if moment is None:
                poll(announced, what=f"the proxy announcing {turn.session_id}", timeout=60, interval=0.05)
            else:
                time.sleep(max(0.0, moment - time.monotonic()))
            send_prompt(opencode_url, turn, prompt)
        except Exception as error:  # recorded: the race fails on it
            failures.append(f"{prompt}: {type(error).__name__}: {error}")

    thread = threading.Thread(target=prompt_then)
    thread.start()
    return thread


def part_of(tool_id: str) -> Callable[[Any], bool]:
    def about(payload: Any) -> bool:
        event = payload.get("payload") if isinstance(payload, dict) else None
        part = ((event or {}).get("properties") or {}).get("part") or {}
        return bool(part.get("id") == tool_id)

    return about


def decided(proxy: ProxyProcess, sessions: list[str]) -> bool | None:
    """Whether the proxy logged its live-settle decision on every one of `sessions`."""
    lines = [line for line in proxy.log().splitlines() if any(d in line for d in DECISIONS.values())]
    return True if all(any(s in line for line in lines) for s in sessions) else None


def stale_v1_sessions(opencode: OpencodeServer, mock_model: MockModel, proxy_url: str) -> dict[int, Observed]:
    """Sessions whose tool runs (`sleep 600`), once the proxy has relayed each one running."""
    prompts: dict[int, tuple[Runtime, str]] = {
        n: ("v1", f"confirming stale #{n}") for n in range(len(NEW_TURN_AT))
    }
    for _, prompt in prompts.values():
        mock_model.plan(prompt, Plan(command="echo hello && sleep 600"))
    with EventTap(f"{proxy_url}/global/event") as tap:
        stale = observe_running(opencode.url, opencode.project, prompts)
        for o in stale.values():
            tap.wait_for(part_of(o.tool_id), what=f"the proxy relaying {o.tool_id} running", timeout=30)
    return stale


def false_settles(
    opencode: OpencodeServer, stale: dict[int, Observed], heard: list[Any], log: str
) -> list[str]:
    """A new turn's tool shown interrupted on the stream, stored other than completed, or written."""
    found = [f for o in stale.values() for f in false_stream_settles(heard, o.session_id, o.tool_id)]
    new_tools = {
        tool["id"]: tool
        for o in stale.values()
        for _, tool in tools_of(messages_body(opencode.url, o.turn), "v1")
        if tool["id"] != o.tool_id
    }
    assert len(new_tools) >= len(stale), "a new turn ran no tool: no race happened"
    found += [
        f"{i}: stored {t['state']}" for i, t in new_tools.items() if t["state"]["status"] != "completed"
    ]
    written = [line for line in log.splitlines() if "wrote back" in line]
    return found + [line for line in written if any(f"part={i}" in line for i in new_tools)]


def _about_session(payloads: Sequence[Any], session_id: str) -> list[dict[str, Any]]:
    """The plain events of a `/global/event` tap about one session, in stream order."""
    plain = [p.get("payload", p) for p in payloads if isinstance(p, dict)]
    return [
        p for p in plain if isinstance(p, dict) and (p.get("properties") or {}).get("sessionID") == session_id
    ]


def _says_idle(event: dict[str, Any]) -> bool:
    status = event["properties"].get("status") or {}
    return event["type"] == "session.idle" or (
        event["type"] == "session.status" and status.get("type") == "idle"
    )


def _tool_part(event: dict[str, Any]) -> dict[str, Any] | None:
    part = event["properties"].get("part") if event["type"] == "message.part.updated" else None
    return part if isinstance(part, dict) and part.get("type") == "tool" else None


def false_idles(payloads: Sequence[Any], session_id: str, stale_tool_id: str) -> list[str]:
    """Idle said of the session after a new turn showed it busy and before that turn's tool
    completed: while the new turn runs, any idle is false."""
    about = _about_session(payloads, session_id)
    busy = next((i for i, e in enumerate(about) if e["type"] == "session.status" and not _says_idle(e)), None)
    if busy is None:
        return []
    done = next(
        (
            i
            for i, e in enumerate(about)
            if i > busy
            and (part := _tool_part(e)) is not None
            and part["id"] != stale_tool_id
            and part["state"].get("status") == "completed"
        ),
        len(about),
    )
    return [f"{session_id}: {e['type']} {e['properties']}" for e in about[busy:done] if _says_idle(e)]


def false_stream_settles(payloads: Sequence[Any], session_id: str, stale_tool_id: str) -> list[str]:
    """A tool of a new turn shown interrupted on the stream (only the stale one may be)."""
    return [
        f"{session_id}: {part['id']} shown {part['state']}"
        for e in _about_session(payloads, session_id)
        if (part := _tool_part(e)) is not None and part["id"] != stale_tool_id and interrupted(part)
    ]
