"""Headless Chromium for the integration suite, driven over the Chrome DevTools Protocol with aiohttp.

Debian's `chromium` and one WebSocket are enough to open a page, read its DOM and take a
screenshot, so the suite needs no Playwright browser download, no chromedriver and no new Python
dependency. One `Chromium` is one browser process in its own process group with a fresh profile;
`close()` SIGKILLs the whole group, so a failing test leaves no renderer behind. Each page gets a
browser context of its own (like a separate incognito window): two pages of the same origin share
no storage, so one page cannot warm another's state.

Every call is bounded: the launch, each protocol command, and the process's exit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

WINDOW = (1400, 900)
"""A fixed window size, so screenshots compare across runs."""

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    "--remote-debugging-port=0",
)
"""`--no-sandbox` because CI runs as root; the `--disable-*` flags keep the browser off the network
except for the pages it is sent to. Port 0 lets Chromium pick a free loopback port and write it
to `DevToolsActivePort` in the profile, so there is no bind race with other tests."""

_LAUNCH_TIMEOUT_S = 20.0
_COMMAND_TIMEOUT_S = 15.0
_EXIT_TIMEOUT_S = 10.0
_LOG_TAIL_CHARS = 2000


def chromium_binary() -> str:
    """Chromium from PATH; fail clearly (never skip) when it is missing."""
    found = shutil.which("chromium")
    if found is None:
        raise FileNotFoundError("chromium not found: install it (Debian package `chromium`, as .ci/run does)")
    return found


class CdpError(RuntimeError):
    """Chromium answered a protocol command with an error, or a page script threw."""


class Page:
    """One tab, addressed through its flattened DevTools session."""

    def __init__(self, browser: Chromium, session_id: str) -> None:
        self._browser = browser
        self._session_id = session_id

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one protocol command to this tab and return its result."""
        return await self._browser.call(method, params, session_id=self._session_id)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page, as JSON (a throw raises `CdpError`)."""
        reply = await self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in reply:
            raise CdpError(f"page script failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        """Save what the tab shows as a PNG."""
        reply = await self.call("Page.captureScreenshot", {"format": "png"})
        await asyncio.to_thread(path.write_bytes, base64.b64decode(reply["data"]))


class Chromium:
    """A headless Chromium under `root` (profile and log); use it as an async context manager."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._process: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Chromium:
        try:
            await self._launch()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def log_path(self) -> Path:
        """Chromium's stdout and stderr, for post-mortems."""
        return self._root / "chromium.log"

    async def open(self, url: str) -> Page:
        """A new tab in a fresh browser context, navigated to `url` (returns once the page is committed)."""
        context = await self.call("Target.createBrowserContext")
        target = await self.call(
            "Target.createTarget", {"url": "about:blank", "browserContextId": context["browserContextId"]}
        )
        attached = await self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        navigated = await page.call("Page.navigate", {"url": url})
        if navigated.get("errorText"):
            raise CdpError(f"navigating to {url} failed: {navigated['errorText']}")
        return page

    async def call(
        self, method: str, params: dict[str, Any] | None = None, *, session_id: str | None = None
    ) -> dict[str, Any]:
        """Send one protocol command (to the browser, or to the tab of `session_id`) and await its reply."""
        if self._socket is None:
            raise RuntimeError("chromium is not running")
        command_id = next(self._ids)
        message: dict[str, Any] = {"id": command_id, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = reply
        try:
            async with asyncio.timeout(_COMMAND_TIMEOUT_S):
                await self._socket.send_json(message)
                return await reply
        finally:
            self._pending.pop(command_id, None)

    async def close(self) -> None:
        """Kill the browser's process group, then drop the connection; idempotent.

        Killing first makes the WebSocket close at once instead of waiting for a closing handshake
        from a browser that may be stuck.
        """
        process, self._process = self._process, None
        try:
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                async with asyncio.timeout(_EXIT_TIMEOUT_S):
                    await process.wait()
        finally:
            await self._disconnect()

    async def _disconnect(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._socket is not None:
            await self._socket.close()
            self._socket = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _launch(self) -> None:
        profile = self._root / "profile"
        profile.mkdir(parents=True)
        with self.log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                chromium_binary(),
                *FLAGS,
                f"--user-data-dir={profile}",
                "about:blank",
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = await self._debugger_url(profile / "DevToolsActivePort")
        self._http = aiohttp.ClientSession()
        # Screenshots arrive as one base64 message of several megabytes.
        self._socket = await self._http.ws_connect(
            url, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=5.0)
        )
        self._reader = asyncio.create_task(self._read(self._socket))

    async def _debugger_url(self, port_file: Path) -> str:
        """The browser's WebSocket address, once Chromium has written it (`<port>\\n<path>`)."""
        deadline = time.monotonic() + _LAUNCH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is not None and self._process.returncode is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode}:\n{self._log_tail()}")
            with contextlib.suppress(FileNotFoundError):
                lines = (await asyncio.to_thread(port_file.read_text)).split()
                if len(lines) == 2 and lines[0].isdigit():
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            await asyncio.sleep(0.05)
        raise RuntimeError(
            f"chromium wrote no {port_file.name} in {_LAUNCH_TIMEOUT_S:.0f}s:\n{self._log_tail()}"
        )

    async def _read(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        """Hand each reply to the command waiting for it; events are not subscribed to, so few arrive."""
        try:
            async for frame in socket:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                message = frame.json()
                reply = self._pending.get(message.get("id", -1))
                if reply is None or reply.done():
                    continue
                if "error" in message:
                    reply.set_exception(CdpError(str(message["error"])))
                else:
                    reply.set_result(message.get("result", {}))
        finally:
            for reply in self._pending.values():
                if not reply.done():
                    reply.set_exception(ConnectionError("the DevTools connection to chromium closed"))

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        except FileNotFoundError:
            return "(no log)"
