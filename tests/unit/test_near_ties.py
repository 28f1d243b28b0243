"""Completions compared with fresh the way vLLM's model tests compare two runs: where greedy tokens part at a
near-tie (each side's token among the other's top logprobs, within NEAR_TIE_NATS), that is numerics and a note;
any other parting is a divergence. On logprobs recorded from real vLLM CPU runs (tests/data/near-ties.json)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx

from specwake.judge.verdict import decide_outcome, diverged
from specwake.report.columns import junit_line as stage_line
from specwake.report.cycles import logprob_line
from specwake.report.explain import explain
from specwake.results import NEAR_TIE_NATS, StageResult, from_dict
from specwake.run.measure.completions import TOP_LOGPROBS, Completer, Completion
from specwake.run.measure.measure import Drift, drift
from tests.helpers.builders import stage, variant
from tests.helpers.paths import DATA

RECORDED = json.loads((DATA / "near-ties.json").read_text())


def completion(recorded: dict[str, Any]) -> Completion:
    tokens = tuple(recorded["tokens"])
    return Completion(recorded["text"], len(tokens), 1.0, 0.1, tokens, tuple(recorded["logprobs"]),
                      tuple(recorded["top_logprobs"]))  # fmt: skip


def pair(case: str) -> tuple[list[Completion], list[Completion]]:
    return [completion(RECORDED[case]["fresh"])], [completion(RECORDED[case]["now"])]


def at(cycle: int, al: float, **fields: Any) -> StageResult:
    """A stage of 100 drafts with acceptance length `al`."""
    return stage(cycle, drafts=100, accepted=round((al - 1) * 100), **fields)


def after_cycle(d: Drift, fresh: list[Completion], now: list[Completion], al: float) -> list[StageResult]:
    """The fresh stage (AL 4) and a stage after one cycle with `now`'s completions, as run_stage records them."""
    before = at(0, 4.0, output=fresh[0].text)
    return [before, at(1, al, output=now[0].text, outputs_match_fresh=now[0].text == fresh[0].text,
                          outputs_close_to_fresh=d.close, near_ties=[list(t) for t in d.near_ties])]  # fmt: skip


def test_a_recorded_near_tie_flip_is_numerics_and_a_collapse_stays_collapse() -> None:
    fresh, now = pair("near_tie")
    d = drift(fresh, now)
    at = RECORDED["near_tie"]["parts_at"]
    assert d.first_difference == (0, at) and d.near_ties == ((0, at),) and d.close
    stages = after_cycle(d, fresh, now, 1.0)
    assert stages[1].outputs_match_fresh is False  # the texts do differ
    assert diverged(stages) is None
    assert decide_outcome(stages, tolerance=0.05) == "collapse"
    assert decide_outcome([stages[0], replace(stages[1], acceptance_length=4.0)], tolerance=0.05) == "recover"
    why = explain(variant("baseline", "collapse", stages=stages), 0.05)
    assert f"note: tokens part from fresh at a near-tie (after L2 #1 request 1 token {at})" in why
    assert stage_line(stages[1]).endswith("outputs part from fresh at near-ties only")
    flipped = replace(stages[1], first_difference=[0, at], logprobs_compared=at)
    assert f"request 1, token {at} (a near-tie: numerics)" in (logprob_line(variant(stages=[stages[0], flipped])) or "")


def test_a_recorded_corruption_is_corrupt_whatever_al_says() -> None:
    fresh, now = pair("corruption")
    d = drift(fresh, now)
    assert d.first_difference is not None and d.near_ties == () and not d.close
    stages = after_cycle(d, fresh, now, 1.0)
    assert diverged(stages) is stages[1]
    assert decide_outcome(stages, tolerance=0.05) == "corrupt"
    why = explain(variant("skiptarget", "corrupt", stages=stages), 0.05)
    assert "after L2 #1: completions differ from fresh (request 1, from character 0" in why and "near-tie" not in why
    assert stage_line(stages[1]).endswith("outputs DIFFER from fresh")


def test_a_top_k_member_ranked_a_nat_below_the_other_token_is_no_near_tie() -> None:
    fresh, now = pair("near_tie")
    at = RECORDED["near_tie"]["parts_at"]
    token = now[0].tokens[at]  # fresh's runner-up: push it more than NEAR_TIE_NATS below fresh's own token
    top = dict(fresh[0].top_logprobs[at])
    top[token] = top[fresh[0].tokens[at]] - NEAR_TIE_NATS - 0.01
    far = replace(fresh[0], top_logprobs=(*fresh[0].top_logprobs[:at], top, *fresh[0].top_logprobs[at + 1 :]))
    d = drift([far], now)
    assert token in far.top_logprobs[at] and d.near_ties == () and not d.close
    assert decide_outcome(after_cycle(d, [far], now, 1.0), tolerance=0.05) == "corrupt"


def test_a_token_outside_the_other_sides_top_logprobs_is_no_near_tie() -> None:
    fresh, now = pair("near_tie")
    at = RECORDED["near_tie"]["parts_at"]
    top = {t: lp for t, lp in now[0].top_logprobs[at].items() if t != fresh[0].tokens[at]}
    cut = replace(now[0], top_logprobs=(*now[0].top_logprobs[:at], top, *now[0].top_logprobs[at + 1 :]))
    assert drift(fresh, [cut]).near_ties == ()


def test_completions_without_tokens_that_differ_are_never_close() -> None:
    fresh = [Completion("abc", 3, 1.0), Completion("xyz", 3, 1.0)]
    d = drift(fresh, [Completion("abc", 3, 1.0), Completion("xyQ", 3, 1.0)])
    assert d.parted == (1,) and not d.close
    assert not drift(fresh[:1], fresh).close  # a request with no fresh counterpart is never excused


def test_a_perturbed_push_that_only_flips_a_near_tie_did_not_arrive() -> None:
    fresh, now = pair("near_tie")
    stages = after_cycle(drift(fresh, now), fresh, now, 4.0)
    assert decide_outcome(stages, tolerance=0.05, perturbed=frozenset({"target", "draft"})) == "degraded"
    fresh, now = pair("corruption")
    stages = after_cycle(drift(fresh, now), fresh, now, 4.0)
    assert decide_outcome(stages, tolerance=0.05, perturbed=frozenset({"target", "draft"})) == "recover"


def test_results_from_before_near_ties_judge_by_equality_alone() -> None:
    sample = from_dict(json.loads((DATA / "result-v1-sample.json").read_text()))
    for v in sample.variants:
        assert all(s.outputs_close_to_fresh is None and s.near_ties == [] for s in v.stages)
    old = [at(0, 4.0), at(1, 1.0, output="y", outputs_match_fresh=False)]
    assert decide_outcome(old, tolerance=0.05) == "corrupt"


def test_each_request_asks_for_the_top_logprobs_and_keeps_them() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        tops = [{"a": -0.1, "c": -2.5}, {"b": -0.7, "a": -0.8}]
        logprobs = {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.7], "top_logprobs": tops, "text_offset": [0, 1]}
        chunk = {"id": "x", "object": "text_completion", "created": 0, "model": "m",
                 "choices": [{"index": 0, "text": "ab", "logprobs": logprobs, "finish_reason": None}]}  # fmt: skip
        usage = {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}  # fmt: skip
        body = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    http = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(handler))
    got = Completer(http).complete(model="m", prompt="p", max_tokens=2, temperature=0.0, ignore_eos=True, timeout=5)
    assert bodies[0]["logprobs"] == TOP_LOGPROBS == 5
    assert got.tokens == ("a", "b") and got.top_logprobs == ({"a": -0.1, "c": -2.5}, {"b": -0.7, "a": -0.8})
