"""Runs on one machine take turns (specwake/run/session/machine_turn.py), through real `specwake run` processes and a
real pytest session on the fake engine, sharing one cache: a run whose tok/s decides waits until another run's servers
are gone, says so in one line, and both reports say every stage measured alone; runs whose tok/s decides nothing go side
by side and claim nothing alone; a pytest session waits for a run as a run does; a run killed outright leaves nothing
locked."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from specwake.run.session.machine_turn import FOLDER, QUEUE_FILE, machine_turn, waiting_line
from tests.helpers.fakeengine import FakeEngine, ServerSpan, cli_env, one_run_dir, scenario_text
from tests.helpers.paths import REPO

SLOW_START = {"FAKE_VLLM_ARGS": "--startup-delay 3"}  # long enough for a run started beside it to arrive meanwhile
BINDS = {"baseline": "collapse", "min_speedup_recovery": 0.5}  # a speed call that binds: the tok/s decides
ADVISORY = {"baseline": "collapse"}  # CPU: the speed call is advisory


def scenario(engine: FakeEngine, tmp: Path, expect: dict[str, object]) -> Path:
    path = tmp / "s.toml"
    path.write_text(scenario_text(engine, variants={"baseline": SLOW_START}, expect=expect, cycles=1, repeats=2))
    return path


def start_run(path: Path, out: Path, cache: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "specwake.cli", "run", str(path), "--output", str(out)],
        cwd=REPO, env=cli_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def until(condition: Callable[[], object], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, stderr


@dataclass(frozen=True)
class Run:
    pid: int
    stderr: str
    out: Path
    server: ServerSpan  # its one server's life


def two_runs(engine: FakeEngine, tmp: Path, expect: dict[str, object]) -> list[Run]:
    """Two runs of one scenario started at once with the same cache, each with its own output folder."""
    path, cache = scenario(engine, tmp, expect), tmp / "cache"
    procs = [(start_run(path, tmp / f"out-{name}", cache), tmp / f"out-{name}") for name in "ab"]
    runs = []
    for proc, out in procs:
        code, stderr = finish(proc)
        assert code == 0, stderr
        [span] = [s for s in engine.servers() if s.log is not None and out in s.log.parents]
        runs.append(Run(proc.pid, stderr, out, span))
    return runs


def stage_marks(out: Path) -> list[object]:
    result = json.loads((one_run_dir(out) / "result.json").read_text())
    return [stage["measured_alone"] for v in result["variants"] for stage in v["stages"]]


def report(out: Path) -> str:
    return (one_run_dir(out) / "report.md").read_text()


def test_a_run_whose_tok_s_decides_waits_for_the_other_run_and_both_measure_alone(
    engine: FakeEngine, tmp_path: Path
) -> None:
    a, b = two_runs(engine, tmp_path, BINDS)
    assert not a.server.overlaps(b.server), "the two runs' servers were up at the same time"
    first, second = (a, b) if a.server.start < b.server.start else (b, a)
    assert second.stderr.count("waiting for another specwake run") == 1, second.stderr
    assert waiting_line(first.pid) in second.stderr
    assert "waiting for another" not in first.stderr
    for run in (a, b):
        assert stage_marks(run.out) == [True, True]
        assert "tok/s of every stage measured alone" in report(run.out)


def test_runs_whose_tok_s_decides_nothing_go_side_by_side_and_claim_nothing_alone(
    engine: FakeEngine, tmp_path: Path
) -> None:
    a, b = two_runs(engine, tmp_path, ADVISORY)
    assert a.server.overlaps(b.server), "the runs' servers were not up at the same time"
    for run in (a, b):
        assert "waiting for another" not in run.stderr
        assert stage_marks(run.out) == [None, None]  # alone in its run, not known to be alone on the machine
        assert "measured alone" not in report(run.out)


def queued(cache: Path) -> bool:
    """Whether some run waits in the queue for the exclusive turn."""
    fd = os.open(cache / FOLDER / QUEUE_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_pytest_session_waits_for_the_run_that_holds_the_turn(engine: FakeEngine, tmp_path: Path) -> None:
    path, cache = scenario(engine, tmp_path, BINDS), tmp_path / "cache"
    with machine_turn(cache, True, lambda event: None):  # a run holding the turn: this process
        # `-s -v` shows specwake's progress lines
        args = ["-p", "no:cacheprovider", "-s", "-v", str(path), "--specwake-output", "out"]
        session = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args],
            cwd=tmp_path, env=cli_env(cache, PYTHONPATH=str(REPO)),  # the specwake under test, from any folder
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        until(lambda: queued(cache) or session.poll() is not None, "the pytest session to wait for its turn")
        time.sleep(0.5)
        assert engine.launched() == [], "the pytest session started a server while another run held the turn"
    stdout, _ = session.communicate(timeout=120)
    assert session.returncode == 0, stdout
    assert f"specwake: {waiting_line(os.getpid())}" in stdout, stdout
    assert "s.toml::baseline PASSED" in stdout and len(engine.launched()) == 1


HOLD = """
import sys, time
from pathlib import Path
from specwake.run.session.machine_turn import machine_turn
with machine_turn(Path(sys.argv[1]), sys.argv[2] == "exclusive", print):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("how", ["exclusive", "shared"])
def test_a_run_killed_outright_leaves_nothing_locked(tmp_path: Path, how: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), how], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        holder.kill()
    said: list[object] = []
    t0 = time.monotonic()
    with machine_turn(tmp_path, True, said.append, poll_s=0.01):
        assert time.monotonic() - t0 < 0.5
    assert said == []
