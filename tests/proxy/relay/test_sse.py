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


async def test_what_the_opening_awaits_goes_right_after_the_first_event_before_the_streams_own() -> None:
    """A stream that came back is sent what it missed before its own events (`catch_up`)."""
    injected: asyncio.Queue[bytes] = asyncio.Queue()
    injected.put_nowait(b"data: replayed\n\n")
    response, opened = Written(), list[bytes]()

    async def catch_up() -> None:
        await asyncio.sleep(0)
        injected.put_nowait(b"data: missed\n\n")

    def opening(first: bytes) -> asyncio.Future[None]:
        opened.append(first)
        return asyncio.ensure_future(catch_up())

    upstream = Chunks(b"data: conn", b"ected\n\ndata: 2\n\nda", b"ta: 3\n\n")
    await relay_with_injection(
        cast(web.StreamResponse, response), cast(UpstreamResponse, upstream), injected, opening
    )
    assert opened == [b"data: connected\n\n"]
    assert response.writes == [
        b"data: connected\n\n",
        b"data: replayed\n\n",
        b"data: missed\n\n",
        b"data: 2\n\n",
        b"data: 3\n\n",
    ]


async def test_a_stream_that_ends_before_its_first_event_is_relayed_as_it_came() -> None:
    response, opened = Written(), list[bytes]()
    upstream = Chunks(b"data: cut sh", b"ort")
    await relay_with_injection(
        cast(web.StreamResponse, response), cast(UpstreamResponse, upstream), asyncio.Queue(), opened.append
    )
    assert opened == []
    assert response.writes == [b"data: cut short"]
