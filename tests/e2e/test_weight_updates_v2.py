"""End to end on real vLLM CPU: the RL weight updates on Model Runner V2, the runner every GPU server runs (its Triton
programs in Triton's interpreter on CPU). The push and sync matrices (tests/e2e/test_push.py, test_sync.py) run on
V1 in the session's shared run; here the draft_model family's push and sync run once on V2, small (one cycle, two
requests of 8 tokens a stage), so that a weight update is shown to work, and to be judged, on either runner:

- push, `target-only`: the trainer pushes the target alone; the drafter keeps its discarded weights and collapses;
- push, `target-and-draft`: both pushed by specwake's worker extension; it recovers;
- sync, `target-and-draft`: both synced through vLLM's weight-transfer API, target session then draft session; it
  recovers.

Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO
from tests.helpers.procs import require_module
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

require_module("vllm")

CPU_SCENARIOS = REPO / "scenarios" / "cpu"
# scenario (a copy of a shipped one) → its variants, each with its push_to and expected outcome
COPIES: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "v2-push-draft-model": (
        "push-draft-model.toml",
        {"target-only": ('["target"]', "collapse"), "target-and-draft": ('["target", "draft"]', "recover")},
    ),
    "v2-sync-draft-model": ("sync-draft-model.toml", {"target-and-draft": ('["target", "draft"]', "recover")}),
}


def v2_copy(folder: Path, name: str, source: str, variants: dict[str, tuple[str, str]]) -> Path:
    """The shipped scenario's server, drafter, workload and cycle (made small), on Model Runner V2, with `variants`."""
    text = (CPU_SCENARIOS / source).read_text()
    text = text[: text.index("\n[variants")] + "\n"  # the variants and [expect] tables come last
    text = re.sub(r'(?m)^name = "[^"]+"', f'name = "{name}"', text, count=1)
    text = re.sub(r"(?m)^\[server\]\n", '[server]\nmodel_runner = "v2"\n', text, count=1)
    text = re.sub(r"(?m)^max_tokens = \d+", "max_tokens = 8", text)
    text = re.sub(r"(?m)^repeats = \d+", "repeats = 2", text)
    text = re.sub(r"(?m)^count = \d+", "count = 1", text)
    text += "".join(f"[variants.{v}]\npush_to = {push_to}\n" for v, (push_to, _) in variants.items())
    text += "[expect]\n" + "".join(f'{v} = "{expected}"\n' for v, (_, expected) in variants.items())
    copy = folder / f"{name}.toml"
    copy.write_text(text)
    return copy


def write_scenarios(folder: Path) -> list[Path]:
    return [v2_copy(folder, name, source, variants) for name, (source, variants) in COPIES.items()]


SCENARIOS = Scenarios("weight-updates-v2", write_scenarios, budget_s=900)
pytestmark = pytest.mark.shared_run(SCENARIOS)


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


@pytest.mark.parametrize(
    ("scenario", "variant", "expected"),
    [(s, v, e) for s, (_, variants) in COPIES.items() for v, (_, e) in variants.items()],
)
def test_each_weight_update_on_v2_meets_its_expectation(
    run: dict[str, Any], scenario: str, variant: str, expected: str
) -> None:
    result = run["results"][scenario]
    assert result["complete"] is True and run["leftovers"] == [], outcome_note(run)
    found = next(v for v in result["variants"] if v["name"] == variant)
    assert found["model_runner"] == "v2", found.get("model_runner")
    assert found["outcome"] == expected and found["matched"], (found["outcome"], found.get("error"), outcome_note(run))
