"""Docs match the code: every command has help text and appears in the README (its flags: test_doc_commands.py); the
README links every docs page; every relative link resolves inside the repository; every scenario key, [expect] number,
expectation and outcome is documented where the docs say it is."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from specwake.judge.crashes import MEANINGS
from specwake.judge.expectations import EXPECTATIONS
from specwake.judge.verdict import OUTCOMES, RULES
from specwake.prepare.scenario_file import EXPECT_NUMBERS, POSITIVE, ScenarioFile
from specwake.results import INCOMPLETE
from tests.helpers.paths import REPO

ROOT = REPO
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
SCENARIO_DOC = DOCS / "scenario-format.md"
MARKDOWN_FILES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


# -- the CLI ------------------------------------------------------------------------------------------


def command_names(typer_app: Any, prefix: str = "") -> list[str]:
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
    from typer.testing import CliRunner

    from specwake.cli import app

    runner = CliRunner()
    names = command_names(app)
    assert {"run", "check", "report", "compare", "models list", "models build", "version"} <= set(names)
    for name in names:
        result = runner.invoke(app, [*name.split(), "--help"])
        assert result.exit_code == 0, name
        assert "Usage" in result.output
        assert f"specwake {name}" in README, f"`specwake {name}` is not documented in README.md"


def test_the_help_of_sequential_says_what_the_mode_lines_of_a_run_say() -> None:
    """`run --sequential` prints ASKED["sequential"], the CPU default one of MEASURING's two side-by-side lines:
    the flag's help names what each of them says, so that neither reads as the other."""
    from typer.testing import CliRunner

    from specwake.cli import app
    from specwake.run.session.runner import ASKED, MEASURING

    help_text = " ".join(CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "300"}).output.split())
    flag = help_text[help_text.index("--no-sequential") :]
    flag = flag[: flag.index("[default")]
    assert ASKED["sequential"].split(" (")[0] in flag, flag
    for mode in ("overlapped", "parallel"):
        said = MEASURING[mode].split(": ")[0]  # "servers side by side, measuring at once"
        assert said.split(", ")[1] in flag, (said, flag)


def test_readme_gives_the_two_commands() -> None:
    assert "make demo" in README and "make test" in README


def test_the_readme_links_every_docs_page() -> None:
    """The README is where a newcomer starts: every page of docs/ must be reachable from it."""
    linked = {target.split("#", 1)[0] for target in link_targets(README)}
    pages = {f"docs/{page.name}" for page in DOCS.glob("*.md")}
    assert pages - linked == set(), f"README.md links no {sorted(pages - linked)}"


# -- Markdown helpers -----------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def without_code(text: str) -> str:
    """Markdown without fenced blocks and with every code span replaced by a placeholder."""
    return CODE_SPAN.sub("code", FENCE.sub("", text))


def link_targets(text: str) -> list[str]:
    prose = without_code(text)
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (duplicates get -1, -2, …)."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in FENCE.sub("", text).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def sections(text: str) -> dict[str, str]:
    """`## heading` → its body (up to the next `## `; `###` subsections stay inside)."""
    parts = re.split(r"^## (.+)$", FENCE.sub("", text), flags=re.MULTILINE)
    return {heading.strip(): body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


def table_rows(body: str) -> list[dict[str, str]]:
    """Every row of every table in `body`, as header → cell (escaped `\\|` stays inside its cell)."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in body.splitlines() + [""]:
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if header is None:
            header = cells
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
            rows.append(dict(zip(header, cells, strict=False)))
    return rows


def ticked(cell: str) -> list[str]:
    """The code spans of a table cell, without their backticks."""
    return re.findall(r"`([^`]+)`", cell)


def keys_line(body: str) -> set[str]:
    """The code spans of the section's `Keys: …` sentence."""
    match = re.search(r"^Keys:.*?\.(?=\s|\Z)", body, re.MULTILINE | re.DOTALL)
    assert match is not None, "section has no `Keys: …` sentence"
    return set(ticked(match.group(0)))


# -- links ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", MARKDOWN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    root = ROOT.resolve()
    broken = []
    for target in link_targets(doc.read_text()):
        if SCHEME.match(target) or target.startswith("#"):
            continue  # a public URL, or an anchor in the same file
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (doc.parent / path).resolve()
        if resolved != root and root not in resolved.parents:
            broken.append(f"{target} (leaves the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
    assert not broken, f"{doc.relative_to(ROOT)} links to: {', '.join(broken)}"


@pytest.mark.parametrize("doc", MARKDOWN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_anchors_of_markdown_links_exist(doc: Path) -> None:
    broken = []
    for target in link_targets(doc.read_text()):
        if SCHEME.match(target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        linked = (doc.parent / path).resolve() if path else doc
        if linked.suffix != ".md" or not linked.is_file():
            continue  # a missing file is the other test's finding
        if anchor not in github_anchors(linked.read_text()):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to headings that do not exist: {', '.join(broken)}"


# Built from parts, so that this file does not name them itself.
PRIVATE_REFERENCES = ("../" + "shared", "DESIGN" + ".md", "VLLM_NOTES" + ".md")
PUBLISHED = ("specwake", "docs", "scenarios", "tests", "benchmarks", "examples", "README.md", "Makefile")


def published_files() -> list[Path]:
    files = []
    for name in PUBLISHED:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        files += [f for f in candidates if f.is_file() and "__pycache__" not in f.parts]
    return files


def test_no_reference_to_files_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    found = []
    for path in published_files():
        if path.resolve() == this:
            continue
        data = path.read_bytes()
        for text in PRIVATE_REFERENCES:
            if text.encode() in data:
                line = data[: data.index(text.encode())].count(b"\n") + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not found, "references to files that are not in the repository:\n" + "\n".join(found)


# -- scenario keys ----------------------------------------------------------------------------------------


def section_models() -> dict[str, type[BaseModel]]:
    """Key prefix (`server.`, `variants.<name>.`) → the pydantic model of that table, from ScenarioFile's fields."""
    found: dict[str, type[BaseModel]] = {}
    for name, field in ScenarioFile.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found[f"{name}."] = annotation
        elif get_origin(annotation) is dict:
            value = get_args(annotation)[1]
            if isinstance(value, type) and issubclass(value, BaseModel):
                found[f"{name}.<name>."] = value
    return found


def test_section_models_are_found() -> None:
    assert set(section_models()) == {"server.", "workload.", "cycle.", "variants.<name>."}


def documented_keys(body: str, prefix: str) -> dict[str, dict[str, str]]:
    """First-column keys of the section's tables that start with `prefix` → their row."""
    return {
        key: row for row in table_rows(body) for key in ticked(next(iter(row.values()), "")) if key.startswith(prefix)
    }


def test_top_level_keys_are_documented() -> None:
    body = sections(SCENARIO_DOC.read_text()).get("Top level")
    assert body is not None, "docs/scenario-format.md has no `## Top level` section"
    fields = set(ScenarioFile.model_fields)
    in_table = {k for row in table_rows(body) for k in ticked(next(iter(row.values()), "")) if "." not in k}
    assert in_table == fields, f"Top level table: missing {fields - in_table}, not keys {in_table - fields}"
    assert keys_line(body) == fields


@pytest.mark.parametrize("prefix", sorted(section_models()))
def test_every_section_key_is_documented(prefix: str) -> None:
    model = section_models()[prefix]
    heading = "`[" + prefix.rstrip(".") + "]`"
    body = sections(SCENARIO_DOC.read_text()).get(heading)
    assert body is not None, f"docs/scenario-format.md has no `## {heading}` section"
    fields = set(model.model_fields)
    in_table = {key.removeprefix(prefix) for key in documented_keys(body, prefix)}
    assert fields - in_table == set(), f"{model.__name__} keys not in the {heading} table: {fields - in_table}"
    assert in_table - fields == set(), f"the {heading} table documents keys that do not exist: {in_table - fields}"
    assert keys_line(body) == fields, f"the `Keys:` line of {heading} differs from {model.__name__}"


@pytest.mark.parametrize("prefix", sorted(section_models()))
def test_documented_defaults_match_the_models(prefix: str) -> None:
    model = section_models()[prefix]
    body = sections(SCENARIO_DOC.read_text())["`[" + prefix.rstrip(".") + "]`"]
    rows = documented_keys(body, prefix)
    for name, field in model.model_fields.items():
        if prefix + name not in rows:
            continue  # test_every_section_key_is_documented names it
        cell = rows[prefix + name].get("default", "")
        if field.is_required():
            assert cell == "required", f"{prefix}{name} is required, the doc says default {cell}"
            continue
        default = field.get_default(call_default_factory=True)
        if default is None or default is PydanticUndefined:
            continue  # "not set", or a default described in words
        expected = f"`{json.dumps(default)}`"
        assert expected in cell, f"{prefix}{name}: the model's default is {expected}, the doc says {cell}"


def interval(key: str) -> str:
    low, high = EXPECT_NUMBERS[key]
    if high == float("inf"):
        return f"> {low:g}" if key in POSITIVE else f"≥ {low:g}"
    return f"{'(' if key in POSITIVE else '['}{low:g}, {high:g})"


def test_expect_keys_ranges_and_values_are_documented() -> None:
    body = sections(SCENARIO_DOC.read_text()).get("`[expect]`")
    assert body is not None, "docs/scenario-format.md has no `## `[expect]`` section"
    rows = documented_keys(body, "expect.")
    wanted = {"expect.<variant>", "expect.graph_safe", *(f"expect.{k}" for k in EXPECT_NUMBERS)}
    assert set(rows) == wanted, f"[expect] table: missing {wanted - set(rows)}, not keys {set(rows) - wanted}"
    for key in EXPECT_NUMBERS:
        assert interval(key) in rows[f"expect.{key}"]["type"], f"expect.{key} must be documented as {interval(key)}"
    values = {v.strip('"') for v in ticked(rows["expect.<variant>"]["type"])}
    assert set(EXPECTATIONS) <= values, f"expectations not documented: {set(EXPECTATIONS) - values}"
    assert set(EXPECT_NUMBERS) <= keys_line(body)


# -- outcomes -----------------------------------------------------------------------------------------------


def column(doc: Path, heading: str, name: str) -> list[str]:
    """Code spans in column `name` of the tables under `heading` (any level) up to the next heading."""
    text = FENCE.sub("", doc.read_text())
    match = re.search(rf"^#+ {re.escape(heading)}\s*$(.*?)(?=^#)", text + "\n#", re.MULTILINE | re.DOTALL)
    assert match is not None, f"{doc.relative_to(ROOT)} has no heading {heading!r}"
    return [v for row in table_rows(match.group(1)) for v in ticked(row.get(name, ""))]


def test_the_outcome_rules_in_how_it_works_are_the_codes_table_in_its_order() -> None:
    text = FENCE.sub("", (DOCS / "how-it-works.md").read_text())
    match = re.search(r"^#+ Outcome of a variant\s*$(.*?)(?=^#)", text + "\n#", re.MULTILINE | re.DOTALL)
    assert match is not None
    rows = [(row["#"], row["outcome"], row["rule"]) for row in table_rows(match.group(1))]
    assert rows == [(str(n), f"`{r.outcome}`", r.text) for n, r in enumerate(RULES, 1)]
    assert {r.outcome for r in RULES} == set(OUTCOMES)  # every outcome has a rule
    assert f"`{INCOMPLETE}`" in text


def test_every_outcome_is_listed_in_scenario_format_and_results() -> None:
    listed = column(SCENARIO_DOC, "`[expect]`", "outcome")
    assert set(listed) == set(OUTCOMES)
    field = next(row for row in table_rows((DOCS / "results.md").read_text()) if row.get("field") == "`outcome`")
    assert set(ticked(field["meaning"])) == {*OUTCOMES, INCOMPLETE}


def test_every_crash_class_is_explained() -> None:
    classes = column(DOCS / "how-it-works.md", "Crash classes", "class")
    assert sorted(classes) == sorted(MEANINGS)
