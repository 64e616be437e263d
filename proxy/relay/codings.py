"""Content codings (RFC 9110 §8.4) of the bodies the proxy must read, decoded and encoded again.

The proxy asks for message views with `Accept-Encoding: identity`, but an upstream that ignores
it, or a compressing hop in between, can answer compressed anyway, and a body relayed unread is
a view left unchecked. gzip and deflate are in the standard library; br and zstd only when their
packages are installed (the `codecs` extra). A coding that cannot be decoded here is reported as
such, so the caller can pass the body on untouched and say why.

Decoding is bounded: a `Decoder` takes the body piece by piece and produces it in pieces of at
most `_PIECE` bytes, and stops with `TooLarge` once the decoded body passes its limit, so a body
that inflates a thousandfold (a decompression bomb) costs the limit, never its inflated size.
"""

from __future__ import annotations

import gzip
import importlib
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

from proxy.relay.zstd_frames import ZstdFrames

_ALIASES = {"x-gzip": "gzip"}
_LEVEL = 6
"""zlib's default; brotli and zstd get levels of about its speed (their maxima take seconds on MBs)."""
_PIECE = 2**16
"""The most each decoding step may produce before the limit is checked again."""


class CodingError(ValueError):
    """A body that is not what its `Content-Encoding` says, or in a coding not installed here."""


class TooLarge(CodingError):
    """A body that decodes to more than the limit it was given."""


class _Sink(Protocol):
    def write(self, data: bytes) -> object: ...


class _Stage(Protocol):
    """One coding undone: takes encoded bytes, writes decoded ones on in bounded pieces."""

    def write(self, data: bytes) -> object: ...

    def end(self) -> None:
        """Raise `CodingError` unless the body taken so far is complete."""


@dataclass(frozen=True, slots=True)
class _Codec:
    stage: Callable[[_Sink], _Stage]
    encode: Callable[[bytes], bytes]


def content_codings(values: Iterable[str]) -> list[str]:
    """The codings applied to a body, in the order they were applied, from `Content-Encoding`."""
    codings = [token.strip().lower() for value in values for token in value.split(",")]
    return [_ALIASES.get(coding, coding) for coding in codings if coding and coding != "identity"]


def missing(codings: Sequence[str]) -> list[str]:
    """The codings among `codings` that cannot be decoded here."""
    return [coding for coding in codings if coding not in _CODECS]


def decode(body: bytes, codings: Sequence[str], *, limit: int) -> bytes:
    """Undo `codings`, last applied first; raises `TooLarge` past `limit` decoded bytes and
    `CodingError` for anything else that does not decode."""
    if not codings:  # most bodies: nothing to undo, so no pipeline to build
        _Decoded(limit, keep=False).write(body)
        return body
    decoder = Decoder(codings, limit=limit)
    decoder.feed(body)
    return decoder.result()


class Decoder:
    """Undoes `codings` on a body given piece by piece, holding at most `limit` decoded bytes;
    `keep=False` only measures (the decoded bytes are dropped as they come)."""

    def __init__(self, codings: Sequence[str], *, limit: int, keep: bool = True) -> None:
        if absent := missing(codings):
            raise CodingError(f"{', '.join(absent)} cannot be decoded here (not installed)")
        self._decoded = _Decoded(limit, keep=keep)
        sink: _Sink = self._decoded
        self._stages: list[_Named] = []
        for coding in codings:  # the first applied is undone last, so it writes to the result
            stage = _Named(coding, _CODECS[coding].stage(sink))
            self._stages.insert(0, stage)
            sink = stage

    def feed(self, piece: bytes) -> None:
        """Decode `piece`, the next bytes of the body."""
        (self._stages[0] if self._stages else self._decoded).write(piece)

    def result(self) -> bytes:
        """The whole decoded body, once every piece was fed (raises if it ended early)."""
        for stage in self._stages:
            stage.end()
        return self._decoded.body()


class _Failed(CodingError):
    """A coding that failed, named (so that the codings it was written through pass it on)."""


class _Named:
    """A stage whose failures say which coding failed."""

    def __init__(self, coding: str, stage: _Stage) -> None:
        self._coding = coding
        self._stage = stage

    def write(self, data: bytes) -> None:
        self._named(self._stage.write, data)

    def end(self) -> None:
        self._named(lambda _: self._stage.end(), b"")

    def _named(self, step: Callable[[bytes], object], data: bytes) -> None:
        try:
            step(data)
        except (TooLarge, _Failed):
            raise
        except Exception as error:  # each library has its own errors; all mean the same here
            raise _Failed(f"not a valid {self._coding} body: {error}") from error


class _Decoded:
    """The end of the chain: counts (and keeps, unless told not to) what was decoded."""

    def __init__(self, limit: int, *, keep: bool) -> None:
        self._size = 0
        self._limit = limit
        self._pieces: list[bytes] | None = [] if keep else None

    def write(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._limit:
            raise TooLarge(f"decodes to more than {self._limit} bytes")
        if self._pieces is not None:
            self._pieces.append(data)

    def body(self) -> bytes:
        return b"".join(self._pieces or ())


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


class _Inflate:
    """gzip (members one after another, zero padding between them, as `gzip.decompress` takes),
    or HTTP's deflate: zlib-wrapped (RFC 9110 §8.4.1.2) or, as some servers send it, raw."""

    def __init__(self, out: _Sink, *, members: bool) -> None:
        self._out, self._members = out, members
        self._wbits = 16 + zlib.MAX_WBITS
        self._head = b""
        self._inflater = zlib.decompressobj(self._wbits) if members else None

    def write(self, data: bytes) -> None:
        if self._inflater is None:  # deflate: which one shows in its first two bytes
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return
            self._wbits = zlib.MAX_WBITS if _zlib_header(data) else -zlib.MAX_WBITS
            self._inflater = zlib.decompressobj(self._wbits)
        while True:
            if self._inflater.eof:
                data = data.lstrip(b"\0") if self._members else data
                if not data:
                    return
                if not self._members:
                    raise CodingError("bytes after the end of the body")
                self._inflater = zlib.decompressobj(self._wbits)
            out = self._inflater.decompress(data, _PIECE)
            data = self._inflater.unused_data if self._inflater.eof else self._inflater.unconsumed_tail
            if out:
                self._out.write(out)
            if not data and len(out) < _PIECE:
                return

    def end(self) -> None:
        if self._inflater is None or not self._inflater.eof:
            raise CodingError("truncated")


def _zlib_header(data: bytes) -> bool:
    """Whether `data` starts as a zlib stream does (RFC 1950 §2.2: deflate, a valid check)."""
    return data[0] & 0x0F == 8 and data[0] >> 4 <= 7 and (data[0] << 8 | data[1]) % 31 == 0


def _optional(*names: str) -> ModuleType | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _codecs() -> dict[str, _Codec]:
    found = {
        "gzip": _Codec(
            lambda out: _Inflate(out, members=True),
            lambda body: gzip.compress(body, compresslevel=_LEVEL, mtime=0),
        ),
        "deflate": _Codec(lambda out: _Inflate(out, members=False), lambda body: zlib.compress(body, _LEVEL)),
    }
    brotli = _optional("brotli")
    if brotli is not None and hasattr(brotli.Decompressor, "can_accept_more_data"):  # bounded since 1.2
        found["br"] = _Codec(
            lambda out: _Brotli(out, brotli), lambda body: bytes(brotli.compress(body, quality=4))
        )
    if (zstandard := _optional("zstandard")) is not None:
        found["zstd"] = _Codec(lambda out: _Zstd(out, zstandard), zstandard.ZstdCompressor(level=3).compress)
    return found


class _Brotli:
    def __init__(self, out: _Sink, brotli: ModuleType) -> None:
        self._out = out
        self._decompressor = brotli.Decompressor()

    def write(self, data: bytes) -> None:
        while True:  # once the output is limited, only empty input may follow until it is taken
            out = self._decompressor.process(data, output_buffer_limit=_PIECE)
            data = b""
            if out:
                self._out.write(out)
            elif self._decompressor.can_accept_more_data():
                return

    def end(self) -> None:
        if not self._decompressor.is_finished():
            raise CodingError("truncated")


class _Zstd:
    """zstandard's bounded decoder (a stream writer) does not say where its frames end, so they
    are walked here too: a truncated frame must not pass for a shorter body."""

    def __init__(self, out: _Sink, zstandard: ModuleType) -> None:
        self._writer = zstandard.ZstdDecompressor().stream_writer(out, write_size=_PIECE)
        self._frames = ZstdFrames()

    def write(self, data: bytes) -> None:
        self._frames.take(data)
        self._writer.write(data)

    def end(self) -> None:
        if not self._frames.complete:
            raise CodingError("truncated frame")


_CODECS = _codecs()
