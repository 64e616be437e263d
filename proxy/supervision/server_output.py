"""The supervised server's output, each line prefixed with its program's name (`opencode| …`).

Under `run` the proxy's banner is where clients go; the server's own "listening on
http://127.0.0.1:<port>" names the port only the proxy uses. Prefixed, a user tells whose each
line is. The server writes into pipes, each read to its end by a thread of its own that writes
every line, prefixed, where the proxy's own output goes (stdout to stdout, stderr to stderr), in
one `write` so it never splits a line of the proxy's log. A thread, not the event loop: a server
that writes a lot must never wait on a busy loop, and what it left running (holding the pipe)
may write after it is gone.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

STDOUT, STDERR = 1, 2
LINE_LIMIT = 65_536
"""A longer line is cut into lines of this many bytes, each prefixed."""


class ServerOutput:
    """Pipes for the server's output, relayed line by line with the program's name before each."""

    def __init__(self, program: str) -> None:
        self._prefix = f"{Path(program).name}| ".encode()
        self._closed = False

    def pipe(self, into: int) -> int:
        """The write end of a new pipe for the server (the caller closes it once the server has
        it); every line written into it reaches the file descriptor `into`, prefixed."""
        read, write = os.pipe()
        threading.Thread(target=self._relay, args=(read, into), name="server output", daemon=True).start()
        return write

    def _relay(self, read: int, into: int) -> None:
        with os.fdopen(read, "rb") as lines:
            while line := lines.readline(LINE_LIMIT):
                if not self._closed:
                    _write_all(into, self._prefix + (line if line.endswith(b"\n") else line + b"\n"))

    def close(self) -> None:
        """Stop relaying (the proxy is stopping): what is still written is read and dropped, so no
        writer left behind blocks on a full pipe."""
        self._closed = True


def _write_all(into: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the proxy's output is gone: the line is dropped
        while data:
            data = data[os.write(into, data) :]
