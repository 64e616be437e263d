"""Injecting events into a relayed event stream: only between the upstream's events, never inside one."""

import asyncio
from typing import cast

import pytest
from aiohttp import web

from proxy.relay.answers import UpstreamResponse
from proxy.relay.sse import complete_events_end, relay_with_injection


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        (b"data: 1\n\ndata: 2", 9),
        (b"data: 1\r\n\r\n", 11),
        (b"data: 1\r\rdata: 2\n\n", 18),
        (b"data: 1\n", 0),
    ],
)
def test_whole_events_end_at_the_last_blank_line(data: bytes, whole: int) -> None:
    assert complete_events_end(data) == whole


class Chunks:
    """An upstream response's body, as `readany` gives it: the chunks, then b"" for its end."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = [*chunks, b""]
        self.content = self

    async def readany(self) -> bytes:
        return self._chunks.pop(0)


class Written:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.writes.append(data)


async def test_an_injected_event_waits_for_the_end_of_the_upstreams_event() -> None:
    injected: asyncio.Queue[bytes] = asyncio.Queue()
    injected.put_nowait(b"data: injected\n\n")
    response = Written()
    upstream = Chunks(b"data: 1\n\nda", b"ta: 2\n\n", b"data: 3")
    await relay_with_injection(cast(web.StreamResponse, response), cast(UpstreamResponse, upstream), injected)
    assert response.writes == [b"data: 1\n\n", b"data: 2\n\n", b"data: injected\n\n", b"data: 3"]
