"""The early stop of a stage after a cycle (specwake.judge.sequential): its pieces checked exactly, its wrong-side
rate and the requests it takes measured by a seeded simulation of draft steps.

A simulated stage is the tiny pair's: K = 3, 128 tokens a request (127 decode steps / AL draft steps), one warmup
request of the shipped length (WARMUP_TOKENS: 16 tokens), then measured requests until both lines are decided (from
MIN_REPEATS on) or REPEATS. The lines are the shipped ones for a fresh AL of 4.00: the recover bound 3.80 (tolerance
0.05) and the collapse line 1.05. Processes:

- chain: every token of a step accepted with probability p until the first rejection (truncated at K), steps
  independent: the test's assumption, exactly;
- collapsing: each request, the warmup included, collapses whole (no token accepted) with probability q, else is a
  chain; q sets the process's AL;
- per-request rate: each request draws its own p around the process's (sd 0.05), so its steps are correlated
  through it;
- stretches: within a request steps run in easy and hard stretches (a Markov switch every 10 steps on average),
  easy ones accepting twice what the process does beyond AL 1 (at most every token), hard ones the rest.

"Wrong side": a line decided above while the truth is at or below it, or below while at or above. The truth is the
process's AL for chain and stretches; for collapsing and per-request rate, whose requests differ from each other,
it is the AL of the requests the stage measured (what a stage can speak for; the process's own AL, and how often
measuring all REPEATS would put the counters' AL on its wrong side, are printed beside). Run with -s for the table.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from specwake.judge.sequential import (
    ABOVE,
    ALPHA,
    BELOW,
    CAP,
    AcceptanceTest,
    acceptance_test,
    bets,
    histogram,
)
from specwake.prepare.scenario_file import WARMUP_TOKENS

K = 3
TOKENS = 128
BOUND, COLLAPSE = 0.95 * 4.0, 1.05
LINES = (("the recover bound", BOUND), ("the collapse line", COLLAPSE))
REPEATS, MIN_REPEATS = 5, 2  # the shipped workload
TRIALS = 400  # per cell
LONG, LONG_TRIALS = 20, 300  # the anytime check: one line looked at after each of 20 requests
SPLIT = 3  # two different lines: of "mean ≤ line" and "mean ≥ line" for each, at most three hold at once
UNLIKELY = 1e-3  # a wrong-side count whose binomial tail at ALPHA is below this fails the test


def chain_al(p: float) -> float:
    return 1.0 + sum(p**i for i in range(1, K + 1))


def chain_p(al: float) -> float:
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if chain_al(mid) < al else (low, mid)
    return (low + high) / 2


def steps_of(al: float, tokens: int = TOKENS) -> int:
    return max(1, round((tokens - 1) / al))


def chain_steps(rng: random.Random, p: float, steps: int) -> list[int]:
    """A request's histogram: `steps` independent steps of a chain with acceptance p."""
    weights = [p**j * (1 - p) for j in range(K)] + [p**K]
    drawn = rng.choices(range(K + 1), weights=weights, k=steps)
    return [drawn.count(j) for j in range(K + 1)]


@dataclass(frozen=True)
class Request:
    counts: list[int]
    al: float  # the AL its own process had (what its counters estimate)


Process = Callable[[random.Random, int], Request]  # a request of that many tokens


def chain(al: float) -> Process:
    p = chain_p(al)
    return lambda rng, tokens: Request(chain_steps(rng, p, steps_of(al, tokens)), al)


def collapsing(al: float, normal: float) -> Process:
    """Requests collapse whole with the probability q that makes the counters' AL (steps pooled) `al`."""
    gain, steps = (normal - 1.0) * steps_of(normal), steps_of(normal)
    q = (gain - (al - 1.0) * steps) / (gain - (al - 1.0) * steps + (al - 1.0) * steps_of(1.0))
    normal_request = chain(normal)

    def draw(rng: random.Random, tokens: int) -> Request:
        return Request([steps_of(1.0, tokens), 0, 0, 0], 1.0) if rng.random() < q else normal_request(rng, tokens)

    return draw


def per_request_rate(al: float, sd: float = 0.05) -> Process:
    p0 = chain_p(al)

    def draw(rng: random.Random, tokens: int) -> Request:
        p = min(1.0, max(0.0, rng.gauss(p0, sd)))
        return Request(chain_steps(rng, p, steps_of(chain_al(p), tokens)), chain_al(p))

    return draw


def stretches(al: float, switch: float = 0.1) -> Process:
    """Easy stretches accept twice what the process does beyond AL 1 (at most every token), hard ones the rest."""
    easy_al = min(K + 1.0, 2.0 * al - 1.0)
    easy, hard = chain_p(easy_al), chain_p(2.0 * al - easy_al)

    def draw(rng: random.Random, tokens: int) -> Request:
        counts, state = [0] * (K + 1), rng.random() < 0.5
        for _ in range(steps_of(al, tokens)):
            if rng.random() < switch:
                state = not state
            p, accepted = (easy if state else hard), 0
            while accepted < K and rng.random() < p:
                accepted += 1
            counts[accepted] += 1
        return Request(counts, al)

    return draw


def pooled_al(requests: list[Request]) -> float:
    """The AL the counters of these requests estimate (their steps pooled)."""
    steps = sum(steps_of(r.al) for r in requests)
    return 1.0 + sum((r.al - 1.0) * steps_of(r.al) for r in requests) / steps


def counters_al(requests: list[Request]) -> float:
    steps = sum(sum(r.counts) for r in requests)
    return 1.0 + sum(j * n for r in requests for j, n in enumerate(r.counts)) / steps


def stage(
    rng: random.Random,
    process: Process,
    *,
    repeats: int = REPEATS,
    least: int = MIN_REPEATS,
    warmup: int = 1,
    tokens: int = TOKENS,
    warmup_tokens: int = WARMUP_TOKENS,
    lines: tuple[tuple[str, float], ...] = LINES,
) -> tuple[AcceptanceTest, list[Request]]:
    """One simulated stage after a cycle, stopped as specwake.run.measure.measure stops it."""
    test = acceptance_test(lines)
    for _ in range(warmup):
        test = test.warmed(process(rng, warmup_tokens).counts)
    measured = []
    for n in range(1, repeats + 1):
        measured.append(process(rng, tokens))
        test = test.observe(measured[-1].counts)
        if n >= least and test.decided:
            break
    return test, measured


def wrong(test: AcceptanceTest, truth: float) -> bool:
    return any(
        (line.side == ABOVE and truth <= line.al) or (line.side == BELOW and truth >= line.al) for line in test.lines
    )


def tail(n: int, k: int, p: float = ALPHA) -> float:
    """P(Binomial(n, p) ≥ k)."""

    def log_term(i: int) -> float:
        ways = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        return ways + i * math.log(p) + (n - i) * math.log1p(-p)

    return sum(math.exp(log_term(i)) for i in range(k, n + 1))


@dataclass(frozen=True)
class Cell:
    process: str
    al: float
    trials: int
    wrong: int  # against the truth of the process (see the module docstring)
    wrong_overall: int  # against the process's own AL
    fixed_wrong_overall: int  # the counters' AL of all REPEATS on the wrong side of a line, against the process's AL
    decided: int
    requests: int  # summed over trials
    asserted: bool = True

    @property
    def rate(self) -> float:
        return self.wrong / self.trials


POSITIONS = {"recover bound": (BOUND - 0.05, BOUND, BOUND + 0.05), "collapse line": (1.03, COLLAPSE, 1.07)}


def processes(al: float, near: str) -> dict[str, tuple[Process, bool]]:
    """name → (process at AL `al`, whether its truth is the measured requests' AL)."""
    return {
        "chain": (chain(al), False),
        "collapsing": (collapsing(al, 4.0 if near == "recover bound" else 2.0), True),
        "per-request rate": (per_request_rate(al), True),
        "stretches": (stretches(al), False),
    }


def side_of(al: float, line: float) -> int:
    return (al > line) - (al < line)


def cell(rng: random.Random, name: str, process: Process, al: float, by_requests: bool) -> Cell:
    bad = bad_overall = fixed_bad = decided = requests = 0
    for _ in range(TRIALS):
        test, measured = stage(rng, process)
        bad += wrong(test, pooled_al(measured) if by_requests else al)
        bad_overall += wrong(test, al)
        decided += test.decided
        requests += test.requests
        full = measured + [process(rng, TOKENS) for _ in range(REPEATS - len(measured))]
        fixed_bad += any(side_of(counters_al(full), line) * side_of(al, line) < 0 for _, line in LINES)
    if any(math.isclose(al, line) for _, line in LINES):
        fixed_bad = -1  # on a line: the counters' AL has no wrong side
    return Cell(name, al, TRIALS, bad, bad_overall, fixed_bad, decided, requests)


def long_cell(rng: random.Random, name: str, process: Process, al: float, asserted: bool) -> Cell:
    """One line, looked at after every one of LONG requests: Ville's bound over many looks."""
    line = min(LINES, key=lambda item: abs(item[1] - al))
    bad = decided = requests = 0
    for _ in range(LONG_TRIALS):
        test, _ = stage(rng, process, repeats=LONG, least=1, lines=(line,))
        bad += wrong(test, al)
        decided += test.decided
        requests += test.requests
    return Cell(name, al, LONG_TRIALS, bad, bad, 0, decided, requests, asserted)


@pytest.fixture(scope="module")
def table() -> list[Cell]:
    rng = random.Random(20261202)
    cells = []
    for near, positions in POSITIONS.items():
        for al in positions:
            for name, (process, by_requests) in processes(al, near).items():
                cells.append(cell(rng, name, process, al, by_requests))
    cells += [long_cell(rng, f"chain, {LONG} looks", chain(al), al, True) for al in (BOUND, COLLAPSE)]
    cells += [long_cell(rng, f"stretches, {LONG} looks", stretches(al), al, True) for al in (BOUND, COLLAPSE)]
    # Stretches longer than a request (a switch every 50 steps): steps far from independent. Shown, not held to α.
    cells += [long_cell(rng, f"long stretches, {LONG} looks", stretches(al, 0.02), al, False) for al in (BOUND,)]
    print(f"\nwrong-side rate (α = {ALPHA}), decided, mean requests; overall: against the process's AL, and the")
    print(f"counters' AL of all {REPEATS} requests on the wrong side of a line")
    print(f"{'process':<26} {'AL':>5} {'wrong':>6} {'decided':>8} {'requests':>9} {'overall':>8} {'fixed':>6}")
    for c in cells:
        print(
            f"{c.process:<26} {c.al:5.2f} {c.rate:6.3f} {c.decided / c.trials:8.2f} {c.requests / c.trials:9.2f}"
            f" {c.wrong_overall / c.trials:8.3f} {_fixed(c):>6}" + ("" if c.asserted else "  *")
        )
    print("* not held to α")
    return cells


def _fixed(c: Cell) -> str:
    if c.fixed_wrong_overall < 0 or c.process.endswith("looks"):
        return "–"
    return f"{c.fixed_wrong_overall / c.trials:.3f}"


def test_no_line_is_decided_on_the_wrong_side_more_often_than_alpha(table: list[Cell]) -> None:
    held = [c for c in table if c.asserted]
    for c in held:
        assert tail(c.trials, c.wrong) > UNLIKELY, f"{c.process} at AL {c.al}: {c.wrong}/{c.trials} wrong"
    trials, bad = sum(c.trials for c in held), sum(c.wrong for c in held)
    assert tail(trials, bad) > UNLIKELY, f"{bad}/{trials} wrong over every cell"


def test_a_process_far_from_both_lines_stops_at_min_repeats() -> None:
    rng = random.Random(7)
    for al in (1.8, 2.5, 3.0):
        taken = [stage(rng, chain(al))[0] for _ in range(50)]
        assert all(t.decided and t.requests == MIN_REPEATS for t in taken), al


# -- exact processes: the builtin tiny pairs -----------------------------------------------------------------------


def exact(accepted: int) -> Process:
    """Every step accepts `accepted` tokens: a request of n tokens takes (n − 1) / (accepted + 1) steps."""
    return lambda rng, tokens: Request(
        [steps_of(1.0 + accepted, tokens) if j == accepted else 0 for j in range(K + 1)], 1.0 + accepted
    )


@pytest.mark.parametrize("tokens", [128, 512])  # 32 and 128 steps a request
def test_every_step_accepting_k_stops_within_three_requests(tokens: int) -> None:
    test, _ = stage(random.Random(0), exact(K), tokens=tokens)
    steps = steps_of(K + 1.0, tokens)
    print(f"\nevery step accepts K, {steps} steps a request: {test.requests} requests, {test.reason()}")
    assert test.decided and test.requests <= 3
    assert [line.side for line in test.lines] == [ABOVE, ABOVE]


def test_every_step_accepting_none_stops_within_three_requests_at_the_collapsed_tiny_pairs_length() -> None:
    test, _ = stage(random.Random(0), exact(0))  # 127 steps: AL 1 over 128 tokens
    print(f"\nno step accepts, {steps_of(1.0)} steps a request: {test.requests} requests, {test.reason()}")
    assert test.decided and test.requests <= 3
    assert [line.side for line in test.lines] == [BELOW, BELOW]


def test_too_few_steps_never_decide_the_collapse_line() -> None:
    """32 steps a request accepting nothing: under the distribution with mean at the collapse line that puts its mass
    on 0 and K, 5 × 32 zeros have probability (1 − m)^160 > α/3, so no valid test may decide: the stage runs to its
    cap."""
    m = (COLLAPSE - 1.0) / K
    assert (1.0 - m) ** (REPEATS * 32) > ALPHA / SPLIT
    test, _ = stage(random.Random(0), exact(0), tokens=33)  # 32 steps
    assert test.requests == REPEATS and test.lines[1].side is None and test.lines[0].side == BELOW
    need = math.ceil(math.log(SPLIT / ALPHA) / -math.log(1.0 - m))
    print(f"\nno step accepts, 32 steps a request: undecided after {REPEATS}; any valid test needs ≥ {need} steps")


def test_without_warmup_the_first_request_bets_nothing() -> None:
    test, _ = stage(random.Random(0), exact(K), warmup=0)
    assert test.requests == 4  # one request later than with the warmup's steps to bet on


def test_a_line_is_decided_exactly_where_its_wealth_reaches_the_level() -> None:
    m = (BOUND - 1.0) / K
    per_request = 32 * math.log1p(CAP / m * (1.0 - m))  # every step accepts K, betting the cap
    needed = math.ceil(math.log(SPLIT / ALPHA) / per_request)
    test = acceptance_test(LINES).warmed([0, 0, 0, 32])
    for n in range(1, needed + 1):
        assert test.lines[0].side is None
        test = test.observe([0, 0, 0, 32])
        assert test.lines[0].log_above == pytest.approx(n * per_request)
    assert test.lines[0].side == ABOVE and test.requests == needed == 3


# -- pieces --------------------------------------------------------------------------------------------------------


def test_histogram_from_per_position_counts() -> None:
    # 10 steps: 4 accepted nothing, 1 one token, 2 two, 3 all three → positions 1..3 accepted 6, 5, 3 times
    assert histogram(10, [6, 5, 3]) == (4, 1, 2, 3)
    assert histogram(0, [0, 0, 0]) == (0, 0, 0, 0)
    assert histogram(5, []) == (5,)
    assert histogram(5, [6, 0, 0]) is None  # more accepted at position 1 than steps
    assert histogram(5, [2, 3, 0]) is None  # acceptance is a prefix: position 2 never exceeds position 1


def test_bets_lean_towards_the_side_seen_and_stay_under_the_cap() -> None:
    m = 0.5
    up, down = bets([0, 0, 0, 10], m)
    assert up == pytest.approx(CAP / m) and down == 0.0
    up, down = bets([10, 0, 0, 0], m)
    assert up == 0.0 and down == pytest.approx(CAP / (1 - m))
    up, down = bets([5, 0, 0, 5], m)
    assert up == down == 0.0
    assert bets([], m) == (0.0, 0.0) and bets([0, 0, 0, 0], m) == (0.0, 0.0)
    up, down = bets([1, 1, 2, 6], m)  # mean 0.77, variance 0.1: (0.77 − 0.5) / (0.1 + 0.27²)
    assert 0.0 < up < CAP / m and down == 0.0


def test_lines_outside_the_range_of_al_are_decided_without_evidence() -> None:
    test = acceptance_test([("low", 0.95), ("top", 4.0), ("over", 4.2)]).observe([0, 0, 0, 5])
    assert [line.side for line in test.lines] == [ABOVE, None, BELOW]
    assert test.observe([0, 0, 1, 4]).lines[1].side == BELOW  # one step short of K: below K + 1


def test_alpha_is_split_over_the_hypotheses_that_can_hold_at_once() -> None:
    assert acceptance_test(LINES).level == pytest.approx(math.log(3 / ALPHA))
    assert acceptance_test(LINES[:1]).level == pytest.approx(math.log(2 / ALPHA))
    assert acceptance_test([("a", 2.0), ("b", 2.0)]).level == pytest.approx(math.log(4 / ALPHA))


def test_reason_names_each_side() -> None:
    test = acceptance_test(LINES)
    for _ in range(3):
        test = test.observe([0, 10, 0, 0])  # AL 2: below the bound, above the collapse line
    assert test.decided
    assert test.reason() == "AL above the collapse line 1.05 and below the recover bound 3.80"
