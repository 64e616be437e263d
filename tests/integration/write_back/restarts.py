"""The timeline's two SIGKILLs of the server that no `settle` follows: the one that leaves the
stale sessions (phase 1), and the one the written sessions must survive (phase 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..opencode_server import OpencodeServer
from ..turns import Observed, read_messages
from .sessions import (
    DB,
    STALE,
    UPSTREAM,
    WRITTEN,
    Key,
    NextTurn,
    Replayed,
    exports,
    next_turns,
    observe,
    replay,
)


@dataclass(frozen=True)
class Crashed:
    """Phase 1: the sessions whose tool was running at the SIGKILL."""

    stale: dict[Key, Observed]
    exports_before: dict[Key, Any]
    """`opencode export` of the db group while the server was down, before any settlement."""


def crash(server: OpencodeServer) -> Crashed:
    stale = observe(server, STALE)
    server.crash()
    exported = exports(server, {key: stale[key] for key in DB})
    server.restart()
    return Crashed(stale, exported)


@dataclass(frozen=True)
class Restarted:
    """Phase 4: the written and settled sessions after another SIGKILL and start."""

    direct: dict[Key, list[dict[str, Any]]]
    replays: dict[Key, Replayed]
    exports_after: dict[Key, Any]
    next_turns: dict[Key, NextTurn]
    """A next prompt in each written session, after the restart."""


def restart(server: OpencodeServer, crashed: Crashed) -> Restarted:
    server.crash()
    server.restart()
    checked = {key: crashed.stale[key] for key in (*WRITTEN, *UPSTREAM)}
    direct = {key: read_messages(server.url, observed.turn) for key, observed in checked.items()}
    replays = {key: replay(server, observed) for key, observed in checked.items() if key[1] == "v2"}
    exported = exports(server, {key: crashed.stale[key] for key in (*DB, ("race", "v2"))})
    prompted = next_turns(server, {key: crashed.stale[key] for key in WRITTEN})
    return Restarted(direct, replays, exported, prompted)
