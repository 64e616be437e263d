"""The bundled web UI open across a crash through a `--resume` proxy: the same page (never
reloaded) shows the interrupted call settled, the resume's prompt and the resumed turn's answer,
and the session no longer busy.

The page lives on `/global/event` after its first load, so everything it shows after the crash
came through the proxy's stream: the settled part, then the resumed turn's own events.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pytest

from .browser import Chromium, Page
from .opencode_server import OpencodeServer
from .polling import poll
from .proxy_process import ProxyProcess, running
from .resumes import final
from .test_web_ui import Seen, _look, _watch_live_tool, session_path
from .turns import Turn, start_turn, wait_tool_running, wait_turn_done

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "web ui resume v1"
TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Resumed:
    decision: dict[str, object]
    seen: Seen


def resumed_on_page(seen: Seen) -> bool:
    """The resume's prompt and the new answer are shown, the old call no longer runs, nothing is busy."""
    after = seen.text.split("were interrupted", 1)
    return len(after) == 2 and "done" in after[1] and not seen.shimmering and not seen.busy


async def _play(opencode: OpencodeServer, proxy: ProxyProcess, root: Path) -> Resumed:
    turn: Turn = await asyncio.to_thread(start_turn, "v1", opencode.url, opencode.project, PROMPT)
    async with Chromium(root / "chromium") as browser:
        page: Page = await browser.open(proxy.url + session_path(turn))
        running_tool = await asyncio.to_thread(wait_tool_running, opencode.url, turn)
        part_id = str(running_tool.tool["id"])
        await _watch_live_tool(page, part_id, root / "before_crash.png")
        await asyncio.to_thread(opencode.crash)
        await asyncio.to_thread(opencode.restart)
        decision = await asyncio.to_thread(
            poll, partial(final, proxy.url, turn), what="the resume decision", timeout=TIMEOUT_S
        )
        await asyncio.to_thread(wait_turn_done, opencode.url, turn, timeout=TIMEOUT_S)
        deadline = time.monotonic() + TIMEOUT_S
        while not resumed_on_page(seen := await _look(page, part_id)) and time.monotonic() < deadline:  # noqa: ASYNC110 - a page, not an event
            await asyncio.sleep(0.25)
        shot = root / "resumed.png"
        await page.screenshot(shot)
        return Resumed(decision, replace(seen, screenshot=shot))


@pytest.fixture(scope="module")
def resumed(opencode: OpencodeServer, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    root = tmp_path_factory.mktemp("web-ui-resume")
    proxy = ProxyProcess(
        opencode.url, root / "proxy.log", ("--resume", "--write-back", "api", "--grace", "0.5")
    )
    with running([proxy]):
        return asyncio.run(_play(opencode, proxy, root))


def test_a_page_open_across_the_crash_shows_the_resumed_turn(resumed: Resumed) -> None:
    seen = resumed.seen
    assert resumed.decision["outcome"] == "resumed", resumed.decision
    assert seen.watched, f"the page was reloaded; {seen.report()}"
    assert resumed_on_page(seen), seen.report()
    assert seen.error_card, f"the interrupted call is not drawn as failed; {seen.report()}"
