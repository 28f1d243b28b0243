"""Docs match the CLI: every command has help text and appears in the README; README commands exist."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from specwake.cli import app

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def command_names(typer_app: typer.Typer, prefix: str = "") -> list[str]:
    names = [
        prefix + (c.name or c.callback.__name__.replace("_", "-"))
        for c in typer_app.registered_commands
        if not c.hidden
    ]
    for group in typer_app.registered_groups:
        assert group.typer_instance is not None
        names += command_names(group.typer_instance, prefix + f"{group.name} ")
    return names


def test_every_command_has_help_and_is_in_readme() -> None:
    runner = CliRunner()
    names = command_names(app)
    assert {"run", "check", "report", "compare", "models list", "models build", "version"} <= set(names)
    for name in names:
        result = runner.invoke(app, [*name.split(), "--help"])
        assert result.exit_code == 0, name
        assert "Usage" in result.output
        assert f"specwake {name}" in README, f"`specwake {name}` is not documented in README.md"


def test_readme_flags_exist() -> None:
    runner = CliRunner()
    for name in ("run", "check", "report", "compare"):
        help_text = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"}).output
        row = next(line for line in README.splitlines() if line.startswith(f"| `specwake {name} "))
        for flag in re.findall(r"--[a-z][a-z-]+", row):
            assert flag in help_text, f"README documents {flag} for `specwake {name}`, but the CLI has no such flag"


def test_readme_gives_the_two_commands() -> None:
    assert "make demo" in README and "make test" in README
