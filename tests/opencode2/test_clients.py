"""Every real client of opencode 2.1.2, across a SIGKILL of the real 2.1.2 mid-`shell` call and its
restart: straight from the server each goes on showing the dead call running; through the proxy
each ends showing it interrupted, with the session idle. One crash cycle per client (`*_scene`),
with the clients open across the crash and opened after it, directly and through the proxy, all
read in the same window.

What each client is (2.1.2, measured; docs/opencode-2x.md "Clients of 2.1.2"):
- The TUI, `opencode --server URL --session ID DIR`, takes the password from `OPENCODE_PASSWORD`
  (without it: "Server at URL requires a password; set OPENCODE_PASSWORD"; credentials in the URL
  are not used). A running call is a braille spinner before its command and "Press ctrl+b to move
  running work to the background"; an interrupted one `$` and "Tool execution interrupted: shell".
- The web UI `serve` bundles, at `/server/{base64url(origin)}/session/{id}?auth_token=
  {base64(opencode:password)}` (it sends the token as Basic on every request it makes). A running
  call is a shimmering title and a "Move to background" hint; an interrupted one an error card.
- `@opencode/client`'s `event.subscribe()` on `/api/event` (`client_follower.mjs`), which does not
  reconnect by itself: the follower subscribes again and reads the messages at every connect.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from proxy.demo.model import DEFAULT_COMMAND, MockModel
from tests.integration.browser import Chromium, Page
from tests.integration.opencode_server import REPO_ROOT
from tests.integration.proxy_process import ProxyProcess
from tests.integration.tui import Terminal, Terminals, idle_output, is_spinner, tool_mark
from tests.opencode2.conftest import real_2x_command
from tests.opencode2.servers import PASSWORD, REAL_2_1_2, RealServer
from tests.opencode2.stand_in import RunningCall
from tests.opencode2.test_behind_proxy import INTERRUPTED, proxy_in_front, until_logged

pytestmark = pytest.mark.integration

SHOWN_INTERRUPTED = "Tool execution interrupted: shell"
BUSY_BAR = "esc interrupt"
"""The TUI's footer while a session is busy (with an animated bar)."""
BACKGROUND_HINT = "move running work to the background"
"""What the TUI shows under a call it believes runs."""
IDLE_WINDOW_S = 10.0
IDLE_LIMIT_BYTES = 1024
"""Measured on 2.1.2 over 10 s, 200x50: a TUI spinning on the dead call writes ~10,000 bytes; one
showing it interrupted writes 0."""
_OPEN_S = 60.0
_SETTLE_S = 30.0
_QUIET_AFTER_S = 2.0
_FOLLOW_S = 60.0

Seen = TypeVar("Seen")
Opened = TypeVar("Opened")


@asynccontextmanager
async def real_2_1_2(root: Path) -> AsyncIterator[tuple[RealServer, ProxyProcess]]:
    """The real 2.1.2 with the mock model and the proxy in front, following its stream."""
    model = MockModel()
    model.start()
    server = RealServer(root / "server", real_2x_command(), model)
    try:
        await server.start()
        async with proxy_in_front(server, root) as proxy:
            await until_logged(proxy, "following /api/event")
            yield server, proxy
    finally:
        await server.stop()
        model.stop()


async def across_a_crash(
    root: Path,
    before: Callable[[RealServer, ProxyProcess, RunningCall], Awaitable[Opened]],
    after: Callable[[RealServer, ProxyProcess, RunningCall, Opened], Awaitable[Seen]],
) -> Seen:
    """`before` opens clients while the call runs; the server is SIGKILLed and restarted; `after`
    opens more and reads them all."""
    async with real_2_1_2(root) as (server, proxy):
        call = await server.running_call()
        opened = await before(server, proxy, call)
        await server.kill()
        await server.restart()
        return await after(server, proxy, call, opened)


# The TUI.


@dataclass(frozen=True)
class Screen:
    """A TUI's screen at the end of the idle window, and the bytes it wrote during it."""

    text: str
    idle_bytes: int

    def report(self) -> str:
        screen = re.sub(r"\n(\s*\n)+", "\n\n", self.text)
        return f"{self.idle_bytes} bytes in {IDLE_WINDOW_S:.0f}s of idle; screen:\n{screen}"


def shows_running(screen: str) -> bool:
    return is_spinner(tool_mark(screen, DEFAULT_COMMAND)) and BUSY_BAR in screen


def shows_spinning(screen: str) -> bool:
    return is_spinner(tool_mark(screen, DEFAULT_COMMAND))


def shows_interrupted(screen: str) -> bool:
    return (
        tool_mark(screen, DEFAULT_COMMAND) == "$"
        and SHOWN_INTERRUPTED in screen
        and BUSY_BAR not in screen
        and BACKGROUND_HINT not in screen
    )


def watch_screens(expected: dict[Terminal, Callable[[str], bool]]) -> dict[str, Screen]:
    """Wait (bounded, without failing) until every screen passes its check, then count the bytes
    each writes over the same idle window; the verdict is each test's, with the screen it got."""
    deadline = time.monotonic() + _SETTLE_S
    while not all(check(t.screen()) for t, check in expected.items()) and time.monotonic() < deadline:
        time.sleep(0.25)
    time.sleep(_QUIET_AFTER_S)
    counts = idle_output(list(expected), IDLE_WINDOW_S)
    return {t.name: Screen(t.screen(), counts[t.name]) for t in expected}


@pytest.fixture(scope="module")
def tui_scene(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Screen]:
    """Two TUIs open across the crash (through the proxy, and straight from the server), two
    attached after the restart, read in the same idle window."""
    root = tmp_path_factory.mktemp("tui-2x")
    terminals = Terminals(root, REPO_ROOT / REAL_2_1_2, {"OPENCODE_PASSWORD": PASSWORD})

    def tui(name: str, url: str, call: RunningCall, project: Path) -> Terminal:
        return terminals.start(name, ("--server", url, "--session", call.session_id, str(project)), project)

    async def before(server: RealServer, proxy: ProxyProcess, call: RunningCall) -> list[Terminal]:
        opened = [tui("across_crash", proxy.url, call, server.project)]
        opened.append(tui("direct_across_crash", server.url, call, server.project))
        for terminal in opened:
            await asyncio.to_thread(
                terminal.wait_screen, shows_running, what="the TUI to show the call running", timeout=_OPEN_S
            )
        return opened

    async def after(
        server: RealServer, proxy: ProxyProcess, call: RunningCall, opened: list[Terminal]
    ) -> dict[str, Screen]:
        across, direct_across = opened
        proxied = tui("proxied", proxy.url, call, server.project)
        direct = tui("direct", server.url, call, server.project)
        expected: dict[Terminal, Callable[[str], bool]] = {
            across: shows_interrupted,
            proxied: shows_interrupted,
        }
        expected |= {direct_across: shows_spinning, direct: shows_spinning}
        return await asyncio.to_thread(watch_screens, expected)

    with terminals:
        return asyncio.run(across_a_crash(root, before, after))


@pytest.mark.parametrize("name", ["direct", "direct_across_crash"])
def test_the_tui_straight_from_the_server_spins_on_the_dead_call(
    tui_scene: dict[str, Screen], name: str
) -> None:
    """The bug, and the proof the measurement can fail: the spinner runs on after the restart."""
    seen = tui_scene[name]
    mark = tool_mark(seen.text, DEFAULT_COMMAND)
    assert is_spinner(mark), f"{name}: {mark!r} before the command, not a spinner; {seen.report()}"
    assert seen.idle_bytes > IDLE_LIMIT_BYTES, f"{name}: the spinner is not in the count; {seen.report()}"


@pytest.mark.parametrize("name", ["across_crash", "proxied"])
def test_the_tui_through_the_proxy_shows_the_call_interrupted_and_stops(
    tui_scene: dict[str, Screen], name: str
) -> None:
    """Open across the crash (it reads the messages again when its stream reconnects) and attached
    after it: `$`, "Tool execution interrupted: shell", no busy bar, no background hint, and quiet."""
    seen = tui_scene[name]
    mark = tool_mark(seen.text, DEFAULT_COMMAND)
    assert mark == "$", f"{name}: the call's line starts with {mark!r}, not '$'; {seen.report()}"
    assert SHOWN_INTERRUPTED in seen.text, f"{name}: not shown interrupted; {seen.report()}"
    assert BUSY_BAR not in seen.text, f"{name}: the session is shown busy; {seen.report()}"
    assert BACKGROUND_HINT not in seen.text, f"{name}: the call is offered to background; {seen.report()}"
    assert seen.idle_bytes <= IDLE_LIMIT_BYTES, f"{name}: above {IDLE_LIMIT_BYTES} bytes; {seen.report()}"


# The web UI.

_PROBE = """
(partId => {
  for (const trigger of document.querySelectorAll(
    '[data-component="collapsed-tool-group"] [data-slot="collapsible-trigger"][aria-expanded="false"]'))
    trigger.click();
  const tool = [...document.querySelectorAll('[data-component="tool-part-wrapper"]')]
    .find(e => e.dataset.timelinePartId === partId);
  return {
    shown: tool !== undefined,
    shimmering: !!tool?.querySelector('[data-component="text-shimmer"][data-active="true"]'),
    error_card: !!tool?.querySelector('[data-kind="tool-error-card"]'),
    background_hint: !!document.querySelector('[data-component="session-background-hint-row"]'),
    submit: document.querySelector('[data-action="composer-submit"]')?.getAttribute("aria-label") ?? null,
    text: document.body?.innerText ?? "",
  };
})
"""
"""What a page shows of one call, found by its id (its tool group opened first): `shimmering` is
the UI's running animation on the call's title, `background_hint` the "Move to background" it
offers for running work, `submit` the composer's button (Send when the session is idle)."""


@dataclass(frozen=True)
class Page2x:
    shown: bool
    shimmering: bool
    error_card: bool
    background_hint: bool
    submit: str | None
    text: str

    def is_running(self) -> bool:
        return self.shown and self.shimmering and self.background_hint and not self.error_card

    def is_interrupted(self) -> bool:
        return (
            self.shown
            and not self.shimmering
            and not self.background_hint
            and self.error_card
            and "Tool execution interrupted" in self.text
            and self.submit == "Send"
        )

    def report(self) -> str:
        text = "\n".join(line for line in self.text.splitlines() if line.strip())
        return (
            f"shown={self.shown} shimmering={self.shimmering} error_card={self.error_card} "
            f"background_hint={self.background_hint} submit={self.submit!r}; page text:\n{text}"
        )


async def read_page(page: Page, call: RunningCall) -> Page2x:
    return Page2x(**await page.evaluate(f"{_PROBE}({orjson.dumps(call.call_id).decode()})"))


def session_page(base_url: str, call: RunningCall) -> str:
    """The web UI's page of the session on `base_url`, with the credentials it takes in its URL."""
    key = base64.urlsafe_b64encode(base_url.encode()).decode().rstrip("=")
    token = base64.b64encode(f"opencode:{PASSWORD}".encode()).decode()
    return f"{base_url}/server/{key}/session/{call.session_id}?auth_token={token}"


async def until_page(page: Page, call: RunningCall, check: Callable[[Page2x], bool], within: float) -> Page2x:
    """The page once `check` accepts it, or as it is when `within` seconds run out (the test judges)."""
    seen = await read_page(page, call)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            while not check(seen):
                await asyncio.sleep(0.25)
                seen = await read_page(page, call)
    return seen


@pytest.fixture(scope="module")
def web_scene(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Page2x]:
    """Two pages open across the crash (through the proxy, and straight from the server), two
    opened after the restart; each in a browser context of its own."""
    root = tmp_path_factory.mktemp("web-2x")

    async def scene(browser: Chromium) -> dict[str, Page2x]:
        async def before(server: RealServer, proxy: ProxyProcess, call: RunningCall) -> dict[str, Page]:
            pages = {
                "across_crash": await browser.open(session_page(proxy.url, call)),
                "direct_across_crash": await browser.open(session_page(server.url, call)),
            }
            for name, page in pages.items():
                seen = await until_page(page, call, Page2x.is_running, _OPEN_S)
                assert seen.is_running(), f"{name} never showed the call running: {seen.report()}"
            return pages

        async def after(
            server: RealServer, proxy: ProxyProcess, call: RunningCall, pages: dict[str, Page]
        ) -> dict[str, Page2x]:
            pages |= {
                "proxied": await browser.open(session_page(proxy.url, call)),
                "direct": await browser.open(session_page(server.url, call)),
            }
            for name, page in pages.items():
                check = Page2x.is_running if name.startswith("direct") else Page2x.is_interrupted
                await until_page(page, call, check, _SETTLE_S)
            await asyncio.sleep(_QUIET_AFTER_S)
            return {name: await read_page(page, call) for name, page in pages.items()}

        return await across_a_crash(root, before, after)

    async def main() -> dict[str, Page2x]:
        async with Chromium(root / "chromium") as browser:
            return await scene(browser)

    return asyncio.run(main())


@pytest.mark.parametrize("name", ["direct", "direct_across_crash"])
def test_the_web_ui_straight_from_the_server_shows_the_dead_call_running(
    web_scene: dict[str, Page2x], name: str
) -> None:
    seen = web_scene[name]
    assert seen.is_running(), f"{name}: {seen.report()}"


@pytest.mark.parametrize("name", ["across_crash", "proxied"])
def test_the_web_ui_through_the_proxy_shows_the_call_interrupted(
    web_scene: dict[str, Page2x], name: str
) -> None:
    seen = web_scene[name]
    assert seen.is_interrupted(), f"{name}: {seen.report()}"


# `@opencode/client` followers.

FOLLOWER = Path(__file__).parent / "client_follower.mjs"


@dataclass
class Follower:
    """One `client_follower.mjs` and the JSON lines it has printed."""

    lines: list[dict[str, Any]]
    process: asyncio.subprocess.Process
    reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, base_url: str, call: RunningCall, mode: str) -> Follower:
        process = await asyncio.create_subprocess_exec(
            "node",
            str(FOLLOWER),
            base_url,
            call.session_id,
            mode,
            cwd=REPO_ROOT,
            env={"PATH": os.environ["PATH"], "OPENCODE_PASSWORD": PASSWORD},
            stdout=asyncio.subprocess.PIPE,
        )
        follower = cls([], process)
        follower.reader = asyncio.create_task(follower._read())
        return follower

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.lines.append(orjson.loads(line))

    async def until(self, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first line `check` accepts, once printed (a positive signal)."""
        deadline = time.monotonic() + _FOLLOW_S
        while not (found := next((line for line in self.lines if check(line)), None)):
            if self.process.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"the follower printed no {what}: {self.lines}")
            await asyncio.sleep(0.1)
        return found

    def events(self) -> list[dict[str, Any]]:
        return [line["event"] for line in self.lines if "event" in line]

    def last_messages(self) -> list[dict[str, Any]]:
        reads: list[list[dict[str, Any]]] = [line["messages"] for line in self.lines if "messages" in line]
        assert reads, f"the follower read no messages: {self.lines}"
        return reads[-1]

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        if self.reader is not None:
            await self.reader


def call_state(messages: list[dict[str, Any]], call: RunningCall) -> dict[str, Any]:
    """The call's state in a message list as `@opencode/client` reads it."""
    for message in messages:
        for item in message.get("content") or []:
            if item.get("id") == call.call_id:
                return dict(item["state"])
    raise AssertionError(f"{call.call_id} is in no message: {messages}")


@dataclass(frozen=True)
class Followed:
    """The call cut, and each follower by name."""

    call: RunningCall
    followers: dict[str, Follower]


@pytest.fixture(scope="module")
def follower_scene(tmp_path_factory: pytest.TempPathFactory) -> Followed:
    """Followers across the crash (through the proxy, and straight from the server), and ones
    subscribing after it (`once`: connect, read the messages, end)."""
    root = tmp_path_factory.mktemp("followers-2x")

    async def before(server: RealServer, proxy: ProxyProcess, call: RunningCall) -> dict[str, Follower]:
        followers = {
            "across_crash": await Follower.start(proxy.url, call, "follow"),
            "direct_across_crash": await Follower.start(server.url, call, "follow"),
        }
        for follower in followers.values():
            await follower.until(lambda line: "messages" in line, "its first read")
        return followers

    async def after(
        server: RealServer, proxy: ProxyProcess, call: RunningCall, followers: dict[str, Follower]
    ) -> Followed:
        try:
            await followers["across_crash"].until(lambda line: "ended" in line, "the end of the execution")
            await followers["direct_across_crash"].until(
                lambda line: line.get("connection") == 2, "read of the messages on its second stream"
            )
            followers |= {
                "proxied": await Follower.start(proxy.url, call, "once"),
                "direct": await Follower.start(server.url, call, "once"),
            }
            for name in ("proxied", "direct"):
                await followers[name].until(lambda line: "ended" in line, "its read")
        finally:
            for follower in followers.values():
                await follower.stop()
        return Followed(call, followers)

    return asyncio.run(across_a_crash(root, before, after))


def test_a_follower_through_the_proxy_is_told_the_call_failed_and_the_execution_ended(
    follower_scene: Followed,
) -> None:
    follower = follower_scene.followers["across_crash"]
    told = [
        e for e in follower.events() if e["type"] in ("session.tool.failed", "session.execution.interrupted")
    ]
    assert [e["type"] for e in told] == ["session.tool.failed", "session.execution.interrupted"], (
        follower.lines
    )
    assert told[0]["data"]["id"] == follower_scene.call.call_id
    assert told[0]["data"]["error"] == INTERRUPTED
    assert told[1]["data"]["reason"] == "shutdown"


def test_a_follower_straight_from_the_server_is_told_nothing(follower_scene: Followed) -> None:
    """The bug: connected again to the restarted server by the time the proxied follower was told,
    it has heard nothing of the call, and the messages it read again still show it running."""
    follower = follower_scene.followers["direct_across_crash"]
    assert [e for e in follower.events() if e["type"] == "session.tool.failed"] == [], follower.lines
    assert call_state(follower.last_messages(), follower_scene.call)["status"] == "running"


def test_a_follower_subscribing_after_the_crash_reads_the_call_settled_through_the_proxy(
    follower_scene: Followed,
) -> None:
    proxied, direct = follower_scene.followers["proxied"], follower_scene.followers["direct"]
    call = follower_scene.call
    shown = call_state(proxied.last_messages(), call)
    assert shown["status"] == "error", proxied.lines
    assert shown["error"] == INTERRUPTED
    assert call_state(direct.last_messages(), call)["status"] == "running", "the control: the server's own"
