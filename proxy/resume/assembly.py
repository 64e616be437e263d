"""Putting `--resume` together for an application: its ledger, its server, its watch."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.relay.tasks import Together
from proxy.resume.clients import ClientStreams
from proxy.resume.continuing import SETTLED_BY_2X, Continuation
from proxy.resume.journal import Journal
from proxy.resume.ledger import Ledger
from proxy.resume.resumer import Fates, ResumeOptions, Resumer, no_fates
from proxy.resume.sending import Server
from proxy.resume.watch import Watch
from proxy.writeback.scheduler import Writer

__all__ = ["resuming"]

log = logging.getLogger(__name__)


async def resuming(
    stack: AsyncExitStack,
    *,
    session: aiohttp.ClientSession,
    origin: URL,
    probe: LivenessProbe,
    writer: Writer | None,
    credentials: Credentials,
    state_db: Path | None,
    journal: Journal,
    options: ResumeOptions,
    fates: Fates = no_fates,
    clients: ClientStreams | None = None,
) -> tuple[Watch, Together] | None:
    """The watch to add to the tracker's listeners and the resumer it feeds (closed with `stack`),
    or None, said once in the log, when no ledger can be kept: without the durable record of
    each resume, nothing is resumed."""
    if state_db is None:
        log.warning("--resume is off: there is no state database to record resumes in")
        return None
    try:
        ledger = await stack.enter_async_context(Ledger.open(state_db))
    except (OSError, sqlite3.Error) as error:
        log.warning("--resume is off: the state database %s cannot be used: %s", state_db, error)
        return None
    api = UpstreamApi(session, origin)

    def resumer_of(server: Server, writer: Writer | None, options: ResumeOptions) -> Resumer:
        resumer = Resumer(
            server,
            probe,
            writer=writer,
            ledger=ledger,
            journal=journal,
            options=options,
            credentials=credentials,
            fates=fates,
            clients=clients,
        )
        stack.push_async_callback(resumer.tasks.close)
        return resumer

    resumer = resumer_of(Server(session, api, probe, origin, credentials), writer, options)
    # 2.x settles the calls itself when the continuation's drain starts: no writer, and it says so.
    continuation = Continuation(session, api, probe, origin, credentials)
    continuing = resumer_of(continuation, None, dataclasses.replace(options, settled_by=SETTLED_BY_2X))
    log.info(
        "resume is on%s: at most %d prompt(s) per interrupted turn, within %g s",
        " (dry run: nothing is sent)" if options.dry_run else "",
        options.policy.attempts,
        options.policy.within_s,
    )
    watch = Watch(lambda candidate: (continuing if candidate.on_2x else resumer).consider(candidate))
    journal.running = watch.running
    return watch, Together(resumer.tasks, continuing.tasks)
