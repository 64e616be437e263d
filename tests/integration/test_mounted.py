"""`proxy.mount` in front of the real opencode 1.18.33: the paging links it builds keep the prefix.

opencode builds the `Link` of a paged message list (`?limit=N`) from `Host` and
`x-forwarded-proto`, so through a proxy mounted under `/opencode` the link points at the
proxy's own origin but lacks the prefix; a client following it would leave the proxy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from yarl import URL

from proxy import Settings, mount
from proxy.demo.model import MockModel, Plan

from .http_client import request as http_request
from .opencode_server import OpencodeServer
from .turns import read_messages, start_v1_turn, wait_turn_done

pytestmark = pytest.mark.integration

PROMPT = "mounted paging v1"
ClientFactory = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]


async def test_paging_links_of_the_real_server_keep_the_mount_prefix(
    opencode: OpencodeServer, mock_model: MockModel, aiohttp_client: ClientFactory
) -> None:
    mock_model.plan(PROMPT, Plan(command="echo paged"))
    turn = await asyncio.to_thread(start_v1_turn, opencode.url, opencode.project, PROMPT)
    await asyncio.to_thread(wait_turn_done, opencode.url, turn)
    every = [message["info"]["id"] for message in await asyncio.to_thread(read_messages, opencode.url, turn)]
    assert len(every) >= 2

    direct = await asyncio.to_thread(http_request, "GET", f"{opencode.origin}{turn.messages_path}?limit=1")
    assert direct.headers["link"].startswith(f"<{opencode.origin}{turn.messages_path}?limit=1&before=")

    app = web.Application()
    mount(app, "/opencode", Settings(upstream=URL(opencode.origin)))
    client = await aiohttp_client(app)
    origin = str(client.make_url("/")).rstrip("/")
    paged: list[str] = []
    path: str | None = f"/opencode{turn.messages_path}?limit=1"
    while path is not None:
        response = await client.get(path)
        assert response.status == 200
        paged += [message["info"]["id"] for message in await response.json()]
        link = response.headers.get("Link")
        if link is None:
            break
        assert link.startswith(f"<{origin}/opencode{turn.messages_path}?limit=1&before="), link
        path = URL(link[1 : link.index(">")]).path_qs
    assert sorted(paged) == sorted(every)
    assert len(paged) == len(every)
    print(f"\nmounted paging: {len(paged)} pages of 1 message, every Link under /opencode")
