"""The server command of `settle-proxy run -- opencode serve …`: where it wanted to listen, and
the same command told to listen where only the proxy can reach it.

The address a user gives the server is the address clients already use, so the proxy takes it
over and the server gets a free loopback port instead. Any command that takes `--port` and
`--hostname` works (`opencode serve`, `opencode web`).
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
_PORT, _HOSTNAME = "--port", "--hostname"


@dataclass(frozen=True, slots=True)
class ServerCommand:
    """A server command line without its listening flags, and the values those flags had."""

    argv: tuple[str, ...]
    port: int | None
    hostname: str | None

    @classmethod
    def parse(cls, argv: Sequence[str]) -> ServerCommand:
        """Split out `--port`/`--hostname` (as `--flag value` or `--flag=value`); ValueError if
        a flag has no value or the port is not a number."""
        rest: list[str] = []
        found: dict[str, str] = {}
        words = iter(argv)
        for word in words:
            flag, equals, value = word.partition("=")
            if flag not in (_PORT, _HOSTNAME):
                rest.append(word)
                continue
            if not equals:
                value = next(words, "")
            if not value or value.startswith("--"):
                raise ValueError(f"{flag} needs a value")
            found[flag] = value
        if not rest:
            raise ValueError("no server command after --")
        port = found.get(_PORT)
        if port is not None and not (port.isdigit() and 0 <= int(port) <= 65535):
            raise ValueError(f"{_PORT} must be a port number, got {port!r}")
        return cls(tuple(rest), int(port) if port is not None else None, found.get(_HOSTNAME))

    def not_serving(self) -> str | None:
        """Why this command, an `opencode` one, may start no server, with the fix; None when it
        names `serve` or `web`, or is not opencode's. `opencode --port N` is accepted by opencode
        1.x, but it starts the TUI, not a server."""
        if not Path(self.argv[0]).name.startswith("opencode") or {"serve", "web"} & set(self.argv[1:]):
            return None
        shown = " ".join(self.argv)
        return f"`{shown}` names no `serve`: on opencode 1.x it is the TUI, not a server (`{shown} serve`?)"

    def listening_on(self, port: int) -> list[str]:
        """The command, told to listen on `port` of the loopback interface only."""
        return [*self.argv, _PORT, str(port), _HOSTNAME, LOOPBACK]


def free_loopback_port() -> int:
    """A port nobody listens on right now (the server binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def unstartable(program: str, path: str | None = None) -> str | None:
    """Why `program` (a server command's first word) cannot be started, with the fix; None when
    it can. `path` is the search path of a bare name (default: `PATH`)."""
    if os.sep not in program:
        if shutil.which(program, path=path) is not None:
            return None
        search = path if path is not None else os.environ.get("PATH", os.defpath)
        present = [Path(folder, program) for folder in search.split(os.pathsep) if folder]
        present = [candidate for candidate in present if candidate.is_file()]
        if not present:
            return f"{program}: not found on PATH (install it, or give its full path)"
        return f"{program}: {present[0]} is not executable (chmod +x {present[0]})"
    file = Path(program)
    if not file.exists():
        why = "no such file"
    elif file.is_dir():
        why = "a directory, not a program"
    elif not os.access(file, os.X_OK):
        why = f"not executable (chmod +x {program})"
    else:
        return None
    return f"{program}: {why}"
