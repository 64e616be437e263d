"""In front of the 2.x stand-in (`tests/opencode2/`, built separately from 2.x's source): after a
crash, the orphaned call is shown as the server itself settles it when its next drain starts,
and `--write-back api` writes nothing and asks nothing of it beyond which server it is."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.testing import idle
from proxy.writeback.modes import WriteBackMode
from tests.opencode2.auth import basic
from tests.opencode2.stand_in import StandIn
from tests.opencode2.store import now_ms
from tests.proxy.conftest import ProxyClient

PASSWORD = "stand-in-password"


def the_call(view: dict[str, Any], call_id: str) -> dict[str, Any]:
    (call,) = [item for m in view["data"] for item in m.get("content", []) if item.get("id") == call_id]
    # `time.completed`: 2.x's is when its settle ran; the proxy's the call's last sign of life.
    kept: dict[str, Any] = call | {
        "time": {key: value for key, value in call["time"].items() if key != "completed"}
    }
    return kept


async def test_the_orphaned_call_is_shown_as_2x_settles_it_and_nothing_is_written(
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with StandIn(password=PASSWORD) as server:
        server.store.clock = lambda: now_ms() - 60_000  # the crash was a minute ago
        session = server.add_session()
        call = server.add_running_call(session, metadata={"output": "hello\n"})
        await server.crash()
        await server.restart()
        settings = Settings(
            upstream=URL(server.url),
            authorization=basic(PASSWORD),
            write_back=WriteBackMode.API,
            grace=0,
            lock_dir=tmp_path,
        )
        proxy = await aiohttp_client(create_app(settings))
        view = f"/api/session/{session}/message"
        shown = await (await proxy.get(view, headers=server.headers)).json()
        await idle(proxy.app)
        published = len(server.published)
        async with aiohttp.ClientSession(headers=server.headers) as direct:
            go_on = {"text": "Go on."}  # the next input's drain: 2.1.2 has no /resume
            async with direct.post(f"{server.url}/api/session/{session}/synthetic", json=go_on) as resumed:
                assert resumed.status == 200
            async with direct.get(f"{server.url}{view}") as settled:
                its_own = await settled.json()
    ours = the_call(shown, call.call_id)
    assert ours == the_call(its_own, call.call_id)
    assert ours["state"]["error"]["message"] == "Tool execution interrupted: shell"
    assert published == 0  # nothing was written before the server's own settle
    said = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("--write-back api does nothing")
    ]
    assert len(said) == 1
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
