"""Whether an interrupted call may be run again unasked: pure, so every class is tested without a server.

A resumed turn lets the model repeat what was cut, so only a call whose repeat can do no harm is
continued by itself: a tool that only reads, a call that started nothing (the model was still
writing its input: v1 `pending`, 2.x `streaming`), and a shell command line a conservative parse
accepts: a pipeline or an `&&`/`||`/`;` list of simple commands from a read-only set, with no
redirection to a file, no substitution, no background `&`, no assignment, no subshell. Anything
the parse does not understand is unsafe, and the reason names the word that made it so.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["READ_ONLY_TOOLS", "CallClass", "Classed", "Safety", "classify", "command_unsafe"]

READ_ONLY_TOOLS = frozenset(
    {"read", "glob", "grep", "list", "webfetch", "websearch", "codesearch", "todoread", "lsp"}
)
"""opencode's tools that only read (`packages/opencode/src/tool/` of 1.18: read, glob, grep, list,
webfetch, websearch, codesearch, todoread, lsp; 2.x keeps read, glob, grep, webfetch, websearch)."""
SHELL_TOOLS = frozenset({"bash", "shell"})
"""1.18's `bash`, 2.x's `shell`: their `command` is classed by the parse."""
NOT_STARTED = frozenset({"pending", "streaming"})
"""A call's status while the model still writes its input (v1 `pending`, 2.x `streaming`)."""

READ_ONLY_COMMANDS = frozenset(
    {
        "echo", "printf", "sleep", "cat", "ls", "pwd", "true", "false", "wc", "head", "tail", "grep",
        "egrep", "fgrep", "rg", "find", "git", "cd", "stat", "du", "df", "basename", "dirname",
        "realpath", "readlink", "which", "whoami", "id", "uname", "date", "cut", "tr", "nl", "diff",
        "cmp", "comm", "seq", "test", "[", "md5sum", "sha1sum", "sha256sum", "ps", "printenv", "nproc",
        "uptime", "jq", "sort",
    }
)  # fmt: skip
GIT_READING = frozenset({"status", "diff", "log", "show"})
FORBIDDEN_ARGS: Mapping[str, tuple[str, ...]] = {
    "find": ("-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fls"),
    "git": ("--output", "--ext-diff", "-o"),
    "rg": ("--pre",),
    "sort": ("-o", "--output", "--compress-program"),
    "date": ("-s", "--set"),
}
"""Per command, the arguments (by prefix) that write, run another program, or set something."""
OPERATORS = frozenset({"&&", "||", ";", "|"})
DISCARDED = "/dev/null"
RAW_UNSAFE = (
    ("`", "command substitution"),
    ("$", "an expansion (`$`)"),
    ("\n", "a second line"),
    ("\\", "an escape"),
)


class CallClass(StrEnum):
    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True, slots=True)
class Safety:
    """What a user set: `patterns` that make a call safe too (`--resume-safe`: a glob over a tool's
    name, a command line or one of its simple commands), and `unsafe_ok` (`--resume-unsafe`):
    every turn is continued, as before classes existed."""

    patterns: tuple[str, ...] = ()
    unsafe_ok: bool = False


@dataclass(frozen=True, slots=True)
class Classed:
    """One call's class and why: the word that made it unsafe, or what made it safe."""

    call_id: str
    tool: str
    command: str
    klass: CallClass
    why: str

    @property
    def safe(self) -> bool:
        return self.klass is CallClass.SAFE

    def as_json(self) -> dict[str, str]:
        return {
            "call": self.call_id,
            "tool": self.tool,
            "command": self.command,
            "class": str(self.klass),
            "why": self.why,
        }


def classify(
    call_id: str, tool: str, given: Mapping[str, Any], status: str | None, *, safety: Safety, shown: str = ""
) -> Classed:
    """The class of one interrupted call: `tool` with its input `given`, last seen in `status`;
    `shown` is its command as a person reads it (shortened)."""
    safe, why = _judged(tool, given, status, safety)
    return Classed(call_id, tool, shown, CallClass.SAFE if safe else CallClass.UNSAFE, why)


def _judged(tool: str, given: Mapping[str, Any], status: str | None, safety: Safety) -> tuple[bool, str]:
    if status in NOT_STARTED:
        return True, f"cut while the model wrote its input ({status}): nothing ran"
    if (pattern := _matching(tool, safety.patterns)) is not None:
        return True, f"tool {tool} matches --resume-safe {pattern!r}"
    if tool in READ_ONLY_TOOLS:
        return True, f"{tool} only reads"
    if tool not in SHELL_TOOLS:
        return False, f"{tool} is not a tool that only reads"
    return _command_judged(tool, given.get("command"), safety)


def _command_judged(tool: str, command: Any, safety: Safety) -> tuple[bool, str]:
    if not isinstance(command, str):
        return False, f"{tool} without a command"
    if (pattern := _matching(command, safety.patterns)) is not None:
        return True, f"the command line matches --resume-safe {pattern!r}"
    why = command_unsafe(command, safety.patterns)
    return why is None, why or "only reads or waits"


def command_unsafe(command: str, patterns: Sequence[str] = ()) -> str | None:
    """Why the shell command line `command` may do harm if run again, or None when every simple
    command of it only reads or waits (or matches one of `patterns`)."""
    for mark, what in RAW_UNSAFE:
        if mark in command:
            return f"{mark!r}: {what}"
    try:
        words = _words(command)
    except ValueError as error:
        return f"it does not parse ({error})"
    if not words:
        return "an empty command"
    return _list_unsafe(words, patterns)


def _list_unsafe(words: Sequence[str], patterns: Sequence[str]) -> str | None:
    """Why a command list (its shell words) is unsafe: the first of its simple commands or
    redirections that is; None when none is."""
    simple: list[str] = []
    for index, word in enumerate(words):
        if word in OPERATORS:
            if (why := _simple_unsafe(simple, patterns, word)) is not None:
                return why
            simple = []
        elif _is_punctuation(word):
            if (why := _redirect_unsafe(words, index)) is not None:
                return why
        elif not (index > 0 and _is_redirect(words[index - 1])):
            simple.append(word)
    return _simple_unsafe(simple, patterns, "the end")


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    return list(lexer)


def _is_punctuation(word: str) -> bool:
    return bool(word) and all(char in "();<>|&" for char in word)


def _is_redirect(word: str) -> bool:
    return word in (">", ">>", "&>", ">&", "<")


def _redirect_unsafe(words: Sequence[str], index: int) -> str | None:
    """None for an output redirection to /dev/null, `>&` to a descriptor, or `<` from a file; else why."""
    word = words[index]
    target = words[index + 1] if index + 1 < len(words) else ""
    if _harmless_redirect(word, target):
        return None
    if word in (">", ">>", "&>", ">&", ">|"):
        return f"{word!r}: redirects to a file ({target or 'none named'})"
    if word.startswith("&") and not word.startswith("&>"):  # `&`, and `&;` `&&&`…: `&` then more
        return f"{word!r}: '&' runs in the background"
    if "(" in word or ")" in word:
        return f"{word!r}: a subshell or substitution"
    return f"{word!r}: not understood"


def _harmless_redirect(word: str, target: str) -> bool:
    discarded = word in (">", ">>", "&>") and target == DISCARDED
    duplicated = word == ">&" and target.isdigit()
    read = word == "<" and bool(target) and not _is_punctuation(target)
    return discarded or duplicated or read


def _simple_unsafe(words: Sequence[str], patterns: Sequence[str], before: str) -> str | None:
    """Why one simple command (its words, redirections taken out) is unsafe, or None."""
    if not words:
        return f"an empty command before {before}"
    if _matching(" ".join(words), patterns) is not None:
        return None
    name, arguments = words[0], words[1:]
    if (why := _name_unsafe(name, arguments)) is not None:
        return why
    for argument in arguments:
        if any(_forbids(argument, prefix) for prefix in FORBIDDEN_ARGS.get(name, ())):
            return f"{argument!r} of {name}: writes, or runs another program"
    return None


def _name_unsafe(name: str, arguments: Sequence[str]) -> str | None:
    if "=" in name:
        return f"{name!r}: a variable assignment"
    if name in ("{", "}", "!"):
        return f"{name!r}: a group or negation"
    if name not in READ_ONLY_COMMANDS:
        return f"{name!r}: not a command that only reads or waits"
    if name == "git" and (not arguments or arguments[0] not in GIT_READING):
        sub = f"git {arguments[0]}" if arguments else "git"
        return f"{sub!r}: not git status, diff, log or show"
    return None


def _forbids(argument: str, prefix: str) -> bool:
    """Whether `argument` is the flag `prefix` (`-o`, `-o=x`, `--output…`; `-o` inside a cluster `-ro`)."""
    if prefix.startswith("--") or len(prefix) > 2:
        return argument.startswith(prefix)
    return argument.startswith("-") and not argument.startswith("--") and prefix[1] in argument[1:]


def _matching(text: str, patterns: Sequence[str]) -> str | None:
    return next((pattern for pattern in patterns if fnmatchcase(text, pattern)), None)
