"""Collects the diagnostics that explain an outcome: weight fingerprints and device memory of every rank, at
points of a cycle, through the worker extension. specwake.judge.weights reads what was collected.

Fingerprints are compared with the fresh ones inside the workers: the "after fresh" probe saves each tensor's
checksum and address there, later probes count the tensors that differ and those that moved. A discard that leaves
random values or NaN (like freed GPU memory) is so caught as "not restored", not only one that leaves zeros. Which
points read what follows from the step table (protocol.STEPS): fingerprints only where weights are resident (never
between a real L2 sleep and `wake_weights`), memory around the wake.
"""

from __future__ import annotations

from typing import Any

from specwake import protocol
from specwake.errors import ServerFault
from specwake.run.client import VllmClient


def fingerprint_kwargs(point: str) -> dict[str, str]:
    return {"save_as": protocol.FRESH} if point == protocol.FRESH_POINT else {"compare_to": protocol.FRESH}


def take(client: VllmClient, cycle: int, point: str, *, timeout: float) -> dict[str, Any] | None:
    """Ask every worker for what this point calls for; None when the point needs nothing.

    A failing diagnostic is recorded, never raised: the cycle's own steps decide whether the server is broken.
    """
    wants_fp, wants_mem = point in protocol.FINGERPRINT_POINTS, point in protocol.MEMORY_POINTS
    if not (wants_fp or wants_mem):
        return None
    entry: dict[str, Any] = {"cycle": cycle, "point": point}
    try:
        if wants_fp:
            kwargs = fingerprint_kwargs(point)
            entry["fingerprints"] = client.rpc_results(protocol.FINGERPRINT, timeout=timeout, kwargs=kwargs)
        if wants_mem:
            entry["memory"] = client.rpc_results(protocol.MEMORY, timeout=timeout)
    except ServerFault as exc:
        entry["error"] = str(exc)
    return entry
