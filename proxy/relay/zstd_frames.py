"""Where the frames of a zstd body end (RFC 8878 §3.1), read from their headers alone.

zstandard's bounded, piece-by-piece decoder (its stream writer) never says whether the body
ended at the end of a frame, and a truncated body must not pass for a shorter one. Block
headers state their sizes, so walking them costs a few bytes per block of up to 128 KiB.
"""

from __future__ import annotations

_FRAME_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50
"""The first of the 16 magic numbers of skippable frames (its low 4 bits are free)."""
_RLE_BLOCK, _RESERVED_BLOCK = 1, 3
_CHECKSUM_SIZE = 4


class ZstdFrameError(ValueError):
    """Bytes that are not a zstd frame where one must start."""


class ZstdFrames:
    """Takes a zstd body piece by piece; `complete` says whether it ends where a frame ends."""

    def __init__(self) -> None:
        self._held = b""
        """The start of a header that has not arrived whole."""
        self._skip = 0
        """Bytes to pass over: block contents, a checksum, a skippable frame."""
        self._in_frame = False
        self._checksum = False

    @property
    def complete(self) -> bool:
        return not (self._in_frame or self._held or self._skip)

    def take(self, data: bytes) -> None:
        data = self._held + data if self._held else data
        position = 0
        while position < len(data):
            if self._skip:
                passed = min(self._skip, len(data) - position)
                self._skip -= passed
                position += passed
                continue
            header = data[position : position + 18]
            used = self._block(header) if self._in_frame else self._frame(header)
            if not used:
                break
            position += used
        self._held = data[position:]

    def _frame(self, header: bytes) -> int:
        """The size of the frame header starting `header`, or 0 while it is incomplete."""
        if len(header) < 5:
            return 0
        magic = int.from_bytes(header[:4], "little")
        if magic & ~0xF == _SKIPPABLE_MAGIC:
            if len(header) < 8:
                return 0
            self._skip = int.from_bytes(header[4:8], "little")
            return 8
        if magic != _FRAME_MAGIC:
            raise ZstdFrameError("not a zstd frame")
        descriptor = header[4]
        single_segment, dictionary, content_size = descriptor >> 5 & 1, descriptor & 3, descriptor >> 6
        size = 5 + (1 - single_segment) + (0, 1, 2, 4)[dictionary] + ((single_segment, 2, 4, 8)[content_size])
        if len(header) < size:
            return 0
        self._in_frame, self._checksum = True, bool(descriptor >> 2 & 1)
        return size

    def _block(self, header: bytes) -> int:
        """3 for a whole block header (its contents are then skipped), or 0 while it is incomplete."""
        if len(header) < 3:
            return 0
        fields = int.from_bytes(header[:3], "little")
        last, kind, size = fields & 1, fields >> 1 & 3, fields >> 3
        if kind == _RESERVED_BLOCK:
            raise ZstdFrameError("a reserved block type")
        self._skip = 1 if kind == _RLE_BLOCK else size
        if last:
            self._in_frame = False
            self._skip += _CHECKSUM_SIZE if self._checksum else 0
        return 3
