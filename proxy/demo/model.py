"""A local OpenAI-compatible model that drives opencode into a long-running bash tool call.

It is what `settle-proxy demo` shows the fix with, needing no account and no network, and what the
integration suites drive the real servers with: one model, so the demo shows what the tests check.
opencode talks to it through the `mock` provider (`@ai-sdk/openai-compatible`). Until the
conversation holds a `tool` message, every completion is one streamed `bash` tool call, so a
turn parks in a running tool; once the tool result (or opencode's interrupted-call stand-in) is
in the history, the model answers with text and the turn ends. Requests without tools (title
generation and other helper agents) get a short text answer, so they never start a tool.

The server runs its own event loop in a daemon thread, so a synchronous caller and any caller's
event loop stay independent of it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

DEFAULT_COMMAND = "echo hello && sleep 600"
"""The command a turn runs unless a plan says otherwise: long enough to outlive any test."""

SLOW_TEXT_CHUNKS = 600
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Plan:
    """How the model answers a conversation whose latest, else first, user message has a given text.

    `cut_stream` drops the connection right after the tool-call chunk, without a finish chunk or
    `data: [DONE]`, to reproduce a provider stream that dies mid-way. `each_prompt` asks for the
    tool once per user prompt (until a tool result follows the latest user message) instead of once
    per conversation, so that a later prompt in the same session runs a tool too. `text_every`
    (seconds) makes the model answer with text only, one chunk that often for `SLOW_TEXT_CHUNKS`
    chunks: a turn that stays busy writing, with no tool call, for as long as a test needs.
    """

    command: str = DEFAULT_COMMAND
    cut_stream: bool = False
    each_prompt: bool = False
    description: str = "demo"
    """The call's `description`; may hold a lone surrogate, sent as its escape as a provider would."""
    text_every: float | None = None
    tool: str = "bash"
    """The tool the model calls; `arguments` replace bash's command and description (e.g. for `task`)."""
    arguments: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RecordedRequest:
    """What the model saw in one completion request and what it decided to answer."""

    at: float
    prompt: str | None
    latest_prompt: str | None
    """The newest user text (a further prompt, or a resume's continuation)."""
    roles: tuple[str, ...]
    tools: tuple[str, ...]
    decision: str
    tool_call_id: str | None
    tool_messages: tuple[Mapping[str, Any], ...]


class MockModel:
    """The mock model server: `start()`, then point opencode at `base_url`; `stop()` at the end."""

    def __init__(self) -> None:
        self._plans: dict[str, Plan] = {}
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._call_ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mock-model", daemon=True)
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def base_url(self) -> str:
        """The provider `baseURL` for opencode.json (it ends in `/v1`)."""
        if self._port is None:
            raise RuntimeError("mock model is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    def plan(self, prompt: str, plan: Plan) -> None:
        """Answer by `plan` when the latest user text is `prompt` (else when the first one is)."""
        with self._lock:
            self._plans[prompt] = plan

    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the completion requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def start(self) -> None:
        """Bind a free loopback port and serve in the background thread."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self._port = future.result(timeout=_START_TIMEOUT_S)

    def stop(self) -> None:
        """Close the server, then the loop and its thread; idempotent."""
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            future.result(timeout=_STOP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"mock model thread did not stop within {_STOP_TIMEOUT_S}s")
        self._loop.close()

    async def _serve(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        port: int = sock.getsockname()[1]
        return port

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        messages: list[dict[str, Any]] = body.get("messages", [])
        tools = tuple(t["function"]["name"] for t in body.get("tools") or [])
        texts = _user_texts(messages)
        prompt = texts[0] if texts else None
        with self._lock:
            plan = self._plans.get(texts[-1] if texts else "") or self._plans.get(prompt or "", Plan())
        slow = plan.text_every is not None and "bash" in tools
        wants_tool = plan.tool in tools and not slow and not _tool_answered(messages, plan)
        call_id = f"call_mock_{next(self._call_ids)}" if wants_tool else None
        self._record(texts, messages, tools, plan, call_id, slow=slow)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if slow and plan.text_every is not None:
            await _send_slowly(response, plan.text_every)
            return response
        if call_id is None:
            await _send_text(response, "done")
            return response
        await _send(response, _tool_call_delta(call_id, plan))
        if plan.cut_stream:
            _drop_connection(request)
            return response
        await _finish(response, "tool_calls")
        return response

    def _record(
        self,
        texts: Sequence[str],
        messages: Sequence[Mapping[str, Any]],
        tools: tuple[str, ...],
        plan: Plan,
        call_id: str | None,
        *,
        slow: bool,
    ) -> None:
        decision = (
            "slow-text" if slow else "text" if call_id is None else "tool-cut" if plan.cut_stream else "tool"
        )
        entry = RecordedRequest(
            at=time.time(),
            prompt=texts[0] if texts else None,
            latest_prompt=texts[-1] if texts else None,
            roles=tuple(str(m.get("role")) for m in messages),
            tools=tools,
            decision=decision,
            tool_call_id=call_id,
            tool_messages=tuple(m for m in messages if m.get("role") == "tool"),
        )
        with self._lock:
            self._requests.append(entry)


def _user_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The text of every user message, oldest first: the latest or the first selects a `Plan`."""
    texts = []
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.append(
                "".join(c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text")
            )
    return texts


def _tool_answered(messages: Sequence[Mapping[str, Any]], plan: Plan) -> bool:
    """Whether a tool result is in the conversation (with `each_prompt`: after the latest user message)."""
    users = [index for index, message in enumerate(messages) if message.get("role") == "user"]
    since = messages[users[-1] :] if plan.each_prompt and users else messages
    return any(message.get("role") == "tool" for message in since)


def _chunk(delta: Mapping[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _tool_call_delta(call_id: str, plan: Plan) -> dict[str, Any]:
    # The standard library writes a lone surrogate as its escape, where orjson refuses it.
    given = (
        plan.arguments
        if plan.arguments is not None
        else {"command": plan.command, "description": plan.description}
    )
    arguments = json.dumps(given, separators=(",", ":"))
    call = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": plan.tool, "arguments": arguments},
    }
    return _chunk({"role": "assistant", "tool_calls": [call]})


async def _send(response: web.StreamResponse, payload: Mapping[str, Any]) -> None:
    await response.write(b"data: " + orjson.dumps(payload) + b"\n\n")


async def _send_text(response: web.StreamResponse, text: str) -> None:
    await _send(response, _chunk({"role": "assistant", "content": text}))
    await _finish(response, "stop")


async def _send_slowly(response: web.StreamResponse, every: float) -> None:
    """Text chunks `every` seconds apart until `SLOW_TEXT_CHUNKS` are sent or the client is gone."""
    try:
        for number in range(SLOW_TEXT_CHUNKS):
            await _send(response, _chunk({"role": "assistant", "content": f"word{number} "}))
            await asyncio.sleep(every)
        await _finish(response, "stop")
    except ConnectionResetError:
        return


async def _finish(response: web.StreamResponse, reason: str) -> None:
    """The last chunk carries the finish reason and usage; `[DONE]` closes the stream."""
    final = _chunk({}, reason)
    final["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    await _send(response, final)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


def _drop_connection(request: web.Request) -> None:
    """Close the socket under the open chunked response: the client sees a truncated stream."""
    transport = request.transport
    if transport is None:
        raise RuntimeError("mock model request has no transport to drop")
    transport.close()
