"""The real TUI after a crash: `opencode attach` spins on the orphaned tool, except through the proxy.

What the 1.18.33 TUI does (measured, and the reason this test looks the way it does):
- Sessions come from the **v1** API only: the transcript from `GET /session/{id}/message?limit=100`,
  busy state from `GET /session/status`, live changes from one `GET /global/event` stream (no PTY,
  no `/api/session/...` route; `/api/...` serves only config lists such as models and agents). A v2
  session shows an empty transcript, so only v1 is tested.
- It builds a session's transcript from that fetch when it opens the session, and afterwards only
  from `/global/event`. When the stream drops (server crash) it reconnects, but re-fetches neither
  messages nor `/session/status`: a TUI that stays open across the crash keeps its "running" tool
  and its busy bar until events on the reconnected stream change them.

One crash/restart cycle serves the module (`scene`): a v1 turn starts, a TUI attaches through the
proxy and watches its bash tool run (booting while the turn starts saves seconds), the server is
SIGKILLed and restarted; then one TUI attaches
directly and one through the proxy, and all three are watched during the same idle window.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.demo.model import DEFAULT_COMMAND, MockModel, Plan

from .crash_views import CrashViews
from .opencode_server import OpencodeServer, opencode_binary
from .polling import poll
from .proxy_process import ProxyProcess, running
from .tui import Terminal, Terminals, idle_output, is_spinner, tool_mark
from .turns import RUNTIMES, Runtime, Turn, read_messages, start_turn, wait_tool_running

pytestmark = pytest.mark.integration

IDLE_WINDOW_S = 10.0
IDLE_LIMIT_BYTES = 1024
"""Measured over 10 s of idle, 200x50, TERM=xterm-256color: a stale spinner writes ~9,600 bytes
(~128 frames of 75 bytes), the busy bar of a TUI that lived through the crash another ~47,000;
a settled screen writes 0. 1 KB is about one second of spinner."""

_BOOT_TIMEOUT_S = 60.0
_SETTLE_TIMEOUT_S = 20.0
"""How long after the restart every TUI may take to show its final state (a TUI boots in ~4 s)."""
_QUIET_AFTER_S = 2.0
"""Late first-paint redraws end within this after the screen is complete (measured: 0 bytes after)."""

SETTLED_ERROR = "Tool execution aborted"
BUSY_BAR = "esc interrupt"
"""The footer the TUI shows while it believes the session is busy (with an animated bar)."""


@dataclass(frozen=True)
class Seen:
    """A TUI's screen at the end of the idle window, and the bytes it wrote during it."""

    screen: str
    idle_bytes: int

    def report(self) -> str:
        """Both, for failure messages (runs of blank lines squeezed)."""
        screen = re.sub(r"\n(\s*\n)+", "\n\n", self.screen)
        return f"{self.idle_bytes} bytes in {IDLE_WINDOW_S:.0f}s of idle; screen:\n{screen}"


TuiScene = CrashViews[Seen]


def shows_running(screen: str) -> bool:
    return is_spinner(tool_mark(screen, DEFAULT_COMMAND)) and BUSY_BAR in screen


def shows_settled(screen: str) -> bool:
    return tool_mark(screen, DEFAULT_COMMAND) == "$" and SETTLED_ERROR in screen and BUSY_BAR not in screen


def _spinning(screen: str) -> bool:
    return is_spinner(tool_mark(screen, DEFAULT_COMMAND))


def watch(expected: dict[Terminal, Callable[[str], bool]]) -> dict[str, Seen]:
    """Wait (bounded, without failing) until every terminal's screen passes its check, then measure.

    Not failing here leaves the verdict to each test, which then shows the screen it got.
    """
    deadline = time.monotonic() + _SETTLE_TIMEOUT_S
    while not all(check(t.screen()) for t, check in expected.items()) and time.monotonic() < deadline:
        time.sleep(0.25)
    time.sleep(_QUIET_AFTER_S)
    counts = idle_output(list(expected), IDLE_WINDOW_S)
    return {t.name: Seen(t.screen(), counts[t.name]) for t in expected}


@pytest.fixture(scope="module")
def scene(opencode: OpencodeServer, tmp_path_factory: pytest.TempPathFactory) -> TuiScene:
    """The module's crash/restart cycle, with three TUIs watching (see the module docstring)."""
    root = tmp_path_factory.mktemp("tui")
    proxy = ProxyProcess(opencode.url, root / "proxy.log")
    with running([proxy]):
        turn = start_turn("v1", opencode.url, opencode.project, "tui stale v1")
        with Terminals(root, opencode_binary()) as terminals:
            across = terminals.attach("across_crash", proxy.url, turn.session_id, turn.directory)
            wait_tool_running(opencode.url, turn)
            across.wait_screen(
                shows_running, what="the TUI to show the live tool running", timeout=_BOOT_TIMEOUT_S
            )
            opencode.crash()
            opencode.restart()
            direct = terminals.attach("direct", opencode.url, turn.session_id, turn.directory)
            proxied = terminals.attach("proxied", proxy.url, turn.session_id, turn.directory)
            seen = watch({direct: _spinning, proxied: shows_settled, across: shows_settled})
    return CrashViews.of(seen)


def assert_settled(seen: Seen, who: str) -> None:
    """No spinner, no busy bar, the call shown failed as opencode shows an interrupted one, and quiet."""
    mark = tool_mark(seen.screen, DEFAULT_COMMAND)
    assert mark == "$", f"{who}: the tool line starts with {mark!r}, not '$'; {seen.report()}"
    assert SETTLED_ERROR in seen.screen, f"{who}: no {SETTLED_ERROR!r} on screen; {seen.report()}"
    assert BUSY_BAR not in seen.screen, f"{who}: the TUI still shows the session busy; {seen.report()}"
    assert seen.idle_bytes <= IDLE_LIMIT_BYTES, f"{who}: above {IDLE_LIMIT_BYTES} bytes; {seen.report()}"


def test_direct_tui_spins_on_orphaned_tool(scene: TuiScene) -> None:
    """The bug, and the proof the measurement can fail: straight from the server the spinner runs on."""
    mark = tool_mark(scene.direct.screen, DEFAULT_COMMAND)
    assert is_spinner(mark), f"no spinner frame before the command but {mark!r}; {scene.direct.report()}"
    assert scene.direct.idle_bytes > IDLE_LIMIT_BYTES, (
        f"the spinner is not in the count; {scene.direct.report()}"
    )


def test_tui_attached_through_proxy_shows_tool_settled(scene: TuiScene) -> None:
    """Opened after the restart through the proxy: the fetched view is settled, so the TUI is idle.

    `interrupted` is how the TUI labels an assistant message that ended in `MessageAbortedError`.
    """
    assert_settled(scene.proxied, "attached through the proxy after the restart")
    assert "· interrupted" in scene.proxied.screen, f"message not shown interrupted; {scene.proxied.report()}"


def test_tui_open_across_crash_settles_through_proxy(scene: TuiScene) -> None:
    """A TUI that stays open through the crash must stop spinning too (issue 4, live settle on streams).

    It never re-fetches after reconnecting `/global/event`, so only events on that stream can reach
    it: `message.part.updated` with the settled part (ends the spinner) and `session.status` idle
    (ends the busy bar). Measured by injecting exactly these: the TUI then writes 0 bytes.
    """
    assert_settled(scene.across_crash, "open through the proxy across the crash")


@dataclass(frozen=True)
class WritingScene:
    """A v1 turn killed while the model was still writing (no tool), seen by a TUI open across the
    crash straight from the server and one through the proxy; and the views of that turn and of a
    v2 turn killed the same way, directly and through the proxy, after the restart."""

    direct: Seen
    proxied: Seen
    views: dict[Runtime, tuple[list[dict[str, Any]], list[dict[str, Any]]]]
    """Per runtime: (direct, through the proxy) message lists."""


def _busy(screen: str) -> bool:
    return BUSY_BAR in screen


def _writing(screen: str) -> bool:
    """Busy, and showing the text the model streams: the transcript is loaded and followed live."""
    return BUSY_BAR in screen and re.search(r"word\d+ word\d+", screen) is not None


def _not_busy(screen: str) -> bool:
    return BUSY_BAR not in screen


@pytest.fixture(scope="module")
def writing_scene(
    opencode: OpencodeServer, mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory
) -> WritingScene:
    root = tmp_path_factory.mktemp("tui-writing")
    proxy = ProxyProcess(opencode.url, root / "proxy.log")
    try:
        proxy.start()
        turns = {}
        for runtime in RUNTIMES:
            mock_model.plan(f"tui writing {runtime}", Plan(text_every=1.0))
            turns[runtime] = start_turn(runtime, opencode.url, opencode.project, f"tui writing {runtime}")
        v1 = turns["v1"]
        poll(lambda: _unfinished_answer(opencode.url, v1), what="the v1 answer started", timeout=60)
        with Terminals(root, opencode_binary()) as terminals:
            direct = terminals.attach("writing_direct", opencode.url, v1.session_id, v1.directory)
            proxied = terminals.attach("writing_proxied", proxy.url, v1.session_id, v1.directory)
            for terminal in (direct, proxied):
                terminal.wait_screen(
                    _writing, what="the TUI to show the model writing", timeout=_BOOT_TIMEOUT_S
                )
            poll(
                lambda: _unfinished_answer(opencode.url, turns["v2"]),
                what="the v2 answer started",
                timeout=30,
            )
            opencode.crash()
            opencode.restart()
            seen = watch({direct: _busy, proxied: _not_busy})
        views = {
            runtime: (read_messages(opencode.url, turn), read_messages(proxy.url, turn))
            for runtime, turn in turns.items()
        }
    finally:
        proxy.stop()
    return WritingScene(seen["writing_direct"], seen["writing_proxied"], views)


def _answer(messages: list[dict[str, Any]], runtime: Runtime) -> dict[str, Any] | None:
    """The assistant message of a turn (v1 its `info`), if there is one."""
    for message in messages:
        info = message["info"] if runtime == "v1" else message
        if info.get("role", info.get("type")) == "assistant":
            return info
    return None


def _unfinished_answer(base_url: str, turn: Turn) -> bool | None:
    answer = _answer(read_messages(base_url, turn), turn.runtime)
    return True if answer is not None and "completed" not in answer["time"] else None


def test_direct_tui_stays_busy_after_a_crash_while_writing(writing_scene: WritingScene) -> None:
    """The bug (issue 10, item 7): no tool to settle, and the busy bar runs on."""
    seen = writing_scene.direct
    assert BUSY_BAR in seen.screen, f"the direct TUI is not busy; {seen.report()}"
    assert seen.idle_bytes > IDLE_LIMIT_BYTES, f"the busy bar is not in the count; {seen.report()}"


def test_tui_open_across_a_crash_while_writing_goes_idle_through_the_proxy(
    writing_scene: WritingScene,
) -> None:
    seen = writing_scene.proxied
    assert BUSY_BAR not in seen.screen, f"the TUI still shows the session busy; {seen.report()}"
    assert seen.idle_bytes <= IDLE_LIMIT_BYTES, f"above {IDLE_LIMIT_BYTES} bytes; {seen.report()}"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_turn_cut_while_writing_is_closed_in_views_through_the_proxy(
    writing_scene: WritingScene, runtime: Runtime
) -> None:
    direct, proxied = writing_scene.views[runtime]
    before, after = _answer(direct, runtime), _answer(proxied, runtime)
    assert before is not None
    assert after is not None
    assert "completed" not in before["time"], "opencode closed the message itself"
    assert after["time"] == {**before["time"], "completed": after["time"]["completed"]}
    assert after["time"]["completed"] >= before["time"]["created"]
    assert len(proxied) == len(direct)
