"""`GET /_settle/resume`, and `--resume` as the application and its settings take it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.writeback.scheduler import WriteBackMode

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
    assert (await (await client.get("/_settle/resume")).json())["enabled"] is False


async def test_resume_without_write_back_is_on(
    upstream: TestServer, aiohttp_client: Client, tmp_path: Path
) -> None:
    """Whether a line can resume without a writer is said when the server is known (2.x can)."""
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), resume=True, state_db=tmp_path / "s.db")
    client = await aiohttp_client(create_app(settings))
    assert (await (await client.get("/_settle/resume")).json())["enabled"] is True
