"""The real `opencode serve` as a test fixture: start, crash (SIGKILL with all tools), restart, stop.

One instance owns one root directory holding fresh XDG data/state/cache dirs and the project
directories (the config dir is shared by the test run, see `opencode_config`). The dirs
survive `crash()`/`restart()`, which is the point: the restarted server reads the same SQLite
store and shows what the crash left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from .http_client import free_port, request, with_credentials
from .opencode_config import opencode_environment, project_config
from .polling import poll
from .proctree import descendants, kill_tree

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = "node_modules/opencode-ai/bin/opencode.exe"
"""Where the pinned `opencode-ai@1.18.33` puts its binary (`node_modules/.bin/opencode` is 2.1.2's:
both packages name their command `opencode`)."""

_READY_TIMEOUT_S = 60.0
_WARMUP_REQUEST_TIMEOUT_S = 15.0
_EXPORT_TIMEOUT_S = 60.0
_EXPORT_ATTEMPTS = 5
_EXPORT_RETRY_DELAY_S = 0.5
_LOG_TAIL_CHARS = 3000


def opencode_binary() -> Path:
    """The binary from `OPENCODE_BIN`, else the repo's npm install; fail clearly when it is missing."""
    configured = Path(os.environ.get("OPENCODE_BIN", DEFAULT_BINARY))
    binary = configured if configured.is_absolute() else REPO_ROOT / configured
    if not binary.exists():
        raise FileNotFoundError(
            f"opencode binary not found at {binary}: run `npm install opencode-ai@1.18.33` in the "
            "repo root or set OPENCODE_BIN"
        )
    return binary


def directory_header(directory: Path) -> dict[str, str]:
    """The header opencode's clients use to pick the per-directory instance of a request."""
    return {"x-opencode-directory": quote(str(directory), safe="")}


class OpencodeServer:
    """A real `opencode serve` on a fixed loopback port, whose data outlives crashes."""

    def __init__(
        self,
        binary: Path,
        root: Path,
        model_base_url: str,
        *,
        password: str | None = None,
        supervised: Sequence[str] | None = None,
    ) -> None:
        self._binary = binary
        self._supervised = supervised
        """Proxy options: started as `settle-proxy run OPTIONS -- opencode serve …`, and `url` and
        `pid` are then the proxy's. None: the server alone."""
        self._root = root
        self._model_base_url = model_base_url
        self._password = password
        self._port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._projects: list[Path] = []
        self.project = self.add_project("main")

    @property
    def origin(self) -> str:
        """Base URL without a trailing slash or credentials; it stays the same across restarts."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def url(self) -> str:
        """The base URL a client of this server uses: `origin`, with the credentials when it has a
        password (`http_client` sends them as Basic auth, user `opencode` as opencode defaults to)."""
        if self._password is None:
            return self.origin
        return with_credentials(self.origin, "opencode", self._password)

    @property
    def pid(self) -> int:
        """The server's process id (its tools are its descendants)."""
        return self._require_process().pid

    @property
    def database(self) -> Path:
        """opencode's SQLite store: `$XDG_DATA_HOME/opencode/opencode.db` of this server's environment."""
        return self._root / "xdg" / "data" / "opencode" / "opencode.db"

    @property
    def state_home(self) -> Path:
        """`$XDG_STATE_HOME` of this server's environment (and of a proxy it runs under)."""
        return self._root / "xdg" / "state"

    @property
    def log_path(self) -> Path:
        """Combined `--print-logs` output of every run, for post-mortems."""
        return self._root / "serve.log"

    def add_project(self, name: str) -> Path:
        """Create a project directory whose opencode.json points at the mock model; warm it if running.

        Each directory is its own opencode instance: without the warm-up its first v2 prompt fails
        with `Model unavailable: mock/m`. Servers built on one root share its projects and its
        database: two processes on one `opencode.db`, each on a port of its own.
        """
        directory = self._root / "projects" / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "opencode.json").write_bytes(orjson.dumps(project_config(self._model_base_url)))
        self._projects.append(directory)
        if self._process is not None:
            self._warm_project(directory)
        return directory

    def start(self) -> None:
        """Start the server and return once every project can take v1 and v2 prompts."""
        if self._process is not None:
            raise RuntimeError("opencode is already running")
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    *(
                        (sys.executable, "-m", "proxy", "run", *self._supervised, "--")
                        if self._supervised is not None
                        else ()
                    ),
                    str(self._binary),
                    "serve",
                    "--port",
                    str(self._port),
                    "--hostname",
                    "127.0.0.1",
                    "--print-logs",
                ],
                cwd=self.project,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready()

    def crash(self) -> None:
        """SIGKILL the server and every descendant (tools run in their own process groups)."""
        process = self._require_process()
        kill_tree(process.pid)
        process.wait(timeout=10)
        self._process = None

    def kill_server_only(self) -> set[int]:
        """SIGKILL the server's own process, as the OOM killer does, and return its tools' pids:
        they run on (each in its own process group), now children of whatever adopts them."""
        process = self._require_process()
        tools = descendants(process.pid)
        process.kill()
        process.wait(timeout=10)
        self._process = None
        return tools

    def restart(self) -> None:
        """Start again on the same port and data dirs, as a supervisor would after a crash."""
        self.start()

    def stop(self) -> None:
        """End the server and its tools; idempotent, so it is safe in any teardown.

        A graceful SIGTERM would buy nothing here: it leaves tools orphaned and parts `running` too.
        """
        if self._process is not None:
            self.crash()

    def export(self, session_id: str) -> Any:
        """`opencode export <session>` with this server's XDG dirs, parsed; works with the server up or down.

        Measured on 1.18.33: the CLI reads the database itself (no server needed, any working
        directory), prints `Exporting session: <id>` on stderr and the JSON on stdout, and exits 0.
        It does not wait for a lock held by another opencode process: in one CI run, three exports
        started side by side right after a SIGKILL, one exited 1 with `database is locked`. A locked
        start is tried again after a pause; any other failure fails the test at once.
        """
        for attempt in range(1, _EXPORT_ATTEMPTS + 1):
            done = subprocess.run(
                [str(self._binary), "export", session_id],
                cwd=self.project,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_EXPORT_TIMEOUT_S,
                check=False,
            )
            if done.returncode == 0:
                return orjson.loads(done.stdout)
            if b"database is locked" not in done.stderr or attempt == _EXPORT_ATTEMPTS:
                break
            time.sleep(_EXPORT_RETRY_DELAY_S * attempt)
        raise AssertionError(
            f"opencode export {session_id} -> {done.returncode} (attempt {attempt}): {done.stderr[-500:]!r}"
        )

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("opencode is not running")
        return self._process

    def _environment(self) -> dict[str, str]:
        env = opencode_environment(self._root)
        if self._supervised is not None:
            env["PYTHONPATH"] = str(REPO_ROOT)
        if self._password is not None:
            env["OPENCODE_SERVER_PASSWORD"] = self._password
        return env

    def wait_ready(self) -> None:
        """Health first, then load the main instance, then each project's provider (after `start`,
        and after a supervising proxy started the server again, before the next v2 prompt).

        Health answers before the project is loaded, and a request sent the instant the port opens
        can hang for good (seen under `run` on a loaded machine: `/config` unanswered for 30 s while
        the server went on booting; `/api/provider/mock` past 5 s): every request here has a
        timeout, and is sent again until one is answered.
        """
        try:
            poll(
                self._healthy,
                what=f"opencode health on {self.origin}",
                timeout=_READY_TIMEOUT_S,
                interval=0.25,
            )
            for path in ("/config", "/api/location"):
                poll(partial(self._answers, path), what=f"GET {path}", timeout=_READY_TIMEOUT_S)
            for directory in self._projects:
                self._warm_project(directory)
        except Exception as err:
            raise RuntimeError(f"opencode did not become ready; log tail:\n{self._log_tail()}") from err

    def _answers(self, path: str, headers: dict[str, str] | None = None) -> bool | None:
        """Whether `path` is answered 200 in time (None: not yet, ask again)."""
        try:
            reply = request("GET", f"{self.url}{path}", headers=headers, timeout=_WARMUP_REQUEST_TIMEOUT_S)
        except TimeoutError:
            return None
        return True if reply.status == 200 else None

    def _healthy(self) -> bool | None:
        process = self._require_process()
        if process.poll() is not None:
            raise RuntimeError(f"opencode exited with {process.returncode}")
        try:
            reply = request("GET", f"{self.url}/global/health", timeout=2.0)
        except OSError:
            return None
        return True if reply.status == 200 else None

    def _warm_project(self, directory: Path) -> None:
        """Boot the directory's instance and wait until its `mock` provider is loaded."""
        headers = directory_header(directory)
        for path in ("/api/location", "/api/provider/mock"):
            answers = partial(self._answers, path, headers)
            poll(answers, what=f"{path} in {directory}", timeout=_READY_TIMEOUT_S, interval=0.25)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        except FileNotFoundError:
            return "(no log)"


@contextmanager
def running_opencode(
    root: Path, model_base_url: str, *, password: str | None = None, supervised: Sequence[str] | None = None
) -> Iterator[OpencodeServer]:
    """A started server with its data under `root`, stopped with all its tools however the block ends."""
    server = OpencodeServer(opencode_binary(), root, model_base_url, password=password, supervised=supervised)
    try:
        server.start()
        yield server
    finally:
        server.stop()
