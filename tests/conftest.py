"""Shared pytest fixtures for specwake's tests, and the tiers.

Tiers, by folder: tests/unit/ (in-process: no subprocess may start, tests/unit/conftest.py enforces it),
tests/component/ (the real CLI and code against a fake engine or fake server) and tests/e2e/ (real vLLM). Every test
gets its folder's marker (`-m unit`, ...); a test module outside the three folders is an error. Shared helpers live in
tests/helpers/.

Sections: process-leak check (servers started through specwake.run.server.server must leave nothing); the fake engine
(tests/helpers/fakeengine.py) of the CLI-level modules. The /proc scans, `assert_no_leftover_processes` and the
real-engine gate themselves live in tests/helpers/procs.py, shared with the end-to-end modules: import helpers from
there (or tests/helpers/fakeengine.py, tests/helpers/builders.py), never from this file.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.fakeengine import WARM_SWITCH, FakeEngine, kill_survivors, make_fake_engine
from tests.helpers.procs import assert_no_leftover_processes

TIERS = ("unit", "component", "e2e")
# The scenario files under tests/data are the tests' inputs: `pytest tests` must not run them through specwake's
# pytest plugin (which collects a scenario file under a folder named on the command line).
collect_ignore_glob = ["data/*.toml"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier, from its folder."""
    for item in items:
        tier = item.path.parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.path}: a test module belongs in tests/unit, tests/component or tests/e2e")
        item.add_marker(getattr(pytest.mark, tier))


# Several tests press Ctrl-C on a specwake subprocess (SIGINT) and expect exit 130. A shell starts a background job
# (`make test &`, a CI step run with `&`) with SIGINT ignored, children inherit an ignored signal across exec, and
# Python then installs no KeyboardInterrupt handler: those tests would see specwake finish instead. Give the children
# the terminal's SIGINT whatever started pytest (a Python handler is reset to the default on exec, unlike "ignored").
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# --------------------------------------------------------------------------------------------
# Process-leak check
#
# Independent of specwake.run.server.server on purpose: it reads /proc itself (tests/helpers/procs.py), so a bug in the
# code under test cannot hide its own leak. Use `pytestmark = pytest.mark.usefixtures("leak_check")` in a
# test module, or call `tests.procs.assert_no_leftover_processes(pgids)` directly.
# --------------------------------------------------------------------------------------------


@pytest.fixture
def leak_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Record the process group of every Server started in the test; assert none survives it."""
    from specwake.run.server import server

    pgids: list[int] = []
    original_start = server.Server.start

    def recording_start(self: server.Server) -> None:
        original_start(self)
        if self.pgid is not None:
            pgids.append(self.pgid)

    monkeypatch.setattr(server.Server, "start", recording_start)
    yield pgids
    assert_no_leftover_processes(pgids)


# --------------------------------------------------------------------------------------------
# Fake engine
# --------------------------------------------------------------------------------------------


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngine]:
    """A fake engine under tmp_path; after the test nothing it started may still run (killed and reported
    otherwise). In-process CLI calls get the private cache tmp_path/cache, the one `run_cli`/`cli_env` pass to
    subprocesses, so a test's cache is the same whichever way it runs specwake, and start their servers cold as
    `cli_env` has them (a warm launcher would live as long as the test session: tests/component/test_warm_start.py)."""
    monkeypatch.setenv("SPECWAKE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(WARM_SWITCH, "0")
    fake = make_fake_engine(tmp_path)
    yield fake
    assert kill_survivors(fake) == [], "a server started by specwake survived the test"
