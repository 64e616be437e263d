"""A body read whole for the addons, bounded: as sent and as decoded.

The relay holds the body as the upstream sent it (the addons decode it themselves, and an
unchanged one goes out as it came), and measures its decoded size as it arrives, dropping the
decoded bytes at once: a compressed body that inflates a thousandfold is noticed at the piece
that takes it past the bound, having cost the bound and no more.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from aiohttp import hdrs

from proxy.relay import codings
from proxy.relay.hooks import Flow

Past = Literal["encoded", "decoded"]


class WholeBody:
    """The pieces of `flow`'s body so far, within `flow.max_body` bytes both as sent and decoded."""

    def __init__(self, flow: Flow) -> None:
        self.pieces: deque[bytes] = deque()
        self._size = 0
        self._limit = flow.max_body
        applied = codings.content_codings(flow.response_headers.getall(hdrs.CONTENT_ENCODING, ()))
        self._decoded = (
            codings.Decoder(applied, limit=self._limit, keep=False)
            if applied and not codings.missing(applied)
            else None
        )

    def add(self, piece: bytes) -> Past | None:
        """Take the next `piece`; how the body is past the bound, or None while it is not."""
        self.pieces.append(piece)
        self._size += len(piece)
        if self._size > self._limit:
            return "encoded"
        if self._decoded is not None:
            try:
                self._decoded.feed(piece)
            except codings.TooLarge:
                return "decoded"
            except codings.CodingError:
                self._decoded = None  # not measurable; the addon that decodes it says why
        return None

    def whole(self) -> bytes:
        """The body as sent, once every piece was added."""
        body = b"".join(self.pieces)
        self.pieces.clear()
        return body
