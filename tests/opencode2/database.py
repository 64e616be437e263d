"""The stand-in's database on disk, so that a killed stand-in process restarts with its messages, as
2.x keeps them in its SQLite database (`session_message`, `event_sequence`; third-party 2.0.24 table
list in idx:70823202177). Written whole, atomically (a rename), after every change."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from tests.opencode2.store import Store

TABLES = ("sessions", "messages", "permissions", "questions", "forms", "inbox")


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
