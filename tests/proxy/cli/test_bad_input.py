"""Bad input, as users give it: one line naming what is wrong (and how to fix it), an exit code,
never a traceback, and the file named left as it was."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.proxy.conftest import settle_proxy


def not_sqlite(path: Path) -> Path:
    path.write_bytes(b"SSH-2.0-OpenSSH_9.2\r\nnot a database, but someone's notes\n" * 40)
    return path


def sqlite_of_another_program(path: Path) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        db.execute("INSERT INTO notes (text) VALUES ('keep me')")
    return path


@pytest.fixture(params=[not_sqlite, sqlite_of_another_program], ids=["not-sqlite", "other-sqlite"])
def foreign(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A file that is not opencode's database, whose bytes and mtime a test checks after."""
    path: Path = request.param(tmp_path / "opencode.db")
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    yield path
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before, "the file was changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["opencode.db"], "a file was added beside it"


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in result.stderr
    assert result.returncode == code, result.stderr
    (line,) = result.stderr.splitlines()
    return line


def test_settle_refuses_a_file_that_is_not_opencodes_database(foreign: Path) -> None:
    line = one_line(settle_proxy("settle", "--db", str(foreign)), 2)
    assert line.startswith(f"settle-proxy settle: error: not an opencode database: {foreign}: ")


def test_settle_names_what_is_missing(tmp_path: Path) -> None:
    line = one_line(settle_proxy("settle", "--db", str(sqlite_of_another_program(tmp_path / "x.db"))), 2)
    assert line.endswith(
        ": it has none of opencode's tables (opencode keeps its own in $XDG_DATA_HOME/opencode/opencode.db)"
    )
    database = tmp_path / "2x.db"
    with sqlite3.connect(database) as db:  # 2.x's tables: settled by 2.x itself
        db.execute("CREATE TABLE session_v2 (id TEXT PRIMARY KEY)")
        db.execute("CREATE TABLE session_message (id TEXT PRIMARY KEY, data TEXT)")
    line = one_line(settle_proxy("settle", "--db", str(database)), 2)
    assert line == (
        f"settle-proxy settle: error: not an opencode database this proxy settles: {database}: it has no "
        "table session, message, part, event, event_sequence (opencode 1.x's has them all; a 2.x server "
        "settles its own)"
    )


def test_settle_refuses_a_directory(tmp_path: Path) -> None:
    line = one_line(settle_proxy("settle", "--dry-run", "--db", str(tmp_path)), 2)
    assert line == f"settle-proxy settle: error: not an opencode database: {tmp_path}: it is a directory"


def test_the_proxy_refuses_a_write_back_database_that_is_not_opencodes(foreign: Path) -> None:
    result = settle_proxy("--port", "0", "--write-back", "db", "--db", str(foreign))
    assert one_line(result, 2).startswith(f"settle-proxy: error: not an opencode database: {foreign}: ")


def test_orphans_refuses_a_state_file_that_is_not_sqlite(tmp_path: Path) -> None:
    state = not_sqlite(tmp_path / "processes.db")
    before = state.read_bytes()
    line = one_line(settle_proxy("orphans", "--state", str(state)), 2)
    assert line == f"settle-proxy orphans: error: not a state database: {state}: file is not a database"
    assert state.read_bytes() == before


def test_orphans_leaves_another_programs_database_untouched(foreign: Path) -> None:
    """SQLite, but not ours: nothing is recorded there, and no table of ours is added."""
    result = settle_proxy("orphans", "--state", str(foreign))
    if foreign.read_bytes().startswith(b"SQLite format 3"):
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout.strip() == f"nothing recorded at {foreign}"
    else:
        assert "not a state database" in one_line(result, 2)


def test_orphans_refuses_a_directory(tmp_path: Path) -> None:
    line = one_line(settle_proxy("orphans", "--state", str(tmp_path)), 2)
    assert line == f"settle-proxy orphans: error: not a state database: {tmp_path}: it is a directory"


def test_a_port_in_use_is_one_line_naming_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(settle_proxy("--port", str(port), "--log-level", "error"), 1)
    assert line == (
        f"settle-proxy: error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another process listens there: choose another --port, or 0 for any free one)"
    )


def test_a_host_that_does_not_resolve_is_one_line() -> None:
    result = settle_proxy("--host", "no-such-host.invalid", "--port", "0", "--log-level", "error")
    line = one_line(result, 1)
    assert line.startswith("settle-proxy: error: cannot listen on no-such-host.invalid:0: ")
    assert line.endswith("(--host is an address or a name this machine resolves, such as 127.0.0.1)")
