"""End to end on real vLLM CPU: two almost-right fixes that only the verdict's defaults catch (issue 48, items 2 and 4),
each the reference fix plus one change made at the end of each drafter reload, beside the reference fix itself:

- `logits-scaled`: the target's logits scaled ×1.01 on every forward after the reload (a forward hook on its logits
  processor; no tensor changes). Greedy tokens, AL and every fingerprint stay as fresh; only the logprobs drift. The
  fresh stage's own requests of one prompt drift by exactly 0 on CPU, so by default the variant has a finding.
- `slow-decode`: every drafter forward after the reload sleeps 10 ms. AL holds; decoding falls far below 0.7× fresh,
  which counts on every platform, so the variant is `degraded` although the L2 discard is emulated (CPU).

The reference fix beside them recovers with no finding: its logprobs do not drift and its speed is kept. A scenario of
the tiny draft_model pair in the session's shared run (tests/helpers/shared_runs.py), with enough requests for a speed
call (5 a stage, 2 cycles). Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specwake.judge.verdict import GROSS_LOSS_RATIO
from tests.helpers.diffs import insert_after
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module, variant_of
from tests.helpers.scenario_texts import TINY_DRAFT_MODEL
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

require_module("vllm")

FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
# The last line of load_draft_weights_inplace's work, before it returns what it did: the drafter is restored by then
RESTORED = "+    _restore_kv_scales(kv_scales)\n"
CHANGES = {
    "logits-scaled": """\
+    # almost right: the target's logits scaled x1.01 on every forward from now on (no tensor changes)
+    target_model.logits_processor.register_forward_hook(lambda module, args, logits: logits * 1.01)
""",
    "slow-decode": """\
+    # almost right: every drafter forward from now on sleeps 10 ms
+    draft_model.register_forward_pre_hook(lambda module, args: __import__("time").sleep(0.01))
""",
}
SCENARIO = f"""\
name = "planted-defaults"
{TINY_DRAFT_MODEL}[workload]
prompts = "builtin:mixed"
max_tokens = 32
repeats = 5
warmup = 1
request_timeout_s = 120
[cycle]
count = 2
step_timeout_s = 120
"""


def write_scenario(folder: Path) -> list[Path]:
    """planted-defaults.toml: the reference fix and the two almost-right fixes, each expected to recover (as their
    authors would)."""
    fix = FIX.read_text()
    assert fix.count(RESTORED) == 1
    texts = {"patched": fix} | {name: insert_after(fix, RESTORED, lines) for name, lines in CHANGES.items()}
    text = SCENARIO
    for name, patch_text in texts.items():
        patch = folder / f"{name}.diff"
        patch.write_text(patch_text)
        text += f'[variants.{name}]\npatch = "{patch}"\n'
    text += "[expect]\n" + "".join(f'"{name}" = "recover"\n' for name in texts)
    scenario = folder / "planted-defaults.toml"
    scenario.write_text(text)
    return [scenario]


SCENARIOS = Scenarios("planted-defaults", write_scenario, budget_s=600)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def test_the_reference_fix_recovers_with_no_drift_and_its_speed_kept(run: dict[str, Any]) -> None:
    assert run["result"]["complete"] is True and run["leftovers"] == [], outcome_note(run)
    patched = variant_of(run, "patched")
    assert patched["outcome"] == "recover" and patched["matched"] and patched["findings"] == [], outcome_note(run)
    fresh, *post = patched["stages"]
    assert fresh["own_logprob_drift"] == 0.0  # CPU: the server's own numerics do not move at all
    assert all(s["max_logprob_drift"] == 0.0 for s in post)


def test_logits_that_drift_with_the_same_tokens_are_a_finding(run: dict[str, Any]) -> None:
    scaled = variant_of(run, "logits-scaled")
    assert scaled["outcome"] == "recover" and not scaled["matched"], outcome_note(run)  # AL and tokens as fresh
    assert all(s["outputs_match_fresh"] for s in scaled["stages"][1:])
    (finding,) = [f for f in scaled["findings"] if f.startswith("logprobs drift by ")]
    assert "beyond the fresh stage's own 0 (its requests of one prompt)" in finding, finding
    assert run["result"]["verdict"] == "fail"


def test_a_gross_speed_loss_fails_where_the_speed_rule_is_advisory(run: dict[str, Any]) -> None:
    slow = variant_of(run, "slow-decode")
    assert slow["outcome"] == "degraded" and not slow["matched"], outcome_note(run)
    assert [s["acceptance_length"] for s in slow["stages"]] == [4.0, 4.0, 4.0]  # AL holds
    assert slow["l2_discard"] == "emulated"
    report = (run["dir"] / "report.md").read_text()
    line = next(line for line in report.splitlines() if line.startswith("- **slow-decode**: "))
    assert f"below {GROSS_LOSS_RATIO}×, lost" in line, line
    assert f"(lost: below {GROSS_LOSS_RATIO}×)" in report
