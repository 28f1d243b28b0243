"""gate.PhaseGate with real threads: measurements alone, everything else side by side, waiting measurements
first, and a cancelled run never left blocked."""

from __future__ import annotations

import random
import threading
import time

import pytest

from specwake.errors import Interrupted
from specwake.gate import PhaseGate

WAIT_S = 5.0  # generous bound for one thread to reach a point; a deadlock fails the test instead of hanging


def test_an_exclusive_phase_never_overlaps_any_other_phase() -> None:
    gate = PhaseGate()
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            kind = rng.choice(["shared", "shared", "exclusive"])
            with getattr(gate, kind)():
                start = time.monotonic()
                time.sleep(rng.uniform(0, 0.004))
                end = time.monotonic()
            with lock:
                spans.append((kind, start, end))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 150
    exclusive = [s for s in spans if s[0] == "exclusive"]
    assert exclusive, "the random mix drew no exclusive phase"
    for kind, start, end in exclusive:
        others = [s for s in spans if s != (kind, start, end) and s[1] < end and start < s[2]]
        assert others == [], f"exclusive phase {start:.4f}–{end:.4f} overlapped {others}"
    shared = sorted(s for s in spans if s[0] == "shared")
    assert any(b[1] < a[2] for a, b in zip(shared, shared[1:], strict=False)), "shared phases never ran together"


def test_shared_phases_run_at_the_same_time() -> None:
    gate = PhaseGate()
    both_in = threading.Barrier(2, timeout=WAIT_S)  # breaks (fails) unless both hold the gate at once

    def hold() -> None:
        with gate.shared():
            both_in.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not both_in.broken


def test_a_waiting_measurement_goes_before_a_later_shared_phase() -> None:
    gate = PhaseGate()
    order: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def first_shared() -> None:
        with gate.shared():
            holding.set()
            release.wait(WAIT_S)
        order.append("startup done")

    def measurement() -> None:
        with gate.exclusive():
            order.append("measurement")

    def later_shared() -> None:
        with gate.shared():
            order.append("later startup")

    a = threading.Thread(target=first_shared)
    a.start()
    assert holding.wait(WAIT_S)
    b = threading.Thread(target=measurement)
    b.start()
    time.sleep(0.2)  # b is now waiting for the shared holder
    c = threading.Thread(target=later_shared)
    c.start()
    time.sleep(0.2)  # c must queue behind the waiting measurement, not join the shared holder
    assert order == []
    release.set()
    for t in (a, b, c):
        t.join(WAIT_S)
    assert order == ["startup done", "measurement", "later startup"]


@pytest.mark.parametrize("kind", ["shared", "exclusive"])
def test_a_cancelled_run_makes_a_waiting_phase_raise_interrupted(kind: str) -> None:
    cancel = threading.Event()
    gate = PhaseGate(cancel)
    raised: list[BaseException] = []
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with gate.exclusive():
            holding.set()
            release.wait(WAIT_S)

    def waiter() -> None:
        try:
            with getattr(gate, kind)():
                pass
        except Interrupted as exc:
            raised.append(exc)

    h = threading.Thread(target=holder)
    h.start()
    assert holding.wait(WAIT_S)
    w = threading.Thread(target=waiter)
    w.start()
    time.sleep(0.2)
    cancel.set()
    w.join(WAIT_S)
    assert not w.is_alive() and len(raised) == 1
    release.set()
    h.join(WAIT_S)
