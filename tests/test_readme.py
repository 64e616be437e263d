"""The README's and the docs' commands and examples are true: every block a test can run, runs.

Each `settle-proxy` line of a ```sh block is parsed by the real parser of its command, each
`curl` names a route the proxy serves, each path a command names exists, each ```python block
runs, and each ```json block parses. A ```sh block followed by the ```text it prints is a
transcript of a failure; `tests/test_docs.py` runs those.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import tomllib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from yarl import URL

from proxy import Settings
from proxy.cli import run as run_command
from proxy.cli.commands import PARSERS
from proxy.demo.lines import Call, Line1x
from proxy.demo.report import report
from proxy.demo.scene import Installed, Outcome, Seen
from proxy.service.app import create_app
from proxy.supervision.server_command import free_loopback_port
from tests.fixtures import load
from tests.proxy.fake_opencode import FakeOpencode

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
PAGES = {"README.md": README} | {
    f"docs/{page.name}": page.read_text() for page in sorted((ROOT / "docs").glob("*.md"))
}
"""Every page a user reads: the README and the docs."""

_BLOCK = re.compile(r"```(\w*)\n(.*?)```\n?", flags=re.DOTALL)
EXTERNAL = {"opencode", "caddy", "tailscale", "cp", "systemctl", "mkdocs"}
"""Programs a block may name that are not this project's: their paths are checked, they are not run."""


def blocks(language: str, text: str = README) -> list[str]:
    return [body for lang, body in _BLOCK.findall(text) if lang == language]


def commands() -> Iterator[tuple[str, str]]:
    """(page, command line) of every ```sh block that is not a transcript of a failure, each
    `&&`-joined command on its own, comments dropped."""
    for name, text in PAGES.items():
        found = list(_BLOCK.finditer(text))
        for index, block in enumerate(found):
            if block.group(1) != "sh":
                continue
            following = found[index + 1] if index + 1 < len(found) else None
            if (
                following is not None
                and following.group(1) == "text"
                and following.start() == block.end() + 1
            ):
                continue  # a transcript: tests/test_docs.py
            for line in block.group(2).splitlines():
                for command in line.split("#", 1)[0].split("&&"):
                    if command.strip():
                        yield name, command.strip()


COMMANDS = sorted(set(commands()))


def test_exactly_two_setup_commands_and_ci_runs_the_second() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", setup, flags=re.DOTALL)
    assert len(commands) == 2
    install_and_run, run_tests = commands
    assert install_and_run.startswith("pip install . && settle-proxy ")
    assert run_tests in (ROOT / ".ci" / "run").read_text()


def test_console_script_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["settle-proxy"] == "proxy.cli.main:main"


def test_there_are_commands_to_check() -> None:
    programs = {shlex.split(command)[0] for _, command in COMMANDS}
    assert {"settle-proxy", "curl", "pip", "scripts/test"} <= programs


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `SETTLE_*` of the test run's own, and a password set, so `run` asks no program its version."""
    for variable in [name for name in os.environ if name.startswith("SETTLE_")]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv("OPENCODE_SERVER_PASSWORD", "secret")


def parse(arguments: list[str]) -> None:
    """Parse `settle-proxy ARGUMENTS` as `main` would, without serving: exits as the parser does."""
    if arguments[:1] == ["run"]:
        run_command.parse(arguments[1:])
    elif arguments[:1] and arguments[0] in PARSERS:
        PARSERS[arguments[0]]().parse_args(arguments[1:])
    else:
        PARSERS[""]().parse_args(arguments)


def _assignments(words: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Apply the leading `NAME=value` words of a command line; the rest of it."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    return words


@pytest.mark.usefixtures("clean_environment")
@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{page}: {line}" for page, line in COMMANDS])
async def test_each_command_is_true(page: str, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    words = _assignments(shlex.split(command), monkeypatch)
    program, arguments = words[0], words[1:]
    if program == "settle-proxy" or words[:3] == ["python", "-m", "proxy"]:
        _parses(arguments if program == "settle-proxy" else words[3:])
    elif program == "curl":
        await _names_a_route(arguments)
    elif program in ("python", "python3"):
        _runs_what_exists(arguments)
    elif program == "pip":
        _installs_what_exists(arguments)
    elif program in EXTERNAL:
        _named_paths_exist(arguments)
    else:
        assert (ROOT / program).is_file(), f"{page}: {program}"
        assert os.access(ROOT / program, os.X_OK), f"{page}: {program} is not executable"


def _parses(arguments: list[str]) -> None:
    """The command parses; one asking for `--help` prints it and exits 0."""
    if "--help" not in arguments:
        parse(arguments)
        return
    with pytest.raises(SystemExit) as stop:
        parse(arguments)
    assert stop.value.code == 0


async def _names_a_route(arguments: list[str]) -> None:
    """A `curl` of the docs asks the proxy's default address, with its method (`-X`), for a route
    it registers itself (not the `/_settle` catch-all's 404, nor the forwarder's), its `{name}`s
    filled in (`POST /_settle/resume/ses_123`)."""
    (url,) = [URL(word) for word in arguments if word.startswith("http")]
    assert (url.host, url.port) == ("127.0.0.1", 4097), url
    method = arguments[arguments.index("-X") + 1] if "-X" in arguments else "GET"
    app = create_app(Settings(upstream=URL("http://127.0.0.1:4096")))
    match = await app.router.resolve(make_mocked_request(method, url.path_qs, app=app))
    resource = match.route.resource
    assert resource is not None, f"{method} {url.path} is no route of the proxy"
    assert "tail" not in match, f"{method} {url.path} is no route of the proxy"
    assert resource.canonical.format_map(match) == url.path, f"{method} {url.path} is no route of the proxy"


def _runs_what_exists(arguments: list[str]) -> None:
    """`python3 -m MODULE` names a module of the checkout, `python3 FILE` a file in it."""
    if arguments[0] == "-m":
        assert importlib.util.find_spec(arguments[1]) is not None, arguments[1]
    else:
        assert (ROOT / arguments[0]).is_file(), arguments[0]


def _installs_what_exists(arguments: list[str]) -> None:
    assert arguments[0] == "install", arguments
    (target,) = [word for word in arguments[1:] if not word.startswith("-")]
    extras = re.fullmatch(r"\.(?:\[([\w,]+)\])?", target)
    assert extras is not None, target
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set((extras.group(1) or "").split(",")) - {""} <= set(declared)


def _named_paths_exist(arguments: list[str]) -> None:
    for word in arguments:
        first = word.split("/", 1)[0]
        if "/" in word and "://" not in word and (ROOT / first).is_dir():
            assert (ROOT / word).exists(), f"{word} is named but does not exist"


def _python_blocks() -> list[tuple[str, str]]:
    return [(name, block) for name, text in PAGES.items() for block in blocks("python", text)]


def test_every_python_block_is_run() -> None:
    examples = _python_blocks()
    assert examples
    assert all("mount(" in block or "settle_view(" in block for _, block in examples)


def test_mount_example(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[web.Application] = []
    monkeypatch.setattr(web, "run_app", lambda app, **_: served.append(app))
    ((_, example),) = [(name, block) for name, block in _python_blocks() if "mount(" in block]
    exec(example, {})
    (app,) = served
    (subapp,) = [resource for resource in app.router.resources() if resource.canonical == "/opencode"]
    assert subapp is not None
    assert isinstance(Settings, type)


def test_settle_view_example() -> None:
    ((_, example),) = [(name, block) for name, block in _python_blocks() if "settle_view(" in block]
    namespace: dict[str, Any] = {
        "document": load("v2-message-stale-running.json"),
        "session_id": "ses_dd6bd0f33ffejRStwdnQDIkDom",
    }
    exec(example, namespace)
    assert namespace["document"]["data"][0]["content"][0]["state"]["status"] == "error"
    assert [change.rule for change in namespace["view"].changes] == ["orphaned-tool", "unfinished-message"]


@pytest.mark.parametrize(
    ("page", "block"), [(name, block) for name, text in PAGES.items() for block in blocks("json", text)]
)
def test_every_json_block_parses(page: str, block: str) -> None:
    json.loads(block)


async def test_the_up_answer_is_what_the_readme_shows(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    """The README's `curl …/_settle/up` prints its ```json block while the server answers."""
    upstream = await aiohttp_server(FakeOpencode().app())
    proxy = await aiohttp_client(create_app(Settings(upstream=URL(str(upstream.make_url("/"))))))
    answer = await proxy.get("/_settle/up")
    (shown,) = blocks("json")
    assert answer.status == 200
    assert await answer.text() == shown.strip()


async def test_up_says_down_with_a_503_while_the_server_cannot_be_reached(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    nobody = URL.build(scheme="http", host="127.0.0.1", port=free_loopback_port())
    proxy = await aiohttp_client(create_app(Settings(upstream=nobody)))
    answer = await proxy.get("/_settle/up")
    assert answer.status == 503
    assert await answer.json() == {"status": "down"}


def test_the_demo_output_shown_is_what_the_demo_prints() -> None:
    """Every ```console block of the demo's (the README's, the docs') is lines the demo's report
    prints for a 1.18.33 call shown running directly and aborted through the proxy."""
    running, aborted = Call("prt_1", "running"), Call("prt_1", "error", "Tool execution aborted")
    printed = report(
        Outcome(
            Installed("opencode", "1.18.33", Line1x()),
            directly=Seen(view=running, told=None, before=running),
            proxied=Seen(view=aborted, told=aborted, before=running),
            left_behind=1,
        )
    ).splitlines()
    shown = [
        (page, block.strip("\n").splitlines())
        for page, text in PAGES.items()
        for block in blocks("console", text)
        if "through settle-proxy" in block
    ]
    assert {page for page, _ in shown} >= {"README.md", "docs/index.md"}
    for page, lines in shown:
        start = printed.index(lines[0])
        assert printed[start : start + len(lines)] == lines, page
