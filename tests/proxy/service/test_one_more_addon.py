"""Adding an addon is one new module and one line in the assembly (`ADDONS`): what it declares
(its scope, that it follows the stream, its background tasks, its close) is all the wiring."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import ClassVar

from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.addons.routing import message_view
from proxy.opencode.tracker import FollowedEvent, StreamListener
from proxy.relay.hooks import Addon, Flow
from proxy.relay.tasks import KeyedTasks
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.assembly import ADDONS
from proxy.service.config import Settings
from proxy.testing import idle
from tests.fixtures import compact
from tests.proxy.conftest import ProxyClient, following, publish
from tests.proxy.fake_opencode import FakeOpencode

ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]
SESSION = "ses_dd6bcdaa7ffenxavFWr4GKPq95"


class Recorder(Addon, StreamListener):
    """An addon as a new module would add it: message views only, follows the stream, works in the
    background for each session the stream speaks of, and ends that work when closed."""

    name: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        self.scope = message_view
        self.tasks: KeyedTasks[str] = KeyedTasks("recorder")
        self.hooks: list[tuple[str, str]] = []
        self.heard: list[str] = []
        self.worked: list[str] = []
        self.gate = asyncio.Event()
        self.closed = False

    async def request_headers(self, flow: Flow) -> None:
        self.hooks.append(("request_headers", flow.request.path))

    async def done(self, flow: Flow) -> None:
        self.hooks.append(("done", flow.request.path))

    def following(self) -> None:
        self.heard.append("following")

    def event(self, event: FollowedEvent) -> None:
        self.heard.append(event.kind)
        if (session_id := event.session_id) is not None:
            self.tasks.start(session_id, lambda: self._work(session_id))

    async def _work(self, session_id: str) -> None:
        await self.gate.wait()
        self.worked.append(session_id)

    async def close(self) -> None:
        self.closed = True
        await self.tasks.close()


async def test_an_addon_added_in_one_line_has_its_hooks_listener_tasks_and_close_run(
    fake: FakeOpencode, upstream: TestServer, aiohttp_client: ClientFactory
) -> None:
    recorder = Recorder()
    settings = Settings(upstream=URL(str(upstream.make_url("/"))))
    app = create_app(settings, addons=(*ADDONS, lambda built: recorder))
    proxy = await aiohttp_client(app)
    await following(proxy)
    fake.bodies[f"/session/{SESSION}/message"] = compact("v1-message-stale-running.json")

    await (await proxy.get(f"/session/{SESSION}/message")).read()
    await (await proxy.get("/config")).read()
    path = f"/session/{SESSION}/message"
    assert recorder.hooks == [("request_headers", path), ("done", path)], "its scope: message views only"

    await publish(proxy, fake, "session.status", SESSION, status={"type": "busy"})
    assert recorder.heard[-1] == "session.status"
    assert proxy.app[ASSEMBLY].background.busy, "its work is the application's background work"
    recorder.gate.set()
    await idle(proxy.app)
    assert recorder.worked == [SESSION]

    recorder.gate.clear()
    await publish(proxy, fake, "session.status", SESSION, status={"type": "idle"})
    assert recorder.tasks.busy
    await proxy.close()
    assert recorder.closed
    assert not recorder.tasks.busy, "closed with the application, its work is cancelled"
    assert recorder.worked == [SESSION]
