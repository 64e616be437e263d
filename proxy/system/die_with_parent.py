"""`python -m proxy.system.die_with_parent PARENT COMMAND…`: run COMMAND so that it dies with PARENT.

Linux's `PR_SET_PDEATHSIG` must be set in the child before it runs the server, and doing that
between fork and exec of a threaded proxy (`preexec_fn`) risks a deadlock; so the proxy starts
this small step instead, which sets it and then becomes the server (exec keeps the pid and the
setting). PARENT is the proxy's pid: if the proxy is already gone, the server is not started. A
COMMAND that cannot be run exits as a shell's would (127 not found, 126 not executable).
"""

from __future__ import annotations

import os
import sys

from proxy.system.reaper import die_with_parent

NOT_FOUND, NOT_EXECUTABLE = 127, 126
"""A shell's exit statuses for a command it cannot find, and for one it cannot run."""

if __name__ == "__main__":
    die_with_parent(int(sys.argv[1]))
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as error:  # one line, not a traceback: the supervisor says the rest
        sys.stderr.write(f"cannot start {sys.argv[2]}: {error.strerror}\n")
        sys.exit(NOT_FOUND if isinstance(error, FileNotFoundError) else NOT_EXECUTABLE)
