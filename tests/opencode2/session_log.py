"""`GET /api/experimental/session/{id}/log` of opencode 2.x: a session's durable event log, read once.

`session.log` (`packages/protocol/src/groups/session.ts` @01fd0c8548b2 and @2092350cf): SSE, one
`data:` line per durable event after the exclusive `after` (framed as on `/api/event`, with
`durable: {aggregateID, seq, version}`, `schema/src/event.ts` `durable()` @162a75f99cc1), then one
marker `{type, aggregateID, seq?}`: `log.synced` (`EventLog.Synced`, `packages/schema/src/event-log.ts`
@2092350cf), named `log.caught_up` (`EventLog.CaughtUp`, same file @2d6e2bb6e224) later; `seq` is
absent when the log holds nothing at or before the read position. An unknown session is 404
`SessionNotFoundError` (measured on @2092350cf).

Variants (`Process.session_log`): `Log.HEAD`, what 2.1.2 answers (measured: its `event` table stays
empty while `event_sequence` counts, so even `after=0` gives back only the marker, with the head's
`seq`: `{"type":"log.synced","aggregateID":"ses_…","seq":11}`); `Log.MARKER`, what the `v2` build
@2092350cf answers (measured: the marker alone, with no `seq`); `Log.EVENTS`, the durable events the
stand-in published, then the marker, as the source says a log answers (no build measured did);
`Log.ABSENT`, no such route (the router's empty 404), as a build older than the route would.
"""

from __future__ import annotations

import enum

from aiohttp import web

from tests.opencode2.events import frame
from tests.opencode2.shapes import Json, dumps, session_not_found


class Log(enum.Enum):
    HEAD = "head"
    MARKER = "marker"
    EVENTS = "events"
    ABSENT = "absent"


MARKER = "log.synced"


def durable_after(published: list[Json], session_id: str, after: int) -> list[Json]:
    """The session's durable events after `after`, in log order."""
    return [
        event
        for event in published
        if (durable := event.get("durable"))
        and durable["aggregateID"] == session_id
        and durable["seq"] > after
    ]


async def serve(
    request: web.Request,
    variant: Log,
    sessions: dict[str, Json],
    published: list[Json],
    sequences: dict[str, int],
) -> web.StreamResponse:
    """One finite read (`follow=false`): the events after `after`, then the marker; `sequences` is
    each session's head, kept across restarts as 2.1.2's `event_sequence` is."""
    session_id = request.match_info["session"]
    if session_id not in sessions:
        return web.json_response(dumps=dumps, data=session_not_found(session_id), status=404)
    try:
        after = int(request.query.get("after", "-1"))
    except ValueError:
        return web.json_response(dumps=dumps, data={"_tag": "BadRequest", "message": "after"}, status=400)
    events = durable_after(published, session_id, after) if variant is Log.EVENTS else []
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(frame(event))
    marker: Json = {"type": MARKER, "aggregateID": session_id}
    if variant is Log.EVENTS and (held := durable_after(published, session_id, -1)):
        marker["seq"] = held[-1]["durable"]["seq"]
    if variant is Log.HEAD and session_id in sequences:
        marker["seq"] = sequences[session_id]
    await response.write(frame(marker))
    await response.write_eof()
    return response
