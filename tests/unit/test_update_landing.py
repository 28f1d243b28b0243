"""Every weight update lands on the model it addresses (issue 48, item 8): both models are fingerprinted before a push
or sync and after each model's update, and an update that changes the model it does not address, or none of the one it
does while that one differed from fresh, is caught and named. The worker on small torch modules, each update planted
as the push would make it; the judge, the explanation and the report on the diagnostics its answers make; the cycle's
planted sync sessions; the scenario key that plants them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake import protocol, weight_updates  # noqa: E402
from specwake.errors import ScenarioError  # noqa: E402
from specwake.judge.verdict import decide_outcome  # noqa: E402
from specwake.judge.weights import landed, misroutes  # noqa: E402
from specwake.prepare.scenario import load_scenario  # noqa: E402
from specwake.report.details import details  # noqa: E402
from specwake.report.explain import explain  # noqa: E402
from specwake.results import Diagnostic  # noqa: E402
from specwake.run.measure.cycle import cycle_steps  # noqa: E402
from specwake.run.measure.diagnose import fingerprint_kwargs  # noqa: E402
from specwake.run.session.assemble import judge_variant  # noqa: E402
from specwake.weight_updates import (  # noqa: E402
    DRAFT_TO_TARGET,
    EMPTY_DRAFT,
    TARGET_ALSO_TO_DRAFT,
    PushRequest,  # noqa: E402
)
from tests.helpers.builders import stage  # noqa: E402
from tests.unit.test_judge import held as held_record  # noqa: E402
from tests.unit.test_judge import prepared, scenario  # noqa: E402
from tests.unit.test_worker_extension import Worker  # noqa: E402

PUSHED = "after push"
TOLERANCE = 0.05
HELD = [stage(c, accepted=300) for c in range(3)]  # AL 4.00 throughout
COLLAPSED = [stage(0, accepted=300), stage(1, accepted=0), stage(2, accepted=0)]


def probe(worker: Worker, cycle: int, point: str, update: str | None = None) -> Diagnostic:
    """What specwake records at `point`: the worker's answer to the arguments specwake sends there."""
    answer = worker.specwake_fingerprint(**fingerprint_kwargs(point, update=update))
    return Diagnostic.from_dict({"cycle": cycle, "point": point, "fingerprints": [answer], "update": update})


def push_run(fault: str | None = None, *, frozen: bool = False, cycles: int = 2) -> list[Diagnostic]:
    """The diagnostics of a push run after each L2 discard: the drafter's push (unless `frozen`: its weights kept
    across the sleep, the target pushed alone), then the target's, each as the planted `fault` makes it."""
    worker = Worker()
    runner = worker.model_runner
    target, draft = runner.model, runner.drafter.model
    saved = {"target": target.state_dict(), "draft": draft.head.state_dict()}
    saved = {role: {k: v.clone() for k, v in tensors.items()} for role, tensors in saved.items()}
    taken = [probe(worker, 0, protocol.FRESH_POINT)]
    for cycle in range(1, cycles + 1):
        worker.specwake_emulate_discard(fill="random", rules="0.33")
        if frozen:  # --sleep-preserve-parameter-names draft.*: the drafter comes back as it was
            draft.head.load_state_dict(saved["draft"])
        taken.append(probe(worker, cycle, protocol.BEFORE_UPDATE))
        with torch.no_grad():
            if not frozen:
                if fault == DRAFT_TO_TARGET:  # the drafter's tensors written into the target
                    target.proj.weight.copy_(saved["draft"]["weight"][:4])
                elif fault != EMPTY_DRAFT:
                    draft.head.load_state_dict(saved["draft"])
                taken.append(probe(worker, cycle, protocol.UPDATE_POINT, "draft"))
            target.load_state_dict(saved["target"])
            if fault == TARGET_ALSO_TO_DRAFT:  # the target's tensors written into the drafter too
                draft.head.weight[:4].copy_(saved["target"]["proj.weight"])
        taken.append(probe(worker, cycle, PUSHED, "target"))
    return taken


def outcome(taken: list[Diagnostic], stages: list = HELD) -> str:
    return decide_outcome(
        stages, tolerance=TOLERANCE, target_landed=landed(taken, "target"), draft_landed=landed(taken, "draft")
    )


def test_a_right_push_lands_on_each_model_alone() -> None:
    for frozen in (False, True):
        taken = push_run(frozen=frozen)
        assert misroutes(taken, "target") == [] and misroutes(taken, "draft") == []
        assert landed(taken, "target") is True and landed(taken, "draft") is True
        assert outcome(taken) == "recover"
    # the drafter's push changed the drafter and nothing of the target; the target's push the target alone (the
    # embedding the drafter shares with it changes in both fingerprints, and is the target's to judge)
    right = push_run()
    first = [d for d in right if d.cycle == 1 and d.update is not None]
    assert [(d.point, d.update) for d in first] == [(protocol.UPDATE_POINT, "draft"), (PUSHED, "target")]
    assert [(d.parts("target")[0].changed, d.parts("draft")[0].changed_own) for d in first] == [(0, 2), (3, 0)]
    assert first[1].parts("draft")[0].changed_shared == ["embed.weight"]


def test_a_draft_update_routed_to_the_target_is_corrupt_and_named() -> None:
    taken = push_run(DRAFT_TO_TARGET)
    (stray, *again) = misroutes(taken, "target")
    assert (stray.role, stray.update, stray.cycle, stray.stray) == ("target", "draft", 1, True)
    assert stray.part.changed_names == ["proj.weight"] and [m.cycle for m in again] == [2]
    (empty, _) = misroutes(taken, "draft")  # and nothing landed on the drafter
    assert (empty.role, empty.update, empty.stray, empty.before) == ("draft", "draft", False, 3)
    # the target's own push overwrote it: the restore point alone sees a target as fresh
    assert all(d.parts("target")[0].differ == 0 for d in taken if d.point == PUSHED)
    assert outcome(taken) == "corrupt"


def test_an_empty_draft_update_is_named_and_never_recovers() -> None:
    taken = push_run(EMPTY_DRAFT)
    assert misroutes(taken, "target") == [] and landed(taken, "draft") is False
    assert outcome(taken, COLLAPSED) == "collapse" and outcome(taken) == "degraded"


def test_a_target_update_that_touches_a_frozen_drafter_is_degraded_whatever_al_says() -> None:
    taken = push_run(TARGET_ALSO_TO_DRAFT, frozen=True)
    (touched, _) = misroutes(taken, "draft")
    assert (touched.update, touched.stray, touched.part.changed_own) == ("target", True, 1)
    assert touched.part.changed_names == ["embed.weight", "head.weight"] and touched.part.changed_shared == [
        "embed.weight"
    ]
    assert landed(taken, "target") is True and outcome(taken) == "degraded"


def test_results_without_update_readings_decide_nothing() -> None:
    old = [Diagnostic(d.cycle, d.point, d.fingerprints) for d in push_run(DRAFT_TO_TARGET) if d.update is None]
    assert landed(old, "target") is None and landed(old, "draft") is None
    assert fingerprint_kwargs(PUSHED) == {"compare_to": protocol.FRESH, "save_as": protocol.RESTORED}  # a reload's


def test_the_report_names_the_model_the_update_the_cycle_and_the_tensors(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    planted = judge_variant(s, prepared(s), held_record(diagnostics=push_run(DRAFT_TO_TARGET)))
    assert planted.outcome == "corrupt" and not planted.matched
    why = explain(planted, TOLERANCE)
    assert (
        "the target's weights explain it (target: 1/4 tensors changed by the draft push of cycle 1, which addresses"
        " the drafter alone — proj.weight: other values; again in cycle 2)" in why
    ), why
    block = "\n".join(details(planted))
    assert (
        "- draft: the draft push of cycle 1 changed none of its 3 tensors, 3 of which differed from fresh before it:"
        " nothing it sent landed on the drafter; again in cycle 2" in block
    ), block


@pytest.mark.parametrize(
    ("fault", "sessions"),
    [
        (None, [("start_weight_update", "target"), ("start_draft_weight_update", "draft")]),
        (DRAFT_TO_TARGET, [("start_weight_update", "target"), ("start_weight_update", "draft")]),
        (EMPTY_DRAFT, [("start_weight_update", "target"), ("start_draft_weight_update", "draft")]),
        (
            TARGET_ALSO_TO_DRAFT,
            [("start_weight_update", "target"), ("start_draft_weight_update", "target"),
             ("start_draft_weight_update", "draft")],
        ),
    ],
)  # fmt: skip
def test_a_planted_sync_fault_misroutes_a_session_that_still_counts_as_its_models(
    fault: str | None, sessions: list[tuple[str, str]]
) -> None:
    chunks = {
        "target": [weight_updates.TransferChunk("target", "/t", ("a",))],
        "draft": [weight_updates.TransferChunk("draft", "/d", ("x",))],
    }
    push = PushRequest(("target", "draft"), via=weight_updates.SYNC_VIA, fault=fault)
    steps = cycle_steps(2, emulate_discard=True, push=push, cycle=2, chunks=chunks)
    starts = [s.name for s in steps if s.name.startswith("start_")]
    ends = [s for s in steps if s.addresses is not None]
    assert list(zip(starts, [s.addresses for s in ends], strict=True)) == sessions
    assert [s.point for s in ends] == [protocol.UPDATE_POINT] * (len(ends) - 1) + [protocol.SYNC_POINT]
    assert steps[2].name == "wake_weights" and steps[2].point == protocol.BEFORE_UPDATE
    files = [s.body["update_info"]["file"] for s in steps if s.name == "update_weights"]
    expected = {
        None: ["/t", "/d"],
        DRAFT_TO_TARGET: ["/t", "/d"],
        EMPTY_DRAFT: ["/t"],
        TARGET_ALSO_TO_DRAFT: ["/t", "/t", "/d"],
    }
    assert files == expected[fault]


def test_push_fault_is_a_key_of_a_push_or_sync_that_must_reach_the_model_it_misroutes(tmp_path: Path) -> None:
    base = (Path(__file__).parent.parent.parent / "scenarios" / "cpu" / "push-draft-model.toml").read_text()
    path = tmp_path / "s.toml"
    path.write_text(base + '[variants.bad]\npush_to = ["target"]\npush_fault = "empty-draft"\n')
    with pytest.raises(ScenarioError, match="variants.bad.push_fault: 'empty-draft' misroutes the draft model's"):
        load_scenario(path)
    path.write_text(base + '[variants.bad]\npush_fault = "sideways"\n')
    with pytest.raises(ScenarioError, match="variants.bad.push_fault: Input should be 'draft-to-target'"):
        load_scenario(path)
    shipped = load_scenario(Path(__file__).parent.parent.parent / "scenarios" / "cpu" / "push-draft-model.toml")
    faults = {v.name: v.push_fault for v in shipped.variants if v.push_fault}
    assert faults == {"draft-to-target": DRAFT_TO_TARGET, "frozen-drafter-touched": TARGET_ALSO_TO_DRAFT}
