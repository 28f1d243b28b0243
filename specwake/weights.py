"""Pure readings of the diagnostics a run recorded (see specwake.diagnose): whether target and drafter weights
match their fresh checksums after reload_weights, and the one-line summaries the report shows
("draft: 6/11 tensors differ from fresh after reload_weights", "device memory: …").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GIB = 1024**3
RESTORE_POINTS = ("after reload_weights", "after push")  # where weights should be back
ROLES = ("target", "draft")


def _at(diagnostics: Sequence[dict[str, Any]], point: str, cycle: int | None = None) -> dict[str, Any] | None:
    for entry in diagnostics:
        if entry.get("point") == point and (cycle is None or entry.get("cycle") == cycle):
            return entry
    return None


def _role(fingerprint: Any, role: str) -> dict[str, Any] | None:
    part = fingerprint.get(role) if isinstance(fingerprint, dict) else None
    return part if isinstance(part, dict) and part.get("present", True) else None


def _rank_text(part: dict[str, Any]) -> tuple[str, str]:
    """(the count phrase, the notes) of one rank's fingerprint of one model."""
    tensors = int(part.get("tensors", 0))
    if "differ" in part:
        count = f"{int(part['differ'])}/{int(part.get('compared', tensors))} tensors differ from fresh"
        if part.get("packed"):
            count += (
                f", {int(part.get('packed_discarded', 0))}/{int(part['packed'])} packed CPU weights still discarded"
            )
    else:  # result files written before checksums were compared
        count = f"{int(part.get('all_zero', 0)) + int(part.get('on_meta', 0))}/{tensors} parameters all-zero or on meta"
    notes = []
    if part.get("nonfinite"):
        notes.append(f"{part['nonfinite']} hold NaN/inf")
    if part.get("on_meta") and "differ" in part:
        notes.append(f"{part['on_meta']} on meta")
    if part.get("shared_with_target"):
        notes.append(f"{part['shared_with_target']} shared with the target")
    if part.get("empty"):
        notes.append(f"{part['empty']} empty parameters: weights the backend keeps packed")
    return count, "; ".join(notes)


def weights_line(diagnostics: Sequence[dict[str, Any]], role: str) -> str | None:
    """`draft: 6/11 tensors differ from fresh after reload_weights (…)` from the first cycle; per rank when
    ranks differ; None when no fingerprint was taken there."""
    entry = next((e for e in diagnostics if e.get("point") in RESTORE_POINTS), None)
    point = str(entry.get("point")) if entry is not None else ""
    if entry is None or not entry.get("fingerprints"):
        return None
    parts = [_role(fp, role) for fp in entry["fingerprints"]]
    if any(part is None for part in parts):
        return f"{role}: no separate drafter parameters found" if role == "draft" else None
    texts = [_rank_text(part) for part in parts if part is not None]
    what = point.removeprefix("after ")
    if len(set(texts)) == 1:
        count, notes = texts[0]
        return f"{role}: {count} after {what}" + (f" ({notes})" if notes else "")
    ranks = ", ".join(f"rank {r}: {count}" for r, (count, _) in enumerate(texts))
    return f"{role} after {what}: {ranks}"


def restored(diagnostics: Sequence[dict[str, Any]], role: str) -> bool | None:
    """Whether every rank's `role` matched its fresh checksums after every reload_weights; None if unknown."""
    seen = False
    for entry in diagnostics:
        if entry.get("point") not in RESTORE_POINTS:
            continue
        for fp in entry.get("fingerprints") or []:
            part = _role(fp, role)
            if part is None or "differ" not in part:
                continue
            seen = True
            if part["differ"] or part.get("on_meta") or part.get("packed_discarded"):
                return False
    return True if seen else None


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
