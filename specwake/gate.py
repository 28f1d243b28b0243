"""Servers side by side on one CPU, measurements alone: the gate every phase of a variant passes through.

A measurement (a stage's warmup and measured requests) holds the gate exclusively, so no other server starts,
measures or cycles while its tok/s is taken; startups, cycles and teardowns hold it shared and overlap freely.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from specwake.errors import Interrupted

_POLL_S = 0.2  # how often a waiting phase looks at the cancel flag


class PhaseGate:
    """Lets phases of servers running side by side share the machine, except measurements: a measurement holds
    the gate alone (no other server starts, measures or cycles meanwhile, so its tok/s is its own), everything
    else holds it shared. Waiting measurements go first: a steady stream of startups never starves them.
    `cancel` (set when the run is interrupted) makes a waiting phase raise Interrupted instead of blocking."""

    def __init__(self, cancel: threading.Event | None = None) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0
        self._cancel = cancel

    def _wait(self, ready: Callable[[], bool]) -> None:
        while not ready():
            if self._cancel is not None and self._cancel.is_set():
                raise Interrupted("the run was cancelled while a phase waited for its turn")
            self._cond.wait(_POLL_S)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._wait(lambda: not self._exclusive and not self._waiting_exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting_exclusive += 1
            try:
                self._wait(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class OpenGate(PhaseGate):
    """No waiting at all: servers that never share a machine's cores (one at a time, or on their own GPUs)."""

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield
