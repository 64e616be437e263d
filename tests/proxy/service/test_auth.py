"""`--auth`: its USER:PASSWORD, and the guard it puts in front of an application."""

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.auth import REALM, basic_credentials, require_basic_auth
from proxy.service.config import Settings, basic_authorization, parse_credentials

Client = TestClient[web.Request, web.Application]


def test_credentials_split_at_the_first_colon() -> None:
    assert parse_credentials("me:pa:ss") == ("me", "pa:ss")


@pytest.mark.parametrize("text", ["me", "me:", ":secret", ""])
def test_credentials_need_a_user_and_a_password(text: str) -> None:
    with pytest.raises(ValueError, match="expected USER:PASSWORD"):
        parse_credentials(text)


@pytest.fixture
async def guarded(aiohttp_client: Callable[[web.Application], Awaitable[Client]]) -> Client:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application(middlewares=[require_basic_auth("me", "pa:ss")])
    app.router.add_get("/", hello)
    return await aiohttp_client(app)


async def test_the_guard_lets_in_the_credentials_by_header_or_token(guarded: Client) -> None:
    header = await guarded.get("/", headers={"Authorization": basic_authorization("me", "pa:ss")})
    assert (header.status, await header.text()) == (200, "hello")
    token = base64.b64encode(b"me:pa:ss").decode()
    assert (await guarded.get("/", params={"auth_token": token})).status == 200


@pytest.mark.parametrize(
    ("headers", "params"),
    [
        ({}, {}),
        ({"Authorization": basic_authorization("me", "pa:sS")}, {}),
        ({}, {"auth_token": base64.b64encode(b"me:pa").decode()}),
        ({"Authorization": "Bearer pa:ss"}, {"auth_token": base64.b64encode(b"me:pa:ss").decode()}),
    ],
)
async def test_anything_else_is_a_json_401_naming_the_realm(
    guarded: Client, headers: dict[str, str], params: dict[str, str]
) -> None:
    """A token counts only when no Authorization header was sent: a header is never overruled."""
    refused = await guarded.get("/", headers=headers, params=params)
    assert refused.status == 401
    assert refused.headers["WWW-Authenticate"] == REALM
    assert (await refused.json())["error"] == "unauthorized"


OPENCODE = "opencode:s3cret-Pa55"
TOKEN = base64.b64encode(OPENCODE.encode()).decode()


@pytest.mark.parametrize(
    "header", [f"Basic {TOKEN}", f"basic {TOKEN}", f"BASIC {TOKEN}", f"bAsIc {TOKEN}", f" Basic   {TOKEN} "]
)
def test_the_basic_scheme_is_read_in_any_case_as_opencode_reads_it(header: str) -> None:
    """RFC 9110 §11.1: the scheme is case-insensitive; opencode 1.18.33 answered 200 to each form."""
    assert basic_credentials(header) == OPENCODE.encode()


@pytest.mark.parametrize(
    "header",
    [f"Bearer {TOKEN}", f"Basic{TOKEN}", "Basic \udcff\udcfe", f"Basic {TOKEN}\udcff", "Basic !!", "Basic"],
)
def test_anything_else_holds_no_credentials(header: str) -> None:
    assert basic_credentials(header) is None


async def _raw_get(client: Client, path: str, authorization: bytes) -> int:
    """The status of a GET whose `Authorization` is these bytes, sent as they are."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".encode()
    writer.write(head + b"Authorization: " + authorization + b"\r\n\r\n")
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return int(status_line.split()[1])


def _proxy(upstream: TestServer, **settings: Any) -> web.Application:
    return create_app(Settings(upstream=URL(str(upstream.make_url("/"))), **settings))


NOT_UTF8 = b"Basic \xff\xfe" + TOKEN.encode()
GUARDED = ("/_settle/health", "/_settle/metrics", "/_settle/resume", "/_settle/nothing")
EVERY_ROUTE = (*GUARDED, "/_settle/up", "/session/ses_x/message", "/global/health")


@pytest.mark.parametrize("with_auth", [False, True], ids=["password", "--auth"])
async def test_a_header_that_is_not_utf8_is_a_401_and_no_log_line(
    upstream: TestServer,
    aiohttp_client: Callable[[web.Application], Awaitable[Client]],
    caplog: pytest.LogCaptureFixture,
    with_auth: bool,
) -> None:
    """A 401 like any credentials that do not match (none of which is logged), never a 500 with a
    traceback that any client could repeat to fill the log."""
    auth = {"auth": ("opencode", "s3cret-Pa55")} if with_auth else {}
    proxy = await aiohttp_client(_proxy(upstream, authorization=f"Basic {TOKEN}", **auth))
    caplog.set_level(logging.INFO)
    for path in EVERY_ROUTE if with_auth else GUARDED:
        for _ in range(3):
            assert await _raw_get(proxy, path, NOT_UTF8) == 401, path
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert [record for record in caplog.records if record.exc_info] == []


@pytest.mark.parametrize("scheme", [b"basic", b"BASIC"])
@pytest.mark.parametrize("with_auth", [False, True], ids=["password", "--auth"])
async def test_the_right_credentials_open_whatever_the_schemes_case(
    upstream: TestServer,
    aiohttp_client: Callable[[web.Application], Awaitable[Client]],
    scheme: bytes,
    with_auth: bool,
) -> None:
    auth = {"auth": ("opencode", "s3cret-Pa55")} if with_auth else {}
    proxy = await aiohttp_client(_proxy(upstream, authorization=f"Basic {TOKEN}", **auth))
    assert await _raw_get(proxy, "/_settle/metrics", scheme + b" " + TOKEN.encode()) == 200
    assert await _raw_get(proxy, "/_settle/metrics", scheme + b" " + base64.b64encode(b"opencode:no")) == 401
