"""The trend speed rule of `specwake compare`: is tonight's tok/s of a variant below what earlier runs of the same
code would give, beyond the spread between runs? Pure and exact.

Within one run, requests and stages share a machine, a server process and a load; between runs they share none of
that. Measured on a shared 2-core machine (tiny-cpu and the five CPU families, 42 variant × run pairs of the same
code, sequential and side-by-side runs): the run-level change ranged from ×0.43 to ×1.40 (log sd 0.28), against a
log sd of 0.12 between the stages of one run. An interval built from one run's requests (or stages) says nothing
about the next run. The spread between runs is therefore measured, from earlier runs:

* a run's *level* for a variant is the mean of log(median tok/s) over its stages (stages with at least
  MIN_REQUESTS requests; the same stages in every run compared);
* the earlier runs (`history`: at least MIN_RUNS of them, e.g. the last nights a nightly keeps) give a mean level m,
  and their spread s (sample sd, R − 1 degrees of freedom);
* tonight's level L is a regression ("drop") when it lies below m + log(1 − max_drop) by more than a one-sided
  ALPHA prediction bound: L < m + log(1 − max_drop) − t(1 − ALPHA, R − 1) · s · √(1 + 1/R). Mirrored for "gain";
  "same" when the whole prediction interval lies within ±max_drop; anything else is "inconclusive".

Fewer than MIN_RUNS earlier runs, or too few stages or requests, give "inconclusive" with the reason: a speed call
needs a measured spread. AL is not judged here: it is exact and compared stage by stage.

The wake (wake_call) is judged the same way, on each run's median wake and reload per cycle: a *rise* beyond
max_rise and the spread between at least MIN_RUNS earlier runs is a regression. With fewer earlier runs no spread is
measured, so only a rise far beyond any seen between runs of the same code counts: above WAKE_RISE_WITHOUT_SPREAD ×
the earlier runs' median. On the repo's CPU runs (23 variants run 2–3 times, 130 ordered pairs of runs of the same
code) the median wake of one run was at most 2.25× another's (the slowest cycle's, 3.3×).
tests/unit/test_trend.py measures the false-alarm rate between runs of the same code and the power against a 2×
slowdown by simulation, over spreads from a quiet GPU to a shared CPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specwake.judge.stats import t99

ALPHA = 0.01  # one-sided
MIN_RUNS = 3  # earlier runs needed to measure the spread between runs
MIN_REQUESTS = 3  # requests a stage needs to count
WORDS = ("drop", "gain", "same", "inconclusive")
WAKE_WORDS = ("rise", "fall", "same", "inconclusive")
MAX_WAKE_RISE = 0.5  # default: a median wake above 1 + this × the earlier runs' beyond their spread is a regression
WAKE_RISE_WITHOUT_SPREAD = 5.0  # with fewer than MIN_RUNS earlier runs: a median wake above this × theirs is one


@dataclass(frozen=True)
class TrendCall:
    word: str  # drop | gain | same | inconclusive
    ratio: float | None  # exp(tonight's level − the earlier runs' mean level)
    low: float | None  # the prediction interval of a same-code run, as a ratio to the earlier mean (shifted by 0)
    high: float | None
    runs: int  # earlier runs measured
    stages: int  # stages in every run's level
    reason: str


Stages = Mapping[str, Sequence[float]]  # stage name → its requests' tok/s


def _usable(stages: Stages) -> set[str]:
    return {name for name, samples in stages.items() if len(samples) >= MIN_REQUESTS and min(samples) > 0}


def level(stages: Stages, names: Sequence[str]) -> float:
    """Mean over `names` of log(median tok/s of the stage)."""
    return statistics.fmean(math.log(statistics.median(stages[name])) for name in names)


def prediction_bound(levels: Sequence[float]) -> float:
    """How far (in log units) a run of the same code may lie from the mean of `levels`, earlier runs' log levels:
    the one-sided ALPHA prediction bound t(1 − ALPHA, R − 1) · s · √(1 + 1/R)."""
    runs = len(levels)
    return t99(runs - 1) * statistics.stdev(levels) * math.sqrt(1 + 1 / runs)


def trend_call(history: Sequence[Stages], tonight: Stages, max_drop: float) -> TrendCall:
    """drop | gain | same | inconclusive for tonight's run against `history` (earlier runs of the same variant)."""
    if not 0.0 <= max_drop < 1.0:
        raise ValueError(f"max_drop must be in [0, 1), got {max_drop}")
    runs = len(history)
    names = sorted(_usable(tonight).intersection(*(_usable(h) for h in history)) if history else set())

    def call(
        word: str, reason: str, r: float | None = None, lo: float | None = None, hi: float | None = None
    ) -> TrendCall:
        return TrendCall(word, r, lo, hi, runs, len(names), reason)

    if runs < MIN_RUNS:
        return call("inconclusive", f"{runs} earlier run(s): the spread between runs needs ≥ {MIN_RUNS}")
    if not names:
        return call("inconclusive", f"no stage with ≥ {MIN_REQUESTS} requests in every run")
    earlier = [level(h, names) for h in history]
    mean, bound = statistics.fmean(earlier), prediction_bound(earlier)
    now = level(tonight, names)
    ratio, low, high = math.exp(now - mean), math.exp(-bound), math.exp(bound)
    where = f"×{ratio:.2f} of {runs} earlier runs (same-code runs fall in ×{low:.2f}–×{high:.2f})"
    floor, ceiling = math.log(1 - max_drop), math.log(1 + max_drop)
    if now - mean < floor - bound:
        return call("drop", f"tok/s {where}, below ×{1 - max_drop:.2f}", ratio, low, high)
    if now - mean > ceiling + bound:
        return call("gain", f"tok/s {where}, above ×{1 + max_drop:.2f}", ratio, low, high)
    if floor <= now - mean - bound and now - mean + bound <= ceiling:
        return call("same", f"tok/s {where}", ratio, low, high)
    return call("inconclusive", f"tok/s {where}: within the spread between runs", ratio, low, high)


def wake_call(history: Sequence[float], tonight: float, max_rise: float) -> TrendCall:
    """rise | fall | same | inconclusive for tonight's median wake (seconds per cycle) against `history`, the
    earlier runs' median wakes of the same variant (see the module docstring)."""
    if max_rise < 0.0:
        raise ValueError(f"max_rise must be ≥ 0, got {max_rise}")
    earlier = [w for w in history if w > 0]
    runs = len(earlier)

    def call(
        word: str, reason: str, r: float | None = None, lo: float | None = None, hi: float | None = None
    ) -> TrendCall:
        return TrendCall(word, r, lo, hi, runs, 1, reason)

    if not earlier or tonight <= 0:
        return call("inconclusive", "no wake measured in " + ("this run" if earlier else "an earlier run"))
    if runs < MIN_RUNS:
        ratio = tonight / statistics.median(earlier)
        where = f"wake ×{ratio:.2f} of {runs} earlier run(s), too few for the spread between runs (≥ {MIN_RUNS})"
        if ratio > WAKE_RISE_WITHOUT_SPREAD:
            return call("rise", f"{where}: above ×{WAKE_RISE_WITHOUT_SPREAD:g}, beyond what runs of the same code"
                        " differ by", ratio)  # fmt: skip
        return call("inconclusive", f"{where}: a rise counts above ×{WAKE_RISE_WITHOUT_SPREAD:g}", ratio)
    levels = [math.log(w) for w in earlier]
    mean, bound = statistics.fmean(levels), prediction_bound(levels)
    now = math.log(tonight)
    ratio, low, high = math.exp(now - mean), math.exp(-bound), math.exp(bound)
    where = f"wake ×{ratio:.2f} of {runs} earlier runs (same-code runs fall in ×{low:.2f}–×{high:.2f})"
    ceiling = math.log(1 + max_rise)
    if now - mean > ceiling + bound:
        return call("rise", f"{where}, above ×{1 + max_rise:.2f}", ratio, low, high)
    if now - mean < -ceiling - bound:
        return call("fall", f"{where}, below ×{1 / (1 + max_rise):.2f}", ratio, low, high)
    if -ceiling <= now - mean - bound and now - mean + bound <= ceiling:
        return call("same", where, ratio, low, high)
    return call("inconclusive", f"{where}: within the spread between runs", ratio, low, high)
