"""Content codings (RFC 9110 §8.4) of the bodies the proxy must read, decoded and encoded again.

The proxy asks for message views with `Accept-Encoding: identity`, but an upstream that ignores
it, or a compressing hop in between, can answer compressed anyway, and a body relayed unread is
a view left unchecked. gzip and deflate are in the standard library; br and zstd only when their
packages are installed (the `codecs` extra). A coding that cannot be decoded here is reported as
such, so the caller can pass the body on untouched and say why.
"""

from __future__ import annotations

import gzip
import importlib
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType

_ALIASES = {"x-gzip": "gzip"}
_LEVEL = 6
"""zlib's default; brotli and zstd get levels of about its speed (their maxima take seconds on MBs)."""


class CodingError(ValueError):
    """A body that is not what its `Content-Encoding` says, or in a coding not installed here."""


@dataclass(frozen=True, slots=True)
class _Codec:
    decode: Callable[[bytes], bytes]
    encode: Callable[[bytes], bytes]


def content_codings(values: Iterable[str]) -> list[str]:
    """The codings applied to a body, in the order they were applied, from `Content-Encoding`."""
    codings = [token.strip().lower() for value in values for token in value.split(",")]
    return [_ALIASES.get(coding, coding) for coding in codings if coding and coding != "identity"]


def missing(codings: Sequence[str]) -> list[str]:
    """The codings among `codings` that cannot be decoded here."""
    return [coding for coding in codings if coding not in _CODECS]


def decode(body: bytes, codings: Sequence[str]) -> bytes:
    """Undo `codings`, last applied first; raises `CodingError` for anything that does not decode."""
    if absent := missing(codings):
        raise CodingError(f"{', '.join(absent)} cannot be decoded here (not installed)")
    for coding in reversed(codings):
        try:
            body = _CODECS[coding].decode(body)
        except Exception as error:  # each library has its own errors; all mean the same here
            raise CodingError(f"not a valid {coding} body: {error}") from error
    return body


def encode(body: bytes, codings: Sequence[str]) -> bytes:
    """Apply `codings` in order (all must be decodable here, so all can be encoded)."""
    for coding in codings:
        body = _CODECS[coding].encode(body)
    return body


def accepts(accept_encoding: str | None, codings: Sequence[str]) -> bool:
    """Whether a client that sent `accept_encoding` takes every one of `codings` (RFC 9110 §12.5.3:
    no header means any coding will do; `q=0` refuses; `*` covers codings not named)."""
    if accept_encoding is None:
        return True
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        name, *parameters = (piece.strip() for piece in item.split(";"))
        weight = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if name:
            weights[_ALIASES.get(name.lower(), name.lower())] = weight
    return all(weights.get(coding, weights.get("*", 0.0)) > 0 for coding in codings)


def _inflate(body: bytes) -> bytes:
    """HTTP's deflate is zlib-wrapped (RFC 9110 §8.4.1.2), but some servers send it raw."""
    try:
        return _whole(zlib.decompressobj(zlib.MAX_WBITS), body)
    except zlib.error:
        return _whole(zlib.decompressobj(-zlib.MAX_WBITS), body)


def _whole(decompressor: zlib._Decompress, body: bytes) -> bytes:
    decoded = decompressor.decompress(body) + decompressor.flush()
    if not decompressor.eof or decompressor.unused_data:
        raise zlib.error("truncated stream, or bytes after its end")
    return decoded


def _optional(*names: str) -> ModuleType | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _codecs() -> dict[str, _Codec]:
    found = {
        "gzip": _Codec(gzip.decompress, lambda body: gzip.compress(body, compresslevel=_LEVEL, mtime=0)),
        "deflate": _Codec(_inflate, lambda body: zlib.compress(body, _LEVEL)),
    }
    if (brotli := _optional("brotli", "brotlicffi")) is not None:
        found["br"] = _Codec(brotli.decompress, lambda body: bytes(brotli.compress(body, quality=4)))
    if (zstandard := _optional("zstandard")) is not None:
        found["zstd"] = _Codec(_zstd_decoder(zstandard), zstandard.ZstdCompressor(level=3).compress)
    return found


def _zstd_decoder(zstandard: ModuleType) -> Callable[[bytes], bytes]:
    """Frame by frame, since a streamed frame need not state its size and a truncated one must
    not pass for a shorter body (`zstandard`'s one-shot and reader APIs do one or the other)."""

    def decoded(body: bytes) -> bytes:
        pieces = []
        while body:
            frame = zstandard.ZstdDecompressor().decompressobj()
            pieces.append(frame.decompress(body))
            if not frame.eof:
                raise CodingError("truncated zstd frame")
            body = frame.unused_data
        return b"".join(pieces)

    return decoded


_CODECS = _codecs()
