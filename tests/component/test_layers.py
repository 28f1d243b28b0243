"""The pipeline order prepare → run → judge → report, held by `make lint`: each folder's ruff.toml bans what it may not
import (specwake/prepare/ruff.toml, specwake/judge/ruff.toml, specwake/report/ruff.toml), and so does each part of
run/ (server/ and measure/ import no other part, session/ all but bisect/, bisect/ only session/). Ruff reads a module
from stdin under a path of the folder, so it applies that folder's own configuration, as it would to a file there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

RUFF = Path(sys.executable).parent / "ruff"


def lint(path: str, line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUFF), "check", "--no-cache", "--select", "TID251", "--stdin-filename", path, "-"],
        input=f'"""A module."""\n\n{line}\n\nprint(imported)\n', capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("specwake/prepare/new.py", "from specwake.run.measure.cycle import cycle_steps as imported"),
        ("specwake/prepare/new.py", "from specwake.report.markdown import render_markdown as imported"),
        ("specwake/judge/new.py", "from specwake.prepare.scenario import Scenario as imported"),
        ("specwake/judge/new.py", "from specwake.run.measure.measure import Workload as imported"),
        ("specwake/judge/new.py", "import specwake.run.session.assemble as imported"),
        ("specwake/report/new.py", "from specwake.run.server.server import Server as imported"),
        ("specwake/report/new.py", "from specwake.run.measure.metrics import summed as imported"),
        ("specwake/run/server/new.py", "from specwake.run.session.session import execute as imported"),
        ("specwake/run/server/new.py", "from specwake.run.measure import client as imported"),
        ("specwake/run/server/new.py", "from specwake.judge.verdict import RULES as imported"),
        ("specwake/run/measure/new.py", "from specwake.run.server.server import Server as imported"),
        ("specwake/run/measure/new.py", "from specwake.run.session.runner import Work as imported"),
        ("specwake/run/session/new.py", "from specwake.run.bisect.bisect import run_bisect as imported"),
        ("specwake/run/bisect/new.py", "from specwake.run.server.server import Server as imported"),
        ("specwake/run/bisect/new.py", "from specwake.run.measure.measure import run_stage as imported"),
    ],
)
def test_a_back_import_fails_lint(path: str, line: str) -> None:
    proc = lint(path, line)
    assert proc.returncode == 1 and "TID251" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("specwake/run/new.py", "from specwake.prepare.scenario import Scenario as imported"),
        ("specwake/run/new.py", "from specwake.judge.verdict import RULES as imported"),
        ("specwake/prepare/new.py", "from specwake.judge.verdict import RULES as imported"),
        ("specwake/report/new.py", "from specwake.judge.verdict import RULES as imported"),
        ("specwake/report/new.py", "from specwake.run.bisect.bisect import BisectOutcome as imported"),
        ("specwake/run/server/new.py", "from specwake.prepare.plan import redact_env as imported"),
        ("specwake/run/measure/new.py", "from specwake.judge.sequential import acceptance_test as imported"),
        ("specwake/run/session/new.py", "from specwake.run.server.server import Server as imported"),
        ("specwake/run/session/new.py", "from specwake.run.measure.measure import run_stage as imported"),
        ("specwake/run/bisect/new.py", "from specwake.run.session.session import execute as imported"),
    ],
)
def test_the_pipelines_own_order_passes(path: str, line: str) -> None:
    proc = lint(path, line)
    assert proc.returncode == 0, proc.stdout + proc.stderr
