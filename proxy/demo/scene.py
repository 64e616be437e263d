"""The demo's one scene: a call runs, the server is SIGKILLed and started again, and each client is
shown the call, directly and through the proxy.

Everything it starts is stopped in reverse order however it ends (a Ctrl-C cancels it): the event
streams, the proxy, the server and what its crash left running, the model, and the directory that
held their data.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import orjson

from proxy.demo.client import Client, Failed, until
from proxy.demo.lines import PROMPT, Call, Line
from proxy.demo.listener import Listener
from proxy.demo.model import MockModel
from proxy.demo.processes import Opencode, Proxy, environment
from proxy.opencode.vocabulary import TOOL_RUNNING
from proxy.supervision.server_command import free_loopback_port

RUN_S = 60.0
SETTLE_S = 30.0
"""How long the proxy is given to show the call settled: it first waits until the call's last sign
of life is 2 s old (the freshness margin), then reads the server."""


@dataclass(frozen=True, slots=True)
class Installed:
    """The opencode the demo runs: its program, the version it names, and its line."""

    binary: str
    version: str
    line: Line


@dataclass(frozen=True, slots=True)
class Seen:
    """What one client was shown of the call after the restart."""

    view: Call | None
    """The call in the session's message view."""
    told: Call | None
    """The last word of the event stream, open across the crash and reconnected, about it."""
    before: Call | None
    """The last word of that stream before the crash."""


@dataclass(frozen=True, slots=True)
class Outcome:
    installed: Installed
    directly: Seen
    proxied: Seen
    left_behind: int
    """Processes the crash left running (the call's), ended by the demo."""


async def play(installed: Installed, say: Callable[[str], None]) -> Outcome:
    """The whole scene, with `say` told each step as it begins."""
    with tempfile.TemporaryDirectory(prefix="settle-proxy-demo-") as directory:
        root = Path(directory)
        model = MockModel()
        model.start()
        try:
            model.plan(PROMPT, installed.line.plan())
            async with AsyncExitStack() as stack:
                return await _play(stack, root, model, installed, say)
        finally:
            model.stop()


async def _play(
    stack: AsyncExitStack, root: Path, model: MockModel, installed: Installed, say: Callable[[str], None]
) -> Outcome:
    line = installed.line
    password = secrets.token_urlsafe(16)
    env = environment(root, password)
    (root / "project").mkdir()
    (root / "project" / "opencode.json").write_bytes(orjson.dumps(line.config(model.base_url)))
    client = Client(password)
    stack.push_async_callback(client.close)
    opencode = Opencode(installed.binary, line, root, free_loopback_port(), env)
    stack.push_async_callback(opencode.stop)
    say(f"starting opencode {installed.version}{line.first_start}…")
    await opencode.start(client)
    proxy = Proxy(opencode.origin, root, free_loopback_port(), env)
    stack.push_async_callback(proxy.stop)
    say(f"starting settle-proxy in front of it ({proxy.origin} -> {opencode.origin})…")
    await proxy.start(client)
    listeners = (Listener(client, opencode.origin, line), Listener(client, proxy.origin, line))
    for listener in listeners:
        stack.push_async_callback(listener.stop)
        listener.start()
    await until(partial(_connected, listeners), what="both event streams connected", within=RUN_S)
    say(f"the model calls `{line.tool}`; it runs `sleep 600`…")
    turn, call = await _running_call(client, opencode, listeners)
    say("SIGKILL opencode's process group (the call's process lives on, as after a real crash)…")
    await opencode.crash()
    crashed = [listener.connections for listener in listeners]
    say("starting opencode again on the same port and data…")
    await opencode.start(client)
    say("reading the call directly and through settle-proxy…")
    settled = partial(_settled, client, proxy.origin, turn)
    proxied_view = await until(settled, what="the proxy showing the call settled", within=SETTLE_S)
    direct_view = await turn.call(client, opencode.origin)
    told = partial(listeners[1].last_word, call.id, after=crashed[1])
    await until(partial(_ended, told), what="the proxy telling its event stream", within=SETTLE_S)
    back = partial(_reconnected, listeners[0], crashed[0])
    await until(back, what="the direct event stream reconnected", within=SETTLE_S)
    direct, proxied = (
        Seen(view, listener.last_word(call.id, after=mark), listener.last_word(call.id, before=mark))
        for view, listener, mark in zip((direct_view, proxied_view), listeners, crashed, strict=True)
    )
    return Outcome(installed, direct, proxied, len(opencode.left_behind))


async def _reconnected(listener: Listener, crashed: int) -> bool | None:
    return True if listener.connections > crashed else None


async def _connected(listeners: tuple[Listener, ...]) -> bool | None:
    return True if all(listener.connections for listener in listeners) else None


@dataclass(frozen=True, slots=True)
class Turn:
    """The demo's session, in the project of its line."""

    line: Line
    project: Path
    session: str

    async def call(self, client: Client, origin: str) -> Call | None:
        """The call as `origin` serves the session's message view."""
        return self.line.call_in(
            await client.answered(origin, self.line.messages(self.session, self.project))
        )


async def _running_call(
    client: Client, opencode: Opencode, listeners: tuple[Listener, ...]
) -> tuple[Turn, Call]:
    """Start the turn directly, and return its call once the server shows it running, the proxy's
    stream has carried that (the proxy then knows the call open), and its process runs."""
    line, project = opencode.line, opencode.project
    session = line.session_id(await client.answered(opencode.origin, line.new_session(project)))
    turn = Turn(line, project, session)
    await client.answered(opencode.origin, line.prompt(session, project))

    async def running() -> Call | None:
        call = await turn.call(client, opencode.origin)
        if call is None or call.status != TOOL_RUNNING or listeners[1].last_word(call.id) is None:
            return None
        return call if opencode.apart() else None

    return turn, await until(running, what=f"the `{line.tool}` call running", within=RUN_S)


async def _settled(client: Client, origin: str, turn: Turn) -> Call | None:
    """The call once `origin` shows it settled (a proxy whose upstream is not back yet answers 502)."""
    try:
        call = await turn.call(client, origin)
    except Failed:
        return None
    return call if call is not None and call.status != TOOL_RUNNING else None


async def _ended(told: Callable[[], Call | None]) -> Call | None:
    call = told()
    return call if call is not None and call.status != TOOL_RUNNING else None
