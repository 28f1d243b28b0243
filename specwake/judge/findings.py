"""Findings: what fails a variant beyond its outcome, each a sentence naming what was measured against which bound.
Tensors a reload moved (a CUDA graph would read the old memory), a stale prefix cache after the wake, logprob drift,
host memory growth, a slow wake, and vLLM's spec-decode counters disagreeing with themselves. Pure functions of a
variant's record and its scenario's [expect] limits, like specwake.judge.verdict beside them.
"""

from __future__ import annotations

from collections.abc import Sequence

from specwake.judge.expectations import MIN_FIRST_LOAD_S, Limits
from specwake.judge.verdict import at_most, fresh_stage, post_stages
from specwake.judge.weights import moved
from specwake.results import MIB, StageResult, VariantResult


def _drift(variant: VariantResult, post: Sequence[StageResult], limits: Limits) -> list[str]:
    """Logprobs that drift from fresh more than `expect.max_logprob_drift`, or, where it is not set and the variant
    recovered, more than the fresh stage's own requests of one prompt drift from each other: the served model is then
    not the fresh one, though it picks the same tokens. (A collapse or a corruption already says what changed; a drafter
    that drafts less changes the target's batch shapes, and with them its rounding on a GPU.)"""
    drifts = [(s.max_logprob_drift, s.name) for s in post if s.max_logprob_drift is not None]
    if not drifts:
        return []
    worst, where = max(drifts)
    if limits.max_logprob_drift is not None:
        if worst > limits.max_logprob_drift:
            return [f"logprobs drift by {worst:.3g} at {where} > max_logprob_drift {limits.max_logprob_drift:g}"]
        return []
    fresh = fresh_stage(variant.stages)
    own = fresh.own_logprob_drift if fresh is not None else None
    if variant.outcome != "recover" or own is None or worst <= own:
        return []
    return [
        f"logprobs drift by {worst:.3g} at {where}, beyond the fresh stage's own {own:.3g} (its requests of one"
        " prompt): the served model is not the fresh one (expect.max_logprob_drift sets another bound)"
    ]


def findings(variant: VariantResult, limits: Limits) -> list[str]:
    """What is wrong beyond the outcome, each a line naming the stage or cycle: spec-decode counters that disagree
    with themselves, tensors a reload moved to new storage (unless the scenario is not graph-safe), a prefix cache that
    served tokens right after a wake (its hashes outlived the discard), a wake far slower than the server's first load
    (slow_wake), and [expect] limits exceeded."""
    found = metrics_findings(variant.stages)
    found += [m.finding() for m in moved(variant.diagnostics)] if limits.graph_safe else []
    post = post_stages(variant.stages)
    for stage in post:
        if stage.prefix_cached:
            found.append(
                f"stale prefix cache: {stage.name} served {stage.prefix_cached} prompt tokens from cache right after"
                " the wake, which should have emptied it"
            )
            break
    found += _drift(variant, post, limits)
    rss = variant.rss_after_wake()
    if limits.max_rss_growth_mb is not None and len(rss) >= 2:
        first, last = rss[min(rss)], rss[max(rss)]
        growth = (last - first) / MIB
        if growth > limits.max_rss_growth_mb:
            found.append(
                f"host RSS grew {growth:.0f} MiB from cycle {min(rss)} to {max(rss)} > max_rss_growth_mb "
                f"{limits.max_rss_growth_mb:g}"
            )
    slowest = variant.slowest_wake()
    if limits.max_wake_s is not None and slowest is not None:
        cycle, seconds = slowest
        if seconds > limits.max_wake_s:
            found.append(f"wake of cycle {cycle} took {seconds:.2f} s > max_wake_s {limits.max_wake_s:g}")
    return found + slow_wake(variant, limits.max_wake_ratio)


def wake_ratio(variant: VariantResult) -> float | None:
    """The slowest cycle's wake over the server's first load of its weights (VariantResult.first_load_seconds);
    None without either."""
    slowest, load = variant.slowest_wake(), variant.first_load_seconds
    return slowest[1] / load if slowest is not None and load else None


def slow_wake(variant: VariantResult, max_ratio: float) -> list[str]:
    """The finding of a wake far above what the server needs: its slowest cycle's wake (wake steps and reload or
    push) took more than `max_ratio` × the server's own first load of the same weights (expect.max_wake_ratio), a
    first load under MIN_FIRST_LOAD_S counting as that much (a shared machine's stalls are of its size)."""
    slowest, load = variant.slowest_wake(), variant.first_load_seconds
    if slowest is None or not load:
        return []
    cycle, seconds = slowest
    if at_most(seconds, max_ratio * max(load, MIN_FIRST_LOAD_S)):
        return []
    counted = f", counted as {MIN_FIRST_LOAD_S:g} s" if load < MIN_FIRST_LOAD_S else ""
    return [
        f"slow wake: cycle {cycle}'s wake took {seconds:.2f} s, {seconds / load:.1f}× the server's first load of its"
        f" weights ({load:.2f} s by vLLM's log{counted}) > max_wake_ratio {max_ratio:g}"
    ]


METRICS_DISAGREE = "vLLM's spec-decode metrics disagree with themselves"


def metrics_findings(stages: Sequence[StageResult]) -> list[str]:
    """One finding per stage, and per data-parallel engine, whose counter deltas break an invariant of vLLM's
    counting: a fault of vLLM's metrics path, whose AL is void and never the drafter's."""
    found = []
    for stage in stages:
        parts = [("", stage.counters_disagree)] + [(f" engine {e.engine}", e.counters_disagree) for e in stage.engines]
        found += [
            f"{METRICS_DISAGREE} at {stage.name}{engine}: {why} (vLLM's metrics path, not the drafter: that AL is void)"
            for engine, why in parts
            if why is not None
        ]
    return found
