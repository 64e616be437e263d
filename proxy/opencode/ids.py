"""Identifiers in opencode's own format, for the events write-back appends.

opencode ids sort by creation: a prefix, 12 hex digits of `milliseconds * 4096 + counter`
(the low 48 bits), then 14 random base-62 characters. Events the proxy appends sort among
the server's own in the same way.
"""

from __future__ import annotations

import secrets
import string
import time

_ALPHABET = string.digits + string.ascii_letters
_last_stamp = 0


def ascending_id(prefix: str, now_ms: int | None = None) -> str:
    """A new id such as `evt_2294399f2001ImhTN5k8tPZx94`, greater than every earlier one."""
    global _last_stamp  # noqa: PLW0603 - the counter is process-wide, like opencode's
    stamp = max((now_ms if now_ms is not None else int(time.time() * 1000)) * 0x1000, _last_stamp + 1)
    _last_stamp = stamp
    random_part = "".join(secrets.choice(_ALPHABET) for _ in range(14))
    return f"{prefix}_{stamp & 0xFFFFFFFFFFFF:012x}{random_part}"
