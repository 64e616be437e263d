"""The real opencode TUI (`opencode attach`) in tmux, seen the way a user's terminal sees it.

A `Terminals` is a private tmux server (`tmux -L <unique socket>` with its own config), so a test
never touches a user's tmux or another test's, and closing it (`kill-server`) ends every TUI it
started. Every pane's output is copied to a file with `pipe-pane`: counting the bytes a TUI writes
while nothing happens is how a spinner shows up in numbers (opencode 1.18.33 redraws a running
tool's spinner about 13 times a second, ~9.6 KB per 10 s; a settled screen writes nothing).

The TUIs get fresh XDG dirs of their own, not the server's: measured on 1.18.33, `attach` needs
none of the server's files (it installs no plugin and reads everything over HTTP), and with its
own dirs it cannot read the server's database behind the proxy's back.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from .opencode_config import opencode_environment
from .polling import WaitTimeout

WIDTH, HEIGHT = 200, 50
"""A fixed window size, so screens and byte counts compare across runs."""

_TMUX_CONFIG = """\
set -g default-terminal xterm-256color
set -g remain-on-exit on
"""
"""`default-terminal` is the TERM the TUI sees (tmux overrides any TERM in the environment);
`remain-on-exit` keeps the last screen of a TUI that exits, for the failure message."""

_TMUX_TIMEOUT_S = 10.0
_SPINNER_FRAMES = re.compile(r"[\u2800-\u28ff]")
"""opencode's spinner frames are braille cells (⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏)."""


def tmux_binary() -> str:
    """tmux from PATH; fail clearly (never skip) when it is missing."""
    found = shutil.which("tmux")
    if found is None:
        raise FileNotFoundError("tmux not found: install it (Debian package `tmux`, as .ci/run does)")
    return found


def tool_mark(screen: str, command: str) -> str | None:
    """The glyph the TUI draws before a bash call's command line, or None if the call is not shown.

    1.18.33 draws a spinner frame there while it believes the call runs and `$` once it has ended
    (completed or failed).
    """
    found = re.search(r"(\S) " + re.escape(command), screen)
    return found[1] if found else None


def is_spinner(mark: str | None) -> bool:
    """Whether `mark` (from `tool_mark`) is a spinner frame."""
    return mark is not None and _SPINNER_FRAMES.fullmatch(mark) is not None


class Terminal:
    """One TUI in one tmux session of a `Terminals` server."""

    def __init__(self, terminals: Terminals, name: str, output: Path) -> None:
        self._terminals = terminals
        self.name = name
        self._output = output

    def screen(self) -> str:
        """The visible screen as plain text (`capture-pane -p`), trailing blank lines dropped."""
        return self._terminals.tmux("capture-pane", "-p", "-t", self.name).rstrip()

    def output_size(self) -> int:
        """How many bytes the TUI has written to its terminal since it started."""
        try:
            return self._output.stat().st_size
        except FileNotFoundError:
            return 0

    def wait_screen(self, check: Callable[[str], bool], *, what: str, timeout: float) -> str:
        """Poll the screen until `check` accepts it and return it; the timeout shows the last screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if check(screen):
                return screen
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; screen:\n{screen}")
            time.sleep(0.25)


class Terminals:
    """A private tmux server for the TUIs of one test; use it as a context manager."""

    def __init__(self, root: Path, binary: Path, environment: dict[str, str] | None = None) -> None:
        """`environment` is added to what every TUI inherits (a 2.x TUI's `OPENCODE_PASSWORD`)."""
        self._root = root
        self._binary = binary
        self._tmux = tmux_binary()
        self._socket = f"settle-tui-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._config = root / "tmux.conf"
        self._config.write_text(_TMUX_CONFIG)
        self._env = self._environment() | (environment or {})

    def __enter__(self) -> Terminals:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def attach(self, name: str, url: str, session_id: str, cwd: Path) -> Terminal:
        """Start `opencode attach URL --session ID` in a new tmux session and copy its output to a file.

        `--session` opens the session directly, as a user picking it from the list would.
        """
        return self.start(name, ("attach", url, "--session", session_id), cwd)

    def start(self, name: str, args: Sequence[str], cwd: Path) -> Terminal:
        """Start the binary with `args` in a new tmux session and copy its output to a file."""
        output = self._root / f"{name}.out"
        command = shlex.join([str(self._binary), *args])
        self.tmux(
            "new-session", "-d", "-s", name, "-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(cwd), command
        )
        self.tmux("pipe-pane", "-o", "-t", name, f"cat >> {shlex.quote(str(output))}")
        return Terminal(self, name, output)

    def tmux(self, *args: str) -> str:
        """Run one tmux command on this server and return its stdout; a failing command raises."""
        done = subprocess.run(
            [self._tmux, "-L", self._socket, "-f", str(self._config), *args],
            env=self._env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_TMUX_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:1])} -> {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def close(self) -> None:
        """Kill this tmux server and with it every TUI; idempotent (a server already gone is fine)."""
        subprocess.run(
            [self._tmux, "-L", self._socket, "kill-server"],
            env=self._env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TMUX_TIMEOUT_S,
            check=False,
        )

    def _environment(self) -> dict[str, str]:
        """What the tmux server (and so every TUI) inherits: fresh XDG dirs, no auto-update, no password.

        `TMUX` is dropped so a test run from inside tmux does not nest into the user's server.
        """
        env = opencode_environment(self._root) | {"TERM": "xterm-256color"}
        env.pop("TMUX", None)
        return env


def idle_output(terminals: Sequence[Terminal], seconds: float) -> dict[str, int]:
    """Bytes each terminal writes during the same `seconds`-long window, by terminal name."""
    before = {terminal.name: terminal.output_size() for terminal in terminals}
    time.sleep(seconds)
    return {terminal.name: terminal.output_size() - before[terminal.name] for terminal in terminals}
