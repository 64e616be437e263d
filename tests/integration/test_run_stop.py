"""SIGTERM to `settle-proxy run -- opencode serve` (the real 1.18.33) with a client on
`/global/event`: the proxy cuts the client's stream first, as a crash would (no last chunk: the
client reconnects), never relays the server's own clean end of it, and stops the server; the stop
took 10 s when opencode outlived its 10 s grace."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from proxy.demo.model import MockModel

from .http_client import get_json
from .opencode_server import OpencodeServer, running_opencode
from .proctree import is_gone

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXIT_WITHIN_S = 30.0
LAST_CHUNK = b"0\r\n\r\n"


@pytest.fixture
def supervised(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    with running_opencode(tmp_path_factory.mktemp("stop"), mock_model.base_url, supervised=()) as server:
        yield server


def _open_stream(server: OpencodeServer) -> tuple[socket.socket, bytes]:
    port = int(server.origin.rsplit(":", 1)[1])
    client = socket.create_connection(("127.0.0.1", port), timeout=EXIT_WITHIN_S)
    client.sendall(b"GET /global/event HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    received = b""
    while b"server.connected" not in received:
        piece = client.recv(65536)
        assert piece, f"the stream ended before its first event: {received!r}"
        received += piece
    return client, received


def _rest(client: socket.socket) -> bytes:
    rest = b""
    try:
        while piece := client.recv(65536):
            rest += piece
    except ConnectionResetError:
        pass
    return rest


def test_sigterm_cuts_the_clients_stream_and_stops_the_server(
    supervised: OpencodeServer, record_property: Callable[[str, object], None]
) -> None:
    server_pid = int(get_json(f"{supervised.url}/_settle/health")["server"]["pid"])
    client, first = _open_stream(supervised)
    assert first.startswith(b"HTTP/1.1 200")
    proxy = supervised._require_process()

    sent = time.monotonic()
    proxy.send_signal(signal.SIGTERM)
    proxy.wait(timeout=EXIT_WITHIN_S)
    record_property("stop_seconds", round(time.monotonic() - sent, 2))
    supervised._process = None  # stopped: nothing for the fixture to crash

    assert proxy.returncode == 0
    rest = _rest(client)
    client.close()
    assert not (first + rest).endswith(LAST_CHUNK), "the stream was ended cleanly, not cut"
    assert is_gone(server_pid)
