"""A 2.x server as a process, for the scenes behind the proxy: the stand-in (`serve.py`) everywhere,
or a real `opencode serve` of the 2.x line when `SETTLE_TEST_OPENCODE2` holds its command (a shell
command with `{port}`; it is given the password as `OPENCODE_PASSWORD`, fresh XDG dirs, and a project
whose `opencode.json` points at the mock model). Either is started, SIGKILLed (its process group, as
a crash ends it: the real server's tools run in groups of their own and outlive it, as they do) and
restarted on the same port and data, and leaves a call running: the stand-in by its seed, the real
server by a turn of the mock model (`proxy/demo/model.py`) that calls `shell`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import orjson

from proxy.demo.lines import Line2x
from proxy.demo.model import DEFAULT_COMMAND, MockModel, Plan
from tests.integration.http_client import free_port
from tests.integration.proctree import descendants, kill_tree
from tests.opencode2.auth import basic
from tests.opencode2.stand_in import RunningCall

REAL = "SETTLE_TEST_OPENCODE2"
"""The variable holding another real 2.x server's command (with `{port}`), run instead of the
pinned 2.1.2 (`REAL_2_1_2`)."""
REAL_2_1_2 = "node_modules/@opencode/cli/bin/opencode.exe"
"""Where the pinned `@opencode/cli@2.1.2` puts its linux build's binary (package.json)."""
PASSWORD = "pw"
PROMPT = "run the long command"
"""The prompt the mock model answers with one `shell` call."""
SERVE = str(Path(__file__).parent / "serve.py")
REPO = Path(__file__).resolve().parents[2]
_BOOT_S = 120.0
"""A real server from source boots in 10 to 30 s on a loaded machine."""
_ASK_S = 10.0


def config_2x(model_base_url: str) -> dict[str, Any]:
    """The project `opencode.json` a 2.x server reads (`proxy.demo.lines.Line2x.config`)."""
    return Line2x().config(model_base_url)


def shell_plan(command: str = DEFAULT_COMMAND) -> Plan:
    """One `shell` call of `command`; `timeout: 0` lifts the tool's 2-minute default
    (`packages/core/src/tool/plugin/shell.ts` `Input`, `DEFAULT_TIMEOUT_MS` @2092350cf)."""
    return Plan(tool="shell", arguments={"command": command, "timeout": 0})


class Server2x(ABC):
    """One 2.x server process on a port and data of its own, which outlive a kill."""

    kind: ClassVar[str]

    def __init__(self, root: Path) -> None:
        self.root, self.port, self.password = root, free_port(), PASSWORD
        root.mkdir(parents=True, exist_ok=True)
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": basic(self.password)}

    @property
    @abstractmethod
    def database(self) -> Path:
        """Where the server keeps its sessions (what `--db` names)."""

    @abstractmethod
    async def start(self) -> None:
        """Start, and return once the server answers."""

    async def kill(self) -> None:
        """SIGKILL the server's process group, as a crash ends it."""
        process = self._require()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        self._process = None

    async def restart(self) -> None:
        await self.start()

    async def stop(self) -> None:
        if self._process is not None:
            await self.kill()

    @abstractmethod
    async def running_call(self) -> RunningCall:
        """A call left running in a session of this server."""

    async def get(self, path: str) -> Any:
        """`path` of the server itself, parsed (what it says, with no proxy in between)."""
        async with (
            aiohttp.ClientSession(headers=self.headers) as http,
            http.get(f"{self.url}{path}", timeout=aiohttp.ClientTimeout(total=_ASK_S)) as answer,
        ):
            assert answer.status == 200, (path, answer.status, await answer.text())
            return await answer.json(content_type=None)

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST `body` to the server itself, parsed; anything but 200 fails."""
        async with (
            aiohttp.ClientSession(headers=self.headers) as http,
            http.post(f"{self.url}{path}", json=body, timeout=aiohttp.ClientTimeout(total=_BOOT_S)) as answer,
        ):
            assert answer.status == 200, (path, answer.status, await answer.text())
            return await answer.json(content_type=None)

    async def closed(self, path: str) -> Any:
        """The message `path` names, once the server itself has closed it (`time.completed`)."""
        async with asyncio.timeout(_BOOT_S):
            while True:
                message = (await self.get(path))["data"]
                if "completed" in message["time"]:
                    return message
                await asyncio.sleep(0.25)

    async def version(self) -> str:
        """The version the server reports: `/api/info` (2.0.x), else early 2.0's `/api/health`."""
        for route in ("/api/info", "/api/health"):
            with contextlib.suppress(AssertionError):
                return str((await self.get(route))["version"])
        raise AssertionError(f"{self.url} names no version on /api/info or /api/health")

    def _require(self) -> asyncio.subprocess.Process:
        if self._process is None:
            raise RuntimeError(f"the {self.kind} is not running")
        return self._process


class StandInServer(Server2x):
    """`serve.py`: its first start seeds one session with a running `shell` call a minute old."""

    kind = "stand-in"

    def __init__(self, root: Path, flags: tuple[str, ...] = ()) -> None:
        super().__init__(root)
        self.flags = flags
        """`serve.py`'s flags of a variant (`stand_in.VARIANT_FLAGS`)."""

    @property
    def database(self) -> Path:
        return self.root / "db.json"

    @property
    def seed(self) -> Path:
        return self.root / "seed.json"

    async def start(self) -> None:
        environment = {k: v for k, v in os.environ.items() if "OPENCODE" not in k}
        command = [sys.executable, SERVE, "serve", "--port", str(self.port), "--database", str(self.database)]
        fresh = () if self.database.exists() else ("--seed", str(self.seed))
        self._process = await asyncio.create_subprocess_exec(
            *command,
            *fresh,
            *self.flags,
            stdout=asyncio.subprocess.PIPE,
            env=environment | {"OPENCODE_PASSWORD": self.password},
            start_new_session=True,
        )
        assert self._process.stdout is not None
        assert (await self._process.stdout.readline()).startswith(b"server listening on ")

    async def running_call(self) -> RunningCall:
        return RunningCall(**orjson.loads(self.seed.read_bytes()))


class RealServer(Server2x):
    """The command of `SETTLE_TEST_OPENCODE2`, run by the shell in a project of its own."""

    kind = "real 2.x server"

    def __init__(
        self,
        root: Path,
        command: str,
        model: MockModel,
        *,
        service: bool = False,
        supervised: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(root)
        self.command, self.project = command + (" --service" if service else ""), root / "project"
        if supervised is not None:
            # `settle-proxy run OPTIONS -- <server>`: the proxy takes the port, and `url` is its.
            proxy = shlex.join([sys.executable, "-m", "proxy", "run", *supervised, "--"])
            self.command = f"{proxy} {self.command}"
        if service:
            # `serve --service` takes its password from the service's settings, not the environment
            # (2.1.2, measured: it writes a random one there when there is none).
            settings = root / "xdg" / "config" / "opencode" / "service.json"
            settings.parent.mkdir(parents=True, exist_ok=True)
            settings.write_bytes(orjson.dumps({"password": self.password}))
        self.project.mkdir(exist_ok=True)
        (self.project / "opencode.json").write_bytes(orjson.dumps(config_2x(model.base_url)))
        model.plan(PROMPT, shell_plan())
        self._model = model
        self._tools: set[tuple[int, int, str]] = set()

    @property
    def database(self) -> Path:
        """The first SQLite file in `$XDG_DATA_HOME/opencode` (a build from source calls it
        `opencode-local.db`, after its channel)."""
        found = sorted((self.root / "xdg" / "data" / "opencode").glob("opencode*.db"))
        assert found, f"no database under {self.root / 'xdg' / 'data' / 'opencode'}"
        return found[0]

    def _environment(self) -> dict[str, str]:
        xdg = {
            f"XDG_{name}_HOME": str(self.root / "xdg" / name.lower())
            for name in ("CONFIG", "DATA", "STATE", "CACHE")
        }
        inherited = {k: v for k, v in os.environ.items() if "OPENCODE" not in k and not k.startswith("XDG_")}
        own = {
            "OPENCODE_PASSWORD": self.password,
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "PYTHONPATH": str(REPO),
        }
        return inherited | xdg | own

    async def start(self) -> None:
        with (self.root / "serve.log").open("ab") as log:
            self._process = await asyncio.create_subprocess_shell(
                self.command.format(port=self.port),
                cwd=self.project,
                env=self._environment(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        async with asyncio.timeout(_BOOT_S):
            await self._until_ready()

    async def kill(self) -> None:
        """SIGKILL the group; its tools (each in a group of its own) run on, and are ended at `stop`."""
        group = self._require().pid
        self._tools |= {tool for pid in descendants(group) if (tool := _process(pid)) and tool[1] != group}
        await super().kill()

    async def stop(self) -> None:
        await super().stop()
        for pid, _, started in self._tools:
            if _process(pid) == (pid, pid, started):  # still the tool seen, the leader of its group
                kill_tree(pid)

    async def _until_ready(self) -> None:
        """Health (2.1.2's `/api/info`, measured: its `/api/health` is 404; early 2.0's
        `/api/health`), then the project's instance with its `mock` provider loaded (else a first
        prompt fails with the model unavailable)."""
        location = {"location[directory]": str(self.project)}
        while not any([await self._answers(path, None) for path in ("/api/info", "/api/health")]):
            self._check_alive()
            await asyncio.sleep(0.25)
        for path in ("/api/location", "/api/provider/mock"):
            while not await self._answers(path, location):
                self._check_alive()
                await asyncio.sleep(0.25)

    def _check_alive(self) -> None:
        if self._require().returncode is not None:
            raise RuntimeError(f"{self.command!r} exited: see {self.root / 'serve.log'}")

    async def _answers(self, path: str, params: dict[str, str] | None) -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with (
                aiohttp.ClientSession(headers=self.headers) as http,
                http.get(
                    f"{self.url}{path}", params=params, timeout=aiohttp.ClientTimeout(total=_ASK_S)
                ) as answer,
            ):
                return answer.status == 200
        return False

    async def running_call(self, command: str = DEFAULT_COMMAND) -> RunningCall:
        """A session of the project whose turn runs the mock model's `shell` call of `command`, once
        its view shows the call `running`."""
        prompt = PROMPT if command == DEFAULT_COMMAND else f"{PROMPT}: {command}"
        self._model.plan(prompt, shell_plan(command))
        created = await self.post(
            "/api/session",
            {"location": {"directory": str(self.project)}, "model": {"id": "m", "providerID": "mock"}},
        )
        session = created["data"]["id"]
        await self.post(f"/api/session/{session}/prompt", {"text": prompt})
        async with asyncio.timeout(_BOOT_S):
            while True:
                call = _running(await self.get(f"/api/session/{session}/message"), session)
                if call is not None:
                    return call
                await asyncio.sleep(0.25)


def _process(pid: int) -> tuple[int, int, str] | None:
    """A process's pid, group and start time (`/proc/PID/stat`), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return pid, int(fields[2]), fields[19]


def _running(view: Any, session: str) -> RunningCall | None:
    """The first call a message list shows `running`, if any."""
    for message in view["data"]:
        for item in message.get("content") or []:
            if item.get("type") == "tool" and item.get("state", {}).get("status") == "running":
                return RunningCall(session, message["id"], item["id"])
    return None
