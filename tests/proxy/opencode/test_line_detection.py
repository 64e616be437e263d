"""Which line a server is, by the shape of its health answer: every answer measured or read in the
source, with every kind of version string, and what the proxy may do on each."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import hdrs, web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi, basic_as
from proxy.opencode.dialects import LINE_1_18, LINE_2X, Dialect, line_of
from proxy.opencode.server_line import KnownServer, ServerLine
from proxy.service.config import basic_authorization

FIXTURES = Path(__file__).parents[2] / "fixtures" / "opencode-1.18.33"
INFO = {"pid": 7, "urls": ["http://127.0.0.1:4096"], "paths": {"home": "/home/u"}}
"""2.x's `ServerInfo` besides its version (`packages/protocol/src/groups/server.ts` @51819a10a412)."""
Routes = dict[str, tuple[int, str, bytes]]
"""What each route answers: status, content type, body; a route absent answers 404."""


@pytest.mark.parametrize(
    ("path", "body", "line"),
    [
        ("/api/info", {"version": "2.1.2"} | INFO, LINE_2X),
        ("/api/health", {"healthy": True, "version": "local", "pid": 7}, LINE_2X),  # v2 @2092350c
        ("/global/health", {"healthy": True, "version": "1.18.33"}, LINE_1_18),
        ("/api/health", {"healthy": True}, None),  # 1.18.33's v2 API: no line's shape
        ("/api/info", {"version": "2.1.2"}, None),  # no pid: not ServerInfo
        ("/global/health", {"healthy": True}, None),
        ("/api/health", {"healthy": True, "version": 2, "pid": 7}, None),  # a version that is no string
        ("/global/health", {"healthy": True, "version": "2.1.2", "pid": 7}, LINE_1_18),  # the route's line
    ],
)
def test_the_shape_of_the_answer_says_the_line(
    path: str, body: dict[str, object], line: Dialect | None
) -> None:
    assert line_of(path, body) is line


@pytest.fixture
async def serve(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> AsyncIterator[Callable[[Routes], Awaitable[tuple[ServerLine, list[tuple[str, str]]]]]]:
    """A line asking a server that answers `routes`, and what it was asked: (path, Authorization)."""
    async with aiohttp.ClientSession() as session:

        async def made(routes: Routes) -> tuple[ServerLine, list[tuple[str, str]]]:
            asked: list[tuple[str, str]] = []

            async def handle(request: web.Request) -> web.Response:
                asked.append((request.path, request.headers.get(hdrs.AUTHORIZATION, "")))
                status, content_type, body = routes.get(request.path, (404, "text/plain", b""))
                return web.Response(status=status, content_type=content_type, body=body)

            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", handle)
            server = await aiohttp_server(app)
            upstream = UpstreamApi(session, URL(str(server.make_url("/"))))
            own = Credentials.configured(basic_authorization("alice", "pw"))
            return ServerLine(upstream, own), asked

        yield made


def _json(body: str) -> tuple[int, str, bytes]:
    return 200, "application/json", body.encode()


@pytest.mark.parametrize(
    ("route", "fields", "version", "line", "writable"),
    [
        ("/api/info", '"pid":7,"urls":[],"paths":{}', "2.1.2", LINE_2X, True),
        ("/api/info", '"pid":7,"urls":[],"paths":{}', "3.0.0", LINE_2X, False),
        ("/api/health", '"healthy":true,"pid":7', "local", LINE_2X, False),
        ("/api/health", '"healthy":true,"pid":7', "dev", LINE_2X, False),
        ("/api/health", '"healthy":true,"pid":7', "0.0.0-dev-202608071200", LINE_2X, False),
        ("/api/health", '"healthy":true,"pid":7', "2.0.3", LINE_2X, True),
        ("/global/health", '"healthy":true', "1.18.33", LINE_1_18, True),
        ("/global/health", '"healthy":true', "1.18.34", LINE_1_18, True),
        ("/global/health", '"healthy":true', "1.19.0", LINE_1_18, False),
        ("/global/health", '"healthy":true', "local", LINE_1_18, False),
        ("/global/health", '"healthy":true', "0.0.0-main-202611300000", LINE_1_18, False),
    ],
)
async def test_each_shape_and_version_gives_a_line_followed_and_told_and_written_into_only_on_a_release(
    *,
    serve: Callable[[Routes], Awaitable[tuple[ServerLine, list[tuple[str, str]]]]],
    caplog: pytest.LogCaptureFixture,
    route: str,
    fields: str,
    version: str,
    line: Dialect,
    writable: bool,
) -> None:
    server, _ = await serve({route: _json(f'{{"version":"{version}",{fields}}}')})
    with caplog.at_level(logging.INFO, "proxy"):
        known = await server.known()
    assert known == KnownServer(version, line, True, route, writable)
    assert known.refusal("follow") is None
    for mode in ("api", "db"):
        refused = known.refusal(mode)
        assert (refused is None) is (writable and mode in line.writers), (mode, refused)
    # 2.x resumes through its own settle-then-continue; 1.18 only after a write-back it may make.
    assert (known.refusal("resume", writer="db") is None) is (line is LINE_2X or writable)
    said = [record for record in caplog.records if record.name.startswith("proxy.opencode.server_line")]
    assert len(said) == 1
    from_source = version in ("local", "dev") or version.startswith("0.0.0")
    assert said[0].levelno == (logging.WARNING if not writable and not from_source else logging.INFO)
    if from_source:
        assert f"version {version}, from-source build" in said[0].getMessage()
    if not writable:
        done = (
            "resumed as that line" if line is LINE_2X else "nothing is written into it, so no turn is resumed"
        )
        assert done in said[0].getMessage()


def _captured() -> Routes:
    """1.18.33's real answers to each health route (`health-routes.txt`, measured)."""
    text = (FIXTURES / "health-routes.txt").read_text()
    routes: Routes = {}
    for found in re.finditer(r"^--- GET (\S+) -> (\d+) (\S+)\n(.*)$", text, re.MULTILINE):
        path, status, content_type, body = found.groups()
        routes[path] = int(status), content_type, body.encode()
    return routes


async def test_1_18_33s_own_answers_say_1_18_though_it_answers_api_health_too(
    serve: Callable[[Routes], Awaitable[tuple[ServerLine, list[tuple[str, str]]]]],
) -> None:
    routes = _captured()
    assert routes["/api/health"][2] == b'{"healthy":true}'
    assert routes["/api/info"][1] == "text/html"
    server, asked = await serve(routes)
    assert await server.known() == KnownServer("1.18.33", LINE_1_18, True, "/global/health", True)
    assert [path for path, _ in asked] == ["/api/info", "/api/health", "/global/health"]


async def test_the_v2_branch_built_from_source_is_2x_and_is_asked_as_opencode(
    serve: Callable[[Routes], Awaitable[tuple[ServerLine, list[tuple[str, str]]]]],
) -> None:
    """Measured on the v2 branch @2092350c: `/api/info` and `/global/health` 404, `/api/health`
    names `local`. 2.x's user is always `opencode`; 1.x's routes are asked as the one configured."""
    server, asked = await serve({"/api/health": _json('{"healthy":true,"version":"local","pid":4242}')})
    known = await server.known()
    assert known == KnownServer("local", LINE_2X, True, "/api/health", False)
    assert known.from_source
    assert known.health_route == "/api/health"
    assert server.health_route(LINE_2X) == "/api/health"
    opencode, alice = basic_authorization("opencode", "pw"), basic_authorization("alice", "pw")
    assert asked == [("/api/info", opencode), ("/api/health", opencode)]
    assert server.user() == "opencode"
    assert basic_as(alice, "opencode") == opencode


def test_only_the_proxys_own_credentials_are_made_the_lines_user() -> None:
    alice = basic_authorization("alice", "p:w")
    own = Credentials.configured(alice)
    assert own.as_user("opencode").headers == {hdrs.AUTHORIZATION: basic_authorization("opencode", "p:w")}
    assert own.as_user(None) is own
    client = Credentials(headers={hdrs.AUTHORIZATION: alice})
    assert client.as_user("opencode") is client  # a client's own are sent as it sent them
    assert basic_as("Bearer x", "opencode") == "Bearer x"
    assert basic_as("Basic !!!", "opencode") == "Basic !!!"
