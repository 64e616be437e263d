"""`--access-log`: one line per request, as uvicorn and Caddy write them, off by default.

`GET /session/ses_1/message?limit=5 200 bytes=1234 ms=12.3 settled=1`: the method, the path with
its query (every secret's value replaced by `***`: `auth_token`, and any name that looks like a
password, token, key or signature), the status, the body's bytes (`-` for an event stream), the
milliseconds from the request's head to the answer's end, and how many parts of a message view
were settled (the `X-Settle-Settled` header; `-` when none were). In JSON the last three are
fields of their own.
"""

from __future__ import annotations

import logging
import re

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, Response, StreamResponse
from yarl import URL

from proxy.addons.settle import SETTLED_HEADER

ACCESS_LOG = logging.getLogger("proxy.access")

SECRET_NAME = re.compile(r"auth|token|pass|secret|key|sig|credential", re.IGNORECASE)
"""A query parameter whose value is never written (opencode's own is `auth_token`)."""
HIDDEN = "***"


class AccessLog(AbstractAccessLogger):
    """aiohttp's access logger, as the proxy writes it: `AppRunner(access_log=ACCESS_LOG,
    access_log_class=AccessLog)`."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        fields = {
            "bytes": body_bytes(response),
            "ms": round(time * 1000, 1),
            "settled": response.headers.get(SETTLED_HEADER, "-"),
        }
        target, status = shown(request.rel_url), response.status
        self.logger.info("%s %s %d", request.method, target, status, extra={"fields": fields})


def body_bytes(response: StreamResponse) -> int | str:
    """The body's bytes as sent (nginx's `$body_bytes_sent`): a whole body's length, else the one
    its head declared; `-` for a stream without one (an event stream)."""
    if isinstance(response, Response) and isinstance(response.body, bytes | bytearray):
        return len(response.body)
    return response.content_length if response.content_length is not None else "-"


def shown(target: URL) -> str:
    """The path and query of `target`, each secret-looking query value replaced by `***`."""
    if not target.query_string:
        return target.raw_path
    pairs = [(name, HIDDEN if SECRET_NAME.search(name) else value) for name, value in target.query.items()]
    return str(target.with_query(pairs))
