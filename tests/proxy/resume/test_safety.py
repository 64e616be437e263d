"""The classes of interrupted calls: a table of command lines, the tools, and a property (one
unsafe word anywhere in a list makes the whole line unsafe, and the reason names it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.resume.safety import CallClass, Safety, classify, command_unsafe

SAFE_LINES = [
    "echo hello && sleep 600",
    "sleep 600",
    "ls -la | wc -l",
    "git status; git diff HEAD~1 | head -50",
    "git log --oneline -5 || true",
    "rg -n TODO src 2>/dev/null",
    "find . -name '*.py' -type f | sort",
    "cat README.md > /dev/null",
    "ls 2>&1 | tail -3",
    "cat < input.txt",
    'echo "a && rm -rf x"',
    "cd src && grep -r foo .",
]
UNSAFE_LINES = {
    "echo x > out.txt && sleep 600": "'>'",
    "echo x >> log": "'>>'",
    "ls &> all.txt": "'&>'",
    "sleep 600 &": "'&'",
    "cat $(ls)": "'$'",
    "echo `id`": "'`'",
    "diff <(ls a) <(ls b)": "'<('",
    "FOO=bar ls": "'FOO=bar'",
    "(cd x && ls)": "'('",
    "{ ls; }": "'{'",
    "git push origin main": "'git push'",
    "rm -rf build": "'rm'",
    "npm install": "'npm'",
    "pytest -q": "'pytest'",
    "find . -name x -delete": "'-delete'",
    "find . -exec rm {} ;": "'-exec'",
    "find . -fprint out": "'-fprint'",
    "sort -o out in": "'-o'",
    "rg --pre=sh x": "'--pre=sh'",
    "git diff --output=x": "'--output=x'",
    "ls\nrm x": "'\\n'",
    "echo 'unclosed": "does not parse",
    "ls | tee out": "'tee'",
    "if true; then ls; fi": "'if'",
    "echo a |& cat": "'|&'",
}


@pytest.mark.parametrize("line", SAFE_LINES)
def test_a_line_that_only_reads_or_waits_is_safe(line: str) -> None:
    assert command_unsafe(line) is None


@pytest.mark.parametrize(("line", "word"), UNSAFE_LINES.items())
def test_a_line_that_may_change_something_is_unsafe_and_the_reason_names_the_word(
    line: str, word: str
) -> None:
    why = command_unsafe(line)
    assert why is not None
    assert word in why


def test_the_calls_of_the_issue() -> None:
    def of(command: str) -> CallClass:
        return classify("c", "bash", {"command": command}, "running", safety=Safety()).klass

    assert of("echo hello && sleep 600") is CallClass.SAFE
    assert of("echo x > out.txt && sleep 600") is CallClass.UNSAFE


@pytest.mark.parametrize("tool", ["read", "glob", "grep", "list", "webfetch"])
def test_a_tool_that_only_reads_is_safe(tool: str) -> None:
    assert classify("c", tool, {"filePath": "/etc/hosts"}, "running", safety=Safety()).safe


@pytest.mark.parametrize("tool", ["edit", "write", "patch", "apply_patch", "task", "subagent", "todowrite"])
def test_any_other_tool_is_unsafe(tool: str) -> None:
    classed = classify("c", tool, {}, "running", safety=Safety())
    assert not classed.safe
    assert tool in classed.why


@pytest.mark.parametrize("status", ["pending", "streaming"])
def test_a_call_cut_while_the_model_wrote_its_input_is_safe(status: str) -> None:
    classed = classify("c", "bash", {"command": "rm -rf /"}, status, safety=Safety())
    assert classed.safe
    assert status in classed.why


def test_2x_shell_is_parsed_as_bash_is() -> None:
    assert classify("c", "shell", {"command": "ls"}, "running", safety=Safety()).safe
    assert not classify("c", "shell", {"command": "make"}, "running", safety=Safety()).safe
    assert not classify("c", "shell", {}, "running", safety=Safety()).safe


def test_resume_safe_patterns_extend_the_safe_set_by_tool_line_or_simple_command() -> None:
    safety = Safety(patterns=("edit", "npm test*", "make check"))
    assert classify("c", "edit", {}, "running", safety=safety).safe
    assert "--resume-safe 'edit'" in classify("c", "edit", {}, "running", safety=safety).why
    assert classify("c", "bash", {"command": "npm test -- --watch"}, "running", safety=safety).safe
    assert classify("c", "bash", {"command": "cd app && make check"}, "running", safety=safety).safe
    assert not classify("c", "bash", {"command": "make check && make install"}, "running", safety=safety).safe
    assert not classify("c", "write", {}, "running", safety=safety).safe


READING = st.sampled_from(
    ["echo hi", "sleep 1", "ls -l", "pwd", "git status", "wc -l x", "head -3 f", "true"]
)
HARMFUL = st.sampled_from(
    [
        ("rm -rf x", "'rm'"),
        ("echo x > f", "'>'"),
        ("touch f", "'touch'"),
        ("git push", "'git push'"),
        ("sleep 9 &", "'&'"),
        ("A=1 ls", "'A=1'"),
        ("find . -delete", "'-delete'"),
        ("cp a b", "'cp'"),
    ]
)
JOIN = st.sampled_from([" && ", " || ", "; ", " | "])


@given(
    before=st.lists(READING, max_size=4),
    after=st.lists(READING, max_size=4),
    harmful=HARMFUL,
    joins=st.lists(JOIN, min_size=8, max_size=8),
)
def test_an_unsafe_word_anywhere_in_a_list_makes_the_line_unsafe(
    before: list[str], after: list[str], harmful: tuple[str, str], joins: list[str]
) -> None:
    commands = [*before, harmful[0], *after]
    line = commands[0]
    for command, join in zip(commands[1:], joins, strict=False):
        line += join + command
    why = command_unsafe(line)
    assert why is not None
    assert harmful[1] in why


@given(commands=st.lists(READING, min_size=1, max_size=6), joins=st.lists(JOIN, min_size=6, max_size=6))
def test_a_list_of_reading_commands_is_safe(commands: list[str], joins: list[str]) -> None:
    line = commands[0]
    for command, join in zip(commands[1:], joins, strict=False):
        line += join + command
    assert command_unsafe(line) is None
