"""A server that wants a password, and a proxy without it or with a wrong one, as users start it:
one line names the fix, once; `/_settle/health` says the same; a client that presents the
server's password is not told to present it."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.service.config import basic_authorization
from tests.proxy.conftest import proxy_process
from tests.proxy.fake_opencode import FakeOpencode

FIX = "OPENCODE_SERVER_PASSWORD (on 2.x OPENCODE_PASSWORD) to the server's"
SERVERS = {"Authorization": basic_authorization("opencode", "s3cret")}
WRONG = base64.b64encode(b"opencode:wrong").decode()
ROUTES = ("/_settle/health", "/_settle/orphans", "/_settle/resume", "/_settle/metrics")


async def health(proxy_health: str, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as client, client.get(proxy_health, headers=headers) as response:
        return response.status, await response.json()


def fix_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if FIX in line]


async def test_no_password_names_the_fix_once_in_the_log_and_in_health(
    fake: FakeOpencode, upstream: TestServer, tmp_path: Path
) -> None:
    fake.password = "s3cret"
    log = tmp_path / "proxy.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")}
    own = {"Authorization": basic_authorization("admin", "mine")}
    async with proxy_process(upstream, log, "--auth", "admin:mine", env=env) as proxy:
        for _ in range(3):
            status, said = await health(str(proxy.with_path("/_settle/health")), own)
        assert status == 200, said
        upstream_said = said["upstream"]
        assert isinstance(upstream_said, dict)
        assert "the server wants a password and the proxy has none: set " + FIX in str(
            upstream_said["not_known"]
        )
    (line,) = fix_lines(log)
    assert "WARNING" in line


async def test_a_wrong_password_names_the_fix_and_admits_no_one_to_the_details(
    fake: FakeOpencode, upstream: TestServer, tmp_path: Path
) -> None:
    """The server refuses the proxy's credentials: a client presenting them would be shown what
    the server refuses it, and the server's own cannot be checked, so all are refused, with why."""
    fake.password = "s3cret"
    log = tmp_path / "proxy.log"
    env = {**os.environ, "OPENCODE_SERVER_PASSWORD": "wrong"}
    presented = [SERVERS, {"Authorization": basic_authorization("opencode", "wrong")}, {}]
    async with proxy_process(upstream, log, env=env) as proxy:
        answers = [
            await health(str(proxy.with_path(route)), headers) for headers in presented for route in ROUTES
        ]
        orphans_token = await health(
            str(proxy.with_path("/_settle/orphans").with_query(auth_token=WRONG)), {}
        )
    for status, said in [*answers, orphans_token]:
        assert status == 403, said
        assert set(said) == {"error", "message"}
        assert str(said["message"]).startswith("the server refuses the proxy's credentials")
        assert "set " + FIX in str(said["message"])
    (line,) = fix_lines(log)
    assert "the server refused the password presented: set " + FIX in line


async def test_without_a_password_the_proxys_routes_name_the_fix(
    fake: FakeOpencode, upstream: TestServer, tmp_path: Path
) -> None:
    fake.password = "s3cret"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_")}
    async with proxy_process(upstream, tmp_path / "proxy.log", env=env) as proxy:
        status, said = await health(str(proxy.with_path("/_settle/health")), SERVERS)
    assert status == 403
    assert str(said["message"]).endswith(
        "give it the server's in OPENCODE_SERVER_PASSWORD (on 2.x OPENCODE_PASSWORD) and "
        "OPENCODE_SERVER_USERNAME, or log in to it with --auth"
    )
