"""What every command line shares: one-line errors, a variable for every flag, typed values, and
the upstream URL's checks."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from yarl import URL

_SWITCH = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}
_NOT_SETTINGS = (argparse._HelpAction, argparse._VersionAction)


class OneLineParser(argparse.ArgumentParser):
    """A bad flag gets one clear line on stderr, not the whole usage block; and every flag can be
    set by an environment variable, which its help names: `SETTLE_DRY_RUN` for `--dry-run`, unless
    `add_argument(..., variable=...)` names another. A switch is turned on by 1, true, yes or on.

    The variables are applied where the parser parses (or shows its help), to every flag however
    it was added, argument groups included: a new flag cannot be without one. A bad value gets one
    line naming the variable; `secret=True` keeps the value out of both --help and that line.
    """

    def __init__(self, *args: Any, environ: Mapping[str, str] = os.environ, **kwargs: Any) -> None:
        self._environ = environ
        self._declared: dict[str, tuple[str | None, bool, bool]] = {}
        self._applied: set[int] = set()
        self._set_by: dict[str, str] = {}
        super().__init__(*args, **kwargs)  # adds --help, through `add_argument`

    def add_argument(
        self,
        *name_or_flags: str,
        variable: str | None = None,
        shown: bool = True,
        secret: bool = False,
        **kwargs: Any,
    ) -> argparse.Action:
        """As argparse's, and: `variable` names the flag's variable, `shown=False` keeps its default
        out of --help (where it says nothing useful), `secret=True` its value out of everything."""
        action = super().add_argument(*name_or_flags, **kwargs)
        self._declared[action.dest] = (variable, shown and not secret, secret)
        return action

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._apply_environment()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._apply_environment()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def _apply_environment(self) -> None:
        for action in self._actions:
            if id(action) in self._applied or not action.option_strings or isinstance(action, _NOT_SETTINGS):
                continue
            self._applied.add(id(action))
            _, shown, secret = self._declared.get(action.dest, (None, True, False))
            variable = self.variable(action)
            _describe(action, variable, shown=shown and action.default is not None)
            text = self._environ.get(variable)
            if text is not None:
                action.default = self._value(action, variable, text, secret=secret)
                self._set_by[action.dest] = variable

    def variable(self, action: argparse.Action) -> str:
        """The environment variable that sets `action`'s flag (what its --help names)."""
        named = self._declared.get(action.dest, (None, True, False))[0]
        return named or variable_of(action)

    def set_by_variable(self, dest: str) -> str | None:
        """The variable that set the flag of `dest`, if one did (known once the parser has parsed)."""
        return self._set_by.get(dest)

    def _value(self, action: argparse.Action, variable: str, text: str, *, secret: bool) -> Any:
        """What `text`, the value of `variable`, sets `action` to; one line and exit 2 if it cannot."""
        if action.nargs == 0:  # a switch
            if text.strip().lower() not in _SWITCH:
                self.error(f"{variable}: 1, true, yes or on, or 0, false, no or off, got {text!r}")
            return action.const if _SWITCH[text.strip().lower()] else action.default
        if isinstance(action, argparse._AppendAction):  # a repeatable flag: its values, comma-separated
            return [part.strip() for part in text.split(",") if part.strip()]
        shown = "the value is not shown" if secret else f"got {text!r}"
        try:
            value = action.type(text) if callable(action.type) else text
        except argparse.ArgumentTypeError as error:
            self.error(f"{variable}: {error}")
        except (TypeError, ValueError):
            self.error(f"{variable}: not a valid value, {shown}")
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(repr(choice) for choice in action.choices)
            self.error(f"{variable}: invalid choice {text!r} (choose from {choices})")
        return value


def variable_of(action: argparse.Action) -> str:
    """`SETTLE_DRY_RUN` for `--dry-run`: a flag's variable unless it names another."""
    flag = max(action.option_strings, key=len)
    return "SETTLE_" + flag.lstrip("-").upper().replace("-", "_")


def _describe(action: argparse.Action, variable: str, *, shown: bool) -> None:
    """End the flag's help with its variable (and its default), unless the help names it already."""
    if action.help == argparse.SUPPRESS or variable in (action.help or ""):
        return
    suffix = f"[{variable}, default %(default)s]" if shown and action.nargs != 0 else f"[{variable}]"
    action.help = f"{action.help} {suffix}" if action.help else suffix


def typed(parse: Callable[[str], object], what: str, *, secret: bool = False) -> Callable[[str], object]:
    """An argparse `type` whose error says what was expected, and what came unless it is a secret."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError:
            came = "the value is not shown" if secret else f"got {text!r}"
            raise argparse.ArgumentTypeError(f"{what}, {came}") from None

    return convert


def seconds(most: float, *, zero: bool = False) -> Callable[[str], object]:
    """An argparse `type` for a number of seconds: finite, at most `most`, and above 0 unless
    `zero` (for a flag whose help says what 0 means). NaN, infinities and negatives are refused:
    a NaN compares false with everything, so a check written `age > limit` would pass anything."""

    def parse(text: str) -> float:
        value = float(text)
        if not (0 <= value <= most if zero else 0 < value <= most):  # NaN is never in range
            raise ValueError(text)
        return value

    return typed(parse, f"a number of seconds {seconds_range(most, zero=zero)}")


def seconds_range(most: float, *, zero: bool) -> str:
    """What `seconds(most, zero=zero)` takes, in words."""
    return f"from 0 to {most:g}" if zero else f"more than 0, at most {most:g}"


def port(text: str) -> int:
    """A port number (0: any free one)."""
    number = int(text)
    if not 0 <= number <= 65535:
        raise ValueError(text)
    return number


def at_least_one(text: str) -> int:
    number = int(text)
    if number < 1:
        raise ValueError(text)
    return number


def upstream_url(text: str) -> URL:
    """An http(s) URL with a host and without credentials. No error shows the text: a URL may hold
    a secret (userinfo, a token in its query), and a command line is readable by every user (`ps`)."""
    authority = text.partition("://")[2] or text
    if "@" in re.split("[/?#]", authority, maxsplit=1)[0]:
        raise argparse.ArgumentTypeError(
            "credentials do not belong in the URL (anyone can read a command line); "
            "set OPENCODE_SERVER_PASSWORD and OPENCODE_SERVER_USERNAME"
        )
    try:
        url = URL(text)
        wrong = _wrong_with(url)
    except ValueError:
        wrong = "it does not parse (is a port past 65535, or a [ unclosed?)"
    if wrong:
        raise argparse.ArgumentTypeError(f"{_AN_UPSTREAM}: {wrong}; the value is not shown")
    return url


def _wrong_with(url: URL) -> str | None:
    if url.scheme not in ("http", "https"):
        return "its scheme is not http or https"
    if not url.host:
        return "it has no host"
    _ = url.port  # yarl checks the port when asked
    return None


_AN_UPSTREAM = "an http(s) URL such as http://127.0.0.1:4096"
UPSTREAM = typed(upstream_url, _AN_UPSTREAM, secret=True)
"""The `type` of every `--upstream` flag."""
