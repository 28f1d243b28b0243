"""Unit tests of specwake.judge.verdict: outcome rules and their order, verdicts, exit codes, wording.

Stages are built here with chosen numbers; the thresholds they sit on are computed, not typed.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from specwake.errors import EXIT_FAIL, EXIT_INFRA, EXIT_INPUT, EXIT_PASS
from specwake.judge.crashes import ERROR_CLASSES, MEANINGS
from specwake.judge.expectations import COLLAPSE_AL, DEFAULT_MIN_SPEEDUP, EXPECTATIONS, Limits
from specwake.judge.findings import findings
from specwake.judge.verdict import (
    GROSS_LOSS_RATIO,
    OUTCOMES,
    decide_outcome,
    decide_verdict,
    exit_code,
    judges_drafter,
    outcome_matches,
    sleep_ignored,
    speed_rule,
)
from specwake.report.explain import explain, first_difference
from specwake.results import INCOMPLETE, Diagnostic, Push, StageResult, StepResult, VariantResult
from tests.helpers import builders

TOL = 0.05


def stage(cycle: int, al: float | None, drafts: int = 100, k: int = 3) -> StageResult:
    """AL exactly `al` (the accepted count rounded to match), no per-position rates."""
    accepted = round(((al or 1.0) - 1.0) * drafts)
    return builders.stage(cycle, drafts=drafts, accepted=accepted, k=k, acceptance_length=al, per_position=[])


def outcome(stages: list[StageResult], **kw: object) -> str:
    return decide_outcome(stages, tolerance=TOL, **kw)  # type: ignore[arg-type]


def variant(outcome_: str, stages: list[StageResult], **kw: object) -> VariantResult:
    """The baseline, expecting any outcome and marked as matched (even an error) unless `matched` is given."""
    return builders.variant(outcome=outcome_, stages=stages, **({"matched": True} | kw))


# ------------------------------------------------------------ decide_outcome


def test_recover_when_every_post_stage_is_within_tolerance() -> None:
    assert outcome([stage(0, 4.0), stage(1, 3.9), stage(2, 4.0)]) == "recover"


def test_recover_on_the_exact_tolerance_bound_despite_float_noise() -> None:
    fresh = 2.47
    bound = round((1 - TOL) * fresh, 9)  # the decimal bound; binary floats put it a hair above
    assert (1 - TOL) * fresh > bound  # the case this test exists for
    assert outcome([stage(0, fresh), stage(1, bound)]) == "recover"


def test_degraded_just_below_the_bound() -> None:
    fresh = 4.0
    below = (1 - TOL) * fresh - 0.01
    assert outcome([stage(0, fresh), stage(1, 4.0), stage(2, below)]) == "degraded"


def test_collapse_when_a_post_stage_has_drafts_and_no_acceptance() -> None:
    assert outcome([stage(0, 4.0), stage(1, 1.0)]) == "collapse"


def test_collapse_threshold_is_inclusive_and_first_collapse_wins_over_recovery() -> None:
    stages = [stage(0, 4.0), stage(1, 4.0), stage(2, COLLAPSE_AL)]
    assert outcome(stages) == "collapse"
    above = [stage(0, 4.0), stage(1, COLLAPSE_AL + 0.01)]
    assert outcome(above) == "degraded"


def test_collapse_threshold_can_be_changed() -> None:
    stages = [stage(0, 4.0), stage(1, 1.5)]
    assert outcome(stages) == "degraded"
    relaxed = decide_outcome(stages, tolerance=TOL, collapse_al=1.5)
    assert relaxed == "collapse"


def test_fresh_al_of_one_that_stays_is_collapse_not_recover() -> None:
    # a drafter that never worked: fresh 1.00 and after 1.00 is no evidence of recovery
    assert outcome([stage(0, 1.0), stage(1, 1.0)]) == "collapse"


def test_post_stage_without_drafts_is_not_collapse() -> None:
    assert outcome([stage(0, 4.0), stage(1, None, drafts=0)]) == "degraded"


@pytest.mark.parametrize(
    "stages",
    [
        [stage(0, 4.0)],  # no post-cycle stage
        [stage(0, None, drafts=0), stage(1, None, drafts=0)],  # speculation never drafted
    ],
    ids=["fresh-only", "no-drafts"],
)
def test_degraded_when_nothing_proves_recovery(stages: list[StageResult]) -> None:
    assert outcome(stages) == "degraded"


@pytest.mark.parametrize("stages", [[], [stage(1, 4.0)]], ids=["nothing", "post-only"])
@pytest.mark.parametrize("failure", [None, "server_exited", "step_failed", "request_timeout"])
def test_without_a_fresh_stage_nothing_was_tested_error_whatever_failed(
    stages: list[StageResult], failure: str | None
) -> None:
    assert outcome(stages, failure=failure) == "error"
    assert not outcome_matches("error", "any")


def test_crash_keeps_priority_over_its_partial_measurement() -> None:
    measured = [stage(0, 4.0), stage(1, 1.0)]
    assert outcome(measured, failure="step_failed") == "crash"
    assert outcome(measured[:1], failure="server_exited") == "crash"
    assert outcome_matches("crash", "any")


@pytest.mark.parametrize("cls", ERROR_CLASSES)
def test_classes_that_mean_never_measured_are_error(cls: str) -> None:
    assert outcome([], failure=cls) == "error"
    assert outcome([stage(0, 4.0)], failure=cls) == "error"


@pytest.mark.parametrize("cls", [c for c in MEANINGS if c not in ERROR_CLASSES])
def test_every_other_class_is_a_crash(cls: str) -> None:
    assert outcome([stage(0, 4.0)], failure=cls) == "crash"


def diverged(cycle: int, al: float) -> StageResult:
    return replace(stage(cycle, al), outputs=["y"], outputs_match_fresh=False)


def test_outputs_that_differ_from_fresh_are_corrupt_and_rank_above_collapse() -> None:
    assert outcome([stage(0, 4.0), diverged(1, 4.0)]) == "corrupt"
    assert outcome([stage(0, 4.0), stage(1, 1.0), diverged(2, 1.0)]) == "corrupt"
    assert outcome([stage(0, 4.0), diverged(1, 1.0)], failure="step_failed") == "crash"


def test_a_target_that_does_not_match_fresh_is_corrupt_even_with_equal_text() -> None:
    assert outcome([stage(0, 4.0), stage(1, 4.0)], target_restored=False) == "corrupt"
    assert outcome([stage(0, 4.0), stage(1, 4.0)], target_restored=True) == "recover"
    assert outcome([stage(0, 4.0), stage(1, 4.0)], target_restored=None) == "recover"


def timed(cycle: int, al: float, speeds: list[float]) -> StageResult:
    return replace(stage(cycle, al), tok_s=speeds, tok_s_median=statistics.median(speeds))


FRESH_SPEEDS = [600.0, 605.0, 610.0, 615.0, 620.0]


def test_a_binding_speed_loss_turns_recover_into_degraded_an_advisory_one_does_not() -> None:
    slower = [timed(0, 4.0, FRESH_SPEEDS)] + [timed(c, 4.0, [x * 0.6 for x in FRESH_SPEEDS]) for c in (1, 2)]
    binding, advisory = speed_rule(0.9, "emulated"), speed_rule(None, "emulated")
    assert binding.binding and not advisory.binding
    assert outcome(slower, speed=binding) == "degraded"
    assert outcome(slower, speed=advisory) == "recover"
    assert outcome(slower, speed=speed_rule(None, "native")) == "degraded"


def test_a_gross_speed_loss_turns_recover_into_degraded_on_every_platform() -> None:
    """A drafter that sleeps 10 ms a forward after its reload: AL holds, decoding runs at 0.43× fresh."""
    slowed = [timed(0, 4.0, FRESH_SPEEDS)] + [timed(c, 4.0, [x * 0.43 for x in FRESH_SPEEDS]) for c in (1, 2)]
    advisory = speed_rule(None, "emulated")
    assert outcome(slowed, speed=advisory) == "degraded"
    assert outcome(slowed, speed=None) == "degraded"
    line = explain(variant("degraded", slowed), TOL)
    assert f"decoding after the cycles ran at 0.43× fresh: below {GROSS_LOSS_RATIO}×, lost" in line


def test_the_speed_rule_says_why_it_applies() -> None:
    assert "scenario" in speed_rule(0.8, "native").why and speed_rule(0.8, "native").min_ratio == 0.8
    assert "advisory" in speed_rule(None, "emulated").why
    assert speed_rule(None, "native").min_ratio == DEFAULT_MIN_SPEEDUP


def test_explain_corrupt_says_where_the_text_diverged() -> None:
    fresh = replace(stage(0, 4.0), outputs=["abcdefgh", "same"])
    after = replace(stage(1, 4.0), outputs=["abcXefgh", "same"], outputs_match_fresh=False)
    line = explain(variant("corrupt", [fresh, after]), TOL)
    assert line.startswith("the target was not restored: after L2 #1: completions differ from fresh")
    assert "request 1, from character 3: 'Xefgh' where fresh had 'defgh'" in line
    assert first_difference("abc", "abc") is None and first_difference("abc", "ab") == 2
    target = {"tensors": 9, "compared": 9, "differ": 1, "differ_names": ["lm_head.weight"], "version": 2}
    target |= {"differ_how": {"lm_head.weight": "rearranged"}, "differ_by_how": {"rearranged": 1}}
    draft = {"tensors": 7, "compared": 7, "differ": 0}
    point = {"cycle": 1, "point": "after reload_weights", "fingerprints": [{"target": target, "draft": draft}]}
    line = explain(variant("corrupt", [fresh, after], diagnostics=[Diagnostic.from_dict(point)]), TOL)
    assert (
        "; the target's weights explain it (target: 1/9 tensors differ from fresh after reload_weights in cycle 1"
        in line
    )
    assert line.endswith(" — lm_head.weight: same values in other places); AL 4.00 → 4.00")
    line = explain(variant("corrupt", [fresh, after], diagnostics=[restore_point(1, 0)]), TOL)
    assert "; not the weights (target and drafter as fresh after every reload_weights); AL 4.00 → 4.00" in line


@pytest.mark.parametrize("tolerance", [-0.1, 1.0, 2.0])
def test_bad_tolerance_is_rejected(tolerance: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        decide_outcome([], tolerance=tolerance)


# ------------------------------------------------------------ matching and verdicts


@pytest.mark.parametrize("out", OUTCOMES)
@pytest.mark.parametrize("expected", EXPECTATIONS)
def test_outcome_matches_table(out: str, expected: str) -> None:
    should = out not in ("error", "untested") and (expected == "any" or expected == out)
    assert outcome_matches(out, expected) is should


def test_degraded_only_matches_any() -> None:
    assert [e for e in EXPECTATIONS if outcome_matches("degraded", e)] == ["any"]


def test_unknown_labels_are_rejected() -> None:
    with pytest.raises(ValueError, match="outcome"):
        outcome_matches("recovered", "recover")
    with pytest.raises(ValueError, match="expectation"):
        outcome_matches("recover", "degraded")


@pytest.mark.parametrize(
    ("pairs", "verdict"),
    [
        ([("collapse", "collapse"), ("recover", "recover")], "pass"),
        ([("collapse", "any"), ("crash", "any")], "pass"),
        ([("collapse", "collapse"), ("collapse", "recover")], "fail"),
        ([("degraded", "recover"), ("error", "recover")], "fail"),  # fail wins over error
        ([("collapse", "collapse"), ("error", "recover")], "error"),
        ([("error", "any")], "error"),
        ([], "error"),
    ],
)
def test_decide_verdict(pairs: list[tuple[str, str]], verdict: str) -> None:
    assert decide_verdict([(o, outcome_matches(o, e)) for o, e in pairs]) == verdict


def test_a_variant_with_findings_fails_even_when_its_outcome_matched() -> None:
    assert decide_verdict([("recover", True), ("collapse", False)]) == "fail"


def step(cycle: int, name: str, seconds: float, rss_mib: float | None = None) -> StepResult:
    rss = None if rss_mib is None else int(rss_mib * 1024 * 1024)
    return StepResult(cycle, name, "POST", "/x", 200, seconds, True, rss_bytes=rss)


def test_findings_name_a_stale_prefix_cache_and_every_limit_exceeded() -> None:
    stale = replace(stage(1, 4.0), prefix_cached=64, max_logprob_drift=0.02)
    steps = [step(1, "wake_weights", 1.0), step(1, "reload_weights", 2.0, 1000), step(2, "wake_weights", 0.5),
             step(2, "reload_weights", 0.5, 1300)]  # fmt: skip
    v = variant("recover", [stage(0, 4.0), stale], steps=steps)
    none = findings(v, Limits())
    assert none == [
        "stale prefix cache: after L2 #1 served 64 prompt tokens from cache right after the wake, "
        "which should have emptied it"
    ]
    every = findings(v, Limits(max_logprob_drift=0.01, max_rss_growth_mb=200, max_wake_s=2.5))
    assert every[1] == "logprobs drift by 0.02 at after L2 #1 > max_logprob_drift 0.01"
    assert every[2] == "host RSS grew 300 MiB from cycle 1 to 2 > max_rss_growth_mb 200"
    assert every[3] == "wake of cycle 1 took 3.00 s > max_wake_s 2.5"
    assert findings(variant("recover", [stage(0, 4.0), stage(1, 4.0)], steps=steps), Limits(max_wake_s=5)) == []


def test_by_default_a_recovered_variants_logprobs_may_drift_only_as_far_as_the_fresh_stages_own() -> None:
    """A fix that serves another target after each reload (its final norm ×1.01) picks the same tokens: AL and outputs
    recover, only the logprobs drift (0.0162 on CPU, where the fresh stage's own requests drift by exactly 0)."""
    fresh = replace(stage(0, 4.0), own_logprob_drift=0.0)
    drifting = replace(stage(1, 4.0), max_logprob_drift=0.0162)
    assert findings(variant("recover", [fresh, drifting]), Limits()) == [
        "logprobs drift by 0.0162 at after L2 #1, beyond the fresh stage's own 0 (its requests of one prompt): the"
        " served model is not the fresh one (expect.max_logprob_drift sets another bound)"
    ]
    assert findings(variant("recover", [fresh, replace(drifting, max_logprob_drift=0.0)]), Limits()) == []
    noisy = replace(fresh, own_logprob_drift=0.02)  # a GPU whose own numerics move this far
    assert findings(variant("recover", [noisy, drifting]), Limits()) == []
    assert findings(variant("collapse", [fresh, replace(drifting, acceptance_length=1.0)]), Limits()) == []
    assert findings(variant("recover", [replace(fresh, own_logprob_drift=None), drifting]), Limits()) == []
    assert findings(variant("recover", [fresh, drifting]), Limits(max_logprob_drift=0.05)) == []  # the override


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        (["pass"], EXIT_PASS),
        (["pass", "pass"], EXIT_PASS),
        (["pass", "fail"], EXIT_FAIL),
        (["error", "fail", "pass"], EXIT_FAIL),
        (["pass", "error"], EXIT_INFRA),
        ([], EXIT_INFRA),
    ],
)
def test_exit_code(verdicts: list[str], code: int) -> None:
    assert exit_code(verdicts) == code


def test_a_refused_input_makes_an_error_exit_2_but_a_failure_still_wins() -> None:
    assert exit_code(["error", "pass"], input_rejected=True) == EXIT_INPUT
    assert exit_code(["error", "fail"], input_rejected=True) == EXIT_FAIL
    assert exit_code(["pass"], input_rejected=True) == EXIT_PASS


def test_exit_code_rejects_unknown_verdict() -> None:
    with pytest.raises(ValueError, match="verdict"):
        exit_code(["PASS"])


# ------------------------------------------------------------ explain


def test_explain_collapse_names_the_stage_and_counts() -> None:
    collapsed = stage(1, 1.0, drafts=96)
    line = explain(variant("collapse", [stage(0, 4.0), collapsed]), TOL)
    assert line.startswith("AL 4.00 → 1.00")
    assert collapsed.name in line
    assert f"{collapsed.num_accepted_tokens}/{collapsed.num_draft_tokens}" in line
    assert f"{collapsed.num_drafts} drafts" in line
    assert "\n" not in line


def test_explain_recover_shows_the_bound() -> None:
    line = explain(variant("recover", [stage(0, 4.0), stage(1, 3.9)]), TOL)
    assert line.startswith("AL 4.00 → 3.90")
    assert f"{(1 - TOL) * 4.0:.2f}" in line


def test_explain_degraded_names_the_low_stage() -> None:
    stages = [stage(0, 4.0), stage(1, 4.0), stage(2, 2.5)]
    line = explain(variant("degraded", stages), TOL)
    assert "after L2 #2: AL 2.50" in line
    assert f"{(1 - TOL) * 4.0:.2f}" in line


def test_explain_degraded_without_drafts() -> None:
    stages = [stage(0, None, drafts=0), stage(1, None, drafts=0)]
    assert "no drafts" in explain(variant("degraded", stages), TOL)


def test_explain_crash_after_partial_measurement_keeps_the_numbers() -> None:
    crashed = variant(
        "crash",
        [stage(0, 4.0), stage(1, 1.0)],
        crash_class="step_failed",
        error="POST /collective_rpc answered 500\nTraceback ...",
    )
    line = explain(crashed, TOL)
    assert "step_failed" in line
    assert "POST /collective_rpc answered 500" in line
    assert "Traceback" not in line
    assert "AL 4.00 → 1.00 before the crash" in line


def test_explain_crash_before_any_stage() -> None:
    line = explain(variant("crash", [], crash_class="server_exited"), TOL)
    assert "server_exited" in line and "no stage measured" in line


def test_explain_error_gives_first_line_of_the_error() -> None:
    failed = variant("error", [], crash_class="startup_failed", error="exited with 1\nlog tail")
    line = explain(failed, TOL)
    assert "startup_failed" in line and "exited with 1" in line and "log tail" not in line
    assert line.startswith("not measured")


def test_explain_a_variant_still_running() -> None:
    running = variant(INCOMPLETE, [stage(0, 4.0), stage(1, 1.0)], matched=False)
    assert explain(running, TOL) == "not finished; AL 4.00 → 1.00 so far"
    nothing = "not run: nothing recorded (the run stopped first, or has not got to it yet)"
    assert explain(variant(INCOMPLETE, []), TOL) == nothing  # a partial result lists every planned variant


def test_a_variant_without_speculation_is_the_floor_unless_its_target_broke() -> None:
    no_drafts = [stage(0, None, drafts=0), stage(1, None, drafts=0)]
    assert outcome(no_drafts, speculative=False) == "floor"
    assert outcome([stage(0, None, drafts=0), diverged(1, 1.0)], speculative=False) == "corrupt"
    assert outcome(no_drafts, speculative=False, failure="startup_failed") == "error"
    assert outcome_matches("floor", "any") and not outcome_matches("floor", "recover")
    assert "no speculation" in explain(variant("floor", no_drafts), TOL)


# ------------------------------------------------------------ the drafter, moved storage, an ignored sleep


def restore_point(cycle: int, draft_differ: int, moved: int = 0, point: str = "after reload_weights") -> Diagnostic:
    """One rank's fingerprints after a reload: the target matches fresh; the drafter has `draft_differ` of 7 tensors
    off and `moved` tensor attributes at a new address."""
    target = {"tensors": 9, "compared": 9, "differ": 0, "moved": 0}
    draft = {
        "tensors": 7, "compared": 7, "differ": draft_differ, "differ_names": ["fc.weight"][:draft_differ],
        "moved": moved, "moved_names": ["_fused"][:moved], "moved_by_kind": {"attribute": moved},
    }  # fmt: skip
    return Diagnostic.from_dict({"cycle": cycle, "point": point, "fingerprints": [{"target": target, "draft": draft}]})


def test_a_drafter_that_does_not_match_fresh_is_never_recover_even_while_al_holds() -> None:
    held = [stage(0, 4.0), stage(1, 4.0), stage(2, 4.0)]
    assert outcome(held, draft_restored=False) == "degraded"
    assert outcome(held, draft_restored=True) == "recover" and outcome(held, draft_restored=None) == "recover"
    assert outcome([stage(0, 4.0), stage(1, 1.0)], draft_restored=False) == "collapse"  # the stock drafter


def test_the_explanation_names_the_worst_cycle_of_the_drafter() -> None:
    diagnostics = [restore_point(1, 0), restore_point(2, 2)]  # restored on cycle 1, not on cycle 2
    v = variant("degraded", [stage(0, 4.0), stage(1, 4.0), stage(2, 4.0)], diagnostics=diagnostics)
    text = explain(v, TOL)
    assert text.startswith("AL 4.00 → 4.00 → 4.00 (every post-cycle AL ≥ 3.80")
    assert text.endswith(
        "; the drafter's weights explain it (draft: 2/7 tensors differ from fresh after reload_weights in cycle 2"
        " — fc.weight and 1 more)"
    )


def test_an_outcome_other_than_recover_says_whether_the_weights_explain_it() -> None:
    collapsed = [stage(0, 4.0), stage(1, 1.0)]
    stock = explain(variant("collapse", collapsed, diagnostics=[restore_point(1, 1)]), TOL)
    assert stock.endswith(
        "; the drafter's weights explain it (draft: 1/7 tensors differ from fresh after reload_weights in cycle 1"
        " — fc.weight)"
    )
    other = explain(variant("collapse", collapsed, diagnostics=[restore_point(1, 0)]), TOL)
    assert other.endswith("; not the weights (target and drafter as fresh after every reload_weights)")
    slow = explain(variant("degraded", [stage(0, 4.0), stage(1, 3.0)], diagnostics=[restore_point(1, 0)]), TOL)
    assert "AL 3.00 < 3.80" in slow and slow.endswith(
        "; not the weights (target and drafter as fresh after every reload_weights)"
    )
    assert "weights" not in explain(variant("collapse", collapsed), TOL)  # nothing compared: nothing said
    assert "weights" not in explain(
        variant("recover", [stage(0, 4.0), stage(1, 4.0)], diagnostics=[restore_point(1, 0)]), TOL
    )


def test_the_drafter_is_judged_after_a_reload_from_its_checkpoint_only() -> None:
    assert judges_drafter(None)  # reload_weights
    assert judges_drafter(Push(("target", "draft")))
    assert not judges_drafter(Push(("target",)))  # the drafter keeps its discarded weights
    assert not judges_drafter(Push(("target", "draft"), {"lm_head.weight": 2.0}))  # changed on purpose


def test_tensors_in_new_storage_are_a_finding_unless_the_scenario_never_captures_graphs() -> None:
    v = variant("recover", [stage(0, 4.0), stage(1, 4.0)], diagnostics=[restore_point(1, 0, moved=1)])
    assert findings(v, Limits()) == [
        "draft: 1 tensor in new storage after reload_weights in cycle 1 (1 tensor attributes; _fused): a CUDA graph"
        " captured before the sleep reads the old memory"
    ]
    assert findings(v, Limits(graph_safe=False)) == []
    assert findings(replace(v, diagnostics=[restore_point(1, 0)]), Limits()) == []


def test_an_ignored_l1_sleep_is_untested_which_no_expectation_accepts() -> None:
    held = [stage(0, 4.0), stage(1, 4.0)]
    assert sleep_ignored(1, "emulated", pushing=False)
    assert not sleep_ignored(2, "emulated", pushing=False) and not sleep_ignored(1, "native", pushing=False)
    assert not sleep_ignored(1, "emulated", pushing=True)  # a push still puts new weights in
    assert outcome(held, sleep_ignored=True) == "untested"
    assert outcome([stage(0, 4.0), diverged(1, 4.0)], sleep_ignored=True) == "corrupt"
    assert not any(outcome_matches("untested", e) for e in EXPECTATIONS)
    assert decide_verdict([("recover", True), ("untested", False)]) == "error"
    assert "vLLM ignores sleep on CPU" in explain(variant("untested", held), TOL)


def test_input_rejected_is_an_error_not_a_crash_even_after_the_fresh_stage() -> None:
    assert outcome([stage(0, 4.0)], failure="input_rejected") == "error"


def test_a_drafter_left_out_of_the_push_is_never_said_to_be_not_the_weights() -> None:
    pushed = [restore_point(1, 0, point="after push")]
    collapsed = variant("collapse", [stage(0, 4.0), stage(1, 1.0)], diagnostics=pushed, push=Push(("target",)))
    assert "weights" not in explain(collapsed, TOL)  # the drafter kept its discarded weights, unjudged
    both = variant("collapse", [stage(0, 4.0), stage(1, 1.0)], diagnostics=pushed, push=Push(("target", "draft")))
    assert explain(both, TOL).endswith("; not the weights (target and drafter as fresh after every push)")
