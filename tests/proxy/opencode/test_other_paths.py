"""Another holder of the database, reached through another path: a hard link, a symlinked
directory, or a path only its own mount namespace has (a bind mount, a container). The file is
the same, so it is the same database: holders are told by device and inode, not by path."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from yarl import URL

from proxy.opencode.other_processes import survey
from proxy.system.holders import holders
from tests.proxy.system.fake_proc import BOOT_S, PORT, FakeProc

UPSTREAM = URL(f"http://127.0.0.1:{PORT}")
HOLDS = "import sys; f = open(sys.argv[1]); print(flush=True); sys.stdin.read()"


def paths_to_one_database(tmp_path: Path) -> dict[str, Path]:
    """The database, and other paths that reach the very same file."""
    database = tmp_path / "data" / "opencode" / "opencode.db"
    database.parent.mkdir(parents=True)
    database.write_bytes(b"SQLite format 3\0")
    (tmp_path / "mirror").mkdir()
    hard_link = tmp_path / "mirror" / "opencode.db"
    os.link(database, hard_link)
    (tmp_path / "linked").symlink_to(database.parent)
    same_name = tmp_path / "elsewhere" / "opencode.db"
    same_name.parent.mkdir()
    same_name.write_bytes(b"SQLite format 3\0")
    return {
        "database": database,
        "hard link": hard_link,
        "symlinked directory": tmp_path / "linked" / "opencode.db",
        "another file of the same name": same_name,
    }


def test_the_survey_finds_holders_of_the_same_file_through_other_paths(
    proc: FakeProc, tmp_path: Path
) -> None:
    paths = paths_to_one_database(tmp_path)
    proc.process(100, "socket:[111]", str(paths["database"]), started_at=BOOT_S * 1000 + 1_000)
    proc.process(200, str(paths["hard link"]), started_at=BOOT_S * 1000 + 2_000)
    # What another mount namespace's readlink gives: a path that is not this one's.
    proc.process(300, str(paths["symlinked directory"]), started_at=BOOT_S * 1000 + 3_000)
    proc.process(400, str(paths["another file of the same name"]), started_at=BOOT_S * 1000 + 4_000)
    found = survey(UPSTREAM, proc=proc.root, own_pid=1, now_ms=BOOT_S * 1000 + 9_000)
    assert found.unknown is None
    assert found.databases == (str(paths["database"]),)
    assert [(other.pid, other.database) for other in found.others] == [
        (200, str(paths["hard link"])),
        (300, str(paths["symlinked directory"])),
    ]
    assert found.bound == BOOT_S * 1000 + 2_000 - 1_000


@contextmanager
def holding(path: Path) -> Iterator[int]:
    """A real second process with `path` open."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDS, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as holder:
        assert holder.stdout is not None
        holder.stdout.readline()
        try:
            yield holder.pid
        finally:
            holder.communicate(b"")


def test_a_real_holder_through_a_hard_link_or_a_symlinked_directory_is_found(tmp_path: Path) -> None:
    paths = paths_to_one_database(tmp_path)
    for way in ("hard link", "symlinked directory"):
        with holding(paths[way]) as pid:
            assert [found.pid for found in holders(paths["database"])] == [pid], way
            offline = survey(URL("http://10.1.2.3:4096"), database=paths["database"], own_pid=os.getpid())
            assert [other.pid for other in offline.others] == [pid], way
    with holding(paths["another file of the same name"]):
        assert holders(paths["database"]) == []


def test_a_real_upstream_and_a_second_server_on_a_hard_link_of_its_database(tmp_path: Path) -> None:
    paths = paths_to_one_database(tmp_path)
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        paths["database"].open("rb"),
        holding(paths["hard link"]) as second,
    ):
        found = survey(URL(f"http://127.0.0.1:{server.getsockname()[1]}"), own_pid=1)
    assert found.unknown is None
    assert found.upstream_pids == (os.getpid(),)
    assert found.databases == (str(paths["database"]),)
    assert [(other.pid, other.database) for other in found.others] == [(second, str(paths["hard link"]))]
