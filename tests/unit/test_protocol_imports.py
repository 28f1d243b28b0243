"""specwake/protocol.py is shared by the CLI process and the workers in vLLM's interpreter, so it imports nothing
from specwake, and specwake/weight_updates.py, shared alike, nothing but protocol (a folder's ruff.toml holds the
folders' order; these files have no folder of their own, so this test holds it)."""

from __future__ import annotations

import ast

from tests.helpers.paths import REPO

PROTOCOL = REPO / "specwake" / "protocol.py"
WEIGHT_UPDATES = REPO / "specwake" / "weight_updates.py"


def specwake_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "specwake"):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "specwake"]
    return found


def test_protocol_imports_nothing_from_specwake() -> None:
    assert specwake_imports(PROTOCOL.read_text()) == []


def test_weight_updates_imports_nothing_from_specwake_but_protocol() -> None:
    assert specwake_imports(WEIGHT_UPDATES.read_text()) == ["specwake.protocol"]


def test_the_check_sees_every_form_of_import() -> None:
    source = "import specwake.results\nfrom specwake.errors import X\nfrom . import files\nimport json\n"
    assert specwake_imports(source) == ["specwake.results", "specwake.errors", "."]
