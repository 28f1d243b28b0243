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
from specwake.results import CheckerReading, Diagnostic
from specwake.run.client import VllmClient


def fingerprint_kwargs(point: str) -> dict[str, str]:
    return {"save_as": protocol.FRESH} if point == protocol.FRESH_POINT else {"compare_to": protocol.FRESH}


def take(client: VllmClient, cycle: int, point: str, *, timeout: float) -> Diagnostic | None:
    """Ask every worker for what this point calls for; None when the point needs nothing.

    A failing diagnostic is recorded, never raised: the cycle's own steps decide whether the server is broken.
    """
    wants_fp, wants_mem = point in protocol.FINGERPRINT_POINTS, point in protocol.MEMORY_POINTS
    if not (wants_fp or wants_mem):
        return None
    answers: dict[str, Any] = {"cycle": cycle, "point": point}
    try:
        if wants_fp:
            kwargs = fingerprint_kwargs(point)
            answers["fingerprints"] = client.rpc_results(protocol.FINGERPRINT, timeout=timeout, kwargs=kwargs)
        if wants_mem:
            answers["memory"] = client.rpc_results(protocol.MEMORY, timeout=timeout)
    except ServerFault as exc:
        answers["error"] = str(exc)
    return Diagnostic.from_dict(answers)


# -- vLLM's own /weight_checker (vLLM >= 0.32): SHA-256 of every target parameter, a second opinion after a sync -------

CHECKER = "/weight_checker"
CHECKER_NAMES_KEPT = 5


def checker_baseline(client: VllmClient, *, timeout: float) -> tuple[dict[str, str] | None, CheckerReading]:
    """The target's parameter checksums by vLLM's /weight_checker, and what to record of them (the checksums
    themselves stay in memory: thousands of names on a real model)."""
    try:
        answer = client.request("POST", CHECKER, json={"action": "checksum"}, timeout=timeout)
    except ServerFault as exc:
        return None, CheckerReading(error=str(exc))
    sums = answer.body.get("checksums") if answer.ok and isinstance(answer.body, dict) else None
    if not isinstance(sums, dict):
        return None, CheckerReading(offered=False, status=answer.status)
    return sums, CheckerReading(offered=True, parameters=len(sums))


def checker_compare(client: VllmClient, baseline: dict[str, str], *, timeout: float) -> CheckerReading:
    """vLLM's comparison of the target's parameters now with `baseline`: match, and which names differ."""
    try:
        answer = client.request("POST", CHECKER, json={"action": "compare", "baseline": baseline}, timeout=timeout)
    except ServerFault as exc:
        return CheckerReading(error=str(exc))
    body = answer.body if isinstance(answer.body, dict) else {}
    if not answer.ok or "match" not in body:
        return CheckerReading(error=f"HTTP {answer.status}: {body or answer.body!r}"[:300])
    names = tuple(str(n) for n in body.get("mismatches") or [])
    kept = names[:CHECKER_NAMES_KEPT]
    return CheckerReading(match=bool(body["match"]), mismatches=len(names), names=kept, parameters=len(baseline))
