"""Where settlements are made durable, as the command line and the settings name it: a module of
its own, so that a parser can offer the modes without importing the writers."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["WriteBackMode"]


class WriteBackMode(StrEnum):
    """Where settlements are made durable: nowhere, through the server's API, or in its database."""

    OFF = "off"
    API = "api"
    DB = "db"
