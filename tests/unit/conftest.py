"""The unit tier runs in-process: a test that starts a process fails, so the tier stays fast and needs nothing
installed beyond the package (torch where a test imports it)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

# matplotlib's first use on a machine lists the system fonts with `fc-list` (a process) and caches them in
# MPLCONFIGDIR: do it here, while the tier is being set up, so that plot tests pass where nothing ran before.
try:
    import matplotlib.font_manager  # noqa: F401
except ImportError:  # the dev extra installs it; test_plot.py fails loudly without it
    pass


@pytest.fixture(autouse=True)
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test started a process: it belongs in tests/component/ or tests/e2e/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
