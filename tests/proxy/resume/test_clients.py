"""Counting the client event streams a resume waits for."""

from __future__ import annotations

import asyncio

from proxy import testing
from proxy.resume.clients import ClientStreams

SSE = {"Content-Type": "text/event-stream"}


class Clock:
    now = 10.0

    def __call__(self) -> float:
        return self.now


async def test_client_event_streams_are_counted_while_open_and_remembered_by_time() -> None:
    clock = Clock()
    clients = ClientStreams(clock)
    clock.now = 11.0
    await testing.cycle(clients, testing.flow("GET", "/global/event", response_headers=SSE))
    assert clients.open == 0, "a stream is counted only while it is open"
    flow = testing.flow("GET", "/event?directory=/w", response_headers=SSE)
    await clients.response_headers(flow)
    clock.now = 12.0
    await clients.response_headers(testing.flow("GET", "/api/event", response_headers=SSE))
    assert clients.open == 2
    assert (clients.open_at(10.5), clients.open_at(11.5), clients.open_at(12.5)) == (0, 1, 2)
    await clients.done(flow)
    await clients.done(flow)
    assert clients.open == 1


async def test_other_routes_and_failed_streams_are_not_client_streams() -> None:
    clients = ClientStreams()
    for flow in (
        testing.flow("GET", "/session/ses_1/message"),
        testing.flow("GET", "/global/event", status=502, response_headers=SSE),
        testing.flow("GET", "/api/session/ses_1/event", response_headers=SSE),
    ):
        await clients.response_headers(flow)
    assert clients.open == 0


async def test_a_resume_waits_until_as_many_streams_are_back() -> None:
    clients = ClientStreams()
    waiting = asyncio.create_task(clients.back(1))
    await asyncio.sleep(0)
    assert not waiting.done()
    await clients.response_headers(testing.flow("GET", "/global/event", response_headers=SSE))
    await asyncio.wait_for(waiting, testing.WAIT_S)
