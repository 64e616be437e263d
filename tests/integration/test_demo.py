"""`settle-proxy demo` against the real servers, as a user runs it: the pinned 1.18.33 and 2.1.2.

It must show the call running directly and interrupted through the proxy, exit 0, and leave
nothing it started running: no process works in (or names) the directory its data was kept in,
neither the servers and the proxy nor the call's `sleep`, which the crash left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.system.procfs import command_line, pids

from .opencode_server import REPO_ROOT, opencode_binary

pytestmark = pytest.mark.integration

BINARY_2_1_2 = REPO_ROOT / "node_modules/@opencode/cli/bin/opencode.exe"
DEMO_S = 300.0
"""A first 1.x start npm-installs its plugin before it answers: tens of seconds."""
INTERRUPTED = {
    "1.18.33": "error: Tool execution aborted",
    "2.1.2": "error: Tool execution interrupted: shell",
}


def _binary(version: str) -> Path:
    binary = opencode_binary() if version == "1.18.33" else BINARY_2_1_2
    assert binary.exists(), f"{binary} is missing: run `npm ci` in the repo root"
    return binary


def _working_in(directory: Path) -> list[str]:
    """Every process whose working directory or command line is under `directory`."""
    found = []
    for pid in pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        command = command_line(pid)
        if cwd.startswith(str(directory)) or str(directory) in command:
            found.append(f"{pid} ({cwd}): {command}")
    return found


@pytest.mark.parametrize("version", ["1.18.33", "2.1.2"])
def test_the_demo_shows_the_call_running_directly_and_interrupted_through_the_proxy(
    version: str, tmp_path: Path
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    environment = {name: value for name, value in os.environ.items() if not name.startswith("OPENCODE")}
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "--opencode", str(_binary(version))],
        capture_output=True,
        text=True,
        timeout=DEMO_S,
        check=False,
        cwd=REPO_ROOT,
        env=environment | {"TMPDIR": str(temporary)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("directly"))
    proxied_at = header.index("through settle-proxy")
    view = next(line for line in lines if line.startswith("message view"))
    stream = next(line for line in lines if line.startswith("event stream"))
    assert view[:proxied_at].split()[-1] == "running"
    assert view[proxied_at:] == INTERRUPTED[version]
    assert stream[:proxied_at].split()[2] == "running"
    assert stream[proxied_at:] == INTERRUPTED[version]
    assert f"opencode {version}, its " in result.stdout
    assert "The crash left 1 process running" in " ".join(result.stdout.split())
    assert _working_in(tmp_path) == []
    assert list(temporary.iterdir()) == []


@pytest.mark.parametrize("step", ["starting opencode", "the model calls", "starting opencode again"])
def test_ctrl_c_at_any_step_stops_everything_it_started(step: str, tmp_path: Path) -> None:
    """SIGINT once a step has begun (2.1.2, the faster to start): one line, exit 130, nothing left."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    environment = {name: value for name, value in os.environ.items() if not name.startswith("OPENCODE")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "proxy", "demo", "--opencode", str(_binary("2.1.2"))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=environment | {"TMPDIR": str(temporary)},
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if line.startswith(step):
                break
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=DEMO_S)
    finally:
        demo.kill()
        demo.wait()
    assert demo.returncode == 130, out + err
    assert err.splitlines() == ["settle-proxy demo: interrupted; everything it started is stopped"]
    assert _working_in(tmp_path) == []
    assert list(temporary.iterdir()) == []
