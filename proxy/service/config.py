"""The proxy's settings: one immutable object built by the CLI or by an embedding app."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from yarl import URL

from proxy.relay.options import DEFAULT_MAX_BODY
from proxy.writeback.modes import WriteBackMode

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY",
    "DEFAULT_PORT",
    "DEFAULT_UPSTREAM",
    "DEFAULT_USERNAME",
    "Settings",
    "WriteBackMode",
    "basic_authorization",
    "parse_credentials",
]

DEFAULT_UPSTREAM = "http://127.0.0.1:4096"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4097
DEFAULT_USERNAME = "opencode"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the application needs to know; nothing here is read from the environment."""

    upstream: URL
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    authorization: str | None = field(default=None, repr=False)
    """`Authorization` for the proxy's own look-ups when a client sent none; never sent for clients."""
    connect_timeout: float = 10.0
    """Seconds to open an upstream connection before answering 502."""
    response_timeout: float | None = None
    """Seconds a plain exchange may wait on the upstream: for its response headers, then for each
    next piece of its body; past it the client gets a 504 (or, once the body has started, a
    visibly cut connection). None (the default) means no limit, because opencode's v1
    `POST /session/{id}/message` answers only when the whole turn has ended. Event streams and
    WebSockets are never timed once open: silence is normal for them."""
    max_body: int = DEFAULT_MAX_BODY
    """The most bytes of a message view read whole to be checked, as sent and once decoded; a
    larger one (or a compressed one that inflates past it) goes out unchecked, as the upstream
    sent it, streamed, with one log line. 64 MiB by default (see `DEFAULT_MAX_BODY`)."""
    liveness_timeout: float = 5.0
    """Seconds a liveness look-up may take; past it the body is passed on unchanged."""
    write_back: WriteBackMode = WriteBackMode.OFF
    grace: float = 2.0
    """Seconds between the two liveness readings that must both find a session inactive."""
    db_path: Path | None = None
    """opencode's database for `write_back="db"`; None means its default location in this
    process's environment, found by `create_app` or `mount` (the command line always says where)."""
    dry_run: bool = False
    """Decide, log and count settlements, but change no response and write nothing."""
    lock_dir: Path | None = None
    """Where v1 write-back locks live, shared by every proxy of this user on this host; None
    means `$XDG_RUNTIME_DIR/settle-proxy` in this process's environment, found as `db_path` is
    (the command line says)."""
    state_db: Path | None = None
    """Where tool processes are recorded with the calls that started them (`settle-proxy orphans`
    reads it); None records nothing. The command line sets `$XDG_STATE_HOME/settle-proxy/processes.db`."""
    auth: tuple[str, str] | None = field(default=None, repr=False)
    """(user, password) of the proxy's own Basic auth in front of every route; None for none."""
    resume: bool = False
    """Start again, once, a turn the proxy saw running when the server died (needs a state
    database, and on a line where only the proxy can make a settlement durable, 1.18, write-back;
    see `proxy.resume`)."""
    resume_attempts: int = 3
    """Prompts sent at most for one person's turn, across its interruptions and failed starts."""
    resume_within: float = 300.0
    """Seconds after its last sign of life past which an interrupted turn is left alone."""
    resume_text: str | None = None
    """The prompt a resumed turn starts with, instead of the one naming the interrupted calls."""
    access_log: bool = False
    """One log line per request (`proxy.service.access_log`); for the command line's runner."""
    resume_safe: tuple[str, ...] = ()
    """Globs over a tool's name or a command line that `--resume` also continues by itself."""
    resume_unsafe: bool = False
    """Continue by itself a turn with an unsafe call too (as before calls were classed)."""
    resume_concurrency: int = 2
    """Continuations admitted at once after one crash."""
    resume_spacing: float = 2.0
    """Seconds at least between two admissions."""
    stall_after: float = 10.0
    """Seconds a call's own process must have exited, with what it started still holding its
    output, before the call is named stalled (`proxy.supervision.stalls`)."""
    stall_abort: bool = False
    """End a stalled call through the server's own abort route, once."""

    def __post_init__(self) -> None:
        if self.max_body < 1:
            raise ValueError(f"max_body must be a positive number of bytes, got {self.max_body}")
        if self.upstream.scheme not in ("http", "https") or not self.upstream.host:
            raise ValueError(f"upstream must be an http(s) URL with a host, got {self.upstream}")

    @property
    def upstream_origin(self) -> URL:
        """The upstream without credentials or path: safe to show in errors and logs."""
        return self.upstream.origin()


def basic_authorization(username: str, password: str) -> str:
    """The `Authorization` header value opencode's HTTP Basic auth expects."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def parse_credentials(text: str) -> tuple[str, str]:
    """`user:password` → (user, password); the password may contain colons."""
    username, colon, password = text.partition(":")
    if not colon or not username or not password:
        raise ValueError("expected USER:PASSWORD")
    return username, password
