"""`scripts/test` sets up what the tests need, idempotently, and says clearly what it cannot do."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from types import ModuleType

from pip._vendor.packaging.requirements import Requirement

ROOT = Path(__file__).parent.parent


def setup_step(step: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one step of scripts/setup.sh the way scripts/test runs it."""
    environment = dict(os.environ, PATH=path or os.environ["PATH"])
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source scripts/setup.sh; {step}"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_second_run_installs_nothing() -> None:
    """Each step run twice: the second finds all in place. (Once is not enough: worktrees of one
    repository share the Python environment, and another checkout's run makes this one's editable
    install due again.)"""
    test_script = (ROOT / "scripts" / "test").read_text()
    steps = [line.strip() for line in test_script.splitlines() if line.startswith("ensure_")]
    assert len(steps) == 3
    for step in steps:
        assert setup_step(step).returncode == 0
        result = setup_step(step)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "", f"{step} did something: {result.stderr}"


def _installed_script() -> ModuleType:
    """scripts/installed.py, which setup.sh runs as a script (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("installed", ROOT / "scripts" / "installed.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_requirement_whose_marker_excludes_this_platform_is_satisfied_without_it() -> None:
    """uvloop is required only off Windows: a requirement for another platform needs nothing here,
    so `scripts/setup.sh` does not call pip for it."""
    installed = _installed_script()
    absent = "no-such-package-here>=1"
    assert not installed.satisfied(Requirement(absent))
    assert installed.satisfied(Requirement(f"{absent}; sys_platform == 'no-such-platform'"))


def test_missing_packages_without_root_or_sudo_stop_with_the_command_to_run(tmp_path: Path) -> None:
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, body in (("id", "echo 1000"), ("sudo", "exit 1")):
        (shims / name).write_text(f"#!/bin/sh\n{body}\n")
        (shims / name).chmod(0o755)
    result = setup_step(
        "ensure_debian_packages tmux:tmux no-such-tool-here:no-such-package",
        path=f"{shims}:{os.environ['PATH']}",
    )
    assert result.returncode == 3
    assert "missing Debian packages: no-such-package" in result.stderr
    assert "sudo apt-get install -y no-such-package" in result.stderr


def test_ci_runs_the_readme_test_command_last() -> None:
    readme = (ROOT / "README.md").read_text()
    command = readme.split("## Set up", 1)[1].split("```sh\n")[2].split("\n```", 1)[0]
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci_lines[-1] == command == "scripts/test"
