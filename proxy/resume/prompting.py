"""Resuming a turn once it is decided on: claim it in the ledger (at most once, whoever else
runs), then prompt until the turn is seen to start, within `--resume-attempts`, and say how it
ended in the journal and the ledger."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.opencode.ids import ascending_id
from proxy.resume.decision import ResumeOutcome
from proxy.resume.journal import Journal
from proxy.resume.last_turn import InterruptedTurn, user_message_after
from proxy.resume.ledger import Ledger
from proxy.resume.sending import READ_ERRORS
from rules import Api, Runtime

__all__ = ["Prompted", "Prompting"]


class Prompted(Protocol):
    """The restarted server as a prompt is sent to it (`proxy.resume.sending.Server`)."""

    def rules(self, turn_api: Api) -> Runtime[Any]: ...

    async def messages(self, turn_api: Api, session_id: str) -> Any: ...

    async def ready(self, directory: str | None, provider: str | None) -> str | None:
        """None once the server can run a turn; else, past a timeout, why not."""
        ...

    async def prompt(
        self, turn: InterruptedTurn, directory: str | None, prompt_id: str, text: str
    ) -> None: ...

    async def started(self, turn: InterruptedTurn, prompt_id: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Try:
    """One try at starting the turn: prompts sent (0 or 1), whether it started, and how or why not."""

    sent: int
    started: bool
    how: str


class Prompting:
    """Claims a decided turn and prompts until it starts; `attempts` prompts in all for the
    person's turn, `retry_pause` seconds apart. With `settled_by` (a server that settles the calls
    itself, and refuses an id it admitted: 2.x), every try of one turn sends under one id, and
    each decision line says what makes the settlement durable."""

    def __init__(
        self,
        server: Prompted,
        ledger: Ledger,
        journal: Journal,
        *,
        attempts: int,
        retry_pause: float,
        settled_by: str | None = None,
    ) -> None:
        self._server = server
        self._ledger = ledger
        self._journal = journal
        self._attempts = attempts
        self._retry_pause = retry_pause
        self._settled_by = settled_by

    async def resume(
        self,
        turn: InterruptedTurn,
        directory: str | None,
        text: str,
        calls: list[dict[str, str]],
        *,
        admitted: float | None = None,
    ) -> None:
        """Claim the turn, then prompt; `admitted` (epoch seconds: when the admission let it go)
        is said with the decision that it started."""
        claim = await self._ledger.claim(turn.session_id, turn.prompted_by, turn.message_id)
        if not claim.won:
            self._decide(ResumeOutcome.SKIPPED, turn, f"already claimed, by {claim.owner} (state database)")
            return
        more = {"calls": calls} | ({"admitted": admitted} if admitted is not None else {})
        await self._send(turn, directory, claim.used, text, more)

    async def _send(
        self, turn: InterruptedTurn, directory: str | None, used: int, text: str, more: dict[str, Any]
    ) -> None:
        """Prompt until the turn starts (`used` prompts spent already); a server never ready
        spends a try too, not a prompt."""
        attempts, prompt_id = self._attempts, ascending_id("msg")
        for tries in range(1, attempts + 1):
            if tries > 1 and self._settled_by is None:
                prompt_id = ascending_id("msg")
            tried = await self._attempt(turn, directory, prompt_id, text)
            used += tried.sent
            why = tried.how
            if tried.started:
                await self._ledger.finished(turn.session_id, turn.message_id, str(ResumeOutcome.RESUMED))
                self._decide(ResumeOutcome.RESUMED, turn, why, prompt=prompt_id, attempt=used, **more)
                return
            if used >= attempts or tries >= attempts:
                await self._ledger.finished(turn.session_id, turn.message_id, str(ResumeOutcome.GAVE_UP))
                self._decide(
                    ResumeOutcome.GAVE_UP, turn, f"{why}; {used} of --resume-attempts {attempts} spent"
                )
                return
            self._decide(ResumeOutcome.NOT_STARTED, turn, f"{why}; trying again in {self._retry_pause:g} s")
            await asyncio.sleep(self._retry_pause)
            view = await self._server.messages(turn.api, turn.session_id)
            if (person := user_message_after(view, self._server.rules(turn.api), prompt_id)) is not None:
                await self._ledger.finished(turn.session_id, turn.message_id, str(ResumeOutcome.SKIPPED))
                why = f"a person wrote ({person}) after the prompt that did not start"
                self._decide(ResumeOutcome.SKIPPED, turn, why)
                return

    async def _attempt(self, turn: InterruptedTurn, directory: str | None, prompt_id: str, text: str) -> Try:
        provider = turn.model["providerID"] if turn.model else None
        if (unready := await self._server.ready(directory, provider)) is not None:
            return Try(0, False, f"the server did not become ready: {unready}")
        await self._ledger.sending(turn.session_id, turn.message_id, prompt_id)
        try:
            await self._server.prompt(turn, directory, prompt_id, text)
        except READ_ERRORS as error:
            return Try(1, False, f"the prompt was refused: {error}")
        how = await self._server.started(turn, prompt_id)
        if how is None:
            return Try(1, False, "the prompt was admitted, but the turn did not start")
        return Try(1, True, how)

    def _decide(self, outcome: ResumeOutcome, turn: InterruptedTurn, why: str, **more: Any) -> None:
        if self._settled_by is not None:
            more["durable"] = self._settled_by
        self._journal.decided(outcome, turn.api, turn.session_id, why, message=turn.message_id, **more)
