"""Bodies read whole to be checked are bounded: past `max_body`, encoded or decoded, a body goes
out unchecked as the upstream sent it, streamed, with one log line; the proxy never holds more
than the bound, however far a compressed body inflates."""

from __future__ import annotations

import gzip
import hashlib
import logging
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Iterator

import brotli
import pytest
import zstandard
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict
from yarl import URL

from proxy.addons.settle import SETTLED_HEADER
from proxy.cli.options import build_parser, settings_from
from proxy.relay import codings
from proxy.service.app import create_app
from proxy.service.config import DEFAULT_MAX_BODY, Settings
from tests.fixtures import compact
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
PATH = f"/api/session/{V2}/message"
STALE = compact("v2-message-stale-running.json")
MIB = 2**20
LIMIT = MIB
"""The bound the tests set: small, so that a bomb far past it is quick to make and to measure."""


def _spaces(size: int) -> Iterator[bytes]:
    """A JSON document of `size` bytes, mostly spaces, in 1 MiB pieces (never held whole)."""
    yield b'{"data":['
    for _ in range(size // MIB):
        yield b" " * MIB
    yield b"]}"


def _gzip(size: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join(compressor.compress(piece) for piece in _spaces(size)) + compressor.flush()


def _deflate(size: int) -> bytes:
    compressor = zlib.compressobj(9)
    return b"".join(compressor.compress(piece) for piece in _spaces(size)) + compressor.flush()


def _br(size: int) -> bytes:
    compressor = brotli.Compressor(quality=5)
    return bytes(b"".join(compressor.process(piece) for piece in _spaces(size)) + compressor.finish())


def _zstd(size: int) -> bytes:
    return _zstd_stream(*_spaces(size))


def _zstd_stream(*pieces: bytes) -> bytes:
    """A frame that does not state its size, as a streaming compressor writes it."""
    compressor = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    return b"".join(compressor.compress(piece) for piece in pieces) + compressor.flush()


BOMBS: dict[str, Callable[[int], bytes]] = {"gzip": _gzip, "deflate": _deflate, "br": _br, "zstd": _zstd}


async def _proxy(
    upstream: TestServer,
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
    max_body: int = DEFAULT_MAX_BODY,
) -> ProxyClient:
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), max_body=max_body)
    return await aiohttp_client(create_app(settings))


async def _fetch_measured(proxy: ProxyClient) -> tuple[bytes, CIMultiDict[str], int]:
    """The digest of the body the client gets (read piece by piece, so that the client holds
    none of it), its headers, and the peak of memory allocated meanwhile."""
    tracemalloc.start()
    try:
        response = await proxy.get(PATH, headers={"Accept-Encoding": "*"}, auto_decompress=False)
        digest = hashlib.sha256()
        async for piece in response.content.iter_any():
            digest.update(piece)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return digest.digest(), response.headers.copy(), peak


def _sha256(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


def _unchecked_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if "unchecked" in record.getMessage()]


@pytest.mark.parametrize("coding", BOMBS)
async def test_a_decompression_bomb_goes_out_as_it_came_and_is_never_inflated_whole(  # type: ignore[no-untyped-def]
    fake: FakeOpencode, upstream: TestServer, aiohttp_client, caplog: pytest.LogCaptureFixture, coding: str
) -> None:
    bomb = BOMBS[coding](64 * MIB)
    assert len(bomb) < LIMIT, "the compressed body is under the bound: only its inflation is past it"
    fake.bodies[PATH] = bomb
    fake.headers[PATH] = {"Content-Encoding": coding, "ETag": '"v1"'}
    proxy = await _proxy(upstream, aiohttp_client, max_body=LIMIT)
    with caplog.at_level(logging.INFO):
        body, headers, peak = await _fetch_measured(proxy)
    assert body == _sha256(bomb)
    assert headers["Content-Encoding"] == coding
    assert headers["ETag"] == '"v1"'
    assert SETTLED_HEADER not in headers
    (line,) = _unchecked_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.fields == {"path": PATH, "limit": LIMIT, "past": "decoded"}  # type: ignore[attr-defined]
    assert peak < 2 * LIMIT, f"{peak / MIB:.1f} MiB allocated for a body bounded at 1 MiB"


async def test_the_default_bound_keeps_a_bomb_far_from_its_inflated_size(  # type: ignore[no-untyped-def]
    fake: FakeOpencode, upstream: TestServer, aiohttp_client, caplog: pytest.LogCaptureFixture
) -> None:
    """The case reported: a gzip view of 0.3 MB that inflates to 300 MB raised RSS by 600 MB."""
    bomb = _gzip(300 * MIB)
    fake.bodies[PATH] = bomb
    fake.headers[PATH] = {"Content-Encoding": "gzip"}
    proxy = await _proxy(upstream, aiohttp_client)
    with caplog.at_level(logging.INFO):
        body, _, peak = await _fetch_measured(proxy)
    assert body == _sha256(bomb)
    assert len(_unchecked_lines(caplog)) == 1
    assert peak < 8 * MIB, f"{peak / MIB:.1f} MiB allocated"


@pytest.mark.parametrize("announced", [True, False], ids=["with-length", "chunked"])
async def test_an_uncompressed_body_past_the_bound_is_streamed_unchecked(  # type: ignore[no-untyped-def]
    upstream: TestServer, aiohttp_client, caplog: pytest.LogCaptureFixture, announced: bool
) -> None:
    big = b'{"data":[' + b" " * (4 * LIMIT) + b"]}"

    async def view(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if announced:
            response.content_length = len(big)
        await response.prepare(request)
        for start in range(0, len(big), 2**16):
            await response.write(big[start : start + 2**16])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get(PATH, view)
    server = TestServer(app)
    await server.start_server()
    try:
        proxy = await _proxy(server, aiohttp_client, max_body=LIMIT)
        with caplog.at_level(logging.INFO):
            body, headers, peak = await _fetch_measured(proxy)
    finally:
        await server.close()
    assert body == _sha256(big)
    assert ("Content-Length" in headers) is announced
    (line,) = _unchecked_lines(caplog)
    assert line.fields == {"path": PATH, "limit": LIMIT, "past": "encoded"}  # type: ignore[attr-defined]
    assert peak < 2 * LIMIT, f"{peak / MIB:.1f} MiB allocated for a body bounded at 1 MiB"


async def test_a_view_under_the_bound_is_still_checked(  # type: ignore[no-untyped-def]
    fake: FakeOpencode, upstream: TestServer, aiohttp_client, caplog: pytest.LogCaptureFixture
) -> None:
    fake.bodies[PATH] = gzip.compress(STALE)
    fake.headers[PATH] = {"Content-Encoding": "gzip"}
    proxy = await _proxy(upstream, aiohttp_client, max_body=len(STALE))
    response = await proxy.get(PATH, headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert response.headers[SETTLED_HEADER] == "1"
    assert b'"status":"error"' in gzip.decompress(await response.read())
    assert _unchecked_lines(caplog) == []


@pytest.mark.parametrize("coding", BOMBS)
def test_decoding_stops_at_the_limit(coding: str) -> None:
    bomb = BOMBS[coding](8 * MIB)
    with pytest.raises(codings.TooLarge):
        codings.decode(bomb, [coding], limit=MIB)
    assert codings.decode(bomb, [coding], limit=9 * MIB).startswith(b'{"data":[    ')


@pytest.mark.parametrize("coding", BOMBS)
@pytest.mark.parametrize("step", [1, 7, 4096])
def test_decoding_piece_by_piece_gives_the_whole_body(coding: str, step: int) -> None:
    body = STALE * 3
    encoded = codings.encode(body, [coding])
    decoder = codings.Decoder([coding], limit=len(body))
    for start in range(0, len(encoded), step):
        decoder.feed(encoded[start : start + step])
    assert decoder.result() == body


@pytest.mark.parametrize("coding", BOMBS)
def test_a_truncated_body_is_refused(coding: str) -> None:
    encoded = codings.encode(STALE, [coding])
    with pytest.raises(codings.CodingError):
        codings.decode(encoded[:-3], [coding], limit=MIB)


def test_the_bound_is_a_flag_in_mib_with_an_environment_variable() -> None:
    assert settings_from(build_parser(environ={}).parse_args([]), {}).max_body == DEFAULT_MAX_BODY == 64 * MIB
    environ = {"SETTLE_MAX_BODY": "16"}
    assert settings_from(build_parser(environ=environ).parse_args([]), environ).max_body == 16 * MIB
    assert settings_from(build_parser(environ={}).parse_args(["--max-body", "2"]), {}).max_body == 2 * MIB
    assert "SETTLE_MAX_BODY" in build_parser(environ={}).format_help()


@pytest.mark.parametrize("text", ["0", "-1", "lots"])
def test_a_bad_bound_is_a_one_line_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(environ={}).parse_args(["--max-body", text])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--max-body" in line


def _raw_deflate(body: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(body) + compressor.flush()


_SKIPPABLE = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"skip!"
VARIANTS: dict[str, tuple[str, bytes]] = {
    "raw deflate": ("deflate", _raw_deflate(STALE)),
    "gzip members, padded": ("gzip", gzip.compress(STALE[:100]) + gzip.compress(STALE[100:]) + b"\0\0"),
    "zstd with checksum": ("zstd", zstandard.ZstdCompressor(write_checksum=True).compress(STALE)),
    "zstd frames, one skippable": (
        "zstd",
        zstandard.ZstdCompressor().compress(STALE[:100]) + _SKIPPABLE + _zstd_stream(STALE[100:]),
    ),
    "gzip then br": ("gzip, br", brotli.compress(gzip.compress(STALE))),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("step", [1, 5, 1 << 20])
def test_every_shape_of_a_coding_decodes_piece_by_piece(variant: str, step: int) -> None:
    names, encoded = VARIANTS[variant]
    decoder = codings.Decoder(codings.content_codings([names]), limit=len(STALE))
    for start in range(0, len(encoded), step):
        decoder.feed(encoded[start : start + step])
    assert decoder.result() == STALE


def test_a_failure_names_the_coding_that_failed() -> None:
    inner_truncated = brotli.compress(gzip.compress(STALE)[:-8])
    with pytest.raises(codings.CodingError, match="not a valid gzip body"):
        codings.decode(inner_truncated, ["gzip", "br"], limit=MIB)
    with pytest.raises(codings.CodingError, match="not a valid br body"):
        codings.decode(b"not brotli", ["gzip", "br"], limit=MIB)
