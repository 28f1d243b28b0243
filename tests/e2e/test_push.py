"""End to end on real vLLM CPU: the RL trainers' weight push (scenarios/cpu/push-*.toml, one per CPU drafter family),
stock vLLM, one server per variant. A push to the target only leaves the drafter discarded (collapse); a push to target
and drafter recovers, in every family (Gemma4's shared embedding and tied head included); a perturbed push changes the
output while AL stays, and one that scales the drafter alone keeps the output and is caught by the drafter's
fingerprint. Outputs and logprobs are compared with fresh in every stage. In the session's shared run
(tests/helpers/shared_runs.py).
Skips only when vLLM is missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from typing import Any

import pytest

from specwake.prepare.scenario import load_scenario
from tests.helpers.paths import REPO
from tests.helpers.procs import require_module
from tests.helpers.shared_runs import Scenarios, SharedRun, draft_update_to_the_target, outcome_note

FILES = sorted(str(p.relative_to(REPO)) for p in (REPO / "scenarios" / "cpu").glob("push-*.toml"))
SCENARIOS = Scenarios.shipped("push", *FILES, budget_s=2400)
pytestmark = pytest.mark.shared_run(SCENARIOS)

require_module("vllm")


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def variant(run: dict[str, Any], scenario: str, name: str) -> dict[str, Any]:
    return next(v for v in run["results"][scenario]["variants"] if v["name"] == name)


def test_every_push_meets_its_expectation(run: dict[str, Any]) -> None:
    assert all(r["verdict"] == "pass" and r["complete"] for r in run["results"].values()), outcome_note(run)
    assert run["leftovers"] == []
    assert all(v["matched"] for r in run["results"].values() for v in r["variants"])


@pytest.mark.parametrize("scenario", [load_scenario(REPO / p).name for p in FILES])
def test_a_full_push_recovers_and_a_target_only_push_collapses(run: dict[str, Any], scenario: str) -> None:
    both = variant(run, scenario, "target-and-draft")
    assert both["outcome"] == "recover" and both["push"]["to"] == ["target", "draft"]
    checked = [both]
    if any(v["name"] == "target-only" for v in run["results"][scenario]["variants"]):
        only = variant(run, scenario, "target-only")
        assert only["outcome"] == "collapse" and only["push"] == {"to": ["target"], "scale": {}}
        checked.append(only)
    for v in checked:  # the target got its tensors back either way: same tokens, same logprobs
        for stage in v["stages"][1:]:
            assert stage["outputs_match_fresh"] is True and stage["first_difference"] is None
            assert stage["max_logprob_drift"] is not None and stage["max_logprob_drift"] < 1e-3
        pushes = [s for s in v["steps"] if s["name"] == "push"]  # one per model pushed, in each of the 2 cycles
        assert len(pushes) == 2 * len(v["push"]["to"]) and all(s["ok"] for s in pushes)


def test_a_perturbed_push_changes_the_output_and_keeps_al(run: dict[str, Any]) -> None:
    perturbed = variant(run, "cpu-push-draft-model", "perturbed")
    assert perturbed["outcome"] == "recover"
    after = perturbed["stages"][1:]
    assert all(s["outputs_match_fresh"] is False and s["first_difference"] for s in after)
    assert all(s["acceptance_length"] == 4.0 for s in after)  # the drafter follows the new weights
    push = next(s for s in perturbed["steps"] if s["name"] == "push")
    assert push["response"]["results"][0]["scaled"] == ["model.layers.1.mlp.down_proj.weight"]
    # down_proj is a row-parallel layer vLLM's CPU build packs, its parameter left empty: the fingerprint reads the
    # packed copy back, so the scaled layer is seen in both models, and nothing else
    pushed = [d for d in perturbed["diagnostics"] if d["point"] == "after push"]
    assert len(pushed) == 2 and all(
        fp[role]["differ_names"] == ["model.layers.1.mlp.down_proj.weight"] and fp[role]["empty"] == 0
        for d in pushed
        for fp in d["fingerprints"]
        for role in ("target", "draft")
    )
    report = (run["dir"] / "cpu-push-draft-model" / "report.md").read_text()
    assert "the output changed, as the perturbed push intends" in report


def test_a_push_that_scales_the_drafter_alone_keeps_the_output_and_is_judged_by_the_drafter(
    run: dict[str, Any],
) -> None:
    """Speculative decoding is lossless: scaling only the drafter's tensors cannot change a greedy completion, so the
    push is judged by the drafter's fingerprint (it must differ from fresh: `degraded`) and AL, never by "the output
    did not change"."""
    v = variant(run, "cpu-push-draft-model", "drafter-off")
    assert v["push"]["scaled"] == {"target": 0, "draft": 1} and v["outcome"] == "degraded"
    assert all(s["outputs_match_fresh"] is True and s["acceptance_length"] == 4.0 for s in v["stages"][1:])
    pushed = [d for d in v["diagnostics"] if d["point"] == "after push"]
    assert len(pushed) == 2
    for d in pushed:
        for fp in d["fingerprints"]:
            assert fp["target"]["differ"] == 0 and fp["draft"]["differ_names"] == ["model.norm.weight"]
    report = (run["dir"] / "cpu-push-draft-model" / "report.md").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("- **drafter-off**: degraded"))
    assert "the push scaled draft:model.norm.weight ×1.05 (1 drafter tensor): the drafter's weights differ" in line
    assert "as speculative decoding guarantees" in line and "did not" not in line


def pushed_updates(v: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(cycle, point, model addressed) of every fingerprint taken after one model's push."""
    return [(d["cycle"], d["point"], d["update"]) for d in v["diagnostics"] if d.get("update")]


def test_each_models_push_is_judged_on_its_own_and_a_right_one_lands_on_its_model_alone(run: dict[str, Any]) -> None:
    """Both models fingerprinted before the pushes and after each: the drafter's push changes the drafter alone, the
    target's the target alone; a frozen drafter (kept across the sleep, the target pushed alone) stays bit-identical."""
    both = variant(run, "cpu-push-draft-model", "target-and-draft")
    assert pushed_updates(both) == [
        (c, p, m) for c in (1, 2) for p, m in (("after update", "draft"), ("after push", "target"))
    ]
    for d in (d for d in both["diagnostics"] if d.get("update")):
        other = "target" if d["update"] == "draft" else "draft"
        assert all(rank[other]["changed"] == 0 and rank[d["update"]]["changed"] > 0 for rank in d["fingerprints"])
    frozen = variant(run, "cpu-push-draft-model", "frozen-drafter")
    assert frozen["outcome"] == "recover" and pushed_updates(frozen) == [
        (1, "after push", "target"),
        (2, "after push", "target"),
    ]
    assert all(
        rank["draft"]["changed"] == 0 for d in frozen["diagnostics"] if d.get("update") for rank in d["fingerprints"]
    )


def test_a_draft_push_routed_to_the_target_is_caught_and_named(run: dict[str, Any]) -> None:
    """The drafter's checkpoint pushed into the target (push_fault = "draft-to-target"): the target's own push
    overwrites it right after, so the restore point sees a target as fresh; the fingerprint after the drafter's push
    names it."""
    v = variant(run, "cpu-push-draft-model", "draft-to-target")
    assert v["push"]["fault"] == "draft-to-target" and v["outcome"] == "corrupt"
    assert all(
        rank["target"]["differ"] == 0
        for d in v["diagnostics"]
        if d["point"] == "after push"
        for rank in d["fingerprints"]
    )
    _, line, report = draft_update_to_the_target(run, "cpu-push-draft-model", v)
    assert "the target got an update meant for another model" in line
    assert "tensors changed by the draft push of cycle 1, which addresses the drafter alone — model." in line
    assert "- draft: the draft push of cycle 1 changed none of its" in report


def test_a_target_push_that_touches_a_frozen_drafter_is_caught_while_al_holds(run: dict[str, Any]) -> None:
    """The target's checkpoint pushed into the frozen drafter too (push_fault = "target-also-to-draft"): the drafter is
    then the target's own network, so AL stays at 4.00 and the outputs as fresh; only the fingerprint sees it."""
    v = variant(run, "cpu-push-draft-model", "frozen-drafter-touched")
    assert v["push"]["fault"] == "target-also-to-draft" and v["outcome"] == "degraded"
    assert all(s["acceptance_length"] == 4.0 and s["outputs_match_fresh"] is True for s in v["stages"][1:])
    report = (run["dir"] / "cpu-push-draft-model" / "report.md").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("- **frozen-drafter-touched**: degraded"))
    assert "the drafter's weights explain it (draft: " in line
    assert "tensors changed by the target push of cycle 1, which addresses the target alone — model." in line
