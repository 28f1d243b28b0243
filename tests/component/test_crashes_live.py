"""Tests of specwake.judge.crashes: unit tests over log excerpts in tests/data/logs (written for these tests in
vLLM's format) with false-positive traps, and two component tests against tests/helpers/fake_server.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from specwake.errors import ServerFault
from specwake.judge.crashes import (
    classify,
)
from specwake.run.measure.client import VllmClient
from specwake.run.measure.completions import Completer
from specwake.run.measure.cycle import run_cycle
from specwake.run.server.server import Server, ServerSpec, free_port
from tests.helpers.paths import DATA, FAKE_SERVER
from tests.helpers.procs import running

LOGS = DATA / "logs"
AFTER_CYCLE = "cycle 1 reload_weights"


# ------------------------------------------------------------------ first_matching_lines


# ------------------------------------------------------------------ the patterns, line by line


# ------------------------------------------------------------------ which part of the log counts


# ------------------------------------------------------------------ classify over whole excerpts


# ------------------------------------------------------------------ component: fake server, real cycle code


def fake_server(tmp_path: Path, mode: str) -> Server:
    port = free_port()
    spec = ServerSpec(
        argv=[sys.executable, str(FAKE_SERVER), "--port", str(port), "--mode", mode, "--model", "tiny"],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
        port=port,
        log_path=tmp_path / "server.log",
        startup_timeout_s=20.0,
    )
    return Server(spec, poll_interval_s=0.05)


def cycle_fault(server: Server) -> tuple[str, ServerFault | None]:
    """Run one emulated L2 cycle against ``server``; return the name of the last step and its fault."""
    client = VllmClient(httpx.Client(base_url=server.base_url, trust_env=False))
    steps, fault = run_cycle(client, 1, level=2, emulate_discard=True, step_timeout_s=10.0)
    return steps[-1].name, fault


@pytest.mark.usefixtures("leak_check")
def test_fake_oom_on_wake_is_cuda_oom(tmp_path: Path) -> None:
    with running(fake_server(tmp_path, "oom-on-wake")) as server:
        step, fault = cycle_fault(server)
        assert step == "wake_kv_cache" and fault is not None
        crash = classify(
            fault_class=fault.crash_class,
            log_text=server.spec.log_path.read_text(),
            phase=f"cycle 1 {step}",
            server_alive=server.alive(),
            message=str(fault),
        )
    assert crash.cls == "cuda_oom"
    assert crash.lines[0].endswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.87 GiB.")


@pytest.mark.usefixtures("leak_check")
def test_fake_engine_death_is_engine_dead(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "engine-dead-after-discard")
    with running(server):
        step, fault = cycle_fault(server)
        assert fault is None and step == "reset_prefix_cache"
        http = httpx.Client(base_url=server.base_url, trust_env=False)
        with pytest.raises(ServerFault) as info:
            Completer(http).complete(
                model="tiny", prompt="hi", max_tokens=4, temperature=0, ignore_eos=True, timeout=10
            )
        assert not answers_health(http)
    crash = classify(
        fault_class=info.value.crash_class,
        log_text=server.spec.log_path.read_text(),  # read after the stop, as a runner may
        phase="after L2 #1",
        server_alive=True,
        message=str(info.value),
    )
    assert crash.cls == "engine_dead"
    assert "Worker proc VllmWorker-0 died unexpectedly" in crash.lines[0]
    assert "EngineDeadError" in crash.lines[1]


def answers_health(http: httpx.Client) -> bool:
    try:
        return http.get("/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
