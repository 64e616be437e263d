"""Reading who holds what open, who listens on a port and since when, from a fake `/proc` tree."""

import os
from pathlib import Path

import pytest

from proxy.system.open_files import (
    PF_KTHREAD,
    FileId,
    boot_time_ms,
    listening_sockets,
    open_files,
    started_at_ms,
)
from tests.proxy.system.fake_proc import BOOT_S, DB, PORT, FakeProc

MARKER = "/memfd:settle-proxy (deleted)"


def test_sockets_databases_and_the_marker_are_told_apart(proc: FakeProc) -> None:
    proc.process(100, "socket:[111]", DB, DB + "-wal", "/dev/null", "pipe:[9]")
    proc.process(200, MARKER, "/srv/other.db")
    seen, not_inspected = open_files(proc.root, MARKER)
    assert set(seen) == {100, 200}
    assert (seen[100].sockets, seen[100].databases, seen[100].marked) == ({"111"}, {DB: DB}, False)
    assert (seen[200].sockets, seen[200].databases, seen[200].marked) == (
        set(),
        {"/srv/other.db": "/srv/other.db"},  # a path no file is at: told by its path
        True,
    )
    assert not_inspected == 0


def test_unreadable_processes_are_counted_kernel_threads_and_entries_not_processes_are_not(
    proc: FakeProc,
) -> None:
    proc.unreadable(300)
    proc.unreadable(400, flags=PF_KTHREAD)
    (proc.root / "self").mkdir()
    seen, not_inspected = open_files(proc.root, MARKER)
    assert seen == {}
    assert not_inspected == 1


def test_only_listening_sockets_on_the_port_in_either_table_are_the_listeners(proc: FakeProc) -> None:
    proc.listen(PORT, "222", table="tcp6")
    proc.listen(PORT, "333", state="01")  # an established connection to the port
    proc.listen(PORT + 1, "444")
    assert listening_sockets(proc.root, PORT) == {"111", "222"}
    assert listening_sockets(proc.root, PORT + 2) == set()


def test_no_socket_table_means_no_listener(tmp_path: Path) -> None:
    assert listening_sockets(tmp_path, PORT) == set()


def test_start_times_count_from_the_boot_time(proc: FakeProc) -> None:
    boot = boot_time_ms(proc.root)
    assert boot == BOOT_S * 1000
    proc.process(100, started_at=BOOT_S * 1000 + 5_000)
    assert started_at_ms(proc.root, 100, boot) == BOOT_S * 1000 + 5_000
    assert started_at_ms(proc.root, 101, boot) is None  # gone


def test_a_stat_without_a_boot_time_raises(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3 4\n")
    with pytest.raises(ValueError, match="no btime"):
        boot_time_ms(tmp_path)
    with pytest.raises(FileNotFoundError):
        boot_time_ms(tmp_path / "nothing")


def test_the_real_proc_shows_this_processes_open_file(tmp_path: Path) -> None:
    database = tmp_path / "opencode.db"
    with database.open("w"):
        seen, _ = open_files(Path("/proc"), MARKER)
    assert seen[os.getpid()].databases[FileId.of(database) or ""] == str(database)
