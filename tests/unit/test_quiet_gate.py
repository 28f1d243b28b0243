"""gate.Quiet with real threads (packed GPU servers): a stage whose tok/s decides never overlaps another server's
start, cycle, stage or stop; everything else runs at once; deciding stages are neither starved nor left waiting by a
cancelled run. And the report line that says which stages measured alone."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace

import pytest

from specwake.errors import Interrupted
from specwake.report import render_markdown
from specwake.run.measure.gate import Gate, Quiet
from tests.helpers.builders import measured_stage, reported_variant, scenario

WAIT_S = 5.0  # generous bound for one thread to reach a point; a deadlock fails the test instead of hanging
SETTLE_S = 0.3  # long enough for a thread that is free to go to have gone


def test_a_deciding_stage_overlaps_nothing_and_the_rest_overlaps_freely() -> None:
    gate = Quiet()
    spans: list[tuple[str, int, float, float]] = []  # kind, server, start, end
    lock = threading.Lock()

    def server(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            kind = rng.choice(["start", "cycle", "stop", "decides", "advisory"])
            held: AbstractContextManager[object]
            if kind in ("decides", "advisory"):
                held = gate.stage(kind == "decides")
            else:
                held = gate.busy(stopping=kind == "stop")
            with held:
                start = time.monotonic()
                time.sleep(rng.uniform(0, 0.006))
                end = time.monotonic()
            with lock:
                spans.append((kind, seed, start, end))

    threads = [threading.Thread(target=server, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 72
    clashes = [
        (a, b)
        for a in spans
        for b in spans
        if a[0] == "decides" and a[1] != b[1] and a[2] < b[3] and b[2] < a[3]  # another server's anything
    ]
    assert clashes == []
    others = [s for s in spans if s[0] != "decides"]
    assert any(a[2] < b[3] and b[2] < a[3] for a in others for b in others if a[1] != b[1]), "busy work ran serially"


def _hold(enter: Callable[[], AbstractContextManager[object]]) -> tuple[threading.Event, threading.Event]:
    """Run `with enter():` in a thread until released: (entered, release)."""
    entered, release = threading.Event(), threading.Event()

    def body() -> None:
        with enter():
            entered.set()
            release.wait(WAIT_S)

    threading.Thread(target=body, daemon=True).start()
    return entered, release


def test_starts_cycles_and_advisory_stages_run_at_once() -> None:
    gate = Quiet()
    holders = [_hold(gate.busy), _hold(gate.busy), _hold(lambda: gate.stage(False))]
    assert all(entered.wait(WAIT_S) for entered, _ in holders)  # all three inside together
    for _, release in holders:
        release.set()


def test_a_deciding_stage_waits_for_busy_servers_and_holds_new_busy_work_back() -> None:
    gate = Quiet()
    starting, start_done = _hold(gate.busy)  # a neighbour compiling and capturing graphs
    assert starting.wait(WAIT_S)
    measuring, measured = _hold(lambda: gate.stage(True))
    time.sleep(SETTLE_S)
    assert not measuring.is_set()  # never measures beside a start
    cycling, cycle_done = _hold(gate.busy)  # a neighbour's cycle asked after the stage did
    time.sleep(SETTLE_S)
    assert not cycling.is_set()  # waits behind the stage: starts and cycles cannot starve it
    start_done.set()
    assert measuring.wait(WAIT_S)
    time.sleep(SETTLE_S)
    assert not cycling.is_set()  # not while it measures
    measured.set()
    assert cycling.wait(WAIT_S)
    cycle_done.set()


def test_deciding_stages_take_turns_in_the_order_they_asked() -> None:
    gate = Quiet()
    order: list[int] = []
    first, release = _hold(lambda: gate.stage(True))
    assert first.wait(WAIT_S)
    threads = []
    for n in range(1, 5):
        t = threading.Thread(target=lambda n=n: _record(gate, order, n))
        t.start()
        threads.append(t)
        time.sleep(0.1)  # each asks after the one before
    release.set()
    for t in threads:
        t.join(WAIT_S)
    assert order == [1, 2, 3, 4]


def _record(gate: Quiet, order: list[int], n: int) -> None:
    with gate.stage(True):
        order.append(n)


def test_a_cancelled_run_stops_the_waiting_and_a_stop_never_waits() -> None:
    cancel = threading.Event()
    gate = Quiet(cancel)
    measuring, measured = _hold(lambda: gate.stage(True))
    assert measuring.wait(WAIT_S)
    raised: list[str] = []

    def wait_for(enter: Callable[[], AbstractContextManager[object]], name: str) -> None:
        try:
            with enter():
                raised.append(f"{name} got in")
        except Interrupted:
            raised.append(name)

    waiters = [
        threading.Thread(target=wait_for, args=(lambda: gate.stage(True), "stage")),
        threading.Thread(target=wait_for, args=(gate.busy, "start")),
    ]
    for t in waiters:
        t.start()
    time.sleep(SETTLE_S)
    assert raised == []
    cancel.set()
    for t in waiters:
        t.join(WAIT_S)
    assert sorted(raised) == ["stage", "start"]
    stopped = threading.Event()
    threading.Thread(target=lambda: _stop(gate, stopped), daemon=True).start()
    assert stopped.wait(WAIT_S)  # stopping a server while another still measures: the run is being torn down
    cancel.clear()  # a later stage (not cancelled) must not wait for the one that gave up
    measured.set()
    after, done = _hold(lambda: gate.stage(True))
    assert after.wait(WAIT_S)
    done.set()


def _stop(gate: Quiet, stopped: threading.Event) -> None:
    with gate.busy(stopping=True):
        stopped.set()


@pytest.mark.parametrize(("gate", "decides", "alone"), [(Quiet(), True, True), (Quiet(), False, False)])
def test_quiet_says_which_stages_measured_alone(gate: Gate, decides: bool, alone: bool) -> None:
    with gate.stage(decides) as got:
        assert got is alone


@pytest.mark.parametrize("alone", [True, False])
def test_a_gate_that_never_waits_says_what_its_mode_guarantees(alone: bool) -> None:
    gate = Gate(alone)
    with gate.busy(), gate.stage(True) as got, gate.stage(False) as also:  # nested: would deadlock if it waited
        assert got is alone and also is alone


def _with_marks(marks: list[bool | None]) -> str:
    fresh = [100.0, 101.0, 99.0]
    stages = [measured_stage(c, 64, 192, fresh, None if c == 0 else True) for c in range(len(marks))]
    stages = [replace(s, measured_alone=m) for s, m in zip(stages, marks, strict=True)]
    return render_markdown([scenario("s", "pass", [reported_variant("v", "recover", "recover", stages)])])


def test_the_report_says_which_stages_measured_alone() -> None:
    assert "tok/s of every stage measured alone" in _with_marks([True, True, True])
    assert "tok/s measured alone in fresh, after L2 #2 only" in _with_marks([True, False, True])
    assert "tok/s measured beside other servers' work (no turns)" in _with_marks([False, False, False])
    older = _with_marks([None, None, None])  # a result from before the field: nothing claimed either way
    assert "measured alone" not in older and "no turns" not in older
