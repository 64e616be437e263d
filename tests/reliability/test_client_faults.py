"""Client faults against the proxy process: slow readers and writers, clients that vanish mid-upload,
mid-download, mid-wait or mid-WebSocket, oversized or junk requests. None may leak a socket, leave
an upstream request running, crash the proxy or fill its log with errors.

The proxy runs as `python -m proxy` (so its fd count is its own, and it cancels the handler of
a client that goes away, as deployed); the upstream is the in-process load fake, whose
`in_flight` count shows whether the proxy closed every upstream request its client abandoned.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.reliability.load_upstream import BIG_PATTERN, LoadUpstream
from tests.reliability.processes import eventually, open_fds, rss_bytes, steady_fds
from tests.reliability.servers import ProxySubprocess, proxy_subprocess, serve

pytestmark = pytest.mark.slow

ROUNDS = 30
"""Each fault is repeated: one leaked socket per round adds up to a count no slack hides."""
FD_SLACK = 8
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)
BIG = 32 * 2**20


@dataclass
class Rig:
    proxy: ProxySubprocess
    upstream: LoadUpstream


@asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    fake = LoadUpstream()
    async with serve(fake.app()) as upstream, proxy_subprocess(upstream, tmp_path / "proxy.log") as proxy:
        yield Rig(proxy, fake)


@asynccontextmanager
async def no_leak(rig: Rig) -> AsyncIterator[None]:
    """The block may abuse the proxy; afterwards it must hold no more sockets than before, have
    closed every upstream request, still serve, and have logged no error."""
    baseline = await steady_fds(rig.proxy.pid)
    yield
    assert rig.proxy.alive(), "the proxy died"
    assert await eventually(lambda: rig.upstream.in_flight == 0), (
        f"{rig.upstream.in_flight} upstream requests left open"
    )
    assert await eventually(lambda: open_fds(rig.proxy.pid) <= baseline + FD_SLACK), (
        f"fds: {baseline} before, {open_fds(rig.proxy.pid)} after"
    )
    async with (
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.get(rig.proxy.url.with_path("/small")) as answer,
    ):
        assert answer.status == 200, "the proxy no longer serves"
    assert _unexplained_tracebacks(rig.proxy.log()) == 0, rig.proxy.log()[-3000:]


def _unexplained_tracebacks(log: str) -> int:
    """Tracebacks other than aiohttp's for a request it could not parse (it logs each at ERROR,
    with a traceback, before answering 400: noise, but the client's fault, not a crash)."""
    refused = len(re.findall(r"^aiohttp\.http_exceptions\.\w+: 400", log, re.MULTILINE))
    return log.count("Traceback (most recent call last)") - refused


async def _raw(proxy: URL, data: bytes, *, then_read: int = 0) -> None:
    """Send `data`, read up to `then_read` bytes of the answer, and drop the connection."""
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        writer.write(data)
        await writer.drain()
        if then_read:
            await asyncio.wait_for(reader.readexactly(then_read), 10)
    finally:
        writer.transport.abort()


async def test_clients_vanishing_mid_upload(tmp_path: Path) -> None:
    async with rig(tmp_path) as r, no_leak(r):
        head = b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % (8 * 2**20)
        await asyncio.gather(*(_raw(r.proxy.url, head + b"x" * 2**18) for _ in range(ROUNDS)))


async def test_clients_vanishing_mid_download(tmp_path: Path) -> None:
    async with rig(tmp_path) as r, no_leak(r):
        request = b"GET /big?size=%d HTTP/1.1\r\nHost: a\r\n\r\n" % BIG
        await asyncio.gather(*(_raw(r.proxy.url, request, then_read=2**18) for _ in range(ROUNDS)))


async def test_clients_vanishing_while_the_upstream_thinks(tmp_path: Path) -> None:
    """Clients that leave before the answer: their upstream requests must be cancelled, not left to
    run out their minute."""
    async with rig(tmp_path) as r, no_leak(r):
        connections = [
            await asyncio.open_connection(r.proxy.url.host, r.proxy.url.port) for _ in range(ROUNDS)
        ]
        for _, writer in connections:
            writer.write(b"GET /slow?delay=60 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert await eventually(lambda: r.upstream.in_flight == ROUNDS), (
            "the requests never reached the upstream"
        )
        for _, writer in connections:
            writer.transport.abort()


async def test_clients_vanishing_mid_websocket(tmp_path: Path) -> None:
    """A client whose TCP connection drops without a close frame: the proxy closes each upstream
    WebSocket with a close frame (never with 1006, which must not be sent)."""
    async with rig(tmp_path) as r, no_leak(r):
        for _ in range(ROUNDS):
            session = aiohttp.ClientSession(timeout=CLIENT_TIMEOUT)
            try:
                socket = await session.ws_connect(r.proxy.url.with_path("/pty/pty_1/connect"))
                await socket.send_str("hi")
                assert await socket.receive_str(timeout=5) == "echo:hi"
                connection = socket._response.connection
                assert connection is not None
                assert connection.transport is not None
                connection.transport.abort()
            finally:
                await session.close()
        assert await eventually(lambda: len(r.upstream.websocket_close_codes) == ROUNDS)
        assert set(r.upstream.websocket_close_codes) <= {1000, 1001}, r.upstream.websocket_close_codes


JUNK = {
    "a 20 kB header": b"GET /small HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    "200 headers": b"GET /small HTTP/1.1\r\nHost: a\r\n"
    + b"".join(b"X-%d: v\r\n" % i for i in range(200))
    + b"\r\n",
    "a 100 kB target": b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    "half a request line": b"GET /sma",
    "half a header block": b"GET /small HTTP/1.1\r\nHost: a\r\nX-A: ",
    "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
    "nothing": b"",
}


async def test_junk_and_oversized_requests(tmp_path: Path) -> None:
    async with rig(tmp_path) as r, no_leak(r):
        for junk in JUNK.values():
            await asyncio.gather(*(_raw(r.proxy.url, junk) for _ in range(ROUNDS)))


async def test_oversized_header_is_refused_with_400(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        reader, writer = await asyncio.open_connection(r.proxy.url.host, r.proxy.url.port)
        try:
            writer.write(JUNK["a 20 kB header"])
            status_line = await asyncio.wait_for(reader.readline(), 10)
            assert status_line.split()[1] == b"400", status_line
        finally:
            writer.close()


async def test_slow_reader_gets_every_byte_and_the_proxy_does_not_buffer(tmp_path: Path) -> None:
    """A client that stops reading holds the proxy back (back-pressure), not the proxy's memory."""
    async with rig(tmp_path) as r, no_leak(r):
        rss = rss_bytes(r.proxy.pid)
        async with (
            aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
            session.get(r.proxy.url.with_path("/big").with_query(size=BIG)) as answer,
        ):
            digest, received = hashlib.sha256(), 0
            first = await answer.content.readexactly(2**16)
            await asyncio.sleep(1.0)  # a client that does not read for a while
            grown = rss_bytes(r.proxy.pid) - rss
            for piece in (first, *[chunk async for chunk in answer.content.iter_chunked(2**20)]):
                digest.update(piece)
                received += len(piece)
        assert received == BIG
        assert digest.digest() == _expected_digest(BIG)
        assert grown < BIG // 4, f"the proxy buffered {grown / 2**20:.1f} MiB for a client that did not read"


def _expected_digest(size: int) -> bytes:
    digest = hashlib.sha256()
    for start in range(0, size, len(BIG_PATTERN)):
        digest.update(BIG_PATTERN[: size - start])
    return digest.digest()


async def test_slow_writer_upload_arrives_whole(tmp_path: Path) -> None:
    async def trickle() -> AsyncIterator[bytes]:
        for number in range(20):
            yield bytes([number]) * 2**14
            await asyncio.sleep(0.02)

    async with (
        rig(tmp_path) as r,
        no_leak(r),
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
        session.post(r.proxy.url.with_path("/echo"), data=trickle()) as answer,
    ):
        assert await answer.read() == b"".join(bytes([number]) * 2**14 for number in range(20))


async def test_client_leaving_a_stream_of_an_embedded_proxy(caplog: pytest.LogCaptureFixture) -> None:
    """Embedded without handler cancellation, the proxy learns that a subscriber left from the
    failed write: it must then close the upstream stream quietly (no error, no leak)."""
    fake = LoadUpstream()
    async with (
        serve(fake.app()) as upstream,
        serve(create_app(Settings(upstream=upstream)), cancel_handlers=False) as proxy,
    ):
        for _ in range(ROUNDS):
            async with (
                aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
                session.get(proxy.with_path("/event")) as stream,
            ):
                await stream.content.readuntil(b"\n\n")
        assert await eventually(lambda: fake.in_flight == 0), f"{fake.in_flight} upstream streams left open"
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
