"""When a stage has measured enough: anytime-valid tests of its acceptance against the lines that decide its outcome
(the collapse line, the recover bound), checked after every request. Pure: histograms in, decisions out.

**The rule: betting test martingales** (Waudby-Smith & Ramdas 2023, "Estimating means of bounded random variables by
betting", JRSS-B 86(1)). A draft step accepts j of its K tokens; x = j / K lies in [0, 1] and a stage's AL is
1 + K · mean(x), the counters' own AL. A line at AL a is m = (a − 1) / K. Two wealth processes per line, both starting
at 1, bet on every step: W⁺ = ∏ (1 + λ (x − m)), λ ∈ [0, CAP / m], grows when the steps accept more than m, and is a
nonnegative supermartingale while every step's conditional mean is ≤ m; W⁻ = ∏ (1 − λ (x − m)), λ ∈ [0, CAP / (1 − m)],
is its mirror. By Ville's inequality such a process ever reaches 1/α′ with probability ≤ α′, however often it is
looked at: so a line is *decided* — AL above it, or below it — the first time one side's wealth reaches 1/α′, and
stays decided. Of the hypotheses "mean ≤ m" and "mean ≥ m" of each line, both hold only for a line the mean equals,
so with two different lines at most three hold at once, and α′ = α / 3 keeps the chance that any line is decided on
the wrong side within α = ALPHA per stage (a union bound over the hypotheses that hold).

**Bets.** λ must be fixed before the steps it bets on: it is constant within a request (so a request's histogram of
accepted tokens per step is all the test reads, and vLLM's counters give it exactly) and chosen from the stage's
earlier requests, its unmeasured warmup included, as the paper's approximately growth-optimal bet on them (aGRAPA:
λ = (μ − m) / (σ² + (μ − m)²) from the mean μ and variance σ² of the steps seen), clipped at CAP of the largest bet
a single step could wipe out. Before anything is seen it bets nothing. A poor bet only wastes evidence; it never
makes a decision wrong.

**The assumption.** Ville's bound holds when each draft step's conditional mean acceptance, given everything before
it, is on the null's side. On the builtin tiny pairs acceptance is exact (every step accepts K, or none), so this
holds trivially. On real models acceptance varies from prompt to prompt and token to token; the test then treats
a request's steps as draws around that request's mean, which is an approximation: where the means of requests
straddle a line, a decision speaks for the requests measured. `workload.repeats` caps every stage regardless.

**Why the draft step and not the request.** Any test of a bounded mean must be able to lose to the worst
distribution with that mean. At the recover bound of the tiny pair (fresh AL 4.00, bound 3.80, K = 3: m = 0.933),
a request whose steps all accept K is one observation at x = 1, and the best bet gains a factor 1/m = 1.07 on it:
1/α′ = 300 takes log 300 / log 1.07 ≈ 83 requests. Only the steps within them carry the evidence (32 steps a request
there), so per-request units could never stop before `repeats`.

tests/unit/test_sequential.py measures the wrong-side rate and the requests taken by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

ALPHA = 0.01  # per stage: the chance that any line is decided on the wrong side
CAP = 0.95  # a bet risks at most this share of the wealth on one step
ABOVE, BELOW = "above", "below"
DEFAULT_MIN_REPEATS = 2  # workload.min_repeats when unset: the fewest requests a stage after a cycle measures


def histogram(num_drafts: int, accepted_per_position: Sequence[int]) -> tuple[int, ...] | None:
    """Draft steps by accepted tokens: counts[j] = steps that accepted exactly j of K = len(accepted_per_position)
    tokens. Acceptance is a prefix (a step stops at its first rejected token), so the steps accepting ≥ j tokens are
    the accepted count at position j − 1. None where the counts cannot come from one set of steps."""
    at_least = [num_drafts, *accepted_per_position, 0]
    if any(a < 0 for a in at_least) or any(b > a for a, b in zip(at_least, at_least[1:], strict=False)):
        return None
    return tuple(a - b for a, b in zip(at_least, at_least[1:], strict=False))


def _gain(counts: Sequence[int], m: float, bet: float) -> float:
    """log of ∏ (1 + bet (x − m)) over the steps of `counts`."""
    k = len(counts) - 1
    return sum(n * math.log1p(bet * (j / k - m)) for j, n in enumerate(counts) if n)


def bets(counts: Sequence[int], m: float, cap: float = CAP) -> tuple[float, float]:
    """(λ⁺, λ⁻) for the next request: the approximate growth-optimal bets of aGRAPA, λ = (μ − m) / (σ² + (μ − m)²)
    with μ, σ² the mean and variance of x over the steps of `counts`, λ⁺ = λ clipped to [0, cap / m], λ⁻ = −λ clipped
    to [0, cap / (1 − m)]. Nothing seen: no bet."""
    k, total = len(counts) - 1, sum(counts)
    if k < 1 or total == 0:
        return 0.0, 0.0
    mean = sum(n * j / k for j, n in enumerate(counts)) / total
    variance = sum(n * (j / k - mean) ** 2 for j, n in enumerate(counts)) / total
    gap = mean - m
    bet = gap / (variance + gap * gap) if gap else 0.0
    return min(max(bet, 0.0), cap / m), min(max(-bet, 0.0), cap / (1.0 - m))


@dataclass(frozen=True)
class Line:
    """One line a stage's AL is tested against, and the evidence so far on either side of it."""

    name: str  # "the recover bound", "the collapse line"
    al: float
    log_above: float = 0.0  # log W⁺: evidence that the steps accept more than the line
    log_below: float = 0.0  # log W⁻: evidence that they accept less
    side: str | None = None  # ABOVE or BELOW once decided; it stays so

    def words(self) -> str:
        return f"{self.name} {self.al:.2f}"


@dataclass(frozen=True)
class AcceptanceTest:
    """The lines of one stage after the requests observed so far."""

    lines: tuple[Line, ...]
    alpha: float = ALPHA
    seen: tuple[int, ...] = ()  # every step so far, warmup included: what the next bets are chosen from
    requests: int = 0  # measured requests observed

    @property
    def decided(self) -> bool:
        return all(line.side is not None for line in self.lines)

    @property
    def level(self) -> float:
        """log(1/α′): the log-wealth that decides a side. α′ = α / (the most one-sided hypotheses that can hold at
        once: one per line, and both sides of the lines at the mean's own value)."""
        alike = max((sum(other.al == line.al for other in self.lines) for line in self.lines), default=0)
        return math.log((len(self.lines) + alike) / self.alpha)

    def observe(self, counts: Sequence[int]) -> AcceptanceTest:
        """The test after one more measured request, whose steps are `counts` (see histogram)."""
        k = max(len(counts), len(self.seen)) - 1
        now, before = _padded(counts, k), _padded(self.seen, k)
        lines = tuple(line if line.side is not None else self._bet(line, before, now, k) for line in self.lines)
        seen = tuple(a + b for a, b in zip(before, now, strict=True))
        return replace(self, lines=lines, seen=seen, requests=self.requests + 1)

    def warmed(self, counts: Sequence[int]) -> AcceptanceTest:
        """The test after unmeasured steps (the warmup): they choose the first bets and decide nothing."""
        k = max(len(counts), len(self.seen)) - 1
        return replace(self, seen=tuple(a + b for a, b in zip(_padded(self.seen, k), _padded(counts, k), strict=True)))

    def _bet(self, line: Line, before: Sequence[int], now: Sequence[int], k: int) -> Line:
        if k < 1:
            return line
        m = (line.al - 1.0) / k
        if m <= 0.0:  # every AL is at least 1: above, whatever is measured
            return replace(line, side=ABOVE)
        if math.isclose(m, 1.0):  # at K + 1: below as soon as a step accepts fewer than K
            return replace(line, side=BELOW) if any(now[:-1]) else line
        if m > 1.0:  # no AL exceeds K + 1
            return replace(line, side=BELOW)
        bet_up, bet_down = bets(before, m)
        up = line.log_above + _gain(now, m, bet_up)
        down = line.log_below + _gain(now, m, -bet_down)
        side = ABOVE if up >= self.level and up >= down else BELOW if down >= self.level else None
        return replace(line, log_above=up, log_below=down, side=side)

    def reason(self) -> str:
        """What was decided: "AL above the recover bound 3.80 and the collapse line 1.05"."""
        sides = {ABOVE: [w.words() for w in self.lines if w.side == ABOVE]}
        sides[BELOW] = [w.words() for w in self.lines if w.side == BELOW]
        parts = [f"{side} {' and '.join(names)}" for side, names in sides.items() if names]
        return "AL " + " and ".join(parts) if parts else "nothing"

    def undecided(self) -> str:
        return " and ".join(line.words() for line in self.lines if line.side is None)


def _padded(counts: Sequence[int], k: int) -> tuple[int, ...]:
    """A histogram over 0..k accepted tokens (a shorter one has no steps beyond its own K)."""
    return (*counts, *([0] * (k + 1 - len(counts))))


def acceptance_test(lines: Sequence[tuple[str, float]], alpha: float = ALPHA) -> AcceptanceTest:
    """A test of a stage's AL against `lines` ((name, AL) each), nothing observed yet."""
    return AcceptanceTest(tuple(Line(name, al) for name, al in lines), alpha)
