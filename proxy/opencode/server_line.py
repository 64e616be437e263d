"""Which opencode server is behind the proxy: asked of the server itself, kept, and asked again
after it restarts.

Each line answers its own health route in its own shape (`proxy.opencode.dialects.HealthShape`):
2.x `GET /api/info` `{version, pid, urls, paths}` (early 2.0 builds, and the v2 branch measured at
2092350c, `/api/health` `{healthy, version, pid}`), 1.x `/global/health` `{healthy, version}`.
That shape says the line; the version only refines it: a from-source build's `local` is of the
line all the same (said at INFO), and so is a release past the line's range (said in one
WARNING). Reading, following the stream, telling clients and resuming follow the line; writing
into the server is kept for the releases the line's range holds (`KnownServer.refusal`).

1.18.33 answers `/api/health` too, `{healthy}` alone: an answer in no line's shape is believed
only when no route gives one, and then gets views at most. Anything else (a web app's HTML page
for every unknown route, a 401, a 503 while the server boots, garbage, nothing at all) leaves the
server not known yet: it is asked again, with growing pauses, and the log says so once, and why.
Until it is known, views go out as the server sent them, and nothing is written, resumed or
followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from proxy.opencode import jsonio
from proxy.opencode.client import Answer, Credentials, UpstreamApi, password_fix
from proxy.opencode.dialects import HEALTH_PATHS, LINE_1_18, Dialect, line_of, release, route_line
from proxy.relay.errors import reason_of

__all__ = ["TOLD_1_18", "KnownServer", "ServerLine"]

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 5.0
RETRY_SECONDS = (0.25, 0.5, 1.0, 2.0, 5.0)
UNKNOWN_VERSION = "unknown"


@dataclass(frozen=True, slots=True)
class KnownServer:
    """The server as it showed itself: its version as it said it, its line's dialect (the line of
    the route it answered when the answer was in no line's shape), whether the answer's shape said
    that line, and whether the version is a release of the line's range."""

    version: str
    dialect: Dialect
    known_line: bool
    """The answer was in the shape of `dialect`'s: the server is of that line."""
    answered: str
    """The route that told."""
    known_version: bool = True
    """Its version is a release the line's range holds: the only servers written into."""

    @property
    def from_source(self) -> bool:
        """It names no release (`local`: built from a checkout; `dev`, `0.0.0-…`)."""
        return release(self.version) is None

    @property
    def health_route(self) -> str:
        """The route to ask whether it is up: the one that told, for a server that was asked."""
        return self.answered if self.answered.startswith("/") else self.dialect.health_paths[0]

    def describe(self) -> dict[str, object]:
        return {
            "version": self.version,
            "dialect": self.dialect.name,
            "known_line": self.known_line,
            "known_version": self.known_version,
        }

    def refusal(self, doing: str, *, writer: str | None = None) -> str | None:
        """Why the proxy must not do `doing` (a write-back mode, `resume` with the write-back mode
        `writer`, `follow`) on this server, or None when it may. A server whose answer said no
        line gets views, nothing more; on one of a known line everything is done as that line
        does it, but writing into it (a write-back mode, and a resume that needs one) only on a
        release of the line's range."""
        line = self.dialect.name
        if not self.known_line:
            return (
                f"opencode {self.version} answered {self.answered} in no line's shape (nearest: the "
                f"{line} line): its views are settled, nothing more"
            )
        if doing in ("api", "db"):
            return self._write_refusal(doing)
        if doing == "resume":
            refused = self._write_refusal(writer) if writer is not None else None
            if refused is not None and self.dialect.settles_before_resume is None:
                return f"{refused}; on the {line} line a turn is resumed only after a write-back"
            return self.dialect.resume_refusal(writer)
        return None

    def _write_refusal(self, mode: str) -> str | None:
        line = self.dialect.name
        if mode not in self.dialect.writers:
            return f"no writer of the proxy's exists for the {line} line: {self.dialect.durable_by}"
        if not self.known_version:
            build = ", a from-source build" if self.from_source else ""
            return (
                f"opencode {self.version}{build} is no release the proxy writes into: writes are kept "
                f"for the releases they were measured on ({self.dialect.releases()})"
            )
        return None


TOLD_1_18 = KnownServer("1.18.33", LINE_1_18, True, "(told)")
"""The server every part of the proxy was built against, for a caller that names no other."""


class _NotYet(Exception):
    """An answer that does not say which server this is (its text says why)."""

    def __init__(
        self, why: str, *, booting: float | None = None, versionless: KnownServer | None = None
    ) -> None:
        super().__init__(why)
        self.booting = booting
        """When the server said it is starting: how long it asked to be left (seconds)."""
        self.versionless = versionless
        """A server that said it is healthy in no line's shape: believed only when no route gives
        one (1.18.33 answers `/api/health` `{healthy}`, and `/global/health` in its line's shape)."""


class ServerLine:
    """Knows which server the upstream is; `known()` asks it when it does not, `forget()` makes it
    ask again (the server restarted). `listeners` are told each time the server becomes known as
    another version or line than before (first of all, at start)."""

    def __init__(
        self,
        upstream: UpstreamApi | None,
        credentials: Credentials,
        *,
        timeout: float = ASK_TIMEOUT_S,
        absent: Callable[[], bool] = lambda: False,
    ) -> None:
        self._upstream = upstream
        self._absent = absent
        """Whether the upstream is a server known not to be up (under `run`: being started, stopped,
        given up on): while it is, that it cannot be reached is no news, and is not said."""
        self._credentials = credentials
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self._last: KnownServer | None = None
        self._pause: float | None = None
        self._said_unknown = False
        self._forgotten = asyncio.Event()
        self.current: KnownServer | None = None
        self.why_unknown: str | None = None
        """Why the server is not known, when it is not (for health)."""
        self.listeners: list[Callable[[KnownServer], None]] = []

    @property
    def latest(self) -> KnownServer | None:
        """The server known now, else the one known last: while a restarted server is asked again,
        its line is still the likeliest."""
        return self.current or self._last

    def user(self) -> str | None:
        """The user the line of the server known last always takes (2.x: `opencode`), if it fixes one."""
        known = self.latest
        return known.dialect.username if known is not None else None

    def health_route(self, dialect: Dialect) -> str:
        """The route to ask whether a server of `dialect` is up: the one the server last known
        answered, when it was of that line (a restart seldom changes the route), else the line's own."""
        last = self._last
        return last.health_route if last is not None and last.dialect is dialect else dialect.health_paths[0]

    @classmethod
    def told(cls, server: KnownServer) -> ServerLine:
        """A line that is not asked: the server is `server`, restarts or not (for a caller that
        knows, and for tests of what does not depend on it)."""
        line = cls(None, Credentials())
        line.current = line._last = server
        return line

    async def known(self, credentials: Credentials | None = None) -> KnownServer | None:
        """The server, asked now (once, however many wait) if it is not known; None while it cannot
        tell (a line with no upstream to ask is never asked). `credentials` are a client's, for a
        proxy that has none of its own."""
        if self.current is None and self._upstream is not None:
            async with self._lock:
                if self.current is None:
                    await self._ask(credentials or self._credentials)
        return self.current

    async def detected(self) -> KnownServer:
        """The server, asked until it is known, with growing pauses."""
        failures = 0
        while (known := await self.known()) is None:
            growing = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
            await asyncio.sleep(self._pause if self._pause is not None else growing)
            failures += 1
        return known

    def forget(self) -> None:
        """The server restarted, or may have: it is asked again before it is next relied on."""
        if self._upstream is not None:
            self.current = None
            self._forgotten.set()

    async def until_forgotten(self, known: KnownServer, within: float) -> None:
        """Return once `known` is no longer the server known (it restarted, or may have), or after
        `within` seconds: how a follower of a server it does not follow learns of a restart."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while self.current is known:
                    self._forgotten.clear()
                    await self._forgotten.wait()

    def _order(self) -> list[str]:
        """The routes to ask: the last known line's first (a restart seldom changes the line)."""
        first = self._last.dialect.health_paths if self._last is not None else ()
        return list(dict.fromkeys((*first, *HEALTH_PATHS)))

    async def _ask(self, credentials: Credentials) -> None:
        assert self._upstream is not None
        reasons, self._pause, versionless, refused = [], None, None, False
        for path in self._order():
            try:
                async with asyncio.timeout(self._timeout):
                    answer = await self._upstream.answer(path, credentials.as_user(route_line(path).username))
                refused |= answer.status == 401
                known = self._read(path, answer)
            except _NotYet as not_yet:
                reasons.append(f"{path} {not_yet}")
                versionless = versionless or not_yet.versionless
                if not_yet.booting is not None:
                    self._pause = not_yet.booting
                    break
                continue
            except TimeoutError:  # it took the connection, and did not answer: booting, or stuck
                self._not_known(f"{path} did not answer within {self._timeout:g} s", unreachable=True)
                return
            except aiohttp.ClientError as error:
                why = reason_of(error)
                self._not_known(f"it cannot be reached: {why}", unreachable=True)
                return
            self._found(known)
            return
        if versionless is not None and self._pause is None:
            self._found(versionless)
            return
        self._not_known(
            "; ".join(reasons) + (f": {password_fix(credentials)}" if refused else ""), unreachable=False
        )

    @staticmethod
    def _read(path: str, answer: Answer) -> KnownServer:
        if answer.status == 503:
            pause = None
            with contextlib.suppress(TypeError, ValueError):
                pause = float(answer.retry_after)  # type: ignore[arg-type]
            after = f", retry after {answer.retry_after} s" if pause is not None else ""
            raise _NotYet(f"answered 503 (starting{after})", booting=min(pause or 1.0, RETRY_SECONDS[-1]))
        if answer.status != 200:
            raise _NotYet(f"answered HTTP {answer.status}")
        if answer.content_type != "application/json":
            raise _NotYet(f"answered {answer.content_type or 'no content type'}, not JSON")
        try:
            body = jsonio.loads(answer.body)
        except Exception:  # whatever the decoder refuses
            raise _NotYet("answered JSON that does not parse") from None
        if not isinstance(body, dict) or not ("version" in body or "healthy" in body):
            raise _NotYet("answered JSON that names no server")
        said = body.get("version")
        version = said if isinstance(said, str) and said else UNKNOWN_VERSION
        dialect = line_of(path, body)
        if dialect is None:
            fields = ", ".join(sorted(map(str, body)))
            guess = KnownServer(version, route_line(path), False, path, False)
            raise _NotYet(f"answered {{{fields}}}, in no line's shape", versionless=guess)
        named = release(version)
        return KnownServer(version, dialect, True, path, named is not None and dialect.serves(named))

    def _found(self, known: KnownServer) -> None:
        again, self.current, self.why_unknown, self._said_unknown = self._said_unknown, known, None, False
        last, self._last = self._last, known
        if last is not None and (last.version, last.dialect) == (known.version, known.dialect):
            if again:
                fields = known.describe() | {"route": known.answered}
                log.info("upstream answers again: opencode %s", known.version, extra={"fields": fields})
            return
        _say(known)
        for listener in list(self.listeners):
            try:
                listener(known)
            except Exception:
                log.exception("a listener of the server line failed; the others are still told")

    def _not_known(self, why: str, *, unreachable: bool) -> None:
        self.why_unknown = why
        if self._said_unknown or (unreachable and self._absent()):
            return
        self._said_unknown = True
        log.log(
            logging.WARNING,
            "the upstream's opencode server is not known yet (%s): until it is, views go out as it "
            "sends them and nothing is written, resumed or followed; asking again",
            why,
            extra={"fields": {"why": why}},
        )


def _say(known: KnownServer) -> None:
    """The server, once: its line and how it was known; a from-source build at INFO, a release
    past the line's range, or an answer in no line's shape, in one WARNING."""
    fields = known.describe() | {"route": known.answered}
    version, line, route = known.version, known.dialect.name, known.answered
    if not known.known_line:
        log.warning(
            "opencode %s answered %s in no line's shape: views are settled in the shape of the %s line only "
            "where they parse as it; nothing is written back or resumed, and its event stream is not "
            "followed (liveness is asked on every fetch)",
            version,
            route,
            line,
            extra={"fields": fields},
        )
    elif known.known_version:
        log.info("upstream is opencode %s: the %s line", version, line, extra={"fields": fields})
    elif known.from_source:
        log.info(
            "upstream is opencode, version %s, from-source build: the %s line, by its %s answer; %s",
            version,
            line,
            route,
            _done(known),
            extra={"fields": fields | {"build": "from source"}},
        )
    else:
        log.warning(
            "opencode %s is past the releases of the %s line this proxy was measured on (%s): it answers %s "
            "as that line does; %s",
            version,
            line,
            known.dialect.releases(),
            route,
            _done(known),
            extra={"fields": fields},
        )


def _done(known: KnownServer) -> str:
    """What is done on a server of a known line that is not written into."""
    if known.refusal("resume") is None:
        return "read, followed, told and resumed as that line; nothing is written into it"
    return "read, followed and told as that line; nothing is written into it, so no turn is resumed"
