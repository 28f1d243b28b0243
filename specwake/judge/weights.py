"""Pure readings of the diagnostics a run recorded (see specwake.run.measure.diagnose): whether target and drafter match
their fresh fingerprints after every reload or push, whether they stayed so through the measured stage that follows,
whether each model's push or sync session landed on the model it addresses, and which tensors moved to new storage. The
one-line summaries the report shows ("draft: 6/11 tensors differ from fresh after reload_weights in cycle 2; …") are
specwake.report.weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specwake.protocol import BEFORE_UPDATE, RESTORE_POINTS, ROLES, STAGE_POINT, Fingerprint
from specwake.results import Diagnostic

KIND_WORDS = {"parameter": "parameters", "buffer": "buffers", "attribute": "tensor attributes"}
GRAPH_HAZARD = "a CUDA graph captured before the sleep reads the old memory"


def at(diagnostics: Sequence[Diagnostic], point: str, cycle: int | None = None) -> Diagnostic | None:
    """The first diagnostic taken at `point` (of `cycle`, when given)."""
    return next((d for d in diagnostics if d.point == point and (cycle is None or d.cycle == cycle)), None)


def kinds_text(counts: dict[str, int]) -> str:
    """`5 parameters, 2 tensor attributes` from {"parameter": 5, "buffer": 0, "attribute": 2}; "" when empty."""
    return ", ".join(f"{int(n)} {KIND_WORDS.get(k, k)}" for k, n in counts.items() if isinstance(n, int) and n)


@dataclass(frozen=True)
class Restore:
    """One model's fingerprint after one reload or push: every rank's part."""

    role: str
    cycle: int
    point: str
    parts: tuple[Fingerprint | None, ...]
    ranks: tuple[str, ...] = ()  # each part's rank, `rank 0` or `engine 1 rank 0` (Diagnostic.rank_names)

    @property
    def what(self) -> str:
        return self.point.removeprefix("after ")

    @property
    def judged(self) -> bool:
        """Some rank compared this model with fresh."""
        return any(p is not None and p.compares for p in self.parts)

    @property
    def not_restored(self) -> int:
        return sum(p.not_restored for p in self.parts if p is not None)


def restores(diagnostics: Sequence[Diagnostic], role: str) -> list[Restore]:
    """`role`'s fingerprints after every reload or push, in cycle order."""
    taken = (d for d in diagnostics if d.point in RESTORE_POINTS and d.fingerprints)
    return [Restore(role, d.cycle, d.point, d.parts(role), tuple(d.rank_names())) for d in taken]


def target_params_differ(diagnostic: Diagnostic) -> int | None:
    """Target parameters specwake's fingerprint found not back as fresh at this point, over every rank."""
    parts = diagnostic.parts("target")
    if not parts or any(p is None or not p.compares for p in parts):
        return None
    return sum(p.differ_by_kind.get("parameter", 0) + p.packed_discarded for p in parts if p is not None)


def restored(diagnostics: Sequence[Diagnostic], role: str) -> bool | None:
    """Whether every rank's `role` matched its fresh fingerprint after every reload or push; None if unknown."""
    judged = [r for r in restores(diagnostics, role) if r.judged]
    if not judged:
        return None
    return all(r.not_restored == 0 for r in judged)


def worst_restore(diagnostics: Sequence[Diagnostic], role: str) -> Restore | None:
    """The reload or push after which `role` was furthest from fresh (the first such cycle), if any was not."""
    worst = max(restores(diagnostics, role), key=lambda r: (r.not_restored, -r.cycle), default=None)
    return worst if worst is not None and worst.not_restored else None


@dataclass(frozen=True)
class Change:
    """One model's tensors that a measured stage changed: after the stage of `cycle`, those that differ from the
    fingerprint taken right after the cycle's reload, push or sync (`since`, its point), on the rank with the most."""

    role: str
    cycle: int
    since: str
    part: Fingerprint

    @property
    def count(self) -> int:
        return self.part.changed or 0

    @property
    def what(self) -> str:
        return self.since.removeprefix("after ")


def stage_changes(diagnostics: Sequence[Diagnostic], role: str) -> list[Change]:
    """`role`'s changes during every measured stage that changed any of its tensors, in cycle order."""
    found = []
    for taken in (d for d in diagnostics if d.point == STAGE_POINT):
        parts = [p for p in taken.parts(role) if p is not None and p.changed]
        if parts:
            since = next((d.point for d in diagnostics if d.point in RESTORE_POINTS and d.cycle == taken.cycle), "")
            found.append(Change(role, taken.cycle, since, max(parts, key=lambda p: p.changed or 0)))
    return sorted(found, key=lambda c: c.cycle)


def stage_parts(diagnostics: Sequence[Diagnostic], role: str) -> list[tuple[int, Fingerprint]]:
    """(cycle, fingerprint) of every rank's `role` after every measured stage that was compared with its cycle's
    restore (none where nothing was fingerprinted after the restore, and in results from before)."""
    taken = [(d.cycle, d.parts(role)) for d in diagnostics if d.point == STAGE_POINT]
    return [(cycle, p) for cycle, parts in taken for p in parts if p is not None and p.changed is not None]


def held(diagnostics: Sequence[Diagnostic], role: str) -> bool | None:
    """Whether every rank's `role` stayed through every measured stage as the cycle's reload, push or sync left it;
    None where no stage was compared with that."""
    compared = stage_parts(diagnostics, role)
    return all(p.changed == 0 for _, p in compared) if compared else None


@dataclass(frozen=True)
class Misroute:
    """One model's push or sync session that did not land as addressed: after the update of `update` (the model it
    addresses) in `cycle`, `role` changed though the update was not for it (`stray`), or, the model it addresses,
    changed in none of its tensors though they differed from fresh before it (an update that sent nothing, or sent it
    elsewhere). `part`: the rank with the most changed (stray) or the first rank (nothing landed)."""

    role: str
    update: str
    cycle: int
    part: Fingerprint
    before: int = 0  # the tensors of `role` that differed from fresh before the update (nothing landed), all ranks

    @property
    def stray(self) -> bool:
        return self.role != self.update


def misroutes(diagnostics: Sequence[Diagnostic], role: str) -> list[Misroute]:
    """Every push or sync session of every cycle that did not land on `role` as it should: one not addressed to `role`
    that changed any of its tensors (a draft publish routed to the target; a target update written into the drafter
    too), or one addressed to `role` that changed none of them while `role` differed from fresh before it (an empty
    session). Compared on every rank with the readings right before that update (BEFORE_UPDATE, or the previous
    update's); in cycle order."""
    found = []
    before: dict[int, Diagnostic] = {}  # cycle → the reading right before the next update
    for taken in diagnostics:
        if taken.point == BEFORE_UPDATE:
            before[taken.cycle] = taken
        if taken.update is None:
            continue
        parts = [p for p in taken.parts(role) if p is not None and p.changed is not None]
        previous = before.get(taken.cycle)
        before[taken.cycle] = taken
        if not parts:
            continue
        if taken.update != role:
            changed = [p for p in parts if p.changed_own]
            if changed:
                found.append(Misroute(role, taken.update, taken.cycle, max(changed, key=lambda p: p.changed_own)))
            continue
        earlier = [p for p in previous.parts(role) if p is not None] if previous is not None else []
        if sum(p.not_restored for p in earlier) and all(p.changed_own == 0 for p in parts):
            found.append(Misroute(role, taken.update, taken.cycle, parts[0], sum(p.differ or 0 for p in earlier)))
    return found


def landed(diagnostics: Sequence[Diagnostic], role: str) -> bool | None:
    """Whether every push or sync session landed on `role` as addressed (misroutes); None where no update was
    compared with the readings before it (a reload, and results from before)."""
    compared = [d for d in diagnostics if d.update is not None and any(
        p is not None and p.changed is not None for p in d.parts(role))]  # fmt: skip
    return not misroutes(diagnostics, role) if compared else None


@dataclass(frozen=True)
class Moved:
    """Tensors of one model at a new address after a reload or push, on the rank with the most."""

    role: str
    cycle: int
    point: str
    count: int
    by_kind: dict[str, int]
    names: tuple[str, ...]

    def finding(self) -> str:
        kinds = kinds_text(self.by_kind)
        names = ", ".join(self.names) + ("…" if self.count > len(self.names) else "")
        detail = "; ".join(part for part in (kinds, names) if part)
        what = self.point.removeprefix("after ")
        return (
            f"{self.role}: {self.count} tensor{'s' if self.count != 1 else ''} in new storage after {what} in cycle "
            f"{self.cycle} ({detail}): {GRAPH_HAZARD}"
        )


def moved(diagnostics: Sequence[Diagnostic]) -> list[Moved]:
    """Per model, the first reload or push after which tensors sat at another address than when fresh."""
    found = []
    for role in ROLES:
        for r in restores(diagnostics, role):
            parts = [p for p in r.parts if p is not None and p.moved]
            if parts:
                top = max(parts, key=lambda p: p.moved or 0)
                names = tuple(str(n) for n in top.moved_names)
                found.append(Moved(role, r.cycle, r.point, top.moved or 0, dict(top.moved_by_kind), names))
                break
    return found
