"""Log output: readable text, or one JSON object per line for log pipelines.

Records may carry structured fields (`extra={"fields": {...}}`); both formats show them,
text as `key=value` pairs. In JSON the text goes under `event` (as structlog does), so a
field may be called `message`; its `time` is RFC 3339, to the millisecond, with the local
offset (`2026-12-03T07:21:07.123+00:00`). `debug` is the proxy's own: the libraries under it
(aiosqlite logs every call it makes) say at most what they say at `info`. Nothing secret is
ever put into a record: credentials stay in headers the proxy forwards and are never logged.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import orjson

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
OWN = ("proxy", "rules")
"""The loggers `--log-level` sets; every other one logs from `info` at the most."""


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields: dict[str, Any] = getattr(record, "fields", {})
        return line + "".join(f" {key}={value}" for key, value in fields.items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str, form: str) -> None:
    """Send every record to stderr at `level`, as `form` ("text" or "json")."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
    own = logging.getLevelNamesMapping()[level.upper()]
    logging.basicConfig(level=max(own, logging.INFO), handlers=[handler], force=True)
    for name in OWN:
        logging.getLogger(name).setLevel(own)


def rfc3339(created: float) -> str:
    """`created` (a record's, seconds since the epoch) in RFC 3339 with milliseconds and the
    local offset, as log pipelines parse it."""
    return datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")
