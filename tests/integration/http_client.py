"""A minimal blocking HTTP client for the harness: every call has a timeout and never raises on 4xx/5xx.

The harness is synchronous (servers are subprocesses, fixtures span the test session), so the
standard library is enough; it sends no `Accept-Encoding`, so bodies arrive uncompressed.
"""

from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any

import orjson

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Reply:
    """A complete response; `headers` looks names up case-insensitively."""

    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (by the standard library, which reads lone surrogate escapes)."""
        return json.loads(self.body)


def request(
    method: str,
    url: str,
    *,
    json: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Reply:
    """Send one request and read the whole response; HTTP error statuses are returned, not raised.

    Credentials in the URL (`http://user:password@host/`) are sent as Basic auth, as curl does,
    so a password-protected server's URL is all a helper needs.
    """
    url, authorization = _split_credentials(url)
    all_headers = ({"Authorization": authorization} if authorization else {}) | dict(headers or {})
    data = None
    if json is not None:
        data = orjson.dumps(json)
        all_headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=all_headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return Reply(err.code, err.headers, err.read())


def with_credentials(url: str, username: str, password: str) -> str:
    """`url` with `username:password@` in it, for `request` to send as Basic auth."""
    parts = urllib.parse.urlsplit(url)
    userinfo = f"{urllib.parse.quote(username, safe='')}:{urllib.parse.quote(password, safe='')}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


def _split_credentials(url: str) -> tuple[str, str | None]:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    plain = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    userinfo = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return plain, "Basic " + base64.b64encode(userinfo.encode()).decode("ascii")


def get_json(url: str, *, headers: dict[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """GET a JSON document that must exist: anything but 200 is a failure worth a clear message."""
    reply = request("GET", url, headers=headers, timeout=timeout)
    if reply.status != 200:
        raise AssertionError(f"GET {url} -> {reply.status}: {reply.body[:500]!r}")
    return reply.json()


def free_port() -> int:
    """A loopback port that was free a moment ago (the usual bind-to-0 race is acceptable in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on the loopback port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False
