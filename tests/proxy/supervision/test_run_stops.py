"""How `settle-proxy run` ends, as a user sees it from a terminal: a server that never starts is
one line and no restart loop; Ctrl-C reaches the proxy only, which stops the server in its own
order (SIGTERM), and a second Ctrl-C stops at once; each stop (the plain proxy's too) ends with
one line saying so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from proxy.supervision.server_command import free_loopback_port
from tests.integration.polling import poll
from tests.proxy.conftest import settle_proxy
from tests.proxy.supervision.test_run import FAKE_SERVER, alive, running, serving

PROGRAM = Path(sys.executable).name
"""The prefix of the server's own lines: its program's name."""


def test_a_server_that_exits_before_it_answers_is_not_restarted() -> None:
    with running("--", sys.executable, FAKE_SERVER, "--exit", "3") as (proxy, _):
        assert proxy.wait(timeout=60) == 1
        log = proxy.log()
    (gave_up,) = [line for line in log.splitlines() if "before it ever answered" in line]
    assert "WARNING" in gave_up
    assert "server exit status 3 before it ever answered on its port: a failed start" in gave_up
    assert "restarting in" not in log  # no restart was attempted
    assert log.count("INFO proxy.supervision.supervisor: starting ") == 1
    assert "Traceback" not in log
    assert "cannot be reached" not in log  # nothing said of a server not yet started


def test_a_program_that_cannot_be_run_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    script = tmp_path / "server"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    result = settle_proxy("run", "--", str(script), "serve")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"settle-proxy run: error: cannot start the server: {script}: not executable (chmod +x {script})"
    ]


def test_a_program_the_system_cannot_run_is_a_failed_start_with_its_status(tmp_path: Path) -> None:
    """Executable, but no program (no `#!`, no binary): exec refuses it once the server starts."""
    garbage = tmp_path / "server"
    garbage.write_bytes(b"\x00\x01\x02 not a program\n")
    garbage.chmod(0o755)
    with running("--", str(garbage), "serve") as (proxy, _):
        assert proxy.wait(timeout=60) == 1
        log = proxy.log()
    assert f"server| cannot start {garbage}: Exec format error" in log
    assert "server exit status 126 before it ever answered on its port" in log
    assert "Traceback" not in log
    assert "restarting in" not in log


def test_ctrl_c_stops_the_server_with_sigterm_from_the_proxy_not_the_terminals_sigint(
    tmp_path: Path,
) -> None:
    signals = tmp_path / "signals"
    with running("--", sys.executable, FAKE_SERVER, "--signals", str(signals)) as (proxy, port):
        server = serving(port, state="running")["server"]["pid"]
        os.killpg(proxy.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: its whole foreground group
        assert proxy.wait(timeout=60) == 0
        log = proxy.log()
    assert signals.read_text() == "SIGTERM\n"
    said = [line.split(": ", 1)[1] for line in log.splitlines() if " INFO proxy" in line]
    order = ["SIGINT: stopping", f"stopping the server, pid {server}: SIGTERM", "stopped on SIGINT in"]
    found = [next(i for i, line in enumerate(said) if line.startswith(text)) for text in order]
    assert found == sorted(found), said
    (stopped,) = [line for line in said if line.startswith("stopped on SIGINT in")]
    assert f"the server (pid {server}, SIGTERM" in stopped
    # The server's own lines are told apart by its program's name; the proxy names the address to use.
    assert f"{PROGRAM}| listening on http://127.0.0.1:" in log
    assert f"clients use http://127.0.0.1:{port})" in log
    assert "cannot be reached" not in log


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    signals = tmp_path / "signals"
    arguments = ("--", sys.executable, FAKE_SERVER, "--signals", str(signals), "--stay")  # ignores SIGTERM
    with running(*arguments) as (proxy, port):
        server = serving(port, state="running")["server"]["pid"]
        os.killpg(proxy.pid, signal.SIGINT)
        poll(lambda: signals.exists() or None, what="the server given SIGTERM", timeout=30)
        os.killpg(proxy.pid, signal.SIGINT)
        assert proxy.wait(timeout=30) == 128 + signal.SIGINT
        log = proxy.log()
    poll(lambda: not alive(server) or None, what="the server SIGKILLed", timeout=10)
    assert "SIGINT again: stopping at once (SIGKILL)" in log
    assert signals.read_text() == "SIGTERM\n"  # never the terminal's SIGINT


def test_run_help_does_not_offer_the_upstream_it_refuses() -> None:
    result = settle_proxy("run", "--help")
    assert result.returncode == 0
    assert "--upstream" not in result.stdout
    assert "SETTLE_UPSTREAM" not in result.stdout


def test_a_plain_proxy_says_it_stopped_on_sigterm(tmp_path: Path) -> None:
    port, output = free_loopback_port(), tmp_path / "proxy.log"
    upstream = f"http://127.0.0.1:{free_loopback_port()}"
    with output.open("ab") as written:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--upstream", upstream, "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=written,
            stderr=subprocess.STDOUT,
        )
    try:
        poll(
            lambda: f"on http://127.0.0.1:{port}" in output.read_text() or None, what="the banner", timeout=30
        )
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(timeout=30) == 0
    finally:
        if proxy.poll() is None:
            proxy.kill()
            proxy.wait()
    (stopped,) = [line for line in output.read_text().splitlines() if "stopped on SIGTERM in" in line]
    assert stopped.endswith(": the proxy")
