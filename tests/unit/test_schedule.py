"""Tests of specwake.run.session.schedule: GPU-list parsing, the pure packing plan and its invariants, and
run_packed executing real fake servers (tests/helpers/fake_server.py) concurrently on disjoint GPU sets."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence

import pytest

from benchmarks.bench_schedule import lower_bound, makespan, utilisation
from specwake.errors import Interrupted
from specwake.run.session.schedule import (
    Assignment,
    Job,
    choose_gpus,
    contiguous_runs,
    parse_gpu_list,
    plan_schedule,
    priority,
    run_packed,
    side_by_side,
)

EPS = 1e-9

# --------------------------------------------------------------------------------------------
# parse_gpu_list


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-7", (0, 1, 2, 3, 4, 5, 6, 7)),
        ("0,1,4,5", (0, 1, 4, 5)),
        ("0-3,6", (0, 1, 2, 3, 6)),
        ("3", (3,)),
        ("5-5", (5,)),
        (" 6 , 0 - 1 ", (6, 0, 1)),
    ],
)
def test_parse_gpu_list_accepts(text: str, expected: tuple[int, ...]) -> None:
    assert parse_gpu_list(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty GPU list"),
        ("   ", "empty GPU list"),
        ("0,,1", "empty item in '0,,1'"),
        ("0,", "empty item"),
        ("-1", "negative GPU id in '-1'"),
        ("0,-2-3", "negative GPU id in '-2-3'"),
        ("5-3", "reversed range '5-3'"),
        ("1,0-2", "GPU 1 listed twice"),
        ("2,2", "GPU 2 listed twice"),
        ("gpu0", "not a GPU id or range: 'gpu0'"),
        ("0-3,x", "'x'"),
        ("1.5", "'1.5'"),
        ("0-", "'0-'"),
        ("0-99999", "above"),
    ],
)
def test_parse_gpu_list_rejects_naming_the_bad_part(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_gpu_list(text)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(("needed", "est"), [(0, 1.0), (-1, 1.0), (1, -1.0), (1, float("nan")), (1, float("inf"))])
def test_job_rejects_impossible_values(needed: int, est: float) -> None:
    with pytest.raises(ValueError, match="x/baseline"):
        Job("x/baseline", needed, est)


# --------------------------------------------------------------------------------------------
# choose_gpus


def test_contiguous_runs() -> None:
    assert contiguous_runs({6, 0, 1, 2, 5}) == [[0, 1, 2], [5, 6]]
    assert contiguous_runs([]) == []


@pytest.mark.parametrize(
    ("free", "count", "expected"),
    [
        ({0, 1, 2, 3}, 2, (0, 1)),
        ({1, 2, 3, 4, 5, 6, 7}, 2, (2, 3)),  # aligned NVLink pair, not (1, 2)
        ({1, 2, 3, 4, 5, 6, 7}, 4, (4, 5, 6, 7)),
        ({0, 2, 3, 5}, 2, (2, 3)),  # the only contiguous pair
        ({1, 2, 5, 6, 7}, 2, (6, 7)),  # aligned wins over the tighter run
        ({1, 2, 4, 5, 6}, 3, (4, 5, 6)),  # no aligned triple: shortest run holding one
        ({0, 2, 5, 7}, 2, (0, 2)),  # nothing contiguous: lowest ids
        ({0, 1}, 3, None),
    ],
)
def test_choose_gpus_prefers_aligned_contiguous_blocks(
    free: set[int], count: int, expected: tuple[int, ...] | None
) -> None:
    assert choose_gpus(free, count) == expected


# --------------------------------------------------------------------------------------------
# plan_schedule invariants


def overlaps(a: Assignment, b: Assignment) -> bool:
    return a.start < b.end - EPS and b.start < a.end - EPS


def free_after_launches(plan: Sequence[Assignment], t: float, n_gpus: int) -> int:
    """GPUs idle at instant t once everything planned to start at t has started."""
    busy = sum(len(a.gpus) for a in plan if a.start <= t + EPS and a.end > t + EPS)
    return n_gpus - busy


def check_plan(jobs: Sequence[Job], gpus: Sequence[int], plan: Sequence[Assignment]) -> None:
    """Every invariant a packing plan must satisfy, whatever the job mix."""
    assert sorted(a.job.key for a in plan) == sorted(j.key for j in jobs)  # each job exactly once
    for a in plan:
        assert len(a.gpus) == a.job.gpus_needed
        assert len(set(a.gpus)) == len(a.gpus)
        assert set(a.gpus) <= set(gpus)
        assert a.start >= 0
        assert a.end - a.start == pytest.approx(a.job.est_seconds)
    for i, a in enumerate(plan):
        for b in plan[i + 1 :]:
            if overlaps(a, b):
                assert not set(a.gpus) & set(b.gpus), f"{a} and {b} share a GPU while both run"
    assert makespan(plan) >= lower_bound(jobs, len(gpus)) - EPS
    # Work-conserving: a job never waits at an instant when enough GPUs stood idle for it.
    events = sorted({a.start for a in plan} | {a.end for a in plan})
    for a in plan:
        for t in events:
            if t < a.start - EPS:
                assert free_after_launches(plan, t, len(gpus)) < a.job.gpus_needed, (a, t)
    # Priority: a lower-ranked job only starts earlier when the higher-ranked one could not fit.
    by_key = {a.job.key: a for a in plan}
    for a in plan:
        for b in plan:
            if priority(a.job) < priority(b.job) and b.start < a.start - EPS:
                assert free_after_launches(plan, b.start, len(gpus)) + len(b.gpus) < a.job.gpus_needed
    assert len(by_key) == len(plan)


def test_plan_largest_first_then_fill() -> None:
    jobs = [Job("one-a", 1), Job("one-b", 1), Job("two", 2), Job("four", 4)]
    plan = plan_schedule(jobs, [0, 1, 2, 3])
    check_plan(jobs, [0, 1, 2, 3], plan)
    start = {a.job.key: a.start for a in plan}
    assert start == {"four": 0.0, "two": 1.0, "one-a": 1.0, "one-b": 1.0}
    assert plan[0].job.key == "four" and plan[0].gpus == (0, 1, 2, 3)
    assert makespan(plan) == 2.0


def test_plan_same_tp_longest_estimate_first_and_aligned_pairs() -> None:
    jobs = [Job(f"s{i}/baseline", 2, est) for i, est in enumerate([300.0, 900.0, 600.0, 450.0])]
    plan = plan_schedule(jobs, range(8))
    check_plan(jobs, range(8), plan)
    assert [a.job.key for a in plan] == ["s1/baseline", "s2/baseline", "s3/baseline", "s0/baseline"]
    assert sorted(a.gpus for a in plan) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(a.start == 0.0 for a in plan)


def test_plan_backfills_small_jobs_while_a_large_one_waits() -> None:
    jobs = [Job("big", 4, 5.0), Job("wide", 3, 10.0), Job("small", 1, 2.0)]
    plan = plan_schedule(jobs, range(4))
    check_plan(jobs, range(4), plan)
    by_key = {a.job.key: a for a in plan}
    assert by_key["big"].start == 0.0
    assert by_key["wide"].start == 5.0
    assert by_key["small"].start == 5.0  # fits beside "wide" instead of queueing after it


def test_plan_rejects_a_job_larger_than_the_gpu_set() -> None:
    with pytest.raises(ValueError) as info:
        plan_schedule([Job("eagle3/patched", 2), Job("eagle3/baseline", 4)], [0, 1])
    assert str(info.value) == "eagle3/baseline needs 4 GPUs, only 2 available (0,1)"


@pytest.mark.parametrize(
    ("jobs", "gpus", "fragment"),
    [
        ([Job("a", 1), Job("a", 2)], [0, 1], "'a' listed twice"),
        ([Job("a", 1)], [0, 0], "GPU 0 listed twice"),
        ([Job("a", 1)], [-1], "GPU -1 is negative"),
    ],
)
def test_plan_rejects_bad_input(jobs: list[Job], gpus: list[int], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        plan_schedule(jobs, gpus)


def test_plan_cpu_mode_is_sequential_with_no_gpus() -> None:
    jobs = [Job("a", 1, 3.0), Job("b", 2, 5.0), Job("c", 8, 1.0)]
    plan = plan_schedule(jobs, ())
    assert [a.job.key for a in plan] == ["c", "b", "a"]
    assert all(a.gpus == () for a in plan)
    for prev, nxt in zip(plan, plan[1:], strict=False):
        assert nxt.start == pytest.approx(prev.end)
    assert makespan(plan) == pytest.approx(9.0) == pytest.approx(lower_bound(jobs, 0))


def test_plan_handles_zero_length_jobs() -> None:
    jobs = [Job("empty-a", 2, 0.0), Job("empty-b", 2, 0.0), Job("real", 2, 5.0), Job("small", 1, 0.0)]
    plan = plan_schedule(jobs, [0, 1])
    assert sorted(a.job.key for a in plan) == sorted(j.key for j in jobs)
    assert makespan(plan) == 5.0
    for a in plan:
        for b in plan:
            if a is not b and overlaps(a, b):
                assert not set(a.gpus) & set(b.gpus)


def test_makespan_lower_bound_and_utilisation_arithmetic() -> None:
    jobs = [Job("a", 2, 10.0), Job("b", 1, 4.0)]
    assert lower_bound(jobs, 4) == 10.0  # longest job dominates 24/4
    assert lower_bound([Job("a", 4, 10.0), Job("b", 4, 10.0)], 4) == 20.0  # GPU-seconds dominate
    assert lower_bound([], 4) == 0.0
    plan = [Assignment(jobs[0], (0, 1), 0.0, 10.0), Assignment(jobs[1], (2,), 0.0, 4.0)]
    assert makespan(plan) == 10.0
    assert utilisation(plan, 4) == pytest.approx(24 / 40)
    assert makespan([]) == 0.0 and utilisation([], 4) == 0.0


def random_case(rng: random.Random) -> tuple[list[Job], list[int]]:
    n_gpus = rng.randint(1, 8)
    gpus = sorted(rng.sample(range(12), n_gpus))  # sometimes non-contiguous ids
    sizes = [s for s in (1, 2, 3, 4, 8) if s <= n_gpus]
    jobs = [
        Job(f"s{i}/{rng.choice(['baseline', 'patched'])}", rng.choice(sizes), rng.choice([0.5, 1.0, 2.5, 300.0, 900.0]))
        for i in range(rng.randint(1, 18))
    ]
    return jobs, gpus


def test_plan_invariants_hold_on_random_job_sets() -> None:
    rng = random.Random(20240607)
    for _ in range(300):
        jobs, gpus = random_case(rng)
        plan = plan_schedule(jobs, gpus)
        check_plan(jobs, gpus, plan)
        shuffled = jobs[:]
        rng.shuffle(shuffled)
        assert plan_schedule(shuffled, gpus) == plan  # input order does not matter


# --------------------------------------------------------------------------------------------
# run_packed with plain callables (fast)


def test_run_packed_cpu_mode_runs_one_at_a_time_and_records_failures() -> None:
    lock = threading.Lock()
    running, peak, seen = [0], [0], []

    def run(job: Job, gpus: tuple[int, ...]) -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            seen.append((job.key, gpus))
        time.sleep(0.02)  # long enough that an executor running jobs together would overlap them
        with lock:
            running[0] -= 1
        if job.key == "bad":
            raise RuntimeError("server crashed\nsecond line")
        return job.key.upper()

    events: list[tuple[str, str]] = []
    jobs = [Job("a", 1), Job("bad", 2), Job("c", 4)]
    results = run_packed(jobs, (), run, on_event=lambda m: events.append((threading.current_thread().name, m)))
    assert peak[0] == 1
    assert [key for key, _ in seen] == ["c", "bad", "a"]
    assert all(gpus == () for _, gpus in seen)
    assert list(results) == ["a", "bad", "c"]
    assert results["a"] == "A" and results["c"] == "C"
    assert isinstance(results["bad"], RuntimeError)
    assert {name for name, _ in events} == {threading.current_thread().name}  # events only from the caller
    assert any(m.startswith("failed bad after") and m.endswith("RuntimeError: server crashed") for _, m in events)
    assert any(m == "start c on no GPUs" for _, m in events)


def test_run_packed_rejects_too_large_before_running_anything() -> None:
    calls: list[str] = []
    with pytest.raises(ValueError, match="big needs 8 GPUs, only 4 available"):
        run_packed([Job("ok", 1), Job("big", 8)], [0, 1, 2, 3], lambda job, gpus: calls.append(job.key))
    assert calls == []


def test_run_packed_external_cancel_skips_unstarted_jobs() -> None:
    cancel = threading.Event()

    def run(job: Job, gpus: tuple[int, ...]) -> str:
        cancel.set()  # e.g. a SIGTERM handler fired while the first job ran
        return "finished"

    results = run_packed([Job("first", 2), Job("second", 1), Job("third", 1)], (), run, cancel=cancel)
    assert results["first"] == "finished"
    for key in ("second", "third"):
        assert isinstance(results[key], Interrupted)
        assert "not started" in str(results[key])


def test_run_packed_waits_for_running_jobs_when_the_caller_side_fails() -> None:
    cancel = threading.Event()
    finished: list[str] = []

    def run(job: Job, gpus: tuple[int, ...]) -> None:
        assert cancel.wait(timeout=30), "run_packed never set cancel"
        finished.append(job.key)

    def on_event(message: str) -> None:
        if message.startswith("start b"):
            raise OSError("event sink broke")

    jobs = [Job("a", 1), Job("b", 1), Job("c", 1)]  # a and b start together on [0, 1], c waits
    with pytest.raises(OSError, match="event sink broke"):
        run_packed(jobs, [0, 1], run, on_event=on_event, cancel=cancel)
    assert cancel.is_set()
    assert sorted(finished) == ["a", "b"]  # both started jobs had returned before the error surfaced


# --------------------------------------------------------------------------------------------
# run_packed with real (fake) servers


# --------------------------------------------------------------------------------------------
# side_by_side: whether the run's mode may say its servers ran at once


def overlap(plan: Sequence[Assignment]) -> bool:
    return any(a.start < b.end and b.start < a.end for i, a in enumerate(plan) for b in plan[i + 1 :])


def test_side_by_side_is_what_the_policy_does_whatever_the_durations() -> None:
    rng = random.Random(7)
    for _ in range(400):
        devices = list(range(rng.randint(1, 8)))
        jobs = [Job(f"j{i}", rng.randint(1, len(devices)), rng.uniform(0.1, 5)) for i in range(rng.randint(1, 6))]
        assert side_by_side(jobs, devices) == overlap(plan_schedule(jobs, devices)), (jobs, devices)


def test_servers_needing_every_core_or_a_single_server_never_run_side_by_side() -> None:
    assert not side_by_side([Job("s/baseline", 2), Job("s/patched", 2)], [0, 1])  # --tp 2 on 2 cores
    assert not side_by_side([Job("s/baseline", 1)], [0, 1, 2, 3])
    assert not side_by_side([Job("a", 3), Job("b", 2)], [0, 1, 2, 3])
    assert side_by_side([Job("a", 3), Job("b", 1), Job("c", 1)], [0, 1, 2])  # b and c after a, together
    assert side_by_side([Job("s/baseline", 1), Job("s/patched", 1)], [0, 1])
