"""Real vLLM CPU: Ctrl-C during a run stops every server and keeps what was measured; --resume finishes it.

specwake is interrupted while the patched variant is being measured (the baseline is complete by then); the
resumed run must keep the baseline as it was and measure only the patched variant.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from specwake.runfolder import load_result
from tests.helpers.paths import REPO
from tests.helpers.procs import SERVER_MARK, launch_env, processes_with_env, require_module

require_module("vllm")

PATCHED_MEASURING_S = 600  # the baseline started and measured, then the patched server started
INTERRUPTED_S = 60  # Ctrl-C to exit: every server stopped, the partial result saved
RESUMED_S = 900  # the patched variant started and measured again
# pytest-timeout must not fire before the test's own limits, each with its own message
pytestmark = pytest.mark.timeout(PATCHED_MEASURING_S + INTERRUPTED_S + RESUMED_S + 120)


def live_with_marker(value: str) -> list[tuple[int, str]]:
    return processes_with_env(SERVER_MARK, value)


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def patched_measuring(out: Path) -> Path | None:
    for path in out.glob("*/result.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        patched = [v for v in data.get("variants", []) if v["name"] == "patched"]
        if patched and patched[0]["stages"]:
            return path.parent
    return None


def test_interrupt_then_resume(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    env = {**launch_env(), SERVER_MARK: mark}
    # --sequential: the baseline is complete by the time the patched variant measures (side by side, either
    # may measure first).
    argv = [
        sys.executable,
        "-m",
        "specwake.cli",
        "run",
        "scenarios/tiny-cpu.toml",
        "--cycles",
        "1",
        "--quiet",
        "--sequential",
        "--model-runner",  # resuming is the runner's business nowhere; V1 costs a quarter of V2 per token on CPU
        "v1",
    ]
    proc = subprocess.Popen([*argv, "--output", str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        run_dir = wait_for(lambda: patched_measuring(tmp_path), PATCHED_MEASURING_S, "the patched variant to measure")
        proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        _, stderr = proc.communicate(timeout=INTERRUPTED_S)
        wait_for(lambda: not live_with_marker(mark), max(1.0, 10 - (time.monotonic() - signalled)), "servers to go")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted" in stderr
    partial = load_result(run_dir)
    assert partial.complete is False
    outcomes = {v.name: v.outcome for v in partial.variants}
    assert outcomes["baseline"] == "collapse" and outcomes["patched"] == "incomplete"
    baseline_before = next(v for v in partial.variants if v.name == "baseline")

    resumed = subprocess.run([*argv, "--resume", str(run_dir)], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=RESUMED_S)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert not live_with_marker(mark)
    final = load_result(run_dir)
    assert final.complete is True and final.verdict == "pass"
    assert final.started_at == partial.started_at
    baseline_after = next(v for v in final.variants if v.name == "baseline")
    assert baseline_after == baseline_before  # kept as measured, not re-run
    patched = next(v for v in final.variants if v.name == "patched")
    assert patched.outcome == "recover" and [s.name for s in patched.stages] == ["fresh", "after L2 #1"]
    assert [w["started"] for w in patched.info["workers"]] == ["fork"]  # as in a run from a shell (launch_env)
    launches = (run_dir / "logs" / "baseline.log").read_text().count("# specwake: server start")
    assert launches == 1  # the baseline server was not started again
