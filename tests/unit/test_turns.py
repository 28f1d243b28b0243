"""gate.Turns with real threads: one turn at a time, first come first served, a cancelled run never left waiting,
and a server that gave up never blocks the ones after it."""

from __future__ import annotations

import random
import threading
import time

import pytest

from specwake.errors import Interrupted
from specwake.run.measure.gate import AnyTime, Turns

WAIT_S = 5.0  # generous bound for one thread to reach a point; a deadlock fails the test instead of hanging


def test_turns_never_overlap() -> None:
    turns = Turns()
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def server(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(15):
            with turns.turn():
                start = time.monotonic()
                time.sleep(rng.uniform(0, 0.004))
                end = time.monotonic()
            with lock:
                spans.append((start, end))
            time.sleep(rng.uniform(0, 0.002))

    threads = [threading.Thread(target=server, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 90
    ordered = sorted(spans)
    overlapping = [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if b[0] < a[1]]
    assert overlapping == []


def test_servers_get_their_turn_in_the_order_they_asked() -> None:
    turns = Turns()
    order: list[int] = []
    release = threading.Event()
    holding = threading.Event()

    def first() -> None:
        with turns.turn():
            holding.set()
            release.wait(WAIT_S)

    def later(n: int) -> None:
        with turns.turn():
            order.append(n)

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert holding.wait(WAIT_S)
    for n in range(1, 5):
        t = threading.Thread(target=later, args=(n,))
        t.start()
        threads.append(t)
        time.sleep(0.1)  # each asks after the one before
    release.set()
    for t in threads:
        t.join(WAIT_S)
    assert order == [1, 2, 3, 4]


def test_a_cancelled_run_stops_the_waiting_and_a_given_up_turn_passes_on() -> None:
    cancel = threading.Event()
    turns = Turns(cancel)
    raised: list[BaseException] = []
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with turns.turn():
            holding.set()
            release.wait(WAIT_S)

    def waiter() -> None:
        try:
            with turns.turn():
                pytest.fail("a cancelled waiter must not get its turn")
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
    cancel.clear()  # a later server (not cancelled) must not wait for the one that gave up
    release.set()
    h.join(WAIT_S)
    got = threading.Event()

    def after() -> None:
        with turns.turn():
            got.set()

    threading.Thread(target=after).start()
    assert got.wait(WAIT_S)


def test_any_time_never_waits() -> None:
    turns = AnyTime()
    with turns.turn(), turns.turn():  # nested: would deadlock if it waited
        pass
