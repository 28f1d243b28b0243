"""Unit tests of specwake.judge.stats: medians/MADs by hand, exact order-statistic CIs, bootstrap ratios.

Binomial coverages are recomputed here from math.comb; synthetic data comes from seeded generators.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from specwake.judge.stats import (
    MIN_BOOTSTRAP_N,
    Ratio,
    mad,
    median_ci_rank,
    min_n_for_median_ci,
    percentile,
    ratio,
    summarize,
)


def coverage(n: int, k: int) -> float:
    """P(x(k) ≤ median ≤ x(n-k+1)) for a continuous distribution, recomputed independently."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n


def table_rank(n: int, confidence: float) -> int | None:
    ranks = [k for k in range(1, (n + 1) // 2 + 1) if coverage(n, k) >= confidence - 1e-12]
    return max(ranks) if ranks else None


# ------------------------------------------------------------ summarize


def test_median_and_mad_by_hand() -> None:
    s = summarize([7.0, 1.0, 3.0, 2.0, 10.0])
    # sorted 1 2 3 7 10 → median 3; |x−3| = 2 1 0 4 7 → sorted 0 1 2 4 7 → MAD 2
    assert (s.n, s.median, s.mad) == (5, 3.0, 2.0)
    even = summarize([4.0, 1.0, 2.0, 8.0])
    # median (2+4)/2 = 3; deviations 2 1 1 5 → median (1+2)/2 = 1.5
    assert (even.median, even.mad) == (3.0, 1.5)
    assert mad([5.0, 5.0, 5.0]) == 0.0


def test_small_n_falls_back_to_the_full_range_and_says_so() -> None:
    for n in range(1, 6):
        values = [float(v) for v in random.Random(n).sample(range(100), n)]
        s = summarize(values)
        assert (s.ci_low, s.ci_high) == (min(values), max(values))
        assert s.method == "range (n<6)"
    assert summarize([42.0]).median == 42.0 and summarize([42.0]).mad == 0.0


def test_no_samples() -> None:
    s = summarize([])
    assert (s.n, s.median, s.mad, s.ci_low, s.ci_high) == (0, None, None, None, None)
    assert s.method == "no samples"


@pytest.mark.parametrize("confidence", [0.90, 0.95, 0.99])
def test_order_statistic_rank_matches_binomial_table(confidence: float) -> None:
    for n in range(1, 60):
        assert median_ci_rank(n, confidence) == table_rank(n, confidence), n
    first = min(n for n in range(1, 60) if table_rank(n, confidence) is not None)
    assert min_n_for_median_ci(confidence) == first


def test_order_statistic_interval_picks_the_tabled_order_statistics() -> None:
    rng = random.Random(7)
    for n in (6, 9, 10, 20, 31):
        values = [rng.uniform(10, 50) for _ in range(n)]
        k = table_rank(n, 0.95)
        assert k is not None
        ordered = sorted(values)
        s = summarize(values)
        assert (s.ci_low, s.ci_high) == (ordered[k - 1], ordered[n - k])
        assert s.method == "order-statistic 95%"
        assert s.median == statistics.median(values)


def test_summarize_is_deterministic_and_rejects_bad_input() -> None:
    values = [3.0, 1.0, 2.0, 9.0, 4.0, 4.5, 7.0]
    assert summarize(values) == summarize(list(reversed(values)))
    with pytest.raises(ValueError, match="finite"):
        summarize([1.0, math.inf])
    with pytest.raises(ValueError, match="confidence"):
        summarize([1.0], confidence=1.0)


def test_order_statistic_interval_covers_the_median_at_its_nominal_rate() -> None:
    """Distribution-free: coverage on skewed data matches the exact binomial figure."""
    rng = random.Random(2024)
    n, trials = 10, 4000
    true_median = math.log(2)  # exponential(1)
    hits = 0
    for _ in range(trials):
        s = summarize([rng.expovariate(1.0) for _ in range(n)])
        assert s.ci_low is not None and s.ci_high is not None
        hits += s.ci_low <= true_median <= s.ci_high
    expected = coverage(n, table_rank(n, 0.95) or 1)
    assert abs(hits / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


# ------------------------------------------------------------ ratio


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert percentile([0.0, 10.0], 0.25) == 2.5
    assert percentile([1.0, 3.0], 1.0) == 3.0


def test_ratio_value_is_the_ratio_of_medians() -> None:
    r = ratio([30.0, 10.0, 20.0], [5.0, 4.0, 6.0])
    assert r.value == 20.0 / 5.0
    assert r.ci_low is not None and r.ci_high is not None
    assert r.ci_low <= r.value <= r.ci_high
    assert r.method.startswith("bootstrap percentile 95%")


def test_ratio_bootstrap_is_deterministic_per_seed() -> None:
    rng = random.Random(1)
    a = [rng.gauss(40, 3) for _ in range(8)]
    b = [rng.gauss(38, 3) for _ in range(8)]
    assert ratio(a, b, seed=3) == ratio(a, b, seed=3)
    assert ratio(a, b, seed=3) != ratio(a, b, seed=4)


def test_ratio_interval_is_bounded_by_the_extreme_sample_ratios() -> None:
    num, den = [10.0, 12.0, 11.0], [20.0, 25.0, 22.0]
    r = ratio(num, den)
    assert r.ci_low is not None and r.ci_high is not None
    assert min(num) / max(den) <= r.ci_low <= r.ci_high <= max(num) / min(den)


def test_ratio_undefined_cases_say_why() -> None:
    assert ratio([], [1.0, 2.0, 3.0]) == Ratio(None, None, None, "no samples on one side")
    assert ratio([1.0, 2.0, 3.0], [0.0, 0.0, 5.0]).value is None
    short = ratio([1.0] * (MIN_BOOTSTRAP_N - 1), [2.0] * 5)
    assert short.value == 0.5 and short.ci_low is None and "fewer than" in short.method
    zero = ratio([1.0, 2.0, 3.0], [0.0, 2.0, 2.0])
    assert zero.value == 1.0 and zero.ci_low is None
    with pytest.raises(ValueError, match="≥ 0"):
        ratio([1.0, -1.0, 2.0], [1.0, 1.0, 1.0])


def test_ratio_bootstrap_coverage_on_synthetic_data() -> None:
    """Both sides normal with known medians: the 95% interval holds the true ratio most of the time."""
    rng = random.Random(99)
    true = 36.0 / 40.0
    trials, hits = 150, 0
    for _ in range(trials):
        new = [rng.gauss(36.0, 2.0) for _ in range(15)]
        old = [rng.gauss(40.0, 2.0) for _ in range(15)]
        r = ratio(new, old, resamples=400, seed=rng.randrange(1 << 30))
        assert r.ci_low is not None and r.ci_high is not None
        hits += r.ci_low <= true <= r.ci_high
    assert 0.85 <= hits / trials <= 1.0


# ------------------------------------------------------------ calls


def test_clear_drop_and_noisy_samples_from_data() -> None:
    fresh = [41.25, 40.5, 42.0, 41.0, 40.75]
    collapsed = [15.5, 15.25, 15.75, 15.0, 15.4]
    clear = ratio(collapsed, fresh)
    assert clear.ci_high is not None and clear.ci_high < 0.9  # the whole interval below 1 − 10 %
    noisy = ratio([20.0, 60.0, 35.0, 45.0, 25.0], fresh)
    assert noisy.ci_low is not None and noisy.ci_high is not None
    assert noisy.ci_low < 0.9 < noisy.ci_high  # the interval straddles the bound: no direction to call
