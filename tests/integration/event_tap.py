"""Follow a server-sent event stream in a background thread and keep every `data:` payload.

A test subscribes before it acts and afterwards asks what the stream carried, the way a connected
client (a TUI, a web view) would have heard it. The stream is closed by shutting its socket down,
so `stop()` returns promptly even while the server sends nothing (opencode's heartbeat is 10 s).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import orjson

from .polling import poll

_CONNECT_TIMEOUT_S = 10.0
_JOIN_TIMEOUT_S = 5.0


class EventTap:
    """One subscription to `url`; use as a context manager, or `start()` and `stop()` in `finally`."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._target = parts.path + (f"?{parts.query}" if parts.query else "")
        self._headers = {"Accept": "text/event-stream", **(headers or {})}
        self._payloads: list[Any] = []
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EventTap:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Connect and return once the server has answered 200; payloads are collected from then on."""
        connection = http.client.HTTPConnection(self._host, self._port, timeout=_CONNECT_TIMEOUT_S)
        self._connection = connection
        connection.request("GET", self._target, headers=self._headers)
        self._socket = connection.sock
        response = connection.getresponse()
        if response.status != 200:
            raise AssertionError(f"GET {self._target} -> {response.status}: {response.read(500)!r}")
        if self._socket is not None:
            self._socket.settimeout(None)  # quiet streams are normal; `stop()` ends the read
        self._thread = threading.Thread(target=self._read, args=(response,), name="event-tap", daemon=True)
        self._thread.start()

    def payloads(self) -> list[Any]:
        """Every payload received so far, oldest first."""
        with self._lock:
            return list(self._payloads)

    def wait_for(self, match: Callable[[Any], bool], *, what: str, timeout: float) -> Any:
        """The first payload `match` accepts, waiting up to `timeout` seconds for it to arrive."""
        return poll(
            lambda: next((p for p in self.payloads() if match(p)), None),
            what=what,
            timeout=timeout,
            interval=0.05,
        )

    def stop(self) -> None:
        """Close the stream and wait for the reader; idempotent."""
        if self._socket is not None:
            with contextlib.suppress(OSError):  # already closed by the server
                self._socket.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                raise RuntimeError(f"event tap on {self._target} did not stop")
        if self._connection is not None:
            self._connection.close()
        self._socket = self._thread = self._connection = None

    def _read(self, response: http.client.HTTPResponse) -> None:
        try:
            while line := response.readline():
                if line.startswith(b"data:"):
                    payload = orjson.loads(line[5:].strip())
                    with self._lock:
                        self._payloads.append(payload)
        except (OSError, ValueError, http.client.HTTPException):
            return  # the stream was shut down by `stop()` or by the server


def part_status(payload: Any, part_id: str) -> str | None:
    """The status a `/global/event` payload gives part `part_id`, if it is an update of it."""
    event = payload.get("payload") or {}
    part = (event.get("properties") or {}).get("part") or {}
    if event.get("type") != "message.part.updated" or part.get("id") != part_id:
        return None
    return str(part["state"]["status"])


def session_status(payload: Any, session_id: str) -> str | None:
    """The status a `/global/event` payload gives session `session_id`, if it is one of its statuses."""
    event = payload.get("payload") or {}
    properties = event.get("properties") or {}
    if event.get("type") != "session.status" or properties.get("sessionID") != session_id:
        return None
    return str(properties["status"]["type"])
