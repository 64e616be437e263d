"""A stand-in for `opencode serve` 2.x, in process on 127.0.0.1, for the proxy's tests.

The 2.x scenes run against the real opencode 2.1.2 (`tests/opencode2/conftest.py` `server_2x`); the
stand-in stays for what no real server can be made to do on cue: a release past the range, a fault,
a from-source build (the `v2` branch @2092350c, which cannot be committed), and the proxy's unit
tests. Every route it serves is one 2.1.2 serves, named with what was measured on 2.1.2 or the source
commit it is read from (`tests.opencode2.routes`); `/api/health` answers only as the from-source
build. Use it as

    async with StandIn() as server:            # 2.1.2, `/api/info`, a random password
        session = server.add_session()
        call = server.add_running_call(session)
        await server.crash()                   # liveness gone, streams cut, messages kept
        await server.restart()                 # a new password, as plain `serve` makes one
        ...                                    # a resume settles the call as 2.x does

Plain `serve` settles nothing at boot: stale calls stay `running` in every view until a drain starts
(a prompt or a synthetic input; 2.1.2 has no `/resume`), exactly what the proxy is there to cover.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from tests.opencode2.auth import Auth, basic
from tests.opencode2.database import load, save
from tests.opencode2.events import HEARTBEAT_SECONDS, EventHub
from tests.opencode2.routes import Api, form_request, permission_request, question_form
from tests.opencode2.session_log import Log
from tests.opencode2.settle import Settle
from tests.opencode2.shapes import (
    Json,
    ascending,
    assistant,
    compaction_running,
    tool_running,
    tool_streaming,
    user,
)
from tests.opencode2.store import Call, Process, Store, now_ms

DEFAULT_VERSION = "2.1.2"
"""The version the bug was reported on (issue 25)."""
FROM_SOURCE = "local"
"""What every from-source or dev build of opencode reports as its version (measured on the `v2`
branch @2092350c: /work/shared/OPENCODE.md, "opencode v2 measured")."""


VARIANTS: dict[str, dict[str, Any]] = {
    "2.1.2": {},
    "from source": {"version": FROM_SOURCE, "health_route": "health", "form_route": False},
    "from source, compressing": {
        "version": FROM_SOURCE,
        "health_route": "health",
        "form_route": False,
        "compress": True,
    },
}
"""The servers a test of the proxy in front of 2.x runs against, by name: a release; the `v2`
branch built from source @2092350c (`StandIn.from_source`); and it compressing what a client
accepts compressed, as newer 2.x servers do (`Process.compress`)."""
VARIANT_FLAGS: dict[str, tuple[str, ...]] = {
    "2.1.2": (),
    "from source": ("--from-source",),
    "from source, compressing": ("--from-source", "--compress"),
}
"""The same variants as `tests/opencode2/serve.py` flags."""


def random_password() -> str:
    """What plain `serve` makes without `OPENCODE_PASSWORD`: `randomBytes(32).toString("base64url")`
    (`packages/cli/src/server-process.ts` `processEffect` @05647a255acf)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class RunningCall:
    """Where a call added by `add_running_call` lives."""

    session_id: str
    message_id: str
    call_id: str


class StandIn:
    """One 2.x server: a store a crash keeps and a process a crash ends."""

    def __init__(
        self,
        version: str = DEFAULT_VERSION,
        *,
        password: str | None = None,
        health_route: str = "info",
        form_route: bool = True,
        web_fallback: bool = False,
        compress: bool = False,
        session_log: Log = Log.HEAD,
        booting: bool = False,
        settle: Settle = Settle.CHILD,
        call_key: str = "id",
        heartbeat_seconds: float | None = HEARTBEAT_SECONDS,
        port: int = 0,
        database: Path | None = None,
    ) -> None:
        self.hub = EventHub(now_ms, heartbeat_seconds)
        self.store = Store(self.hub, clock=now_ms, settle=settle, call_key=call_key)
        auth = Auth(password or random_password())
        self.process = Process(
            version,
            auth,
            booting=booting,
            health_route=health_route,
            form_route=form_route,
            web_fallback=web_fallback,
            compress=compress,
            session_log=session_log,
        )
        self.process.port = port
        self.database = database
        """Where the store is kept across processes (`tests/opencode2/serve.py`); None: in memory."""
        if database is not None and database.exists():
            load(self.store, database)
        self.password_fixed = password is not None
        """A password given (as `OPENCODE_PASSWORD` would be) survives restarts; a generated one does not."""
        self._runner: web.AppRunner | None = None

    @classmethod
    def from_source(cls, **more: Any) -> StandIn:
        """The server as the `v2` branch built from source @2092350c answers: version `local`,
        `GET /api/health` `{healthy, version, pid}`, `/api/info` and `/global/health` 404
        (/work/shared/OPENCODE.md, "opencode v2 measured"), no form route (not seen there), and a
        durable session log that gives back only its marker (measured there: its `event` table
        stays empty)."""
        fixed: dict[str, Any] = {"health_route": "health", "form_route": False, "session_log": Log.MARKER}
        return cls(FROM_SOURCE, **(fixed | more))

    async def __aenter__(self) -> StandIn:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.process.port}"

    @property
    def password(self) -> str:
        return self.process.auth.password

    @property
    def headers(self) -> dict[str, str]:
        """The `Authorization` header a client of this server sends."""
        return {"Authorization": basic(self.password)}

    @property
    def calls(self) -> list[Call]:
        return self.store.calls

    @property
    def published(self) -> list[Json]:
        return self.hub.published

    async def start(self) -> None:
        """Listen on 127.0.0.1: a free port the first time, the same port after a restart."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.process.port))
        except OSError:
            sock.close()
            raise
        self.process.port = sock.getsockname()[1]
        api = Api(self.store, self.process, self.save if self.database else None)
        self._runner = web.AppRunner(api.app(), shutdown_timeout=0.1)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    def save(self) -> None:
        if self.database is not None:
            save(self.store, self.database)

    async def stop(self) -> None:
        if self._runner is not None:
            self.hub.cut()
            await self._runner.cleanup()
            self._runner = None

    async def crash(self) -> None:
        """A SIGKILL: no session runs any more, every stream drops without a last frame, the port
        refuses connections; the stored messages stay as they were."""
        self.store.active.clear()
        await self.stop()

    async def restart(self, *, booting: bool = False, password: str | None = None) -> None:
        """A new process on the same port and database: a new pid, and a new random password unless
        one was fixed (or is given here)."""
        if password is not None:
            self.process.auth = Auth(password)
        elif not self.password_fixed:
            self.process.auth = Auth(random_password())
        self.process.pid += 1
        self.process.booting = booting
        await self.start()

    def set_version(self, version: str) -> None:
        self.process.version = version

    def set_booting(self, booting: bool) -> None:
        """While booting every API route answers 503 with `retry-after` (after auth)."""
        self.process.booting = booting

    def heartbeat(self) -> None:
        """Send `: heartbeat` to every open `/api/event` stream now."""
        self.hub.heartbeat()

    async def wait_for_subscribers(self, count: int = 1) -> None:
        await self.hub.wait_for_subscribers(count)

    def publish(self, event_type: str, data: Json, durable: bool = True) -> Json:
        return self.hub.publish(event_type, data, durable)

    def messages(self, session_id: str) -> list[Json]:
        """The session's stored messages, oldest first (the view answers newest first)."""
        return self.store.messages[session_id]

    def add_session(self, *, parent_id: str | None = None, title: str = "stand-in") -> str:
        session_id = ascending("ses")
        info: Json = {"id": session_id, "title": title}
        if parent_id is not None:
            info["parentID"] = parent_id
        created = self.store.clock()
        info["time"] = {"created": created, "updated": created}
        self.store.sessions[session_id] = info
        self.store.messages[session_id] = []
        return session_id

    def add_running_call(
        self,
        session_id: str,
        name: str = "shell",
        tool_input: Json | None = None,
        *,
        metadata: Json | None = None,
        streaming: str | None = None,
        active: bool = True,
    ) -> RunningCall:
        """A user prompt and an assistant message whose call is `running` (or, with `streaming`, still
        `streaming` that raw input). `active` says whether the process still runs it."""
        created = self.store.clock()
        self.store.messages[session_id].append(user(ascending("msg"), "Do it.", created))
        message_id, call_id = ascending("msg"), ascending("call")
        if streaming is not None:
            part = tool_streaming(call_id, name, streaming, created)
        else:
            part = tool_running(
                call_id, name, tool_input or {"command": "sleep 20"}, created, metadata=metadata
            )
        self.store.messages[session_id].append(assistant(message_id, [part], created))
        if active:
            self.store.active.add(session_id)
        return RunningCall(session_id, message_id, call_id)

    def add_subagent_call(self, session_id: str, child_id: str, *, active: bool = True) -> RunningCall:
        """A `subagent` call whose running metadata names its child session (llm.ts @008d57153952
        reads `metadata.sessionID`)."""
        tool_input = {"description": "explore", "prompt": "Look around."}
        metadata = {"sessionID": child_id}
        return self.add_running_call(session_id, "subagent", tool_input, metadata=metadata, active=active)

    def add_running_compaction(self, session_id: str, reason: str = "auto") -> str:
        message_id = ascending("msg")
        self.store.messages[session_id].append(compaction_running(message_id, self.store.clock(), reason))
        return message_id

    def add_permission(
        self, call: RunningCall, action: str = "shell", resources: list[str] | None = None
    ) -> Json:
        """A pending permission request of `call` (listed by `GET /api/session/{id}/permission`)."""
        request = permission_request(
            call.session_id, action, resources or ["*"], (call.message_id, call.call_id)
        )
        self.store.permissions.setdefault(call.session_id, []).append(request)
        return request

    def add_form(self, session_id: str, title: str = "Sign in") -> Json:
        """A pending form of the session (listed by `GET /api/session/{id}/form`)."""
        request = form_request(session_id, title)
        self.store.forms.setdefault(session_id, []).append(request)
        return request

    def add_question(self, call: RunningCall) -> Json:
        """A question `call` (the `question` tool) asks: on 2.1.2 a pending form of the session
        (`routes.question_form`), listed by `GET /api/session/{id}/form`."""
        request = question_form(call.session_id, (call.message_id, call.call_id))
        self.store.forms.setdefault(call.session_id, []).append(request)
        return request
