"""Runs on one machine take turns: a lock in specwake's cache that every `specwake run` holds while its servers are up.

Two runs at once pin their servers to the same cores (each packs onto every core it may use) and share the caches,
memory and, on GPUs, the PCIe of the machine, so one run's starts, cycles and measurements slow the other's stages. A
run whose tok/s decides an outcome (a speed call binds: `runner.speed_binds`) holds the turn *exclusively*, from
before its first server starts until its last one stops: no other specwake run has a server up meanwhile, and its
stages can say they measured alone. A run whose tok/s decides nothing holds it *shared*: such runs go side by side
(AL and outputs are each server's own whatever runs beside it), never beside one that holds it exclusively, and
their stages claim no measurement alone (`runner.alone_on_machine`). The pytest plugin's runs take the same turn (it
calls the same `session.execute`), beside the turns its xdist workers take among themselves.

A run that wants the turn exclusively first queues (`queue.lock`, exclusive): runs that ask for a shared turn after
it pass through that queue and so wait behind it, and a stream of shared runs cannot starve it. Among runs waiting
alike there is no order. A run that must wait says so in one progress line naming a run that holds the turn.

The locks are `fcntl.flock` locks, which the kernel drops when the process holding them dies, SIGKILL included: a
crash never leaves the machine locked. The pid a holder writes into `turn.lock` only names it in the waiting line; a
stale pid there locks nothing. Runs share turns only when they share specwake's cache folder (`SPECWAKE_CACHE`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from specwake.events import Event, Events

FOLDER = "machine"  # under specwake's cache
TURN_FILE = "turn.lock"  # held by every run while its servers are up: exclusive or shared
QUEUE_FILE = "queue.lock"  # held by a run that waits for the exclusive turn, passed through by shared ones
POLL_S = 0.5  # how often a waiting run tries again (a blocked flock would not let Ctrl-C or SIGTERM through)


def turn_file(cache: Path) -> Path:
    return cache / FOLDER / TURN_FILE


def holder(cache: Path) -> int | None:
    """The pid the latest holder of the turn wrote (None: none written, or unreadable)."""
    try:
        return int(turn_file(cache).read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None


def waiting_line(pid: int | None) -> str:
    return f"waiting for another specwake run on this machine{f' (pid {pid})' if pid else ''} to finish measuring"


@contextlib.contextmanager
def machine_turn(cache: Path, exclusive: bool, events: Events, poll_s: float = POLL_S) -> Iterator[None]:
    """Hold the machine's turn, `exclusive`ly or shared, waiting for it as long as it takes (Ctrl-C and SIGTERM still
    stop the wait); released when the block ends, or when the process dies."""
    folder = cache / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    said: list[bool] = []

    def waiting() -> None:
        if not said:
            said.append(True)
            events(Event(waiting_line(holder(cache))))

    with _opened(folder / TURN_FILE) as turn:
        with _opened(folder / QUEUE_FILE) as queue:
            _take(queue, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, waiting, poll_s)
            _take(turn, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, waiting, poll_s)
        # the queue is left (closing it unlocks it) once the turn is held
        os.ftruncate(turn, 0)
        os.pwrite(turn, f"{os.getpid()}\n".encode(), 0)
        yield


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[int]:
    """A descriptor of `path` (created if need be); closing it drops any lock taken through it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)


def _take(fd: int, mode: int, waiting: Callable[[], None], poll_s: float) -> None:
    """Lock `fd` in `mode`, trying every `poll_s` seconds; `waiting()` is called each time it is held elsewhere."""
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waiting()
            time.sleep(poll_s)
