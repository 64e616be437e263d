"""The paths a request can take to the fake upstream: the registry of benchmark targets.

Each target is a starter: given the upstream and a place for its files, it starts whatever
sits in between (pinned to the intermediary's cores), registers its stop on the ExitStack, and
returns where clients should connect. To compare another intermediary, write one more starter
and add it to TARGETS; the runner, report and plot pick it up by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import grp
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench import procs, shapes
from bench.procs import Cpus, PeakRss

DEFAULT_PROXY_CMD = "{python} -m proxy --upstream {upstream} --port {port}"
# The mitmproxy release this target was tested with. Its own virtualenv holds it, with what
# the addon's `rules` import needs, so it never meets the project's dependencies.
MITMPROXY_VERSION = "11.0.2"
MITM_REQUIREMENTS = (f"mitmproxy=={MITMPROXY_VERSION}", "pydantic>=2.6", "orjson>=3.9", "msgspec>=0.18")
MITM_VENV = Path("bench") / ".mitm-venv"
MITM_ADDON = Path("bench") / "mitm_settle.py"
MITM_INSTALL_TIMEOUT_S = 900


class TargetUnavailable(RuntimeError):
    """The target cannot run here; the benchmark goes on without its column."""


@dataclass(frozen=True, slots=True)
class TargetContext:
    upstream_url: str
    repo: Path
    workdir: Path
    cpus: Cpus | None
    proxy_cmd: str


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where clients connect; `memory` tracks the intermediary, None when there is none.

    `rewrites` says the target is expected to settle stale message lists, which the runner
    checks before measuring, so a number is never reported for a path that did not do the work.
    """

    name: str
    base_url: str
    memory: PeakRss | None = None
    rewrites: bool = False


TargetStarter = Callable[[TargetContext, ExitStack], Endpoint]


def start_direct(ctx: TargetContext, stack: ExitStack) -> Endpoint:
    """No intermediary: the baseline every ratio is taken against."""
    return Endpoint("direct", ctx.upstream_url)


def start_proxy(ctx: TargetContext, stack: ExitStack) -> Endpoint:
    """settle-proxy, started from the repository root as `python -m proxy` (or --proxy-cmd)."""
    port = procs.free_port()
    command = ctx.proxy_cmd.format(python=shlex.quote(sys.executable), upstream=ctx.upstream_url, port=port)
    argv = procs.pinned(shlex.split(command), ctx.cpus)
    endpoint = _serve(stack, "proxy", argv, ctx, port, rewrites=True)
    _await_event_liveness(endpoint.base_url)
    return endpoint


def start_relay(ctx: TargetContext, stack: ExitStack) -> Endpoint:
    """The proxy's own stack with no addons (`bench/bare_relay.py`): the floor the proxy's figures
    are read against, as direct is the floor of every hop's."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "bench.bare_relay", "--upstream", ctx.upstream_url, "--port", str(port)]
    return _serve(stack, "relay", procs.pinned(argv, ctx.cpus), ctx, port)


def _await_event_liveness(base_url: str) -> None:
    """Measure the steady state: the proxy follows the upstream's events before the first request."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(base_url + "/_settle/health", timeout=5) as answer,
        ):
            if json.loads(answer.read())["liveness"]["source"] == "events":
                return
        time.sleep(0.1)
    raise TargetUnavailable(
        "the proxy never followed /global/event; its figures would include liveness look-ups"
    )


def start_nginx(ctx: TargetContext, stack: ExitStack) -> Endpoint:
    """nginx as a plain, well-tuned reverse proxy: the reference for what a hop costs."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if nginx is None:
        raise TargetUnavailable(
            "nginx is not installed (Debian: apt-get install -y nginx); skipping its column"
        )
    port = procs.free_port()
    home = ctx.workdir / "nginx"
    home.mkdir(exist_ok=True)
    conf = home / "nginx.conf"
    conf.write_text(nginx_config(home, port, ctx.upstream_url.removeprefix("http://")))
    argv = procs.pinned([nginx, "-p", str(home), "-e", str(home / "error.log"), "-c", str(conf)], ctx.cpus)
    return _serve(stack, "nginx", argv, ctx, port, rewrites=False)


def nginx_config(home: Path, port: int, upstream: str) -> str:
    """One worker (like the single-process proxy), keepalive HTTP/1.1 upstream, no buffering.

    Buffering is off everywhere, not only for SSE: settle-proxy streams what it does not
    rewrite, so nginx spooling a 100 MB body to a temp file would not be the same job. With
    buffering off nginx relays through one `proxy_buffer_size` buffer, whose 4 KB default
    made it 5-8x slower on message lists here than 64 KB or more; 256 KB is a tuned nginx.
    `user` keeps the worker as the current user even when started as root.
    """
    group = grp.getgrgid(os.getgid()).gr_name
    return f"""daemon off;
master_process on;
worker_processes 1;
user {getpass.getuser()} {group};
pid {home}/nginx.pid;
error_log {home}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {home}/client_body;
    proxy_temp_path {home}/proxy_temp;
    fastcgi_temp_path {home}/fastcgi_temp;
    uwsgi_temp_path {home}/uwsgi_temp;
    scgi_temp_path {home}/scgi_temp;
    upstream opencode {{
        server {upstream};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://opencode;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_buffer_size 256k;
            proxy_buffers 8 256k;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"""


def start_mitmproxy(ctx: TargetContext, stack: ExitStack) -> Endpoint:
    """mitmproxy in reverse mode with the settle rule as an addon: what a user would write instead.

    mitmdump runs from a private virtualenv (created on first use, see `mitm_environment`) with
    `bench/mitm_settle.py`, which settles stale lists like the proxy does, so the runner checks
    it as a rewriting target. Its CA and settings go to the run's work directory, not ~/.mitmproxy.
    """
    mitmdump = mitm_environment(ctx.repo / MITM_VENV)
    port = procs.free_port()
    argv = [
        str(mitmdump),
        "--mode",
        f"reverse:{ctx.upstream_url}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        str(port),
        "-q",
        "--set",
        "flow_detail=0",
        "--set",
        f"confdir={ctx.workdir / 'mitmproxy'}",
        "-s",
        str(ctx.repo / MITM_ADDON),
    ]
    return _serve(stack, "mitmproxy", procs.pinned(argv, ctx.cpus), ctx, port, rewrites=True)


def mitm_environment(venv: Path) -> Path:
    """The `mitmdump` of a virtualenv holding MITM_REQUIREMENTS, created or rebuilt when needed.

    A stamp file written after a successful install records what it holds and for which
    Python; without it (a first run, an interrupted install) or when it differs (a new pin,
    another interpreter) the virtualenv is built again from scratch. Raises TargetUnavailable,
    so the run goes on without the column, when it cannot be built.
    """
    mitmdump = venv / "bin" / "mitmdump"
    stamp = venv / "bench-requirements.txt"
    wanted = "\n".join([f"# {sys.executable} {sys.version.split()[0]}", *MITM_REQUIREMENTS]) + "\n"
    with _locked(venv.with_name(venv.name + ".lock")):
        if mitmdump.exists() and stamp.exists() and stamp.read_text() == wanted:
            return mitmdump
        shutil.rmtree(venv, ignore_errors=True)
        print(f"installing {' '.join(MITM_REQUIREMENTS)} into {venv} (first run only)", file=sys.stderr)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
        for argv in (
            [sys.executable, "-m", "venv", str(venv)],
            [*pip, "--quiet", "--retries", "1", "--timeout", "30", *MITM_REQUIREMENTS],
        ):
            _install_step(argv, venv)
        stamp.write_text(wanted)
    return mitmdump


def _install_step(argv: list[str], venv: Path) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=MITM_INSTALL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        shutil.rmtree(venv, ignore_errors=True)
        raise TargetUnavailable(
            f"could not install mitmproxy into {venv}: {error}; skipping its column"
        ) from error
    if done.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise TargetUnavailable(
            f"could not install mitmproxy into {venv} ({argv[2]} exited {done.returncode}); "
            f"skipping its column\n{output}"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive for the block, across processes: two runs never build one virtualenv at once."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _serve(
    stack: ExitStack, name: str, argv: list[str], ctx: TargetContext, port: int, *, rewrites: bool = False
) -> Endpoint:
    service = procs.start(stack, name, argv, ctx.workdir / f"{name}.log", cwd=ctx.repo)
    base_url = f"http://127.0.0.1:{port}"
    try:
        service.wait_http(base_url + shapes.CONFIG_PATH)
    except procs.StartupError as error:
        service.stop()
        raise TargetUnavailable(str(error)) from error
    return Endpoint(name, base_url, PeakRss(service.pid), rewrites)


TARGETS: dict[str, TargetStarter] = {
    "direct": start_direct,
    "relay": start_relay,
    "proxy": start_proxy,
    "nginx": start_nginx,
    "mitmproxy": start_mitmproxy,
}
