"""The end-to-end tier's shared real run: every scenario the CPU-matrix modules assert on, in one `specwake run`
started once per pytest session (tests/e2e/conftest.py), its servers side by side on the machine's cores.

A module names its scenarios with `pytestmark = pytest.mark.shared_run(Scenarios(...))` and reads them back with
`SharedRun.view`: the same answer `procs.run_scenario_cli` gives for a run of those scenarios alone (their result.json
files, their folder), beside the shared process and what it left running. Only the scenarios of the modules pytest
selected run: `pytest tests/e2e/test_vllm.py` runs tiny-cpu alone.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specwake.prepare.scenario import load_scenario
from tests.helpers.paths import REPO
from tests.helpers.procs import run_scenario_cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MARKER = "shared_run"
# The runner of every shared scenario that leaves it to vLLM's choice: V1. Those modules test specwake's verdicts,
# fingerprints, pushes, syncs, faults and data parallelism, none of which depends on the runner, and on this 2-core
# machine Model Runner V2 (its Triton programs interpreted) costs several times V1's per token. The modules about the
# runners name V2 in their own scenarios: every family (test_families.py), the fix's runner hunks (test_runners.py),
# DSpark (test_dspark.py) and Qwen3.5 (test_qwen35.py).
RUNNER_FLAGS = ("--model-runner", "v1")
# pytest-timeout counts the setup of the test that starts the shared run: the run's own limit must fire first, with
# the process's output in its message.
TIMEOUT_MARGIN_S = 300.0


@dataclass(frozen=True)
class Scenarios:
    """One module's scenarios in the shared run: `write(folder)` writes its files into `folder` (a folder of its own)
    or names shipped ones, and returns their paths. `key` names the module's share (its folder); `budget_s` is what
    the scenarios may add to the shared run's time limit: the limit of a run of them alone (specwake's own deadlines,
    a server's start, each step and request, end a stuck server well before)."""

    key: str
    write: Callable[[Path], Sequence[Path]]
    budget_s: float

    @classmethod
    def shipped(cls, key: str, *paths: str, budget_s: float) -> Scenarios:
        """Scenario files of the repository, as they are (paths from its root)."""
        return cls(key, lambda _folder: [REPO / p for p in paths], budget_s)


def budget(every: Sequence[Scenarios]) -> float:
    """The shared run's limit: the sum of its scenarios' own, as their separate runs had."""
    return sum(s.budget_s for s in every)


def timeout_for(every: Sequence[Scenarios]) -> float:
    """pytest-timeout's limit for a test of the shared run: the run's limit, and the margin for its own."""
    return budget(every) + TIMEOUT_MARGIN_S


def wanted(items: Iterable[pytest.Item]) -> list[Scenarios]:
    """The scenarios of the selected tests' modules, each once, in key order."""
    found = {m.args[0].key: m.args[0] for item in items for m in item.iter_markers(MARKER)}
    return [found[key] for key in sorted(found)]


@dataclass(frozen=True)
class SharedRun:
    """`run_scenario_cli`'s answer for the shared run, and the names of each module's scenarios in it."""

    run: dict[str, Any]
    names: dict[str, list[str]]  # Scenarios.key → scenario names

    def folder(self, name: str) -> Path:
        """A scenario's folder: its own in a run of several, the run's folder in a run of one."""
        root: Path = self.run["dir"]
        return root / name if self.run["results"] else root

    def view(self, scenarios: Scenarios) -> dict[str, Any]:
        """The run as a run of `scenarios` alone would read: `result` and `dir` (its folder) for one scenario, the
        shared folder (with the combined report) for several; `results` by name; the shared `proc` and
        `leftovers`."""
        names = self.names[scenarios.key]
        alone = {names[0]: self.run["result"]} if self.run["result"] else {}  # a run of one scenario
        every = self.run["results"] or alone
        proc = self.run["proc"]
        missing = [n for n in names if n not in every]
        assert not missing, f"no result.json for {missing} (exit {proc.returncode})\nstderr:\n{proc.stderr[-6000:]}"
        results = {n: every[n] for n in names}
        one = len(names) == 1
        return {
            "proc": proc,
            "leftovers": self.run["leftovers"],
            "results": results,
            "result": results[names[0]] if one else {},
            "dir": self.folder(names[0]) if one else self.run["dir"],
        }


def start(every: Sequence[Scenarios], scenario_folder: Path, output: Path) -> SharedRun:
    """Write every module's scenarios into a folder of its own under `scenario_folder` and run them all at once
    (`specwake run A.toml B.toml ... --output OUTPUT`)."""
    paths: dict[str, list[Path]] = {}
    for scenarios in every:
        own = scenario_folder / scenarios.key
        own.mkdir()
        paths[scenarios.key] = list(scenarios.write(own))
    names = {key: [load_scenario(p).name for p in files] for key, files in paths.items()}
    files = [str(p) for found in paths.values() for p in found]
    run = run_scenario_cli(files, output, timeout=budget(every), flags=RUNNER_FLAGS)
    return SharedRun(run, names)


EVENT = re.compile(r"^\[\s*(\d+(?:\.\d+)?)s\] (.*)$")
PREPARED = "results in "  # the event that ends a run's preparation (probes, overlays, builtin models, validation)
PHASES = ("startup", "measurement", "cycle_steps", "diagnostics", "teardown")  # a variant's info.timings


def breakdown(run: dict[str, Any]) -> list[str]:
    """Where the shared run's time went, in lines for the session's summary: its wall time; its preparation (engine
    probe, overlays, builtin model builds, vLLM's validation: until the run names its folder); and the server-seconds
    of every variant's phases (servers run side by side, so these add up to more than the wall time)."""
    output = f"{run['proc'].stderr}\n{run['proc'].stdout}"  # events go to stderr, the report to stdout
    times = sorted((float(m[1]), m[2]) for line in output.splitlines() if (m := EVENT.match(line)))
    if not times:
        return ["shared run: no events (it printed nothing the summary can read)"]
    prepared = next((t for t, text in times if text.startswith(PREPARED)), None)
    variants = [v for result in (run["results"] or {"": run["result"]}).values() for v in result.get("variants", [])]
    spent = dict.fromkeys(PHASES, 0.0)
    for variant in variants:
        for phase, seconds in (variant.get("info", {}).get("timings") or {}).items():
            if phase in spent and isinstance(seconds, int | float):
                spent[phase] += seconds
    phases = ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in spent.items())
    return [
        f"shared run: {times[-1][0]:.0f} s wall, {len(variants)} servers"
        + (f"; preparation (probe, overlays, builtin models, validation) {prepared:.0f} s" if prepared else ""),
        f"shared run, server-seconds by phase (side by side, so more than the wall time): {phases}",
    ]


def outcome_note(run: dict[str, Any]) -> str:
    """The shared process's exit code and output tails, for an assertion's message."""
    proc = run["proc"]
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


def restores(variant: dict[str, Any], role: str = "draft") -> list[dict[str, Any]]:
    """The model's fingerprint (rank 0) after each reload, in cycle order."""
    found = [d for d in variant["diagnostics"] if d["point"] == "after reload_weights"]
    return [d["fingerprints"][0][role] for d in sorted(found, key=lambda d: d["cycle"])]


def draft_update_to_the_target(
    run: dict[str, Any], scenario: str, variant: dict[str, Any]
) -> tuple[dict[str, Any], str, str]:
    """A draft update routed to the target (push_fault = "draft-to-target"), push or sync: the reading after the draft
    update, which must show the target changed and the drafter not; the variant's line of the scenario's report; the
    report."""
    draft_update = next(d for d in variant["diagnostics"] if d.get("update") == "draft")
    rank = draft_update["fingerprints"][0]
    assert rank["target"]["changed"] > 0 and rank["draft"]["changed"] == 0
    report = (run["dir"] / scenario / "report.md").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("- **draft-to-target**: corrupt"))
    return draft_update, line, report


def assert_a_small_copy_of(text: str, shipped: Path) -> None:
    """A scenario the shared run makes smaller runs the shipped family's server and drafter unchanged."""
    small, original = tomllib.loads(text), tomllib.loads(shipped.read_text())
    assert small["server"] == original["server"] and small["speculative"] == original["speculative"]


def assert_stock_collapses_from_k_plus_1(base: dict[str, Any], k: int = 3) -> None:
    """Stock vLLM on a builtin pair: AL exactly K + 1 fresh (every draft accepted), 1.00 after every cycle with the text
    unchanged, the target restored by the reload and the drafter not."""
    fresh, *after = base["stages"]
    assert base["outcome"] == "collapse" and fresh["acceptance_length"] == k + 1
    assert after and all(s["acceptance_length"] == 1.0 and s["outputs_match_fresh"] for s in after)
    assert all(fp["differ"] == 0 for fp in restores(base, "target")) and all(fp["differ"] > 0 for fp in restores(base))
