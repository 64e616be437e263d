"""The addon model: each behaviour is a small named object with hooks, as in mitmproxy.

The forwarding core calls the hooks through `Addons`, at fixed points of an exchange, and
knows none of the addons. An addon that needs a whole response body says so in
`response_headers` (`flow.read_whole`); every other body is streamed through untouched. What
only one addon may own in a flow (the events slipped into a stream, `flow.inject`) is refused
to a second one, loudly; per-flow addon state lives in the flow under a typed `FlowKey`; policy
the relay must apply (`flow.start_timeout`) is set by the addon that owns it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar, final

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter

from proxy.relay.options import DEFAULT_MAX_BODY
from proxy.relay.sse import Opened
from proxy.relay.tasks import Lifecycle, Working

log = logging.getLogger(__name__)
Hook = Literal["request_headers", "response_headers", "response", "done"]
T = TypeVar("T")


@final
class FlowKey(Generic[T]):
    """A typed key for an addon's state in a flow, as aiohttp's `AppKey` is for an application's:
    `flow[KEY]` reads back with the key's type, and two keys never collide, whatever their names."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<FlowKey {self.name}>"


class ClaimedTwice(RuntimeError):
    """Two addons claimed what only one may own in a flow (its injected events)."""


@dataclass(slots=True)
class Flow:
    """One request/response exchange as addons see it.

    Per-flow addon state lives in the flow itself (`flow[KEY]`, with a `FlowKey` the addon owns),
    so it goes when the flow goes, and which value a key holds is undone with the rest of a
    failed hook's changes (`_Snapshot` says exactly what is).
    """

    request: web.Request
    upstream_headers: CIMultiDict[str]
    """The headers about to be sent upstream; `request_headers` hooks may edit them."""
    start_timeout: float | None = None
    """How long the upstream may take to start answering (None: forever); `request_headers`
    hooks may change it for the routes whose policy they own."""
    max_body: int = DEFAULT_MAX_BODY
    """The most bytes of a body read whole, as sent and decoded: past it the relay streams the
    body unchecked (and `response` is not called); an addon that decodes the body bounds its
    own decoding by it too."""
    status: int = 0
    response_headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    content_length: int | None = None
    """The upstream body's announced length, if it announced one."""
    body: bytes = b""
    read_whole_by: set[str] = field(default_factory=set)
    """The addons that asked, in `response_headers`, to receive the whole body in `response`."""
    metadata: dict[FlowKey[Any], Any] = field(default_factory=dict)
    _injected: asyncio.Queue[bytes] | None = field(default=None, init=False)
    _injector: str | None = field(default=None, init=False)
    _opened: Opened | None = field(default=None, init=False)

    def __getitem__(self, key: FlowKey[T]) -> T:
        value: T = self.metadata[key]
        return value

    def __setitem__(self, key: FlowKey[T], value: T) -> None:
        self.metadata[key] = value

    def get(self, key: FlowKey[T]) -> T | None:
        value: T | None = self.metadata.get(key)
        return value

    @property
    def event_stream(self) -> bool:
        """Whether the response is a server-sent event stream (known once its headers are)."""
        return self.response_headers.get("Content-Type", "").startswith("text/event-stream")

    @property
    def opened_event_stream(self) -> bool:
        """Whether a client's `GET` was answered with an event stream, 200: a stream the proxy may
        speak on (its headers known)."""
        return self.status == 200 and self.request.method == "GET" and self.event_stream

    @property
    def reads_whole(self) -> bool:
        """Whether some addon asked for the whole body."""
        return bool(self.read_whole_by)

    def read_whole(self, *, by: str) -> None:
        """Ask, in `response_headers`, for the whole body in `response` (several addons may)."""
        self.read_whole_by.add(by)

    @property
    def injected(self) -> asyncio.Queue[bytes] | None:
        """Events to slip in between the upstream's, if an addon asked to (`inject`)."""
        return self._injected

    @property
    def opened(self) -> Opened | None:
        """What the injecting addon is handed the stream's first event with (`inject`)."""
        return self._opened

    def inject(self, events: asyncio.Queue[bytes], *, by: str, opened: Opened | None = None) -> None:
        """Slip `events` in between an event stream's own, from `response_headers`; `opened` is
        handed the upstream's first event as it goes out, and what it returns is awaited before
        the rest (`relay.sse`). One addon only: a second would interleave its events with the first's, so it
        is refused."""
        if self._injector is not None:
            raise ClaimedTwice(f"{by} cannot inject into {self.request.path}: {self._injector} does")
        self._injected, self._injector, self._opened = events, by, opened


Scope = Callable[[Flow], bool]
"""Whether an addon takes part in a flow, read from what the earlier hooks put in it (its route)."""


class Addon(Working):
    """Base class with no-op hooks; subclasses override the hooks they handle.

    An addon says what it is, and the application wires it from that alone: its `scope` (the
    flows it takes part in; None: all), its background `tasks` (waited for by `Background`,
    closed by its `close`), and, by being an `opencode.tracker.StreamListener` too, that it
    follows the server's event stream."""

    name: ClassVar[str]
    scope: Scope | None = None
    tasks: Lifecycle | None = None

    async def request_headers(self, flow: Flow) -> None:
        """Before the request goes upstream."""

    async def response_headers(self, flow: Flow) -> None:
        """When the upstream status and headers are known, before any body byte is read."""

    async def response(self, flow: Flow) -> None:
        """With the whole body, for flows some addon asked to read; may replace body and headers."""

    async def done(self, flow: Flow) -> None:
        """The exchange is over (answered, streamed to the end, or abandoned by the client)."""

    async def close(self) -> None:
        """The application is shutting down: cancel what the addon still runs in the background."""


HOOKS: tuple[Hook, ...] = ("request_headers", "response_headers", "response", "done")


@dataclass(slots=True)
class _Snapshot:
    """What a hook may change in a flow, taken before the hook runs, to undo a failed one.

    Undone: the headers its stage can still change (the upstream's before the request goes, the
    client's after: the upstream's are then sent, and the client's not known yet), the start
    timeout, the status, the body, who reads it whole, who injects, and which value each
    `FlowKey` holds (a key set is unset, a value replaced is put back). Not undone: a change
    inside a value held under a key (an object's field set, a list appended to). The mapping is
    copied, not what it holds: those values are the addons' live objects (a stream, a
    subscriber), which others refer to by identity and some of which cannot be copied, and a
    copy per hook call would cost on every scoped route. An addon whose per-flow state must be
    undone with a failed hook replaces the value (`flow[KEY] = ...`) instead of changing it.
    Not frozen: a frozen dataclass sets each field through `object.__setattr__`, and one is
    taken for every hook call.
    """

    hook: Hook
    headers: CIMultiDict[str]
    start_timeout: float | None
    status: int
    body: bytes
    read_whole_by: frozenset[str]
    metadata: dict[FlowKey[Any], Any]
    injected: tuple[asyncio.Queue[bytes] | None, str | None, Opened | None]

    @staticmethod
    def of(flow: Flow, hook: Hook) -> _Snapshot:
        headers = flow.upstream_headers if hook == "request_headers" else flow.response_headers
        return _Snapshot(
            hook,
            headers.copy(),
            flow.start_timeout,
            flow.status,
            flow.body,
            frozenset(flow.read_whole_by),
            dict(flow.metadata),
            (flow._injected, flow._injector, flow._opened),
        )

    def restore(self, flow: Flow) -> None:
        if self.hook == "request_headers":
            flow.upstream_headers = self.headers
        else:
            flow.response_headers = self.headers
        flow.start_timeout, flow.status, flow.body = self.start_timeout, self.status, self.body
        flow.read_whole_by, flow.metadata = set(self.read_whole_by), self.metadata
        flow._injected, flow._injector, flow._opened = self.injected


class Addons:
    """The addons of one application, in order, and the one place their hooks are called.

    A hook that raises is isolated: it is logged and counted, what it changed in the flow is
    undone (as `_Snapshot` says: the client gets the upstream's bytes, never a proxy's 500), and the
    other addons run on. Only the addons that implement a hook are called for it, and an addon
    given a scope only for the flows in it (as a router hands each route to its handlers), so a
    flow no addon claims costs no hook call and no snapshot.
    """

    def __init__(self, addons: Sequence[Addon], errors: Counter) -> None:
        self.addons = tuple(addons)
        self._errors = errors
        self._implementing: dict[Hook, tuple[tuple[Addon, Scope | None], ...]] = {
            hook: tuple(
                (addon, addon.scope)
                for addon in addons
                if getattr(type(addon), hook) is not getattr(Addon, hook)
            )
            for hook in HOOKS
        }

    async def trigger(self, hook: Hook, flow: Flow) -> None:
        """Call `hook` of every addon that has it and takes part in `flow`, in order, each
        isolated from the others."""
        for addon, scope in self._implementing[hook]:
            if scope is not None and not scope(flow):
                continue
            method: Callable[[Flow], Coroutine[Any, Any, None]] = getattr(addon, hook)
            snapshot = _Snapshot.of(flow, hook) if hook != "done" else None
            try:
                await method(flow)
            except Exception:
                log.exception(
                    "addon %s failed in %s of %s; what it changed is undone",
                    addon.name,
                    hook,
                    flow.request.path,
                )
                self._errors.labels(addon.name, hook).inc()
                if snapshot is not None:
                    snapshot.restore(flow)

    async def close(self) -> None:
        """Close every addon, the last first (application cleanup)."""
        for addon in reversed(self.addons):
            await addon.close()
