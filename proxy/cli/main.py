"""`settle-proxy` / `python -m proxy`: run the proxy in front of `opencode serve`.

The entry point imports nothing of the command line before it has made Ctrl-C quiet: until the
proxy takes SIGINT itself (once it serves, `proxy.cli.stopping`), SIGINT ends the process as the
signal does, with no traceback. Nothing a stop must end has started by then: the supervised
server is started only after.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the console script and of `python -m proxy`."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from proxy.cli.commands import run_command  # noqa: PLC0415 - only once Ctrl-C is quiet

    run_command(sys.argv[1:] if argv is None else list(argv))
