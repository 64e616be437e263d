"""The docs say what the code does: the tables generated or checked against it, the troubleshooting
page's messages are the proxy's own, every page is in the site, and each word keeps one meaning."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import re
import shlex
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.test_readme import PAGES, README, ROOT, clean_environment, parse  # noqa: F401 - a fixture

DOCS = ROOT / "docs"
PROXY_SOURCES = sorted((ROOT / "proxy").rglob("*.py"))
_BLOCK = re.compile(r"```(\w*)\n(.*?)```\n?", flags=re.DOTALL)


def _script() -> ModuleType:
    """scripts/docs_flags.py (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("docs_flags", ROOT / "scripts" / "docs_flags.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_flags_table_is_the_parsers() -> None:
    """Fails after a flag changed until `python3 scripts/docs_flags.py --write` is run."""
    page = (DOCS / "configuration.md").read_text()
    assert _script().rendered(page) == page, "run python3 scripts/docs_flags.py --write"


def test_the_flags_table_has_every_flag() -> None:
    table = (DOCS / "configuration.md").read_text()
    for flag in ("--upstream", "--write-back", "--resume-within", "--restart", "--terminate", "--state"):
        assert f"| `{flag}`" in table


def test_every_variable_the_proxy_reads_is_in_the_table() -> None:
    read = {
        name
        for path in PROXY_SOURCES
        for name in re.findall(r"environ(?:\.get\(|\[)\"([A-Z_]+)\"", path.read_text())
    }
    assert read
    assert read <= set(_script().ENVIRONMENT)


def _literals() -> list[str]:
    """Every string the proxy's source spells, `…` where a value goes (a %-placeholder, an
    f-string's field); adjacent literals are one, as Python joins them."""
    found = []
    for path in PROXY_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else "…" for v in node.values]
                found.append("".join(str(part) for part in parts))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(re.sub(r"%[-\d.]*[sdgrf]", "…", node.value))
    return found


LITERALS = _literals()


def in_the_source(message: str) -> bool:
    """Whether some literal of the source says `message`, each `…` in it standing for anything."""
    pattern = re.compile(".*?".join(re.escape(piece) for piece in message.split("…")))
    return any(pattern.search(literal) for literal in LITERALS)


def said_by_the_source(line: str) -> bool:
    """Whether some literal of the source, its values filled in, is `line` (a literal with little
    text of its own, such as a lone `%s`, says nothing)."""
    for literal in LITERALS:
        pieces = literal.split("…")
        if sum(map(len, pieces)) >= 12 and re.fullmatch(".+?".join(map(re.escape, pieces)), line):
            return True
    return False


def test_the_banner_is_what_the_proxy_prints() -> None:
    """The README's log lines, less their time, level and logger, and the fields after them."""
    (banner,) = [body for lang, body in _BLOCK.findall(README) if lang == "text"]
    lines = banner.strip().splitlines()
    assert len(lines) >= 2
    for line in lines:
        message = re.sub(r"^\S+ \S+ [A-Z]+ [\w.]+: ", "", line)
        message = re.sub(r"( \w+=\S+)+$", "", message)
        assert said_by_the_source(message), message


def test_a_message_not_in_the_source_is_not_found() -> None:
    assert in_the_source("write-back of … failed (mode=…); nothing half-written: …")
    assert not in_the_source("write-back of … succeeded (mode=…)")
    assert said_by_the_source("following /global/event: liveness now comes from events")
    assert not said_by_the_source("following /global/event: liveness now comes from guesses")


TROUBLESHOOTING = (DOCS / "troubleshooting.md").read_text()


def _transcripts() -> Iterator[tuple[str, str]]:
    """(command, what it prints) of every ```sh block followed at once by a ```text block."""
    found = list(_BLOCK.finditer(TROUBLESHOOTING))
    for block, following in itertools.pairwise(found):
        if block.group(1) == "sh" and following.group(1) == "text" and following.start() == block.end() + 1:
            yield block.group(2).strip(), following.group(2).strip()


def _log_lines() -> list[str]:
    """The ```text blocks that follow no command: lines of the log or of an answer."""
    transcribed = {printed for _, printed in _transcripts()}
    texts = [body.strip() for lang, body in _BLOCK.findall(TROUBLESHOOTING) if lang == "text"]
    answers = [
        message
        for lang, body in _BLOCK.findall(TROUBLESHOOTING)
        if lang == "json"
        for message in re.findall(r'"message": "(.*?)"', body)
    ]
    return [text for text in texts if text not in transcribed] + answers


TRANSCRIPTS = list(_transcripts())


@pytest.mark.usefixtures("clean_environment")
@pytest.mark.parametrize(("command", "printed"), TRANSCRIPTS, ids=[command for command, _ in TRANSCRIPTS])
def test_each_failure_prints_what_the_page_says(
    command: str, printed: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    words = shlex.split(command)
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    assert words[0] == "settle-proxy"
    with pytest.raises(SystemExit) as stop:
        parse(words[1:])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == printed


def test_there_are_transcripts_and_log_lines() -> None:
    assert len(TRANSCRIPTS) >= 10
    assert len(_log_lines()) >= 15


@pytest.mark.parametrize("message", _log_lines())
def test_each_log_line_is_the_proxys_own(message: str) -> None:
    assert in_the_source(message), f"no message of the proxy says {message!r}"


def test_the_metrics_table_names_every_metric() -> None:
    registered = {
        name for path in PROXY_SOURCES for name in re.findall(r"\"(settle_proxy_[a-z_]+)\"", path.read_text())
    }
    page = (DOCS / "observability.md").read_text()
    documented = set(re.findall(r"^\| `(settle_proxy_[a-z_]+)`", page, flags=re.MULTILINE))
    assert registered
    assert documented == registered


def test_every_page_is_in_the_site() -> None:
    nav = set(re.findall(r":\s+(\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), flags=re.MULTILINE))
    assert nav == {page.name for page in DOCS.glob("*.md")}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_proxys_routes_are_named_with_their_prefix(page: str) -> None:
    """`/metrics` is no route of the proxy's (nor of opencode's): `/_settle/metrics` is."""
    assert re.findall(r"`(?:GET |POST )?(/(?:metrics|orphans|up)\b[^`]*)`", PAGES[page]) == []


def test_the_docs_folder_holds_only_pages() -> None:
    """Notes about how the pages get written are not shipped beside them."""
    assert sorted(path.name for path in DOCS.iterdir() if path.is_dir()) == []


def test_the_map_is_architecture_md() -> None:
    assert (DOCS / "map.md").resolve() == (ROOT / "ARCHITECTURE.md").resolve()


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len(README.splitlines()) <= 150


def test_the_readme_links_only_to_pages_that_exist() -> None:
    links = re.findall(r"\]\(((?!https?:)[^)#]+)", README)
    assert links
    for link in links:
        assert (ROOT / link).exists(), link


HOUSE_WORDS = (
    "release line",
    "message API",
    "settle",
    "settled view",
    "reading",
    "vouch",
    "follow",
    "told",
    "replay",
    "catch-up",
    "write-back",
    "dialect",
    "runtime",
    "survey",
    "claim",
    "state database",
)


def _headings(text: str) -> set[str]:
    return {word.strip() for line in re.findall(r"^#+ (.*)$", text, re.MULTILINE) for word in line.split(",")}


@pytest.mark.parametrize("word", HOUSE_WORDS)
def test_each_house_word_is_in_the_glossary(word: str) -> None:
    assert word in _headings((DOCS / "glossary.md").read_text())


@pytest.mark.parametrize(
    "word", ["reading", "vouch", "release line", "message API", "dialect", "runtime", "settle", "write-back"]
)
def test_each_word_of_the_code_is_in_architecture_md(word: str) -> None:
    glossary = (ROOT / "ARCHITECTURE.md").read_text().split("## Glossary", 1)[1]
    assert re.search(rf"^- \*\*{re.escape(word)}\*\*", glossary, flags=re.MULTILINE | re.IGNORECASE)


MIXED = re.compile(
    r"\b[12]\.x (?:message )?API\b|\bv[12] (?:release )?line\b|\bline v[12]\b|\bAPI [12]\.x\b|\bv[12] release\b"
)


@pytest.mark.parametrize("page", sorted(set(PAGES) - {"docs/map.md"}))
def test_release_lines_and_message_apis_are_never_mixed(page: str) -> None:
    assert not MIXED.findall(PAGES[page])


@pytest.mark.parametrize(
    "page", sorted(set(PAGES) - {"docs/map.md", "docs/architecture.md", "docs/glossary.md"})
)
def test_user_pages_say_message_api_not_runtime(page: str) -> None:
    assert not re.findall(r"\bruntimes?\b", PAGES[page].replace("XDG_RUNTIME_DIR", ""), flags=re.IGNORECASE)
