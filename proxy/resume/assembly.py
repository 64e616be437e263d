"""Putting `--resume` together for an application: its ledger, its server, its watch."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.resume.clients import ClientStreams
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
) -> tuple[Watch, Resumer] | None:
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
    server = Server(session, UpstreamApi(session, origin), probe, origin, credentials)
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
    log.info(
        "resume is on%s: at most %d prompt(s) per interrupted turn, within %g s",
        " (dry run: nothing is sent)" if options.dry_run else "",
        options.policy.attempts,
        options.policy.within_s,
    )
    watch = Watch(resumer.consider)
    journal.running = watch.running
    return watch, resumer
