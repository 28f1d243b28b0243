"""Servers side by side on one CPU, measurements alone: whose turn it is to measure.

On a CPU every server runs confined to cores of its own (specwake.run.session.variant_run), so one server's start, stop
or cycle cannot take CPU from another. Measurements still share caches and memory, so they take turns: a server that
is ready waits for its turn, then runs all its phases — the fresh stage, every cycle and the stage after it — while
no other server measures or cycles, and hands the turn on. Servers get their turn in the order they asked for it.
Whole variants rather than single stages take turns so that the other cores start the next servers meanwhile: a
turn per stage would keep every server ready at the same moment, and every start after them in step.

GPU servers packed onto one machine share no GPU, but they share its CPUs, host memory and PCIe: a neighbour that
starts (torch.compile, CUDA-graph capture), sleeps, wakes, reloads or stops can slow a stage. There single stages
take turns (`Quiet`): a stage whose tok/s decides measures while no other server of the run does anything else,
and everything else — starts, cycles, diagnostics, stops, stages whose tok/s decides nothing — runs at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from specwake.errors import Interrupted

_POLL_S = 0.2  # how often a waiting server looks at the cancel flag


class _Tickets:
    """First come first served: each waiter takes a ticket and waits until it is served (and, while `also_wait()`
    holds, longer). `cond` guards the caller's own state as well. A waiter that gives up (the run was cancelled) has
    its ticket passed straight on when its turn comes."""

    def __init__(self, cancel: threading.Event | None) -> None:
        self.cond = threading.Condition()
        self.issued = 0  # tickets handed out
        self.serving = 0  # the ticket whose turn it is; issued > serving: someone holds or waits for a turn
        self._given_up: set[int] = set()
        self._cancel = cancel

    def cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    @contextlib.contextmanager
    def turn(self, why: str, also_wait: Callable[[], bool] = lambda: False) -> Iterator[None]:
        """Hold a turn; `why` words the Interrupted raised when the run is cancelled while waiting."""
        with self.cond:
            ticket = self.issued
            self.issued += 1
            try:
                while self.serving != ticket or also_wait():
                    if self.cancelled():
                        raise Interrupted(why)
                    self.cond.wait(_POLL_S)
            except BaseException:
                self._given_up.add(ticket)
                self._pass_on()
                raise
        try:
            yield
        finally:
            with self.cond:
                self.serving += 1
                self._pass_on()

    def _pass_on(self) -> None:
        while self.serving in self._given_up:
            self._given_up.discard(self.serving)
            self.serving += 1
        self.cond.notify_all()


class Turns:
    """One turn at a time, first come first served. `cancel` (set when the run is interrupted) makes a waiting
    server raise Interrupted instead of waiting on."""

    def __init__(self, cancel: threading.Event | None = None) -> None:
        self._tickets = _Tickets(cancel)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        with self._tickets.turn("the run was cancelled while a server waited for its turn to measure"):
            yield


class AnyTime(Turns):
    """No waiting: servers that never share cores (one at a time, or each on its own GPUs)."""

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        yield


class Gate:
    """What one server's phases wait for, stage by stage. This one waits for nothing; `alone` is what its stages
    record: True where nothing else measures meanwhile anyway (one server at a time, or whole variants taking
    Turns), False where servers measure side by side, None where the run shares the machine with other runs
    (runner.alone_on_machine)."""

    def __init__(self, alone: bool | None) -> None:
        self.alone = alone

    @contextlib.contextmanager
    def busy(self, stopping: bool = False) -> Iterator[None]:
        """A start, a cycle, diagnostics, a stop (`stopping`), or a stage whose tok/s decides nothing."""
        yield

    @contextlib.contextmanager
    def stage(self, decides: bool) -> Iterator[bool | None]:
        """A measured stage; `decides`: its tok/s decides an outcome. Yields whether it measures alone."""
        yield self.alone


class Quiet(Gate):
    """GPU servers packed on one machine: a stage whose tok/s decides waits until no other server is busy, then
    measures while none starts; busy work runs at once, and waits while a deciding stage measures or waits (so a
    stream of starts and cycles never starves a stage). Deciding stages go first come first served. `cancel` makes
    a waiting start or stage raise Interrupted; a stop never waits once the run is cancelled."""

    def __init__(self, cancel: threading.Event | None = None) -> None:
        super().__init__(alone=False)
        self._tickets = _Tickets(cancel)  # deciding stages; its condition also guards `_busy`
        self._busy = 0  # servers busy right now

    @contextlib.contextmanager
    def busy(self, stopping: bool = False) -> Iterator[None]:
        t = self._tickets
        with t.cond:
            while t.issued != t.serving and not (stopping and t.cancelled()):
                if t.cancelled():
                    raise Interrupted("the run was cancelled while a server waited for another's stage to end")
                t.cond.wait(_POLL_S)
            self._busy += 1
        try:
            yield
        finally:
            with t.cond:
                self._busy -= 1
                t.cond.notify_all()

    @contextlib.contextmanager
    def stage(self, decides: bool) -> Iterator[bool | None]:
        if not decides:
            with self.busy():
                yield False
            return
        why = "the run was cancelled while a server waited for its turn to measure"
        with self._tickets.turn(why, also_wait=lambda: self._busy > 0):
            yield True
