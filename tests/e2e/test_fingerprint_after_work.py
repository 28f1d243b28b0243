"""End to end on real vLLM CPU: a fix that reloads the drafter right and changes it afterwards (issue 48, item 1). The
reference fix plus one change: after each reload it hooks the drafter so that its first forward scales the drafter's
final norm ×1.05 (`model.norm.weight`). Every fingerprint right after the reload reads it as fresh, and AL holds on the
tiny pair (the same function in other tensors), so before fingerprints were taken after the measured stages it passed
as `recover`, `0/… tensors differ`. Now the fingerprint after the stage names the tensor, the stage and the cycle, and
the variant is `degraded`; the reference fix beside it still recovers, its models unchanged through the stage.

A scenario of the tiny draft_model pair in the session's shared run (tests/helpers/shared_runs.py), small: 16 tokens,
2 requests, one cycle. Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.diffs import insert_after
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module, variant_of
from tests.helpers.scenario_texts import TINY_DRAFT_MODEL
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

require_module("vllm")

FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
# The last line of load_draft_weights_inplace's work, before it returns what it did: the drafter is restored by then
RESTORED = "+    _restore_kv_scales(kv_scales)\n"
NORM = "model.norm.weight"
LATER = """\
+    # almost right: the drafter's final norm scaled x1.05 on its first forward after each reload
+    norm = draft_model.model.norm
+
+    def scale_once(module, args):
+        with torch.no_grad():
+            norm.weight.mul_(1.05)
+        handle.remove()
+
+    handle = draft_model.register_forward_pre_hook(scale_once)
"""
SCENARIO = f"""\
name = "fingerprint-after-work"
{TINY_DRAFT_MODEL}[workload]
prompts = "builtin:mixed"
max_tokens = 16
repeats = 2
warmup = 0
request_timeout_s = 120
[cycle]
count = 1
step_timeout_s = 120
"""


def write_scenario(folder: Path) -> list[Path]:
    """fingerprint-after-work.toml: the reference fix, and the fix that changes the drafter after the reload, both
    expected to recover (as the second's author would)."""
    fix = FIX.read_text()
    assert fix.count(RESTORED) == 1
    text = SCENARIO
    for name, patch_text in (("patched", fix), ("drafter-changed-later", insert_after(fix, RESTORED, LATER))):
        patch = folder / f"{name}.diff"
        patch.write_text(patch_text)
        text += f'[variants.{name}]\npatch = "{patch}"\n'
    text += '[expect]\npatched = "recover"\ndrafter-changed-later = "recover"\n'
    scenario = folder / "fingerprint-after-work.toml"
    scenario.write_text(text)
    return [scenario]


SCENARIOS = Scenarios("fingerprint-after-work", write_scenario, budget_s=600)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def at(variant: dict[str, Any], point: str, role: str) -> dict[str, Any]:
    """`role`'s fingerprint (rank 0) at `point` of cycle 1."""
    (found,) = [d for d in variant["diagnostics"] if d["point"] == point and d["cycle"] == 1]
    return found["fingerprints"][0][role]


def test_a_drafter_changed_after_a_right_reload_fails_named_by_tensor_stage_and_cycle(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "fail" and run["result"]["complete"] is True, outcome_note(run)
    later = variant_of(run, "drafter-changed-later")
    assert later["outcome"] == "degraded", outcome_note(run)
    assert at(later, "after reload_weights", "draft")["differ"] == 0  # right after the reload: as fresh
    after = at(later, "after stage", "draft")
    assert after["changed"] == 1 and after["changed_how"] == {NORM: "values"}, after
    assert after["differ_names"] == [NORM]  # and no longer as fresh at the stage's end
    assert at(later, "after stage", "target")["changed"] == 0
    report = (run["dir"] / "report.md").read_text()
    named = f"changed during the stage after L2 #1 (cycle 1), since reload_weights — {NORM}: other values"
    line = next(line for line in report.splitlines() if line.startswith("- **drafter-changed-later**: "))
    assert "the drafter's weights explain it (draft: 1/" in line and named in line, line
    assert "- draft: 1/" in report and named in report


def test_the_reference_fix_recovers_its_models_unchanged_through_the_stage(run: dict[str, Any]) -> None:
    patched = variant_of(run, "patched")
    assert patched["outcome"] == "recover" and patched["matched"], outcome_note(run)
    assert at(patched, "after stage", "draft")["changed"] == 0 and at(patched, "after stage", "target")["changed"] == 0
    report = (run["dir"] / "report.md").read_text()
    assert "tensors changed during the stage after cycle 1, since reload_weights" in report
    timings = patched["info"]["timings"]
    assert 0 < timings["stage_fingerprints"] <= timings["diagnostics"]
    assert "s of it fingerprints after stages)" in report
