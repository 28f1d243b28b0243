"""Where the Hub ids of the shipped GPU scenarios (scenarios/*.toml, not scenarios/cpu/) are named, as each file's
header says, one id a line:

    #   <org>/<name> — vLLM 0.33.0 code: vllm/<path>:<line>
    #   <org>/<name> — vLLM tests: <path>:<line> (commit <sha>)        (or: vLLM docs: …)
    #   <org>/<name> — model card: https://huggingface.co/<org>/<name>
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specwake.prepare.models import is_builtin
from specwake.prepare.scenario import load_scenario
from tests.helpers.paths import REPO

GPU_SCENARIOS = sorted((REPO / "scenarios").glob("*.toml"))
_LINE = re.compile(
    r"^#   (?P<id>[\w.-]+/[\w.-]+) — (?:"
    r"vLLM (?P<version>\d+\.\d+\.\d+) code: (?P<code>vllm/\S+):(?P<code_line>\d+)"
    r"|vLLM (?P<kind>tests|docs): (?P<path>\S+):(?P<line>\d+) \(commit (?P<commit>[0-9a-f]{7,40})\)"
    r"|model card: (?P<card>https://huggingface\.co/\S+))$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Source:
    model: str
    kind: str  # "code" | "tests" | "docs" | "model card"
    where: str  # vllm/… path, repository path, or the card's URL
    line: int | None = None
    version: str | None = None  # the release whose wheel holds `where` (code only)


def header(path: Path) -> str:
    return path.read_text(encoding="utf-8").split("\n[", 1)[0]


def sources(path: Path) -> dict[str, Source]:
    """Model id → the source its scenario's header names for it."""
    found = {}
    for m in _LINE.finditer(header(path)):
        if m["code"]:
            found[m["id"]] = Source(m["id"], "code", m["code"], int(m["code_line"]), m["version"])
        elif m["path"]:
            found[m["id"]] = Source(m["id"], m["kind"], m["path"], int(m["line"]))
        else:
            found[m["id"]] = Source(m["id"], "model card", m["card"])
    return found


def hub_ids(path: Path) -> list[str]:
    """The scenario's model references that name a Hub repository (not builtin, not a local folder)."""
    scenario = load_scenario(path)
    refs = [scenario.server.model, scenario.speculative.get("model")]
    return [r for r in dict.fromkeys(refs) if isinstance(r, str) and not is_builtin(r) and not Path(r).is_absolute()]
