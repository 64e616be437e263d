"""A v2 session's log, from opencode's database when it holds the session, else from the API."""

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.writeback.session_logs import SessionLogs
from tests.proxy.fake_opencode import FakeOpencode

# opencode 1.18.33's `event` table, as its migrations create it (read off a 1.18.33 database).
EVENT_TABLE = """
CREATE TABLE `event` (`id` text PRIMARY KEY, `aggregate_id` text NOT NULL, `seq` integer NOT NULL,
  `type` text NOT NULL, `data` text NOT NULL);
CREATE UNIQUE INDEX `event_aggregate_seq_idx` ON `event` (`aggregate_id`,`seq`);
"""
STORED = [
    ("evt_1", "ses_a", 0, "session.created.1", {"sessionID": "ses_a"}),
    ("evt_2", "ses_b", 0, "session.created.1", {"sessionID": "ses_b"}),
    ("evt_3", "ses_a", 1, "session.next.tool.called.1", {"callID": "call_1", "input": {}}),
    ("evt_4", "ses_a", 2, "session.updated.1", {"sessionID": "ses_a", "info": {"title": "t"}}),
]
EXPECTED = [
    (0, "session.created", None),
    (1, "session.next.tool.called", "call_1"),
    (2, "session.updated", None),
]
THROUGH_API = [*EXPECTED[1:], (3, "session.next.prompted", None)]
"""What `/sync/history` answers asked after seq 0, as the writer asks: the `session.created` at 0
left out, and one event the database has not (yet)."""


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "opencode.db"
    with sqlite3.connect(path) as db:
        db.executescript(EVENT_TABLE)
        db.executemany(
            "INSERT INTO event VALUES (?, ?, ?, ?, ?)", [(*row[:4], json.dumps(row[4])) for row in STORED]
        )
    return path


@pytest.fixture
def history(fake: FakeOpencode) -> FakeOpencode:
    """The same log on the fake's `/sync/history`, one more event of `ses_a` than the database."""
    fake.events = [
        {"id": i, "aggregate_id": a, "seq": s, "type": t, "data": d} for i, a, s, t, d in STORED
    ] + [{"id": "evt_5", "aggregate_id": "ses_a", "seq": 3, "type": "session.next.prompted.1", "data": {}}]
    return fake


def history_asked(fake: FakeOpencode) -> int:
    return sum(request.path == "/sync/history" for request in fake.seen)


async def test_a_database_that_holds_the_session_answers_without_the_api(
    history: FakeOpencode, upstream_api: UpstreamApi, database: Path
) -> None:
    logs = SessionLogs(upstream_api, database)
    assert await logs.read("ses_a", Credentials()) == EXPECTED
    assert history_asked(history) == 0


async def test_a_database_without_the_session_leaves_it_to_the_api(
    history: FakeOpencode, upstream_api: UpstreamApi, database: Path
) -> None:
    logs = SessionLogs(upstream_api, database)
    assert await logs.read("ses_c", Credentials()) == []
    assert history_asked(history) == 1
    assert await logs.read("ses_a", Credentials()) == EXPECTED  # the database is asked each time
    assert history_asked(history) == 1
    history.events.append(
        {"id": "evt_6", "aggregate_id": "ses_c", "seq": 1, "type": "session.next.prompted.1", "data": {}}
    )
    assert await logs.read("ses_c", Credentials()) == [(1, "session.next.prompted", None)]


async def test_the_api_answers_when_there_is_no_database(
    history: FakeOpencode, upstream_api: UpstreamApi
) -> None:
    assert await SessionLogs(upstream_api).read("ses_a", Credentials()) == THROUGH_API
    assert history_asked(history) == 1


async def test_no_database_there_is_a_server_elsewhere(
    history: FakeOpencode, upstream_api: UpstreamApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As for a server on another host: no line above DEBUG (every writer line is a decision)."""
    logs = SessionLogs(upstream_api, tmp_path / "opencode.db")
    with caplog.at_level(logging.INFO, logger="proxy.writeback.session_logs"):
        assert await logs.read("ses_a", Credentials()) == THROUGH_API
    assert not [r for r in caplog.records if r.name == "proxy.writeback.session_logs"]
    assert not (tmp_path / "opencode.db").exists()


@pytest.mark.parametrize("content", [b"not a database", b""])
async def test_an_unreadable_database_is_said_once_and_the_api_answers(
    history: FakeOpencode,
    upstream_api: UpstreamApi,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    content: bytes,
) -> None:
    path = tmp_path / "opencode.db"
    path.write_bytes(content)
    logs = SessionLogs(upstream_api, path)
    with caplog.at_level(logging.INFO, logger="proxy.writeback.session_logs"):
        for _ in range(2):
            assert await logs.read("ses_a", Credentials()) == THROUGH_API
    said = [r.getMessage() for r in caplog.records if r.name == "proxy.writeback.session_logs"]
    assert len(said) == 1
    assert "read through /sync/history" in said[0]
    assert path.read_bytes() == content  # nothing written
