"""The calls 2.x's `/api/event` showed open, confirmed orphaned and told, for the live-settle addon.

2.x settles a call a crash left open only when the session's next drain starts; until then a
client of `/api/event` that saw `session.tool.called` shows it running, and the session's
execution as never ended. So when the stream comes back after a loss, or an execution ends while
one of its calls is open, the proxy waits the grace period, reads each message afresh, takes a
reading after that read, and if the session is inactive tells every client of `/api/event` what
2.x would have said: `session.tool.failed` per call, in the shape 2.x's own settle gives it
(`rules.runtime_2x`), then `session.execution.interrupted` with reason `shutdown` (2.x ends an
execution with one of `succeeded`, `failed`, `interrupted`; `shutdown` is the server going away,
and the only one for which 2.x's projection appends no `idle` message the server would not hold).
News of the session withdraws a confirmation under way (`confirmations`), and the state is replayed
to streams that open later until the stream says anything newer of the session (`clients`),
as for 1.18's parts (`parts`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from proxy.addons.context import SettleContext
from proxy.addons.live.clients import ClientStreams, Telling
from proxy.addons.live.confirmations import (
    Asked,
    Confirmer,
    Judgement,
    StillHeld,
    Told,
    Words,
    read_messages,
    said,
)
from proxy.addons.live.held import Holds
from proxy.addons.live.memory import OpenCall, Place, StreamMemory
from proxy.opencode.events_2x import api_execution_interrupted, api_tool_failed
from proxy.opencode.liveness import LivenessUnknown
from proxy.opencode.server_line import ServerLine
from proxy.opencode.sessions import CallClosed, CallOpened, SessionIdle
from proxy.opencode.tracker import FollowedEvent
from proxy.opencode.vocabulary import is_open_tool
from rules import Api, Liveness, Runtime, settle_view

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallsRead:
    """The session's open calls, their messages as read afresh, and a reading taken after."""

    calls: list[OpenCall]
    messages: dict[str, Any]
    liveness: Liveness
    rules: Runtime[Any]
    """The shape the server's dialect settles its calls in."""


class OpenCalls:
    """One confirmation at a time per session, of the 2.x calls the stream last showed open;
    read and settled as the dialect of the server `server` says it is."""

    words: ClassVar[Words] = Words("live-settle", "open calls", "open calls", "live settle", Api.V2, log)

    def __init__(
        self, ctx: SettleContext, memory: StreamMemory, clients: ClientStreams, server: ServerLine
    ) -> None:
        self._ctx = ctx
        self._clients = clients
        self._server = server
        self._open = memory.calls
        self._confirmer = Confirmer(ctx, self)
        self.tasks = self._confirmer.tasks

    def following(self) -> None:
        for session_id in dict.fromkeys(call.session_id for call in self._open.values()):
            self._confirmer.schedule(session_id)

    def heard(self, event: FollowedEvent) -> None:
        """Withdraw on news; remember what opens and ends a call; an execution that ended with a
        call open is confirmed."""
        if not event.line_2x or event.session_id is None:
            return
        self._confirmer.heard(event)
        for change in event.transitions:
            match change:
                case CallOpened(session_id, call_id, message_id, key, directory, line_2x=True):
                    self._open[call_id] = OpenCall(session_id, message_id, call_id, key, directory)
                case CallClosed(_, call_id, line_2x=True):
                    self._open.pop(call_id, None)
                case SessionIdle(session_id) if self._calls(session_id):
                    self._confirmer.schedule(session_id)

    def _calls(self, session_id: str) -> list[OpenCall]:
        return [call for call in self._open.values() if call.session_id == session_id]

    def judge(self, session_id: str, reading: CallsRead, asked: Asked) -> Judgement:
        """Each call the rules settled told, then the execution's end; the calls held back kept."""
        holds = self._holds(reading)
        judgement = Judgement()
        open_calls = [call for call in reading.calls if call.call_id not in holds.calls]
        events = [self._settle(call, reading, judgement) for call in open_calls]
        if settled := [event for event in events if event is not None]:
            call = reading.calls[-1]
            place = Place(session_id, call.message_id, call.directory, None)
            ended = api_execution_interrupted(session_id, settled[-1]["created"], call.directory)
            telling = Telling(place, [ended], line_2x=True)
            judgement.told.append(
                Told(None, publish=partial(self._clients.publish, f"execution {session_id}", telling))
            )
        if held := holds.calls & {call.call_id for call in reading.calls}:
            judgement.held.append(
                StillHeld(holds, lambda: any(call.call_id in held for call in self._calls(session_id)))
            )
        return judgement

    def _holds(self, reading: CallsRead) -> Holds:
        """What held back the calls a reading left open that a later one may settle: they stay
        remembered, to be confirmed again."""

        def settles(liveness: Liveness) -> set[str]:
            views = (
                settle_view(message, Api.V2, liveness, single=True, runtime=reading.rules)
                for message in reading.messages.values()
            )
            return set().union(*(_changed(view) for view in views))

        return Holds.of(settles, reading.liveness)

    async def read(self, session_id: str, asked: Asked) -> CallsRead | None:
        """The session's open calls, their messages read afresh, and a reading taken after them;
        None when there is nothing to confirm, or the server's line serves no `/api` views. A
        server that cannot say which it is is a failed try, asked again."""
        if not (calls := self._calls(session_id)):
            return None
        if (known := await self._server.known(asked.credentials)) is None:
            raise LivenessUnknown(f"the upstream's opencode server is not known: {self._server.why_unknown}")
        if (http := known.dialect.runtime(Api.V2)) is None:
            return None
        ids = (call.message_id for call in calls)
        messages = await read_messages(
            self._ctx, asked, partial(http.messages_path, session_id), ids, self._gone
        )
        liveness = await self._ctx.probe.read(Api.V2, session_id, asked.credentials)
        return CallsRead(calls, messages, liveness, http.rules)

    def _gone(self, message_id: str) -> None:
        for call in [call for call in self._open.values() if call.message_id == message_id]:
            del self._open[call.call_id]

    def _settle(self, call: OpenCall, reading: CallsRead, judgement: Judgement) -> dict[str, Any] | None:
        """Tell the clients a call the rules settled (or say the server did, unseen); the event told."""
        if (message := reading.messages.get(call.message_id)) is None:
            return None
        view = settle_view(message, Api.V2, reading.liveness, single=True, runtime=reading.rules)
        document = view.document if view is not None else message
        content = document.get("data", {}).get("content", []) if isinstance(document, dict) else []
        item = next((i for i in content if isinstance(i, dict) and i.get("id") == call.call_id), None)
        self._open.pop(call.call_id, None)
        if item is None or is_open_tool(item, Api.V2) or not isinstance(item["state"].get("error"), dict):
            return None
        fields: dict[str, Any] = {
            "session": call.session_id,
            "message": call.message_id,
            "call": call.call_id,
        }
        if call.call_id not in _changed(view):
            # The server holds the call settled itself: it published that (`durable`), and its view
            # and log say it to any client that reads them; a copy would only repeat it.
            line = (
                f"call {call.call_id} of {call.session_id}: the server settled it itself; "
                "not repeated to clients"
            )
            judgement.told.append(Told((line, line), fields | {"decision": "settled by the server"}))
            return None
        event = api_tool_failed(
            call.session_id, call.message_id, item, key=call.key, directory=call.directory
        )
        fields |= {
            "tool": item.get("name"),
            "rule": "orphaned-tool",
            "api": str(Api.V2),
            "why": "open when the server went away; inactive in two readings",
        }
        place = Place(call.session_id, call.message_id, call.directory, None)
        publish = partial(self._clients.publish, call.call_id, Telling(place, [event], line_2x=True))
        judgement.told.append(
            Told(said("settled", "would settle", "orphaned call in client streams"), fields, publish)
        )
        return event


def _changed(view: Any) -> set[str]:
    """The items a settled view changed (none for no view)."""
    return set() if view is None else {str(change.target.part) for change in view.changes}
