"""The path of one message view through `Settle.response`, call by call: the algorithm has one
owner (`proxy.views.message_views`), so the flow does not bounce between the modules of the
view path (the settle addon and `proxy/views/`).

Measured with `sys.setprofile`: every function of the proxy first entered (not resumed) under
`Settle.response` is a node under the nearest such function that called it, which makes the call
tree; walking it depth first, a call into another module and the return from it each move to that
module. Kept to the view path's own modules (a call anywhere else stays, for this count, in the
module that made it), a move into a module already entered, and so already left, is a return to
it.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType

import aiohttp
from yarl import URL

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.settle import SETTLED_HEADER, Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import LivenessTracker
from proxy.relay.hooks import Flow
from proxy.service.metrics import Metrics
from tests.fixtures import compact

ROOT = Path(__file__).resolve().parents[3]
VIEW_PATH = ("proxy/addons/settle", "proxy/views/")
RETURNS = 10
"""At most this many returns (issue 27; 19 when the algorithm was split across three classes)."""
V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
VIEW = f"/session/{V1}/message"


def _module(code: CodeType) -> str | None:
    path = Path(code.co_filename)
    if not path.is_relative_to(ROOT / "proxy"):
        return None
    return path.relative_to(ROOT).with_suffix("").as_posix()


def _under(frame: FrameType | None, code: CodeType) -> bool:
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


async def call_tree(
    run: Callable[[], Awaitable[object]], root: CodeType
) -> dict[FrameType | None, list[FrameType]]:
    """The proxy's functions first entered under `root` while `run` runs, each under its caller
    (the nearest one of them up its stack; None for the outermost)."""
    calls: dict[FrameType | None, list[FrameType]] = {None: []}

    def caller(frame: FrameType | None) -> FrameType | None:
        while frame is not None and frame not in calls:
            frame = frame.f_back
        return frame

    def profile(frame: FrameType, event: str, _: object) -> None:
        if event == "call" and frame not in calls and _module(frame.f_code) and _under(frame, root):
            calls[frame] = []
            calls[caller(frame.f_back)].append(frame)

    sys.setprofile(profile)
    try:
        await run()
    finally:
        sys.setprofile(None)
    return calls


def walk(calls: dict[FrameType | None, list[FrameType]]) -> list[str]:
    """The modules of the view path the flow moves through, depth first, each move once."""

    def visit(frame: FrameType) -> Iterator[str]:
        module = _module(frame.f_code) or ""
        for callee in calls[frame]:
            yield module
            yield from visit(callee)
        yield module

    moves: list[str] = []
    for module in (module for top in calls[None] for module in visit(top)):
        if module.startswith(VIEW_PATH) and (not moves or moves[-1] != module):
            moves.append(module)
    return moves


async def settled_view_walk(upstream_api: UpstreamApi) -> list[str]:
    """The walk of one stale v1 list settled by a reading asked of the upstream."""
    async with aiohttp.ClientSession() as session:
        tracker = LivenessTracker(session, URL("http://127.0.0.1:1"))
        settle = Settle(
            SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0), tracker=tracker
        )
        flow = testing.flow("GET", VIEW, body=compact("v1-message-stale-running.json"))
        response = settle.response

        async def measured(flow: Flow) -> None:
            calls.update(await call_tree(lambda: response(flow), Settle.response.__code__))

        calls: dict[FrameType | None, list[FrameType]] = {}
        settle.response = measured  # type: ignore[method-assign]
        await testing.cycle(settle, flow)
    assert calls, "the view was read and checked"
    assert SETTLED_HEADER in flow.response_headers
    return walk(calls)


def returns(moves: list[str]) -> int:
    return len(moves) - len(set(moves))


async def test_a_settled_view_returns_to_a_module_of_its_path_at_most_ten_times(
    upstream_api: UpstreamApi,
) -> None:
    moves = await settled_view_walk(upstream_api)
    assert {"proxy/addons/settle", "proxy/views/message_views", "proxy/views/rewrite"} <= set(moves)
    assert returns(moves) <= RETURNS, moves


def test_the_walk_counts_each_return_to_a_module_left() -> None:
    """The premise: a module entered again after another one counts, staying in one does not."""
    assert returns(["a", "b", "a", "c", "b", "a"]) == 3
    assert returns(["a", "b", "c"]) == 0
