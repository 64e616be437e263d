"""The stand-in's database on disk, so that a killed stand-in process restarts with its messages, as
2.x keeps them in its SQLite database (`session_message`, `event_sequence`; third-party 2.0.24 table
list in idx:70823202177). Written whole, atomically (a rename), after every change."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import orjson

from tests.opencode2.store import Store

TABLES = ("sessions", "messages", "permissions", "forms", "inbox", "admitted")


def save(store: Store, path: Path) -> None:
    tables = {name: getattr(store, name) for name in TABLES}
    tables["sequences"] = store.hub.sequences
    partial = path.with_name(path.name + ".tmp")
    partial.write_bytes(orjson.dumps(tables, option=orjson.OPT_INDENT_2))
    os.replace(partial, path)


def load(store: Store, path: Path) -> None:
    tables = orjson.loads(path.read_bytes())
    for name in TABLES:
        setattr(store, name, tables.get(name, {}))
    store.hub.sequences = tables.get("sequences", {})


def opencode_sqlite(path: Path) -> Path:
    """An empty SQLite file with 2.x's session table (`session_v2`, `packages/core/src/session/
    sql.ts` @2092350c), which makes a file opencode's to the proxy's `--db` check: the stand-in
    keeps its own tables in JSON."""
    with contextlib.closing(sqlite3.connect(path)) as database, database:
        database.execute("CREATE TABLE session_v2 (id TEXT PRIMARY KEY, data TEXT)")
    return path
