"""The web UI (and the TUI, and an official-SDK subscriber) open across a crash, its stream held
back and let go at a chosen moment of the resume (issue 28): before the write-back, between the
write-back and the prompt, or after the prompt.
Whenever it comes back, the same page (never reloaded) must show the interrupted call settled,
the resume's prompt, and the session no longer busy; so must the same `opencode attach` TUI,
whose only stream is `/global/event` (seen at the gate: it fetches no messages once it is back).

The page's requests go through a `StreamGate` in front of the proxy: closed at the crash, it
holds the page's reconnect until the moment, checked on the server itself (the proxy following
again; the part settled in the server's own view; the prompt stored). The resume waits for the
page's stream (up to 30 s) before it prompts, so the last moment is reached once that wait ran out.

`SETTLE_COMEBACK_REPEATS` (default 1) repeats each moment, for a stress run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import DEFAULT_COMMAND

from .browser import Chromium
from .opencode_server import OpencodeServer, opencode_binary
from .polling import WaitTimeout, poll
from .proxy_process import ProxyProcess, running
from .resumes import after_reconnect, event_kind, final, following, sdk_subscriptions
from .stream_gate import StreamGate
from .test_resume_web_ui import resumed_on_page
from .test_tui import BUSY_BAR, SETTLED_ERROR, shows_running
from .test_web_ui import Seen, _look, _watch_live_tool, session_path
from .tui import Terminals, tool_mark
from .turns import Turn, read_messages, start_turn, wait_tool_running, wait_turn_done

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT_S = 90.0
REPEATS = int(os.environ.get("SETTLE_COMEBACK_REPEATS", "1"))
PROMPTED = "were interrupted"
Play = Callable[[OpencodeServer, ProxyProcess, Path, str], Coroutine[Any, Any, tuple[bool, str]]]
"""One client's scene: whether it holds what it should after the resume, and a report of what it holds."""


def part_settled(server: OpencodeServer, turn: Turn, part_id: str) -> bool | None:
    """Whether the server's own view shows the part settled (the write-back is durable)."""
    for message in read_messages(server.url, turn):
        for part in message["parts"]:
            if part["id"] == part_id and part["state"]["status"] not in ("pending", "running"):
                return True
    return None


def prompted(server: OpencodeServer, turn: Turn) -> bool | None:
    """Whether the resume's prompt is stored."""
    for message in read_messages(server.url, turn):
        if message["info"]["role"] == "user" and any(PROMPTED in p.get("text", "") for p in message["parts"]):
            return True
    return None


MOMENTS = {
    "before the write-back": lambda server, proxy, turn, part_id: following(proxy),
    "between the write-back and the prompt": lambda server, proxy, turn, part_id: part_settled(
        server, turn, part_id
    ),
    "after the prompt": lambda server, proxy, turn, part_id: prompted(server, turn),
}


def shown(seen: Seen, moment: str) -> bool:
    """Settled, prompted, not busy; the answer too when the page was back before the prompt."""
    settled = (
        seen.shown and not seen.shimmering and seen.error_card and not seen.busy and PROMPTED in seen.text
    )
    return settled and (moment == "after the prompt" or resumed_on_page(seen))


async def _crash_and_come_back(
    server: OpencodeServer, proxy: ProxyProcess, gate: StreamGate, turn: Turn, *, part_id: str, moment: str
) -> None:
    """Crash the server with the gate closed; let the held stream go at `moment`; wait for the
    resumed turn to end."""
    gate.close()
    await asyncio.to_thread(server.crash)
    await asyncio.to_thread(server.restart)
    reached = partial(MOMENTS[moment], server, proxy, turn, part_id)
    await asyncio.to_thread(poll, reached, what=moment, timeout=TIMEOUT_S, interval=0.05)
    await asyncio.to_thread(
        poll, lambda: gate.held or None, what="the client reconnecting", timeout=TIMEOUT_S
    )
    gate.open()
    decision = await asyncio.to_thread(
        poll, partial(final, proxy.url, turn), what="decision", timeout=TIMEOUT_S
    )
    assert decision["outcome"] == "resumed", decision
    await asyncio.to_thread(wait_turn_done, server.url, turn, timeout=TIMEOUT_S)


async def _page(server: OpencodeServer, proxy: ProxyProcess, root: Path, moment: str) -> tuple[bool, str]:
    """Whether the page open across the crash (never reloaded) shows what it should, and what it shows."""
    turn = await asyncio.to_thread(start_turn, "v1", server.url, server.project, f"web ui comeback {moment}")
    async with StreamGate(proxy.url) as gate, Chromium(root / "chromium") as browser:
        page = await browser.open(gate.url + session_path(turn))
        part_id = str((await asyncio.to_thread(wait_tool_running, server.url, turn)).tool["id"])
        await _watch_live_tool(page, part_id, root / "before_crash.png")
        await _crash_and_come_back(server, proxy, gate, turn, part_id=part_id, moment=moment)
        deadline = time.monotonic() + TIMEOUT_S
        while not shown(seen := await _look(page, part_id), moment) and time.monotonic() < deadline:  # noqa: ASYNC110 - a page, not an event
            await asyncio.sleep(0.25)
        await page.screenshot(root / "comeback.png")
        return seen.watched and shown(seen, moment), seen.report()


async def _sdk(server: OpencodeServer, proxy: ProxyProcess, root: Path, moment: str) -> tuple[bool, str]:
    """Whether the official SDK's `/global/event` subscription was told the call settled and the
    prompt after its reconnect, and what it yielded then."""
    turn = await asyncio.to_thread(start_turn, "v1", server.url, server.project, f"sdk comeback {moment}")
    async with StreamGate(proxy.url) as gate:
        with contextlib.ExitStack() as stack:
            # Started and waited for in a thread: the gate serves the subscription from this loop.
            subscribe = partial(sdk_subscriptions, root, {"global": (gate.url, "global", "")})
            subscriptions = await asyncio.to_thread(lambda: stack.enter_context(subscribe()))
            part_id = str((await asyncio.to_thread(wait_tool_running, server.url, turn)).tool["id"])
            await _crash_and_come_back(server, proxy, gate, turn, part_id=part_id, moment=moment)
            subscription = subscriptions["global"]
            sdk_told = partial(subscription.heard, lambda events: told(events, turn, part_id))
            with contextlib.suppress(WaitTimeout):
                await asyncio.to_thread(
                    poll, sdk_told, what="the settled call and the prompt", timeout=TIMEOUT_S
                )
            events = after_reconnect(subscription)
            return told(events, turn, part_id), f"the SDK yielded after its reconnect: {events}"


def told(events: list[Any], turn: Turn, part_id: str) -> bool:
    """Whether `events` settle the call and carry the resume's prompt."""
    settled = prompt = False
    for event in events:
        kind, properties = event_kind(event)
        part = properties.get("part") or {}
        if kind == "message.part.updated" and part.get("id") == part_id:
            settled = part["state"]["status"] == "error"
        elif kind == "message.part.updated" and part.get("sessionID") == turn.session_id:
            prompt = prompt or PROMPTED in part.get("text", "")
    return settled and prompt


async def _tui(server: OpencodeServer, proxy: ProxyProcess, root: Path, moment: str) -> tuple[bool, str]:
    """Whether the TUI open across the crash (`opencode attach`, never restarted) shows what it
    should, and its screen."""
    turn = await asyncio.to_thread(start_turn, "v1", server.url, server.project, f"tui comeback {moment}")
    async with StreamGate(proxy.url) as gate:
        with Terminals(root, opencode_binary()) as terminals:
            tui = terminals.attach("across", gate.url, turn.session_id, turn.directory)
            part_id = str((await asyncio.to_thread(wait_tool_running, server.url, turn)).tool["id"])
            await asyncio.to_thread(
                tui.wait_screen, shows_running, what="the TUI to show the tool running", timeout=TIMEOUT_S
            )
            await _crash_and_come_back(server, proxy, gate, turn, part_id=part_id, moment=moment)
            with contextlib.suppress(WaitTimeout):
                await asyncio.to_thread(
                    tui.wait_screen,
                    partial(on_screen, moment=moment),
                    what="the settled call and the prompt",
                    timeout=TIMEOUT_S,
                )
            screen = tui.screen()
            return on_screen(screen, moment), f"the gate: {gate.said}; the TUI's screen:\n{screen}"


def on_screen(screen: str, moment: str) -> bool:
    """The call drawn ended and failed, the prompt, nothing busy; the answer too when the TUI was back
    before the prompt."""
    settled = tool_mark(screen, DEFAULT_COMMAND) == "$" and SETTLED_ERROR in screen
    after = screen.split(PROMPTED, 1)
    prompted = settled and len(after) == 2 and BUSY_BAR not in screen
    return prompted and (moment == "after the prompt" or "done" in after[1])


CLIENTS: dict[str, Play] = {"web ui": _page, "sdk": _sdk, "tui": _tui}


@pytest.mark.parametrize("repeat", range(REPEATS))
@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_back_at_any_moment_of_the_resume_holds_the_call_settled_and_the_prompt(
    opencode: OpencodeServer, tmp_path: Path, client: str, moment: str, repeat: int
) -> None:
    del repeat
    log = tmp_path / "proxy.log"
    proxy = ProxyProcess(opencode.url, log, ("--resume", "--write-back", "api", "--grace", "0.5"))
    with running([proxy]):
        holds, report = asyncio.run(CLIENTS[client](opencode, proxy, tmp_path, moment))
    said = log.read_text()
    assert holds, f"{client}, back {moment}: {report}\n--- the proxy's log ---\n{said[-6000:]}"
    assert "client stream /global/event opened after the server was lost" in said
