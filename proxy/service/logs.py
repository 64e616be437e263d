"""Log output: readable text, or one JSON object per line for log pipelines.

Records may carry structured fields (`extra={"fields": {...}}`); both formats show them,
text as `key=value` pairs. In JSON the text goes under `event` (as structlog does), so a
field may be called `message`. Nothing secret is ever put into a record: credentials stay in
headers the proxy forwards and are never logged.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
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
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
