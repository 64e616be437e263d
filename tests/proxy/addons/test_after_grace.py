"""A confirmation's reading: asked again while a restarted server does not answer, each try bounded."""

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from proxy.addons.live import after_grace
from proxy.addons.live.after_grace import read_after_grace


def answers(*tries: Callable[[], Awaitable[str]]) -> Callable[[], Awaitable[str]]:
    """A read whose n-th call is the n-th try."""
    pending = list(tries)

    def read() -> Awaitable[str]:
        return pending.pop(0)()

    return read


async def hangs() -> str:
    await asyncio.Event().wait()
    raise AssertionError("never answers")


async def drops() -> str:
    raise aiohttp.ServerDisconnectedError()


async def answer() -> str:
    return "read"


@pytest.mark.parametrize("first", [hangs, drops], ids=["held for good", "dropped mid-answer"])
async def test_a_failed_try_is_logged_and_asked_again(
    first: Callable[[], Awaitable[str]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(after_grace, "TRY_TIMEOUT_S", 0.05)
    caplog.set_level(logging.INFO, logger="proxy.addons.live.after_grace")
    assert await read_after_grace(answers(first, answer), 0, "stream settle", "ses_a") == "read"
    assert "stream settle of ses_a: not confirmed" in caplog.text
    assert "try 1 of 3" in caplog.text


async def test_every_try_failing_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(after_grace, "TRY_TIMEOUT_S", 0.05)
    assert await read_after_grace(answers(drops, hangs, drops), 0, "stream settle", "ses_a") is None
