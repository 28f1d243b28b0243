"""End to end on real vLLM CPU in bfloat16: `specwake run scenarios/tiny-cpu-bf16.toml` through the CLI, once per
module. Completions are compared with fresh the way vLLM's model tests compare two runs, so stock vLLM reads
`collapse` and the reference patch `recover`; where a collapsed stage's tokens part from fresh at a near-tie (bf16
kernels of another step shape), that is a note, never `corrupt`. Skips only when vLLM is missing and
SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.procs import require_module, run_scenario_cli, variant_of

# The module's shared real run may take up to its subprocess budget; pytest's default 900 s must not cut it short.
pytestmark = pytest.mark.timeout(1500)

require_module("vllm")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bf16-results")
    return run_scenario_cli("scenarios/tiny-cpu-bf16.toml", out, timeout=1500)


variant = variant_of


def test_exit_zero_and_verdict_pass(run: dict[str, Any]) -> None:
    proc = run["proc"]
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    assert run["result"]["verdict"] == "pass" and run["result"]["complete"] is True
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
