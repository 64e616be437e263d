"""Request smuggling basics: a request whose framing two parsers could read differently is refused
(400/501) or reaches the upstream with one unambiguous framing; header injection is refused.

Each attack hides a second request, `GET /smuggled`, where one reading of the framing would
find it. It must never reach the upstream as a request of its own, and the client must never
get two answers for what it sent as one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from yarl import URL

from proxy.opencode.dialects import HEALTH_PATHS
from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.reliability.raw_upstream import RawUpstream, Received, Reply, raw_upstream, response
from tests.reliability.servers import serve

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
_FIRST_ANSWER_S = 10.0
_READ_IDLE_S = 0.3
"""After the first answer, how long the proxy may stay silent before nothing more is expected
(a second answer, to a hidden request, would follow at once: all of this is on loopback)."""


async def _ok(_: Received) -> Reply:
    return response(200, b"ok", [("Content-Type", "text/plain")])


@asynccontextmanager
async def proxy_and_upstream() -> AsyncIterator[tuple[URL, RawUpstream]]:
    async with (
        raw_upstream(_ok) as (upstream_url, upstream),
        serve(create_app(Settings(upstream=upstream_url))) as proxy,
    ):
        yield proxy, upstream


async def exchange(proxy: URL, raw: bytes) -> bytes:
    """Send `raw` on one connection; everything the proxy answers until it goes quiet or closes."""
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await _read_or_nothing(reader, _FIRST_ANSWER_S)
        while chunk := await _read_or_nothing(reader, _READ_IDLE_S):
            answer += chunk
        return answer
    finally:
        writer.close()


async def _read_or_nothing(reader: asyncio.StreamReader, within: float) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(65536), within)
    except TimeoutError:
        return b""


def _statuses(answer: bytes) -> list[int]:
    return [int(line.split()[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.")]


def _forwarded(upstream: RawUpstream, path: str) -> list[Received]:
    return [request for request in upstream.received if request.path == path]


def _head(*lines: str) -> bytes:
    return "".join(f"{line}\r\n" for line in lines).encode() + b"\r\n"


CONFLICTS = {
    "CL then TE": _head("POST /x HTTP/1.1", "Host: a", "Content-Length: 4", "Transfer-Encoding: chunked")
    + b"0\r\n\r\n"
    + SMUGGLED,
    "TE then CL": _head("POST /x HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Content-Length: 60")
    + b"0\r\n\r\n"
    + SMUGGLED,
    "TE twice": _head(
        "POST /x HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"
    )
    + b"0\r\n\r\n"
    + SMUGGLED,
    "TE with space before colon": _head(
        "POST /x HTTP/1.1", "Host: a", "Transfer-Encoding : chunked", f"Content-Length: {len(SMUGGLED) + 5}"
    )
    + b"0\r\n\r\n"
    + SMUGGLED,
    "TE xchunked": _head("POST /x HTTP/1.1", "Host: a", "Transfer-Encoding: xchunked", "Content-Length: 5")
    + b"0\r\n\r\n"
    + SMUGGLED,
    "TE chunked with trailing junk": _head(
        "POST /x HTTP/1.1", "Host: a", "Transfer-Encoding: chunked, identity"
    )
    + b"0\r\n\r\n"
    + SMUGGLED,
    "two different CLs": _head(
        "POST /x HTTP/1.1", "Host: a", "Content-Length: 0", f"Content-Length: {len(SMUGGLED)}"
    )
    + SMUGGLED,
    "CL list": _head("POST /x HTTP/1.1", "Host: a", f"Content-Length: 0, {len(SMUGGLED)}") + SMUGGLED,
    "CL with a sign": _head("POST /x HTTP/1.1", "Host: a", f"Content-Length: +{len(SMUGGLED)}") + SMUGGLED,
    "chunk size overflow": _head("POST /x HTTP/1.1", "Host: a", "Transfer-Encoding: chunked")
    + b"10000000000000000000000000000000\r\nx\r\n0\r\n\r\n"
    + SMUGGLED,
    "chunked in HTTP/1.0": _head(
        "POST /x HTTP/1.0", "Host: a", "Transfer-Encoding: chunked", "Content-Length: 5"
    )
    + b"0\r\n\r\n"
    + SMUGGLED,
}


@pytest.mark.parametrize("raw", CONFLICTS.values(), ids=CONFLICTS.keys())
async def test_ambiguous_framing_is_refused_or_neutralised(raw: bytes) -> None:
    async with proxy_and_upstream() as (proxy, upstream):
        answer = await exchange(proxy, raw)
        statuses = _statuses(answer)
        assert _forwarded(upstream, "/smuggled") == [], "a hidden request reached the upstream"
        assert len(statuses) == 1, f"one request sent, answers: {statuses}"
        if statuses[0] in (400, 501):
            assert _forwarded(upstream, "/x") == [], "refused, yet forwarded"
            return
        (forwarded,) = _forwarded(upstream, "/x")
        framing = forwarded.header("Content-Length") + forwarded.header("Transfer-Encoding")
        assert len(framing) <= 1, f"forwarded with ambiguous framing: {forwarded.headers}"
        assert forwarded.header("Transfer-Encoding") in ([], ["chunked"])


INJECTIONS = {
    "CR in a value": _head("GET /x HTTP/1.1", "Host: a", "X-A: b\rInjected: 1"),
    "LF in a value": _head("GET /x HTTP/1.1", "Host: a", "X-A: b\nInjected: 1"),
    "NUL in a value": _head("GET /x HTTP/1.1", "Host: a", "X-A: b\x00Injected: 1"),
    "obsolete line folding": _head("GET /x HTTP/1.1", "Host: a", "X-A: b", " Injected: 1"),
    "space in a name": _head("GET /x HTTP/1.1", "Host: a", "X A: b"),
    "CR in Host": _head("GET /x HTTP/1.1", "Host: a\rInjected: 1"),
}


@pytest.mark.parametrize("raw", INJECTIONS.values(), ids=INJECTIONS.keys())
async def test_header_injection_is_refused(raw: bytes) -> None:
    async with proxy_and_upstream() as (proxy, upstream):
        statuses = _statuses(await exchange(proxy, raw))
        assert statuses == [400]
        own = (*HEALTH_PATHS, "/global/event")  # what the proxy asks on its own
        assert [request for request in upstream.received if request.path not in own] == []


async def test_encoded_crlf_stays_encoded() -> None:
    """A percent-encoded CR LF is data: forwarded as sent, never decoded into a line break."""
    async with proxy_and_upstream() as (proxy, upstream):
        raw = _head("GET /x%0D%20y?q=%0d%0aInjected:%201 HTTP/1.1", "Host: a")
        assert _statuses(await exchange(proxy, raw)) == [200]
        (forwarded,) = [request for request in upstream.received if request.path.startswith("/x")]
        assert forwarded.target == "/x%0D%20y?q=%0d%0aInjected:%201"
        assert forwarded.header("Injected") == []


async def test_transfer_coding_other_than_chunked_is_refused() -> None:
    """aiohttp removes a request body's chunked framing but no other coding, and
    `Transfer-Encoding` is hop-by-hop: forwarded, a `gzip, chunked` body would reach the upstream
    still gzipped with nothing saying so. So it is refused with 501, as nginx and Go refuse it."""
    async with proxy_and_upstream() as (proxy, upstream):
        raw = (
            _head("POST /x HTTP/1.1", "Host: a", "Transfer-Encoding: gzip, chunked")
            + b"5\r\nhello\r\n0\r\n\r\n"
        )
        answer = await exchange(proxy, raw)
        assert _statuses(answer) == [501]
        assert b'"not_implemented"' in answer
        assert _forwarded(upstream, "/x") == []


async def test_h2c_upgrade_is_not_passed_on() -> None:
    """`Upgrade` is hop-by-hop: an h2c upgrade reaches the upstream as a plain request."""
    async with proxy_and_upstream() as (proxy, upstream):
        raw = _head(
            "GET /x HTTP/1.1",
            "Host: a",
            "Connection: Upgrade, HTTP2-Settings",
            "Upgrade: h2c",
            "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
        )
        assert _statuses(await exchange(proxy, raw)) == [200]
        (forwarded,) = _forwarded(upstream, "/x")
        assert forwarded.header("Upgrade") == forwarded.header("HTTP2-Settings") == []
