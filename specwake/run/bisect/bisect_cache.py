"""The outcomes `specwake bisect` measured, kept in specwake's cache so that a later bisect never runs the same step
again: each keyed by everything that decides a step's outcome, and reused with a line saying so (`--remeasure` runs
it anyway and replaces what was kept).

A step's outcome depends on the installed vLLM build (its install stamp: vLLM and torch as installed in the variant's
interpreter), the diff of vllm/ overlaid on it (from BASE to the commit: two commits whose diffs are the same share it,
whichever they are), the scenario as the step runs it (its resolved settings and prompts, the chosen variant alone,
cycles included) and the specwake that measures. The model's files are not read: a scenario naming a local folder
whose weights changed needs `--remeasure`. Outcomes that say nothing about the commit (`error`, `untested`, an
interrupted step) are never kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwake import __version__
from specwake.files import write_cache
from specwake.judge.verdict import NOT_TESTED, OUTCOMES
from specwake.prepare.releases import ByRelease
from specwake.prepare.scenario import Scenario

FOLDER = "bisect"  # under specwake's cache (SPECWAKE_CACHE, else ~/.cache/specwake)
UNMEASURED = ("name", "description")  # settings that change no measurement (nor does the file's path)
FORMAT = 1  # raised when what a key covers or an entry holds changes: older entries are then never read


@dataclass(frozen=True)
class Measured:
    """What one step measured, as a later bisect reuses it."""

    outcome: str
    al_fresh: float | None
    al_after: tuple[float | None, ...]
    seconds: float
    commit: str  # the commit that was measured (another with the same diff from BASE reuses it)
    folder: str  # that step's run folder, with its result.json and server logs
    measured_at: str  # ISO 8601, UTC


def step_key(scenario: Scenario, variant: str, diff: str, stamp: str) -> str:
    """The key of a step's outcome: the installed build (`stamp`, engine.install_stamp of the variant's interpreter),
    the diff overlaid, the scenario's resolved settings and prompts with `variant` alone, as the step runs it (no
    patch of its own, no expectation: the outcome is judged after), and specwake's version."""
    chosen = next(v for v in scenario.variants if v.name == variant)
    ran = dataclasses.replace(
        scenario, variants=(dataclasses.replace(chosen, patches=None, expects=ByRelease.plain("any")),)
    )
    settings = {k: v for k, v in ran.settings().items() if k not in UNMEASURED}
    material = {
        "format": FORMAT,
        "specwake": __version__,
        "build": stamp,
        "diff": hashlib.sha256(diff.encode()).hexdigest(),
        "scenario": settings,
        "prompts": list(scenario.prompts),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def keeps(outcome: str) -> bool:
    """Whether an outcome says something about the commit, and so may be reused."""
    return outcome in OUTCOMES and outcome not in NOT_TESTED


def entry_file(cache: Path, key: str) -> Path:
    return cache / FOLDER / f"{key}.json"


def recall(cache: Path, key: str) -> Measured | None:
    """The outcome kept under `key`, or None (none kept, or an entry that does not read as one)."""
    try:
        data: dict[str, Any] = json.loads(entry_file(cache, key).read_text())
        measured = Measured(**{**data, "al_after": tuple(data["al_after"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return measured if keeps(measured.outcome) else None


def keep(cache: Path, key: str, measured: Measured) -> None:
    """Keep a step's outcome under `key` (not one that says nothing about the commit); a cache that cannot be
    written only costs a later bisect the run."""
    if keeps(measured.outcome):
        write_cache(entry_file(cache, key), json.dumps(dataclasses.asdict(measured), indent=2) + "\n")
