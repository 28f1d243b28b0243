"""End to end on real vLLM CPU in bfloat16: scenarios/tiny-cpu-bf16.toml through the CLI, in the session's shared
run (tests/helpers/shared_runs.py). Completions are compared with fresh the way vLLM's model tests compare two runs, so
stock vLLM reads `collapse` and the reference patch `recover`; where a collapsed stage's tokens part from fresh at a
near-tie (bf16 kernels of another step shape), that is a note, never `corrupt`. Skips only when vLLM is missing and
SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.procs import require_module, variant_of
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

SCENARIOS = Scenarios.shipped("tiny-cpu-bf16", "scenarios/tiny-cpu-bf16.toml", budget_s=1500)
pytestmark = pytest.mark.shared_run(SCENARIOS)

require_module("vllm")


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


variant = variant_of


def test_verdict_pass(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "pass" and run["result"]["complete"] is True, outcome_note(run)
    assert run["leftovers"] == []


def test_the_servers_ran_in_bfloat16(run: dict[str, Any]) -> None:
    for v in run["result"]["variants"]:
        command = v["command"]
        assert command[command.index("--dtype") + 1] == "bfloat16"


def test_stock_collapses_and_the_fix_recovers_in_bf16(run: dict[str, Any]) -> None:
    base, patched = variant(run, "baseline"), variant(run, "patched")
    assert (base["outcome"], patched["outcome"]) == ("collapse", "recover")
    assert base["stages"][0]["acceptance_length"] >= 3.9
    assert all(s["acceptance_length"] <= 1.05 for s in base["stages"][1:])
    assert all(s["acceptance_length"] >= 3.9 for s in patched["stages"])


def test_every_post_cycle_completion_is_fresh_or_a_near_tie_flip_and_each_flip_is_a_note(run: dict[str, Any]) -> None:
    report = (run["dir"] / "report.md").read_text()
    for v in run["result"]["variants"]:
        for s in v["stages"][1:]:
            assert s["outputs_close_to_fresh"] is True, (v["name"], s["name"], s["first_difference"])
            assert (s["outputs_match_fresh"] is False) == bool(s["near_ties"]), (v["name"], s["name"])
            for request, token in s["near_ties"]:
                assert f"{s['name']} request {request + 1} token {token}" in report
    assert "**no**" not in report  # no stage's outputs column says they differ
