"""The command words, as users type them: the usage line names every command, `serve` is the
proxy itself, and an unknown word is one line suggesting the nearest command."""

from __future__ import annotations

import pytest

from proxy import __version__
from tests.proxy.conftest import settle_proxy


def test_the_usage_line_names_every_command() -> None:
    usage = settle_proxy("--help").stdout.split("\n\n")[0]
    assert usage.splitlines() == [
        "usage: settle-proxy [serve] [options]",
        "       settle-proxy run [options] -- opencode serve [server options]",
        "       settle-proxy settle [options]",
        "       settle-proxy orphans [options]",
        "       settle-proxy demo [--opencode PATH]",
    ]


def test_serve_is_the_proxy_itself() -> None:
    assert settle_proxy("serve", "--version").stdout.strip() == f"settle-proxy {__version__}"


@pytest.mark.parametrize(
    ("word", "hint"),
    [("setle", "; did you mean 'settle'?"), ("orphan", "; did you mean 'orphans'?"), ("xyzzy", "")],
)
def test_an_unknown_command_suggests_the_nearest(word: str, hint: str) -> None:
    result = settle_proxy(word, "--dry-run")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"settle-proxy: error: unknown command {word!r}{hint} (commands: serve, run, settle, orphans, demo) "
        "(see --help)"
    ]


@pytest.mark.parametrize("command", [[], ["run"]])
def test_the_timeout_flags_say_a_synchronous_prompt_answers_when_its_turn_ends(command: list[str]) -> None:
    text = " ".join(settle_proxy(*command, "--help").stdout.split())
    assert "opencode 1.x's POST /session/{id}/message answers only when the turn ends" in text
    assert "a client's request has no deadline unless --response-timeout sets one" in text
