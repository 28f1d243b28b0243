"""specwake.run.session.machine_turn: runs on one machine take turns through lock files in specwake's cache. Each holder
here is a thread with its own descriptors, which flock treats as another run would be (a lock belongs to its open
file, not its process); that a dead process leaves nothing locked is tests/component/test_machine_turns.py's."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from specwake.events import Event
from specwake.run.session.machine_turn import machine_turn, turn_file, waiting_line

POLL_S = 0.01
SETTLE_S = 0.3  # long enough for a waiter to have taken the turn had it been free


class Holder(threading.Thread):
    """A run holding the turn until `release` is set; `took` records when it got it, `said` what it printed."""

    def __init__(self, cache: Path, exclusive: bool, log: list[str]) -> None:
        super().__init__(daemon=True)
        self.cache, self.exclusive, self.log = cache, exclusive, log
        self.took = threading.Event()
        self.release = threading.Event()
        self.said: list[str] = []

    def run(self) -> None:
        with machine_turn(self.cache, self.exclusive, lambda e: self.said.append(e.text), POLL_S):
            self.log.append(f"{self.name} took")
            self.took.set()
            self.release.wait(10)
            self.log.append(f"{self.name} left")


def holding(cache: Path, exclusive: bool, log: list[str], name: str) -> Holder:
    holder = Holder(cache, exclusive, log)
    holder.name = name
    holder.start()
    return holder


def waits_then_takes(holder: Holder, blocker: Holder) -> None:
    assert not holder.took.wait(SETTLE_S), f"{holder.name} took the turn while {blocker.name} held it"
    blocker.release.set()
    assert holder.took.wait(5), f"{holder.name} never got the turn"


def done(*holders: Holder) -> None:
    for holder in holders:
        holder.release.set()
        holder.join(5)


def test_an_exclusive_turn_waits_for_the_run_that_holds_it_and_says_so_once(tmp_path: Path) -> None:
    log: list[str] = []
    first = holding(tmp_path, True, log, "first")
    assert first.took.wait(5)
    second = holding(tmp_path, True, log, "second")
    waits_then_takes(second, first)
    done(first, second)
    assert log == ["first took", "first left", "second took", "second left"]
    assert second.said == [waiting_line(int(turn_file(tmp_path).read_text()))]  # one line, naming a pid
    assert "pid" in second.said[0] and first.said == []


def test_shared_turns_go_together_and_an_exclusive_one_waits_for_all_of_them(tmp_path: Path) -> None:
    log: list[str] = []
    a, b = holding(tmp_path, False, log, "a"), holding(tmp_path, False, log, "b")
    assert a.took.wait(5) and b.took.wait(5), "two shared turns did not go side by side"
    alone = holding(tmp_path, True, log, "alone")
    assert not alone.took.wait(SETTLE_S)
    a.release.set()
    waits_then_takes(alone, b)
    done(a, b, alone)
    assert log.index("alone took") > max(log.index("a left"), log.index("b left"))


def test_a_shared_turn_waits_for_an_exclusive_one(tmp_path: Path) -> None:
    log: list[str] = []
    alone = holding(tmp_path, True, log, "alone")
    assert alone.took.wait(5)
    shared = holding(tmp_path, False, log, "shared")
    waits_then_takes(shared, alone)
    done(alone, shared)
    assert shared.said and shared.said[0].startswith("waiting for another specwake run on this machine")


def test_a_run_waiting_for_the_exclusive_turn_goes_before_shared_ones_that_come_after_it(tmp_path: Path) -> None:
    """Shared runs that keep coming cannot starve a run whose tok/s decides: they queue behind it."""
    log: list[str] = []
    first = holding(tmp_path, False, log, "first")
    assert first.took.wait(5)
    alone = holding(tmp_path, True, log, "alone")
    assert not alone.took.wait(SETTLE_S)
    later = holding(tmp_path, False, log, "later")  # would go beside `first` at once without the queue
    assert not later.took.wait(SETTLE_S), "a shared run went ahead of the run waiting for the exclusive turn"
    waits_then_takes(alone, first)
    waits_then_takes(later, alone)
    done(first, alone, later)


def test_the_turn_is_given_back_when_the_block_raises(tmp_path: Path) -> None:
    said: list[Event] = []
    try:
        with machine_turn(tmp_path, True, said.append, POLL_S):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    t0 = time.monotonic()
    with machine_turn(tmp_path, True, said.append, POLL_S):
        assert time.monotonic() - t0 < SETTLE_S
    assert said == []
