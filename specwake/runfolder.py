"""Run folders, in one place: their layout (RunLayout gives every path), creating them (never over an existing
one), writing the files a renderer made and loading `result.json`, and finding runs in a results folder ("the latest
run" included). What goes into the files is specwake.report's.

Layout: `<results>/<UTC yyyymmdd-hhmmss>-<label>[-N]/` holds `result.json`, `report.md`, `stages.csv` and
`logs/<variant>.log` for one scenario; a run of several scenarios holds one such folder per scenario (named
after it) and a combined `report.md`. A shard's folder ends `-shard-KofN`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specwake.errors import InputError, ResultsUnwritable
from specwake.files import what_it_is, write_atomic
from specwake.results import ScenarioResult, from_dict

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


def check_writable(root: Path, flag: str = "--output") -> None:
    """Fail before anything is launched when results could not be written: a file where the folder `flag` names (or
    one above it) would be is bad input (exit 2), a folder refused to us the machine's problem (exit 3); each names
    the path. Creates nothing: a run refused later must not leave an empty results folder behind."""
    existing = root
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file, not a folder" if existing.is_file() else "is not a folder"
        raise InputError(f"{flag}: " + (f"{root}: " if existing != root else "") + f"{existing} {what}")
    try:
        if existing != root:  # the folders a run would create: their nearest existing parent must take one
            Path(tempfile.mkdtemp(dir=existing, prefix=".specwake-write-test-")).rmdir()
        else:
            probe = root / f".specwake-write-test-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
    except OSError as exc:
        raise ResultsUnwritable(f"results folder not writable: {root}: {exc.strerror}") from None


@dataclass(frozen=True)
class RunLayout:
    """Where everything of one run goes: a scenario's folder, its logs, the combined report of several scenarios."""

    root: Path
    scenarios: tuple[str, ...]  # the names of the run's scenarios

    @classmethod
    def new(cls, output: Path, scenarios: Sequence[str], now: dt.datetime, shard: str | None = None) -> RunLayout:
        """A new run folder under `output`: named after its one scenario, or `N-scenarios`; `shard` "KofN"."""
        label = scenarios[0] if len(scenarios) == 1 else f"{len(scenarios)}-scenarios"
        return cls(new_run_dir(output, label + (f"-shard-{shard}" if shard else ""), now), tuple(scenarios))

    def scenario_dir(self, scenario: str) -> Path:
        return self.root if len(self.scenarios) == 1 else self.root / scenario

    def log_file(self, scenario: str, variant: str) -> Path:
        return self.scenario_dir(scenario) / LOGS / f"{variant}.log"

    @property
    def combined_report(self) -> Path | None:
        """The report of every scenario together: only a run of several has one."""
        return self.root / REPORT_FILE if len(self.scenarios) > 1 else None

    def create(self) -> None:
        """Every scenario folder with its logs folder; ResultsUnwritable (exit 3) naming the path otherwise."""
        try:
            for name in self.scenarios:
                (self.scenario_dir(name) / LOGS).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsUnwritable(f"results folder not writable: {exc.filename}: {exc.strerror}") from None


def write_files(folder: Path, files: Mapping[str, str]) -> None:
    """Write each file name → text into `folder`, each atomically (result.json, report.md, stages.csv of a scenario:
    specwake.report.run_files makes them). Raises ResultsUnwritable naming the folder when one cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_atomic(folder / name, text)
    except OSError as exc:
        raise ResultsUnwritable(f"{folder}: cannot write run files: {exc}") from exc


def load_result(path: Path) -> ScenarioResult:
    """Read a result.json or a run folder's; raises InputError("<path>: <reason>") otherwise."""
    file = path / RESULT_FILE if path.is_dir() else path
    problem = what_it_is(file)
    if problem is not None:
        raise InputError(f"{file}: {'no such file' if problem == 'not found' else problem}")
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


def run_id(file: Path) -> str | None:
    """The name of the run folder a result.json lies in: its own folder, or the run folder above a scenario's
    sub-folder (a run of several scenarios); None outside run folders."""
    folder = file.absolute().parent
    return next((f.name for f in (folder, folder.parent) if RUN_NAME.match(f.name)), None)


def load_found(file: Path) -> ScenarioResult:
    """load_result, with the run folder it was found in as `scenario.run` (what `report` and `compare` show to tell
    runs apart; never written back)."""
    result = load_result(file)
    run = run_id(file)
    if run is None or "run" in result.scenario:
        return result
    return replace(result, scenario={**result.scenario, "run": run})


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
    latest run, or with `every_run` all of its runs, oldest first; each with its run folder (load_found). InputError
    naming the path otherwise."""
    path = Path(path)
    if path.is_file():
        return Loaded([load_found(path)])
    if not path.is_dir():
        problem = what_it_is(path)
        raise InputError(f"{path}: {'no such file or folder' if problem == 'not found' else problem}")
    own = scenario_results(path)
    if own:
        return Loaded([load_found(p) for p in own])
    runs = runs_in(path)
    if not runs:
        raise InputError(f"{path}: no {RESULT_FILE} here, and no run folder (<yyyymmdd-hhmmss>-<name>) holding one")
    if every_run:
        return Loaded([load_found(p) for run in runs for p in scenario_results(run)])
    latest = runs[-1]
    return Loaded([load_found(p) for p in scenario_results(latest)], picked=latest)


def load_many(paths: Sequence[Path], *, every_run: bool = False, note: Callable[[str], None]) -> list[ScenarioResult]:
    """load_results over several paths; `note` hears which run each results folder was taken to mean."""
    results = []
    for path in paths:
        loaded = load_results(path, every_run=every_run)
        if loaded.picked is not None:
            note(f"{path} is a results folder: using its latest run, {loaded.picked}")
        results += loaded.results
    return results
