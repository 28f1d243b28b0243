"""Run folders, in one place: their names, creating them (never over an existing one), writing and loading
`result.json` with its report files, and finding runs in a results folder ("the latest run" included).

Layout: `<results>/<UTC yyyymmdd-hhmmss>-<label>[-N]/` holds `result.json`, `report.md`, `stages.csv` and
`logs/<variant>.log` for one scenario; a run of several scenarios holds one such folder per scenario (named
after it) and a combined `report.md`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specwake.errors import InputError, ResultsUnwritable
from specwake.files import write_atomic
from specwake.report import render_csv, render_markdown
from specwake.results import ScenarioResult, from_dict, to_json

RESULT_FILE = "result.json"
REPORT_FILE = "report.md"
STAGES_FILE = "stages.csv"
LOGS = "logs"
RUN_NAME = re.compile(r"^(\d{8}-\d{6})-.+")  # <UTC yyyymmdd-hhmmss>-<label>[-N]
MAX_SUFFIX = 1000


def new_run_dir(root: Path, label: str, now: dt.datetime) -> Path:
    """Create `<root>/<UTC yyyymmdd-hhmmss>-<label>[-N]`, the first name not taken; never reuses a folder."""
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, MAX_SUFFIX):
            path = root / (f"{stamp}-{label}" + (f"-{n}" if n > 1 else ""))
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
    except OSError as exc:
        raise ResultsUnwritable(f"results folder not writable: {exc.filename or root}: {exc.strerror}") from None
    raise ResultsUnwritable(f"{root}: could not find a free run folder name")


def check_writable(root: Path) -> None:
    """Fail before anything is launched when results could not be written (exit 3, naming the path)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".specwake-write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ResultsUnwritable(f"results folder not writable: {exc.filename or root}: {exc.strerror}") from None


def write_run_files(run_dir: Path, result: ScenarioResult) -> None:
    """Write result.json, report.md and stages.csv into `run_dir`, each atomically.

    Raises ResultsUnwritable naming the folder when anything cannot be written.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / RESULT_FILE, to_json(result))
        write_atomic(run_dir / REPORT_FILE, render_markdown([result]))
        write_atomic(run_dir / STAGES_FILE, render_csv([result]))
    except OSError as exc:
        raise ResultsUnwritable(f"{run_dir}: cannot write run files: {exc}") from exc


def load_result(path: Path) -> ScenarioResult:
    """Read a result.json or a run folder's; raises InputError("<path>: <reason>") otherwise."""
    file = path / RESULT_FILE if path.is_dir() else path
    if not file.exists():
        raise InputError(f"{file}: no such file")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{file}: cannot read: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{file}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{file}: not a specwake result (top level is not an object)")
    try:
        return from_dict(data)
    except ValueError as exc:
        raise InputError(f"{file}: {exc}") from exc
    except (TypeError, AttributeError) as exc:
        raise InputError(f"{file}: not a specwake result: {exc}") from exc


def scenario_results(run_dir: Path) -> list[Path]:
    """The result.json files of a run folder: its own, or one per scenario sub-folder (in name order). Sub-folders
    named like runs are runs of a results folder, not scenarios of one run."""
    own = run_dir / RESULT_FILE
    if own.is_file():
        return [own]
    return sorted(p for p in run_dir.glob(f"*/{RESULT_FILE}") if not RUN_NAME.match(p.parent.name))


def run_order(run: Path) -> tuple[str, int, str]:
    """Sort key of run folders: timestamp, then name length (`x` before `x-2` before `x-10`), then name."""
    match = RUN_NAME.match(run.name)
    return (match.group(1) if match else ""), len(run.name), run.name


def runs_in(folder: Path) -> list[Path]:
    """Run folders directly inside `folder` that hold results, oldest first."""
    try:
        entries = [e for e in folder.iterdir() if e.is_dir() and RUN_NAME.match(e.name)]
    except OSError as exc:
        raise InputError(f"{folder}: cannot list: {exc.strerror or exc}") from exc
    return sorted((e for e in entries if scenario_results(e)), key=run_order)


@dataclass(frozen=True)
class Loaded:
    """Results behind a path, and which run a results folder was taken to mean (None when none was chosen)."""

    results: list[ScenarioResult]
    picked: Path | None = None


def load_results(path: Path, *, every_run: bool = False) -> Loaded:
    """Results behind a path: a result.json, a run folder (one or many scenarios), or a results folder — its
    latest run, or with `every_run` all of its runs, oldest first. InputError naming the path otherwise."""
    path = Path(path)
    if path.is_file():
        return Loaded([load_result(path)])
    if not path.is_dir():
        raise InputError(f"{path}: no such file or folder")
    own = scenario_results(path)
    if own:
        return Loaded([load_result(p) for p in own])
    runs = runs_in(path)
    if not runs:
        raise InputError(f"{path}: no {RESULT_FILE} here, and no run folder (<yyyymmdd-hhmmss>-<name>) holding one")
    if every_run:
        return Loaded([load_result(p) for run in runs for p in scenario_results(run)])
    latest = runs[-1]
    return Loaded([load_result(p) for p in scenario_results(latest)], picked=latest)


def load_many(paths: Sequence[Path], *, every_run: bool = False, note: Callable[[str], None]) -> list[ScenarioResult]:
    """load_results over several paths; `note` hears which run each results folder was taken to mean."""
    results = []
    for path in paths:
        loaded = load_results(path, every_run=every_run)
        if loaded.picked is not None:
            note(f"{path} is a results folder: using its latest run, {loaded.picked}")
        results += loaded.results
    return results
