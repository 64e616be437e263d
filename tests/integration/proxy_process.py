"""The proxy under test as a subprocess: `python -m proxy --upstream URL --port P [extra flags]`.

Running it as a real process (not an in-process app) tests the CLI and the lifecycle the way it
is deployed, and keeps its event loop and any crash apart from the harness.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from .http_client import free_port, port_open, request
from .opencode_server import REPO_ROOT
from .polling import poll

_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 10.0
_LOG_TAIL_CHARS = 3000
_BACKGROUND_BUSY = "settle_proxy_background_busy "


class ProxyProcess:
    """One proxy process in front of `upstream`, listening on a free loopback port.

    `args` are further command-line flags, such as `("--write-back", "api", "--grace", "0.5")`;
    `environment` is laid over the harness's own (opencode's password is never inherited from it).
    Its state database (`$XDG_STATE_HOME/settle-proxy/processes.db`) lies beside its log.
    """

    def __init__(
        self,
        upstream: str,
        log_path: Path,
        args: Sequence[str] = (),
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self._upstream = upstream
        self._log_path = log_path
        self._args = tuple(args)
        inherited = {
            name: value for name, value in os.environ.items() if not name.startswith("OPENCODE_SERVER_")
        }
        own_state = {"XDG_STATE_HOME": str(log_path.parent / "proxy-state")}
        self._environment = inherited | own_state | dict(environment or {})
        self._port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def environment(self) -> Mapping[str, str]:
        """The environment the proxy runs with."""
        return self._environment

    @property
    def url(self) -> str:
        """Base URL of the proxy, without a trailing slash."""
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        """Launch the proxy and return once its port accepts connections."""
        with self._log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "proxy",
                    "--upstream",
                    self._upstream,
                    "--port",
                    str(self._port),
                    *self._args,
                ],
                cwd=REPO_ROOT,
                env=self._environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        poll(self._listening, what=f"proxy listening on {self.url}", timeout=_START_TIMEOUT_S, interval=0.1)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time; idempotent."""
        process = self._process
        if process is None:
            return
        self._process = None
        if process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_STOP_TIMEOUT_S)

    def _listening(self) -> bool | None:
        if self._process is None:
            raise RuntimeError("proxy is not started")
        if self._process.poll() is not None:
            raise RuntimeError(f"proxy exited with {self._process.returncode}; log tail:\n{self._log_tail()}")
        return True if port_open(self._port) else None

    def log(self) -> str:
        """Everything the proxy has logged so far (it logs every write-back and every skip)."""
        return self._log_path.read_text(errors="replace")

    def _log_tail(self) -> str:
        return self.log()[-_LOG_TAIL_CHARS:]


def wait_all_decided(base_url: str, *, within: float) -> None:
    """Wait until the proxy at `base_url` (with credentials in it if the server wants a password)
    says no confirmation, write-back pass or resume is under way: every decision it was going to
    make about what it was shown is made, and logged. A positive signal, where a pause would
    pass whenever the proxy was merely slow."""

    def decided() -> bool | None:
        reply = request("GET", f"{base_url}/_settle/metrics")
        assert reply.status == 200, reply.body[:300]
        (line,) = [line for line in reply.body.decode().splitlines() if line.startswith(_BACKGROUND_BUSY)]
        return True if float(line.split()[-1]) == 0 else None

    poll(decided, what=f"every decision of the proxy at {base_url}", timeout=within)


def write_back_proxies(upstream: str, database: Path, logs: Path, grace_s: float) -> dict[str, ProxyProcess]:
    """A `--write-back api` and a `--write-back db` proxy in front of one server, by mode, each
    confirming an orphan `grace_s` after it saw it; not started yet (see `running`)."""
    grace = ("--grace", str(grace_s))
    return {
        "api": ProxyProcess(upstream, logs / "api.log", ("--write-back", "api", *grace)),
        "db": ProxyProcess(upstream, logs / "db.log", ("--write-back", "db", "--db", str(database), *grace)),
    }


@contextlib.contextmanager
def running(proxies: Iterable[ProxyProcess]) -> Iterator[None]:
    """Every proxy started; all of them stopped however the block ends."""
    started = list(proxies)
    try:
        for proxy in started:
            proxy.start()
        yield
    finally:
        for proxy in started:
            proxy.stop()
