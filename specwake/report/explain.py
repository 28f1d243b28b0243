"""Why a variant got its outcome, in one human line with its numbers: the report's, JUnit's and the CLI's wording of
the decisions specwake.judge.verdict makes. Decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from specwake.judge.crashes import ERROR_CLASSES
from specwake.judge.expectations import COLLAPSE_AL
from specwake.judge.verdict import (
    DRAFT_ONLY,
    GROSS_LOSS_RATIO,
    SLEEP_IGNORED,
    at_least,
    collapsed,
    diverged,
    engine_stages,
    fresh_stage,
    gross_loss,
    judges_drafter,
    perturbed_models,
    post_stages,
    recovery_bound,
)
from specwake.judge.weights import (
    Change,
    Restore,
    held,
    misroutes,
    restored,
    restores,
    stage_changes,
    worst_restore,
)
from specwake.report.weights import change_text, misroutes_line, restore_names, restore_text
from specwake.results import INCOMPLETE, Push, StageResult, VariantResult
from specwake.weight_updates import KIND_BY_VIA, PUSH_VIA

MODEL_WORDS = {"target": "target", "draft": "drafter"}
NOT_RUN = "not run"  # a variant of a partial result that recorded nothing (VariantResult.not_run)


def _al(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _al_chain(stages: Sequence[StageResult]) -> str:
    fresh = fresh_stage(stages)
    chain = [_al(fresh.acceptance_length) if fresh is not None else "–"]
    chain += [_al(s.acceptance_length) for s in post_stages(stages)]
    return "AL " + " → ".join(chain)


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _why_collapse(stages: Sequence[StageResult], collapse_al: float) -> str:
    stage = next((s for s in post_stages(stages) if collapsed(s, collapse_al)), None)
    if stage is None:
        return f"no post-cycle stage with drafts has AL ≤ {collapse_al:.2f}"
    return (
        f"{stage.name}: {stage.num_accepted_tokens}/{stage.num_draft_tokens} draft tokens "
        f"accepted over {stage.num_drafts} drafts, AL ≤ {collapse_al:.2f}"
    )


def first_difference(fresh: str, now: str) -> int | None:
    """Index of the first character where two completions differ (None when equal)."""
    if fresh == now:
        return None
    return next((i for i, (a, b) in enumerate(zip(fresh, now, strict=False)) if a != b), min(len(fresh), len(now)))


def _why_corrupt(variant: VariantResult) -> str:
    reasons = []
    stage, fresh = diverged(variant.stages), fresh_stage(variant.stages)
    if stage is not None and fresh is not None:
        ties = {request for request, _ in stage.near_ties}
        where = next(
            (
                (i, first_difference(a, b))
                for i, (a, b) in enumerate(zip(fresh.outputs, stage.outputs, strict=False))
                if a != b and i not in ties
            ),
            None,
        )
        text = f"{stage.name}: completions differ from fresh"
        if where is not None:
            i, at = where
            now = stage.outputs[i][at or 0 :][:12]
            was = fresh.outputs[i][at or 0 :][:12]
            text += f" (request {i + 1}, from character {at}: {now!r} where fresh had {was!r})"
        reasons.append(text)
    reason = weights_reason(variant)
    if reason is not None:
        reasons.append(reason)
    return "; ".join(reasons) or "target weights differ from fresh"


def _judged_roles(variant: VariantResult) -> list[str]:
    """The models whose fingerprints judge this variant, the one its outcome is about first: the target of a
    corrupt variant, else the drafter (where it is judged: a reload from its checkpoint); a target that a push scaled on
    purpose is not."""
    roles = ["draft"] if judges_drafter(variant.push) else []
    roles += [] if "target" in perturbed_models(variant.push) else ["target"]
    return roles[::-1] if variant.outcome == "corrupt" else roles


def weights_reason(variant: VariantResult) -> str | None:
    """Whether the weights explain an outcome: `the drafter's weights explain it (draft: 1/24 tensors differ from fresh
    after reload_weights in cycle 1 — model.layers.0.mlp.down_proj.weight: signs changed)`, or `not the weights
    (target and drafter as fresh after every reload_weights)`; None when the fingerprints compared nothing, or when
    the model the outcome is about was not judged (a drafter the push left out). Then, for either model, what a
    measured stage changed of what the cycle's reload, push or sync left: `the drafter's weights explain it (draft:
    1/24 tensors changed during the stage after L2 #1 (cycle 1), since reload_weights — model.norm.weight: other
    values)`. First of all, a push or sync session that did not land on the model it addresses: `the target's
    weights explain it (target: 9/24 tensors changed by the draft session of cycle 1, which addresses the drafter
    alone — …)`."""
    roles = _judged_roles(variant)
    for role in ("target", "draft") if variant.outcome == "corrupt" else ("draft", "target"):
        missed = misroutes_line(variant.diagnostics, role, update_words(variant.push))
        if missed is not None:
            return f"the {MODEL_WORDS[role]}'s weights explain it ({missed})"
    for role in roles:
        worst = worst_restore(variant.diagnostics, role)
        if worst is not None:
            names = restore_names(worst)
            found = f"{role}: {restore_text(worst)} after {worst.what} in cycle {worst.cycle}"
            return f"the {MODEL_WORDS[role]}'s weights explain it ({found}{f' — {names}' if names else ''})"
    for role in ("target", "draft") if variant.outcome == "corrupt" else ("draft", "target"):
        changed = stage_changes(variant.diagnostics, role)
        if changed:
            return f"the {MODEL_WORDS[role]}'s weights explain it ({change_text(changed[0], variant.stages)})"
    if not roles or any(restored(variant.diagnostics, role) is not True for role in roles):
        return None
    if "draft" not in roles and variant.outcome != "corrupt":
        return None  # a drafter left out of the push, or following a scaled target: its weights were not judged
    which = "target and drafter" if len(roles) == 2 else f"the {MODEL_WORDS[roles[0]]}"
    kept = ", unchanged through every stage" if all(held(variant.diagnostics, role) for role in roles) else ""
    return f"not the weights ({which} as fresh after every {restores(variant.diagnostics, roles[0])[0].what}{kept})"


def _why_measured(stages: Sequence[StageResult], tolerance: float, collapse_al: float) -> str:
    """The reason for recover/degraded, read from the stages."""
    fresh = fresh_stage(stages)
    post = post_stages(stages)

    if not stages or all(s.num_drafts == 0 for s in stages):
        return "no drafts were made in any stage"
    if fresh is None or fresh.acceptance_length is None:
        return "no fresh acceptance length to compare with"
    if not post:
        return "no stage measured after a cycle"
    bound = recovery_bound(fresh.acceptance_length, tolerance)
    low = [s for s in post if s.acceptance_length is None or not at_least(s.acceptance_length, bound)]
    if not low:
        held = f"every post-cycle AL ≥ {bound:.2f} = {1 - tolerance:.0%} of fresh"
        gross = gross_loss(stages)
        if gross is None or gross.ratio is None:
            return held
        return f"{held}, but decoding after the cycles ran at {gross.ratio:.2f}× fresh: below {GROSS_LOSS_RATIO}×, lost"

    worst = low[0]
    if worst.acceptance_length is None:
        return f"{worst.name}: no drafts were made"
    return (
        f"{worst.name}: AL {worst.acceptance_length:.2f} < {bound:.2f} "
        f"({1 - tolerance:.0%} of fresh) but > {collapse_al:.2f}"
    )


def near_tie_note(stages: Sequence[StageResult]) -> str | None:
    """Where post-cycle completions part from fresh only at near-ties: numerics, which decide nothing."""
    where = [
        f"{s.name} request {request + 1} token {token}"
        for s in post_stages(stages)
        if s.outputs_match_fresh is False and s.outputs_close_to_fresh
        for request, token in s.near_ties
    ]
    if not where:
        return None
    return f"note: tokens part from fresh at a near-tie ({', '.join(where)}): numerics, not corruption"


def explain(variant: VariantResult, tolerance: float, *, collapse_al: float = COLLAPSE_AL) -> str:
    """One human line: why the variant got its outcome, with the numbers (and a note on near-tie flips)."""
    note = near_tie_note(variant.stages)
    why = _by_engine(variant, tolerance, collapse_al) or _explain(variant, tolerance, collapse_al)
    return why if note is None else f"{why}; {note}"


def _by_engine(variant: VariantResult, tolerance: float, collapse_al: float) -> str | None:
    """A data-parallel variant: why the engine that decided its outcome got it, then every other engine's outcome
    and AL; None for a variant of one engine."""
    decided = [e for e, outcome in variant.engine_outcomes.items() if outcome == variant.outcome]
    if not decided:
        return None
    first = decided[0]
    seen = replace(variant, stages=engine_stages(variant.stages, first))
    why = f"engine {first} of {len(variant.engine_outcomes)}: {_explain(seen, tolerance, collapse_al)}"
    others = [
        f"engine {e}: {outcome}, {_al_chain(engine_stages(variant.stages, e))}"
        for e, outcome in variant.engine_outcomes.items()
        if e != first
    ]
    return "; ".join([why, *others])


def _explain(variant: VariantResult, tolerance: float, collapse_al: float) -> str:
    stages = variant.stages
    if variant.outcome == "error":
        void = next((s for s in stages if s.counters_disagree is not None), None)
        if variant.crash_class is None and void is not None:
            return (
                f"{void.name}: the spec-decode counters disagree with themselves ({void.counters_disagree}): vLLM's"
                " metrics path is at fault, and the AL the outcome turns on is void"
            )
        if variant.crash_class is None:
            return "nothing was measured, not even the fresh stage: nothing about sleep or wake was tested"
        reason = _first_line(variant.error) or "no error text"
        when = "" if variant.crash_class in ERROR_CLASSES else " before the fresh stage was measured"
        return f"not measured ({variant.crash_class}{when}): {reason}"
    if variant.outcome == "untested":
        return (
            f"{_al_chain(stages)}, but {SLEEP_IGNORED}: nothing was slept, discarded or woken, so the cycles tested"
            " nothing"
        )
    if variant.outcome == "crash":
        what = f"crashed ({variant.crash_class or 'unknown'})"
        reason = _first_line(variant.error)
        if reason:
            what += f": {reason}"
        measured = f"{_al_chain(stages)} before the crash" if stages else "no stage measured"
        return f"{what}; {measured}"
    if variant.not_run:
        return f"{NOT_RUN}: nothing recorded (the run stopped first, or has not got to it yet)"
    if variant.outcome == INCOMPLETE:
        return f"not finished; {_al_chain(stages)} so far" if stages else "no stage measured yet"
    sent = sent_line(variant.push)
    also = f"; {sent}" if sent else ""
    weights = weights_reason(variant) if variant.outcome in ("collapse", "degraded") else None
    weighed = f"; {weights}" if weights else ""
    if variant.outcome == "collapse":
        return f"{_al_chain(stages)} ({_why_collapse(stages, collapse_al)}{also}){weighed}"
    if variant.outcome == "floor":
        return "no speculation: the decode speed a collapsed drafter falls to"
    if variant.outcome == "corrupt":
        restored_then_changed = diverged(stages) is None and restored(variant.diagnostics, "target") is not False
        what = "changed after its restore" if restored_then_changed and stage_change(variant) else "was not restored"
        if restored(variant.diagnostics, "target") is not False and any(
            m.stray for m in misroutes(variant.diagnostics, "target")
        ):
            what = "got an update meant for another model"
        return f"the target {what}: {_why_corrupt(variant)}; {_al_chain(stages)}{also}"
    perturbed = perturbed_models(variant.push)
    if "target" in perturbed:
        return _target_perturbed(variant, tolerance, collapse_al)
    if perturbed == DRAFT_ONLY:
        return _drafter_perturbed(variant, tolerance, collapse_al)
    return f"{_al_chain(stages)} ({_why_measured(stages, tolerance, collapse_al)}{also}){weighed}"


def _counts(counted: dict[str, int] | None) -> str:
    """` (1 drafter tensor)`, ` (3 target and 3 drafter tensors)` from a result's per-model counts; "" without."""
    if counted is None:
        return ""
    parts = [f"{n} {MODEL_WORDS.get(role, role)}" for role, n in counted.items() if n]
    total = sum(counted.values())
    return f" ({' and '.join(parts)} tensor{'s' if total != 1 else ''})" if parts else ""


def sent_line(push: Push | None) -> str | None:
    """What a perturbed or partial push or sync did to the checkpoint's tensors: `the sync scaled
    draft:model.norm.weight ×1.05 (1 drafter tensor)`, `the push left out draft:model.layers.1.* (9 drafter tensors)`;
    None for a plain one."""
    if push is None or not (push.scale or push.skip):
        return None
    did = []
    if push.scale:
        factors = ", ".join(f"{entry} ×{factor:g}" for entry, factor in push.scale.items())
        did.append(f"scaled {factors}{_counts(push.scaled)}")
    if push.skip:
        did.append(f"left out {', '.join(push.skip)}{_counts(push.skipped)}")
    return f"the {_how(push)} {' and '.join(did)}"


def _how(push: Push | None) -> str:
    return KIND_BY_VIA[push.via if push is not None else PUSH_VIA].noun


def update_words(push: Push | None) -> str:
    """How one model's update of this push or sync is called: `{role} push`, `{role} session`."""
    return KIND_BY_VIA[push.via if push is not None else PUSH_VIA].update


def _target_perturbed(variant: VariantResult, tolerance: float, collapse_al: float) -> str:
    """Why a push or sync that scaled the target's tensors got `recover` or `degraded`: its output must change."""
    stages, sent = variant.stages, sent_line(variant.push)
    if diverged(stages) is None:
        target = restored(variant.diagnostics, "target")
        if target is False:
            why = (
                "the target's checksums differ from fresh, but its completions do not: too small a change to show"
                " that the server answers with the new weights"
            )
        else:
            why = (
                "but the target's completions are as fresh: the new weights did not reach the target (a tensor only"
                " the drafter loads is limited to it as draft:NAME)"
            )
        return f"{_al_chain(stages)} ({sent}; {why})"
    why = _why_measured(stages, tolerance, collapse_al)
    reason = weights_reason(variant) if variant.outcome == "degraded" else None
    why += f"; {reason}" if reason else ""
    return f"{_al_chain(stages)} ({why}; {sent}; the output changed, as the perturbed {_how(variant.push)} intends)"


def _drafter_perturbed(variant: VariantResult, tolerance: float, collapse_al: float) -> str:
    """Why a push or sync that scaled the drafter's tensors alone got `recover` or `degraded`: the target verifies
    every token, so the output cannot change; the drafter must differ from fresh, and AL shows what it costs."""
    stages, sent = variant.stages, sent_line(variant.push)
    lossless = "the completions are as fresh, as speculative decoding guarantees (the target verifies every token)"
    worst = worst_restore(variant.diagnostics, "draft")
    if worst is not None:
        differs = (
            f"the drafter's weights differ from fresh ({restore_text(worst)} after {worst.what} in cycle {worst.cycle})"
        )
        why = f"{differs}, as intended: a drafter unlike its checkpoint is no recovery, whatever AL says"
    elif restored(variant.diagnostics, "draft"):
        why = "but the drafter's weights are as fresh after it: the new weights did not reach the drafter"
    else:
        measured = _why_measured(stages, tolerance, collapse_al)
        why = f"the drafter's weights were not compared, so AL alone judged it: {measured}"
    return f"{_al_chain(stages)} ({sent}: {why}; {lossless})"


def stage_change(variant: VariantResult) -> Change | None:
    """Why a `corrupt` or `degraded` variant's weights kept it from `recover` where every restore matched fresh: the
    first measured stage that changed the target's tensors (corrupt) or the drafter's (degraded)."""
    role = {"corrupt": "target", "degraded": "draft"}.get(variant.outcome)
    changed = stage_changes(variant.diagnostics, role) if role is not None else []
    return changed[0] if changed else None


def unrestored_drafter(variant: VariantResult) -> Restore | None:
    """Why a `degraded` variant's drafter kept it from `recover`: its worst reload from the drafter's checkpoint, if
    the drafter was judged there and did not match fresh."""
    if variant.outcome != "degraded" or not judges_drafter(variant.push):
        return None
    return worst_restore(variant.diagnostics, "draft")
