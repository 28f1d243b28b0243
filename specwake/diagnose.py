"""Diagnostics that explain a collapse: weight fingerprints and device memory per rank at points of a cycle,
and the one-line summaries the report shows ("draft: 7/15 parameters all-zero after reload_weights").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specwake.client import VllmClient
from specwake.errors import ServerFault

GIB = 1024**3

# Fingerprints read the weights, so they are taken only where weights are resident: never while a real L2
# sleep has unmapped them (between `sleep` and `wake_weights` on GPU).
FINGERPRINT_POINTS = {"after fresh", "after discard", "after reload_weights"}
# Memory is safe to read at any point.
MEMORY_POINTS = {"before sleep", "after sleep", "after wake_weights", "after reload_weights", "after wake_kv_cache"}


def point_after(step_name: str) -> str:
    return f"after {step_name}"


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
            entry["fingerprints"] = client.rpc_results("specwake_fingerprint", timeout=timeout)
        if wants_mem:
            entry["memory"] = client.rpc_results("specwake_memory", timeout=timeout)
    except ServerFault as exc:
        entry["error"] = str(exc)
    return entry


def _at(diagnostics: Sequence[dict[str, Any]], point: str, cycle: int | None = None) -> dict[str, Any] | None:
    for entry in diagnostics:
        if entry.get("point") == point and (cycle is None or entry.get("cycle") == cycle):
            return entry
    return None


def draft_zero_line(diagnostics: Sequence[dict[str, Any]]) -> str | None:
    """`draft: 7/15 parameters all-zero after reload_weights` (per rank when ranks differ), from the first cycle."""
    entry = _at(diagnostics, "after reload_weights")
    if entry is None or not entry.get("fingerprints"):
        return None
    per_rank = []
    empty = 0
    for fp in entry["fingerprints"]:
        draft = fp.get("draft") if isinstance(fp, dict) else None
        if not draft or not draft.get("present", True):
            return "draft: no separate drafter parameters found"
        per_rank.append((int(draft.get("all_zero", 0)) + int(draft.get("on_meta", 0)), int(draft.get("tensors", 0))))
        empty = int(draft.get("empty", 0))
    if len(set(per_rank)) == 1:
        bad, total = per_rank[0]
        note = f" ({empty} empty: weights the backend keeps outside parameters)" if empty else ""
        return f"draft: {bad}/{total} parameters all-zero or on meta after reload_weights{note}"
    ranks = ", ".join(f"rank {r}: {bad}/{total}" for r, (bad, total) in enumerate(per_rank))
    return f"draft parameters all-zero or on meta after reload_weights: {ranks}"


def _free(entry: dict[str, Any] | None) -> list[int | None]:
    if entry is None:
        return []
    return [m.get("free_bytes") if isinstance(m, dict) else None for m in entry.get("memory") or []]


def memory_line(diagnostics: Sequence[dict[str, Any]], cycle: int = 1) -> str:
    """GiB freed by sleep and restored by wake, per rank, for one cycle; `n/a` where no device memory exists."""
    before = _free(_at(diagnostics, "before sleep", cycle))
    asleep = _free(_at(diagnostics, "after sleep", cycle))
    awake = _free(_at(diagnostics, "after wake_kv_cache", cycle))
    if not before or any(v is None for v in before + asleep + awake) or not asleep or not awake:
        return "device memory: n/a (no accelerator memory reported)"
    parts = []
    for rank, (b, s, w) in enumerate(zip(before, asleep, awake, strict=False)):
        assert b is not None and s is not None and w is not None
        parts.append(f"rank {rank}: {(s - b) / GIB:.2f} GiB freed by sleep, {(s - w) / GIB:.2f} GiB restored by wake")
    return "device memory: " + "; ".join(parts)
