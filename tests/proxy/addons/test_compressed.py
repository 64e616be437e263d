"""Message views an upstream compresses although the proxy asked for identity: decoded, checked,
settled, and sent in a coding the client takes, with headers that say what is sent."""

import gzip
import logging
import zlib
from collections.abc import Callable

import brotli
import orjson
import pytest
import zstandard

from proxy.addons.settle import SETTLED_HEADER
from proxy.relay import codings
from tests.fixtures import compact, load
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
PATH = f"/api/session/{V2}/message"
STALE = compact("v2-message-stale-running.json")


def _raw_deflate(body: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(body) + compressor.flush()


def _zstd_streamed(body: bytes) -> bytes:
    """A frame that does not state its size, as a streaming compressor writes it."""
    compressor = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    return compressor.compress(body) + compressor.flush()


COMPRESSORS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),
    "raw deflate": ("deflate", _raw_deflate),
    "br": ("br", brotli.compress),
    "zstd": ("zstd", _zstd_streamed),
    "gzip then br": ("gzip, br", lambda body: brotli.compress(gzip.compress(body))),
}
DECOMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
    "br": brotli.decompress,
    "zstd": lambda body: zstandard.ZstdDecompressor().decompress(body),
    "gzip, br": lambda body: gzip.decompress(brotli.decompress(body)),
}


def serve_compressed(fake: FakeOpencode, coding: str, body: bytes) -> None:
    fake.bodies[PATH] = body
    fake.headers[PATH] = {"Content-Encoding": coding, "ETag": '"v1"', "Vary": "Origin"}


@pytest.mark.parametrize("name", COMPRESSORS)
async def test_compressed_view_is_settled_and_sent_in_the_same_coding(
    proxy: ProxyClient, fake: FakeOpencode, name: str
) -> None:
    coding, compress = COMPRESSORS[name]
    serve_compressed(fake, coding, compress(STALE))
    response = await proxy.get(
        PATH, headers={"Accept-Encoding": "gzip, deflate, br, zstd"}, auto_decompress=False
    )
    sent = await response.read()
    assert fake.seen[-1].headers["Accept-Encoding"] == "identity"
    assert response.headers[SETTLED_HEADER] == "1"
    assert response.headers["Content-Encoding"] == coding
    assert response.headers["Content-Length"] == str(len(sent))
    assert "ETag" not in response.headers
    assert response.headers.getall("Vary") == ["Origin", "Accept-Encoding"]
    document = orjson.loads(DECOMPRESSORS[coding](sent))
    assert document["data"][0]["content"][0]["state"]["status"] == "error"
    assert document["data"][1] == load("v2-message-stale-running.json")["data"][1]


@pytest.mark.parametrize("accept", [None, "identity", "gzip;q=0, deflate", "br"])
async def test_a_client_that_does_not_take_the_coding_gets_identity(
    proxy: ProxyClient, fake: FakeOpencode, accept: str | None
) -> None:
    serve_compressed(fake, "gzip", gzip.compress(STALE))
    headers = {"Accept-Encoding": accept} if accept else {}
    response = await proxy.get(
        PATH, headers=headers, skip_auto_headers=["Accept-Encoding"], auto_decompress=False
    )
    sent = await response.read()
    if accept is None:  # RFC 9110: no Accept-Encoding means any coding will do
        sent = gzip.decompress(sent)
    else:
        assert "Content-Encoding" not in response.headers
        assert response.headers["Content-Length"] == str(len(sent))
    assert response.headers[SETTLED_HEADER] == "1"
    assert "Accept-Encoding" in response.headers.getall("Vary")
    assert orjson.loads(sent)["data"][0]["content"][0]["state"]["status"] == "error"


async def test_nothing_to_settle_passes_the_compressed_bytes_as_they_came(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    original = gzip.compress(STALE)
    serve_compressed(fake, "gzip", original)
    fake.v2_active.add(V2)
    response = await proxy.get(PATH, headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert await response.read() == original
    assert response.headers["Content-Encoding"] == "gzip"
    assert response.headers["ETag"] == '"v1"'
    assert response.headers["Vary"] == "Origin"
    assert SETTLED_HEADER not in response.headers
    assert fake.liveness_requests == 1, "the decoded body was scanned and found an open tool"


UNDECODABLE = {
    "truncated gzip": ("gzip", gzip.compress(STALE)[:-8], "not a valid gzip body"),
    "not br": ("br", b"not brotli at all", "not a valid br body"),
    "truncated zstd": ("zstd", _zstd_streamed(STALE)[:-5], "not a valid zstd body: truncated"),
    "unknown coding": (
        "compress",
        gzip.compress(STALE),
        "compress, which cannot be decoded here (not installed)",
    ),
}


@pytest.mark.parametrize("case", UNDECODABLE)
async def test_a_body_that_does_not_decode_passes_untouched_with_one_line_saying_why(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    coding, body, why = UNDECODABLE[case]
    serve_compressed(fake, coding, body)
    with caplog.at_level(logging.WARNING, logger="proxy.addons.settle"):
        response = await proxy.get(PATH, headers={"Accept-Encoding": "*"}, auto_decompress=False)
        assert await response.read() == body
    assert response.headers["Content-Encoding"] == coding
    assert SETTLED_HEADER not in response.headers
    (line,) = [record.getMessage() for record in caplog.records if record.name == "proxy.addons.settle"]
    assert why in line
    assert V2 in line


async def test_a_coding_whose_package_is_not_installed_passes_untouched(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(codings._CODECS, "br")
    original = brotli.compress(STALE)
    serve_compressed(fake, "br", original)
    with caplog.at_level(logging.WARNING, logger="proxy.addons.settle"):
        response = await proxy.get(PATH, headers={"Accept-Encoding": "br"}, auto_decompress=False)
        assert await response.read() == original
    assert SETTLED_HEADER not in response.headers
    (line,) = [record.getMessage() for record in caplog.records if record.name == "proxy.addons.settle"]
    assert "br, which cannot be decoded here (not installed)" in line


@pytest.mark.parametrize(
    ("accept", "taken"),
    [
        ("gzip, deflate, br, zstd", True),
        ("GZIP;q=0.5", True),
        ("x-gzip", True),
        ("gzip;q=0", False),
        ("*", True),
        ("*;q=0, deflate", False),
        ("identity", False),
        ("gzip;q=oops", False),
        ("", False),
    ],
)
def test_accept_encoding(accept: str, taken: bool) -> None:
    assert codings.accepts(accept, ["gzip"]) is taken
