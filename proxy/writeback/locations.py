"""Where the write-back works unless it is told: opencode's database (`--write-back db`) and the
proxy's v1 write locks (`--write-back api`), each where the environment puts it.

The one resolver of those defaults: the command line hands it the environment it reads; an
embedding application's entry point (`create_app`, `mount`) lets it read its process's. The
application is given the result, and reads no environment itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from proxy.writeback.locks import default_lock_dir

__all__ = ["Locations", "default_path", "locations"]


def default_path(environ: Mapping[str, str]) -> Path:
    """Where opencode keeps its database in `environ`: `$XDG_DATA_HOME/opencode/opencode.db`."""
    data_home = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "opencode" / "opencode.db"


@dataclass(frozen=True, slots=True)
class Locations:
    """Where a writer works, resolved."""

    db_path: Path
    """opencode's database, for `--write-back db`."""
    lock_dir: Path
    """Where v1 write-back locks live, shared by every proxy of this user on this host."""


def locations(
    db_path: Path | None = None, lock_dir: Path | None = None, *, environ: Mapping[str, str] = os.environ
) -> Locations:
    """`db_path` and `lock_dir` as given, each one left unset where `environ` (the process's
    environment unless given) puts it: `$XDG_DATA_HOME/opencode/opencode.db`, and
    `$XDG_RUNTIME_DIR/settle-proxy`."""
    return Locations(db_path or default_path(environ), lock_dir or default_lock_dir(environ))
