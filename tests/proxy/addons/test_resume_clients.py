"""Counting the client event streams a resume waits for."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy import testing
from proxy.addons.live.resume_clients import ResumeClients
from proxy.addons.routing import Routing
from proxy.relay.hooks import Flow

SSE = {"Content-Type": "text/event-stream"}


async def routed(method: str, path: str, **answer: Any) -> Flow:
    """A flow as the addon sees it in the application: `routing` has named its route."""
    flow = testing.flow(method, path, **answer)
    await Routing().request_headers(flow)
    return flow


class Clock:
    now = 10.0

    def __call__(self) -> float:
        return self.now


async def test_client_event_streams_are_counted_while_open_and_remembered_by_time() -> None:
    clock = Clock()
    clients = ResumeClients(clock)
    clock.now = 11.0
    await testing.cycle(clients, await routed("GET", "/global/event", response_headers=SSE))
    assert clients.open == 0, "a stream is counted only while it is open"
    flow = await routed("GET", "/event?directory=/w", response_headers=SSE)
    await clients.response_headers(flow)
    clock.now = 12.0
    await clients.response_headers(await routed("GET", "/api/event", response_headers=SSE))
    assert clients.open == 2
    assert (clients.most_open_since(12.5), clients.most_open_since(11.5)) == (2, 2)
    clock.now = 13.0
    await clients.done(flow)
    await clients.done(flow)
    assert clients.open == 1
    assert (clients.most_open_since(9.0), clients.most_open_since(13.5)) == (2, 1)


async def test_a_stream_opened_after_the_servers_last_word_is_waited_for() -> None:
    """The server said nothing after a page opened its stream (its tool ran quietly); the crash cut
    the stream. A resume counting from the server's last word still waits for the page (issue 28)."""
    clock = Clock()
    clients = ResumeClients(clock)
    last_alive = clock.now
    clock.now = 14.0
    page = await routed("GET", "/global/event", response_headers=SSE)
    await clients.response_headers(page)
    clock.now = 18.0
    await clients.done(page)  # the crash
    assert clients.most_open_since(last_alive) == 1
    waiting = asyncio.create_task(clients.back(clients.most_open_since(last_alive)))
    await asyncio.sleep(0)
    assert not waiting.done(), "the resume went ahead without the page"
    await clients.response_headers(await routed("GET", "/global/event", response_headers=SSE))
    await asyncio.wait_for(waiting, testing.WAIT_S)


async def test_other_routes_and_failed_streams_are_not_client_streams() -> None:
    clients = ResumeClients()
    for flow in (
        await routed("GET", "/session/ses_1/message"),
        await routed("GET", "/global/event", status=502, response_headers=SSE),
        await routed("GET", "/api/session/ses_1/event", response_headers=SSE),
    ):
        await clients.response_headers(flow)
    assert clients.open == 0


async def test_a_resume_waits_until_as_many_streams_are_back() -> None:
    clients = ResumeClients()
    waiting = asyncio.create_task(clients.back(1))
    await asyncio.sleep(0)
    assert not waiting.done()
    await clients.response_headers(await routed("GET", "/global/event", response_headers=SSE))
    await asyncio.wait_for(waiting, testing.WAIT_S)
