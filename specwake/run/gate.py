"""Servers side by side on one CPU, measurements alone: whose turn it is to measure.

On a CPU every server runs confined to cores of its own (specwake.run.variant_run), so one server's start, stop or
cycle cannot take CPU from another. Measurements still share caches and memory, so they take turns: a server that
is ready waits for its turn, then runs all its phases — the fresh stage, every cycle and the stage after it — while
no other server measures or cycles, and hands the turn on. Servers get their turn in the order they asked for it.
Whole variants rather than single stages take turns so that the other cores start the next servers meanwhile: a
turn per stage would keep every server ready at the same moment, and every start after them in step.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

from specwake.errors import Interrupted

_POLL_S = 0.2  # how often a waiting server looks at the cancel flag


class Turns:
    """One turn at a time, first come first served. `cancel` (set when the run is interrupted) makes a waiting
    server raise Interrupted instead of waiting on."""

    def __init__(self, cancel: threading.Event | None = None) -> None:
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._serving = 0  # the ticket whose turn it is
        self._given_up: set[int] = set()  # tickets of servers that stopped waiting (the run was cancelled)
        self._cancel = cancel

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        with self._cond:
            ticket = next(self._tickets)
            try:
                while self._serving != ticket:
                    if self._cancel is not None and self._cancel.is_set():
                        raise Interrupted("the run was cancelled while a server waited for its turn to measure")
                    self._cond.wait(_POLL_S)
            except BaseException:
                self._given_up.add(ticket)  # its turn, when it comes, passes straight on
                self._pass_on()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._serving += 1
                self._pass_on()

    def _pass_on(self) -> None:
        while self._serving in self._given_up:
            self._given_up.discard(self._serving)
            self._serving += 1
        self._cond.notify_all()


class AnyTime(Turns):
    """No waiting: servers that never share cores (one at a time, or each on its own GPUs)."""

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        yield
