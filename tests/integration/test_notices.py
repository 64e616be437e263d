"""A turn that waits for a person is told in the real clients: the 1.18.33 TUI and web UI, each open
across a crash and opened after it, show the notice the resume's Announcer gives, and drop it
when the wait ends.

The proxy runs in this process (an aiohttp runner on a free port) in front of the real server, so
the test calls what the resume calls: the assembly's `notices` (`waiting`, then `ended`). A v1
turn runs `echo hello && sleep 600`; a TUI and a page watch it through the proxy; the server is
SIGKILLed and restarted; the turn is announced waiting; a second TUI and a second page open. Each
of the four is waited on until it shows the notice's text (bounded; the failure shows the
screen), then until it no longer does once the wait has ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from yarl import URL

from proxy.addons.live.notices import Notices
from proxy.demo.model import DEFAULT_COMMAND
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings

from .browser import Chromium, Page
from .opencode_server import OpencodeServer, opencode_binary
from .polling import WaitTimeout
from .test_web_ui import session_path
from .tui import Terminal, Terminals, tool_mark
from .turns import start_turn, wait_tool_running

pytestmark = pytest.mark.integration

PROMPT = "notice v1"
TITLE = "Waiting for you: bash was not continued"
SAID = "The server restarted while it ran. Send a message to continue."
_BOOT_TIMEOUT_S = 90.0
"""A TUI boots in ~4 s and a page paints in 3-5 s on an idle machine; up to 45 s at a load of 20."""
_SHOWN_TIMEOUT_S = 90.0
"""How long a client may take to show (or drop) the notice: one open across the crash waits for its
stream to come back (the TUI after a pause of its own), one opened after it boots first."""
_POLL_S = 0.25


@asynccontextmanager
async def in_process_proxy(upstream: str) -> AsyncIterator[tuple[str, Notices]]:
    """The proxy application in this process, served on a free loopback port; its URL and announcer."""
    app = create_app(Settings(upstream=URL(upstream)))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        announcer = app[ASSEMBLY].notices
        assert announcer is not None, "the assembly exposes no notices"
        yield f"http://{host}:{port}", announcer
    finally:
        await runner.cleanup()


def tui_screen(terminal: Terminal) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        return await asyncio.to_thread(terminal.screen)

    return read


def page_text(page: Page) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        return str(await page.evaluate("document.body?.innerText ?? ''"))

    return read


async def wait_for(read: Callable[[], Awaitable[str]], check: Callable[[str], bool], what: str) -> str:
    """Read until `check` accepts what the client shows (bounded); the timeout says what it showed."""
    deadline = time.monotonic() + _SHOWN_TIMEOUT_S
    while not check(shown := await read()):
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {_SHOWN_TIMEOUT_S:.0f}s waiting for {what}; shown:\n{shown}")
        await asyncio.sleep(_POLL_S)
    return shown


def notice_shown(shown: str) -> bool:
    return TITLE in shown and SAID in shown


def notice_dropped(shown: str) -> bool:
    """The transcript shown (its prompt: the settled call's card no longer names the command in
    the web UI), the notice not; a blank screen between two paints is neither."""
    return PROMPT in shown and TITLE not in shown


def running_tool_shown(shown: str) -> bool:
    return DEFAULT_COMMAND in shown


async def _play(opencode: OpencodeServer, root: Path) -> dict[str, tuple[str, str]]:
    """The crash, the wait announced, four clients; per client what it showed while the session
    waited and once the wait had ended."""
    async with in_process_proxy(opencode.url) as (url, announcer):
        turn = await asyncio.to_thread(start_turn, "v1", opencode.url, opencode.project, PROMPT)
        with Terminals(root, opencode_binary()) as terminals:
            async with Chromium(root / "chromium") as browser:
                await asyncio.to_thread(wait_tool_running, opencode.url, turn)
                tui_across = terminals.attach("tui_across", url, turn.session_id, turn.directory)
                pages = {"page_across": await browser.open(url + session_path(turn))}
                reads = {"tui_across": tui_screen(tui_across), "page_across": page_text(pages["page_across"])}
                for name, read in reads.items():
                    await wait_for(read, running_tool_shown, f"{name} to show the running tool")
                assert tool_mark(await reads["tui_across"](), DEFAULT_COMMAND) is not None
                await asyncio.to_thread(opencode.crash)
                await asyncio.to_thread(opencode.restart)
                announcer.waiting(turn.session_id, str(turn.directory), TITLE, SAID)
                tui_after = terminals.attach("tui_after", url, turn.session_id, turn.directory)
                reads["tui_after"] = tui_screen(tui_after)
                pages["page_after"] = await browser.open(url + session_path(turn))
                reads["page_after"] = page_text(pages["page_after"])
                waiting = {}
                for name, read in reads.items():
                    waiting[name] = await wait_for(read, notice_shown, f"{name} to show the notice")
                for name, page in pages.items():
                    await page.screenshot(root / f"{name}.png")
                announcer.ended(turn.session_id)
                after = {}
                for name, read in reads.items():
                    after[name] = await wait_for(read, notice_dropped, f"{name} to drop the notice")
    return {name: (waiting[name], after[name]) for name in reads}


@pytest.fixture(scope="module")
def shown(opencode: OpencodeServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    return asyncio.run(_play(opencode, tmp_path_factory.mktemp("notices")))


@pytest.mark.parametrize("client", ["tui_across", "tui_after", "page_across", "page_after"])
def test_the_client_shows_the_notice_while_the_turn_waits_and_drops_it_after(
    shown: dict[str, tuple[str, str]], client: str
) -> None:
    waiting, after = shown[client]
    assert notice_shown(waiting), f"{client} never showed the notice:\n{waiting}"
    assert PROMPT in after, f"{client} lost the transcript with the notice:\n{after}"
    assert TITLE not in after, f"{client} still shows the notice after the wait ended:\n{after}"
