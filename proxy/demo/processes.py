"""The processes the demo starts: opencode in data directories of its own, the proxy in front of
it, and what a crash of opencode leaves running.

Each runs in a session of its own, so a Ctrl-C reaches the demo alone, which then stops them in
order; each is started through `proxy.system.die_with_parent`, so they die with the demo even if it
is killed. A crash is a SIGKILL of the server's process group: its tools run in groups of their own
and live on, as after a real crash (that is what a client must not be told runs); the demo names
them as it kills the server and ends them when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from proxy.demo.client import Client, Failed, until
from proxy.demo.lines import Line, Request
from proxy.system.procfs import pids, stat

READY_S = 180.0
"""A first 1.x start npm-installs its plugin (about 64 MB) before it answers."""
STOP_S = 10.0
VERSION_WITHIN_S = 30.0
_PASSWORD = ("OPENCODE_PASSWORD", "OPENCODE_SERVER_PASSWORD")


def environment(root: Path, password: str) -> dict[str, str]:
    """This environment without opencode's or the proxy's own variables, with XDG directories and a
    temporary directory under `root` (nothing of the user's is read, nothing is left behind: opencode
    writes a log and its runtime's files even for `--version`), no auto-update, and the password
    under both its names (2.x reads the first, 1.x the second)."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OPENCODE", "SETTLE_", "XDG_")) and name != "TMPDIR"
    }
    xdg = {
        f"XDG_{name}_HOME": str(root / "xdg" / name.lower()) for name in ("CONFIG", "DATA", "STATE", "CACHE")
    }
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    own = {"TMPDIR": str(root / "tmp"), "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    return kept | xdg | own | dict.fromkeys(_PASSWORD, password)


def version_of(program: str) -> str | None:
    """What `program --version` prints, run in directories of its own; None when it fails."""
    with tempfile.TemporaryDirectory(prefix="settle-proxy-demo-") as directory:
        try:
            answer = subprocess.run(
                [program, "--version"],
                env=environment(Path(directory), ""),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=VERSION_WITHIN_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
    return answer.stdout.strip() if answer.returncode == 0 else None


class Child:
    """One process of the demo's, its output in a log file."""

    def __init__(self, argv: list[str], cwd: Path, env: Mapping[str, str], log: Path) -> None:
        self._argv, self._cwd, self._env, self.log = argv, cwd, env, log
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "proxy.system.die_with_parent",
                str(os.getpid()),
                *self._argv,
                cwd=self._cwd,
                env=dict(self._env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def signal_group(self, signum: int) -> None:
        """Signal the child's whole process group and wait for the child to end (a SIGTERM not
        obeyed within `STOP_S` is followed by SIGKILL)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            await asyncio.wait_for(process.wait(), STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    def tail(self, lines: int = 15) -> str:
        """The last lines the child wrote, for an error that says why it did not come up."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Opencode:
    """`opencode serve` on one loopback port and one project, started again on the same data."""

    def __init__(self, binary: str, line: Line, root: Path, port: int, env: Mapping[str, str]) -> None:
        self.line, self.project, self.origin = line, root / "project", f"http://127.0.0.1:{port}"
        argv = [binary, "serve", "--port", str(port), "--hostname", "127.0.0.1", "--print-logs"]
        self._child = Child(argv, self.project, env, root / "opencode.log")
        self.left_behind: list[tuple[int, int]] = []
        """(pid, start time) of each process a crash left running: ended at `stop`."""

    async def start(self, client: Client) -> None:
        """Start, and return once a first prompt would run: health, then the warm-up."""
        await self._child.start()
        try:
            health = Request("GET", self.line.health)
            for request in (health, *self.line.warm_up(self.project)):
                asked = partial(self._answered, client, request)
                await until(asked, what=f"opencode answering GET {request.path}", within=READY_S)
        except Failed as error:
            raise Failed(f"{error}; its last lines:\n{self._child.tail()}") from None

    def apart(self) -> list[tuple[int, int]]:
        """(pid, start time) of each process below the server in a group of its own: its tools'."""
        if (server := self._child.pid) is None:
            return []
        return [(pid, started) for pid, (group, started) in _below(server).items() if group != server]

    async def crash(self) -> None:
        """SIGKILL the server's process group; what runs in other groups below it lives on."""
        self.left_behind += self.apart()
        await self._child.signal_group(signal.SIGKILL)

    async def stop(self) -> None:
        """The server, then every process a crash left behind that still is the one it left."""
        await self.crash()
        for pid, started in self.left_behind:
            if (now := stat(pid)) is not None and now.started == started and now.state != "Z":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(now.group, signal.SIGKILL)

    async def _answered(self, client: Client, request: Request) -> bool | None:
        if not self._child.alive():
            raise Failed("opencode exited")
        return True if await client.answers(self.origin, request) else None


class Proxy:
    """`settle-proxy --upstream … --grace 0` on a loopback port of its own."""

    def __init__(self, upstream: str, root: Path, port: int, env: Mapping[str, str]) -> None:
        self.origin = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "proxy", "--upstream", upstream, "--port", str(port), "--grace", "0"]
        self._child = Child(argv, root, env, root / "proxy.log")

    async def start(self, client: Client) -> None:
        """Start, and return once it follows the server's event stream (it then sees the call open)."""
        await self._child.start()
        try:
            following = partial(self._following, client)
            await until(following, what="the proxy following opencode", within=READY_S)
        except Failed as error:
            raise Failed(f"{error}; its last lines:\n{self._child.tail()}") from None

    async def stop(self) -> None:
        await self._child.signal_group(signal.SIGTERM)

    async def _following(self, client: Client) -> bool | None:
        if not self._child.alive():
            raise Failed("the proxy exited")
        try:
            status, health = await client.ask(self.origin, Request("GET", "/_settle/health"), within=5.0)
        except Failed:
            return None
        following = status == 200 and health["liveness"]["event_stream"] == "following"
        return True if following else None


def _below(root: int) -> dict[int, tuple[int, int]]:
    """Every process below `root`, with its process group and start time."""
    seen = {pid: found for pid in pids() if (found := stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, found in seen.items():
        children.setdefault(found.parent, []).append(pid)
    below: dict[int, tuple[int, int]] = {}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in below:
                below[child] = (seen[child].group, seen[child].started)
                stack.append(child)
    return below
