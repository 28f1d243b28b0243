"""Cycle steps and stage measurement against an in-memory vLLM (httpx.MockTransport)."""

from __future__ import annotations

import pytest

from specwake.client import VllmClient
from specwake.cycle import cycle_steps, run_cycle
from specwake.errors import RequestFailed, RequestTimeout
from specwake.measure import Workload, run_stage, stage_name

from .mock_vllm import MockVllm

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
    assert steps[1].response == {"results": [{"zeroed": 10}]}


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


def test_stage_measures_al_from_counter_deltas_excluding_warmup() -> None:
    server = MockVllm(k=3)
    client = VllmClient(server.client())
    fresh = run_stage(client, WORKLOAD, name="fresh", cycle=0)
    # 8 tokens per request with K=3 all accepted: 2 drafts each, 6 accepted — warmup not counted.
    assert fresh.num_drafts == 3 * 2 and fresh.num_accepted_tokens == 3 * 6 and fresh.num_draft_tokens == 18
    assert fresh.acceptance_length == pytest.approx(1 + 18 / 6)
    assert fresh.per_position == [1.0, 1.0, 1.0]
    assert fresh.outputs == ["echo:alp", "echo:bet", "echo:alp"]
    assert fresh.outputs_match_fresh is None and len(fresh.tok_s) == 3 and fresh.tok_s_median is not None

    run_cycle(client, 1, level=2, emulate_discard=True, step_timeout_s=5)
    after = run_stage(client, WORKLOAD, name=stage_name(1), cycle=1, fresh=fresh)
    assert after.name == "after L2 #1"
    assert after.acceptance_length == pytest.approx(1.0) and after.num_accepted_tokens == 0
    assert after.per_position == [0.0, 0.0, 0.0]
    assert after.outputs_match_fresh is True


def test_patched_reload_recovers() -> None:
    server = MockVllm(reload_restores_draft=True)
    client = VllmClient(server.client())
    fresh = run_stage(client, WORKLOAD, name="fresh", cycle=0)
    run_cycle(client, 1, level=2, emulate_discard=True, step_timeout_s=5)
    after = run_stage(client, WORKLOAD, name="after L2 #1", cycle=1, fresh=fresh)
    assert after.acceptance_length == fresh.acceptance_length


def test_stage_waits_for_late_counters() -> None:
    server = MockVllm()
    client = VllmClient(server.client())
    server.lag_metrics = 0
    client.metrics_text()  # prime the stale copy
    server.lag_metrics = 2  # the first two scrapes after the requests still show old counters
    naps: list[float] = []
    stage = run_stage(client, WORKLOAD, name="fresh", cycle=0, sleep=naps.append)
    assert stage.num_drafts == 6 and naps  # it waited instead of reporting zero drafts


def test_request_failure_propagates() -> None:
    server = MockVllm(fail={"/v1/completions": 503})
    with pytest.raises(RequestFailed, match="HTTP 503"):
        run_stage(VllmClient(server.client()), WORKLOAD, name="fresh", cycle=0)
