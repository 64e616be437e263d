"""Which server the upstream is: each line's own route, asked in turn; anything else is "not
known yet", asked again and said once, with why."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.dialects import LINE_1_18, LINE_2X, parse_version, release, route_line
from proxy.opencode.server_line import KnownServer, ServerLine
from proxy.supervision.server_command import free_loopback_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
line_log = "proxy.opencode.server_line"


@dataclass
class Answers:
    """What each route answers; a route absent answers 404. `asked` records every request."""

    routes: dict[str, Handler] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.asked.append(request.path)
        handler = self.routes.get(request.path)
        return await handler(request) if handler is not None else web.Response(status=404)


def json_answer(body: object, status: int = 200, **headers: str) -> Handler:
    async def answer(_: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status, headers=headers)

    return answer


def html(_: web.Request) -> Awaitable[web.StreamResponse]:
    async def page() -> web.StreamResponse:
        return web.Response(text="<!doctype html><html></html>", content_type="text/html")

    return page()


@pytest.fixture
def answers() -> Answers:
    return Answers()


@pytest.fixture
async def line(
    answers: Answers, aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]
) -> AsyncIterator[ServerLine]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answers.handle)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        yield ServerLine(UpstreamApi(session, URL(str(server.make_url("/")))), Credentials())


async def test_2x_names_itself_on_api_info(line: ServerLine, answers: Answers) -> None:
    answers.routes["/api/info"] = json_answer({"version": "2.1.2", "pid": 7, "urls": [], "paths": {}})
    known = await line.known()
    assert known == KnownServer("2.1.2", LINE_2X, True, "/api/info")
    assert answers.asked == ["/api/info"]
    assert known.refusal("api") is not None
    assert "event bus" in str(known.refusal("db"))
    # Continued through 2.x's own settle-then-continue, which makes the settlement durable itself.
    assert known.refusal("resume") is None


async def test_early_2_0_names_itself_on_api_health(line: ServerLine, answers: Answers) -> None:
    answers.routes["/api/health"] = json_answer({"healthy": True, "version": "2.0.3", "pid": 7})
    known = await line.known()
    assert (known and known.version, known and known.dialect) == ("2.0.3", LINE_2X)


async def test_1x_behind_a_web_app_fallback_is_known_by_global_health(
    line: ServerLine, answers: Answers, caplog: pytest.LogCaptureFixture
) -> None:
    answers.routes["/api/info"] = html
    answers.routes["/api/health"] = html
    answers.routes["/global/health"] = json_answer({"healthy": True, "version": "1.18.34"})
    with caplog.at_level(logging.INFO):
        known = await line.known()
    assert known == KnownServer("1.18.34", LINE_1_18, True, "/global/health")  # a patch release: the line
    assert known.refusal("api") is None
    assert known.refusal("resume", writer="db") is None
    # Only a writer makes a settlement durable on 1.18, and a turn is resumed only after one.
    assert "add `--write-back api` or `--write-back db`" in str(known.refusal("resume"))
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


async def test_once_known_it_is_not_asked_again_until_forgotten(line: ServerLine, answers: Answers) -> None:
    answers.routes["/global/health"] = json_answer({"healthy": True, "version": "1.18.33"})
    await line.known()
    await line.known()
    assert answers.asked == ["/api/info", "/api/health", "/global/health"]
    line.forget()
    assert line.current is None
    await line.known()
    assert answers.asked[3:] == ["/global/health"]  # the line it was is asked first


async def test_a_server_that_cannot_tell_is_asked_again_and_said_once_with_why(
    line: ServerLine, answers: Answers, caplog: pytest.LogCaptureFixture
) -> None:
    answers.routes["/api/info"] = html
    answers.routes["/api/health"] = json_answer({"_tag": "UnauthorizedError"}, status=401)
    answers.routes["/global/health"] = json_answer([1, 2])
    assert await line.known() is None
    assert await line.known() is None
    said = [record.getMessage() for record in caplog.records if "not known yet" in record.getMessage()]
    assert len(said) == 1
    assert "/api/info answered text/html, not JSON" in said[0]
    assert "/api/health answered HTTP 401" in said[0]
    assert "/global/health answered JSON that names no server" in said[0]
    assert line.why_unknown is not None
    answers.routes["/global/health"] = json_answer({"healthy": True, "version": "1.18.33"})
    known = await asyncio.wait_for(line.detected(), 5)
    assert known.dialect is LINE_1_18


async def test_a_booting_2x_is_waited_for_as_it_asks(line: ServerLine, answers: Answers) -> None:
    answers.routes["/api/info"] = json_answer(
        {"_tag": "ServiceUnavailableError"}, 503, **{"Retry-After": "0"}
    )
    assert await line.known() is None
    assert answers.asked == ["/api/info"]  # a 2.x that is starting: no other route is asked
    assert line.why_unknown == "/api/info answered 503 (starting, retry after 0 s)"


async def test_an_api_info_that_is_not_json_is_not_believed(line: ServerLine, answers: Answers) -> None:
    async def garbage(_: web.Request) -> web.StreamResponse:
        return web.Response(body=b"{not json", content_type="application/json")

    answers.routes["/api/info"] = garbage
    assert await line.known() is None
    assert "/api/info answered JSON that does not parse" in str(line.why_unknown)


async def test_an_answer_in_no_lines_shape_is_named_once_and_gets_views_at_most(
    line: ServerLine, answers: Answers, caplog: pytest.LogCaptureFixture
) -> None:
    told: list[KnownServer] = []
    line.listeners.append(told.append)
    answers.routes["/api/info"] = json_answer({"version": "3.0.0"})  # no pid: not 2.x's ServerInfo
    known = await line.known()
    assert known == KnownServer("3.0.0", LINE_2X, False, "/api/info", False)
    line.forget()
    await line.known()
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "opencode 3.0.0 answered /api/info in no line's shape" in warnings[0]
    assert told == [known]
    for doing in ("api", "db", "resume", "follow"):
        assert "3.0.0" in str(known.refusal(doing))


async def test_a_release_past_the_line_is_that_line_and_written_into_never(
    line: ServerLine, answers: Answers, caplog: pytest.LogCaptureFixture
) -> None:
    answers.routes["/api/info"] = json_answer({"version": "3.0.0", "pid": 7, "urls": [], "paths": {}})
    known = await line.known()
    assert known == KnownServer("3.0.0", LINE_2X, True, "/api/info", False)
    assert (known.refusal("follow"), known.refusal("resume")) == (None, None)
    assert "no writer of the proxy's exists for the 2.x line" in str(known.refusal("db"))
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "opencode 3.0.0 is past the releases of the 2.x line" in warnings[0]
    assert "read, followed, told and resumed as that line; nothing is written into it" in warnings[0]


async def test_an_unreachable_server_is_not_known() -> None:
    async with aiohttp.ClientSession() as session:
        line = ServerLine(
            UpstreamApi(session, URL(f"http://127.0.0.1:{free_loopback_port()}")), Credentials()
        )
        assert await line.known() is None
    assert str(line.why_unknown).startswith("it cannot be reached")


async def test_a_server_being_started_is_not_said_unreachable_until_it_is_started(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under `run`: the supervisor says the server is being started; that it cannot be reached yet
    is no news. Once it is started, an unreachable server is said, once."""
    absent = True
    async with aiohttp.ClientSession() as session:
        upstream = UpstreamApi(session, URL(f"http://127.0.0.1:{free_loopback_port()}"))
        line = ServerLine(upstream, Credentials(), absent=lambda: absent)
        with caplog.at_level(logging.INFO):
            assert await line.known() is None
            assert str(line.why_unknown).startswith("it cannot be reached")
            assert not [record for record in caplog.records if "not known yet" in record.getMessage()]
            absent = False
            assert await line.known() is None
            assert await line.known() is None
    said = [record.getMessage() for record in caplog.records if "not known yet" in record.getMessage()]
    assert len(said) == 1
    assert "it cannot be reached" in said[0]


async def test_a_refused_connection_is_one_warning_and_its_return_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=line_log)
    answers = Answers({"/global/health": json_answer({"healthy": True, "version": "1.18.33"})})
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answers.handle)
    port = free_loopback_port()
    async with aiohttp.ClientSession() as session:
        line = ServerLine(UpstreamApi(session, URL(f"http://127.0.0.1:{port}")), Credentials())
        for _ in range(3):
            assert await line.known() is None
        for restart in range(2):
            async with TestServer(app, port=port):
                assert await line.known() is not None
                line.forget()
            if not restart:
                assert await line.known() is None
    said = [(record.levelno, record.getMessage()) for record in caplog.records if record.name == line_log]
    down = "the upstream's opencode server is not known yet (it cannot be reached: "
    assert [(level, text[: len(down)]) for level, text in said] == [
        (logging.WARNING, down),
        (logging.INFO, "upstream is opencode 1.18.33: the 1.18 line"[: len(down)]),
        (logging.WARNING, down),
        (logging.INFO, "upstream answers again: opencode 1.18.33"),
    ]


def test_versions_and_lines() -> None:
    assert parse_version("v2.1.2") == (2, 1, 2)
    assert parse_version("2.0.0-beta.3") == (2, 0, 0)
    assert parse_version("unknown") is None
    assert release("1.18.33") == (1, 18, 33)
    for build in ("local", "dev", "0.0.0-dev-202608071200", "0.0.0"):
        assert release(build) is None, build
    assert route_line("/api/health") is LINE_2X
    assert route_line("/global/health") is LINE_1_18


async def test_a_health_without_a_version_is_believed_only_when_no_route_names_one(
    line: ServerLine, answers: Answers
) -> None:
    answers.routes["/api/health"] = json_answer({"healthy": True})  # as 1.18.33's v2 API answers it
    answers.routes["/global/health"] = json_answer({"healthy": True, "version": "1.18.33"})
    assert await line.known() == KnownServer("1.18.33", LINE_1_18, True, "/global/health")
    del answers.routes["/global/health"]
    line.forget()
    known = await line.known()
    assert known == KnownServer("unknown", LINE_2X, False, "/api/health", False)  # in no line's shape
