"""Shared pytest fixtures for specwake's tests.

Sections: process-leak check (servers started through specwake.server must leave nothing).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

# --------------------------------------------------------------------------------------------
# Process-leak check
#
# Independent of specwake.server on purpose: it reads /proc itself, so a bug in the code under
# test cannot hide its own leak. Use `pytestmark = pytest.mark.usefixtures("leak_check")` in a
# test module, or call `assert_no_leftover_processes(pgids)` directly.
# --------------------------------------------------------------------------------------------


def leftover_processes(pgids: Iterable[int]) -> list[tuple[int, int, str, str]]:
    """(pid, pgid, state, name) of every non-zombie process whose group is one of ``pgids``."""
    wanted = set(pgids)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        state, _ppid, pgrp = stat[stat.rfind(")") + 1 :].split()[:3]
        if int(pgrp) in wanted and state != "Z":
            found.append((int(entry.name), int(pgrp), state, name))
    return found


def assert_no_leftover_processes(pgids: Iterable[int]) -> None:
    """Fail if any process group in ``pgids`` still has a live member; SIGKILL those first."""
    pgids = list(pgids)
    leftovers = leftover_processes(pgids)
    for pid, *_ in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)  # never leak onto the shared machine, even on failure
        except ProcessLookupError:
            pass
    assert not leftovers, f"processes left running (pid, pgid, state, name): {leftovers}"


@pytest.fixture
def leak_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Record the process group of every Server started in the test; assert none survives it."""
    from specwake import server

    pgids: list[int] = []
    original_start = server.Server.start

    def recording_start(self: server.Server) -> None:
        original_start(self)
        if self.pgid is not None:
            pgids.append(self.pgid)

    monkeypatch.setattr(server.Server, "start", recording_start)
    yield pgids
    assert_no_leftover_processes(pgids)
