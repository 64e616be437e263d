"""The systemd example unit is valid, and its command line is one `settle-proxy run` accepts."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from proxy.cli import run as run_command
from proxy.supervision.supervisor import Orphans, Restart

UNIT = Path(__file__).parent.parent / "examples" / "systemd" / "settle-proxy.service"


def service_setting(name: str) -> str:
    (line,) = [line for line in UNIT.read_text().splitlines() if line.startswith(f"{name}=")]
    return line.split("=", 1)[1]


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    """`systemd-analyze verify` reports every bad setting on stderr; the binary must exist for it."""
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("%h/.local/bin/settle-proxy", "/usr/bin/env"))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stderr) == (0, "")


def test_the_unit_runs_settle_proxy_run_in_mixed_kill_mode() -> None:
    assert service_setting("KillMode") == "mixed"
    program, subcommand, *arguments = shlex.split(service_setting("ExecStart"))
    assert (program.rsplit("/", 1)[1], subcommand) == ("settle-proxy", "run")
    _, settings, supervisor = run_command.parse(arguments)
    assert (settings.host, settings.port) == ("127.0.0.1", 4096)
    health = supervisor.health()
    assert (health["restart"], health["orphans"]) == (Restart.ON_FAILURE, Orphans.TERMINATE)
    assert supervisor.command[:2] == ["opencode", "serve"]
