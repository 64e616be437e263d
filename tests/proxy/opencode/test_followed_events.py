"""Event lines read from a stream up to a limit: a line past it is skipped, never held whole."""

from __future__ import annotations

import asyncio
import tracemalloc
from unittest import mock

import aiohttp
import pytest

from proxy.opencode.followed_events import event_lines
from proxy.testing import WAIT_S


async def test_event_lines_hold_no_more_than_the_limit_of_a_huge_line() -> None:
    limit, size = 2**20, 64 * 2**20
    content = aiohttp.StreamReader(mock.Mock(), 2**16, loop=asyncio.get_running_loop())

    async def feed() -> None:
        content.feed_data(b"data: first\n")
        piece = b"x" * 2**16
        for _ in range(size // len(piece)):
            content.feed_data(piece)
            await asyncio.sleep(0)
        content.feed_data(b"\ndata: after\n")
        content.feed_eof()

    tracemalloc.start()
    try:
        feeding = asyncio.create_task(feed())
        lines = [line async for line in event_lines(content, limit, silence=WAIT_S)]
        await feeding
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [b"data: first\n", None, b"data: after\n"]
    assert peak < 4 * limit, f"held {peak} bytes of a {size}-byte line"


@pytest.mark.parametrize(
    ("pieces", "lines"),
    [
        ([b"a\nbb\n", b"c\n"], [b"a\n", b"bb\n", b"c\n"]),
        ([b"aa", b"aa\nb", b"b\n"], [b"aaaa\n", b"bb\n"]),
        ([b"12345678\n"], [b"12345678\n"]),  # exactly the limit, its line end included
        ([b"123456789\n", b"ok\n"], [None, b"ok\n"]),
        ([b"1234", b"56789012", b"345\nok\n"], [None, b"ok\n"]),
        ([b"whole\n", b"cut off"], [b"whole\n"]),
    ],
)
async def test_event_lines_cut_at_line_ends_up_to_the_limit(
    pieces: list[bytes], lines: list[bytes | None]
) -> None:
    content = aiohttp.StreamReader(mock.Mock(), 2**16, loop=asyncio.get_running_loop())

    async def feed() -> None:
        for piece in pieces:
            content.feed_data(piece)
            await asyncio.sleep(0)
        content.feed_eof()

    feeding = asyncio.create_task(feed())
    assert [line async for line in event_lines(content, 9, silence=WAIT_S)] == lines
    await feeding
