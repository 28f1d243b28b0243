"""Spec-decode counters that disagree with themselves (docs/how-it-works.md#acceptance-length): a stage measured on a
metrics path that counts accepted tokens it never drafted has its AL void, the variant a finding naming vLLM's metrics
path, and its outcome `error` where it would turn on that AL; an outcome other evidence decides stands.

The planted stages come from the in-memory server (tests/helpers/mock_vllm.py, phantom_accepted) or from
specwake.run.measure.metrics.disagreement on chosen counts, never typed-in reasons.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwake.judge.expectations import Limits
from specwake.judge.findings import METRICS_DISAGREE, findings
from specwake.judge.verdict import decide_outcome, decide_verdict, engine_stages, outcome_matches, worst
from specwake.report import render_markdown, stages_frame
from specwake.report.explain import explain
from specwake.report.junit import render_junit
from specwake.results import EngineStage, StageResult
from specwake.run.measure.client import VllmClient
from specwake.run.measure.completions import Completer
from specwake.run.measure.cycle import run_cycle
from specwake.run.measure.measure import Stopping, Workload, run_stage, stage_name
from specwake.run.measure.metrics import disagreement
from tests.helpers import builders
from tests.helpers.mock_vllm import MockVllm

TOL = 0.05
WORKLOAD = Workload("m", ("alpha", "beta"), max_tokens=8, repeats=4, warmup=1, temperature=0.0, ignore_eos=True,
                    request_timeout_s=5)  # fmt: skip


def measured(server: MockVllm) -> list[StageResult]:
    """The fresh stage, one L2 cycle, and the stage after it (which may stop early), on `server`."""
    http = server.client()

    def stage(cycle: int, fresh: tuple | None = None) -> tuple:
        return run_stage(VllmClient(http), Completer(http), WORKLOAD, name=stage_name(cycle), cycle=cycle,
                         fresh=fresh[0] if fresh else None, fresh_completions=fresh[1] if fresh else (),
                         stopping=Stopping(TOL))  # fmt: skip

    fresh = stage(0)
    run_cycle(VllmClient(http), 1, level=2, emulate_discard=True, step_timeout_s=5)
    return [fresh[0], stage(1, fresh)[0]]


def void(cycle: int, drafts: int = 100, accepted: int = 300, per_pos: tuple[int, ...] = (0, 0, 0)) -> StageResult:
    """A stage whose counters count `accepted` tokens but `per_pos` at the positions: AL as fresh's if it were read."""
    why = disagreement(drafts, accepted, per_pos)
    assert why is not None
    return builders.stage(cycle, drafts=drafts, accepted=accepted, acceptance_length=None, counters_disagree=why)


def test_a_metrics_path_counting_accepted_tokens_never_drafted_voids_the_stage() -> None:
    fresh, after = measured(MockVllm(phantom_accepted=True))
    assert fresh.counters_disagree is None and fresh.acceptance_length == pytest.approx(4.0)
    # the fooling case: read as AL, the dead drafter's counters say 1 + accepted / drafts = fresh's AL
    assert 1 + after.num_accepted_tokens / after.num_drafts == pytest.approx(fresh.acceptance_length)
    assert after.acceptance_length is None and after.counters_disagree is not None
    assert after.counters_disagree.startswith("the accepted tokens per position sum to 0, not to the accepted total")
    # not decided request by request on counters that disagree: every request measured
    assert after.measured == WORKLOAD.repeats
    assert (
        after.stopped
        == f"cap: {WORKLOAD.repeats} requests (repeats); the counters could not be read request by request"
    )
    assert decide_outcome([fresh, after], tolerance=TOL) == "error"


def test_honest_counters_of_the_same_server_are_read() -> None:
    fresh, after = measured(MockVllm())
    assert fresh.counters_disagree is None and after.counters_disagree is None
    assert after.acceptance_length == pytest.approx(1.0)
    assert decide_outcome([fresh, after], tolerance=TOL) == "collapse"


@pytest.mark.parametrize("at", [0, 1])
def test_the_outcome_is_error_where_it_turns_on_the_void_al(at: int) -> None:
    stages = [builders.stage(0, accepted=300), builders.stage(1, accepted=300)]
    stages[at] = void(at)
    assert decide_outcome(stages, tolerance=TOL) == "error"


def test_outcomes_other_evidence_decides_stand_beside_a_void_stage() -> None:
    fresh, void_two = builders.stage(0, accepted=300), void(2)
    assert decide_outcome([fresh, builders.stage(1, accepted=0), void_two], tolerance=TOL) == "collapse"
    changed = builders.stage(1, accepted=300, outputs_match_fresh=False, outputs_close_to_fresh=False)
    assert decide_outcome([fresh, changed, void_two], tolerance=TOL) == "corrupt"
    assert decide_outcome([fresh, void(1)], tolerance=TOL, failure="server_exited") == "crash"
    assert decide_outcome([fresh, void(1)], tolerance=TOL, draft_restored=False) == "degraded"


def test_the_finding_names_vllms_metrics_path_the_stage_and_the_numbers() -> None:
    stage = void(1, drafts=20, accepted=45, per_pos=(25, 15, 5))
    variant = builders.variant(outcome="error", stages=[builders.stage(0, accepted=300), stage])
    assert findings(variant, Limits()) == [
        f"{METRICS_DISAGREE} at after L2 #1: position 0 accepted 25 tokens in 20 drafts (vLLM's metrics path, not the"
        " drafter: that AL is void)"
    ]
    assert findings(builders.variant(stages=[builders.stage(0, accepted=300)]), Limits()) == []
    line = explain(variant, TOL)
    assert "after L2 #1" in line and "position 0 accepted 25 tokens in 20 drafts" in line and "metrics path" in line


def test_the_finding_fails_an_outcome_that_stands_and_error_is_not_a_failure() -> None:
    stages = [builders.stage(0, accepted=300), builders.stage(1, accepted=0), void(2)]
    found = findings(builders.variant(outcome="collapse", stages=stages), Limits())
    assert len(found) == 1 and found[0].startswith(f"{METRICS_DISAGREE} at after L2 #2")
    matched = outcome_matches("collapse", "collapse") and not found
    assert decide_verdict([("collapse", matched)]) == "fail"
    assert decide_verdict([("error", outcome_matches("error", "recover"))]) == "error"


def test_one_engines_counters_that_disagree_void_its_al_and_make_the_variant_error() -> None:
    why = disagreement(50, 150, (0, 0, 0))
    good = EngineStage("0", 4.0, 50, 150, 150, [1.0, 1.0, 1.0], 2)
    bad = EngineStage("1", None, 50, 150, 150, [0.0, 0.0, 0.0], 2, why)
    fresh = builders.stage(0, accepted=300, engines=[replace(good), replace(good, engine="1")])
    after = builders.stage(1, accepted=300, engines=[good, bad])  # the sum over engines reads as recovered
    stages = [fresh, after]
    outcomes = {e: decide_outcome(engine_stages(stages, e), tolerance=TOL) for e in ("0", "1")}
    assert decide_outcome(stages, tolerance=TOL) == "recover" and outcomes == {"0": "recover", "1": "error"}
    assert worst([*outcomes.values()]) == "error"
    assert engine_stages(stages, "1")[1].counters_disagree == why
    found = findings(builders.variant(outcome="error", stages=stages), Limits())
    assert found == [
        f"{METRICS_DISAGREE} at after L2 #1 engine 1: {why} (vLLM's metrics path, not the drafter: that AL is void)"
    ]


def test_reports_show_the_al_as_void() -> None:
    stages = [builders.stage(0, accepted=300), void(1)]
    result = builders.scenario("s", "error", [builders.variant(outcome="error", expected="recover", stages=stages)])
    assert f"AL void (counters disagree: {stages[1].counters_disagree})" in render_junit([result])
    assert "| after L2 #1 |  void |" in render_markdown([result])
    column = stages_frame([result])["counters_disagree"]
    assert column.isna().tolist() == [True, False] and column.iloc[1] == stages[1].counters_disagree
