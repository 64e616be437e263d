"""What three clients of one session showed after a crash: one opened straight from the restarted
server, one opened through the proxy after the restart, and one that was open through the proxy
across the crash. The TUI and the web UI suites each read their own kind of client this way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

View = TypeVar("View")


@dataclass(frozen=True)
class CrashViews(Generic[View]):
    """`direct` and `proxied` opened after the restart; `across_crash` (through the proxy) before."""

    direct: View
    proxied: View
    across_crash: View

    @classmethod
    def of(cls, seen: dict[str, View]) -> CrashViews[View]:
        """From what each client (named as the fields are) showed."""
        return cls(seen["direct"], seen["proxied"], seen["across_crash"])
