"""Collects the diagnostics that explain an outcome: weight fingerprints and device memory of every rank, at
points of a cycle, through the worker extension. specwake.judge.weights reads what was collected.

Fingerprints are compared with the fresh ones inside the workers: the "after fresh" probe saves each tensor's
digest, sums and address there, later probes count the tensors that differ (naming how) and those that moved; the
probe after each reload, push or sync keeps its own readings as well, and the probe after the stage that follows
counts the tensors that differ from those: what the stage's forwards changed. A discard that leaves random values
or NaN (like freed GPU memory) is so caught as "not restored", not only one that leaves zeros. Which points read
what follows from the step table (protocol.STEPS): fingerprints only where weights are resident (never between a
real L2 sleep and `wake_weights`), memory around the wake.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwake import protocol
from specwake.errors import RequestFailed, ServerFault
from specwake.results import CheckerReading, Diagnostic
from specwake.run.measure.client import FannedClient, VllmClient


@dataclass(frozen=True)
class Fanout:
    """How every worker's answer reaches specwake. With one engine /collective_rpc returns each worker's; so it does
    from each of several servers of one engine each (server.load_balancing), engine i being server i. With data
    parallelism behind one server it reaches every engine but returns engine 0's alone (vLLM's load-balancing
    client), so each worker also leaves its answer in a fresh folder under `folder` (in the results folder), read
    and removed here."""

    engines: int = 1
    folder: Path | None = None

    def results(
        self, client: VllmClient, method: str, *, timeout: float, kwargs: dict[str, Any] | None = None
    ) -> tuple[list[Any], tuple[int, ...]]:
        """(every worker's answer, engine by engine and rank by rank; their engine indices, () for one engine)."""
        if self.engines == 1:
            return client.rpc_results(method, timeout=timeout, kwargs=kwargs), ()
        if isinstance(client, FannedClient):  # several servers of one engine each: engine i is server i
            each = client.each_rpc(method, timeout=timeout, kwargs=kwargs)
            return [a for found in each for a in found], tuple(e for e, found in enumerate(each) for _ in found)
        if self.folder is None:
            return client.rpc_results(method, timeout=timeout, kwargs=kwargs), ()
        self.folder.mkdir(parents=True, exist_ok=True)
        answers_dir = Path(tempfile.mkdtemp(prefix=f"{method}-", dir=self.folder))
        try:
            client.rpc_results(method, timeout=timeout, kwargs={**(kwargs or {}), "answer_dir": str(answers_dir)})
            left = [json.loads(path.read_text()) for path in answers_dir.glob("*.json")]
        finally:
            shutil.rmtree(answers_dir, ignore_errors=True)
        left.sort(key=lambda a: (int(a["engine"]), int(a["rank"])))
        indices = tuple(int(a["engine"]) for a in left)
        if set(indices) != set(range(self.engines)):
            missing = sorted(set(range(self.engines)) - set(indices))
            raise RequestFailed(f"collective_rpc {method}: no answer from engine(s) {missing} of {self.engines}")
        return [a["answer"] for a in left], indices


def fingerprint_kwargs(point: str, inexact: dict[str, str] | None = None, update: str | None = None) -> dict[str, Any]:
    """The worker's fingerprint arguments at `point`: at `after fresh` keep the readings, and which tensors are
    inexact (the scenario's cycle.inexact_tensors, glob → why); later, compare with them. After a reload, push or
    sync keep the readings too, as the cycle's `restored` ones; after the stage that follows, compare with those as
    well: what the stage's own forwards changed. Before a push or sync keep the readings as `updating`; after each
    model's update (`update`: the model it addresses) compare with them, what the update changed, and keep the new
    ones for the next update."""
    if point == protocol.FRESH_POINT:
        return {"save_as": protocol.FRESH} | ({"inexact_tensors": inexact} if inexact else {})
    if point == protocol.BEFORE_UPDATE:
        return {"compare_to": protocol.FRESH, "save_as": protocol.UPDATING}
    if point == protocol.UPDATE_POINT:
        return {"compare_to": protocol.FRESH, "save_as": protocol.UPDATING, "changed_since": protocol.UPDATING}
    if point in protocol.RESTORE_POINTS and update:
        return {"compare_to": protocol.FRESH, "save_as": protocol.RESTORED, "changed_since": protocol.UPDATING}
    if point in protocol.RESTORE_POINTS:
        return {"compare_to": protocol.FRESH, "save_as": protocol.RESTORED}
    if point == protocol.STAGE_POINT:
        return {"compare_to": protocol.FRESH, "changed_since": protocol.RESTORED}
    return {"compare_to": protocol.FRESH}


def take(
    client: VllmClient,
    cycle: int,
    point: str,
    *,
    timeout: float,
    fanout: Fanout = Fanout(),
    inexact: dict[str, str] | None = None,
    update: str | None = None,
) -> Diagnostic | None:
    """Ask every worker for what this point calls for; None when the point needs nothing. `inexact`: the scenario's
    cycle.inexact_tensors; `update`: the model the push or sync session that ends at this point addresses.

    A failing diagnostic is recorded, never raised: the cycle's own steps decide whether the server is broken.
    """
    wants_fp, wants_mem = point in protocol.FINGERPRINT_POINTS, point in protocol.MEMORY_POINTS
    if not (wants_fp or wants_mem):
        return None
    answers: dict[str, Any] = {"cycle": cycle, "point": point} | ({"update": update} if update else {})
    try:
        if wants_fp:
            kwargs = fingerprint_kwargs(point, inexact, update)
            found, engines = fanout.results(client, protocol.FINGERPRINT, timeout=timeout, kwargs=kwargs)
            answers |= {"fingerprints": found, "engines": list(engines)}
        if wants_mem:
            answers["memory"], engines = fanout.results(client, protocol.MEMORY, timeout=timeout)
            answers["engines"] = list(engines)
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
