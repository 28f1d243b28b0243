"""A Ray cluster the user brings, for servers with vLLM's Ray executor (`--distributed-executor-backend ray`).

specwake never starts or stops the cluster: a server's process group holds vLLM's driver only, and Ray's workers live
in the cluster's own processes. Once a server is stopped, Ray frees its actors and their GPUs on its own time, so
before the next server starts specwake waits until the cluster counts every GPU free again. It asks Ray in the
server's interpreter (the CLI never imports Ray or vLLM): `ray.init(address="auto")` joins the running cluster, or
fails where none runs (a Ray the server started itself went with its process group: nothing to wait for).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Run in the server's interpreter: joins the running cluster, never starts one (address="auto" fails without one).
PROBE = (
    "import json, ray\n"
    "ray.init(address='auto', logging_level='ERROR', log_to_driver=False)\n"
    "print(json.dumps({'total': ray.cluster_resources().get('GPU', 0),"
    " 'free': ray.available_resources().get('GPU', 0)}))\n"
    "ray.shutdown()\n"
)
PROBE_TIMEOUT_S = 60.0
POLL_S = 2.0


@dataclass(frozen=True)
class ClusterGpus:
    total: float
    free: float


def cluster_gpus(python: str, env: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> ClusterGpus | None:
    """The running cluster's GPUs, all and free; None where no cluster answers (or Ray is not installed)."""
    try:
        done = subprocess.run(
            [python, "-c", PROBE], env=dict(env), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    try:
        found = json.loads(lines[-1])
        return ClusterGpus(float(found["total"]), float(found["free"]))
    except (ValueError, KeyError, TypeError):
        return None


def wait_until_free(
    python: str,
    env: Mapping[str, str],
    timeout_s: float,
    *,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Wait until the cluster has every GPU free; a line saying what was seen (for the run's events)."""
    deadline = clock() + timeout_s
    started = clock()
    while True:
        gpus = cluster_gpus(python, env)
        if gpus is None:
            return "no Ray cluster answers: nothing to wait for"
        if gpus.free >= gpus.total:
            return f"Ray cluster: {gpus.free:g} of {gpus.total:g} GPUs free after {clock() - started:.1f} s"
        if clock() >= deadline:
            return (
                f"Ray cluster: still {gpus.total - gpus.free:g} of {gpus.total:g} GPUs in use {timeout_s:g} s after"
                " the server stopped; the next server may not find them free"
            )
        sleep(poll_s)
