"""Pure decisions, and the only place they are made: what a variant run recorded → its outcome (one ordered table of
rules, RULES, which `specwake check` prints and docs/how-it-works.md repeats); outcomes vs expectations → verdict and
exit code. Findings beyond the outcome are specwake.judge.findings'; the words that explain a decision are
specwake.report.explain's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specwake.errors import EXIT_FAIL, EXIT_INFRA, EXIT_INPUT, EXIT_PASS
from specwake.judge.crashes import ERROR_CLASSES
from specwake.judge.expectations import (
    COLLAPSE_AL,
    DEFAULT_MIN_SPEEDUP,
    DEFAULT_TOLERANCE,
    accepted,
)
from specwake.judge.speed import SpeedCall, speed_call
from specwake.protocol import ROLES
from specwake.results import EngineStage, Push, ScenarioResult, StageResult, VariantResult

OUTCOMES = ("recover", "collapse", "corrupt", "crash", "degraded", "error", "floor", "untested")
# Outcomes that say nothing about the wake: they never meet an expectation, and make a scenario's verdict `error`.
NOT_TESTED = ("error", "untested")
VERDICTS = ("pass", "fail", "error")
_REL_EPS = 1e-9  # AL thresholds are compared with this relative slack against float noise
DRAFT_ONLY = frozenset({"draft"})  # a push or sync that scaled the drafter's tensors alone (perturbed_models)
SLEEP_IGNORED = "vLLM ignores sleep on CPU (its CPU worker logs 'sleep mode is not supported on CPU, ignore it')"


# Decoding after the cycles below this share of fresh, beyond the spread between stages, is lost on every platform,
# whatever the speed rule says (advisory where the L2 discard is emulated): a loss this gross is no shared machine's
# noise. The speed rule's simulation from speeds recorded on a shared 2-core machine, other servers running beside
# (tests/unit/test_speed_rule.py), found no false alarm at it in 20,000 null runs (none at 0.85 either), and caught a
# drafter that sleeps 10 ms a forward (0.43× fresh) in 183 of 200 runs at the shipped sizes, 5 requests and 2 cycles.
GROSS_LOSS_RATIO = 0.7


def gross_loss(stages: Sequence[StageResult]) -> SpeedCall | None:
    """The after-cycle speed call against GROSS_LOSS_RATIO where it says `lost`; None otherwise."""
    call = speed_after_cycles(stages, GROSS_LOSS_RATIO)
    return call if call is not None and call.word == "lost" else None


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


def at_most(value: float, bound: float) -> bool:
    return value <= bound or math.isclose(value, bound, rel_tol=_REL_EPS)


def at_least(value: float, bound: float) -> bool:
    return value >= bound or math.isclose(value, bound, rel_tol=_REL_EPS)


def fresh_stage(stages: Sequence[StageResult]) -> StageResult | None:
    return next((s for s in stages if s.cycle == 0), None)


def post_stages(stages: Sequence[StageResult]) -> list[StageResult]:
    return [s for s in stages if s.cycle > 0]


def collapsed(stage: StageResult, collapse_al: float) -> bool:
    al = stage.acceptance_length
    return stage.num_drafts > 0 and al is not None and at_most(al, collapse_al)


def diverged(stages: Sequence[StageResult]) -> StageResult | None:
    """The first post-cycle stage whose completions differ from the fresh ones beyond near-ties: a request whose
    greedy tokens part from fresh where both tokens were near-tied (StageResult.near_ties) is numerics, not a
    divergence."""
    return next(
        (s for s in post_stages(stages) if s.outputs_match_fresh is False and not s.outputs_close_to_fresh), None
    )


def recovery_bound(fresh_al: float, tolerance: float) -> float:
    return (1.0 - tolerance) * fresh_al


def _check_tolerance(tolerance: float) -> None:
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")


def speed_after_cycles(stages: Sequence[StageResult], min_ratio: float) -> SpeedCall | None:
    """The pooled after-cycle speed call of a variant's stages (None without a fresh or post-cycle stage). Made once
    per variant's speeds and ratio: the judge (for each data-parallel engine, whose views share the variant's tok/s),
    the explanation and the PR table ask for the same call (the gross loss among them) and share it."""
    fresh, post = fresh_stage(stages), post_stages(stages)
    if fresh is None or not post:
        return None
    return _pooled_call(tuple(fresh.tok_s), tuple(tuple(s.tok_s) for s in post), min_ratio)


@functools.lru_cache(maxsize=256)
def _pooled_call(fresh: tuple[float, ...], post: tuple[tuple[float, ...], ...], min_ratio: float) -> SpeedCall:
    return speed_call(fresh, post, min_ratio)


# -- the outcome rules -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """Everything the outcome rules look at, for one variant."""

    stages: Sequence[StageResult]
    tolerance: float
    failure: str | None = None  # the failure class (specwake.judge.crashes), None when nothing failed
    target_restored: bool | None = None  # target matched fresh after every reload or push; None: not compared
    draft_restored: bool | None = None  # the same for the drafter, where it is judged (judges_drafter)
    speed: SpeedRule | None = None
    collapse_al: float = COLLAPSE_AL
    speculative: bool = True
    # the models a push or sync scaled tensors of on purpose (perturbed_models): the target's output must change;
    # a drafter perturbed alone must differ from fresh while the target stays as fresh
    perturbed: frozenset[str] = frozenset()
    sleep_ignored: bool = False  # the engine ignored the sleep and nothing emulated it (see sleep_ignored)
    # every tensor stayed through every measured stage as the cycle's reload, push or sync left it (judge.weights.held);
    # None: not compared. Never on purpose, whatever was pushed: both models are judged by it
    target_held: bool | None = None
    draft_held: bool | None = None
    # every push or sync session landed on the model it addresses, and only there (judge.weights.landed); None: not
    # compared (a reload)
    target_landed: bool | None = None
    draft_landed: bool | None = None

    @property
    def fresh(self) -> StageResult | None:
        return fresh_stage(self.stages)

    @property
    def post(self) -> list[StageResult]:
        return post_stages(self.stages)

    def held(self) -> bool:
        """Every post-cycle AL within tolerance of fresh, and speed not clearly lost where it binds."""
        fresh_al = self.fresh.acceptance_length if self.fresh is not None else None
        if not self.post or fresh_al is None:
            return False
        bound = recovery_bound(fresh_al, self.tolerance)
        if not all(s.acceptance_length is not None and at_least(s.acceptance_length, bound) for s in self.post):
            return False
        if gross_loss(self.stages) is not None:
            return False
        binding = self.speed is not None and self.speed.binding
        call = speed_after_cycles(self.stages, self.speed.min_ratio) if self.speed is not None and binding else None
        return call is None or call.word != "lost"


@dataclass(frozen=True)
class Rule:
    """One outcome rule: the outcome, the rule in one line (printed by `check`, repeated in the docs), the test."""

    outcome: str
    text: str
    applies: Callable[[Facts], bool]


RULES: tuple[Rule, ...] = (
    Rule(
        "error",
        "nothing was measured, not even the fresh stage, or the failure is never vLLM's fault (startup_failed,"
        " port_conflict, overlay_not_used, input_rejected, specwake_failed)",
        lambda f: f.fresh is None or f.failure in ERROR_CLASSES,
    ),
    Rule("crash", "a server or a step failed after the fresh stage was measured", lambda f: f.failure is not None),
    Rule(
        "degraded",
        "a push or sync that scaled the target's tensors left the completions as they were, but for near-ties: the"
        " new weights did not reach the target",
        lambda f: "target" in f.perturbed and diverged(f.stages) is None,
    ),
    Rule(
        "corrupt",
        "a post-cycle completion differs from fresh beyond a near-tie (where the tokens part, each side's token among"
        " the other's top logprobs), or the target's weights differ from fresh after a reload, push or sync (not when"
        " it scaled the target's tensors, which changes them on purpose; scaling the drafter's alone must change"
        " neither)",
        lambda f: "target" not in f.perturbed and (diverged(f.stages) is not None or f.target_restored is False),
    ),
    Rule(
        "corrupt",
        "a tensor of the target changed during a measured stage after a cycle: the weights the reload, push or sync"
        " left are not the ones the stage served",
        lambda f: f.target_held is False,
    ),
    Rule(
        "corrupt",
        "a push or sync session not addressed to the target changed its tensors (a draft update routed to the target),"
        " or one addressed to it changed none of them though they differed from fresh before it",
        lambda f: f.target_landed is False,
    ),
    Rule("floor", "the variant runs without speculation", lambda f: not f.speculative),
    Rule(
        "untested",
        "an L1 sleep the engine ignores (CPU), without a push: nothing was slept, discarded or woken",
        lambda f: f.sleep_ignored,
    ),
    Rule(
        "collapse",
        "a post-cycle stage drafted with AL ≤ 1.05",
        lambda f: any(collapsed(s, f.collapse_al) for s in f.post),
    ),
    Rule(
        "degraded",
        "the drafter's weights differ from fresh after a reload, push or sync from its checkpoint (a partial one, or"
        " one that scaled the drafter's tensors alone, included), whatever AL says",
        lambda f: f.draft_restored is False,
    ),
    Rule(
        "degraded",
        "a tensor of the drafter changed during a measured stage after a cycle, whatever AL says",
        lambda f: f.draft_held is False,
    ),
    Rule(
        "degraded",
        "a push or sync session not addressed to the drafter changed its tensors (the target's update written into it"
        " too), or one addressed to it changed none of them though they differed from fresh before it (an empty draft"
        " session), whatever AL says",
        lambda f: f.draft_landed is False,
    ),
    Rule(
        "degraded",
        "a push or sync that scaled the drafter's tensors alone left its weights as fresh: the new weights did not"
        " reach the drafter",
        lambda f: f.perturbed == DRAFT_ONLY and f.draft_restored is True,
    ),
    Rule(
        "error",
        "a stage's spec-decode counters disagree with themselves (vLLM's metrics path: accepted tokens per position"
        " that do not sum to the accepted total, exceed the drafts or rise with position): its AL is void, and the"
        " outcome would turn on it",
        lambda f: any(s.counters_disagree is not None for s in f.stages),
    ),
    Rule(
        "recover",
        "every post-cycle AL ≥ (1 − tolerance) × fresh AL, and tok/s not clearly lost where the speed rule binds, nor"
        f" below {GROSS_LOSS_RATIO}× fresh anywhere",
        Facts.held,
    ),
    Rule("degraded", "anything else: AL below the bound but above 1.05, no drafts, speed lost", lambda f: True),
)


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
    perturbed: frozenset[str] = frozenset(),
    sleep_ignored: bool = False,
    target_held: bool | None = None,
    draft_held: bool | None = None,
    target_landed: bool | None = None,
    draft_landed: bool | None = None,
) -> str:
    """The outcome of one variant: the first rule of RULES that applies."""
    _check_tolerance(tolerance)
    facts = Facts(stages, tolerance, failure, target_restored, draft_restored, speed, collapse_al, speculative,
                  perturbed, sleep_ignored, target_held, draft_held, target_landed, draft_landed)  # fmt: skip
    return next(rule.outcome for rule in RULES if rule.applies(facts))


# From worst to best: a data-parallel variant is as good as its worst engine.
WORST_FIRST = ("error", "crash", "corrupt", "collapse", "degraded", "untested", "floor", "recover")


def worst(outcomes: Sequence[str]) -> str:
    return min(outcomes, key=WORST_FIRST.index)


def engine_stages(stages: Sequence[StageResult], engine: str) -> list[StageResult]:
    """The stages as one data-parallel engine saw them: its own counters in place of the server's."""
    views = []
    for stage in stages:
        silent = EngineStage(engine, None, 0, 0, 0, [], 0)  # an engine the stage has no counters of
        part = next((e for e in stage.engines if e.engine == engine), silent)
        views.append(replace(stage, acceptance_length=part.acceptance_length, num_drafts=part.num_drafts,
                             num_draft_tokens=part.num_draft_tokens, num_accepted_tokens=part.num_accepted_tokens,
                             per_position=part.per_position, counters_disagree=part.counters_disagree))  # fmt: skip
    return views


def outcome_matches(outcome: str, expected: str) -> bool:
    """Whether an outcome meets its expectation: the outcome itself, one of a set of outcomes ("collapse|degraded"),
    or `any`, which matches everything but `error` and `untested`."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r} (one of {', '.join(OUTCOMES)})")
    members = accepted(expected)
    if outcome in NOT_TESTED:
        return False
    return members is None or outcome in members


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


def sleep_ignored(level: int, l2_discard: str, pushing: bool) -> bool:
    """Whether a cycle tests nothing: an L1 sleep on an engine without sleep mode (CPU), which ignores it, and no
    push to put new weights in. At L2 specwake emulates the discard; at L1 nothing stands in for the offload."""
    return level == 1 and l2_discard == "emulated" and not pushing


def perturbed_models(push: Push | None) -> frozenset[str]:
    """The models whose tensors a push or sync (a result's `push`) scaled on purpose: those it counted scaled
    tensors for, or, in results that did not count them (push_scale resolved by no server), every model it went to."""
    if push is None or not push.scale:
        return frozenset()
    if push.scaled is not None:
        return frozenset(role for role, n in push.scaled.items() if n)
    return frozenset(push.to)


def judges_drafter(push: Push | None) -> bool:
    """Whether the drafter must match its fresh fingerprint after the wake: after a reload from its checkpoint
    (reload_weights, `push` None), or a push or sync into it, partial or perturbed, unless it scaled the target's
    tensors too (then the drafter follows the target's new weights on purpose, and AL judges it). A drafter
    perturbed alone is judged: it must differ from fresh, and does not recover."""
    if push is None:
        return True
    return "draft" in push.to and perturbed_models(push) != frozenset(ROLES)


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
