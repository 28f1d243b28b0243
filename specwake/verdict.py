"""Pure decisions, and the only place they are made: what a variant run recorded → its outcome; outcomes vs
expectations → verdict, exit code. Also the one-line human explanation of an outcome, with its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specwake.crashes import ERROR_CLASSES
from specwake.errors import EXIT_FAIL, EXIT_INFRA, EXIT_INPUT, EXIT_PASS
from specwake.results import ScenarioResult, StageResult, StepResult, VariantResult
from specwake.speed import SpeedCall, speed_call
from specwake.weights import Restore, moved, weights_line, worst_restore

OUTCOMES = ("recover", "collapse", "corrupt", "crash", "degraded", "error", "floor", "untested")
# Outcomes that say nothing about the wake: they never meet an expectation, and make a scenario's verdict `error`.
NOT_TESTED = ("error", "untested")
EXPECTATIONS = ("recover", "collapse", "corrupt", "crash", "any")
VERDICTS = ("pass", "fail", "error")
INCOMPLETE = "incomplete"  # the runner's label for a variant still running in a partial result
COLLAPSE_AL = 1.05  # AL at or below this after a cycle means (almost) every draft was rejected
DEFAULT_TOLERANCE = 0.05  # [expect] tolerance when a scenario sets none
DEFAULT_MIN_SPEEDUP = 0.9  # [expect] min_speedup_recovery when a scenario sets none
_REL_EPS = 1e-9  # AL thresholds are compared with this relative slack against float noise


@dataclass(frozen=True)
class SpeedRule:
    """Whether the after-cycle speed call can turn `recover` into `degraded`, and why."""

    min_ratio: float
    binding: bool
    why: str


def speed_rule(min_speedup: float | None, l2_discard: str) -> SpeedRule:
    """The scenario's own min_speedup_recovery always counts. Without one, speed counts (at 0.9× fresh) where
    the L2 discard is real; where it is emulated (CPU, a shared machine) it is reported but advisory."""
    if min_speedup is not None:
        return SpeedRule(min_speedup, True, "counts: set by the scenario (expect.min_speedup_recovery)")
    if l2_discard == "emulated":
        return SpeedRule(
            DEFAULT_MIN_SPEEDUP,
            False,
            "advisory: the L2 discard is emulated (CPU); set expect.min_speedup_recovery to make it count",
        )
    return SpeedRule(DEFAULT_MIN_SPEEDUP, True, "counts: the default for a real L2 discard")


def recorded_tolerance(result: ScenarioResult) -> float:
    """The [expect] tolerance a result was decided with (the default for results that did not record it)."""
    value = result.expectation("tolerance", DEFAULT_TOLERANCE)
    return DEFAULT_TOLERANCE if value is None else value


def recorded_speed_rule(result: ScenarioResult, variant: VariantResult) -> SpeedRule:
    """The speed rule a result's variant was decided with."""
    return speed_rule(result.expectation("min_speedup_recovery", None), variant.l2_discard)


def _at_most(value: float, bound: float) -> bool:
    return value <= bound or math.isclose(value, bound, rel_tol=_REL_EPS)


def _at_least(value: float, bound: float) -> bool:
    return value >= bound or math.isclose(value, bound, rel_tol=_REL_EPS)


def _fresh(stages: Sequence[StageResult]) -> StageResult | None:
    return next((s for s in stages if s.cycle == 0), None)


def _post(stages: Sequence[StageResult]) -> list[StageResult]:
    return [s for s in stages if s.cycle > 0]


def _collapsed(stage: StageResult, collapse_al: float) -> bool:
    al = stage.acceptance_length
    return stage.num_drafts > 0 and al is not None and _at_most(al, collapse_al)


def _diverged(stages: Sequence[StageResult]) -> StageResult | None:
    """The first post-cycle stage whose completions differ from the fresh ones."""
    return next((s for s in _post(stages) if s.outputs_match_fresh is False), None)


def _recovery_bound(fresh_al: float, tolerance: float) -> float:
    return (1.0 - tolerance) * fresh_al


def _check_tolerance(tolerance: float) -> None:
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")


def speed_after_cycles(stages: Sequence[StageResult], min_ratio: float) -> SpeedCall | None:
    """The pooled after-cycle speed call of a variant's stages (None without a fresh or post-cycle stage)."""
    fresh, post = _fresh(stages), _post(stages)
    if fresh is None or not post:
        return None
    return speed_call(fresh.tok_s, [s.tok_s for s in post], min_ratio)


def decide_outcome(
    stages: Sequence[StageResult],
    *,
    tolerance: float,
    failure: str | None = None,
    target_restored: bool | None = None,
    draft_restored: bool | None = None,
    speed: SpeedRule | None = None,
    collapse_al: float = COLLAPSE_AL,
    speculative: bool = True,
    perturbed: bool = False,
    sleep_ignored: bool = False,
) -> str:
    """The outcome of one variant; the first rule that applies wins. A variant run without speculation (the
    no-speculation floor) ends as `floor` unless it failed or its target was not restored. A perturbed push
    (`perturbed`) must change the output: it is `degraded` when it did not, and never `corrupt` for changing it.

    error (nothing measured, not even the fresh stage; or `failure` is a class meaning the variant was never
    measured or the scenario asked for what the server refuses: startup_failed, input_rejected, ...) → crash (any
    other failure after a measured fresh stage) → corrupt (a post-cycle stage's completions differ from fresh, or
    the target's weights do not match their fresh checksums after a reload or push: the target was not restored) →
    floor → untested (`sleep_ignored`: the engine ignored the sleep and nothing emulated it, so no cycle tested
    anything) → collapse (a post-cycle stage drafted and AL ≤ collapse_al) → degraded, when the drafter's weights do
    not match fresh after a reload from its checkpoint (`draft_restored` False) → recover (every post-cycle AL ≥
    (1 − tolerance) × fresh, and, where `speed` is binding, speed not clearly lost; see specwake.speed) → degraded
    (everything else, including no drafts at all, no post-cycle stage).
    """
    _check_tolerance(tolerance)
    if failure is not None:
        return "error" if failure in ERROR_CLASSES or _fresh(stages) is None else "crash"
    if _fresh(stages) is None:
        return "error"
    if perturbed:
        if _diverged(stages) is None:
            return "degraded"
    elif _diverged(stages) is not None or target_restored is False:
        return "corrupt"
    if not speculative:
        return "floor"
    if sleep_ignored:
        return "untested"
    post = _post(stages)
    if any(_collapsed(s, collapse_al) for s in post):
        return "collapse"
    if draft_restored is False:
        return "degraded"
    fresh = _fresh(stages)
    fresh_al = fresh.acceptance_length if fresh is not None else None
    if post and fresh_al is not None:
        bound = _recovery_bound(fresh_al, tolerance)
        if all(s.acceptance_length is not None and _at_least(s.acceptance_length, bound) for s in post):
            call = speed_after_cycles(stages, speed.min_ratio) if speed is not None and speed.binding else None
            if call is None or call.word != "lost":
                return "recover"
    return "degraded"


def outcome_matches(outcome: str, expected: str) -> bool:
    """Whether an outcome meets its expectation; `any` matches everything but `error` and `untested`."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r} (one of {', '.join(OUTCOMES)})")
    if expected not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expected!r} (one of {', '.join(EXPECTATIONS)})")
    if outcome in NOT_TESTED:
        return False
    return expected == "any" or outcome == expected


def decide_verdict(variants: Sequence[tuple[str, bool]]) -> str:
    """A scenario's verdict from its variants' (outcome, matched) — matched: the outcome meets its expectation
    and the variant has no findings: pass | fail | error."""
    if not variants:
        return "error"
    if any(outcome not in NOT_TESTED and not matched for outcome, matched in variants):
        return "fail"
    if any(outcome in NOT_TESTED for outcome, _ in variants):
        return "error"
    return "pass"


SLEEP_IGNORED = "vLLM ignores sleep on CPU (its CPU worker logs 'sleep mode is not supported on CPU, ignore it')"


def sleep_ignored(level: int, l2_discard: str, pushing: bool) -> bool:
    """Whether a cycle tests nothing: an L1 sleep on an engine without sleep mode (CPU), which ignores it, and no
    push to put new weights in. At L2 specwake emulates the discard; at L1 nothing stands in for the offload."""
    return level == 1 and l2_discard == "emulated" and not pushing


def judges_drafter(push: dict[str, Any] | None) -> bool:
    """Whether the drafter must match its fresh checksums after the wake: after a reload from its checkpoint
    (reload_weights, `push` None), or a push into it without scaling."""
    if push is None:
        return True
    return "draft" in (push.get("to") or []) and not push.get("scale")


@dataclass(frozen=True)
class Limits:
    """[expect] bounds beyond the outcome; each number None when the scenario sets none."""

    max_logprob_drift: float | None = None  # largest |Δ logprob| against fresh after a cycle
    max_rss_growth_mb: float | None = None  # host RSS after the last cycle's wake minus after the first's
    max_wake_s: float | None = None  # the slowest cycle's wake: wake steps and reload, in seconds
    # A tensor the reload put at a new address is a finding: a CUDA graph captured before the sleep still reads the
    # old one. False only for a scenario that never captures graphs (server.enforce_eager).
    graph_safe: bool = True


WAKE_STEPS = ("wake_weights", "reload_weights", "push", "wake_kv_cache", "wake_up")
MIB = 1024 * 1024


def wake_seconds(steps: Sequence[StepResult]) -> dict[int, float]:
    """Cycle → seconds from the first wake step to the end of the wake (sleep and discard excluded)."""
    per_cycle: dict[int, float] = {}
    for step in steps:
        if step.name in WAKE_STEPS and step.ok:
            per_cycle[step.cycle] = per_cycle.get(step.cycle, 0.0) + step.seconds
    return per_cycle


def rss_after_wake(steps: Sequence[StepResult]) -> dict[int, int]:
    """Cycle → host RSS of the server group after the cycle's last step."""
    rss: dict[int, int] = {}
    for step in steps:
        if step.rss_bytes is not None:
            rss[step.cycle] = step.rss_bytes
    return rss


def findings(variant: VariantResult, limits: Limits) -> list[str]:
    """What is wrong beyond the outcome, each a line naming the stage or cycle: tensors a reload moved to new storage
    (unless the scenario is not graph-safe), a prefix cache that served tokens right after a wake (its hashes outlived
    the discard), and [expect] limits exceeded."""
    found = [m.finding() for m in moved(variant.diagnostics)] if limits.graph_safe else []
    for stage in _post(variant.stages):
        if stage.prefix_cached:
            found.append(
                f"stale prefix cache: {stage.name} served {stage.prefix_cached} prompt tokens from cache right after"
                " the wake, which should have emptied it"
            )
            break
    drifts = [(s.max_logprob_drift, s.name) for s in _post(variant.stages) if s.max_logprob_drift is not None]
    if limits.max_logprob_drift is not None and drifts:
        worst, where = max(drifts)
        if worst > limits.max_logprob_drift:
            found.append(f"logprobs drift by {worst:.3g} at {where} > max_logprob_drift {limits.max_logprob_drift:g}")
    rss = rss_after_wake(variant.steps)
    if limits.max_rss_growth_mb is not None and len(rss) >= 2:
        first, last = rss[min(rss)], rss[max(rss)]
        growth = (last - first) / MIB
        if growth > limits.max_rss_growth_mb:
            found.append(
                f"host RSS grew {growth:.0f} MiB from cycle {min(rss)} to {max(rss)} > max_rss_growth_mb "
                f"{limits.max_rss_growth_mb:g}"
            )
    wakes = wake_seconds(variant.steps)
    if limits.max_wake_s is not None and wakes:
        cycle, seconds = max(wakes.items(), key=lambda item: item[1])
        if seconds > limits.max_wake_s:
            found.append(f"wake of cycle {cycle} took {seconds:.2f} s > max_wake_s {limits.max_wake_s:g}")
    return found


def exit_code(verdicts: Sequence[str], *, input_rejected: bool = False) -> int:
    """0 when every verdict passed; 1 when any failed (wins over the rest); 2 on an error where the server refused
    the scenario's own input (`input_rejected`: bad input, found only once running); 3 on any other error or none."""
    unknown = [v for v in verdicts if v not in VERDICTS]
    if unknown:
        raise ValueError(f"unknown verdict {unknown[0]!r} (one of {', '.join(VERDICTS)})")
    if "fail" in verdicts:
        return EXIT_FAIL
    if "error" in verdicts and input_rejected:
        return EXIT_INPUT
    if "error" in verdicts or not verdicts:
        return EXIT_INFRA
    return EXIT_PASS


def _al(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _al_chain(stages: Sequence[StageResult]) -> str:
    fresh = _fresh(stages)
    chain = [_al(fresh.acceptance_length) if fresh is not None else "–"]
    chain += [_al(s.acceptance_length) for s in _post(stages)]
    return "AL " + " → ".join(chain)


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _why_collapse(stages: Sequence[StageResult], collapse_al: float) -> str:
    stage = next((s for s in _post(stages) if _collapsed(s, collapse_al)), None)
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
    stage, fresh = _diverged(variant.stages), _fresh(variant.stages)
    if stage is not None and fresh is not None:
        where = next(
            (
                (i, first_difference(a, b))
                for i, (a, b) in enumerate(zip(fresh.outputs, stage.outputs, strict=False))
                if a != b
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
    line = weights_line(variant.diagnostics, "target")
    if line is not None and "differ" in line and not line.startswith("target: 0/"):
        reasons.append(line)
    return "; ".join(reasons) or "target weights differ from fresh"


def _why_measured(stages: Sequence[StageResult], tolerance: float, collapse_al: float) -> str:
    """The reason for recover/degraded, read from the stages."""
    fresh = _fresh(stages)
    post = _post(stages)

    if not stages or all(s.num_drafts == 0 for s in stages):
        return "no drafts were made in any stage"
    if fresh is None or fresh.acceptance_length is None:
        return "no fresh acceptance length to compare with"
    if not post:
        return "no stage measured after a cycle"
    bound = _recovery_bound(fresh.acceptance_length, tolerance)
    low = [s for s in post if s.acceptance_length is None or not _at_least(s.acceptance_length, bound)]
    if not low:
        return f"every post-cycle AL ≥ {bound:.2f} = {1 - tolerance:.0%} of fresh"
    worst = low[0]
    if worst.acceptance_length is None:
        return f"{worst.name}: no drafts were made"
    return (
        f"{worst.name}: AL {worst.acceptance_length:.2f} < {bound:.2f} "
        f"({1 - tolerance:.0%} of fresh) but > {collapse_al:.2f}"
    )


def explain(variant: VariantResult, tolerance: float, *, collapse_al: float = COLLAPSE_AL) -> str:
    """One human line: why the variant got its outcome, with the numbers."""
    stages = variant.stages
    if variant.outcome == "error":
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
    if variant.outcome == INCOMPLETE:
        return f"not finished; {_al_chain(stages)} so far" if stages else "no stage measured yet"
    if variant.outcome == "collapse":
        return f"{_al_chain(stages)} ({_why_collapse(stages, collapse_al)})"
    if variant.outcome == "floor":
        return "no speculation: the decode speed a collapsed drafter falls to"
    if variant.outcome == "corrupt":
        return f"the target was not restored: {_why_corrupt(variant)}; {_al_chain(stages)}"
    if (variant.push or {}).get("scale"):
        if _diverged(stages) is None:
            return f"{_al_chain(stages)} (the perturbed push left the output unchanged: the new weights did not arrive)"
        why = _why_measured(stages, tolerance, collapse_al)
        return f"{_al_chain(stages)} ({why}; the output changed, as the perturbed push intends)"
    why = _why_measured(stages, tolerance, collapse_al)
    unrestored = unrestored_drafter(variant)
    if unrestored is not None:
        why += (
            f"; but the drafter was not restored: {unrestored.text()} after {unrestored.what} in cycle"
            f" {unrestored.cycle}"
        )
    return f"{_al_chain(stages)} ({why})"


def unrestored_drafter(variant: VariantResult) -> Restore | None:
    """Why a `degraded` variant's drafter kept it from `recover`: its worst reload from the drafter's checkpoint, if
    the drafter was judged there and did not match fresh."""
    if variant.outcome != "degraded" or not judges_drafter(variant.push):
        return None
    return worst_restore(variant.diagnostics, "draft")
