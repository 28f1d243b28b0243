"""The end-to-end tier's shared real run (tests/helpers/shared_runs.py): one `specwake run` of the scenarios of every
selected module marked `shared_run`, started by the first test that needs it and kept for the session.

Under pytest-xdist with `--dist loadgroup` (what `make test` runs, on two workers) every module is a group of its own
and the shared run's modules one group: the shared run is made once, on one worker, while the other worker takes the
modules that start real runs of their own (bisect, resume, the plugin, validation) one after the other."""

from __future__ import annotations

import pytest

from tests.helpers import shared_runs


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{shared_runs.MARKER}(scenarios): the module's scenarios join the session's shared real run"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The xdist groups: one for the shared run's modules, one per other module (its module-scoped runs made once)."""
    for item in items:
        shared = item.get_closest_marker(shared_runs.MARKER) is not None
        item.add_marker(pytest.mark.xdist_group(shared_runs.MARKER if shared else item.module.__name__))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Any test of the shared run may be the one that starts it: give each the whole run's time limit and a margin,
    so that the run's own limit fires first (pytest-timeout counts a test's fixture setup)."""
    every = shared_runs.wanted(session.items)
    for item in session.items:
        if item.get_closest_marker(shared_runs.MARKER) is not None:
            item.add_marker(pytest.mark.timeout(shared_runs.timeout_for(every)))


@pytest.fixture(scope="session")
def shared_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> shared_runs.SharedRun:
    every = shared_runs.wanted(request.session.items)
    assert every, "no selected test is marked shared_run, yet one asked for the shared run"
    return shared_runs.start(every, tmp_path_factory.mktemp("shared-scenarios"), tmp_path_factory.mktemp("shared"))
