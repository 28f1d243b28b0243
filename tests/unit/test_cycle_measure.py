"""Cycle steps and stage measurement against an in-memory vLLM (httpx.MockTransport)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from specwake import protocol
from specwake.errors import RequestFailed, RequestTimeout
from specwake.run.measure.client import VllmClient
from specwake.run.measure.completions import Completer, Completion
from specwake.run.measure.cycle import cycle_steps, run_cycle
from specwake.run.measure.measure import Workload, drift, own_drift, run_stage, stage_name
from specwake.run.measure.metrics import OperationClock, operation_seconds
from specwake.weight_updates import SYNC_VIA, PushRequest, TransferChunk
from tests.helpers.mock_vllm import MockVllm
from tests.helpers.paths import DATA

WORKLOAD = Workload(
    "m",
    ("alpha", "beta"),
    max_tokens=8,
    repeats=3,
    warmup=1,
    temperature=0.0,
    ignore_eos=True,
    request_timeout_s=5,
)


def test_l2_sequence_order_and_statuses() -> None:
    server = MockVllm()
    steps, fault = run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    assert fault is None
    assert [s.name for s in steps] == [
        "sleep",
        "discard",
        "wake_weights",
        "reload_weights",
        "wake_kv_cache",
        "reset_prefix_cache",
    ]
    assert server.calls == [
        "/sleep?level=2",
        "specwake_emulate_discard",
        "/wake_up?tags=weights",
        "reload_weights",
        "/wake_up?tags=kv_cache",
        "/reset_prefix_cache",
    ]
    assert all(s.ok and s.status == 200 and s.cycle == 1 and s.seconds >= 0 for s in steps)
    assert steps[1].response == {"results": [{"filled_elements": 10}]}


def test_native_discard_and_level_1() -> None:
    assert "discard" not in [s.name for s in cycle_steps(2, emulate_discard=False)]
    assert [s.name for s in cycle_steps(1, emulate_discard=True)] == [
        "sleep",
        "wake_up",
        "reset_prefix_cache",
    ]


def test_failed_step_stops_the_cycle_and_keeps_the_reason() -> None:
    server = MockVllm(fail={"reload_weights": 500})
    steps, fault = run_cycle(VllmClient(server.client()), 2, level=2, emulate_discard=True, step_timeout_s=5)
    assert isinstance(fault, RequestFailed) and fault.crash_class == "step_failed"
    assert steps[-1].name == "reload_weights" and steps[-1].status == 500 and not steps[-1].ok
    assert "reload_weights failed on purpose" in (steps[-1].error or "")
    assert "/wake_up?tags=kv_cache" not in server.calls


def test_a_prefix_cache_reset_that_answers_success_false_is_a_failed_step() -> None:
    server = MockVllm(prefix_reset_fails=True)
    steps, fault = run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    assert isinstance(fault, RequestFailed) and fault.crash_class == "step_failed"
    last = steps[-1]
    assert last.name == "reset_prefix_cache" and last.status == 200 and not last.ok
    assert '"success": false' in (last.error or "") and last.response == {"success": False}


def test_step_timeout_is_its_own_fault() -> None:
    server = MockVllm(hang={"/wake_up"})
    steps, fault = run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=False, step_timeout_s=3)
    assert isinstance(fault, RequestTimeout) and fault.crash_class == "request_timeout"
    assert steps[-1].status is None and "within 3 s" in (steps[-1].error or "")


def stage(server: MockVllm, cycle: int = 0, fresh=None, **kw):  # noqa: ANN001, ANN201
    """Measure one stage on `server`; `fresh`: the (result, completions) of its fresh stage."""
    http = server.client()
    result, completions = run_stage(
        VllmClient(http), Completer(http), WORKLOAD, name=stage_name(cycle), cycle=cycle,
        fresh=fresh[0] if fresh else None, fresh_completions=fresh[1] if fresh else (), **kw,
    )  # fmt: skip
    return result, completions


def test_stage_measures_al_from_counter_deltas_excluding_warmup_and_probes() -> None:
    server = MockVllm(k=3)
    fresh = stage(server)
    result = fresh[0]
    # 8 tokens per request with K=3 all accepted: 2 drafts each, 6 accepted — warmup and probes not counted.
    assert result.num_drafts == 3 * 2 and result.num_accepted_tokens == 3 * 6 and result.num_draft_tokens == 18
    assert result.acceptance_length == pytest.approx(1 + 18 / 6)
    assert result.per_position == [1.0, 1.0, 1.0]
    assert len(result.outputs) == 3 and result.outputs[0] == result.outputs[2] != result.outputs[1]
    assert result.outputs_match_fresh is None and len(result.tok_s) == 3 and result.tok_s_median is not None
    assert len(result.ttft) == len(result.tpot) == 3 and all(t is not None for t in result.tpot)

    run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    after = stage(server, 1, fresh)[0]
    assert after.name == "after L2 #1"
    assert after.acceptance_length == pytest.approx(1.0) and after.num_accepted_tokens == 0
    assert after.per_position == [0.0, 0.0, 0.0]
    assert after.outputs_match_fresh is True  # reload_weights restored the target
    assert after.first_difference is None and after.max_logprob_drift == 0.0 and after.logprobs_over_tolerance == 0
    assert after.logprobs_compared == 3 * 8


def test_patched_reload_recovers() -> None:
    server = MockVllm(reload_restores_draft=True)
    fresh = stage(server)
    run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    assert stage(server, 1, fresh)[0].acceptance_length == fresh[0].acceptance_length


def test_a_target_left_discarded_shows_where_tokens_diverge() -> None:
    server = MockVllm()
    fresh = stage(server)
    server.model.discard()  # and no reload: the target answers garbage
    after = stage(server, 1, fresh)[0]
    assert after.outputs_match_fresh is False and after.first_difference == [0, 0]
    assert after.logprobs_compared == 0  # nothing shared to compare logprobs on


def test_logprob_drift_with_identical_text_is_measured() -> None:
    fresh = [Completion("ab", 2, 1.0, 0.1, ("a", "b"), (-0.5, -0.25))]
    same_text = [Completion("ab", 2, 1.0, 0.1, ("a", "b"), (-0.5, -0.2))]
    d = drift(fresh, same_text)
    assert d.first_difference is None and d.max_logprob_drift == pytest.approx(0.05) and d.over_tolerance == 1
    shorter = [Completion("a", 1, 1.0, 0.1, ("a",), (-0.5,))]
    assert drift(fresh, shorter).first_difference == (0, 1)


def test_the_fresh_stage_measures_how_far_its_own_requests_of_one_prompt_drift() -> None:
    server = MockVllm()
    fresh = stage(server)
    assert fresh[0].own_logprob_drift == 0.0  # the warmup's "alpha" and the measured ones agree: nothing changed
    run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    assert stage(server, 1, fresh)[0].own_logprob_drift is None  # only the fresh stage sets the bound
    a = Completion("ab", 2, 1.0, 0.1, ("a", "b"), (-0.5, -0.25))
    moved = Completion("abc", 3, 1.0, 0.1, ("a", "b", "c"), (-0.5, -0.26, -1.0))
    other = Completion("xy", 2, 1.0, 0.1, ("x", "y"), (-3.0, -3.0))
    assert own_drift(WORKLOAD, [a], [moved, other, a]) == pytest.approx(0.01)  # warmup vs request 0, and 2
    assert own_drift(replace(WORKLOAD, warmup=0, repeats=2), [], [a, other]) is None  # no prompt sent twice


def test_prefix_probe_sees_an_empty_cache_after_a_wake_and_a_stale_one_when_hashes_survive() -> None:
    healthy, stale = MockVllm(), MockVllm(stale_prefix_cache=True)
    for server in (healthy, stale):
        fresh = stage(server)[0]
        assert fresh.prefix_cached == 0 and (fresh.prefix_cached_repeat or 0) > 0  # the cache works at all
        run_cycle(VllmClient(server.client()), 1, level=2, emulate_discard=True, step_timeout_s=5)
    assert stage(healthy, 1)[0].prefix_cached == 0
    assert (stage(stale, 1)[0].prefix_cached or 0) > 0  # served from a cache the wake should have emptied


def test_ttft_and_tpot_of_a_completion() -> None:
    c = Completion("abc", 5, seconds=1.0, ttft=0.2)
    assert c.tpot == pytest.approx(0.2) and c.tok_s == 5.0
    assert Completion("a", 1, 1.0, 0.2).tpot is None and Completion("a", 3, 1.0).tpot is None


def test_stage_waits_for_late_counters() -> None:
    server = MockVllm()
    VllmClient(server.client()).metrics_text()  # prime the stale copy
    server.lag_metrics = 2  # the first two scrapes after the requests still show old counters
    naps: list[float] = []
    result = stage(server, sleep=naps.append)[0]
    assert result.num_drafts == 6 and naps  # it waited instead of reporting zero drafts


def test_request_failure_propagates() -> None:
    server = MockVllm(fail={"/v1/completions": 503})
    with pytest.raises(RequestFailed, match="HTTP 503"):
        stage(server)


def test_a_push_replaces_reload_weights_at_either_level() -> None:
    push = PushRequest(("target", "draft"), {"model.x.weight": 2.0})
    request = push.to_json()
    assert json.loads(request) == {"to": ["target", "draft"], "scale": {"model.x.weight": 2.0}}
    l2 = cycle_steps(2, emulate_discard=True, push=push)
    pushes = ["push", "push"]  # one call per model: the drafter's, then the target's
    assert [s.name for s in l2] == ["sleep", "discard", "wake_weights", *pushes, "wake_kv_cache", "reset_prefix_cache"]
    assert [s.rpc for s in l2[3:5]] == ["specwake_push"] * 2
    assert [s.rpc_kwargs for s in l2[3:5]] == [
        (("request", replace(push, to=(role,)).to_json()),) for role in ("draft", "target")
    ]
    # both models fingerprinted before the first update and after each; the last one's point is the restore point
    assert [(s.point, s.addresses) for s in l2[2:5]] == [
        (protocol.BEFORE_UPDATE, None), (protocol.UPDATE_POINT, "draft"), ("after push", "target"),
    ]  # fmt: skip
    l1 = cycle_steps(1, emulate_discard=True, push=push)  # L1 keeps its weights: nothing to discard
    assert [s.name for s in l1] == ["sleep", "wake_weights", *pushes, "wake_kv_cache", "reset_prefix_cache"]
    assert l1[0].params == (("level", "1"),)


SYNC = PushRequest(("target", "draft"), via=SYNC_VIA)
CHUNKS = {
    "target": [
        TransferChunk("target", "/m/t.safetensors", ("a", "b")),
        TransferChunk("target", "/m/t.safetensors", ("c",)),
    ],
    "draft": [TransferChunk("draft", "/m/d.safetensors", ("x",))],
}


def test_a_sync_runs_one_session_per_model_and_initializes_the_engine_once() -> None:
    first = cycle_steps(2, emulate_discard=True, push=SYNC, cycle=1, chunks=CHUNKS)
    sessions = ["start_weight_update", "update_weights", "update_weights", "finish_weight_update"]
    sessions += ["start_draft_weight_update", "update_weights", "finish_weight_update"]
    head = ["sleep", "discard", "wake_weights"]
    assert [s.name for s in first] == [
        *head,
        "init_weight_transfer_engine",
        *sessions,
        "wake_kv_cache",
        "reset_prefix_cache",
    ]
    second = cycle_steps(2, emulate_discard=True, push=SYNC, cycle=2, chunks=CHUNKS)
    assert [s.name for s in second] == [*head, *sessions, "wake_kv_cache", "reset_prefix_cache"]
    updates = [s.body for s in second if s.name == "update_weights"]
    assert updates[0] == {"update_info": {"file": "/m/t.safetensors", "names": ["a", "b"]}}
    # the weights are judged once, after the last session: a drafter session that wrote into the target is caught
    assert [s.point for s in second if s.point == protocol.SYNC_POINT] == [protocol.SYNC_POINT]
    assert second[-3].point == protocol.SYNC_POINT and second[-3].name == "finish_weight_update"
    target_only = cycle_steps(2, emulate_discard=True, push=replace(SYNC, to=("target",)), cycle=2, chunks=CHUNKS)
    assert "start_draft_weight_update" not in [s.name for s in target_only]
    assert target_only[-3].point == protocol.SYNC_POINT


def test_a_target_only_sync_collapses_and_a_full_one_recovers_on_the_mock() -> None:
    for to, al in ((("target",), 1.0), (("target", "draft"), 4.0)):
        server = MockVllm(checker=True)
        client = VllmClient(server.client())
        points: list[str] = []
        steps, fault = run_cycle(
            client, 1, level=2, emulate_discard=True, step_timeout_s=5, push=replace(SYNC, to=to), chunks=CHUNKS,
            on_step=lambda result, point, update, seen=points: seen.append(point),
        )  # fmt: skip
        assert fault is None and all(s.ok for s in steps)
        assert [role for role, _ in server.updates] == ["target", "target", "draft"][: 2 + len(to) - 1]
        assert protocol.SYNC_POINT in points
        assert stage(server)[0].acceptance_length == al


def test_vllms_own_seconds_come_from_its_operation_histograms() -> None:
    text = (DATA / "metrics-weight-transfer.txt").read_text()
    sums = operation_seconds(text, frozenset({protocol.SLEEP_METRIC, protocol.TRANSFER_METRIC}))
    assert sums[(protocol.TRANSFER_METRIC, "update")] > 0 and (protocol.SLEEP_METRIC, "sleep") in sums
    scrapes = iter([text, text])
    clock = OperationClock(lambda: next(scrapes), frozenset({protocol.TRANSFER_METRIC}))
    clock.start()
    assert clock.seconds((protocol.TRANSFER_METRIC, "update")) == 0.0  # nothing happened between the two scrapes
    assert clock.seconds(None) is None
    assert operation_seconds("not prometheus {", frozenset({protocol.SLEEP_METRIC})) == {}


def test_vllms_own_seconds_are_the_sums_of_its_histograms_alone() -> None:
    """Only the named histograms are parsed (metrics.family_lines): their `_sum` samples, summed per operation, and
    a line the parser could not read elsewhere in the text changes nothing."""
    text = (DATA / "metrics-weight-transfer.txt").read_text()
    name = re.escape(protocol.TRANSFER_METRIC)
    pattern = re.compile(rf'^{name}_sum\{{[^}}]*operation="update"[^}}]*\}} (\S+)$', re.M)
    grepped = sum(float(value) for value in pattern.findall(text))
    noisy = text + "vllm:another_family{oops 1\n"
    sums = operation_seconds(noisy, frozenset({protocol.TRANSFER_METRIC}))
    assert grepped > 0 and sums[(protocol.TRANSFER_METRIC, "update")] == pytest.approx(grepped)
    assert all(metric == protocol.TRANSFER_METRIC for metric, _ in sums)
