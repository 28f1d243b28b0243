"""Every `specwake` command the README and docs/ write, in a fenced block or inline code, names a command that exists
and only flags that command takes (read from the CLI's own click objects), and each command's `--help` answers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from specwake.cli import app
from tests.helpers.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
# `specwake` as the program, then its command: not `specwake's`, `specwake/run`, `specwake.cli`
COMMAND = re.compile(r"(?:^|[\s$(])specwake ((?:[a-z][\w-]*)(?: [a-z][\w-]*)?)")
# where a command ends inside a line: a shell comment, pipe, `&&`, `;` or redirection (a table's `\|` is a choice)
END = re.compile(r"\s#|(?<!\\)\||&&|;|\s>")
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def commands() -> dict[str, Any]:
    """Every command by its words (`run`, `models list`), as the CLI's click objects have them (typer's own click)."""
    root: Any = typer.main.get_command(app)
    found: dict[str, Any] = {}
    for name, command in root.commands.items():
        found[name] = command
        for sub, each in getattr(command, "commands", {}).items():  # a group's commands
            found[f"{name} {sub}"] = each
    return found


def options(command: Any) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}


def command_texts(markdown: str) -> Iterator[str]:
    """Each piece of text that may hold a command line: a fenced block's lines (a `\\` continuation joined) and each
    inline code span outside the blocks."""
    for block in FENCE.findall(markdown):
        yield from block.replace("\\\n", " ").splitlines()
    yield from INLINE.findall(FENCE.sub("", markdown))


def unknown_flags(markdown: str, known: dict[str, Any]) -> list[str]:
    """`specwake COMMAND … --flag` where COMMAND has no such flag, or a command with flags that does not exist."""
    problems = []
    for text in command_texts(markdown):
        for match in COMMAND.finditer(text):
            rest = text[match.end() :]
            rest = rest[: m.start()] if (m := END.search(rest)) else rest
            words = match.group(1)
            name = words if words in known else words.split()[0]
            flags = FLAG.findall(rest if name == words else words.split()[1] + rest)
            if name not in known:
                problems += [f"`specwake {name}` (no such command) {flag}" for flag in flags]
                continue
            problems += [f"`specwake {name}` has no {flag}" for flag in flags if flag not in options(known[name])]
    return problems


def named_commands(markdown: str, known: dict[str, Any]) -> set[str]:
    found = set()
    for text in command_texts(markdown):
        for match in COMMAND.finditer(text):
            words = match.group(1)
            found |= {words} if words in known else {words.split()[0]} & set(known)
    return found


def test_the_reader_catches_a_flag_no_command_takes() -> None:
    """The check below can fail: a planted flag, in inline code and in a fenced block, is found; real ones are not."""
    known = commands()
    planted = "Run `specwake run a.toml --cycles 2 --no-such-flag`\n```\nspecwake check a.toml \\\n  --tensorz\n```\n"
    found = unknown_flags(planted, known)
    assert found == ["`specwake check` has no --tensorz", "`specwake run` has no --no-such-flag"]
    table_row = "| `specwake check SCENARIO... [--model-runner v1\\|v2] [--online]` | … |"
    assert unknown_flags(table_row, known) == []
    assert unknown_flags("`specwake models list --all`", known) == ["`specwake models list` has no --all"]
    assert unknown_flags("`specwake frobnicate --x`", known) == ["`specwake frobnicate` (no such command) --x"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_the_docs_name_exists(doc: Path) -> None:
    assert unknown_flags(doc.read_text(), commands()) == []


def test_every_command_the_docs_name_answers_its_help() -> None:
    known = commands()
    named = set().union(*(named_commands(doc.read_text(), known) for doc in DOCS))
    assert {"run", "check", "report", "compare", "bisect", "leftovers", "models build"} <= named
    runner = CliRunner()
    for name in sorted(named):
        shown = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and "Usage:" in shown.output, (name, shown.output)
