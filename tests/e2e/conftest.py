"""The end-to-end tier's shared real run (tests/helpers/shared_runs.py): one `specwake run` of the scenarios of every
selected module marked `shared_run`, started by the first test that needs it and kept for the session."""

from __future__ import annotations

import pytest

from tests.helpers import shared_runs


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{shared_runs.MARKER}(scenarios): the module's scenarios join the session's shared real run"
    )


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
