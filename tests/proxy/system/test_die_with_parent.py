"""The step that starts a supervised server: it becomes the command, unless its parent is gone."""

import os
import subprocess
import sys

PRINT_PID = (sys.executable, "-c", "import os; print(os.getpid())")


def step(parent: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "proxy.system.die_with_parent", str(parent), *PRINT_PID],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_command_runs_in_the_steps_place_while_its_parent_lives() -> None:
    with step(os.getpid()) as started:
        output, _ = started.communicate(timeout=30)
    assert started.returncode == 0
    assert output.strip() == str(started.pid)  # exec kept the pid, so the parent's death reaches it


def test_the_command_is_not_run_when_the_parent_is_already_gone() -> None:
    with step(os.getppid()) as started:  # not the step's parent: as if the proxy had died
        output, _ = started.communicate(timeout=30)
    assert started.returncode == 1
    assert output == ""
