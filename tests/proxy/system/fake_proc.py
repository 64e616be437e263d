"""A fake `/proc` tree, as the readers of `proxy.system.open_files` and the survey of other
processes see one: boot time, the TCP socket tables and one directory per process."""

import os
from dataclasses import dataclass, field
from pathlib import Path

BOOT_S = 1_795_900_000
DB = "/home/dev/.local/share/opencode/opencode.db"
PORT = 4096
"""The port the upstream listens on, with socket inode 111."""


@dataclass
class FakeProc:
    """A `/proc` tree: `/proc/stat`, `/proc/net/tcp{,6}` and one directory per process."""

    root: Path
    tcp: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.root / "net").mkdir(parents=True)
        (self.root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT_S}\nprocesses 9\n")
        self.listen(PORT, "111")

    def listen(self, port: int, inode: str, *, state: str = "0A", table: str = "tcp") -> None:
        self.tcp.append(
            f"   0: 0100007F:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000"
            f"     0        0 {inode} 1 0000000000000000 100 0 0 10 0"
        )
        header = (
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
        )
        (self.root / "net" / table).write_text("\n".join([header, *self.tcp]) + "\n")

    def process(
        self, pid: int, *links: str, started_at: int = 0, comm: str = "opencode", flags: int = 0
    ) -> None:
        """A process whose fds point at `links`, started at `started_at` (epoch ms, before the margin)."""
        directory = self.root / str(pid)
        (directory / "fd").mkdir(parents=True)
        for number, target in enumerate(links):
            (directory / "fd" / str(number)).symlink_to(target)
        ticks = (started_at - BOOT_S * 1000) * os.sysconf("SC_CLK_TCK") // 1000
        fields = ["S", "1", "1", "1", "0", "-1", str(flags), *["0"] * 12, str(ticks), "0"]
        (directory / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (directory / "cmdline").write_bytes(b"\0".join(part.encode() for part in (comm, "serve")) + b"\0")

    def unreadable(self, pid: int, *, flags: int = 0) -> None:
        """A process whose fds cannot be listed (as another user's; root would read any)."""
        self.process(pid, flags=flags)
        (self.root / str(pid) / "fd").rmdir()
        (self.root / str(pid) / "fd").write_text("")
