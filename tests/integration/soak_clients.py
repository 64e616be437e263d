"""The clients a soak round keeps open across its kills, and what each one was told and shows.

An official-SDK follower on `/global/event` stays open through the whole soak (it reconnects by
itself, across proxy kills too: the port stays the same); each round adds one on each v2 session's
own stream, and in a watched round the real TUI and a web UI page on the v1 tool turn. Chromium
is driven from an event loop of its own thread, so the synchronous rounds can open a page before
a kill and read it after.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from proxy.opencode.vocabulary import (
    PART_UPDATED,
    PROMPT_ADMITTED,
    SESSION_IDLE,
    SESSION_STATUS,
    STEP_CALLS_TOOLS,
    STEP_ENDED,
    TOOL_FAILED,
)

from .browser import Chromium, Page
from .proctree import kill_tree
from .resumes import event_kind, v1_story
from .test_resume import resumed_on_screen
from .test_resume_web_ui import resumed_on_page
from .test_sdk_streams import Subscription
from .test_tui import IDLE_LIMIT_BYTES, shows_running, shows_settled, watch
from .test_web_ui import Seen, _look, _watch_live_tool, session_path
from .tui import Terminal, Terminals
from .turns import Observed, Turn

T = TypeVar("T")
_CALL_TIMEOUT_S = 120.0
_PAGE_SETTLE_TIMEOUT_S = 60.0


class WebPages:
    """One headless Chromium on a loop of its own thread; a context manager."""

    def __init__(self, root: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="soak-chromium", daemon=True)
        self._browser = Chromium(root)

    def __enter__(self) -> WebPages:
        self._thread.start()
        self._run(self._browser.__aenter__())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self._run(self._browser.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=_CALL_TIMEOUT_S)

    def open_watching(self, url: str, part_id: str, shot: Path) -> Page:
        """A page at `url` once it shows the live call running (marked, so a reload shows)."""
        page = self._run(self._browser.open(url))
        self._run(_watch_live_tool(page, part_id, shot))
        return page

    def look(self, page: Page, part_id: str) -> Seen:
        return self._run(_look(page, part_id))

    def shot(self, page: Page, path: Path) -> None:
        self._run(page.screenshot(path))

    def close(self, page: Page) -> None:
        self._run(page.call("Page.close"))


@dataclass
class Watchers:
    """A watched round's TUI and page, on its v1 tool turn."""

    tui: Terminal
    page: Page
    part_id: str


@dataclass
class Clients:
    """What the soak keeps open: the `/global/event` follower, the browser and the terminals."""

    root: Path
    follower: Subscription
    terminals: Terminals
    pages: WebPages
    sessions: dict[str, Subscription] = field(default_factory=dict)
    """This round's v2 session streams, by session id."""

    def attach(self, base_url: str, observed: Observed, number: int) -> Watchers:
        """The real TUI and a web UI page on the turn, once both show its call running."""
        turn = observed.turn
        tui = self.terminals.attach(f"round{number}", base_url, turn.session_id, turn.directory)
        tui.wait_screen(shows_running, what="the TUI to show the call running", timeout=_CALL_TIMEOUT_S)
        shot = self.root / f"round{number}-before.png"
        page = self.pages.open_watching(base_url + session_path(turn), observed.tool_id, shot)
        return Watchers(tui, page, observed.tool_id)

    def follow_sessions(self, base_url: str, turns: list[Turn], number: int) -> None:
        """An SDK follower on each v2 turn's own stream, once it has replayed the turn so far."""
        for turn in turns:
            output = self.root / f"round{number}-{turn.session_id}.jsonl"
            self.sessions[turn.session_id] = Subscription.start(
                turn.session_id, output, base_url, "session", turn.session_id
            )
        for subscription in self.sessions.values():
            _wait(subscription.opened, _CALL_TIMEOUT_S)

    def close_sessions(self) -> None:
        for subscription in self.sessions.values():
            subscription.process.kill()
            subscription.process.wait(timeout=10)
        self.sessions.clear()

    def detach(self, watchers: Watchers) -> None:
        """Close a watched round's TUI and page: each round's usage is then measured with the
        same clients open (the whole soak's follower)."""
        pane = int(self.terminals.tmux("list-panes", "-t", watchers.tui.name, "-F", "#{pane_pid}").split()[0])
        kill_tree(pane)  # the TUI outlives a hang-up: its tmux session ends with it
        self.pages.close(watchers.page)


def _wait(check: Callable[[], bool | None], timeout: float) -> bool:
    """Whether `check` passes within `timeout` (the verdict is the caller's, with what it saw)."""
    deadline = time.monotonic() + timeout
    while check() is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
    return True


def v1_told(follower: Subscription, since: int, observed: Observed | None, turn: Turn) -> list[str]:
    """What `/global/event` told of a v1 session after line `since`: its statuses, `settled <part>`
    for each part it was told failed, `answering`/`answered` for each newer assistant message."""
    events = [line["event"] for line in follower.lines()[since:] if "event" in line]
    story = []
    for event in events:
        kind, properties = event_kind(event)
        part = properties.get("part") or {}
        if kind == PART_UPDATED and part.get("sessionID") == turn.session_id:
            if part.get("state", {}).get("status") == "error":
                story.append(f"settled {part['id']}")
        elif kind in (SESSION_STATUS, SESSION_IDLE) and properties.get("sessionID") == turn.session_id:
            story.append("idle" if kind == SESSION_IDLE else properties["status"]["type"])
    if observed is not None:
        story += [s for s in v1_story(events, observed) if s.startswith("answer")]
    return story


def v1_problems(story: list[str], calls: list[str], *, answered: bool) -> list[str]:
    """Why a v1 session's story is not complete: each interrupted call told settled, the session
    last told idle, and (`answered`) a resumed turn's answer told."""
    problems = [f"never told {call} settled" for call in calls if f"settled {call}" not in story]
    statuses = [s for s in story if s in ("idle", "busy", "retry")]
    if not statuses or statuses[-1] != "idle":
        problems.append(f"last told {statuses[-1] if statuses else 'nothing'}, not idle")
    if answered and "answered" not in story:
        problems.append("never told the resumed turn's answer")
    return problems


def v2_problems(subscription: Subscription, calls: list[str], *, resumed: bool) -> list[str]:
    """Why a v2 session's own stream is not complete: each interrupted call told failed, and a
    resumed turn's last prompt followed by a step that ends the turn."""
    kinds = [event_kind(event) for event in subscription.events()]
    failed = {data.get("callID") for kind, data in kinds if kind == TOOL_FAILED}
    problems = [f"never told {call} failed" for call in calls if call not in failed]
    if resumed:
        admitted = [i for i, (kind, _) in enumerate(kinds) if kind == PROMPT_ADMITTED]
        ended = [
            i
            for i, (kind, data) in enumerate(kinds)
            if kind == STEP_ENDED and data.get("finish") != STEP_CALLS_TOOLS
        ]
        if not admitted or not ended or ended[-1] < admitted[-1]:
            problems.append(f"the resumed turn's end never told: {[kind for kind, _ in kinds]}")
    return problems


def watched_problems(clients: Clients, watchers: Watchers, *, resumed: bool) -> list[str]:
    """What the TUI and the page open across the round show: the resumed turn answered (or, the
    proxy having died with it, the call settled), nothing busy, and the TUI quiet."""
    problems = []
    check = resumed_on_screen if resumed else shows_settled
    seen = watch({watchers.tui: check})[watchers.tui.name]
    if not check(seen.screen) or seen.idle_bytes > IDLE_LIMIT_BYTES:
        problems.append(f"the TUI: {seen.report()}")
    shows: Callable[[Seen], bool] = resumed_on_page if resumed else Seen.is_settled
    page = clients.pages
    _wait(lambda: True if shows(page.look(watchers.page, watchers.part_id)) else None, _PAGE_SETTLE_TIMEOUT_S)
    shot = clients.root / f"{watchers.tui.name}-after.png"
    page.shot(watchers.page, shot)
    final = page.look(watchers.page, watchers.part_id)
    if not (shows(final) and final.watched):
        problems.append(f"the web UI page ({shot}): {final.report()}")
    return problems
