"""The end-to-end tier's shared real run (tests/helpers/shared_runs.py): one `specwake run` of the scenarios of every
selected module marked `shared_run`, started by the first test that needs it and kept for the session.

Under pytest-xdist with `--dist loadscope` (what `make test` runs, on two workers) each module goes to one worker, as
loadscope does, but the shared run's modules go to one worker together (`SharedRunScheduling`): the shared run is
made once, while the other worker takes the modules that make real runs of their own (bisect, resume, the plugin,
validation). xdist's own `--dist loadgroup` cannot do it: it renames items in a way pytest 9 no longer reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.helpers import shared_runs

HERE = Path(__file__).parent
# The modules of the shared run, as the scheduler (on xdist's controller, which collects nothing) must know them: by
# their marker's text. pytest_collection_modifyitems holds every collected item to it.
SHARED_MODULES = frozenset(
    p.name for p in HERE.glob("test_*.py") if f"pytest.mark.{shared_runs.MARKER}(" in p.read_text()
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{shared_runs.MARKER}(scenarios): the module's scenarios join the session's shared real run"
    )


# The modules with real runs of their own, dearest first: the worker beside the shared run takes them in this order,
# so what is left when the shared run ends is short, and both workers end together. Measured beside the shared run on a
# 2-core machine: bisect about 210 s, releases and validation about 150 each (releases downloads its wheels on a fresh
# machine), the reference fix 110, resume 65, the plugin 60, the warm base 35. The other modules follow, by their
# number of tests (loadscope's own order); the shared run, with the most tests, goes first.
DEAREST_FIRST = (
    "test_bisect.py",
    "test_releases.py",
    "test_validate.py",
    "test_reference_fix.py",
    "test_resume.py",
    "test_pytest_plugin.py",
    "test_warm_base.py",
)


assert all((HERE / name).is_file() for name in DEAREST_FIRST), "conftest.DEAREST_FIRST names a module that is gone"


def dearest_first(scope: str) -> int:
    """Where a scope goes in the queue: the shared run, then DEAREST_FIRST's order, then the rest."""
    if scope == shared_runs.MARKER:
        return -1
    name = Path(scope.split("::", 1)[0]).name
    return DEAREST_FIRST.index(name) if name in DEAREST_FIRST else len(DEAREST_FIRST)


class SharedRunScheduling(LoadScopeScheduling):
    """`--dist loadscope`, with every module of the shared run in one scope, and the dearest modules first."""

    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return shared_runs.MARKER if Path(module).name in SHARED_MODULES else super()._split_scope(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the first assignment: loadscope has just queued every scope, by number of tests
            self._ordered = True
            queued = sorted(self.workqueue.items(), key=lambda item: dearest_first(item[0]))  # stable
            self.workqueue.clear()
            self.workqueue.update(queued)
        super()._assign_work_unit(node)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> SharedRunScheduling | None:
    return SharedRunScheduling(config, log) if config.getvalue("dist") == "loadscope" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marked = item.get_closest_marker(shared_runs.MARKER) is not None
        assert marked == (item.path.name in SHARED_MODULES), (
            f"{item.nodeid}: its module's shared_run mark and conftest.SHARED_MODULES disagree"
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Any test of the shared run may be the one that starts it: give each the whole run's time limit and a margin,
    so that the run's own limit fires first (pytest-timeout counts a test's fixture setup)."""
    every = shared_runs.wanted(session.items)
    for item in session.items:
        if item.get_closest_marker(shared_runs.MARKER) is not None:
            item.add_marker(pytest.mark.timeout(shared_runs.timeout_for(every)))


BREAKDOWN = "shared_run_breakdown"  # where the shared run's time went: a worker's output, the controller's summary


@pytest.fixture(scope="session")
def shared_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> shared_runs.SharedRun:
    every = shared_runs.wanted(request.session.items)
    assert every, "no selected test is marked shared_run, yet one asked for the shared run"
    run = shared_runs.start(every, tmp_path_factory.mktemp("shared-scenarios"), tmp_path_factory.mktemp("shared"))
    lines = shared_runs.breakdown(run.run)
    config = request.config
    if hasattr(config, "workeroutput"):  # an xdist worker: its controller prints them (pytest_testnodedown)
        config.workeroutput[BREAKDOWN] = lines
    else:
        config.stash[_LINES] = lines
    return run


_LINES = pytest.StashKey[list[str]]()


def pytest_testnodedown(node: object, error: object) -> None:
    """xdist's controller: keep the breakdown a worker made, for the summary."""
    lines = getattr(node, "workeroutput", {}).get(BREAKDOWN)
    config = getattr(node, "config", None)
    if lines and config is not None:
        config.stash[_LINES] = lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_LINES, None)
    if lines:
        terminalreporter.section("where the shared run's time went")
        for line in lines:
            terminalreporter.write_line(line)
