"""In front of each server line: views in its shape, health naming it, and no writer on a line
that has none (2.x) or a version no line covers, with one line saying why and no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy.opencode import tracker
from proxy.opencode.dialects import LINE_1_18
from proxy.opencode.server_line import KnownServer
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings
from proxy.testing import WAIT_S, hearing, idle, refollowing
from proxy.writeback.modes import WriteBackMode
from tests.proxy.conftest import ProxyClient, following
from tests.proxy.fake_opencode import FakeOpencode
from tests.reliability.processes import eventually

SESSION = "ses_2x0000000000000000000000"
VIEW = f"/api/session/{SESSION}/message"


def stale_2x_view() -> bytes:
    """A 2.x message view after a crash mid-call: a running `shell` call (the times a client
    measured on 2.0.24 after `kill -9`, `/work/notes/opencode2x-facts.md`)."""
    call = {
        "type": "tool",
        "id": "call_1",
        "name": "shell",
        "state": {"status": "running", "input": {"command": "sleep 600"}, "metadata": {"output": "hi\n"}},
        "time": {"created": 1791430444062, "ran": 1791430444073},
    }
    message = {
        "id": "msg_1",
        "type": "assistant",
        "agent": "build",
        "model": {"id": "m", "providerID": "p"},
        "content": [call],
        "time": {"created": 1791430444000},
    }
    return orjson.dumps({"data": [message], "cursor": {"next": "x"}})


Start = Callable[..., Awaitable[ProxyClient]]


@pytest.fixture
def start(upstream: TestServer, aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]]) -> Start:
    async def started(**settings: Any) -> ProxyClient:
        app = create_app(Settings(upstream=URL(str(upstream.make_url("/"))), grace=0, **settings))
        client: TestClient[web.Request, web.Application] = await aiohttp_client(app)
        return client

    return started


async def settled_call(proxy: ProxyClient) -> dict[str, Any]:
    response = await proxy.get(VIEW)
    assert response.status == 200
    call: dict[str, Any] = orjson.loads(await response.read())["data"][0]["content"][0]
    return call


def never_asked_1x(fake: FakeOpencode) -> None:
    """No 1.x route was asked beyond detection, and nothing was written through the API."""
    assert fake.patches == []
    assert fake.replays == []
    asked = {request.path for request in fake.seen}
    assert not {path for path in asked if path.startswith(("/session", "/sync", "/global/event"))}


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]


async def test_2x_views_are_settled_as_2x_settles_them(fake: FakeOpencode, start: Start) -> None:
    fake.version = "2.1.2"
    fake.bodies[VIEW] = stale_2x_view()
    call = await settled_call(await start())
    assert call["state"] == {
        "status": "error",
        "error": {"type": "aborted", "message": "Tool execution interrupted: shell"},
        "input": {"command": "sleep 600"},
        "metadata": {"output": "hi\n"},
    }
    assert call["time"]["completed"] == 1791430444073


async def test_a_live_2x_call_is_not_touched(fake: FakeOpencode, start: Start) -> None:
    fake.version = "2.1.2"
    fake.bodies[VIEW] = stale_2x_view()
    fake.v2_active.add(SESSION)
    assert (await settled_call(await start()))["state"]["status"] == "running"


@pytest.mark.parametrize(
    ("version", "dialect", "route"), [("2.1.2", "2.x", "/api/info"), ("1.18.33", "1.18", "/global/health")]
)
async def test_health_names_the_version_and_the_dialect(
    fake: FakeOpencode, start: Start, version: str, dialect: str, route: str
) -> None:
    fake.version = version
    health = await (await (await start()).get("/_settle/health")).json()
    assert health["status"] == "ok"
    assert (health["upstream"]["version"], health["upstream"]["dialect"]) == (version, dialect)
    assert health["upstream"]["route"] == route


@pytest.mark.parametrize("mode", [WriteBackMode.API, WriteBackMode.DB])
async def test_write_back_is_refused_on_2x_with_one_line_and_writes_nothing(
    fake: FakeOpencode, start: Start, mode: WriteBackMode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.version = "2.1.2"
    fake.bodies[VIEW] = stale_2x_view()
    database = tmp_path / "opencode.db"
    with contextlib.closing(sqlite3.connect(database)) as rows, rows:  # 2.x's table, as its bus writes it
        rows.execute("CREATE TABLE session_message (id TEXT PRIMARY KEY, data TEXT)")
        rows.execute("INSERT INTO session_message VALUES ('msg_1', ?)", (stale_2x_view().decode(),))
    before = database.read_bytes()
    proxy = await start(write_back=mode, db_path=database, lock_dir=tmp_path)
    assert (await settled_call(proxy))["state"]["status"] == "error"
    await idle(proxy.app)
    assert database.read_bytes() == before
    said = [
        record.getMessage() for record in caplog.records if "does nothing on opencode" in record.getMessage()
    ]
    assert said == [
        f"--write-back {mode} does nothing on opencode 2.1.2: no writer of the proxy's exists for the 2.x "
        "line: 2.x settles an interrupted call itself when the session's next turn starts (a prompt, or "
        "`--resume`); no route settles one without running the model, and only its own event bus writes "
        "its database"
    ]
    never_asked_1x(fake)
    no_traceback(caplog)


async def test_a_release_past_the_2x_line_is_that_line_and_never_written_into(
    fake: FakeOpencode, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    fake.version = "3.0.0"
    fake.bodies[VIEW] = stale_2x_view()
    proxy = await start(write_back=WriteBackMode.API, resume=False)
    call = await settled_call(proxy)
    assert call["state"]["error"]["message"] == "Tool execution interrupted: shell"
    await idle(proxy.app)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(
        message.startswith("opencode 3.0.0 is past the releases of the 2.x line") for message in warnings
    )
    assert any(message.startswith("--write-back api does nothing on opencode 3.0.0") for message in warnings)
    never_asked_1x(fake)
    no_traceback(caplog)


async def test_a_1x_version_past_the_line_is_settled_in_its_shape_and_not_written(
    fake: FakeOpencode, start: Start
) -> None:
    fake.version = "1.19.0"
    fake.bodies[VIEW] = stale_2x_view()
    proxy = await start(write_back=WriteBackMode.API)
    call = await settled_call(proxy)
    assert call["state"]["error"] == {"type": "unknown", "message": "Tool execution interrupted"}  # 1.18's v2
    await idle(proxy.app)
    assert fake.replays == []
    health = await (await proxy.get("/_settle/health")).json()
    assert health["upstream"]["known_version"] is False
    assert health["upstream"]["dialect"] == LINE_1_18.name


async def test_a_server_that_cannot_tell_gets_its_bytes_back(
    fake: FakeOpencode, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    fake.version = "2.1.2"
    fake.web_app = True  # every route it has nothing for answers HTML, its health routes included
    fake.bodies[VIEW] = body = stale_2x_view()
    proxy = await start()
    for _ in range(2):
        assert await (await proxy.get(VIEW)).read() == body
    health = await (await proxy.get("/_settle/health")).json()
    assert health["status"] == "upstream not known yet"
    assert "/api/info answered text/html, not JSON" in health["upstream"]["not_known"]
    said = [record for record in caplog.records if "is not known yet" in record.getMessage()]
    assert len(said) == 1
    assert "/global/health answered text/html, not JSON" in said[0].getMessage()


async def test_resume_on_1_18_without_write_back_says_what_to_add_and_skips_each_turn(
    fake: FakeOpencode, start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On 1.18 only a write-back makes a settlement durable: without one, one WARNING for the
    server (not again for the same server after a restart), and each turn the crash interrupted
    gets one decision line, never a prompt."""
    add_a_writer = (
        "on the 1.18 line a settlement is durable only through a write-back, and a turn is resumed, or "
        "waits for a Continue, only after a durable settlement: add `--write-back api` or `--write-back db`"
    )
    proxy = await start(resume=True, state_db=tmp_path / "s.db")
    await following(proxy)
    async with hearing(proxy.app, "session.status", "ses_busy"):
        fake.publish("session.status", "ses_busy", status={"type": "busy"})
    async with refollowing(proxy.app):
        fake.drop_streams()  # the server died mid-turn, and is back as the same server
    decisions = (await (await proxy.get("/_settle/resume")).json())["decisions"]
    assert [(d["outcome"], d["session"], d["why"]) for d in decisions] == [
        ("skipped", "ses_busy", f"--resume does nothing: {add_a_writer}")
    ]
    said = [record for record in caplog.records if record.getMessage().startswith("--resume")]
    assert [(record.levelno, record.getMessage()) for record in said] == [
        (logging.WARNING, f"--resume does nothing on opencode 1.18.33: {add_a_writer}")
    ]
    assert not [request for request in fake.seen if request.method == "POST"]
    no_traceback(caplog)


async def test_resume_on_2x_is_not_refused_and_asks_no_1x_route(
    fake: FakeOpencode, start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.version = "2.1.2"
    proxy = await start(resume=True, state_db=tmp_path / "s.db")  # no write-back: 2.x settles itself
    health = await (await proxy.get("/_settle/health")).json()
    assert health["upstream"]["dialect"] == "2.x"
    said = [record.getMessage() for record in caplog.records if record.getMessage().startswith("--resume")]
    # Continued through 2.x's own settle-then-continue (tests/proxy/resume/test_resume_2x.py).
    assert said == []
    never_asked_1x(fake)
    no_traceback(caplog)


async def test_a_server_that_restarts_as_another_line_is_asked_again(
    fake: FakeOpencode, start: Start
) -> None:
    fake.bodies[VIEW] = stale_2x_view()
    proxy = await start()
    await following(proxy)
    line = proxy.app[ASSEMBLY].started.line
    told: asyncio.Queue[KnownServer] = asyncio.Queue()
    line.listeners.append(told.put_nowait)
    fake.version = "2.1.2"
    fake.drop_streams()  # the 1.18 server went away; a 2.x one answers in its place
    known = await asyncio.wait_for(told.get(), WAIT_S)
    assert (known.version, known.dialect.name) == ("2.1.2", "2.x")
    assert (await settled_call(proxy))["state"]["error"]["type"] == "aborted"


async def test_a_server_not_followed_is_asked_again_as_soon_as_it_restarted(
    fake: FakeOpencode, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No lost stream says that a server whose stream is not followed restarted; `run`'s supervisor
    does (it forgets the line), and the server is asked again then, and its stream tried, not only
    once a while has passed."""
    monkeypatch.setattr(tracker, "REDETECT_S", 3600.0)
    fake.version = "3.0.0"
    proxy = await start()
    line = proxy.app[ASSEMBLY].started.line
    told: asyncio.Queue[KnownServer] = asyncio.Queue()
    line.listeners.append(told.put_nowait)
    assert (await asyncio.wait_for(told.get(), WAIT_S)).version == "3.0.0"
    fake.version = "2.1.2"
    line.forget()  # what the supervisor does when the server exits
    assert (await asyncio.wait_for(told.get(), WAIT_S)).version == "2.1.2"
    assert await eventually(lambda: "/api/event" in {request.path for request in fake.seen})
