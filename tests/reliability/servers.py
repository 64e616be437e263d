"""Run the proxy (in-process or as `python -m proxy`) and fake upstreams on loopback, and stop them.

The subprocess is the proxy as deployed, and the only honest subject for leak checks: its
file descriptors and memory are its own. The in-process variant serves tests that need to
reach inside (timeouts set on the app) and runs with `handler_cancellation=True`, as the CLI
does, so a client that goes away cancels its handler exactly as in production.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from yarl import URL

from tests.integration.http_client import free_port
from tests.integration.opencode_server import REPO_ROOT

_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 10.0
_LOG_TAIL_CHARS = 3000


class ProxySubprocess:
    """`python -m proxy` in front of `upstream` on a free loopback port; `flags` are passed on."""

    def __init__(self, upstream: URL, log_path: Path, *flags: str) -> None:
        self._port = free_port()
        self._command = ["-m", "proxy", "--upstream", str(upstream), "--port", str(self._port), *flags]
        self._log_path = log_path
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> URL:
        return URL(f"http://127.0.0.1:{self._port}")

    @property
    def pid(self) -> int:
        return self._running().pid

    async def start(self) -> None:
        """Launch and return once the port accepts connections (the proxy is then serving)."""
        with self._log_path.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                *self._command,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = asyncio.get_running_loop().time() + _START_TIMEOUT_S
        while not await _accepts(self._port):
            if not self.alive() or asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"proxy did not start; log tail:\n{self.log()[-_LOG_TAIL_CHARS:]}")
            await asyncio.sleep(0.05)

    def alive(self) -> bool:
        """Whether the process still runs (a crash under load must fail the test)."""
        return self._running().returncode is None

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time; idempotent."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await asyncio.wait_for(process.wait(), _STOP_TIMEOUT_S)

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")

    def _running(self) -> asyncio.subprocess.Process:
        if self._process is None:
            raise RuntimeError("proxy is not running")
        return self._process


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


@asynccontextmanager
async def proxy_subprocess(upstream: URL, log_path: Path, *flags: str) -> AsyncIterator[ProxySubprocess]:
    """A started `ProxySubprocess`, stopped on exit whatever happened."""
    proxy = ProxySubprocess(upstream, log_path, *flags)
    try:
        await proxy.start()
        yield proxy
    finally:
        await proxy.stop()


@asynccontextmanager
async def serve(app: web.Application, port: int = 0, *, cancel_handlers: bool = True) -> AsyncIterator[URL]:
    """Serve `app` on 127.0.0.1 (a kernel-chosen port unless given) until the block ends.

    `cancel_handlers=False` is aiohttp's default, which an application embedding the proxy
    with `mount()` may well run with: a client that leaves is then noticed only on a write.
    """
    runner = web.AppRunner(app, handler_cancellation=cancel_handlers, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        host, bound = runner.addresses[0][:2]
        yield URL(f"http://{host}:{bound}")
    finally:
        await runner.cleanup()
