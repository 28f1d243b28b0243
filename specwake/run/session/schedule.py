"""GPU packing for many scenario x variant servers: a pure list scheduler onto disjoint GPU sets,
and a thread executor (`run_packed`) that runs the jobs for real, starting each as soon as it fits."""

from __future__ import annotations

import heapq
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from specwake.errors import Interrupted

R = TypeVar("R")

MAX_GPU_ID = 1023
_ITEM = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?", re.ASCII)
_NEGATIVE = re.compile(r"-\s*[0-9]", re.ASCII)
_JOIN_POLL_S = 0.2


# ---------------------------------------------------------------------------------------------
# Input


def parse_gpu_list(text: str) -> tuple[int, ...]:
    """``"0-7"``, ``"0,1,4,5"``, ``"0-3,6"`` → GPU ids in the order given.

    Raises ValueError with a one-line reason naming the bad part (empty list or item, junk,
    negative id, reversed range, id above MAX_GPU_ID, an id listed twice).
    """
    if not text.strip():
        raise ValueError("empty GPU list (expected e.g. 0-7 or 0,1,4,5)")
    ids: list[int] = []
    for part in text.split(","):
        for gpu in _parse_item(part.strip(), text):
            if gpu in ids:
                raise ValueError(f"GPU {gpu} listed twice in {text.strip()!r}")
            ids.append(gpu)
    return tuple(ids)


def _parse_item(item: str, text: str) -> range:
    if not item:
        raise ValueError(f"empty item in {text.strip()!r}")
    match = _ITEM.fullmatch(item)
    if match is None:
        if _NEGATIVE.match(item):
            raise ValueError(f"negative GPU id in {item!r}")
        raise ValueError(f"not a GPU id or range: {item!r}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if low > high:
        raise ValueError(f"reversed range {item!r} (write {high}-{low})")
    if high > MAX_GPU_ID:
        raise ValueError(f"GPU id {high} in {item!r} is above {MAX_GPU_ID}")
    return range(low, high + 1)


@dataclass(frozen=True)
class Job:
    """One server to run: ``key`` names it (unique), ``gpus_needed`` is its tensor parallel size."""

    key: str
    gpus_needed: int
    est_seconds: float = 1.0

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("job key must not be empty")
        if isinstance(self.gpus_needed, bool) or not isinstance(self.gpus_needed, int) or self.gpus_needed < 1:
            raise ValueError(f"{self.key}: gpus_needed must be an integer >= 1, got {self.gpus_needed!r}")
        if not math.isfinite(self.est_seconds) or self.est_seconds < 0:
            raise ValueError(f"{self.key}: est_seconds must be finite and >= 0, got {self.est_seconds!r}")


@dataclass(frozen=True)
class Assignment:
    """A planned run of ``job`` on ``gpus`` from ``start`` to ``end`` (simulated seconds)."""

    job: Job
    gpus: tuple[int, ...]
    start: float
    end: float


def validate(jobs: Sequence[Job], gpus: Sequence[int]) -> None:
    """Reject duplicate job keys, bad or duplicate GPU ids, and jobs larger than the GPU set."""
    keys: set[str] = set()
    for job in jobs:
        if job.key in keys:
            raise ValueError(f"job {job.key!r} listed twice")
        keys.add(job.key)
    seen: set[int] = set()
    for gpu in gpus:
        if gpu < 0 or gpu in seen:
            raise ValueError(f"GPU {gpu} {'is negative' if gpu < 0 else 'listed twice'}")
        seen.add(gpu)
    if not gpus:
        return  # CPU mode: no GPU constraint
    for job in jobs:
        if job.gpus_needed > len(gpus):
            listed = ",".join(str(g) for g in gpus)
            raise ValueError(f"{job.key} needs {job.gpus_needed} GPUs, only {len(gpus)} available ({listed})")


# ---------------------------------------------------------------------------------------------
# Policy (pure), shared by plan_schedule and run_packed
#
# Jobs are ranked by GPUs needed (largest first), then estimated seconds (longest first), then key.
# Whenever GPUs are free, the ranked pending jobs are walked in order and every one that fits starts
# (a smaller job may use GPUs a larger one cannot use yet). A job gets an aligned contiguous block
# when one is free (NVLink pairs/quads are aligned), else the best-fitting contiguous block, else
# the lowest free ids. With no GPUs at all (CPU mode) jobs run one at a time and each gets ().


def priority(job: Job) -> tuple[int, float, str]:
    """Sort key: most GPUs first, then longest estimate, then key."""
    return (-job.gpus_needed, -job.est_seconds, job.key)


def contiguous_runs(ids: Iterable[int]) -> list[list[int]]:
    """Maximal runs of consecutive ids, ascending: {0,1,2,5,6} → [[0,1,2],[5,6]]."""
    runs: list[list[int]] = []
    for gpu in sorted(ids):
        if runs and gpu == runs[-1][-1] + 1:
            runs[-1].append(gpu)
        else:
            runs.append([gpu])
    return runs


def choose_gpus(free: Iterable[int], count: int) -> tuple[int, ...] | None:
    """``count`` GPUs out of ``free`` (None if too few): prefer an aligned contiguous block
    (first id a multiple of ``count``), then a block in the shortest run that holds one, then the
    lowest id; with no contiguous block, the lowest ``count`` free ids."""
    free_ids = sorted(set(free))
    if count < 1 or len(free_ids) < count:
        return None
    best: tuple[bool, int, int] | None = None
    for run in contiguous_runs(free_ids):
        for offset in range(len(run) - count + 1):
            first = run[offset]
            rank = (first % count != 0, len(run), first)
            if best is None or rank < best:
                best = rank
    if best is None:
        return tuple(free_ids[:count])
    return tuple(range(best[2], best[2] + count))


def next_launches(
    pending: Sequence[Job], free: Iterable[int], running: int, cpu_mode: bool
) -> list[tuple[Job, tuple[int, ...]]]:
    """Which of the ranked ``pending`` jobs start now, and on which GPUs (greedy, in order).

    CPU mode: the first pending job, alone, once nothing is running.
    """
    if cpu_mode:
        return [(pending[0], ())] if pending and running == 0 else []
    left = set(free)
    launches: list[tuple[Job, tuple[int, ...]]] = []
    for job in pending:
        if not left:
            break
        got = choose_gpus(left, job.gpus_needed)
        if got is not None:
            launches.append((job, got))
            left.difference_update(got)
    return launches


def side_by_side(jobs: Sequence[Job], devices: Sequence[int]) -> bool:
    """Whether the policy ever runs two of `jobs` at once on `devices`: exactly when the two smallest fit together.
    (If they do, the first of them to start either joins a running job or leaves room for the other, which is
    pending then; if they do not, no two jobs fit.) With no devices (CPU mode of the scheduler) jobs run one at a
    time."""
    needs = sorted(job.gpus_needed for job in jobs)
    return bool(devices) and len(needs) > 1 and needs[0] + needs[1] <= len(devices)


def plan_schedule(jobs: Sequence[Job], gpus: Sequence[int]) -> list[Assignment]:
    """Simulate the packing policy with each job lasting its ``est_seconds``; assignments in start order."""
    validate(jobs, gpus)
    pending = sorted(jobs, key=priority)
    free = set(gpus)
    running: list[tuple[float, int, tuple[int, ...]]] = []  # heap of (end, seq, gpus)
    plan: list[Assignment] = []
    now = 0.0
    while pending:
        launches = next_launches(pending, free, len(running), not gpus)
        for job, got in launches:
            free.difference_update(got)
            heapq.heappush(running, (now + job.est_seconds, len(plan), got))
            plan.append(Assignment(job, got, now, now + job.est_seconds))
        started = {job.key for job, _ in launches}
        pending = [job for job in pending if job.key not in started]
        if not pending:
            break
        if not running:  # unreachable after validate(); never loop forever
            raise RuntimeError(f"cannot place {pending[0].key} on GPUs {sorted(free)}")
        now = running[0][0]
        while running and running[0][0] <= now:
            free.update(heapq.heappop(running)[2])
    return plan


# ---------------------------------------------------------------------------------------------
# Executor (threads)


def run_packed(
    jobs: Sequence[Job],
    gpus: Sequence[int],
    run: Callable[[Job, tuple[int, ...]], R],
    *,
    on_event: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    unit: str = "GPUs",
) -> dict[str, R | BaseException]:
    """Run every job for real, each in its own thread, ``run(job, gpus)`` as soon as it fits.

    Returns ``{job.key: run's return value or the exception it raised}`` in the order of ``jobs``;
    one job's exception never stops the others. ``on_event`` gets one-line progress messages and is
    only ever called from the calling thread.

    Cancellation: ``cancel`` (create it and let ``run`` close over it) is set by run_packed when the
    calling thread is interrupted (KeyboardInterrupt, or any exception, e.g. from ``on_event``);
    the caller may also set it, e.g. from a SIGTERM handler. Once it is set no job starts; ``run``
    should poll it (or ``cancel.wait(...)``) and stop its server promptly. run_packed always waits
    for every started ``run`` to return — a server outliving its thread would leak a GPU — then
    re-raises the interruption; a further Ctrl-C while waiting does not abandon the wait. When the
    caller set ``cancel`` itself, jobs never started get an ``Interrupted`` result instead.
    ``unit`` names the devices in progress lines ("cores" when they are CPU cores).
    Raises ValueError (nothing started) for duplicate keys or a job larger than ``gpus``.
    """
    validate(jobs, gpus)
    cancel = cancel if cancel is not None else threading.Event()
    emit = on_event if on_event is not None else _ignore
    pending = sorted(jobs, key=priority)
    free = set(gpus)
    done: queue.Queue[tuple[Job, tuple[int, ...], float, R | BaseException]] = queue.Queue()
    threads: dict[str, threading.Thread] = {}
    results: dict[str, R | BaseException] = {}

    def work(job: Job, got: tuple[int, ...]) -> None:
        started = time.monotonic()
        outcome: R | BaseException
        try:
            outcome = run(job, got)
        except BaseException as exc:  # recorded as the job's result, never propagated
            outcome = exc
        done.put((job, got, time.monotonic() - started, outcome))

    try:
        while pending or threads:
            if cancel.is_set() and pending:
                emit(f"cancelled: {len(pending)} job(s) not started: {', '.join(j.key for j in pending)}")
                for job in pending:
                    results[job.key] = Interrupted(f"{job.key}: not started, the run was cancelled")
                pending = []
            for job, got in next_launches(pending, free, len(threads), not gpus):
                free.difference_update(got)
                pending.remove(job)
                thread = threading.Thread(target=work, args=(job, got), name=f"specwake-job-{job.key}")
                threads[job.key] = thread  # registered before start: the drain below must see it
                thread.start()
                emit(f"start {job.key} on {_describe(got, unit)}")
            if not threads:
                if pending:  # unreachable after validate(); never wait for nothing
                    raise RuntimeError(f"cannot place {pending[0].key} on GPUs {sorted(free)}")
                break
            job, got, seconds, outcome = done.get()
            threads.pop(job.key).join()
            free.update(got)
            results[job.key] = outcome
            emit(_finished(job, seconds, outcome))
    except BaseException:
        cancel.set()
        _drain(threads, emit)
        raise
    return {job.key: results[job.key] for job in jobs}


def _drain(threads: dict[str, threading.Thread], emit: Callable[[str], None]) -> None:
    """Wait for every started job thread to end; a further Ctrl-C only repeats the notice."""
    started = [t for t in threads.values() if t.ident is not None]
    note = f"interrupted: waiting for {len(started)} running job(s) to stop" if started else ""
    while True:
        try:
            if note:
                _emit_safely(emit, note)
                note = ""
            for thread in started:
                while thread.is_alive():
                    thread.join(_JOIN_POLL_S)
            return
        except KeyboardInterrupt:
            note = "interrupted again: still waiting for running jobs to stop their servers"


def _emit_safely(emit: Callable[[str], None], message: str) -> None:
    try:
        emit(message)
    except Exception:  # the event sink failing must not abandon running servers
        pass


def _ignore(message: str) -> None:
    pass


def _describe(devices: tuple[int, ...], unit: str) -> str:
    return f"{unit} {','.join(str(d) for d in devices)}" if devices else f"no {unit}"


def _finished(job: Job, seconds: float, outcome: object) -> str:
    if not isinstance(outcome, BaseException):
        return f"done {job.key} in {seconds:.1f} s"
    lines = str(outcome).splitlines()
    reason = f"{type(outcome).__name__}: {lines[0]}" if lines else type(outcome).__name__
    return f"failed {job.key} after {seconds:.1f} s: {reason}"
