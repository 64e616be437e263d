"""`settle-proxy run -- opencode serve` on opencode 2.x, end to end: the stand-in process is the
`opencode` first on PATH. With no password set, the proxy gives the server one of its own, shown
once in the log as 2.x shows its own, kept (mode 0600) and the same after a SIGKILL and restart of
the server and after a restart of the proxy; health names the version of the server that runs now,
also when a restart brings another. A password the user sets is the server's, and nothing is made."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.integration.http_client import free_port, request
from tests.integration.opencode_server import REPO_ROOT
from tests.integration.polling import poll
from tests.opencode2.auth import basic

SERVE = Path(__file__).parent / "serve.py"
SHOWN = "proxy.supervision.supervisor: server password "
"""The proxy's line with the password, in the words 2.x prints its own with (`serve.py`)."""


class Supervised:
    """`python -m proxy run -- opencode serve --port P --hostname 127.0.0.1` in `root`, where
    `opencode` answers `--version` with the version in `root/version` and `serve` by becoming the
    stand-in (of that version, on `root/db.json`)."""

    def __init__(self, root: Path, environment: dict[str, str] | None = None) -> None:
        self.root, self.port, self.log_path = root, free_port(), root / "proxy.log"
        (root / "bin").mkdir(exist_ok=True)
        program = root / "bin" / "opencode"
        program.write_text(
            "#!/bin/sh\n"
            f'version=$(cat "{root / "version"}")\n'
            'if [ "$1" = --version ]; then echo "$version"; exit 0; fi\n'
            f'exec "{sys.executable}" "{SERVE}" "$@" --database "{root / "db.json"}" --version "$version"\n'
        )
        program.chmod(0o700)
        self.set_version("2.1.2")
        inherited = {name: value for name, value in os.environ.items() if "OPENCODE" not in name}
        self.environment = inherited | {
            "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO_ROOT),
            "XDG_STATE_HOME": str(root / "state"),
        }
        self.environment |= environment or {}
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_version(self, version: str) -> None:
        """The version the next start of `opencode` says it is."""
        (self.root / "version").write_text(version)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The proxy started; SIGTERMed after, and its process group SIGKILLed if it outlives that."""
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "proxy", "run", "--", "opencode", "serve", "--port", str(self.port)],
                cwd=REPO_ROOT,
                env=self.environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            yield
        finally:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=20)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self, password: str) -> dict[str, Any] | None:
        """The proxy's health as someone with `password` is shown it; None while it cannot answer."""
        try:
            reply = request("GET", f"{self.url}/_settle/health", headers=_basic(password), timeout=5)
        except OSError:  # not listening yet
            return None
        return dict(reply.json()) if reply.status in (200, 503) else None

    def serving(self, password: str, restarts: int) -> dict[str, Any]:
        """Health, the first time it names the version of a server of start `restarts` (0: the
        first) that answers: a version read before that server ran would show here."""

        def known() -> dict[str, Any] | None:
            found = self.health(password)
            if found is None or found["server"]["restarts"] != restarts:
                return None
            return found if found["upstream"]["reachable"] and "version" in found["upstream"] else None

        return poll(known, what=f"start {restarts} of the server known", timeout=60)

    def following(self, password: str) -> bool | None:
        """Whether the proxy follows the server's event stream."""
        found = self.health(password)
        return True if found is not None and found["liveness"]["source"] == "events" else None


def _basic(password: str) -> dict[str, str]:
    return {"Authorization": basic(password)}


def shown(supervised: Supervised) -> list[str]:
    """Each password the log shows, in order."""
    log = supervised.log().splitlines()
    return [line.partition(SHOWN)[2] for line in log if "server password" in line]


def shown_once(supervised: Supervised) -> str:
    """The password the proxy showed, once it has."""
    (password,) = poll(lambda: shown(supervised) or None, what="the password shown", timeout=30)
    return password


def active(supervised: Supervised, password: str) -> int:
    """The status of a 2.x route through the proxy, asked with `password`."""
    return request("GET", f"{supervised.url}/api/session/active", headers=_basic(password)).status


def test_a_2x_server_keeps_one_password_across_restarts(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path)
    with supervised.running():
        password = shown_once(supervised)
        first = supervised.serving(password, 0)
        assert (first["upstream"]["version"], first["upstream"]["dialect"]) == ("2.1.2", "2.x")
        assert active(supervised, password) == 200
        supervised.set_version("2.1.7")
        os.kill(first["server"]["pid"], signal.SIGKILL)
        after = supervised.serving(password, 1)
        assert (after["upstream"]["version"], after["upstream"]["dialect"]) == ("2.1.7", "2.x")
        assert after["server"]["last_exit"] == "killed by SIGKILL"
        assert after["server"]["pid"] != first["server"]["pid"]
        assert active(supervised, password) == 200
        assert active(supervised, "wrong") == 401
    kept = tmp_path / "state" / "settle-proxy" / "server-password"
    assert kept.read_text() == password
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert shown(supervised) == [password]
    with supervised.running():
        assert supervised.serving(password, 0)["upstream"]["version"] == "2.1.7"
        assert active(supervised, password) == 200
        assert shown(supervised) == [password, password]


def test_health_follows_a_restart_from_an_unknown_version_back_to_2x(tmp_path: Path) -> None:
    """A release past the 2.x line is of that line by its `/api/info` shape, but not one written
    into (`known_version` false); once the server restarts as 2.1.2, it is asked again."""
    supervised = Supervised(tmp_path)
    supervised.set_version("3.0.0")
    with supervised.running():
        password = shown_once(supervised)
        first = supervised.serving(password, 0)
        assert (first["upstream"]["version"], first["upstream"]["known_version"]) == ("3.0.0", False)
        supervised.set_version("2.1.2")
        os.kill(first["server"]["pid"], signal.SIGKILL)
        after = supervised.serving(password, 1)["upstream"]
        assert (after["version"], after["dialect"], after["known_version"]) == ("2.1.2", "2.x", True)
        poll(lambda: supervised.following(password), what="the restarted 2.x followed", timeout=60)


def test_a_password_the_user_sets_is_the_servers_and_nothing_is_made(tmp_path: Path) -> None:
    supervised = Supervised(tmp_path, {"OPENCODE_PASSWORD": "mine"})
    with supervised.running():
        assert supervised.serving("mine", 0)["upstream"]["version"] == "2.1.2"
        assert active(supervised, "mine") == 200
    assert shown(supervised) == []
    assert not (tmp_path / "state" / "settle-proxy" / "server-password").exists()
