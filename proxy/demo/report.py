"""What the demo prints: the call as each client was shown it after the restart, directly and
through the proxy, side by side, and one line each on what that means and what was cleaned up."""

from __future__ import annotations

import textwrap

from proxy.demo.lines import Call
from proxy.demo.scene import Outcome, Seen

_ROWS = ("message view", "event stream")
_WIDTH = 88


def report(outcome: Outcome) -> str:
    """The table, a word on what it shows, and what the demo ended."""
    line = outcome.installed.line
    heads = ("", "directly", "through settle-proxy")
    rows = [
        heads,
        *zip(_ROWS, _column(outcome.directly), _column(outcome.proxied), strict=True),
    ]
    widths = [max(len(row[index]) for row in rows) for index in range(len(heads))]
    table = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    stream = f"`{line.events}`"
    return "\n".join(
        [
            f"opencode {outcome.installed.version}, its `{line.tool}` call after a SIGKILL and a restart:",
            "",
            *table,
            "",
            textwrap.fill(
                f"Directly, the call stays running {line.stays}, though the server that ran it is gone, "
                f"and a client on {stream} (the TUI, the web UI, an SDK) is never told otherwise. Through "
                "settle-proxy it is shown interrupted, in the shape opencode itself writes, and a client on "
                f"its stream across the crash is sent `{line.told_by}` saying so. The crash left "
                f"{_processes(outcome.left_behind)} running, as a real one does: the demo ended "
                f"{'it' if outcome.left_behind == 1 else 'them'}.",
                width=_WIDTH,
            ),
        ]
    )


def _column(seen: Seen) -> tuple[str, str]:
    """The view's cell and the stream's cell of one client."""
    if seen.told is not None:
        stream = _call(seen.told)
    elif seen.before is not None:
        stream = f"{seen.before.status} (nothing since the crash)"
    else:
        stream = "(nothing)"
    return (_call(seen.view) if seen.view is not None else "(no call)"), stream


def _call(call: Call) -> str:
    return call.status if call.error is None else f"{call.status}: {call.error}"


def _processes(count: int) -> str:
    return "1 process" if count == 1 else f"{count} processes"
