"""The unit tier runs in-process: a test that starts a process fails, so the tier stays fast and needs nothing
installed beyond the package (torch where a test imports it)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test started a process: it belongs in tests/component/ or tests/e2e/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
