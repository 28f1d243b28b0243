"""Collects the diagnostics that explain an outcome: weight fingerprints and device memory of every rank, at
points of a cycle, through the worker extension. specwake.weights reads what was collected.

Fingerprints are compared with the fresh ones inside the workers: the "after fresh" probe saves each
parameter's checksum there, later probes count the tensors whose checksum differs. A discard that leaves
random values or NaN (like freed GPU memory) is so caught as "not restored", not only one that leaves zeros.
"""

from __future__ import annotations

from typing import Any

from specwake.client import VllmClient
from specwake.errors import ServerFault

FINGERPRINT_METHOD = "specwake_fingerprint"
FRESH = "fresh"  # the name the workers keep the fresh checksums under

# Fingerprints read the weights, so they are taken only where weights are resident: never while a real L2
# sleep has unmapped them (between `sleep` and `wake_weights` on GPU).
FINGERPRINT_POINTS = {"after fresh", "after discard", "after reload_weights", "after push"}
# Memory is safe to read at any point.
MEMORY_POINTS = {
    "before sleep", "after sleep", "after wake_weights", "after reload_weights", "after push", "after wake_kv_cache",
}  # fmt: skip


def point_after(step_name: str) -> str:
    return f"after {step_name}"


def fingerprint_kwargs(point: str) -> dict[str, str]:
    return {"save_as": FRESH} if point == "after fresh" else {"compare_to": FRESH}


def take(client: VllmClient, cycle: int, point: str, *, timeout: float) -> dict[str, Any] | None:
    """Ask every worker for what this point calls for; None when the point needs nothing.

    A failing diagnostic is recorded, never raised: the cycle's own steps decide whether the server is broken.
    """
    wants_fp, wants_mem = point in FINGERPRINT_POINTS, point in MEMORY_POINTS
    if not (wants_fp or wants_mem):
        return None
    entry: dict[str, Any] = {"cycle": cycle, "point": point}
    try:
        if wants_fp:
            kwargs = fingerprint_kwargs(point)
            entry["fingerprints"] = client.rpc_results(FINGERPRINT_METHOD, timeout=timeout, kwargs=kwargs)
        if wants_mem:
            entry["memory"] = client.rpc_results("specwake_memory", timeout=timeout)
    except ServerFault as exc:
        entry["error"] = str(exc)
    return entry
