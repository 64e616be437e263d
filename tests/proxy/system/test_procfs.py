"""Reading /proc: this process's own fields, a gone process, and who holds a file open."""

import os
import subprocess
import sys
from pathlib import Path

from proxy.system.holders import can_see_holders, holders
from proxy.system.procfs import command_line, pids, program_name, stat

GONE = 2**22 + 1
"""Above Linux's largest pid: never a process."""


def test_this_process_is_read() -> None:
    own = stat(os.getpid())
    assert own is not None
    assert (own.state, own.parent) == ("R", os.getppid())
    assert own.started > 0
    assert "python" in command_line(os.getpid())
    assert os.getpid() in set(pids())


def test_a_gone_process_reads_as_nothing() -> None:
    assert stat(GONE) is None
    assert command_line(GONE) == "?"


def test_only_the_program_of_a_command_is_shown() -> None:
    assert program_name("/usr/bin/opencode serve --password hunter2") == "opencode"
    assert program_name("") == ""


def test_a_process_holding_the_database_or_its_wal_is_found(tmp_path: Path) -> None:
    assert can_see_holders()
    database = tmp_path / "opencode.db"
    database.touch()
    (tmp_path / "opencode.db-wal").touch()
    assert holders(database) == []  # this process is never its own holder
    code = "import sys; f = open(sys.argv[1]); print(flush=True); sys.stdin.read()"
    with subprocess.Popen(
        [sys.executable, "-c", code, f"{database}-wal"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as holder:
        assert holder.stdout is not None
        holder.stdout.readline()  # it has the file open
        assert [found.pid for found in holders(database)] == [holder.pid]
        holder.communicate(b"")
    assert holders(database) == []
