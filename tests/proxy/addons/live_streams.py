"""What the tests of live settlement share: the stale v1 message the fake serves and one the model
was still writing, and, through a whole proxy, a client's event stream read as events and a crash
with the tool part open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from proxy.testing import WAIT_S
from tests.fixtures import load
from tests.proxy.conftest import ProxyClient, crash, publish
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
MESSAGE = load("v1-message-stale-running.json")[1]
PART = MESSAGE["parts"][1]
WRITING_INFO: dict[str, Any] = {**MESSAGE["info"], "id": "msg_writing"}
WRITING: dict[str, Any] = {"info": WRITING_INFO, "parts": []}
"""An assistant message the model was still writing when the server died: no tool, no completion."""
GRACE_S = 0.05


async def events(response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The events of a client's stream, each as soon as its `data:` line arrives."""
    while line := await asyncio.wait_for(response.content.readline(), WAIT_S):
        if line.startswith(b"data: "):
            yield orjson.loads(line[6:])


async def crash_with_part_open(proxy: ProxyClient, fake: FakeOpencode) -> None:
    """The stream shows the stale message's tool part running, then the server crashes."""
    await publish(proxy, fake, "message.part.updated", V1, part=PART, time=1)
    await crash(proxy, fake)
