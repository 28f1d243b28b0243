"""The speed rule: did decoding after the cycles keep `min_ratio` of the fresh speed? Pure and exact.

One call per variant, on every post-cycle request pooled (so more cycles never mean more chances of a false
alarm). "lost" needs two tests to reject "no loss" at ALPHA (one-sided):

1. an exact Mann–Whitney test of the pooled post-cycle requests against min_ratio × the fresh ones. It is
   distribution-free and says whether there are *enough samples*: it can reject only when the most extreme
   arrangement is rare enough, 1 / C(n_fresh + n_post, n_fresh) ≤ ALPHA — 3 fresh requests need 7
   post-cycle ones, 4 need 5, 5 need 4. Fewer give "inconclusive", never "lost";
2. a z-test of log(median post / median fresh) against log(min_ratio) whose variance adds, to the requests'
   own spread, a stage-to-stage spread of STAGE_SPREAD for the fresh stage and for the mean of the c
   post-cycle stages: σ² = STAGE_SPREAD² (1 + 1/c) + s²(1/n_fresh + 1/n_post). Requests within one stage share
   the machine's load of that moment, so on a shared machine a whole stage runs faster or slower than the next
   (measured on a 2-core machine with other work running: stage medians spread by ~9 % in log terms, one stage
   in 13 ran ~25 % slow), and a single fresh stage is never enough to call a small loss.

"kept" is the mirrored test 1 (post-cycle requests above min_ratio × fresh) rejecting at ALPHA; anything else
is "inconclusive". tests/unit/test_speed_rule.py measures the false-alarm rate and the power of this rule by
simulation from request speeds recorded on a shared 2-core machine (tests/data/tok-s-2core.json).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.01
Z_ALPHA = 2.3263478740408408  # the one-sided 1 % point of the standard normal
STAGE_SPREAD = 0.09  # sd of log stage-median tok/s between stages of one run, measured on a shared 2-core box
WORDS = ("kept", "lost", "inconclusive")


@dataclass(frozen=True)
class SpeedCall:
    word: str  # kept | lost | inconclusive
    ratio: float | None  # median of the pooled post-cycle requests / median of the fresh ones
    p_lost: float | None  # one-sided p-value for "post below min_ratio × fresh"
    p_kept: float | None  # one-sided p-value for "post above min_ratio × fresh"
    n_fresh: int
    n_post: int
    stages: int
    reason: str  # one line: what decided the word


@functools.lru_cache(maxsize=512)
def _u_counts(a: int, b: int) -> tuple[int, ...]:
    """counts[u] = arrangements of a A-values and b B-values with u pairs where the A-value is the larger."""
    rows: list[list[int]] = [[1] for _ in range(a + 1)]  # b = 0: U is 0 for every a
    for bb in range(1, b + 1):
        for aa in range(1, a + 1):
            shifted, kept = rows[aa - 1], rows[aa]  # (aa-1, bb) already updated; (aa, bb-1) not yet
            size = max(len(shifted) + bb, len(kept))
            merged = [0] * size
            for u, count in enumerate(kept):
                merged[u] += count
            for u, count in enumerate(shifted):
                merged[u + bb] += count
            rows[aa] = merged
    return tuple(rows[a])


def rank_p_value(larger: Sequence[float], smaller: Sequence[float]) -> float:
    """Exact one-sided Mann–Whitney p-value for "`larger` tends to exceed `smaller`" (ties count half; the
    p-value is rounded towards the conservative side)."""
    a, b = len(larger), len(smaller)
    if a == 0 or b == 0:
        raise ValueError("rank test needs samples on both sides")
    u = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in larger for y in smaller)
    counts = _u_counts(a, b)
    at_least = sum(counts[math.floor(u) :])
    return at_least / math.comb(a + b, a)


def min_p_value(n_fresh: int, n_post: int) -> float:
    """The smallest p-value the rank test can give with these sample sizes."""
    return 1.0 / math.comb(n_fresh + n_post, n_fresh)


def speed_call(fresh: Sequence[float], post_stages: Sequence[Sequence[float]], min_ratio: float) -> SpeedCall:
    """kept | lost | inconclusive for the post-cycle tok/s of one variant (see the module docstring)."""
    if not min_ratio > 0.0:
        raise ValueError(f"min_ratio must be > 0, got {min_ratio}")
    stages = [list(s) for s in post_stages if s]
    pooled = [x for s in stages for x in s]
    n_fresh, n_post = len(fresh), len(pooled)
    if not fresh or not pooled:
        return SpeedCall("inconclusive", None, None, None, n_fresh, n_post, len(stages), "no samples to compare")
    ratio = statistics.median(pooled) / statistics.median(fresh) if statistics.median(fresh) > 0 else None
    bar = [min_ratio * x for x in fresh]
    p_lost, p_kept = rank_p_value(bar, pooled), rank_p_value(pooled, bar)
    floor = min_p_value(n_fresh, n_post)

    def call(word: str, reason: str) -> SpeedCall:
        return SpeedCall(word, ratio, p_lost, p_kept, n_fresh, n_post, len(stages), reason)

    if floor > ALPHA:
        return call(
            "inconclusive", f"too few requests for a {ALPHA:.0%} test ({n_fresh} fresh need {_needed(n_fresh)})"
        )
    if p_kept <= ALPHA:
        return call("kept", f"post-cycle requests above {min_ratio:.2f}× fresh (p = {p_kept:.2g})")
    if p_lost > ALPHA:
        return call("inconclusive", f"no clear loss below {min_ratio:.2f}× fresh (p = {p_lost:.2g})")
    z = _stage_aware_z(fresh, stages, min_ratio)
    if z is None or z > -Z_ALPHA:
        return call("inconclusive", "below the threshold, but within the spread between stages of one run")
    return call("lost", f"below {min_ratio:.2f}× fresh beyond the spread between stages (p = {p_lost:.2g})")


def _needed(n_fresh: int) -> str:
    """How many post-cycle requests make a test at ALPHA possible with `n_fresh` fresh ones."""
    n_post = 1
    while min_p_value(n_fresh, n_post) > ALPHA:
        n_post += 1
    return f"≥ {n_post} post-cycle"


def _log_spread(values: Sequence[float]) -> float:
    logs = [math.log(x) for x in values]
    return statistics.stdev(logs) if len(logs) > 1 else 0.0


def _stage_aware_z(fresh: Sequence[float], stages: Sequence[Sequence[float]], min_ratio: float) -> float | None:
    """z of log(median post / median fresh) − log(min_ratio), with stage-to-stage spread in its variance."""
    pooled = [x for s in stages for x in s]
    if min(fresh) <= 0 or min(pooled) <= 0:
        return None
    within = statistics.fmean([_log_spread(s) for s in [fresh, *stages]])  # requests' own spread, in logs
    variance = STAGE_SPREAD**2 * (1 + 1 / len(stages)) + within**2 * (1 / len(fresh) + 1 / len(pooled))
    gap = math.log(statistics.median(pooled) / statistics.median(fresh)) - math.log(min_ratio)
    return gap / math.sqrt(variance)
