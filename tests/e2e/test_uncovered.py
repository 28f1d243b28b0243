"""End to end on real vLLM CPU: a drafter parameter that no load writes, as DSpark's `mask_embedding`. A scenario of
the EAGLE3 family with the reference fix in the session's shared run (tests/helpers/shared_runs.py), one server per
variant, the emulated discard leaving random values (as freed CUDA memory does):

- `ignored` (tests/data/eagle3-unloaded-param.diff): the forward never reads it. The reload cannot bring it back, and
  nothing needs it: the fix recovers, and the report names the parameter apart from the judged ones.
- `read` (tests/data/eagle3-unloaded-param-read.diff): the forward adds it to the hidden states it drafts from. It fails
  on what it measured (the drafter's acceptance), not on the parameter's checksum.

Both expect `recover`, as their author would. Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO
from tests.helpers.procs import require_module, variant_of
from tests.helpers.scenario_texts import cpu_pair
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

require_module("vllm")

FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
DATA = REPO / "tests" / "data"
PARAMETER = "model.mask_embedding"
SCENARIO = f"""\
name = "uncovered-eagle3"
{cpu_pair("builtin:eagle3-llama", "eagle3", "builtin:eagle3-llama-draft", 1200)}[workload]
max_tokens = 64
repeats = 2
warmup = 0
request_timeout_s = 300
[cycle]
count = 2
discard_fill = "random"
step_timeout_s = 300
"""
PATCHES = {"ignored": "eagle3-unloaded-param.diff", "read": "eagle3-unloaded-param-read.diff"}


def write_scenario(folder: Path) -> list[Path]:
    """uncovered-eagle3.toml: a variant per patch, each with the reference fix, each expected to recover."""
    text = SCENARIO
    for name, diff in PATCHES.items():
        patch = folder / f"{name}.diff"
        patch.write_text((DATA / diff).read_text() + FIX.read_text())
        text += f'[variants.{name}]\npatch = "{patch}"\n'
    text += "[expect]\n" + "".join(f'{name} = "recover"\n' for name in PATCHES)
    scenario = folder / "uncovered-eagle3.toml"
    scenario.write_text(text)
    return [scenario]


SCENARIOS = Scenarios("uncovered", write_scenario, budget_s=1800)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def drafter_at(variant: dict[str, Any], point: str) -> list[dict[str, Any]]:
    """The drafter's fingerprint (rank 0) at `point`, in cycle order."""
    found = sorted((d for d in variant["diagnostics"] if d["point"] == point), key=lambda d: d["cycle"])
    return [d["fingerprints"][0]["draft"] for d in found]


def test_only_the_variant_whose_forward_reads_it_fails(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "fail" and run["result"]["complete"] is True, outcome_note(run)
    assert run["leftovers"] == []
    assert {name: variant_of(run, name)["matched"] for name in PATCHES} == {"ignored": True, "read": False}


def test_the_fresh_stage_finds_the_parameter_no_load_writes(run: dict[str, Any]) -> None:
    for name in PATCHES:
        (fresh,) = drafter_at(variant_of(run, name), "after fresh")
        assert (fresh["uncovered"], fresh["uncovered_names"], fresh["coverage_error"]) == (1, [PARAMETER], None)
    fresh = next(d for d in variant_of(run, "ignored")["diagnostics"] if d["point"] == "after fresh")
    target = fresh["fingerprints"][0]["target"]
    assert (target["uncovered"], target["coverage_error"]) == (0, None)


def test_an_unread_parameter_left_discarded_does_not_fail_the_fix(run: dict[str, Any]) -> None:
    v = variant_of(run, "ignored")
    assert v["outcome"] == "recover" and v["findings"] == [], (v.get("error"), v["findings"])
    for restore in drafter_at(v, "after reload_weights"):
        assert (restore["differ"], restore["uncovered_differ"]) == (0, 1)  # left as the discard did: not judged
        assert restore["uncovered_differ_names"] == [PARAMETER]
    report = (run["dir"] / "report.md").read_text()
    assert (
        f"- draft: 1 parameter no load writes ({PARAMETER}), checksum not judged (a forward that reads one shows in "
        "AL and outputs): differs from fresh after reload_weights in cycles 1–2"
    ) in report


def test_a_read_parameter_left_discarded_fails_on_acceptance(run: dict[str, Any]) -> None:
    v = variant_of(run, "read")
    fresh, *after = [s["acceptance_length"] for s in v["stages"]]
    assert fresh == 4.0 and all(al < 0.9 * fresh for al in after), [fresh, *after]
    assert v["outcome"] in ("collapse", "degraded"), v.get("error")
    assert all(r["differ"] == 0 for r in drafter_at(v, "after reload_weights"))  # the checksums decided nothing
