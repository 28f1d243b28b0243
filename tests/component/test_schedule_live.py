"""Tests of specwake.run.session.schedule: GPU-list parsing, the pure packing plan and its invariants, and
run_packed executing real fake servers (tests/helpers/fake_server.py) concurrently on disjoint GPU sets."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from specwake.errors import StartupFailed
from specwake.run.server.server import Server, ServerSpec, free_port
from specwake.run.session.schedule import (
    Job,
    run_packed,
)
from tests.helpers.paths import FAKE_SERVER
from tests.helpers.procs import running

EPS = 1e-9

# --------------------------------------------------------------------------------------------
# parse_gpu_list


# --------------------------------------------------------------------------------------------
# choose_gpus


# --------------------------------------------------------------------------------------------
# plan_schedule invariants


# --------------------------------------------------------------------------------------------
# run_packed with plain callables (fast)


# --------------------------------------------------------------------------------------------
# run_packed with real (fake) servers


@dataclass
class Record:
    gpus: tuple[int, ...]
    launched: float  # before the process started
    ready: float  # /health answered
    stopping: float  # about to stop it
    stopped: float  # the whole group is gone


class FakeFleet:
    """A `run` for run_packed: one tests/helpers/fake_server.py per job, on the GPU set it was given."""

    def __init__(self, tmp_path: Path, modes: dict[str, str]) -> None:
        self.tmp_path, self.modes = tmp_path, modes
        self.records: dict[str, Record] = {}
        self.barriers: dict[str, threading.Barrier] = {}
        self.after_ready: dict[str, Callable[[], None]] = {}

    def __call__(self, job: Job, gpus: tuple[int, ...]) -> int:
        port = free_port()
        spec = ServerSpec(
            argv=[sys.executable, str(FAKE_SERVER), "--port", str(port), "--spawn-child"]
            + ["--mode", self.modes.get(job.key, "ready")],
            env={
                "PATH": os.environ.get("PATH", ""),
                "PYTHONUNBUFFERED": "1",
                "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
            },
            port=port,
            log_path=self.tmp_path / "logs" / f"{job.key.replace('/', '-')}.log",
            startup_timeout_s=30.0,
        )
        launched = time.monotonic()
        with running(Server(spec, poll_interval_s=0.05, grace_s=5.0)) as server:
            ready = time.monotonic()
            status = httpx.get(f"{server.base_url}/health", timeout=10).status_code
            if job.key in self.barriers:
                self.barriers[job.key].wait()  # proves the executor ran these jobs together
            if job.key in self.after_ready:
                self.after_ready[job.key]()
            stopping = time.monotonic()
        self.records[job.key] = Record(gpus, launched, ready, stopping, time.monotonic())
        return status


leak_checked = pytest.mark.usefixtures("leak_check")


@leak_checked
@pytest.mark.timeout(60)
def test_run_packed_real_servers_share_no_gpu_and_survive_a_crash(tmp_path: Path) -> None:
    jobs = [
        Job("pair-a/baseline", 2),
        Job("one-a/baseline", 1),
        Job("big/patched", 4),
        Job("one-bad/patched", 1),
        Job("pair-b/patched", 2),
        Job("one-b/baseline", 1),
    ]
    fleet = FakeFleet(tmp_path, modes={"one-bad/patched": "exit-early"})
    pair = threading.Barrier(2, timeout=20)  # breaks (the job fails) if run one after the other
    fleet.barriers = {"pair-a/baseline": pair, "pair-b/patched": pair}
    events: list[str] = []
    results = run_packed(jobs, [0, 1, 2, 3], fleet, on_event=events.append)

    assert isinstance(results["one-bad/patched"], StartupFailed)
    ok = [job.key for job in jobs if job.key != "one-bad/patched"]
    assert all(results[key] == 200 for key in ok), results
    assert sorted(fleet.records) == sorted(ok)
    records = list(fleet.records.items())
    for key, rec in records:
        job = next(j for j in jobs if j.key == key)
        assert len(rec.gpus) == job.gpus_needed and set(rec.gpus) <= {0, 1, 2, 3}
    for i, (key_a, a) in enumerate(records):
        for key_b, b in records[i + 1 :]:
            if set(a.gpus) & set(b.gpus):  # sharing a GPU: one server was gone before the other launched
                assert a.stopped <= b.launched or b.stopped <= a.launched, (key_a, a, key_b, b)
    up_together = [
        (ka, kb)
        for i, (ka, a) in enumerate(records)
        for kb, b in records[i + 1 :]
        if a.ready < b.stopping and b.ready < a.stopping
    ]
    assert up_together, "no two servers were ever up at the same time"
    assert any("start big/patched on GPUs 0,1,2,3" == m for m in events)
    assert any(m.startswith("failed one-bad/patched") and "StartupFailed" in m for m in events)


@pytest.fixture
def default_sigint() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@leak_checked
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("default_sigint")
def test_ctrl_c_stops_launching_waits_for_running_servers_and_reraises(tmp_path: Path) -> None:
    cancel = threading.Event()
    fleet = FakeFleet(tmp_path, modes={})
    saw_cancel: dict[str, bool] = {}

    def press_ctrl_c_then_wait() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, delivered to the main thread
        saw_cancel["first"] = cancel.wait(timeout=30)

    def wait_for_cancel() -> None:
        saw_cancel["second"] = cancel.wait(timeout=30)

    fleet.after_ready = {"first": press_ctrl_c_then_wait, "second": wait_for_cancel}
    jobs = [Job("first", 2, 9.0), Job("second", 2, 8.0), Job("third", 2), Job("fourth", 1)]
    events: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_packed(jobs, [0, 1, 2, 3], fleet, on_event=events.append, cancel=cancel)
    assert saw_cancel == {"first": True, "second": True}
    assert sorted(fleet.records) == ["first", "second"]  # both stopped their servers before the re-raise
    assert not any(m.startswith(("start third", "start fourth")) for m in events)
    assert any(m.startswith("interrupted: waiting for 2 running job(s)") for m in events)
