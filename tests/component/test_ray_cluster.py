"""specwake.run.server.raycluster against a fake of Ray's API (tests/helpers/fake_ray, real subprocesses): after a
server with vLLM's Ray executor stops, specwake waits until the user's cluster counts every GPU free, joins the cluster
and never starts one, and says so when no cluster answers or its GPUs stay in use."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from specwake.run.server.raycluster import cluster_gpus, wait_until_free
from tests.helpers.paths import REPO

FAKE_RAY = REPO / "tests" / "helpers" / "fake_ray"


def cluster(tmp_path: Path, total: int, busy_probes: int) -> dict[str, str]:
    state = tmp_path / "ray.json"
    state.write_text(json.dumps({"total": total, "busy_probes": busy_probes}))
    return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(FAKE_RAY), "FAKE_RAY_STATE": str(state)}


def probes(env: dict[str, str]) -> int:
    return int(json.loads(Path(env["FAKE_RAY_STATE"]).read_text())["probes"])


def test_the_wait_lasts_until_every_gpu_of_the_cluster_is_free(tmp_path: Path) -> None:
    env = cluster(tmp_path, total=8, busy_probes=2)
    line = wait_until_free(sys.executable, env, timeout_s=60, poll_s=0.0)
    assert line.startswith("Ray cluster: 8 of 8 GPUs free after") and probes(env) == 3


def test_gpus_still_in_use_at_the_deadline_are_said(tmp_path: Path) -> None:
    env = cluster(tmp_path, total=8, busy_probes=1000)
    line = wait_until_free(sys.executable, env, timeout_s=0.0, poll_s=0.0)
    assert line.startswith("Ray cluster: still 4 of 8 GPUs in use") and probes(env) == 1


def test_without_a_cluster_there_is_nothing_to_wait_for(tmp_path: Path) -> None:
    env = cluster(tmp_path, total=8, busy_probes=0)
    del env["FAKE_RAY_STATE"]  # Ray's own init(address="auto") raises ConnectionError then
    assert cluster_gpus(sys.executable, env) is None
    assert (
        wait_until_free(sys.executable, env, timeout_s=60, poll_s=0.0) == "no Ray cluster answers: nothing to wait for"
    )
    assert cluster_gpus(sys.executable, {"PATH": os.environ.get("PATH", "")}) is None  # no Ray installed: the same
