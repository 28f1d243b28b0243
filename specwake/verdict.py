"""Pure decisions: a variant's stages → its outcome; outcomes vs expectations → verdict, exit code.

Also the one-line human explanation of an outcome, with the numbers that decided it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specwake.errors import EXIT_FAIL, EXIT_INFRA, EXIT_PASS
from specwake.results import StageResult, VariantResult
from specwake.stats import speed_recovered

OUTCOMES = ("recover", "collapse", "crash", "degraded", "error")
EXPECTATIONS = ("recover", "collapse", "crash", "any")
VERDICTS = ("pass", "fail", "error")
INCOMPLETE = "incomplete"  # the runner's label for a variant still running in a partial result
COLLAPSE_AL = 1.05  # AL at or below this after a cycle means (almost) every draft was rejected
_REL_EPS = 1e-9  # AL thresholds are compared with this relative slack against float noise


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


def _recovery_bound(fresh_al: float, tolerance: float) -> float:
    return (1.0 - tolerance) * fresh_al


def _check_tolerance(tolerance: float) -> None:
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")


def decide_outcome(
    stages: Sequence[StageResult],
    *,
    crashed: bool,
    never_ready: bool,
    tolerance: float,
    collapse_al: float = COLLAPSE_AL,
    min_speedup: float | None = None,
) -> str:
    """The outcome of one variant (DESIGN.md "Outcome"); the first rule that applies wins.

    error (never ready) → crash (died after startup, whatever it measured before) → collapse →
    recover → degraded (including no drafts at all, no fresh stage, no post-cycle stage).
    With `min_speedup`, `recover` also needs every post-cycle stage's tok/s to keep that share of fresh:
    a stage whose after/fresh interval lies wholly below it is not recovered; an inconclusive one is.
    """
    _check_tolerance(tolerance)
    if never_ready:
        return "error"
    if crashed:
        return "crash"
    post = _post(stages)
    if any(_collapsed(s, collapse_al) for s in post):
        return "collapse"
    fresh = _fresh(stages)
    fresh_al = fresh.acceptance_length if fresh is not None else None
    if post and fresh_al is not None:
        bound = _recovery_bound(fresh_al, tolerance)
        post_als = [s.acceptance_length for s in post]
        if all(al is not None and _at_least(al, bound) for al in post_als):
            if min_speedup is None or fresh is None:
                return "recover"
            if all(speed_recovered(fresh.tok_s, s.tok_s, min_speedup) != "no" for s in post):
                return "recover"
    return "degraded"


def outcome_matches(outcome: str, expected: str) -> bool:
    """Whether an outcome meets its expectation; `any` matches everything but `error`."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r} (one of {', '.join(OUTCOMES)})")
    if expected not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expected!r} (one of {', '.join(EXPECTATIONS)})")
    if outcome == "error":
        return False
    return expected == "any" or outcome == expected


def decide_verdict(pairs: Sequence[tuple[str, str]]) -> str:
    """A scenario's verdict from its (outcome, expected) pairs: pass | fail | error."""
    if not pairs:
        return "error"
    failed = any(o != "error" and not outcome_matches(o, e) for o, e in pairs)
    if failed:
        return "fail"
    if any(o == "error" for o, _ in pairs):
        return "error"
    return "pass"


def exit_code(verdicts: Sequence[str]) -> int:
    """0 when every verdict passed; 1 when any failed (wins over 3); 3 on any error or none."""
    unknown = [v for v in verdicts if v not in VERDICTS]
    if unknown:
        raise ValueError(f"unknown verdict {unknown[0]!r} (one of {', '.join(VERDICTS)})")
    if "fail" in verdicts:
        return EXIT_FAIL
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
        reason = _first_line(variant.error) or "no error text"
        return f"never became ready ({variant.crash_class or 'startup_failed'}): {reason}"
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
    return f"{_al_chain(stages)} ({_why_measured(stages, tolerance, collapse_al)})"
