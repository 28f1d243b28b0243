"""The report's lines about what a wake does beyond AL: the prefix cache right after each wake, tokens and logprobs
against fresh, what each wake costs (time, host memory), and over many cycles a per-cycle ledger with its drift.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from specwake.judge.stats import Slope, slope
from specwake.protocol import AWAKE_POINT
from specwake.report.markdown import MISSING, cell, inline, num
from specwake.report.weights import GIB
from specwake.results import LOGPROB_TOLERANCE, MIB, StageResult, VariantResult

MIN_DRIFT_CYCLES = 3  # a slope needs this many cycles for an interval


def _post(variant: VariantResult) -> list[StageResult]:
    return sorted((s for s in variant.stages if s.cycle > 0), key=lambda s: s.cycle)


def prefix_cache_line(variants: Sequence[VariantResult]) -> list[str]:
    """Cached prompt tokens of the first request after each wake (must be 0), with the control repeat."""
    parts, controls = [], []
    for v in variants:
        after = [s.prefix_cached for s in _post(v) if s.prefix_cached is not None]
        if after:
            parts.append(f"{v.name} " + " · ".join(str(n) for n in after))
        controls += [s.prefix_cached_repeat for s in v.stages if s.prefix_cached_repeat is not None]
    if not parts:
        return []
    stale = any(s.prefix_cached for v in variants for s in _post(v))
    works = bool(controls) and max(controls) > 0
    control = (
        f"the same prompt again: {max(controls)} cached" if works else "prefix caching off (no hit even on repeat)"
    )
    verdict = "STALE: tokens served from a cache the wake emptied" if stale else "no stale hashes"
    return [f"- prefix cache, first request after each wake: {', '.join(parts)} cached tokens ({control}) — {verdict}"]


def logprob_line(variant: VariantResult) -> str | None:
    """How the tokens and their logprobs compare with fresh after every cycle."""
    post = [s for s in _post(variant) if s.logprobs_compared is not None]
    if not post:
        return None
    diverged = next((s for s in post if s.first_difference), None)
    drifts = [s.max_logprob_drift for s in post if s.max_logprob_drift is not None]
    over = sum(s.logprobs_over_tolerance or 0 for s in post)
    compared = sum(s.logprobs_compared or 0 for s in post)
    if diverged is not None and diverged.first_difference is not None:
        request, token = diverged.first_difference
        text = f"tokens differ from fresh at {diverged.name}, request {request + 1}, token {token}"
        if [request, token] in diverged.near_ties:
            text += " (a near-tie: numerics)"
    else:
        text = "identical tokens"
    if drifts:
        text += f"; logprob drift up to {max(drifts):.3g} ({over}/{compared} positions over {LOGPROB_TOLERANCE:g})"
        fresh = next((s for s in variant.stages if s.cycle == 0), None)
        if fresh is not None and fresh.own_logprob_drift is not None:
            text += f", fresh's own requests of one prompt {fresh.own_logprob_drift:.3g}"
        if diverged is None and max(drifts) > LOGPROB_TOLERANCE:
            text += " — same text, different probabilities (what breaks RL importance ratios)"
    return inline(f"- **{variant.name}** vs fresh: {text}")


def cost_table(variants: Sequence[VariantResult]) -> list[str]:
    """What each variant's wake costs, side by side: the trade-off of reloading against preserving in host memory."""
    rows = []
    for v in variants:
        wakes, rss, asleep = v.wake_seconds(), v.rss_after_wake(), v.rss_asleep()
        if wakes or rss:
            seconds = statistics.median(wakes.values()) if wakes else None
            host = statistics.median(rss.values()) / MIB if rss else None
            held = statistics.median(asleep.values()) / MIB if asleep else None
            rows.append((v.name, seconds, held, host))
    if not rows:
        return []
    lines = [
        "| variant | wake + reload per cycle (s, median) | host RSS asleep (MiB, median) |"
        " host RSS after wake (MiB, median) |"
    ]
    lines.append("| --- | ---: | ---: | ---: |")
    lines += [f"| {cell(n)} | {num(s, 3)} | {num(a, 0)} | {num(h, 0)} |" for n, s, a, h in rows]
    return ["", *lines]


def _free_after_wake(variant: VariantResult) -> dict[int, float]:
    """Cycle → free device memory of rank 0 after the wake, GiB (GPU only)."""
    free: dict[int, float] = {}
    for entry in variant.diagnostics:
        value = entry.memory[0].free_bytes if entry.memory else None
        if entry.point == AWAKE_POINT and value is not None:
            free[entry.cycle] = value / GIB
    return free


def ledger(variant: VariantResult) -> list[str]:
    """One row per cycle: AL and decode time after it, what its wake took and left in memory."""
    post = {s.cycle: s for s in _post(variant)}
    wakes, rss, free = variant.wake_seconds(), variant.rss_after_wake(), _free_after_wake(variant)
    cycles = sorted(set(post) | set(wakes) | set(rss))
    if not cycles:
        return []
    lines = ["Wake ledger:", "", "| cycle | AL | TPOT ms | 1st TTFT ms | wake s | host RSS MiB | device free GiB |"]
    lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in cycles:
        stage = post.get(c)
        tpot = _median_ms(stage.tpot) if stage else None
        ttft = stage.first_request_ttft * 1000 if stage and stage.first_request_ttft is not None else None
        device = num(free[c], 2) if c in free else "n/a (cpu)" if variant.platform == "cpu" else MISSING
        lines.append(
            f"| {c} | {num(stage.acceptance_length if stage else None, 2)} | {num(tpot, 2)} | {num(ttft, 1)} | "
            f"{num(wakes.get(c), 3)} | {num(rss[c] / MIB if c in rss else None, 0)} | {device} |"
        )
    return [*lines, ""]


def _median_ms(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) * 1000 if known else None


def _within_al(s: Slope, variant: VariantResult, cycles: Sequence[int]) -> Slope:
    """The AL slope and its interval held to what AL can do: AL lies in [1, K + 1], so over the cycles measured it
    changes by at most K, at most K / (last − first cycle) a cycle. A t interval of few noisy cycles (3 cycles: 1
    degree of freedom, t = 12.7) would otherwise claim changes no drafter can make."""
    k = max((len(stage.per_position) for stage in variant.stages), default=0)
    span = max(cycles, default=0) - min(cycles, default=0)
    if not k or not span or s.value is None:
        return s
    most = k / span

    def held(x: float | None) -> float | None:
        return None if x is None else min(max(x, -most), most)

    return replace(s, value=held(s.value), ci_low=held(s.ci_low), ci_high=held(s.ci_high))


def _slope_text(s: Slope, unit: str, digits: int) -> str:
    if s.value is None:
        return MISSING
    interval = (
        f" [{s.ci_low:+.{digits}f}, {s.ci_high:+.{digits}f}]" if s.ci_low is not None and s.ci_high is not None else ""
    )
    return f"{s.value:+.{digits}f}{interval} {unit}"


def drift_line(variant: VariantResult) -> str | None:
    """Per-cycle slope of host RSS, wake time and AL, with a 95 % interval (from MIN_DRIFT_CYCLES cycles on)."""
    rss, wakes = variant.rss_after_wake(), variant.wake_seconds()
    als = {s.cycle: s.acceptance_length for s in _post(variant) if s.acceptance_length is not None}
    if max(len(rss), len(wakes), len(als)) < MIN_DRIFT_CYCLES:
        return None
    parts = [
        f"host RSS {_slope_text(slope(list(rss), [v / MIB for v in rss.values()]), 'MiB', 2)}",
        f"wake {_slope_text(slope(list(wakes), list(wakes.values())), 's', 4)}",
        f"AL {_slope_text(_within_al(slope(list(als), list(als.values())), variant, list(als)), '', 4)}".rstrip(),
    ]
    count = max(len(rss), len(wakes), len(als))
    return inline(f"- **{variant.name}** drift per cycle over {count} cycles: " + ", ".join(parts))
