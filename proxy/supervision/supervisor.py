"""`settle-proxy run`: the proxy starts the server itself, restarts it after a crash, and never
lets it (or what it left running) outlive the proxy.

Restarts are what a terminal user needs and no more: a crash of a server that served restarts
after a short pause, exits in a row of one that did not wait longer each time (`restarts`), a
server that never answered is not restarted at all, and more restarts within a window than a cap
make the proxy give up and exit, so that whatever supervises *it* (a shell, systemd) sees the
failure. Every change of the child's state is one log line. The server runs in a session of its
own, so a terminal's Ctrl-C reaches the proxy only, which stops the server in its own order; its
output is the proxy's, each line prefixed with its program's name (`server_output`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from pathlib import Path

from proxy.supervision.process_records import ProcessRecords
from proxy.supervision.restarts import BACKOFF_S, Pause, Restarts
from proxy.supervision.server_command import LOOPBACK, ServerCommand
from proxy.supervision.server_output import STDERR, STDOUT, ServerOutput
from proxy.supervision.tool_processes import Orphan, ToolProcesses, described
from proxy.system.reaper import adopted, become_subreaper, end_groups, own_child, reap

log = logging.getLogger(__name__)

ANSWER_POLL_S = 0.1
"""How often a started server's port is tried until it takes a connection: then it answers.
Only connected, never asked anything: a request sent the instant opencode's port opens can
hang (measured on 1.18.33), and the proxy's own first requests are its look-ups, not this one."""
RESTARTS_PER_WINDOW = 5
WINDOW_S = 60.0
"""More than `RESTARTS_PER_WINDOW` restarts within `WINDOW_S` seconds is a storm: give up."""
STOP_GRACE_S = 10.0
"""How long what a server left running may take to end after SIGTERM."""
SERVER_STOP_GRACE_S = 5.0
"""How long the server may take to end after SIGTERM. Its clients' streams are cut before it is
asked, so this is the server's own clean-up time, not theirs: opencode 1.18.33 settles nothing on
SIGTERM and ends in a quarter of a second, but 2.x records each execution it interrupts for a
shutdown, which a SIGKILL would cut short. Five seconds stays well inside systemd's 90 s."""


class Restart(StrEnum):
    """When the server is started again after it exits."""

    NO = "no"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


class Orphans(StrEnum):
    """What to do with the processes of calls that were running when the server died."""

    REPORT = "report"
    TERMINATE = "terminate"


class ChildState(StrEnum):
    STARTING = "starting"
    """Started, not yet answering on its port."""
    RUNNING = "running"
    """Answering on its port."""
    BACKING_OFF = "backing off"
    STOPPED = "stopped"
    GAVE_UP = "gave up"


def describe_exit(code: int) -> str:
    """`exit status 1` or `killed by SIGKILL`, as a person reads it."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


class Supervisor:
    """Runs one server command on a loopback port until `stop()`, restarting it by `restart`."""

    def __init__(
        self,
        command: ServerCommand,
        port: int,
        restart: Restart = Restart.ON_FAILURE,
        orphans: Orphans = Orphans.REPORT,
        *,
        records: Path | None = None,
        environment: Mapping[str, str] | None = None,
        shown_password: str | None = None,
    ) -> None:
        self._command = command.listening_on(port)
        self._port = port
        self._environment = environment
        """The server's environment; None: the proxy's own."""
        self._shown_password = shown_password
        """The password the proxy gives the server, shown once in the log as 2.x shows its own."""
        self._restart = restart
        self._orphans = orphans
        self._records = records
        self.tool_processes = ToolProcesses(self._server_pid)
        """Follows the event stream (the app adds it) to tie tool processes to their calls."""
        self._process: asyncio.subprocess.Process | None = None
        self._output = ServerOutput(command.argv[0])
        self._stopping = False
        self._restarts_at: deque[float] = deque()
        self._restarts = Restarts(BACKOFF_S)
        self._answered_at: float | None = None
        """When the server of this start first answered on its port (None: not yet)."""
        self._ended_with: Pause | None = None
        """The pause decided at the last exit, or why there is none (restarts ended)."""
        self.address: str | None = None
        """Where clients reach the proxy, said when the server answers (its own port is not it)."""
        self.stopped: list[str] = []
        """What `stop()` stopped, for the proxy's shutdown line."""
        self.state = ChildState.STARTING
        self.restarts = 0
        self.last_exit: int | None = None
        self.finished = asyncio.Event()
        """Set when the proxy should stop with the server: it exited for good, or restarts gave up."""
        self.subreaper = False
        """Whether this process adopts what the server leaves behind (set once `run` starts)."""
        self.exited: list[Callable[[], None]] = []
        """Told each time the server exits, before any restart: what was known of it is of the past."""
        self._ending: asyncio.Task[None] | None = None

    @property
    def command(self) -> list[str]:
        """The server command as started, with the loopback address it was given."""
        return list(self._command)

    @property
    def program(self) -> str:
        """The server command's program, as given."""
        return self._command[0]

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    def absent(self) -> bool:
        """Whether the server is not up: being started (or started again), stopped, or given up on.
        That it cannot be reached then is the supervisor's own news, which it says itself."""
        return self.state is not ChildState.RUNNING

    async def _server_pid(self) -> int | None:
        return self.pid

    @property
    def exit_code(self) -> int:
        """What the proxy exits with once `finished`: the server's own status, 1 after giving up."""
        if self.state is ChildState.GAVE_UP or self.last_exit is None:
            return 1
        return self.last_exit if self.last_exit >= 0 else 128 - self.last_exit

    def health(self) -> dict[str, object]:
        """The child's state for `/_settle/health`."""
        return {
            "state": str(self.state),
            "pid": self.pid,
            "restarts": self.restarts,
            "last_exit": None if self.last_exit is None else describe_exit(self.last_exit),
            "restart": str(self._restart),
            "next_restart": self._next_restart().as_json(),
            "orphans": str(self._orphans),
            "command": self._command,
        }

    async def run(self) -> None:
        """Start the server, and again after each exit the policy restarts; return when done.

        With a state database, every tool process tied to its call is recorded there, so that
        `settle-proxy orphans` can still name it after the proxy itself is gone.
        """
        self.subreaper = become_subreaper()
        if self._shown_password is not None:
            # The one secret the proxy logs, on purpose: 2.x prints the one it makes the same way.
            log.info("server password %s", self._shown_password)
        if self._records is None:
            await self._supervise()
            return
        async with ProcessRecords.open(self._records) as records:
            self.tool_processes.recorder = records
            try:
                await self._supervise()
            finally:
                await self.tool_processes.flush()
                self.tool_processes.recorder = None

    async def _supervise(self) -> None:
        while not self._stopping:
            code = await self._run_once()
            answered_for = self._answered_for()
            for told in self.exited:
                told()
            if self._stopping:
                break
            self.last_exit = code
            self._account_for_orphans()
            pause = self._restarts.exited(answered_for)
            if (ending := self._no_restart(code, pause)) is not None:
                self._end(*ending)
                break
            assert pause.seconds is not None
            self._ended_with = pause
            self._set(
                ChildState.BACKING_OFF,
                f"server {describe_exit(code)}; restarting in {pause.seconds:g} s: {pause.why}",
            )
            await asyncio.sleep(pause.seconds)
            self.restarts += 1
        self.finished.set()

    def _no_restart(self, code: int, pause: Pause) -> tuple[ChildState, str] | None:
        """Why the server that exited with `code` is not started again, if it is not."""
        exited = f"server {describe_exit(code)}"
        if not self._restarts_after(code):
            return ChildState.STOPPED, f"{exited}; not restarted (--restart {self._restart})"
        if pause.seconds is None:
            return (
                ChildState.GAVE_UP,
                f"{exited} before it ever answered on its port: a failed start, not a crash, so it "
                f"is not restarted (run `{shlex.join(self._command)}` by itself to see why)",
            )
        if self._storm():
            return (
                ChildState.GAVE_UP,
                f"{exited}; {RESTARTS_PER_WINDOW} restarts within {WINDOW_S:g} s already, giving up",
            )
        return None

    def _end(self, state: ChildState, message: str) -> None:
        self._ended_with = Pause(None, message)
        self._set(state, message)

    def _answered_for(self) -> float | None:
        """How long the server of this start has answered (None: it has not)."""
        return None if self._answered_at is None else time.monotonic() - self._answered_at

    def _next_restart(self) -> Pause:
        """What the next restart waits and why: decided, while the server is down; else what an
        exit now would earn."""
        down = self.state in (ChildState.BACKING_OFF, ChildState.STOPPED, ChildState.GAVE_UP)
        if down and self._ended_with is not None:
            return self._ended_with
        if self._restart is Restart.NO:
            return Pause(None, "not restarted (--restart no)")
        pause = self._restarts.preview(self._answered_for())
        return Pause(pause.seconds, f"if it exited now: {pause.why}")

    async def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after `SERVER_STOP_GRACE_S`) and what it left
        running (SIGTERM, then SIGKILL after `STOP_GRACE_S`); `stopped` says what was."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            began = time.monotonic()
            log.info("stopping the server, pid %d: SIGTERM", process.pid)
            process.terminate()
            how = "SIGTERM"
            try:
                await asyncio.wait_for(process.wait(), SERVER_STOP_GRACE_S)
            except TimeoutError:
                log.warning(
                    "server pid %d did not stop within %g s: SIGKILL", process.pid, SERVER_STOP_GRACE_S
                )
                process.kill()
                await process.wait()
                how = f"SIGKILL after {SERVER_STOP_GRACE_S:g} s"
            self.stopped.append(f"the server (pid {process.pid}, {how}, {time.monotonic() - began:.1f} s)")
            self._end(ChildState.STOPPED, "server stopped with the proxy")
        if self._ending is not None:
            await self._ending
        if self.subreaper and (left := adopted()):
            log.info("ending %d process(es) the server left running: pids %s", len(left), left)
            await asyncio.to_thread(end_groups, left, STOP_GRACE_S)
            self.stopped.append(f"{len(left)} process(es) it left running")
        self._output.close()

    def kill_now(self) -> None:
        """Stop at once (a second Ctrl-C): SIGKILL the server's process group and what it left
        running, without their grace."""
        if (pid := self.pid) is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its own session: the group is the server's
        if self.subreaper:
            end_groups(adopted(), 0)

    async def _run_once(self) -> int:
        self._answered_at = None
        self._set(ChildState.STARTING, f"starting {shlex.join(self._command)}")
        out, err = self._output.pipe(STDOUT), self._output.pipe(STDERR)
        try:
            with own_child() as keep:
                self._process = process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "proxy.system.die_with_parent",
                    str(os.getpid()),
                    *self._command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=self._environment,
                    start_new_session=True,  # a terminal's Ctrl-C is the proxy's to act on
                )
                keep(process.pid)
        finally:
            os.close(out)
            os.close(err)
        answering = asyncio.create_task(self._until_answering(process.pid))
        try:
            return await process.wait()
        finally:
            answering.cancel()

    async def _until_answering(self, pid: int) -> None:
        """Try the server's port until it takes a connection."""
        while not await self._answers():  # noqa: ASYNC110 - nothing to wait on but the server itself
            await asyncio.sleep(ANSWER_POLL_S)
        self._answered_at = time.monotonic()
        self._restarts.answered_ever = True
        clients = f" (its own port, for the proxy only: clients use {self.address})" if self.address else ""
        self._set(ChildState.RUNNING, f"server answering, pid {pid}, on {LOOPBACK}:{self._port}{clients}")

    async def _answers(self) -> bool:
        try:
            async with asyncio.timeout(ANSWER_POLL_S * 10):
                _, writer = await asyncio.open_connection(LOOPBACK, self._port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True

    def _restarts_after(self, code: int) -> bool:
        return self._restart is Restart.ALWAYS or (self._restart is Restart.ON_FAILURE and code != 0)

    def _storm(self) -> bool:
        now = time.monotonic()
        while self._restarts_at and now - self._restarts_at[0] > WINDOW_S:
            self._restarts_at.popleft()
        if len(self._restarts_at) >= RESTARTS_PER_WINDOW:
            return True
        self._restarts_at.append(now)
        return False

    def orphans(self) -> list[Orphan]:
        """The processes dead servers left that still run, with the calls that started them."""
        if not self.subreaper:
            return []
        reap(adopted())
        return self.tool_processes.orphans(adopted())

    def _account_for_orphans(self) -> None:
        """One log line per process a dead server left running, when first found, then only their
        count; with `--orphans terminate`, the
        process groups of calls that were running at the crash are ended (SIGTERM, then SIGKILL).
        A process of a call that had completed (a server started on purpose), or that cannot be
        tied to a call, is only reported."""
        found = self.orphans()
        first_found = self.tool_processes.first_found(found)
        for orphan in first_found:
            log.warning("orphaned process %s", described(orphan), extra={"fields": orphan.as_json()})
        new = {orphan.pid for orphan in first_found}
        if earlier := [orphan.pid for orphan in found if orphan.pid not in new]:
            log.info(
                "%d orphaned process(es) found at an earlier exit still run: pids %s (/_settle/orphans)",
                len(earlier),
                earlier,
            )
        doomed = [orphan.pid for orphan in found if orphan.call_was_running]
        if self._orphans is Orphans.TERMINATE and doomed:
            log.warning("ending the process groups of %d orphaned call(s): pids %s", len(doomed), doomed)
            self._ending = asyncio.create_task(asyncio.to_thread(end_groups, doomed, STOP_GRACE_S))

    def _set(self, state: ChildState, message: str) -> None:
        self.state = state
        log.log(
            logging.WARNING if state in (ChildState.BACKING_OFF, ChildState.GAVE_UP) else logging.INFO,
            message,
        )


async def supervised(
    supervisor: Supervisor, stop: asyncio.Event, stop_serving: Callable[[], Awaitable[None]]
) -> int:
    """Run the server until `stop` is set or the server is gone for good; the proxy's exit code.
    The proxy stops serving (`stop_serving`) before the server is stopped, so that the clients'
    streams are cut as a crash cuts them, and the server's own clean end of them never reaches one."""
    running = asyncio.create_task(supervisor.run(), name="supervisor")
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait((running, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        running.cancel()  # a pause before a restart must not hold up the stop
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await stop_serving()
        await supervisor.stop()
    return 0 if stop.is_set() else supervisor.exit_code
