"""One dialect per opencode server line: what a range of versions serves, and how the proxy must
speak to it. Every module asks the dialect of the server it talks to instead of branching on a
version (`proxy.opencode.server_line` says which one that is).

Two lines today. 1.18 serves two runtimes that share no session (v1 `/session/...`, v2
`/api/session/...`), answers `/global/health`, carries liveness on `/global/event`, and can be
written to (its part PATCH and `/sync/replay`, or its database). 2.x serves the `/api/...`
family only, in 1.18's v2 layout but settled its own way (`rules.runtime_2x`), answers
`/api/info` (early 2.0: `/api/health`), and carries liveness on `/api/event`; nothing but its own
event bus writes its database, so no writer of the proxy exists for it.

A server is of the line whose health answer it gives, in that answer's shape (`HealthShape`):
the route and the fields only that line's answer has. Its version refines that and never gates
it: a from-source or dev build names none (`release` is None for `local`, `dev`, `0.0.0-…`), and
a release outside the line's range is still of the line; only writing into a server is kept for
the releases its `versions` hold (`proxy.opencode.server_line.KnownServer.refusal`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from proxy.opencode.runtimes import V1_HTTP, V2_HTTP, V2X_HTTP, HttpRuntime
from rules import Api

__all__ = [
    "DIALECTS",
    "HEALTH_PATHS",
    "LINE_1_18",
    "LINE_2X",
    "Dialect",
    "HealthShape",
    "Version",
    "line_of",
    "parse_version",
    "release",
    "route_line",
]

Version = tuple[int, int, int]
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")
_UNRELEASED = (0, 0, 0)
"""What a snapshot build stamps (`0.0.0-<channel>-<time>`): no release."""


def parse_version(text: str) -> Version | None:
    """`1.18.33`, `v2.1.2`, `2.0.0-beta.3` → a comparable triple; None for what is not a version."""
    found = _VERSION.match(text.strip())
    if found is None:
        return None
    return int(found[1]), int(found[2]), int(found[3] or 0)


def release(text: str) -> Version | None:
    """The release `text` names; None for a from-source or dev build (`local`, which every build
    from a checkout reports, `dev`, `0.0.0-…`) and for anything else that names none."""
    version = parse_version(text)
    return None if version is None or version == _UNRELEASED else version


@dataclass(frozen=True, slots=True)
class HealthShape:
    """How a line says it is up: the route it answers, and the fields its JSON object always has
    there, which no other line's answer on that route has."""

    path: str
    fields: frozenset[str]
    source: str
    """Where that answer comes from, for people."""

    def fits(self, path: str, body: Mapping[str, object]) -> bool:
        return path == self.path and self.fields <= body.keys() and isinstance(body.get("version"), str)


@dataclass(frozen=True, slots=True)
class Dialect:
    """What one server line serves. `versions` is `[first, past)`, the releases it was measured on
    and the only ones written into (a patch release is among them: 1.18.34 behaves as 1.18.33,
    measured); a server of the line outside them is still read, followed, told and resumed as it."""

    name: str
    versions: tuple[Version, Version]
    runtimes: Mapping[Api, HttpRuntime]
    """The message views it serves, each in its own shape; a route family it does not serve is
    absent (2.x has no `/session/...`)."""
    health: tuple[HealthShape, ...]
    """What says it is up, and that it is of this line: its own answer, then what earlier builds
    of the line answer instead."""
    events_path: str
    """The event stream liveness comes from."""
    writers: frozenset[str] = field(default_factory=frozenset)
    """The write-back modes (`api`, `db`) that can make a settlement durable on it."""
    durable_by: str = ""
    """For people: what does make a settlement durable on it, when the proxy cannot."""
    resumes: bool = False
    """Whether `--resume` can continue an interrupted turn on it (1.18: a prompt, as a client would;
    2.x: its own settle-then-continue, `proxy.resume.continuing`)."""
    settles_before_resume: str | None = None
    """What makes an interrupted call's settlement durable before a resumed turn's model work when
    the server does it itself (2.x: the continuation's own drain); None when only a writer of the
    proxy's can (1.18), so a turn is resumed there only through one of `writers`."""
    session_log: str | None = None
    """Its durable session log, a path with `{session}`, read for what its volatile stream
    missed (`proxy.opencode.durable_log`); None for a line that keeps none."""
    username: str | None = None
    """The user its Basic auth always takes, when the line fixes it (2.x: `opencode`,
    `packages/server/src/auth.ts` @605784f48417); None: the one configured (1.x's
    OPENCODE_SERVER_USERNAME, default `opencode`)."""

    @property
    def health_paths(self) -> tuple[str, ...]:
        return tuple(shape.path for shape in self.health)

    def releases(self) -> str:
        """Its range, for people: `1.18.0 to before 1.19.0`."""
        first, past = (".".join(map(str, version)) for version in self.versions)
        return f"{first} to before {past}"

    def serves(self, version: Version) -> bool:
        first, past = self.versions
        return first <= version < past

    def runtime(self, api: Api) -> HttpRuntime | None:
        """The shape its `api` message views are in, or None when it serves no such route."""
        return self.runtimes.get(api)

    def resume_refusal(self, writer: str | None) -> str | None:
        """Why `--resume` does nothing on this line with the write-back mode `writer` (None: off),
        and no turn waits for a Continue either, or None when it resumes: a turn is resumed, or
        left for a person to continue, only after a durable settlement."""
        if not self.resumes:
            return f"resuming is not done on the {self.name} line yet"
        if self.settles_before_resume is None and writer not in self.writers:
            modes = " or ".join(f"`--write-back {mode}`" for mode in sorted(self.writers))
            return (
                f"on the {self.name} line a settlement is durable only through a write-back, and a turn is "
                f"resumed, or waits for a Continue, only after a durable settlement: add {modes}"
            )
        return None


LINE_1_18 = Dialect(
    "1.18",
    ((1, 18, 0), (1, 19, 0)),
    {Api.V1: V1_HTTP, Api.V2: V2_HTTP},
    health=(
        HealthShape(
            "/global/health",
            frozenset({"healthy", "version"}),
            "measured on 1.18.33: {healthy, version} (its `/api/health` is {healthy} alone; "
            "tests/fixtures/opencode-1.18.33/health-routes.txt)",
        ),
    ),
    events_path="/global/event",
    writers=frozenset({"api", "db"}),
    resumes=True,
)
LINE_2X = Dialect(
    "2.x",
    ((2, 0, 0), (3, 0, 0)),
    {Api.V2: V2X_HTTP},
    health=(
        HealthShape(
            "/api/info",
            frozenset({"version", "pid"}),
            "ServerInfo {version, pid, urls, paths}: packages/protocol/src/groups/server.ts @51819a10a412",
        ),
        HealthShape(
            "/api/health",
            frozenset({"healthy", "version", "pid"}),
            "{healthy, version, pid}: packages/protocol/src/groups/health.ts @7c3c912ea4ff; measured "
            "on the v2 branch @2092350c, version `local`",
        ),
    ),
    events_path="/api/event",
    session_log="/api/experimental/session/{session}/log",
    username="opencode",
    resumes=True,
    settles_before_resume=(
        "2.x's own drain: the continuation's drain fails every call left open (settleStaleToolCalls) "
        "before any model work"
    ),
    durable_by=(
        "2.x settles an interrupted call itself when the session's next turn starts (a prompt, or "
        "`--resume`); no route settles one without running the model, and only its own event bus "
        "writes its database"
    ),
)
DIALECTS = (LINE_2X, LINE_1_18)


def line_of(path: str, body: Mapping[str, object]) -> Dialect | None:
    """The line whose health answer `body`, given on `path`, is in the shape of; None for none."""
    return next((d for d in DIALECTS if any(shape.fits(path, body) for shape in d.health)), None)


def route_line(path: str) -> Dialect:
    """The line whose health route `path` is (what a server is taken for, at most, when its
    answer there is in no line's shape)."""
    return next(dialect for dialect in DIALECTS if path in dialect.health_paths)


HEALTH_PATHS = tuple(path for dialect in DIALECTS for path in dialect.health_paths)
"""Every route that says which server answers, in the order they are asked first."""
