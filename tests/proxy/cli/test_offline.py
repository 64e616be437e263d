"""`settle-proxy settle` on a database shaped like the one a crash leaves."""

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from rich.console import Console

from proxy.cli.offline import SettleExit, build_parser, run
from tests.fixtures import js_json
from tests.fixtures.new_turn import call_status, start_v2_turn
from tests.fixtures.stale_db import DIRECTORY, V1_SESSION, V2_SESSION, build_stale_db
from tests.proxy.conftest import settle_proxy
from tests.proxy.fake_opencode import FakeOpencode


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return build_stale_db(tmp_path / "opencode.db")


async def settle_against(upstream: TestServer, db_path: Path, console: Console) -> SettleExit:
    """`settle-proxy settle --db DB_PATH --upstream UPSTREAM`, in this process."""
    return await run(
        build_parser().parse_args(["--db", str(db_path), "--upstream", str(upstream.make_url("/"))]), console
    )


def test_dry_run_lists_and_writes_nothing(db_path: Path) -> None:
    before = db_path.read_bytes()
    result = settle_proxy("settle", "--db", str(db_path), "--dry-run")
    assert result.returncode == SettleExit.SETTLED
    assert V1_SESSION in result.stdout
    assert V2_SESSION in result.stdout
    assert "would settle 2 tool call(s)" in result.stdout
    assert db_path.read_bytes() == before


def test_settles_then_has_nothing_to_do(db_path: Path) -> None:
    first = settle_proxy("settle", "--db", str(db_path))
    assert first.returncode == SettleExit.SETTLED, first.stderr
    assert "settled 2 tool call(s) in 2 session(s)" in first.stdout
    second = settle_proxy("settle", "--db", str(db_path))
    assert second.returncode == SettleExit.NOTHING_TO_DO
    assert "nothing to do" in second.stdout


def test_rows_cut_inside_an_emoji_are_settled(db_path: Path) -> None:
    connection = sqlite3.connect(db_path)
    for table in ("part", "session_message"):
        for row_id, data in connection.execute(f"SELECT id, data FROM {table}").fetchall():
            value = json.loads(data)
            value["cut"] = "\ud83d"
            connection.execute(f"UPDATE {table} SET data = ? WHERE id = ?", (js_json(value).decode(), row_id))
    connection.commit()
    connection.close()
    result = settle_proxy("settle", "--db", str(db_path))
    assert result.returncode == SettleExit.SETTLED, result.stderr
    assert "settled 2 tool call(s) in 2 session(s)" in result.stdout
    connection = sqlite3.connect(db_path)
    rows = connection.execute("SELECT data FROM part UNION ALL SELECT data FROM session_message").fetchall()
    connection.close()
    assert all('"cut":"\\ud83d"' in data for (data,) in rows)


@contextmanager
def held_open(path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another process with the database at `path` open, started now."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sqlite3, time; c = sqlite3.connect({str(path)!r}); "
            "c.execute('select 1 from part').fetchall(); print('open', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"open\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def database_in_use(db_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another process holding the database open, started now: after every time the fixture records."""
    with held_open(db_path) as holder:
        yield holder


def test_refuses_when_another_process_has_the_database_open(
    db_path: Path, database_in_use: subprocess.Popen[bytes]
) -> None:
    result = settle_proxy("settle", "--db", str(db_path))
    assert result.returncode == SettleExit.REFUSED
    assert f"pid {database_in_use.pid}" in result.stderr
    assert "--upstream" in result.stderr
    assert settle_proxy("settle", "--db", str(db_path), "--dry-run").returncode == SettleExit.REFUSED


def test_refuses_when_another_process_has_the_database_open_through_a_hard_link(
    db_path: Path, tmp_path: Path
) -> None:
    (tmp_path / "mirror").mkdir()
    other_path = tmp_path / "mirror" / "opencode.db"
    os.link(db_path, other_path)
    before = db_path.read_bytes()
    with held_open(other_path) as holder:
        result = settle_proxy("settle", "--db", str(db_path))
    assert result.returncode == SettleExit.REFUSED
    assert f"pid {holder.pid}" in result.stderr
    assert db_path.read_bytes() == before


async def test_upstream_says_which_sessions_are_live(
    db_path: Path, fake: FakeOpencode, upstream: TestServer
) -> None:
    fake.v2_active.add(V2_SESSION)
    fake.directories[V1_SESSION] = "/home/dev/work/proj"
    console = Console(record=True, width=200)
    assert await settle_against(upstream, db_path, console) == SettleExit.SETTLED
    assert "settled 1 tool call(s) in 1 session(s)" in console.export_text()
    assert await settle_against(upstream, db_path, console) == SettleExit.NOTHING_TO_DO
    assert "(1 live left alone)" in console.export_text()


async def test_upstream_leaves_alone_what_another_holder_may_run(
    db_path: Path, database_in_use: subprocess.Popen[bytes], fake: FakeOpencode, upstream: TestServer
) -> None:
    """Its tool was last alive after the other holder started (now, in the fixture): it may run there."""
    fake.directories[V1_SESSION] = DIRECTORY
    with closing(sqlite3.connect(db_path)) as db, db:
        db.execute(
            "UPDATE part SET data = json_set(data, '$.state.time.start', ?) WHERE data LIKE '%running%'",
            (int(time.time() * 1000),),
        )
        before = db.execute("SELECT data FROM part WHERE session_id = ?", (V1_SESSION,)).fetchall()
    console = Console(record=True, width=200)
    assert await settle_against(upstream, db_path, console) == SettleExit.SETTLED
    text = console.export_text()
    assert "1 tool call(s) left alone: another process may run them" in text
    assert "settled 1 tool call(s) in 1 session(s)" in text
    with closing(sqlite3.connect(db_path)) as db:
        assert db.execute("SELECT data FROM part WHERE session_id = ?", (V1_SESSION,)).fetchall() == before
        (v2,) = db.execute("SELECT data FROM session_message WHERE session_id = ?", (V2_SESSION,)).fetchone()
    assert '"status":"running"' not in v2


async def test_upstream_in_doubt_is_a_refusal(
    db_path: Path, fake: FakeOpencode, upstream: TestServer
) -> None:
    fake.liveness_fails = True
    with pytest.raises(Exception, match="could not say which sessions are live"):
        await settle_against(upstream, db_path, Console())


def test_missing_database(tmp_path: Path) -> None:
    result = settle_proxy("settle", "--db", str(tmp_path / "none.db"))
    assert result.returncode == SettleExit.BAD_USAGE
    assert result.stderr.splitlines() == [
        f"settle-proxy settle: error: no opencode database at {tmp_path / 'none.db'} "
        "(--db, or SETTLE_DB, names where it is)"
    ]


def test_no_database_at_the_default_place_names_the_flag(tmp_path: Path) -> None:
    result = settle_proxy("settle", env={"XDG_DATA_HOME": str(tmp_path)})
    assert result.returncode == SettleExit.BAD_USAGE
    assert result.stderr.splitlines() == [
        f"settle-proxy settle: error: no opencode database at {tmp_path / 'opencode' / 'opencode.db'} "
        "(--db, or SETTLE_DB, names where it is)"
    ]


async def test_upstream_reading_is_taken_per_session_after_its_re_read(
    db_path: Path, fake: FakeOpencode, upstream: TestServer
) -> None:
    """A turn starts in the v2 session as its liveness is asked: asked after the session's rows
    were re-read, with the write checking that nothing changed since, the new call is never
    written (asked up front, as before, it was written as failed)."""
    turns: list[threading.Thread] = []

    def new_turn() -> None:
        turns.append(threading.Thread(target=start_v2_turn, args=(db_path,)))
        turns[-1].start()

    fake.on_serve["/api/session/active"] = [new_turn]
    await settle_against(upstream, db_path, Console(width=200))
    for turn in turns:
        await asyncio.to_thread(turn.join, 15)
    assert len(turns) == 1
    assert call_status(db_path) == "running"
