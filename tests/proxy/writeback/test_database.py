"""Settling opencode's SQLite store in place, on a database shaped like the one a crash leaves."""

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.writeback.database import OpencodeDatabase
from rules import Api, Liveness
from tests.fixtures import OPENCODE, js_json
from tests.fixtures.new_turn import call_status, start_v2_turn
from tests.fixtures.stale_db import DIRECTORY, V1_SESSION, V2_SESSION, build_stale_db

V1_PART = "prt_229433856001UdZM6dtgAYZqVe"
V1_MESSAGE = "msg_229432faa0010ifWjJPo42f8Zo"
V2_MESSAGE = "msg_22942f8cd001S0O0R7RZWGCalD"
V1_PROMPT_PART = "prt_2294328bf001tfvm6AAj3yh110"
V2_PROMPT = "msg_22942f4d7001qzI46NEJt1Jq67"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return build_stale_db(tmp_path / "opencode.db")


def query(path: Path, sql: str, *parameters: Any) -> list[Any]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(sql, parameters).fetchall()
    finally:
        connection.close()


def data(path: Path, table: str, row_id: str) -> Any:
    return orjson.loads(query(path, f"SELECT data FROM {table} WHERE id = ?", row_id)[0][0])


EVERYTHING = {V1_PART, V1_MESSAGE, "call_mock_1"}


async def settle(
    path: Path, api: Api, session: str, active: bool = False, targets: set[str] = EVERYTHING
) -> list[Any]:
    async def confirm() -> Liveness:
        return Liveness(session, active)

    async with OpencodeDatabase.open(path) as database:
        return await database.settle_session(api, session, targets, confirm)


async def test_open_tools_lists_both_runtimes(db_path: Path) -> None:
    async with OpencodeDatabase.open(db_path) as database:
        tools = await database.open_tools()
    assert [(t.api, t.session_id, t.directory, t.message_id, t.tool) for t in tools] == [
        (Api.V2, V2_SESSION, DIRECTORY, V2_MESSAGE, "bash"),
        (Api.V1, V1_SESSION, DIRECTORY, V1_MESSAGE, "bash"),
    ]
    assert tools[1].part == V1_PART
    assert tools[1].since == 1795988600938


async def test_v1_part_message_and_events_are_settled(db_path: Path) -> None:
    written = await settle(db_path, Api.V1, V1_SESSION)
    assert [(w.part, w.rule) for w in written] == [(V1_PART, "orphaned-tool"), (None, "unfinished-message")]
    part = data(db_path, "part", V1_PART)
    assert "id" not in part
    assert part["state"]["status"] == "error"
    assert part["state"]["error"] == "Tool execution aborted"
    assert part["state"]["metadata"] == {"output": "hello\n", "interrupted": True}
    assert part["state"]["time"] == {"start": 1795988600938, "end": 1795988600938}
    message = data(db_path, "message", V1_MESSAGE)
    assert message["time"]["completed"] == 1795988600938
    assert message["error"]["name"] == "MessageAbortedError"
    events = query(
        db_path,
        "SELECT seq, type, data FROM event WHERE aggregate_id = ? AND seq > 13 ORDER BY seq",
        V1_SESSION,
    )
    assert [(seq, kind) for seq, kind, _ in events] == [
        (14, "message.part.updated.1"),
        (15, "message.updated.1"),
    ]
    assert orjson.loads(events[0][2])["part"]["state"] == part["state"]
    assert query(db_path, "SELECT seq FROM event_sequence WHERE aggregate_id = ?", V1_SESSION) == [(15,)]


async def test_v2_row_and_event_log_move_together(db_path: Path) -> None:
    written = await settle(db_path, Api.V2, V2_SESSION)
    assert [(w.part, w.rule) for w in written] == [("call_mock_1", "orphaned-tool")]
    stored = data(db_path, "session_message", V2_MESSAGE)
    after_replay = _after_replay_row()
    assert stored["content"][0]["state"] == after_replay["content"][0]["state"]
    assert stored["content"][0]["time"] == {
        "created": 1795988584665,
        "ran": 1795988584703,
        "completed": 1795988584703,
    }
    assert "completed" not in stored["time"], "the server's tool.failed projection leaves the message open"
    events = query(
        db_path, "SELECT id, seq, type, data FROM event WHERE aggregate_id = ? AND seq > 6", V2_SESSION
    )
    assert [(seq, kind) for _, seq, kind, _ in events] == [(7, "session.next.tool.failed.1")]
    replayed = orjson.loads((OPENCODE / "v2-sync-replay-request.json").read_bytes())["events"][0]["data"]
    assert orjson.loads(events[0][3]) == {**replayed, "timestamp": 1795988584703}
    assert (
        events[0][0]
        > query(db_path, "SELECT max(id) FROM event WHERE seq = 6 AND aggregate_id = ?", V2_SESSION)[0][0]
    )
    assert query(db_path, "SELECT seq FROM event_sequence WHERE aggregate_id = ?", V2_SESSION) == [(7,)]


@pytest.mark.parametrize(("api", "session"), [(Api.V1, V1_SESSION), (Api.V2, V2_SESSION)])
async def test_a_second_pass_changes_nothing(db_path: Path, api: Api, session: str) -> None:
    await settle(db_path, api, session)
    before = query(db_path, "SELECT count(*), max(seq) FROM event")
    assert await settle(db_path, api, session) == []
    assert query(db_path, "SELECT count(*), max(seq) FROM event") == before
    assert query(db_path, "PRAGMA integrity_check") == [("ok",)]


@pytest.mark.parametrize(("api", "session"), [(Api.V1, V1_SESSION), (Api.V2, V2_SESSION)])
async def test_active_session_is_never_written(db_path: Path, api: Api, session: str) -> None:
    before = query(db_path, "SELECT * FROM event ORDER BY id"), query(db_path, "SELECT data FROM part")
    assert await settle(db_path, api, session, active=True) == []
    assert (
        query(db_path, "SELECT * FROM event ORDER BY id"),
        query(db_path, "SELECT data FROM part"),
    ) == before


async def test_v2_call_with_a_later_prompt_is_left_to_the_server(db_path: Path) -> None:
    connection = sqlite3.connect(db_path)
    connection.execute(
        "INSERT INTO event (id, aggregate_id, seq, type, data) VALUES ('evt_x', ?, 7, 'session.next.prompt.admitted.1', '{}')",
        (V2_SESSION,),
    )
    connection.execute("UPDATE event_sequence SET seq = 7 WHERE aggregate_id = ?", (V2_SESSION,))
    connection.commit()
    connection.close()
    assert await settle(db_path, Api.V2, V2_SESSION) == []
    assert data(db_path, "session_message", V2_MESSAGE)["content"][0]["state"]["status"] == "running"


def rewrite_row(path: Path, table: str, row_id: str, edit: Callable[[Any], None]) -> str:
    """Edit one row's data and store it as the server would (`JSON.stringify`); returns the text."""
    value = json.loads(query(path, f"SELECT data FROM {table} WHERE id = ?", row_id)[0][0])
    edit(value)
    text = js_json(value).decode()
    connection = sqlite3.connect(path)
    connection.execute(f"UPDATE {table} SET data = ? WHERE id = ?", (text, row_id))
    connection.commit()
    connection.close()
    return text


def raw_data(path: Path, table: str, row_id: str) -> str:
    return str(query(path, f"SELECT data FROM {table} WHERE id = ?", row_id)[0][0])


async def test_v1_rows_with_lone_surrogates_are_settled_and_keep_them(db_path: Path) -> None:
    prompt = rewrite_row(db_path, "part", V1_PROMPT_PART, lambda part: part.update(text="run \ud83d"))
    rewrite_row(db_path, "part", V1_PART, lambda part: part["state"]["metadata"].update(output="hi \udc00"))
    written = await settle(db_path, Api.V1, V1_SESSION)
    assert [(w.part, w.rule) for w in written] == [(V1_PART, "orphaned-tool"), (None, "unfinished-message")]
    stored = raw_data(db_path, "part", V1_PART)
    assert '"output":"hi \\udc00"' in stored
    assert json.loads(stored)["state"]["status"] == "error"
    assert raw_data(db_path, "part", V1_PROMPT_PART) == prompt
    (event,) = query(db_path, "SELECT data FROM event WHERE type = 'message.part.updated.1' AND seq > 13")
    assert '"output":"hi \\udc00"' in event[0]


async def test_v2_rows_with_lone_surrogates_are_settled_and_keep_them(db_path: Path) -> None:
    prompt = rewrite_row(db_path, "session_message", V2_PROMPT, lambda message: message.update(text="\ud83d"))

    def cut(message: Any) -> None:
        message["content"][0]["state"]["input"]["description"] = "demo \ud83d"

    rewrite_row(db_path, "session_message", V2_MESSAGE, cut)
    async with OpencodeDatabase.open(db_path) as database:
        assert [tool.message_id for tool in await database.open_tools()] == [V2_MESSAGE, V1_MESSAGE]
    written = await settle(db_path, Api.V2, V2_SESSION)
    assert [(w.part, w.rule) for w in written] == [("call_mock_1", "orphaned-tool")]
    stored = raw_data(db_path, "session_message", V2_MESSAGE)
    assert '"description":"demo \\ud83d"' in stored
    assert json.loads(stored)["content"][0]["state"]["status"] == "error"
    assert raw_data(db_path, "session_message", V2_PROMPT) == prompt


async def test_missing_database_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no opencode database"):
        async with OpencodeDatabase.open(tmp_path / "nope.db"):
            pass


def _after_replay_row() -> Any:
    dump = (OPENCODE / "db-rows-after-writeback.txt").read_text()
    row = next(line for line in dump.splitlines() if line.startswith("assistant|3|"))
    return orjson.loads(row.split("|", 3)[3])


async def test_only_named_parts_are_written(db_path: Path) -> None:
    """A turn that started after the fetch has a part nobody named: it is never written."""
    start_v2_turn(db_path)
    assert await settle(db_path, Api.V2, V2_SESSION, targets={"call_mock_1"}) == []
    assert call_status(db_path) == "running"


async def test_a_turn_recorded_while_the_reading_is_taken_stops_the_write(db_path: Path) -> None:
    """The reading is taken with no lock held (a server write waiting for one stops the whole
    server), and whatever the server records meanwhile is found before anything is written."""

    async def confirm() -> Liveness:
        start_v2_turn(db_path)
        return Liveness(V2_SESSION, active=False)

    async with OpencodeDatabase.open(db_path) as database:
        written = await database.settle_session(Api.V2, V2_SESSION, {"call_mock_1"}, confirm)
    assert written == []
    assert data(db_path, "session_message", V2_MESSAGE)["content"][0]["state"]["status"] == "running"
    assert call_status(db_path) == "running"
