"""End to end on real vLLM CPU: broken reload_weights must be named for what they are.

Runs tests/data/crash-cpu.toml through the CLI, in the session's shared run (tests/helpers/shared_runs.py): the
baseline is still measured (it collapses); the patched variant's reload_weights raises (outcome crash, class
step_failed); the skiptarget variant's reload_weights skips the target (outcome corrupt: wrong text, the target's
weights unlike fresh). Every expectation is met. Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.procs import require_module, variant_of
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

SCENARIOS = Scenarios.shipped("crash", "tests/data/crash-cpu.toml", budget_s=1200)
pytestmark = pytest.mark.shared_run(SCENARIOS)

require_module("vllm")


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


variant = variant_of


def test_verdict_pass_every_expectation_met(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "pass" and run["result"]["complete"] is True, outcome_note(run)
    assert all(v["matched"] for v in run["result"]["variants"])


def test_no_server_process_left(run: dict[str, Any]) -> None:
    assert run["leftovers"] == []


def test_patched_crashes_in_reload_weights(run: dict[str, Any]) -> None:
    patched = variant(run, "patched")
    assert patched["outcome"] == "crash" and patched["expected"] == "crash"
    assert patched["crash_class"] == "step_failed"
    assert "reload_weights failed on purpose" in patched["error"]
    assert patched["overlay"] and patched["vllm_file"].startswith(patched["overlay"] + "/")
    failed = [s for s in patched["steps"] if not s["ok"]]
    assert [s["name"] for s in failed] == ["reload_weights"]
    assert failed[0]["status"] == 500
    assert [s["name"] for s in patched["stages"]] == ["fresh"]  # measured before the cycle, none after
    log = Path(patched["log_path"]).read_text(errors="replace")
    assert "reload_weights failed on purpose" in log  # the worker's traceback reached the server log


def test_baseline_still_measured_and_collapses(run: dict[str, Any]) -> None:
    base = variant(run, "baseline")
    assert base["outcome"] == "collapse" and base["crash_class"] is None and base["error"] is None
    assert [s["name"] for s in base["stages"]] == ["fresh", "after L2 #1"]
    fresh, after = base["stages"]
    assert fresh["acceptance_length"] >= 3.9
    assert after["num_drafts"] > 0 and after["acceptance_length"] <= 1.05
    assert all(s["ok"] for s in base["steps"])


def test_report_names_the_crash(run: dict[str, Any]) -> None:
    report = (run["dir"] / "report.md").read_text()
    assert "crash" in report and "collapse" in report
    assert "First error the server announced: `RuntimeError: specwake test: reload_weights failed on purpose`" in report


def test_a_reload_that_skips_the_target_is_corrupt_not_collapse(run: dict[str, Any]) -> None:
    skipped = variant(run, "skiptarget")
    assert skipped["outcome"] == "corrupt" and skipped["matched"] is True
    fresh, after = skipped["stages"]
    assert after["outputs_match_fresh"] is False
    restore = [d for d in skipped["diagnostics"] if d["point"] == "after reload_weights"]
    target = restore[0]["fingerprints"][0]["target"]
    # every parameter and packed weight still discarded; its buffers, which an L2 sleep keeps, match
    assert target["differ"] == target["compared"] - target["kinds"]["buffer"] > 0 and target["packed_discarded"] > 0
    assert restore[0]["fingerprints"][0]["draft"]["differ"] == 0  # the drafter it reloaded instead is fine
    report = (run["dir"] / "report.md").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("- **skiptarget**"))
    assert "the target was not restored: after L2 #1: completions differ from fresh (request 1, from character" in line
    assert "target: " in line and "tensors differ from fresh" in line
