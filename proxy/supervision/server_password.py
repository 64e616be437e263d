"""The password a supervised opencode 2.x is given when none is set.

opencode 2.x always wants a password, and a plain `opencode serve` without one makes a new
random one at every start (`packages/cli/src/server-process.ts` @05647a25): a supervised restart
would lock every client out. So under `run` the proxy gives a 2.x server one password of its own,
kept in the proxy's state directory (mode 0600) and the same at every start. A 1.x server runs
without a password, and given one would refuse the clients that have none, so it is given none.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from pathlib import Path

FIRST_LINE_WITH_A_PASSWORD = 2
"""The first opencode line that always wants a password."""
VERSION_WITHIN_S = 30.0
_VERSION = re.compile(rb"\b(\d+)\.\d+\.\d+")


def major_version(program: str) -> int | None:
    """The major version `program --version` prints (opencode prints `1.18.33`); None when it
    cannot be told (no such program, an error, no version in its output)."""
    try:
        answer = subprocess.run(
            [program, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=VERSION_WITHIN_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _VERSION.search(answer.stdout) if answer.returncode == 0 else None
    return int(found.group(1)) if found is not None else None


def wants_a_password(program: str) -> bool:
    """Whether `program` is an opencode that always wants a password (2.x or later); any other
    program is not asked its version."""
    if "opencode" not in Path(program).name:
        return False
    major = major_version(program)
    return major is not None and major >= FIRST_LINE_WITH_A_PASSWORD


def stable_password(path: Path) -> str:
    """The password kept at `path`, made (random, 32 bytes) and kept there with mode 0600 the
    first time. It is written whole beside `path` and then linked there, so a second proxy
    starting at the same moment reads the first one's, never a half-written file."""
    if path.exists():
        return _read(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    made = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as kept:
        kept.write(secrets.token_urlsafe(32))
    try:
        os.link(made, path)
    except FileExistsError:
        pass
    finally:
        made.unlink()
    return _read(path)


def _read(path: Path) -> str:
    password = path.read_text().strip()
    if not password:
        raise ValueError(f"{path} holds no password: remove it, and a new one is made")
    return password
