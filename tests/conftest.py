"""Shared pytest fixtures for specwake's tests.

Sections: process-leak check (servers started through specwake.server must leave nothing). The /proc
scans and the real-engine gate themselves live in tests/procs.py, shared with the end-to-end modules.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator

import pytest

from tests.procs import leftover_processes

__all__ = ["assert_no_leftover_processes", "leak_check", "leftover_processes"]

# --------------------------------------------------------------------------------------------
# Process-leak check
#
# Independent of specwake.server on purpose: it reads /proc itself (tests/procs.py), so a bug in the
# code under test cannot hide its own leak. Use `pytestmark = pytest.mark.usefixtures("leak_check")` in a
# test module, or call `assert_no_leftover_processes(pgids)` directly.
# --------------------------------------------------------------------------------------------


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
