"""`GET /_settle/resume`, and `--resume` as the application and its settings take it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy.opencode.dialects import LINE_1_18
from proxy.resume.last_turn import InterruptedTurn
from proxy.resume.waiting import Waiting
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings
from proxy.writeback.modes import WriteBackMode
from rules import Api
from tests.proxy.fake_opencode import FakeOpencode

Client = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]


async def test_resume_is_off_and_says_so(upstream: TestServer, aiohttp_client: Client) -> None:
    client = await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))
    answer = await client.get("/_settle/resume")
    assert await answer.json() == {
        "enabled": False,
        "dry_run": False,
        "continue": False,
        "running": [],
        "waiting": [],
        "decisions": [],
        "reason": "nothing is resumed and no turn waits: there is no state database to keep resumes in",
    }


async def test_resume_on_opens_its_ledger_in_the_state_database(
    upstream: TestServer, aiohttp_client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        upstream=URL(str(upstream.make_url("/"))),
        write_back=WriteBackMode.API,
        resume=True,
        state_db=tmp_path / "state" / "processes.db",
        lock_dir=tmp_path / "locks",
    )
    client = await aiohttp_client(create_app(settings))
    assert (await (await client.get("/_settle/resume")).json())["enabled"] is True
    assert (tmp_path / "state" / "processes.db").is_file()


async def test_resume_without_a_state_database_is_off_and_says_so(
    upstream: TestServer, aiohttp_client: Client
) -> None:
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), write_back=WriteBackMode.API, resume=True)
    client = await aiohttp_client(create_app(settings))
    said = await (await client.get("/_settle/resume")).json()
    assert (said["enabled"], said["reason"]) == (
        False,
        "nothing is resumed and no turn waits: there is no state database to keep resumes in",
    )


WITHOUT_WRITE_BACK = (
    "on the 1.18 line a settlement is durable only through a write-back, and a turn is resumed, or "
    "waits for a Continue, only after a durable settlement: add `--write-back api` or `--write-back db`"
)


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "no-resume"])
async def test_on_1x_without_write_back_every_surface_says_nothing_is_resumed_nor_waits(
    upstream: TestServer,
    aiohttp_client: Client,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    resume: bool,
) -> None:
    """The startup line (said before the server is known), `GET /_settle/resume` and a Continue
    tell the same: on 1.18 a turn is resumed, or waits, only after a write-back settled it."""
    caplog.set_level(logging.INFO, logger="proxy.resume.resuming")
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), resume=resume, state_db=tmp_path / "s.db")
    app = create_app(settings)
    client = await aiohttp_client(app)
    await app[ASSEMBLY].started.line.known()
    said = await (await client.get("/_settle/resume")).json()
    assert (said["enabled"], said["continue"]) == (False, False)
    assert said["reason"] == f"nothing is resumed and no turn waits on opencode 1.18.33: {WITHOUT_WRITE_BACK}"
    answer = await client.post("/_settle/resume/ses_1")
    assert answer.status == 404
    assert (await answer.json())["message"] == f"no turn waits for a person here: {WITHOUT_WRITE_BACK}"
    (started,) = [r.getMessage() for r in caplog.records if r.name == "proxy.resume.resuming"]
    assert started.endswith(f"; but {WITHOUT_WRITE_BACK}")


async def test_resume_without_write_back_is_on_for_2x(
    fake: FakeOpencode, upstream: TestServer, aiohttp_client: Client, tmp_path: Path
) -> None:
    """2.x settles an interrupted turn itself as it continues it: no write-back is needed."""
    fake.version = "2.1.2"
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), resume=True, state_db=tmp_path / "s.db")
    app = create_app(settings)
    client = await aiohttp_client(app)
    assert (await app[ASSEMBLY].started.line.known()) is not None
    said = await (await client.get("/_settle/resume")).json()
    assert (said["enabled"], said["continue"], "reason" in said) == (True, True, False)


async def test_with_write_back_resume_is_on_for_1x(
    upstream: TestServer, aiohttp_client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        upstream=URL(str(upstream.make_url("/"))),
        resume=True,
        write_back=WriteBackMode.API,
        state_db=tmp_path / "s.db",
        lock_dir=tmp_path / "locks",
    )
    app = create_app(settings)
    client = await aiohttp_client(app)
    await app[ASSEMBLY].started.line.known()
    said = await (await client.get("/_settle/resume")).json()
    assert (said["enabled"], said["continue"], "reason" in said) == (True, True, False)


async def test_continue_answers_404_for_a_session_that_does_not_wait(
    upstream: TestServer, aiohttp_client: Client, tmp_path: Path
) -> None:
    url = URL(str(upstream.make_url("/")))
    for settings in (Settings(upstream=url), Settings(upstream=url, state_db=tmp_path / "s.db")):
        client = await aiohttp_client(create_app(settings))
        answer = await client.post("/_settle/resume/ses_nobody")
        assert answer.status == 404
        assert (await answer.json())["error"] == "not_waiting"


async def test_continue_continues_a_waiting_turn_once_and_a_second_is_409(
    upstream: TestServer, aiohttp_client: Client, tmp_path: Path
) -> None:
    """Without --resume too: the turn waits for the person's Continue."""
    settings = Settings(
        upstream=URL(str(upstream.make_url("/"))),
        write_back=WriteBackMode.API,
        state_db=tmp_path / "s.db",
        lock_dir=tmp_path / "locks",
    )
    app = create_app(settings)
    client = await aiohttp_client(app)
    resuming = app[ASSEMBLY].started.resuming
    assert resuming is not None
    turn = InterruptedTurn("ses_1", Api.V1, "msg_002", (), None, None, None)
    await resuming.waiting.add(Waiting(turn, "/work", (), 1.0, "--resume is off", LINE_1_18.name, 1.0))
    listed = (await (await client.get("/_settle/resume")).json())["waiting"]
    assert [w["session"] for w in listed] == ["ses_1"]
    first = await client.post("/_settle/resume/ses_1")
    assert first.status == 202
    assert (await first.json())["continuing"]["message"] == "msg_002"
    second = await client.post("/_settle/resume/ses_1")
    assert second.status == 409
    assert "continued already" in (await second.json())["message"]
    assert (await (await client.get("/_settle/resume")).json())["waiting"] == []


async def test_continue_is_behind_the_upstreams_credentials(
    upstream: TestServer, aiohttp_client: Client, tmp_path: Path
) -> None:
    settings = Settings(
        upstream=URL(str(upstream.make_url("/"))),
        state_db=tmp_path / "s.db",
        authorization="Basic b3BlbmNvZGU6eA==",
    )
    client = await aiohttp_client(create_app(settings))
    assert (await client.post("/_settle/resume/ses_1")).status == 401
