"""The 2.x stand-in as a process, started as 2.x is: `python tests/opencode2/serve.py serve --port P
--hostname H --database FILE`, for tests that kill it (SIGKILL) or run it under `settle-proxy run`.

As plain `opencode serve` (`packages/cli/src/server-process.ts` `processEffect` @05647a255acf): the
password is `OPENCODE_PASSWORD`, else `OPENCODE_SERVER_PASSWORD` (`packages/cli/src/env.ts` @2da05b6f39bf),
else a new random one printed as `server password <pw>`; then `server listening on <url>`. Without
`--port` it takes the first free port from 4096 up (`packages/server/src/process.ts` `listen`
@02ce4a330f33). The database file keeps sessions and messages across kills; nothing is settled at
start. `--from-source` answers as the `v2` branch built from source @2092350c does (version
`local`, only `/api/health`, no `/form`); `--compress` gzips what a client accepts gzipped, `/api/event` too.
`--boot-seconds` answers 503 that long first; `--seed FILE` adds, on a fresh database, one
session with a running `shell` call, writes its ids to FILE as JSON, and shows its execution to
the first `/api/event` subscriber (as the live server that ran it would have); with `--run-tool`
the call's command (`sleep 600`) then runs in a real process, as 2.x's `shell` tool runs one
(`packages/core/src/shell.ts` `Shell.create` @9e3d245ca256: `ChildProcess.make(shell,
ShellSelect.args(shell, command), {detached, stdin: "ignore"})`, the args `["-c", command]` of
`shell/select.ts` @27004baa8387), whose pid goes into FILE with `.pid` added.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import orjson

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.opencode2.shapes import earlier
from tests.opencode2.stand_in import DEFAULT_VERSION, FROM_SOURCE, RunningCall, StandIn


def _options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="opencode")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("--port", type=int)
    serve.add_argument("--hostname", default="127.0.0.1")
    serve.add_argument("--database", type=Path, required=True)
    serve.add_argument("--version", dest="server_version", default=DEFAULT_VERSION)
    serve.add_argument("--health-route", choices=("info", "health"), default="info")
    serve.add_argument("--web-fallback", action="store_true")
    serve.add_argument("--compress", action="store_true")
    serve.add_argument("--from-source", action="store_true", help="as the v2 branch built @2092350c")
    serve.add_argument("--boot-seconds", type=float, default=0.0)
    serve.add_argument("--seed", type=Path)
    serve.add_argument("--run-tool", action="store_true")
    return parser.parse_args(argv)


def _environment_password() -> str | None:
    return os.environ.get("OPENCODE_PASSWORD") or os.environ.get("OPENCODE_SERVER_PASSWORD") or None


async def _listen(server: StandIn, port: int | None) -> None:
    """`--port`, or the first free port from 4096 up."""
    candidates = [port] if port is not None else range(4096, 65536)
    for candidate in candidates:
        server.process.port = candidate
        try:
            await server.start()
        except OSError:
            if port is not None:
                raise
            continue
        return


TOOL_COMMAND = "sleep 600"
"""The seeded call's command when it runs in a process (`--run-tool`)."""


def _seed(server: StandIn, path: Path, *, run_tool: bool) -> RunningCall:
    session = server.add_session()
    tool_input = {"command": TOOL_COMMAND} if run_tool else None
    call = server.add_running_call(session, tool_input=tool_input, active=False)
    earlier(server.messages(session), 60_000)  # started a minute ago: past any freshness margin
    server.save()
    path.write_bytes(orjson.dumps(dataclasses.asdict(call)))
    return call


async def _announce(server: StandIn, call: RunningCall, tool: Path | None) -> None:
    """Show the seeded call's execution to the first stream that subscribes, as a live server shows
    the call it runs (`session.execution.started`, `session.tool.called`), so that a follower of
    `/api/event` knows it was running when this process is killed. With `tool` (where its pid
    goes), the call then runs its command in a process of its own, as 2.x's `shell` tool does:
    its input began (`session.tool.input.started`, the one event that names the tool), it is
    called with its whole input, and the shell runs the command, detached."""
    await server.wait_for_subscribers(1)
    server.publish("session.execution.started", {"sessionID": call.session_id})
    data = {"sessionID": call.session_id, "assistantMessageID": call.message_id, "id": call.call_id}
    if tool is None:
        server.publish("session.tool.called", data | {"name": "shell", "input": {}, "executed": False})
        return
    server.publish("session.tool.input.started", data | {"name": "shell"})
    server.publish("session.tool.called", data | {"input": {"command": TOOL_COMMAND}, "executed": False})
    _run_tool(tool)


def _run_tool(pid_file: Path) -> None:
    """The shell runs the command in a session of its own (node's `detached`): the server's death
    leaves it running. Not waited for: the server is killed while it runs."""
    process = subprocess.Popen(
        ["/bin/sh", "-c", TOOL_COMMAND],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pid_file.write_text(str(process.pid))


async def serve(options: argparse.Namespace) -> None:
    if options.hostname != "127.0.0.1":
        sys.exit(f"the stand-in listens on 127.0.0.1 only, not {options.hostname}")
    password = _environment_password()
    fresh = not options.database.exists()
    version, route = options.server_version, options.health_route
    if options.from_source:  # `StandIn.from_source`
        version, route = FROM_SOURCE, "health"
    server = StandIn(
        version,
        password=password,
        health_route=route,
        form_route=not options.from_source,
        web_fallback=options.web_fallback,
        compress=options.compress,
        booting=options.boot_seconds > 0,
        database=options.database,
    )
    announcing = None
    if options.seed is not None and fresh:
        call = _seed(server, options.seed, run_tool=options.run_tool)
        tool = options.seed.with_name(options.seed.name + ".pid") if options.run_tool else None
        announcing = asyncio.create_task(_announce(server, call, tool))
    await _listen(server, options.port)
    print(f"server listening on {server.url}", flush=True)
    if password is None:
        print(f"server password {server.password}", flush=True)
    if options.boot_seconds > 0:
        asyncio.get_running_loop().call_later(options.boot_seconds, server.set_booting, False)
    try:
        await asyncio.Event().wait()
    finally:
        if announcing is not None:
            announcing.cancel()
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(_options(argv)))


if __name__ == "__main__":
    main()
