"""The one-line summaries of the workers' diagnostics that the report shows: how far each model is from fresh after
every reload or push, and which tensors differ how ("draft: 2/11 tensors differ from fresh after reload_weights in
cycle 2; … — model.norm.weight, model.fc.weight: other values"), what the measured stages changed of what the reload
left ("draft: 1/24 tensors changed during the stage after L2 #1 (cycle 1), since reload_weights — …"), whether each
push or sync session landed on the model it addresses ("target: 9/24 tensors changed by the draft session of cycle 1,
which addresses the drafter alone — …"), parameters no load writes, vLLM's own /weight_checker, what the emulated
discard took, and device memory. Whether a model was restored is judge's reading (specwake.judge.weights); these only
say it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from specwake.judge.weights import (
    Change,
    Misroute,
    Restore,
    at,
    kinds_text,
    misroutes,
    restores,
    stage_changes,
    stage_parts,
    target_params_differ,
)
from specwake.protocol import (
    AWAKE_POINT,
    BEFORE_SLEEP,
    FRESH_POINT,
    GONE,
    REARRANGED,
    RESTORE_POINTS,
    SIGNS,
    SLEEP,
    VALUES,
    DiscardAnswer,
    Fingerprint,
    rules_name,
)
from specwake.results import CheckerReading, Diagnostic, StageResult

GIB = 1024**3
NAMES_SHOWN = 3  # differing tensors a line names, then "and N more"
HOW_WORDS = {
    REARRANGED: "same values in other places",
    SIGNS: "signs changed",
    VALUES: "other values",
    GONE: "no data (on meta or emptied)",
}


def differ_text(part: Fingerprint) -> str:
    """The tensors one rank's fingerprint found differing from fresh, the first few with how they differ:
    `model.layers.0.mlp.down_proj.weight: signs changed`, `a, b, c and 2 more: other values`, `a (signs changed),
    b (other values) and 1 more`; names alone from an older specwake, which did not say how; "" when none differ."""
    return _names_text(part.differ or 0, part.differ_names, part.differ_how, part.differ_by_how)


def _names_text(count: int, names: list[str], how: dict[str, str], by_how: dict[str, int]) -> str:
    """`differ_text` of any comparison: `count` tensors differ, the first of them `names`, each `how`."""
    shown = names[:NAMES_SHOWN]
    if not count or not shown:
        return ""
    more = f" and {count - len(shown)} more" if count > len(shown) else ""
    if not how:
        return ", ".join(shown) + more
    kinds = [h for h, n in by_how.items() if n] or [how.get(n, "") for n in shown]
    if len(set(kinds)) == 1:
        return f"{', '.join(shown)}{more}: {HOW_WORDS.get(kinds[0], kinds[0])}"
    named = [f"{n} ({HOW_WORDS.get(how.get(n, ''), how.get(n, '?'))})" for n in shown]
    return ", ".join(named) + more


def stage_of(stages: Sequence[StageResult], cycle: int) -> str:
    """The name of the stage measured after `cycle` (`after L2 #1`), as its result has it."""
    return next((s.name for s in stages if s.cycle == cycle), f"after cycle {cycle}")


def change_text(change: Change, stages: Sequence[StageResult]) -> str:
    """`draft: 1/24 tensors changed during the stage after L2 #1 (cycle 1), since reload_weights — model.norm.weight:
    other values`: what a measured stage's forwards changed of what the cycle's reload, push or sync left."""
    part = change.part
    names = _names_text(change.count, part.changed_names, part.changed_how, Counter(part.changed_how.values()))
    since = f", since {change.what}" if change.what else ""
    total = sum(part.kinds.values()) or part.tensors
    return (
        f"{change.role}: {change.count}/{total} tensors changed during the stage {stage_of(stages, change.cycle)}"
        f" (cycle {change.cycle}){since}" + (f" — {names}" if names else "")
    )


def changes_line(diagnostics: Sequence[Diagnostic], role: str, stages: Sequence[StageResult]) -> str | None:
    """What the measured stages changed of `role`: the first stage that changed any of its tensors (`change_text`,
    and the other cycles that did), or `draft: 0/24 tensors changed during the stages after cycles 1–2, since
    reload_weights`; None where no stage was compared with its cycle's restore."""
    found = stage_changes(diagnostics, role)
    if found:
        others = [c.cycle for c in found[1:]]
        return change_text(found[0], stages) + (f"; changed too in {_cycles(others)}" if others else "")
    compared = stage_parts(diagnostics, role)
    if not compared:
        return None
    part, restored = compared[0][1], restores(diagnostics, role)
    since = f", since {restored[0].what}" if restored else ""
    total = sum(part.kinds.values()) or part.tensors
    cycles = sorted({cycle for cycle, _ in compared})
    stages_word = "stage" if len(cycles) == 1 else "stages"
    return f"{role}: 0/{total} tensors changed during the {stages_word} after {_cycles(cycles)}{since}"


MODEL_NAMES = {"target": "target", "draft": "drafter"}


def misroute_text(misroute: Misroute, update: str = "{role} update") -> str:
    """`target: 9/24 tensors changed by the draft session of cycle 1, which addresses the drafter alone —
    model.norm.weight …: other values`, or `draft: the draft session of cycle 1 changed none of its 24 tensors, 24 of
    which differed from fresh before it: nothing it sent landed on the drafter`. `update`: how one model's update is
    called (weight_updates.ReloadKind.update)."""
    part, what = misroute.part, update.format(role=misroute.update)
    total = sum(part.kinds.values()) or part.tensors
    if misroute.stray:
        own = [n for n in part.changed_names if n not in part.changed_shared]
        how = {n: h for n, h in part.changed_how.items() if n in own}
        names = _names_text(part.changed_own, own, how, Counter(how.values()))
        addressed = MODEL_NAMES.get(misroute.update, misroute.update)
        return (
            f"{misroute.role}: {part.changed_own}/{total} tensors changed by the {what} of cycle {misroute.cycle},"
            f" which addresses the {addressed} alone" + (f" — {names}" if names else "")
        )
    return (
        f"{misroute.role}: the {what} of cycle {misroute.cycle} changed none of its {total} tensors, {misroute.before}"
        f" of which differed from fresh before it: nothing it sent landed on the"
        f" {MODEL_NAMES.get(misroute.role, misroute.role)}"
    )


def misroutes_line(diagnostics: Sequence[Diagnostic], role: str, update: str = "{role} update") -> str | None:
    """The first push or sync session that did not land on `role` as addressed (`misroute_text`), and the other cycles
    where one did not; None when every one did, or none was compared."""
    found = misroutes(diagnostics, role)
    if not found:
        return None
    others = sorted({m.cycle for m in found[1:]} - {found[0].cycle})
    return misroute_text(found[0], update) + (f"; again in {_cycles(others)}" if others else "")


def restore_names(restore: Restore) -> str:
    """`differ_text` of the rank of this reload or push with the most differing tensors; "" when none differ."""
    parts = [p for p in restore.parts if p is not None and p.differ]
    return differ_text(max(parts, key=lambda p: p.differ or 0)) if parts else ""


def _rank_text(part: Fingerprint) -> tuple[str, str]:
    """(the count phrase, the notes) of one rank's fingerprint of one model."""
    if part.differ is not None:
        count = f"{part.differ}/{part.tensors if part.compared is None else part.compared} tensors differ from fresh"
        if part.differ and any(part.differ_by_kind.get(k) for k in ("buffer", "attribute")):
            count += f" ({kinds_text(part.differ_by_kind)})"
        if part.packed_discarded:
            count += f", {part.packed_discarded}/{part.packed} packed CPU weights still discarded"
    else:  # result files written before checksums were compared
        count = f"{part.all_zero + part.on_meta}/{part.tensors} parameters all-zero or on meta"
    notes = []
    if part.nonfinite:
        notes.append(f"{part.nonfinite} hold NaN/inf")
    if part.on_meta and part.compares:
        notes.append(f"{part.on_meta} on meta")
    if part.shared_with_target:
        notes.append(f"{part.shared_with_target} shared with the target")
    if part.unpacked:
        notes.append(f"{part.unpacked} packed CPU weights read back and compared")
    if part.empty:
        notes.append(f"{part.empty} empty parameters not compared")
    return count, "; ".join(notes)


def restore_text(restore: Restore) -> str:
    """The count phrase of one reload or push, per rank when ranks differ."""
    names = restore.ranks or tuple(f"rank {r}" for r in range(len(restore.parts)))
    texts = [(name, _rank_text(p)[0]) for name, p in zip(names, restore.parts, strict=False) if p is not None]
    if len({text for _, text in texts}) == 1:
        return texts[0][1]
    return ", ".join(f"{name}: {text}" for name, text in texts)


def _cycles(numbers: Sequence[int]) -> str:
    """`cycle 2`, `cycles 1, 3–20`."""
    ordered = sorted(set(numbers))
    runs: list[list[int]] = []
    for n in ordered:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)
    return f"cycle{'s' if len(ordered) > 1 else ''} {text}"


def weights_line(diagnostics: Sequence[Diagnostic], role: str) -> str | None:
    """`draft: 2/11 tensors differ from fresh after reload_weights in cycle 2; 0/11 in cycle 1 (notes) — a, b: other
    values`: every cycle, the worst first, cycles with the same reading together, then the tensors that differ in the
    worst (`differ_text`); None when no fingerprint was taken after a reload or push."""
    found = restores(diagnostics, role)
    if not found:
        return None
    if any(part is None for r in found for part in r.parts):
        return f"{role}: no separate drafter parameters found" if role == "draft" else None
    groups: dict[str, list[Restore]] = {}
    for r in found:
        groups.setdefault(restore_text(r), []).append(r)
    ordered = sorted(groups.items(), key=lambda g: (-max(r.not_restored for r in g[1]), g[1][0].cycle))
    first = next(p for p in found[0].parts if p is not None)
    notes = _rank_text(first)[1]
    (text, rs), *rest = ordered
    line = f"{role}: {text} after {rs[0].what} in {_cycles([r.cycle for r in rs])}"
    line += "".join(f"; {t} in {_cycles([r.cycle for r in g])}" for t, g in rest)
    names = restore_names(max(found, key=lambda r: (r.not_restored, -r.cycle)))
    return line + (f" ({notes})" if notes else "") + (f" — {names}" if names else "")


def uncovered_line(diagnostics: Sequence[Diagnostic], role: str) -> str | None:
    """`draft: 1 parameter no load writes (model.mask_embedding), its checksum not judged: differs from fresh after
    reload_weights in cycles 1–2`, from the fresh fingerprint (rank 0) and every restore after; why it is unknown
    when the dry run failed; None when every parameter is covered."""
    fresh = at(diagnostics, FRESH_POINT)
    first = next((p for p in fresh.parts(role) if p is not None), None) if fresh is not None else None
    if first is None:
        return None
    if first.coverage_error:
        return f"{role}: which parameters no load writes is unknown ({first.coverage_error}); all are judged"
    if not first.uncovered:
        return None
    names = ", ".join(first.uncovered_names) + ("…" if first.uncovered > len(first.uncovered_names) else "")
    line = f"{role}: {first.uncovered} parameter{'s' if first.uncovered != 1 else ''} no load writes ({names}),"
    line += " checksum not judged (a forward that reads one shows in AL and outputs)"
    found = restores(diagnostics, role)
    differ = [r for r in found if any(p is not None and p.uncovered_differ for p in r.parts)]
    if differ:
        return f"{line}: differs from fresh after {differ[0].what} in {_cycles([r.cycle for r in differ])}"
    return f"{line}: as fresh after every {found[0].what}" if found else line


CHECKER = "vLLM's /weight_checker (SHA-256 of the target's parameters; no drafter, no buffers)"


def checker_line(diagnostics: Sequence[Diagnostic]) -> str | None:
    """What vLLM's own /weight_checker said after each weight sync, and whether specwake's fingerprint of the
    target's parameters agrees; None when it was never asked (no sync)."""
    asked = [d for d in diagnostics if d.weight_checker is not None]
    if not asked:
        return None
    fresh = next((d.weight_checker for d in asked if d.point == FRESH_POINT), None) or CheckerReading()
    if fresh.offered is False:
        return f"{CHECKER}: not offered by this server (vLLM 0.32 and later; HTTP {fresh.status})"
    if fresh.error is not None:
        return f"{CHECKER}: failed when fresh: {fresh.error}"
    parts, matched, agree = [], [], []
    for taken in (d for d in asked if d.point in RESTORE_POINTS):
        found, cycle = taken.weight_checker, taken.cycle
        assert found is not None
        if found.error is not None:
            parts.append(f"failed in cycle {cycle}: {found.error}")
            continue
        ours = target_params_differ(taken)
        if ours is not None:
            agree.append((ours == 0) == bool(found.match))
        if found.match:
            matched.append(cycle)
        else:
            names = ", ".join(found.names)
            parts.append(
                f"{found.mismatches}/{found.parameters} parameters differ from fresh in cycle {cycle} ({names})"
            )
    if matched:
        parts.insert(0, f"matches fresh after the sync in {_cycles(matched)}")
    verdict = ""
    if agree:
        verdict = " — specwake's fingerprint agrees" if all(agree) else " — specwake's fingerprint disagrees"
    return f"{CHECKER}: {'; '.join(parts) or 'not compared'}{verdict}"


def discard_rules(steps: Sequence[Any]) -> str | None:
    """Whose L2 sleep the first emulated discard followed ("0.33", "0.34"), as its answer says; None without one (or
    from a specwake that did not say)."""
    step = next((s for s in steps if getattr(s, "name", None) == "discard" and getattr(s, "response", None)), None)
    results = step.response.get("results") if step is not None and isinstance(step.response, dict) else None
    rules = {answer.rules for answer in map(DiscardAnswer.from_dict, results or []) if answer is not None}
    return rules.pop() if len(rules) == 1 and "" not in rules else None


def discard_line(steps: Sequence[Any]) -> str | None:
    """What the first emulated discard took, per model, and whose L2 sleep it followed: `discarded (emulated, 0.34
    rules, preserving draft.*) — target: 15 parameters, 4 tensor attributes, 7 packed CPU weights; 10 buffers kept ·
    draft: …` (per rank when ranks differ); None without a discard answer."""
    step = next((s for s in steps if getattr(s, "name", None) == "discard" and getattr(s, "response", None)), None)
    results = step.response.get("results") if step is not None and isinstance(step.response, dict) else None
    answers = [DiscardAnswer.from_dict(answer) for answer in results or []]
    if not answers or any(answer is None for answer in answers):
        return None
    found = [answer for answer in answers if answer is not None]
    how = ["emulated"] + sorted({rules_name(a.rules) for a in found if a.rules})
    how += sorted({f"preserving {' '.join(a.preserve)}" for a in found if a.preserve})
    texts = [_discard_text(answer) for answer in found]
    if len(set(texts)) == 1:
        return f"discarded ({', '.join(how)}) — {texts[0]}"
    return f"discarded ({', '.join(how)}) — " + " · ".join(f"rank {r}: {t}" for r, t in enumerate(texts))


def _discard_text(answer: DiscardAnswer) -> str:
    parts = []
    for role, counts in answer.models.items():
        lost = [f"{counts.parameter} parameters", f"{counts.attribute} tensor attributes"]
        lost += [f"{counts.packed} packed CPU weights"] if counts.packed else []
        lost += [f"{counts.buffer} buffers"] if counts.buffer else []
        kept = [f"{counts.parameter_kept} parameters"] if counts.parameter_kept else []
        kept += [f"{counts.attribute_kept} tensor attributes"] if counts.attribute_kept else []
        kept += [f"{counts.packed_kept} packed CPU weights"] if counts.packed_kept else []
        kept.append(f"{counts.buffer_kept} buffers kept")
        parts.append(f"{role}: {', '.join(lost)}; {', '.join(kept)}")
    return " · ".join(parts)


def _free(diagnostic: Diagnostic | None) -> list[int | None]:
    return [m.free_bytes for m in diagnostic.memory] if diagnostic is not None else []


def memory_line(diagnostics: Sequence[Diagnostic], cycle: int = 1) -> str:
    """GiB freed by sleep and restored by wake, per rank, for one cycle; `n/a` where no device memory exists."""
    before = _free(at(diagnostics, BEFORE_SLEEP, cycle))
    asleep = _free(at(diagnostics, SLEEP.point, cycle))
    awake = _free(at(diagnostics, AWAKE_POINT, cycle))
    if not before or any(v is None for v in before + asleep + awake) or not asleep or not awake:
        return "device memory: n/a (no accelerator memory reported)"
    taken = at(diagnostics, BEFORE_SLEEP, cycle)
    names = taken.rank_names() if taken is not None else []
    parts = []
    for rank, (b, s, w) in enumerate(zip(before, asleep, awake, strict=False)):
        assert b is not None and s is not None and w is not None
        name = names[rank] if rank < len(names) else f"rank {rank}"
        parts.append(f"{name}: {(s - b) / GIB:.2f} GiB freed by sleep, {(s - w) / GIB:.2f} GiB restored by wake")
    return "device memory: " + "; ".join(parts)
