"""A stage after a cycle stops once its AL is decided (specwake.run.measure.measure.run_stage with a Stopping), against
an in-memory vLLM whose counters are the tiny pair's: every step accepts K = 3 when the drafter is whole, none after its
weights were discarded."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from specwake.run.measure.client import VllmClient
from specwake.run.measure.completions import Completer
from specwake.run.measure.cycle import run_cycle
from specwake.run.measure.measure import Stopping, Workload, drift, run_stage, stage_name
from tests.helpers.mock_vllm import MockVllm

WORKLOAD = Workload(
    "m",
    ("alpha one", "beta two", "gamma three", "delta four", "epsilon five", "zeta six"),
    max_tokens=128,  # 32 draft steps a request at AL 4, 128 at AL 1: the tiny-cpu scenario's requests
    repeats=5,
    warmup=1,
    temperature=0.0,
    ignore_eos=True,
    request_timeout_s=5,
    min_repeats=2,
)
STOPPING = Stopping(tolerance=0.05)


def stage(server: MockVllm, cycle: int = 0, fresh=None, workload: Workload = WORKLOAD, **kw):  # noqa: ANN001, ANN201
    http = server.client()
    return run_stage(
        VllmClient(http), Completer(http), workload, name=stage_name(cycle), cycle=cycle,
        fresh=fresh[0] if fresh else None, fresh_completions=fresh[1] if fresh else (), **kw,
    )  # fmt: skip


def cycled(server: MockVllm, stopping: Stopping | None = STOPPING, **kw):  # noqa: ANN201
    """The fresh stage, one L2 cycle, and the stage after it."""
    fresh = stage(server)
    run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    return fresh, stage(server, 1, fresh, stopping=stopping, **kw)


def scrapes(server: MockVllm) -> int:
    return server.calls.count("/metrics")


def test_a_collapsed_stage_stops_as_soon_as_both_lines_are_decided() -> None:
    server = MockVllm()  # reload_weights leaves the drafter discarded: AL 1
    fresh, (after, completions) = cycled(server)
    assert fresh[0].requests == 5 and fresh[0].stopped == "fixed: the fresh stage is the reference"
    assert after.requests == 3 and len(after.tok_s) == len(after.outputs) == len(completions) == 3
    assert after.stopped == (
        "decided after 3 requests: AL below the recover bound 3.80 and the collapse line 1.05 (α 0.01)"
    )
    assert after.acceptance_length == 1.0 and after.num_drafts == 3 * 128  # the counters of the 3 requests only
    assert after.outputs_match_fresh is True and after.outputs == fresh[0].outputs[:3]


def test_a_short_warmup_costs_only_its_tokens_and_still_places_the_first_bets() -> None:
    """A warmup of 16 tokens (the shipped default) instead of 128: the collapsed stage decides after the same 3
    requests, and the server generated 112 tokens fewer."""
    generated = []
    for warmup_tokens in (None, 16):  # None: the warmup asks for max_tokens
        server = MockVllm()
        fresh, (after, _) = cycled(server, workload=replace(WORKLOAD, warmup_tokens=warmup_tokens))
        assert after.requests == 3 and after.stopped.startswith("decided after 3 requests: AL below")
        generated.append(server.model.counters[0].generation)
    assert generated[0] - generated[1] == 128 - 16  # the cycled stage's warmup (both fresh stages asked for 128)


def test_a_recovered_stage_stops_early_and_is_compared_with_the_fresh_stages_first_requests() -> None:
    server = MockVllm(reload_restores_draft=True)
    fresh, (after, completions) = cycled(server)
    assert 2 <= after.requests < WORKLOAD.repeats
    assert after.stopped == (
        f"decided after {after.requests} requests: AL above the recover bound 3.80 and the collapse line 1.05 (α 0.01)"
    )
    assert after.acceptance_length == 4.0 and after.num_drafts == after.requests * 32
    assert after.outputs == fresh[0].outputs[: after.requests] and after.outputs_match_fresh is True
    assert after.first_difference is None and after.logprobs_compared == after.requests * 128
    assert after.outputs_close_to_fresh is True and after.near_ties == []
    assert drift(fresh[1], completions).parted == ()  # the fresh requests it did not repeat are not held against it


def test_each_request_costs_one_scrape_and_a_fixed_stage_none_more() -> None:
    server = MockVllm()
    fresh = stage(server)
    for cycle, stopping in ((1, Stopping(0.05, speed_binds=True)), (2, STOPPING)):
        run_cycle(VllmClient(server.client()), cycle, level=2, emulate_discard=True, step_timeout_s=5)
        server.calls.clear()
        after = stage(server, cycle, fresh, stopping=stopping)[0]
        if cycle == 1:  # start, after the warmup, after the measured requests: as before stages could stop early
            assert after.requests == 5 and scrapes(server) == 3
        else:  # start, after the warmup, after each measured request
            assert after.requests == 3 and scrapes(server) == 2 + 3


def test_stages_that_measure_every_request_say_why() -> None:
    binds = cycled(MockVllm(), Stopping(0.05, speed_binds=True))[1][0]
    assert binds.requests == 5 and binds.stopped == "fixed: the speed rule binds (a fixed-sample test)"
    off = cycled(MockVllm(), workload=replace(WORKLOAD, min_repeats=5))[1][0]
    assert off.requests == 5 and off.stopped == "fixed: min_repeats = repeats (early stopping off)"
    none = cycled(MockVllm(), None)[1][0]
    assert none.requests == 5 and none.stopped == "fixed: no stopping rule given"


def test_an_al_close_to_the_recover_bound_runs_to_the_cap() -> None:
    server = MockVllm()
    server.model.al_after = 3.85  # 33 steps a request, 29 accepting 3 tokens and 4 accepting 2: AL 3.88
    after = cycled(server)[1][0]
    assert after.requests == 5
    assert after.stopped == "cap: 5 requests (repeats); undecided: AL against the recover bound 3.80"
    assert after.acceptance_length == pytest.approx(1 + 95 / 33)


class NoSpeculation(MockVllm):
    """A server without speculative decoding: /metrics has no spec-decode counters."""

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.model.metrics_text(spec_metrics=False))
        return super().handler(request)


def test_a_stage_without_drafts_stops_at_min_repeats() -> None:
    fresh, (after, _) = cycled(NoSpeculation())
    assert fresh[0].acceptance_length is None and fresh[0].requests == 5
    assert after.requests == 2 and after.acceptance_length is None
    assert after.stopped == "no drafts: nothing for AL to decide (2 requests, min_repeats)"


def test_late_counters_are_waited_for_after_each_request() -> None:
    server = MockVllm()
    fresh = stage(server)
    run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    server.lag_metrics = 4  # the next four scrapes still show the counters of the scrape before
    naps: list[float] = []
    after = stage(server, 1, fresh, stopping=STOPPING, sleep=naps.append)[0]
    assert naps and set(naps) == {0.05}
    assert after.requests == 3 and after.acceptance_length == 1.0 and after.num_drafts == 3 * 128
