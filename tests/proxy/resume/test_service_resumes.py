"""A 2.x server that continues interrupted turns itself (2.1.2's `serve --service`, measured) is
known by the command line of the process its `/api/info` names, or by the restart notice it
admits, and said once; a plain `serve` is not taken for one."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.resume.continuing import Continuation, restart_notice
from proxy.system import procfs
from tests.integration.polling import poll

SLEEPER = "import time; time.sleep(60)"


def started(*flags: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line ends `serve *flags --port 1`, once /proc shows it (it is empty
    for a moment after the exec)."""
    process = subprocess.Popen([sys.executable, "-c", SLEEPER, "serve", *flags, "--port", "1"])
    try:
        poll(
            lambda: "--port" in procfs.command_line(process.pid) or None, what="its command line", timeout=10
        )
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def service() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line is a service's: `… serve --service --port 1`."""
    yield from started("--service")


@pytest.fixture
def plain() -> Iterator[subprocess.Popen[bytes]]:
    yield from started()


async def continuation_for(pids: list[int]) -> tuple[Continuation, TestServer, aiohttp.ClientSession]:
    """A Continuation of a server whose `/api/info` names each of `pids` in turn, then the last."""

    async def info(_: web.Request) -> web.Response:
        pid = pids.pop(0) if len(pids) > 1 else pids[0]
        return web.json_response({"version": "2.1.2", "pid": pid, "urls": [], "paths": {}})

    app = web.Application()
    app.router.add_get("/api/info", info)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    session = aiohttp.ClientSession()
    origin = URL(str(server.make_url("/")))
    api = UpstreamApi(session, origin)
    made = Continuation(session, api, LivenessProbe(api), origin, Credentials.configured(None))
    return made, server, session


async def test_a_service_command_line_is_known_and_said_once(
    service: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "proxy.resume")
    made, server, session = await continuation_for([service.pid])
    try:
        first, again = await made.resumes_itself(), await made.resumes_itself()
    finally:
        await session.close()
        await server.close()
    assert first == again == f"its command line says so (pid {service.pid}: serve --service)"
    assert len([r for r in caplog.records if "resumes interrupted turns itself" in r.getMessage()]) == 1


async def test_a_plain_serve_is_not_a_service_and_a_restart_into_one_is_known(
    plain: subprocess.Popen[bytes], service: subprocess.Popen[bytes]
) -> None:
    made, server, session = await continuation_for([plain.pid, service.pid])
    try:
        before, after = await made.resumes_itself(), await made.resumes_itself()
    finally:
        await session.close()
        await server.close()
    assert before is None
    assert after is not None
    assert f"pid {service.pid}" in after


async def test_a_restart_notice_newer_than_the_crash_is_known_when_no_process_can_be_seen(
    plain: subprocess.Popen[bytes],
) -> None:
    """Another host's server (here: a process with a plain command line) is known by what it does."""
    notice = {"id": "msg_3", "type": "synthetic", "metadata": {"notice": "restart"}, "text": "…"}
    made, server, session = await continuation_for([plain.pid])
    try:
        assert await made.resumes_itself() is None
        made.heard({"data": [notice]}, "ses_1", "msg_3")
        unmoved = await made.resumes_itself()
        made.heard({"data": [notice]}, "ses_1", "msg_2")
        known = await made.resumes_itself()
    finally:
        await session.close()
        await server.close()
    assert unmoved is None, "a notice older than the crash says nothing of the server now"
    assert known == "it continued session ses_1 itself (its restart notice msg_3)"


def test_only_a_synthetic_restart_notice_counts() -> None:
    other = {"id": "msg_5", "type": "synthetic", "metadata": {"notice": "compaction"}}
    user = {"id": "msg_6", "type": "user", "metadata": {"notice": "restart"}}
    assert restart_notice({"data": [other, user]}, "msg_1") is None
    assert restart_notice({"data": "garbage"}, "msg_1") is None
    assert restart_notice([], "msg_1") is None
