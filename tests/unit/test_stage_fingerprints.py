"""Fingerprints after the measured work (issue 48, item 1): each worker keeps its readings right after every reload,
push or sync, and the fingerprint after the stage that follows names what the stage's own forwards changed of them.
A planted fix that restores the drafter right and then scales its final norm on the first forward after the reload
passes every fingerprint taken right after the reload; it must not pass the run. Worker on small torch modules; the
judge, the explanation and the report on the diagnostics the worker's answers make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake import protocol  # noqa: E402
from specwake.judge.verdict import decide_outcome  # noqa: E402
from specwake.judge.weights import held, stage_changes  # noqa: E402
from specwake.report.details import details  # noqa: E402
from specwake.report.explain import explain  # noqa: E402
from specwake.report.summary import verdict_line  # noqa: E402
from specwake.results import STAGE_FINGERPRINTS, Diagnostic  # noqa: E402
from specwake.run.measure.diagnose import fingerprint_kwargs  # noqa: E402
from specwake.run.session.assemble import judge_scenario, judge_variant  # noqa: E402
from tests.helpers.builders import stage  # noqa: E402
from tests.unit.test_judge import held as held_record  # noqa: E402
from tests.unit.test_judge import prepared, scenario  # noqa: E402
from tests.unit.test_worker_extension import Worker  # noqa: E402

RELOAD = "after reload_weights"
TOLERANCE = 0.05


def probe(worker: Worker, cycle: int, point: str) -> Diagnostic:
    """What specwake records at `point`: the worker's answer to the arguments specwake sends there."""
    answer = worker.specwake_fingerprint(**fingerprint_kwargs(point))
    return Diagnostic.from_dict({"cycle": cycle, "point": point, "fingerprints": [answer]})


def restore(worker: Worker, saved: dict[str, dict[str, torch.Tensor]]) -> None:
    """A right reload: every tensor of both models back as fresh."""
    runner = worker.model_runner
    runner.model.load_state_dict(saved["target"])
    runner.drafter.model.load_state_dict(saved["draft"])


def planted_run(change: str | None, cycles: int = 2) -> list[Diagnostic]:
    """The diagnostics of a run whose reload restores both models right; after each reload the stage's first forward
    scales `change` ("draft": the drafter's head, "target": the target's proj) by 1.05 (None: nothing changes)."""
    worker = Worker()
    runner = worker.model_runner
    saved = {"target": runner.model.state_dict(), "draft": runner.drafter.model.state_dict()}
    saved = {role: {k: v.clone() for k, v in tensors.items()} for role, tensors in saved.items()}
    taken = [probe(worker, 0, protocol.FRESH_POINT)]
    for cycle in range(1, cycles + 1):
        worker.specwake_emulate_discard(fill="random", rules="0.33")
        restore(worker, saved)
        taken.append(probe(worker, cycle, RELOAD))
        with torch.no_grad():  # the stage's first forward after the reload
            if change == "draft":
                runner.drafter.model.head.weight.mul_(1.05)
            elif change == "target":
                runner.model.proj.weight.mul_(1.05)
        taken.append(probe(worker, cycle, protocol.STAGE_POINT))
    return taken


def at(diagnostics: list[Diagnostic], cycle: int, point: str, role: str) -> Any:
    (found,) = [d.parts(role)[0] for d in diagnostics if d.cycle == cycle and d.point == point]
    return found


def test_the_worker_names_a_tensor_the_stage_changed_after_a_right_reload() -> None:
    taken = planted_run("draft")
    assert at(taken, 1, RELOAD, "draft").differ == 0  # every fingerprint right after the reload passes it
    after = at(taken, 1, protocol.STAGE_POINT, "draft")
    assert after.changed == 1 and after.changed_names == ["head.weight"]
    assert after.changed_how == {"head.weight": "values"}
    assert after.differ == 1 and after.differ_names == ["head.weight"]  # and it differs from fresh at the stage's end
    assert at(taken, 1, protocol.STAGE_POINT, "target").changed == 0
    assert at(taken, 2, protocol.STAGE_POINT, "draft").changed_names == ["head.weight"]  # again after every reload


def test_a_tensor_the_reload_left_wrong_is_not_counted_as_changed_by_the_stage() -> None:
    worker = Worker()
    worker.specwake_fingerprint(**fingerprint_kwargs(protocol.FRESH_POINT))
    worker.specwake_emulate_discard(fill="random", rules="0.33")  # nothing restores it: wrong since the reload
    reload = worker.specwake_fingerprint(**fingerprint_kwargs(RELOAD))
    after = worker.specwake_fingerprint(**fingerprint_kwargs(protocol.STAGE_POINT))
    assert reload["draft"]["differ"] == 3 and after["draft"]["differ"] == 3
    assert after["draft"]["changed"] == 0 and after["target"]["changed"] == 0


def test_without_a_fingerprint_after_a_restore_nothing_is_compared_with_one() -> None:
    worker = Worker()
    worker.specwake_fingerprint(**fingerprint_kwargs(protocol.FRESH_POINT))
    after = worker.specwake_fingerprint(**fingerprint_kwargs(protocol.STAGE_POINT))  # an L1 wake: no restore point
    assert "changed" not in after["draft"] and after["draft"]["differ"] == 0
    taken = Diagnostic.from_dict({"cycle": 1, "point": protocol.STAGE_POINT, "fingerprints": [after]})
    assert held([taken], "draft") is None


def test_a_drafter_changed_during_a_stage_is_degraded_a_target_corrupt_whatever_al_says() -> None:
    stages = [stage(c, accepted=300) for c in range(3)]  # AL 4.00 throughout
    for change, outcome in (("draft", "degraded"), ("target", "corrupt"), (None, "recover")):
        taken = planted_run(change)
        facts = {"target_held": held(taken, "target"), "draft_held": held(taken, "draft")}
        restored = {"target_restored": True, "draft_restored": True}
        assert decide_outcome(stages, tolerance=TOLERANCE, **restored, **facts) == outcome
    assert decide_outcome(stages, tolerance=TOLERANCE) == "recover"  # results from before: nothing compared


def test_the_run_fails_naming_the_tensor_the_stage_and_the_cycle(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    timings = {"startup": 3.0, "measurement": 2.0, "diagnostics": 0.5, STAGE_FINGERPRINTS: 0.2}
    planted = judge_variant(s, prepared(s), held_record(diagnostics=planted_run("draft"), timings=timings))
    assert planted.outcome == "degraded" and not planted.matched  # expected recover
    assert explain(planted, TOLERANCE) == (
        "AL 4.00 → 4.00 → 4.00 (every post-cycle AL ≥ 3.80 = 95% of fresh); the drafter's weights explain it (draft:"
        " 1/3 tensors changed during the stage after L2 #1 (cycle 1), since reload_weights — head.weight: other values)"
    )
    block = "\n".join(details(planted))
    assert (
        "- draft: 1/3 tensors changed during the stage after L2 #1 (cycle 1), since reload_weights — head.weight: other"
        " values; changed too in cycle 2" in block
    ), block
    assert "- target: 0/4 tensors changed during the stages after cycles 1–2, since reload_weights" in block
    assert "diagnostics 0.5 s (0.2 s of it fingerprints after stages)" in block and "stage fingerprints" not in block
    run = judge_scenario(s, [planted], "2026-12-01T00:00:00+00:00", complete=True, mode="sequential", host={})
    line = verdict_line([run])
    assert "degraded (draft: 1/3 tensors changed during the stage after L2 #1 (cycle 1)" in line, line
    assert [(c.role, c.cycle, c.what) for c in stage_changes(planted.diagnostics, "draft")] == [
        ("draft", 1, "reload_weights"),
        ("draft", 2, "reload_weights"),
    ]


def test_a_run_whose_stages_changed_nothing_recovers_and_says_so(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    right = judge_variant(s, prepared(s), held_record(diagnostics=planted_run(None)))
    assert right.outcome == "recover" and right.matched
    block = "\n".join(details(right))
    assert "- draft: 0/3 tensors changed during the stages after cycles 1–2, since reload_weights" in block


def test_a_target_the_stage_changed_is_corrupt_and_said_to_have_changed_after_its_restore(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    planted = judge_variant(s, prepared(s), held_record(diagnostics=planted_run("target")))
    assert planted.outcome == "corrupt" and not planted.matched
    assert explain(planted, TOLERANCE).startswith(
        "the target changed after its restore: the target's weights explain it (target: 1/4 tensors changed during the"
        " stage after L2 #1 (cycle 1), since reload_weights — proj.weight: other values)"
    )
