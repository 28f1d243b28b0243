"""The nightly GitHub workflow (examples/nightly-gpu.yml): valid against GitHub's workflow schema (the copy that
check-jsonschema ships, so offline), every action on a current major, and its merge job red when the night regressed:
the trend step is run here as GitHub runs it — with the shell the workflow declares — on results built from the test
builders, the newer one with a patched variant's AL dropped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from specwake.report import run_files
from specwake.results import ScenarioResult
from specwake.runfolder import write_files
from tests.helpers.builders import dropped, scaled, tiny_cpu
from tests.helpers.paths import REPO
from tests.helpers.procs import check_schema

WORKFLOW = REPO / "examples" / "nightly-gpu.yml"
# How GitHub runs `run:` for `shell: bash` and for no shell at all (docs: "Defaults / shell").
SHELLS = {"bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"], None: ["bash", "-e"]}
NODE24_MAJORS = {  # the first major of each action whose action.yml says `runs.using: node24`, or later
    "actions/checkout": 5,
    "actions/upload-artifact": 6,
    "actions/download-artifact": 7,
    "mikepenz/action-junit-report": 6,
}


def workflow() -> dict[str, Any]:
    return dict(yaml.safe_load(WORKFLOW.read_text()))


def step(name: str) -> dict[str, Any]:
    return next(s for job in workflow()["jobs"].values() for s in job["steps"] if s.get("name", "").startswith(name))


def test_the_workflow_is_valid_against_githubs_schema() -> None:
    proc = check_schema(WORKFLOW, "vendor.github-workflows")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_action_runs_on_node24() -> None:
    uses = [s["uses"] for job in workflow()["jobs"].values() for s in job["steps"] if "uses" in s]
    assert uses
    for ref in uses:
        name, _, version = ref.partition("@")
        assert name in NODE24_MAJORS, f"{ref}: not an action this test knows the node24 major of"
        assert int(version.removeprefix("v").split(".")[0]) >= NODE24_MAJORS[name], ref


def test_the_servers_get_a_hub_token_for_the_gated_model() -> None:
    assert workflow()["jobs"]["shard"]["env"]["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}"
    assert "meta-llama" in (REPO / "scenarios" / "eagle3-eager.toml").read_text()  # why it is needed


def test_the_merge_job_fails_when_a_shard_failed() -> None:
    last = workflow()["jobs"]["merge"]["steps"][-1]
    assert last["if"] == "always() && needs.shard.result != 'success'" and "exit 1" in last["run"]


def write_run(folder: Path, result: ScenarioResult) -> None:
    write_files(folder / f"20261201-021700-{result.name}", run_files(result))


def trend(tmp_path: Path, nights: list[ScenarioResult], new: ScenarioResult) -> subprocess.CompletedProcess[str]:
    """The trend step's script, run in a workspace holding the kept nights (history/<date>/, oldest first) and
    tonight's results, with the shell the workflow declares; `.venv/bin/specwake` is this checkout's specwake."""
    for day, night in enumerate(nights, start=1):
        write_run(tmp_path / "history" / f"202611{day:02d}", night)
    write_run(tmp_path / "merged", new)
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "specwake").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m specwake.cli "$@"\n')
    (venv / "specwake").chmod(0o755)
    summary = tmp_path / "summary.md"
    shell = SHELLS[workflow().get("defaults", {}).get("run", {}).get("shell")]
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*shell, "-c", step("Trend against the earlier nights")["run"]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_trend_step_fails_the_night_on_a_regression(tmp_path: Path) -> None:
    proc = trend(tmp_path, [tiny_cpu()], dropped(tiny_cpu()))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # compare's exit code survives `| tee`
    assert "regression" in (tmp_path / "summary.md").read_text()


def test_the_trend_step_passes_a_night_like_the_last(tmp_path: Path) -> None:
    proc = trend(tmp_path, [tiny_cpu()], tiny_cpu())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_trend_step_calls_tok_s_against_every_kept_night(tmp_path: Path) -> None:
    nights = [scaled(tiny_cpu(), f) for f in (1.0, 0.98, 1.02, 1.01)]  # GPU nights: a real discard
    proc = trend(tmp_path, nights, scaled(tiny_cpu(), 0.5))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "4 earlier runs" in summary and "| tok/s, every stage |" in summary


def test_the_kept_nights_roll_over_at_seven(tmp_path: Path) -> None:
    history = tmp_path / "history"
    for day in range(1, 9):
        (history / f"202611{day:02d}").mkdir(parents=True)
    (tmp_path / "merged").mkdir()
    shell = SHELLS[workflow().get("defaults", {}).get("run", {}).get("shell")]
    keep = step("Keep tonight with the last 7 nights")["run"]
    proc = subprocess.run([*shell, "-c", keep], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    kept = sorted(p.name for p in history.iterdir())
    assert len(kept) == 7 and "20261101" not in kept and "20261102" not in kept  # tonight in, the oldest two out
