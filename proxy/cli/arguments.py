"""What both command lines share: one-line errors, typed values, and the upstream URL's checks."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from yarl import URL


class OneLineParser(argparse.ArgumentParser):
    """A bad flag gets one clear line on stderr, not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def typed(parse: Callable[[str], object], what: str, *, secret: bool = False) -> Callable[[str], object]:
    """An argparse `type` whose error says what was expected, and what came unless it is a secret."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError:
            came = "the value is not shown" if secret else f"got {text!r}"
            raise argparse.ArgumentTypeError(f"{what}, {came}") from None

    return convert


def upstream_url(text: str) -> URL:
    """An http(s) URL with a host and without credentials."""
    url = URL(text)
    if url.user is not None or url.password is not None:
        # Not echoed: the text holds a secret, and a command line is readable by every user (`ps`).
        raise argparse.ArgumentTypeError(
            "credentials do not belong in the URL (anyone can read a command line); "
            "set OPENCODE_SERVER_PASSWORD and OPENCODE_SERVER_USERNAME"
        )
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(text)
    return url


UPSTREAM = typed(upstream_url, "an http(s) URL such as http://127.0.0.1:4096")
"""The `type` of every `--upstream` flag."""
