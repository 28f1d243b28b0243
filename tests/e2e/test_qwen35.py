"""End to end on real vLLM CPU: the Qwen3.5 hybrid MTP family (scenarios/cpu/qwen-mtp.toml) on Model Runner V2, its
Triton programs interpreted, in the session's shared run (tests/helpers/shared_runs.py), one server per variant,
small: 2 requests × 8 tokens a stage, one L2 cycle (a V2 step of this model takes ~0.3 s here, more once AL is 1).

builtin:mtp-qwen35 is a Qwen3_5ForCausalLM (three gated-delta-net layers, one full-attention layer) with its MTP
module inside the checkpoint; vLLM runs the module as Qwen3_5MTP, which shares the target's embedding and lm_head.

- `baseline`: stock vLLM. Fresh AL is exactly K + 1 = 4.00 (the bigram construction), 1.00 after the cycle, the
  text unchanged; the target comes back bit for bit, the MTP module does not.
- `patched`: the reference fix reloads the MTP module from the same checkpoint: AL 4.00 after the cycle.

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

SHIPPED = REPO / "scenarios" / "cpu" / "qwen-mtp.toml"
PATCHES = REPO / "scenarios" / "patches"
SCENARIO = """\
name = "qwen35-small"
[server]
model = "builtin:mtp-qwen35"
enforce_eager = true
dtype = "bfloat16"
max_model_len = 512
args = ["--seed", "0", "--max-num-seqs", "4", "--num-gpu-blocks-override", "256"]
env = { HF_HUB_OFFLINE = "1" }
model_runner = "v2"
startup_timeout_s = 300
[speculative]
method = "mtp"
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
patch = { "<0.34" = "{patches}/draft-reload.diff", ">=0.34" = "{patches}/draft-reload-0.34.diff" }
[expect]
baseline = "collapse"
patched = "recover"
"""


def write_scenario(folder: Path) -> list[Path]:
    """qwen35-small.toml: the shipped family's server and drafter, stock vLLM and the reference fix."""
    scenario = folder / "qwen35-small.toml"
    scenario.write_text(SCENARIO.replace("{patches}", str(PATCHES)))
    return [scenario]


SCENARIOS = Scenarios("qwen35", write_scenario, budget_s=900)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def test_the_small_copy_runs_the_shipped_family() -> None:
    assert_a_small_copy_of(SCENARIO, SHIPPED)


def test_stock_vllm_collapses_from_exactly_k_plus_1(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "pass" and run["result"]["complete"] is True, outcome_note(run)
    assert run["leftovers"] == []
    assert_stock_collapses_from_k_plus_1(variant_of(run, "baseline"))


def test_the_reference_fix_reloads_the_mtp_module(run: dict[str, Any]) -> None:
    fixed = variant_of(run, "patched")
    assert fixed["outcome"] == "recover", fixed.get("error")
    assert [s["acceptance_length"] for s in fixed["stages"]] == [4.0, 4.0]
    assert all(fp["differ"] == 0 for fp in restores(fixed)) and all(
        fp["differ"] == 0 for fp in restores(fixed, "target")
    )
