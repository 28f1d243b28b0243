"""Small-sample statistics for tok/s: median, MAD, an exact CI for the median, bootstrap ratio CIs.

Pure and deterministic (stdlib only; the bootstrap draws from `random.Random(seed)`).

Methods, chosen to be honest with the 3–10 samples a stage usually has:

* `summarize`: median, MAD = median(|x − median|) (unscaled, not ×1.4826), and a distribution-free
  confidence interval for the population median from order statistics. For sorted x(1) ≤ … ≤ x(n),
  P(x(k) ≤ median ≤ x(n−k+1)) = 1 − 2·P(B ≤ k−1) with B ~ Binomial(n, ½), whatever the distribution
  (continuous). The largest k whose coverage is ≥ `confidence` is used (computed exactly with
  fractions). When even k = 1 (the full range) falls short — n < 6 at 95 % — the interval reported is
  the full range [min, max] and `method` says so ("range (n<6)"): it is the widest statement the data
  allows, not a 95 % interval.
* `ratio`: ratio of medians with a percentile-bootstrap interval (each side resampled independently,
  `resamples` times; percentiles by linear interpolation between order statistics). With fewer than
  MIN_BOOTSTRAP_N samples on a side no interval is given (a bootstrap of one sample has zero width).
  For very small n the bootstrap interval is close to [min(a)/max(b), max(a)/min(b)].
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

MIN_BOOTSTRAP_N = 3  # per side; fewer samples give no ratio interval
DEFAULT_RESAMPLES = 2000


@dataclass(frozen=True)
class Summary:
    """Centre and spread of one stage's samples, with a confidence interval for the median."""

    n: int
    median: float | None
    mad: float | None
    ci_low: float | None
    ci_high: float | None
    method: str


@dataclass(frozen=True)
class Ratio:
    """median(numerator) / median(denominator) with an interval; None where undefined."""

    value: float | None
    ci_low: float | None
    ci_high: float | None
    method: str


def _pct(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _check_samples(samples: Sequence[float], what: str) -> list[float]:
    values = [float(x) for x in samples]
    bad = [x for x in values if not math.isfinite(x)]
    if bad:
        raise ValueError(f"{what}: samples must be finite numbers, got {bad[0]}")
    return values


def mad(samples: Sequence[float]) -> float:
    """Unscaled median absolute deviation from the median (samples must not be empty)."""
    centre = statistics.median(samples)
    return statistics.median([abs(x - centre) for x in samples])


def median_ci_coverage(n: int, k: int) -> Fraction:
    """Exact coverage of [x(k), x(n−k+1)] for the median: 1 − 2·P(Binomial(n, ½) ≤ k−1)."""
    if not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"order-statistic index k must be in [1, {(n + 1) // 2}] for n={n}, got {k}")
    tail = sum(math.comb(n, i) for i in range(k))
    return 1 - Fraction(2 * tail, 2**n)


def median_ci_rank(n: int, confidence: float) -> int | None:
    """The largest k with coverage of [x(k), x(n−k+1)] ≥ confidence; None when even k = 1 falls short."""
    _check_confidence(confidence)
    target = Fraction(str(confidence))
    best = None
    for k in range(1, (n + 1) // 2 + 1):
        if median_ci_coverage(n, k) < target:
            break
        best = k
    return best


def min_n_for_median_ci(confidence: float) -> int:
    """The smallest n for which the order-statistic interval reaches `confidence` (6 at 95 %)."""
    n = 1
    while median_ci_rank(n, confidence) is None:
        n += 1
    return n


def summarize(samples: Sequence[float], confidence: float = 0.95) -> Summary:
    """Median, MAD and a CI for the median (see the module docstring for the method)."""
    _check_confidence(confidence)
    values = sorted(_check_samples(samples, "summarize"))
    n = len(values)
    if n == 0:
        return Summary(0, None, None, None, None, "no samples")
    centre = statistics.median(values)
    spread = mad(values)
    k = median_ci_rank(n, confidence)
    if k is None:
        method = f"range (n<{min_n_for_median_ci(confidence)})"
        return Summary(n, centre, spread, values[0], values[-1], method)
    return Summary(n, centre, spread, values[k - 1], values[n - k], f"order-statistic {_pct(confidence)}")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0 ≤ q ≤ 1) of sorted values, linear interpolation between order statistics."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    pos = q * (len(sorted_values) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    frac = pos - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * frac


def _bootstrap_ratios(num: list[float], den: list[float], resamples: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        top = statistics.median(rng.choices(num, k=len(num)))
        bottom = statistics.median(rng.choices(den, k=len(den)))
        ratios.append(top / bottom)
    return sorted(ratios)


def ratio(
    numerator: Sequence[float],
    denominator: Sequence[float],
    confidence: float = 0.95,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Ratio:
    """median(numerator) / median(denominator) with a percentile-bootstrap interval.

    Samples must be finite and ≥ 0 (rates). No value when a side is empty or the denominator's median
    is 0; no interval when a side has fewer than MIN_BOOTSTRAP_N samples or any denominator sample is
    0 (a resample could divide by zero). `method` always says which case applied.

    The same samples give the same answer (the resampling is seeded), so each is computed once: a run renders its
    report after every phase, and the bootstrap of the stages it already had was most of that render.
    """
    return _ratio(tuple(numerator), tuple(denominator), confidence, resamples, seed)


@functools.lru_cache(maxsize=4096)
def _ratio(
    numerator: tuple[float, ...], denominator: tuple[float, ...], confidence: float, resamples: int, seed: int
) -> Ratio:
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be ≥ 1, got {resamples}")
    num = _check_samples(numerator, "ratio numerator")
    den = _check_samples(denominator, "ratio denominator")
    negative = [x for x in num + den if x < 0]
    if negative:
        raise ValueError(f"ratio: samples must be ≥ 0, got {negative[0]}")
    if not num or not den:
        return Ratio(None, None, None, "no samples" if not num and not den else "no samples on one side")
    bottom = statistics.median(den)
    if bottom == 0:
        return Ratio(None, None, None, "undefined (denominator median is 0)")
    value = statistics.median(num) / bottom
    if min(len(num), len(den)) < MIN_BOOTSTRAP_N:
        return Ratio(value, None, None, f"no interval (fewer than {MIN_BOOTSTRAP_N} samples on a side)")
    if min(den) == 0:
        return Ratio(value, None, None, "no interval (a denominator sample is 0)")
    ratios = _bootstrap_ratios(num, den, resamples, seed)
    alpha = (1.0 - confidence) / 2.0
    low, high = percentile(ratios, alpha), percentile(ratios, 1.0 - alpha)
    method = f"bootstrap percentile {_pct(confidence)} ({resamples} resamples, seed {seed})"
    return Ratio(value, low, high, method)


# Critical values of Student's t for df = 1..30; beyond, a Cornish-Fisher expansion of the normal point z.
_T95 = (  # two-sided 95 % (one-sided 2.5 %)
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_T99_ONE_SIDED = (  # one-sided 1 %
    31.821, 6.965, 4.541, 3.747, 3.365, 3.143, 2.998, 2.896, 2.821, 2.764,
    2.718, 2.681, 2.650, 2.624, 2.602, 2.583, 2.567, 2.552, 2.539, 2.528,
    2.518, 2.508, 2.500, 2.492, 2.485, 2.479, 2.473, 2.467, 2.462, 2.457,
)  # fmt: skip


def _t(table: tuple[float, ...], z: float, df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be ≥ 1, got {df}")
    if df <= len(table):
        return table[df - 1]
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t95(df: int) -> float:
    """The two-sided 95 % critical value of Student's t with `df` degrees of freedom (df ≥ 1)."""
    return _t(_T95, 1.959963984540054, df)


def t99(df: int) -> float:
    """The one-sided 1 % critical value of Student's t with `df` degrees of freedom (df ≥ 1)."""
    return _t(_T99_ONE_SIDED, 2.3263478740408408, df)


@dataclass(frozen=True)
class Slope:
    """Least-squares change of y per unit of x, with a 95 % interval (None below 3 points or without spread in x)."""

    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int


def slope(xs: Sequence[float], ys: Sequence[float]) -> Slope:
    """Ordinary least squares slope of ys on xs and its t interval (residual standard error, n − 2 df)."""
    points = [(float(x), float(y)) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    n = len(points)
    if n < 2:
        return Slope(None, None, None, n)
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return Slope(None, None, None, n)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    if n < 3:
        return Slope(b, None, None, n)
    residual = sum((y - mean_y - b * (x - mean_x)) ** 2 for x, y in points) / (n - 2)
    half = t95(n - 2) * math.sqrt(residual / sxx)
    return Slope(b, b - half, b + half, n)
