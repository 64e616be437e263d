"""Which opencode server is behind the proxy: asked of the server itself, kept, and asked again
after it restarts.

Each line answers its own route with its version: 2.x `GET /api/info` (early 2.0 builds
`/api/health`), 1.x `/global/health`. Anything else (a web app's HTML page for every unknown
route, a 401, a 503 while the server boots, garbage, nothing at all) leaves the server not known
yet: it is asked again, with growing pauses, and the log says so once, and why. Until it is known,
views go out as the server sent them, and nothing is written, resumed or followed; a version no
line covers is named in one WARNING, and gets views at most (`KnownServer.refusal`).
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
from proxy.opencode.dialects import HEALTH_PATHS, LINE_1_18, Dialect, nearest, parse_version
from proxy.relay.errors import reason_of

__all__ = ["TOLD_1_18", "KnownServer", "ServerLine"]

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 5.0
RETRY_SECONDS = (0.25, 0.5, 1.0, 2.0, 5.0)
UNKNOWN_VERSION = "unknown"


@dataclass(frozen=True, slots=True)
class KnownServer:
    """The server as it named itself: its version, its line's dialect (the nearest one when no
    line covers the version), and whether a line does."""

    version: str
    dialect: Dialect
    known_line: bool
    answered: str
    """The route that told."""

    def describe(self) -> dict[str, object]:
        return {"version": self.version, "dialect": self.dialect.name, "known_version": self.known_line}

    def refusal(self, doing: str, *, writer: str | None = None) -> str | None:
        """Why the proxy must not do `doing` (a write-back mode, `resume` with the write-back mode
        `writer`, `follow`) on this server, or None when it may: a version no line covers gets
        views, nothing more."""
        line = self.dialect.name
        if not self.known_line:
            return f"opencode {self.version} is no version this proxy knows (nearest: the {line} line)"
        if doing == "resume":
            return self.dialect.resume_refusal(writer)
        if doing in ("api", "db") and doing not in self.dialect.writers:
            return f"no writer of the proxy's exists for the {line} line: {self.dialect.durable_by}"
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
        """A server that said it is healthy but not which version: believed only when no route
        names one (1.18.33 answers `/api/health` so, and names its version on `/global/health`)."""


class ServerLine:
    """Knows which server the upstream is; `known()` asks it when it does not, `forget()` makes it
    ask again (the server restarted). `listeners` are told each time the server becomes known as
    another version or line than before (first of all, at start)."""

    def __init__(
        self, upstream: UpstreamApi | None, credentials: Credentials, *, timeout: float = ASK_TIMEOUT_S
    ) -> None:
        self._upstream = upstream
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

    @classmethod
    def told(cls, server: KnownServer) -> ServerLine:
        """A line that is not asked: the server is `server`, restarts or not (for a caller that
        knows, and for tests of what does not depend on it)."""
        line = cls(None, Credentials())
        line.current = line._last = server
        return line

    async def known(self, credentials: Credentials | None = None) -> KnownServer | None:
        """The server, asked now (once, however many wait) if it is not known; None while it cannot
        tell. `credentials` are a client's, for a proxy that has none of its own."""
        if self.current is None:
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
        assert self._upstream is not None, "a line told its server is never asked"
        reasons, self._pause, versionless, refused = [], None, None, False
        for path in self._order():
            try:
                async with asyncio.timeout(self._timeout):
                    answer = await self._upstream.answer(path, credentials)
                refused |= answer.status == 401
                known = self._read(path, answer)
            except _NotYet as not_yet:
                reasons.append(f"{path} {not_yet}")
                versionless = versionless or not_yet.versionless
                if not_yet.booting is not None:
                    self._pause = not_yet.booting
                    break
                continue
            except (aiohttp.ClientError, TimeoutError) as error:
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
        version = body.get("version")
        if not isinstance(version, str) or not version:
            dialect, _ = nearest(None, path)
            raise _NotYet("named no version", versionless=KnownServer(UNKNOWN_VERSION, dialect, False, path))
        dialect, known_line = nearest(parse_version(version), path)
        return KnownServer(version, dialect, known_line, path)

    def _found(self, known: KnownServer) -> None:
        again, self.current, self.why_unknown, self._said_unknown = self._said_unknown, known, None, False
        last, self._last = self._last, known
        fields = known.describe() | {"route": known.answered}
        if last is not None and (last.version, last.dialect) == (known.version, known.dialect):
            if again:
                log.info("upstream answers again: opencode %s", known.version, extra={"fields": fields})
            return
        line = known.dialect.name
        log.info("upstream is opencode %s: the %s line", known.version, line, extra={"fields": fields})
        if not known.known_line:
            log.warning(
                "opencode %s is no version this proxy knows: views are settled in the shape of the %s line "
                "only where they parse as it; nothing is written back or resumed, and its event stream is "
                "not followed (liveness is asked on every fetch)",
                known.version,
                known.dialect.name,
                extra={"fields": fields},
            )
        for listener in list(self.listeners):
            try:
                listener(known)
            except Exception:
                log.exception("a listener of the server line failed; the others are still told")

    def _not_known(self, why: str, *, unreachable: bool) -> None:
        self.why_unknown = why
        if self._said_unknown:
            return
        self._said_unknown = True
        log.log(
            logging.WARNING,
            "the upstream's opencode server is not known yet (%s): until it is, views go out as it "
            "sends them and nothing is written, resumed or followed; asking again",
            why,
            extra={"fields": {"why": why}},
        )
