"""`settle-proxy run -- SERVER`, as users start it, with a stand-in server (the real one:
tests/integration/test_run_supervised.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from proxy.supervision import supervisor
from proxy.supervision.server_command import ServerCommand, free_loopback_port
from proxy.supervision.supervisor import ChildState, Restart, Supervisor
from tests.integration.polling import poll
from tests.proxy.conftest import settle_proxy

FAKE_SERVER = str(Path(__file__).parent.parent / "fake_server_command.py")


class Proxy(subprocess.Popen[bytes]):
    """`settle-proxy run` as a user starts it, in a process group of its own as a terminal's job
    is (so that a signal sent to the group is what a terminal's Ctrl-C sends), its output in a file."""

    def __init__(self, arguments: list[str], output: Path) -> None:
        self.output = output
        with output.open("ab") as written:
            super().__init__(
                [sys.executable, "-m", "proxy", "run", *arguments],
                stdin=subprocess.DEVNULL,
                stdout=written,
                stderr=subprocess.STDOUT,
                process_group=0,
            )

    def log(self) -> str:
        return self.output.read_text(errors="replace")


@contextmanager
def running(*arguments: str, port: int | None = None) -> Iterator[tuple[Proxy, int]]:
    """`settle-proxy run [--port P] ARGUMENTS` (the server command after `--`), killed at the end."""
    port = port or free_loopback_port()
    own = [] if "--port" in arguments else ["--port", str(port)]
    with tempfile.TemporaryDirectory() as folder:
        process = Proxy([*own, *arguments], Path(folder) / "proxy.log")
        try:
            yield process, port
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_settle/health", timeout=2) as answer:
            return dict(json.load(answer))
    except urllib.error.HTTPError as refusal:
        return dict(json.load(refusal))
    except OSError:
        return None


def serving(port: int, **expected: object) -> dict[str, Any]:
    """The health of a proxy whose server answers and whose server state has `expected` values."""

    def ready() -> dict[str, Any] | None:
        found = health(port)
        if found is None or not found.get("upstream", {}).get("reachable"):
            return None  # not up, or not yet known to want no password (its details are not shown)
        return found if all(found["server"][key] == value for key, value in expected.items()) else None

    return poll(ready, what=f"the proxy on {port} serving with {expected}", timeout=30)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_crashed_server_is_restarted_and_nothing_outlives_a_stopped_proxy(tmp_path: Path) -> None:
    orphan_file = tmp_path / "orphan"
    with running("--", sys.executable, FAKE_SERVER, "--orphan", str(orphan_file)) as (proxy, port):
        first = serving(port, state="running")["server"]["pid"]
        orphan = int(poll(lambda: orphan_file.read_text() or None, what="the tool's pid", timeout=10))
        os.kill(first, signal.SIGKILL)
        after = serving(port, state="running", restarts=1)
        assert after["server"]["pid"] != first
        assert after["server"]["last_exit"] == "killed by SIGKILL"
        assert after["server"]["next_restart"]["why"].startswith("if it exited now: this start answered")
        assert alive(orphan)
        assert parent_of(orphan) == proxy.pid  # adopted by the proxy, not by PID 1
        second_orphan = int(poll(lambda: orphan_file.read_text() or None, what="the new pid", timeout=10))
        os.kill(after["server"]["pid"], signal.SIGKILL)
        last = serving(port, state="running", restarts=2)
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(timeout=30) == 0
        left = [pid for pid in (last["server"]["pid"], orphan, second_orphan) if alive(pid)]
        assert left == []
        log = proxy.log()
    # Each orphan is listed once, when first found; at the next exit, the one found before is counted.
    assert [log.count(f"orphaned process pid {pid} ") for pid in (orphan, second_orphan)] == [1, 1]
    assert f"1 orphaned process(es) found at an earlier exit still run: pids [{orphan}]" in log
    assert "stopped on SIGTERM in" in log


def test_a_killed_proxy_takes_its_server_down() -> None:
    with running("--", sys.executable, FAKE_SERVER) as (proxy, port):
        server = serving(port, state="running")["server"]["pid"]
        proxy.kill()
        proxy.wait(timeout=10)
        poll(lambda: True if not alive(server) else None, what="the server to die with the proxy", timeout=10)


@pytest.mark.parametrize(("restart", "code"), [("no", 3), ("on-failure", 0)])
def test_a_server_that_is_not_restarted_ends_the_proxy_with_its_status(restart: str, code: int) -> None:
    with running("--restart", restart, "--", sys.executable, FAKE_SERVER, "--exit", str(code)) as (proxy, _):
        assert proxy.wait(timeout=30) == code


def test_the_servers_address_becomes_the_proxys() -> None:
    port = free_loopback_port()
    with running("--", sys.executable, FAKE_SERVER, "--port", str(port), port=port) as (_, _):
        found = serving(port, state="running")
        assert found["upstream"]["url"] != f"http://127.0.0.1:{port}"
        # The server answers on the upstream's port (it was given it); health names its program only.
        assert "command" not in found["server"]
        assert found["server"]["program"] == Path(sys.executable).name


@pytest.mark.parametrize(("restart", "code"), [(Restart.ON_FAILURE, 1), (Restart.ALWAYS, 0)])
async def test_a_restart_storm_is_given_up(
    monkeypatch: pytest.MonkeyPatch, restart: Restart, code: int
) -> None:
    monkeypatch.setattr(supervisor, "BACKOFF_S", (0.01,))
    monkeypatch.setattr(supervisor, "RESTARTS_PER_WINDOW", 3)
    monkeypatch.setattr(supervisor, "become_subreaper", lambda: False)  # not for the test runner itself
    command = ServerCommand.parse([sys.executable, FAKE_SERVER, "--answer-for", "1", "--exit", str(code)])
    child = Supervisor(command, free_loopback_port(), restart)
    exits: list[int] = []
    child.exited.append(lambda: exits.append(child.restarts))
    await child.run()
    assert child.state is ChildState.GAVE_UP
    assert (child.restarts, child.exit_code, child.health()["last_exit"]) == (3, 1, f"exit status {code}")
    assert exits == [0, 1, 2, 3]  # each exit is told, before the restart that follows it


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["opencode", "serve"], ServerCommand(("opencode", "serve"), None, None)),
        (
            ["opencode", "web", "--port", "4096", "--hostname=0.0.0.0", "--cors", "x"],
            ServerCommand(("opencode", "web", "--cors", "x"), 4096, "0.0.0.0"),
        ),
    ],
)
def test_server_command_listening_flags(argv: list[str], expected: ServerCommand) -> None:
    assert ServerCommand.parse(argv) == expected
    assert expected.listening_on(5)[-4:] == ["--port", "5", "--hostname", "127.0.0.1"]


@pytest.mark.parametrize(
    ("argv", "serving"),
    [
        (["opencode", "serve"], True),
        (["/opt/bin/opencode", "--log-level", "DEBUG", "web"], True),
        (["python3", "fake_server.py"], True),
        (["opencode"], False),
        (["node_modules/opencode-ai/bin/opencode.exe", "--print-logs"], False),
    ],
)
def test_an_opencode_command_without_serve_is_named(argv: list[str], serving: bool) -> None:
    why = ServerCommand.parse([*argv, "--port", "4096"]).not_serving()
    assert (why is None) == serving
    if why is not None:
        assert why.startswith(f"`{' '.join(argv)}` names no `serve`: on opencode 1.x it is the TUI")


def test_run_warns_of_an_opencode_command_without_serve(tmp_path: Path) -> None:
    opencode = tmp_path / "opencode"
    opencode.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_SERVER} "$@"\n')
    opencode.chmod(0o755)
    with running("--", str(opencode)) as (proxy, port):
        serving(port)
        warnings = [line for line in proxy.log().splitlines() if line.startswith("settle-proxy run: warning")]
    assert warnings == [
        f"settle-proxy run: warning: `{opencode}` names no `serve`: on opencode 1.x it is the TUI, "
        f"not a server (`{opencode} serve`?)"
    ]


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ([], "the server command goes after `--`"),
        (["--"], "server command: no server command after --"),
        (["--", "opencode", "serve", "--port"], "server command: --port needs a value"),
        (["--", "opencode", "serve", "--port", "x"], "server command: --port must be a port number, got 'x'"),
        (["--upstream", "http://127.0.0.1:1", "--", "opencode"], "--upstream is not for `run`"),
        (["--restart", "sometimes", "--", "opencode"], "argument --restart: invalid choice"),
        (["--", "/no/such/command"], "cannot start the server: /no/such/command: no such file"),
        (["--", "no-such-server-x", "serve"], "cannot start the server: no-such-server-x: not found on PATH"),
    ],
)
def test_a_bad_run_command_gets_one_line(arguments: list[str], complaint: str) -> None:
    result = settle_proxy("run", *arguments)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"settle-proxy run: error: {complaint}")
