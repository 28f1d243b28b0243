"""End to end on real vLLM CPU: weights synced the way RL frameworks do, through vLLM's own weight-transfer API
(scenarios/cpu/sync-draft-model.toml and sync-mimo-mtp.toml), stock vLLM, one server per variant. specwake's file
engine carries the tensors; sessions, layerwise reload and the draft session are vLLM's code. A target-only session
leaves the drafter discarded (collapse); a target session plus a draft session recovers. Every step of the sequence is
in the wake ledger, with vLLM's own operation time beside specwake's, and vLLM's /weight_checker agrees with specwake's
fingerprint of the target. A drafter sync that is partial (push_skip) or slightly wrong (push_scale ×1.05 on the
drafter alone) is caught by the drafter's fingerprint (`degraded`), while the completions stay as fresh. The other
families run in `make sync`. In the session's shared run (tests/helpers/shared_runs.py).
Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from typing import Any

import pytest

from specwake.protocol import SYNC_POINT
from tests.helpers.procs import require_module
from tests.helpers.shared_runs import Scenarios, SharedRun, draft_update_to_the_target, outcome_note

SCENARIOS = Scenarios.shipped(
    "sync", "scenarios/cpu/sync-draft-model.toml", "scenarios/cpu/sync-mimo-mtp.toml", budget_s=1800
)
pytestmark = pytest.mark.shared_run(SCENARIOS)

require_module("vllm")

NAMES = ["cpu-sync-draft-model", "cpu-sync-mimo-mtp"]

TARGET_SESSION = ["start_weight_update", "update_weights", "finish_weight_update"]
DRAFT_SESSION = ["start_draft_weight_update", "update_weights", "finish_weight_update"]


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def variant(run: dict[str, Any], scenario: str, name: str) -> dict[str, Any]:
    return next(v for v in run["results"][scenario]["variants"] if v["name"] == name)


def collapse_runs(names: list[str]) -> list[str]:
    """The step names with repeated update_weights chunks written once, for comparing sequences."""
    out: list[str] = []
    for name in names:
        if not (out and name == out[-1] == "update_weights"):
            out.append(name)
    return out


def test_every_sync_meets_its_expectation(run: dict[str, Any]) -> None:
    assert sorted(run["results"]) == NAMES
    assert all(r["verdict"] == "pass" and r["complete"] for r in run["results"].values()), outcome_note(run)
    assert run["leftovers"] == []
    assert all(v["matched"] for r in run["results"].values() for v in r["variants"])


@pytest.mark.parametrize("scenario", NAMES)
def test_a_draft_session_recovers_and_a_target_session_alone_collapses(run: dict[str, Any], scenario: str) -> None:
    only = variant(run, scenario, "target-only")
    both = variant(run, scenario, "target-and-draft")
    assert only["push"] == {"to": ["target"], "scale": {}, "via": "weight_transfer"}
    assert both["push"] == {"to": ["target", "draft"], "scale": {}, "via": "weight_transfer"}
    assert only["outcome"] == "collapse" and both["outcome"] == "recover"
    assert only["stages"][0]["acceptance_length"] > 3.5  # fresh: the drafter agrees with the target
    assert all(s["acceptance_length"] == 1.0 for s in only["stages"][1:])
    assert all(s["acceptance_length"] > 3.5 for s in both["stages"][1:])
    for v in (only, both):  # the target got its tensors back either way: the same tokens as fresh
        assert all(s["outputs_match_fresh"] is True for s in v["stages"][1:])


@pytest.mark.parametrize("scenario", NAMES)
def test_the_ledger_holds_the_frameworks_sequence(run: dict[str, Any], scenario: str) -> None:
    for name, sessions in (("target-only", TARGET_SESSION), ("target-and-draft", TARGET_SESSION + DRAFT_SESSION)):
        v = variant(run, scenario, name)
        assert all(s["ok"] for s in v["steps"])
        for cycle in (1, 2):
            names = collapse_runs([s["name"] for s in v["steps"] if s["cycle"] == cycle])
            init = ["init_weight_transfer_engine"] if cycle == 1 else []  # once per server
            assert names == [
                "sleep",
                "discard",
                "wake_weights",
                *init,
                *sessions,
                "wake_kv_cache",
                "reset_prefix_cache",
            ]
        updates = [s for s in v["steps"] if s["name"] == "update_weights"]
        assert len(updates) >= 2 * (1 + (name == "target-and-draft"))
        # vLLM's own rl_weight_update histogram timed every update; specwake's wall time includes the HTTP round trip
        assert all(s["vllm_seconds"] is not None and 0 < s["vllm_seconds"] <= s["seconds"] + 0.05 for s in updates)


@pytest.mark.parametrize("scenario", NAMES)
def test_vllms_weight_checker_agrees_with_specwakes_fingerprint(run: dict[str, Any], scenario: str) -> None:
    v = variant(run, scenario, "target-and-draft")
    checks = [d for d in v["diagnostics"] if d["point"] == SYNC_POINT]
    assert [d["cycle"] for d in checks] == [1, 2]
    for d in checks:
        checker = d["weight_checker"]
        assert checker["match"] is True and checker["mismatches"] == 0 and checker["parameters"] > 0
        assert all(rank["target"]["differ"] == 0 for rank in d["fingerprints"])
    report = (run["dir"] / scenario / "report.md").read_text()
    assert "vLLM's /weight_checker" in report and "specwake's fingerprint agrees" in report
    assert "vLLM's seconds" in report


def drafter_differs(v: dict[str, Any]) -> list[str]:
    """The drafter's tensors that differ from fresh after each sync (the target's must all match)."""
    synced = [d for d in v["diagnostics"] if d["point"] == SYNC_POINT]
    assert [d["cycle"] for d in synced] == [1, 2]
    for d in synced:
        assert all(rank["target"]["differ"] == 0 for rank in d["fingerprints"])
    return sorted({n for d in synced for rank in d["fingerprints"] for n in rank["draft"]["differ_names"]})


def test_a_partial_drafter_sync_is_caught_by_the_drafters_fingerprint(run: dict[str, Any]) -> None:
    v = variant(run, "cpu-sync-draft-model", "drafter-partial")
    assert v["push"]["skipped"] == {"target": 0, "draft": 3} and v["push"]["scaled"] == {"target": 0, "draft": 0}
    assert v["outcome"] == "degraded"  # not recover: the layer-1 MLP it never sent is still discarded
    assert all(s["outputs_match_fresh"] is True for s in v["stages"][1:])
    assert "model.layers.1.mlp.down_proj.weight" in drafter_differs(v)
    report = (run["dir"] / "cpu-sync-draft-model" / "report.md").read_text()
    assert "the sync left out draft:model.layers.1.mlp.* (3 drafter tensors)" in report


def test_a_drafter_synced_slightly_wrong_is_caught_while_al_and_outputs_hold(run: dict[str, Any]) -> None:
    v = variant(run, "cpu-sync-mimo-mtp", "drafter-off")
    assert v["push"]["scaled"] == {"target": 0, "draft": 1}
    assert v["outcome"] == "degraded"  # AL holds at 4.00: only the fingerprint sees it
    assert all(s["acceptance_length"] == 4.0 and s["outputs_match_fresh"] is True for s in v["stages"][1:])
    differ = drafter_differs(v)
    assert len(differ) == 1 and differ[0].endswith(".final_layernorm.weight"), differ
    report = (run["dir"] / "cpu-sync-mimo-mtp" / "report.md").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("- **drafter-off**: degraded"))
    assert "the sync scaled draft:model.mtp_layers.0.final_layernorm.weight ×1.05 (1 drafter tensor)" in line
    assert "the drafter's weights differ from fresh" in line and "as speculative decoding guarantees" in line
    assert "did not" not in line


def test_a_draft_session_routed_to_the_target_is_caught_and_named(run: dict[str, Any]) -> None:
    """The draft session opened with /start_weight_update (push_fault = "draft-to-target", verl-SpeCo#78): the
    drafter's tensors land on the target, and the drafter gets none."""
    v = variant(run, "cpu-sync-draft-model", "draft-to-target")
    assert v["push"]["fault"] == "draft-to-target" and v["outcome"] == "corrupt"
    starts = [s["name"] for s in v["steps"] if s["cycle"] == 1 and s["name"].startswith("start_")]
    assert starts == ["start_weight_update", "start_weight_update"]  # no draft session at all
    draft_session, line, report = draft_update_to_the_target(run, "cpu-sync-draft-model", v)
    assert draft_session["point"] == SYNC_POINT
    assert "tensors changed by the draft session of cycle 1, which addresses the drafter alone — model." in line
    assert "- draft: the draft session of cycle 1 changed none of its" in report


def test_an_empty_draft_session_is_named(run: dict[str, Any]) -> None:
    """A draft session started and finished with no tensors (push_fault = "empty-draft"): the drafter stays
    discarded, AL collapses, and the report names the session."""
    v = variant(run, "cpu-sync-draft-model", "empty-draft")
    assert v["push"]["fault"] == "empty-draft" and v["outcome"] == "collapse"
    names = collapse_runs([s["name"] for s in v["steps"] if s["cycle"] == 2])
    assert names[names.index("start_draft_weight_update") + 1] == "finish_weight_update"  # no update_weights between
    report = (run["dir"] / "cpu-sync-draft-model" / "report.md").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("- **empty-draft**: collapse"))
    assert "(draft: the draft session of cycle 1 changed none of its" in line
    assert "nothing it sent landed on the drafter; again in cycle 2" in line
