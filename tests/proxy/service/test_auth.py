"""`--auth`: its USER:PASSWORD, and the guard it puts in front of an application."""

import base64
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.service.auth import REALM, parse_credentials, require_basic_auth
from proxy.service.config import basic_authorization

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
