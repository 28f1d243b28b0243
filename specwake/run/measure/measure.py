"""One measured stage: a prefix-cache probe, warmup, up to N greedy requests one at a time, /metrics before and
after. A stage after a cycle stops as soon as its AL is decided against the lines its outcome turns on
(specwake.judge.sequential), reading /metrics after every request.

Returns a StageResult: AL and per-position rates from counter deltas; tok/s, time to first token and time per
output token per request; completion texts; against the fresh stage, where the tokens first differ, which requests
part from it at a near-tie (numerics, see near_tie), and how far their logprobs drifted; how many prompt tokens the
server served from its prefix cache right after the wake; and how many requests it took, and why.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specwake.errors import RequestFailed
from specwake.judge.expectations import COLLAPSE_AL
from specwake.judge.sequential import AcceptanceTest, acceptance_test, histogram
from specwake.judge.verdict import recovery_bound
from specwake.prepare.prompts import probe_prompt
from specwake.prepare.scenario import Scenario
from specwake.results import LOGPROB_TOLERANCE, NEAR_TIE_NATS, EngineStage, StageResult
from specwake.run.measure.client import VllmClient
from specwake.run.measure.completions import Completer, Completion
from specwake.run.measure.metrics import (
    SpecCounters,
    SpecDelta,
    counter_delta,
    engine_deltas,
    parse_spec_counters,
    summed,
)


@dataclass(frozen=True)
class Workload:
    model: str  # served model name
    prompts: tuple[str, ...]
    max_tokens: int
    repeats: int
    warmup: int
    temperature: float
    ignore_eos: bool
    request_timeout_s: float
    min_repeats: int = 2  # a stage that may stop early measures at least this many (workload.min_repeats)
    engines: int = 1  # data-parallel engines behind the server: request i goes to engine i mod engines
    warmup_tokens: int | None = None  # max_tokens of a warmup request (workload.warmup_tokens); None: max_tokens

    @classmethod
    def of(cls, scenario: Scenario, model: str) -> Workload:
        """A scenario's [workload], sent to the served `model`."""
        w = scenario.workload
        return cls(model, scenario.prompts, w.max_tokens, w.repeats, w.warmup, w.temperature, w.ignore_eos,
                   w.request_timeout_s, w.least_repeats, scenario.server.data_parallel_size,
                   w.warmup_max_tokens)  # fmt: skip

    def prompt(self, i: int) -> str:
        """The prompt of request i of a stage (warmup and measured requests each start at the first)."""
        return self.prompts[i % len(self.prompts)]

    def engine(self, i: int) -> int | None:
        """The engine request i of a stage is sent to: every engine in turn; None (vLLM's choice) for one engine."""
        return i % self.engines if self.engines > 1 else None

    @property
    def each_engine(self) -> list[int | None]:
        return [self.engine(e) for e in range(self.engines)]


@dataclass(frozen=True)
class Stopping:
    """What a stage after a cycle needs to stop early: the lines its AL is tested against are the recover bound,
    (1 − tolerance) × fresh AL, and the collapse line; where tok/s decides the outcome (the speed rule binds) it
    measures every request, since the speed rule is a fixed-sample test."""

    tolerance: float
    speed_binds: bool = False
    collapse_al: float = COLLAPSE_AL


def stage_name(cycle: int, level: int = 2) -> str:
    return "fresh" if cycle == 0 else f"after L{level} #{cycle}"


def _request(
    completer: Completer, workload: Workload, prompt: str, max_tokens: int | None = None, engine: int | None = None
) -> Completion:
    return completer.complete(
        model=workload.model,
        prompt=prompt,
        max_tokens=workload.max_tokens if max_tokens is None else max_tokens,
        temperature=workload.temperature,
        ignore_eos=workload.ignore_eos,
        timeout=workload.request_timeout_s,
        engine=engine,
    )


def _scrape(client: VllmClient) -> SpecCounters:
    """The counters of the variant's server, or summed over its servers (one engine each: engine i is server i)."""
    counters = []
    for text in client.metrics_texts():
        try:
            counters.append(parse_spec_counters(text))
        except ValueError as exc:
            raise RequestFailed(f"GET /metrics: not Prometheus text ({exc}): {text[:200]!r}") from None
    return counters[0] if len(counters) == 1 else summed(counters)


SETTLE_POLL_S = 0.05  # between /metrics scrapes while the counters catch up (a scrape of a few kB)


def _settled(before: SpecCounters, after: SpecCounters, tokens: int) -> bool:
    return after.generation_tokens - before.generation_tokens >= tokens


def _settled_counters(
    client: VllmClient,
    before: SpecCounters,
    tokens: int,
    wait_s: float,
    sleep: Callable[[float], None],
) -> SpecCounters:
    """Scrape /metrics until the generation counter has seen our tokens (stats arrive asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        after = _scrape(client)
        if _settled(before, after, tokens) or time.monotonic() >= deadline:
            return after
        sleep(SETTLE_POLL_S)


@dataclass(frozen=True)
class Drift:
    """How a stage's tokens and logprobs differ from the fresh stage's, request by request."""

    first_difference: tuple[int, int] | None  # (request, token) where the tokens first differ
    max_logprob_drift: float | None  # largest |Δ logprob| over the positions both share
    over_tolerance: int  # positions whose |Δ logprob| exceeds LOGPROB_TOLERANCE
    compared: int  # positions compared
    parted: tuple[int, ...] = ()  # requests whose completion differs from fresh
    near_ties: tuple[tuple[int, int], ...] = ()  # (request, token) of each request parting from fresh at a near-tie

    @property
    def close(self) -> bool:
        """Every completion equals fresh or parts from it at a near-tie."""
        return set(self.parted) <= {request for request, _ in self.near_ties}


def near_tie(fresh: Completion, now: Completion, index: int) -> bool:
    """Whether two greedy completions that part at token `index` part at a near-tie, which numerics can flip: as
    vLLM's model tests judge it (check_logprobs_close), each side's token is among the other side's top logprobs
    there; and, since a top-k member can be far from a tie, each side ranks the two within NEAR_TIE_NATS."""
    if index >= min(len(fresh.tokens), len(now.tokens), len(fresh.top_logprobs), len(now.top_logprobs)):
        return False
    a, b = fresh.tokens[index], now.tokens[index]
    seen_fresh, seen_now = fresh.top_logprobs[index], now.top_logprobs[index]
    if not {a, b} <= seen_fresh.keys() or not {a, b} <= seen_now.keys():
        return False
    return seen_fresh[a] - seen_fresh[b] <= NEAR_TIE_NATS and seen_now[b] - seen_now[a] <= NEAR_TIE_NATS


def drift(fresh: Sequence[Completion], now: Sequence[Completion], tolerance: float = LOGPROB_TOLERANCE) -> Drift:
    """Token by token against fresh: logprobs are compared up to each request's first differing token, where the
    comparison of that request stops (the continuations may differ from there), noting whether it parts at a
    near-tie."""
    first: tuple[int, int] | None = None
    largest: float | None = None
    over = compared = 0
    parted: list[int] = []
    ties: list[tuple[int, int]] = []
    for request, (a, b) in enumerate(zip(fresh, now, strict=False)):
        parts: int | None = None
        for index, (ta, tb) in enumerate(zip(a.tokens, b.tokens, strict=False)):
            if ta != tb:
                parts = index
                break
            la = a.logprobs[index] if index < len(a.logprobs) else None
            lb = b.logprobs[index] if index < len(b.logprobs) else None
            if la is None or lb is None:
                continue
            delta = abs(la - lb)
            compared += 1
            over += delta > tolerance
            largest = delta if largest is None else max(largest, delta)
        else:
            if len(a.tokens) != len(b.tokens):
                parts = min(len(a.tokens), len(b.tokens))
        if parts is not None:
            first = first or (request, parts)
            if near_tie(a, b, parts):
                ties.append((request, parts))
        if parts is not None or a.text != b.text:
            parted.append(request)
    parted += range(len(fresh), len(now))  # nothing to compare with: never close
    return Drift(first, largest, over, compared, tuple(parted), tuple(ties))


def own_drift(workload: Workload, warm: Sequence[Completion], measured: Sequence[Completion]) -> float | None:
    """The largest |Δ logprob| between a stage's own requests of one prompt on one engine (a warmup request and the
    measured one of its prompt, or two measured ones), over the tokens both share before they part: how far the
    server's own numerics move when nothing changed. None where no prompt went to an engine twice."""
    sent = [
        ((workload.prompt(i), engine), c)
        for (engine, i), c in zip(
            [(engine, i) for engine in workload.each_engine for i in range(workload.warmup)], warm, strict=True
        )
    ]
    sent += [((workload.prompt(i), workload.engine(i)), c) for i, c in enumerate(measured)]  # fmt: skip
    first: dict[tuple[str, int | None], Completion] = {}
    largest: float | None = None
    for key, completion in sent:
        if key not in first:
            first[key] = completion
            continue
        found = drift([first[key]], [completion]).max_logprob_drift
        if found is not None:
            largest = found if largest is None else max(largest, found)
    return largest


def _fixed(workload: Workload, fresh: StageResult | None, stopping: Stopping | None) -> str | None:
    """Why a stage measures all `repeats` requests, or None where it may stop once AL is decided."""
    if fresh is None:
        return "fixed: the fresh stage is the reference"
    if stopping is None:
        return "fixed: no stopping rule given"
    if stopping.speed_binds:
        return "fixed: the speed rule binds (a fixed-sample test)"
    if workload.min_repeats >= workload.repeats:
        return "fixed: min_repeats = repeats (early stopping off)"
    if workload.engines > 1:
        return "fixed: data parallel (every engine's AL is judged on its share of the requests)"
    return None


def _lines(fresh: StageResult, stopping: Stopping) -> list[tuple[str, float]]:
    """The lines the outcome rules hold a post-cycle AL against."""
    lines = [("the collapse line", stopping.collapse_al)]
    if fresh.acceptance_length is not None:
        lines.insert(0, ("the recover bound", recovery_bound(fresh.acceptance_length, stopping.tolerance)))
    return lines


def _steps(delta: SpecDelta) -> tuple[int, ...] | None:
    """The draft steps of a counter delta by accepted tokens (sequential.histogram); None after a counter reset, and
    where the counters disagree with themselves."""
    if delta.counters_reset or delta.disagreement is not None:
        return None
    accepted = [round(rate * delta.num_drafts) for rate in delta.per_position]
    return histogram(delta.num_drafts, accepted)


@dataclass
class _Watch:
    """A stage that may stop early, request by request: its test, the counters read so far, and whether they can
    still be read request by request."""

    test: AcceptanceTest
    counters: SpecCounters
    drafts: int = 0
    readable: bool = True
    reset: bool = False  # a counter went backwards between two requests

    def read(self, now: SpecCounters) -> None:
        delta = counter_delta(self.counters, now)
        self.counters, self.drafts = now, self.drafts + delta.num_drafts
        self.reset = self.reset or delta.counters_reset
        steps = _steps(delta)
        if steps is None:
            self.readable = False
        elif self.readable:
            self.test = self.test.observe(steps)

    def stop(self, n: int, workload: Workload) -> str | None:
        """Why the stage stops after its n-th measured request, or None."""
        if n < workload.min_repeats:
            return None
        if self.drafts == 0 and self.readable:
            return f"no drafts: nothing for AL to decide ({n} requests, min_repeats)"
        if self.readable and self.test.decided:
            return f"decided after {n} requests: {self.test.reason()} (α {self.test.alpha:g})"
        if n < workload.repeats:
            return None
        if not self.readable:
            return f"cap: {n} requests (repeats); the counters could not be read request by request"
        return f"cap: {n} requests (repeats); undecided: AL against {self.test.undecided()}"


def run_stage(
    client: VllmClient,
    completer: Completer,
    workload: Workload,
    *,
    name: str,
    cycle: int,
    fresh: StageResult | None = None,
    fresh_completions: Sequence[Completion] = (),
    stopping: Stopping | None = None,
    on_request: Callable[[Completion], None] | None = None,
    settle_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[StageResult, list[Completion]]:
    """Measure one stage; returns it with its measured completions. Server faults propagate as ServerFault.

    The fresh stage, and any stage where `stopping` says so, measures `workload.repeats` requests. A stage after a
    cycle otherwise reads /metrics after each request and stops after the first, from `workload.min_repeats` on,
    at which its AL is decided against the recover bound and the collapse line (or no draft was made)."""
    start = _scrape(client)
    probe = probe_prompt(cycle)
    # the first request after a wake, to every engine: each has its own prefix cache
    first_probes = [_request(completer, workload, probe, 1, engine) for engine in workload.each_engine]
    controls = [_request(completer, workload, probe, 1, engine) for engine in workload.each_engine]
    warm_started = time.monotonic()
    warm = [_request(completer, workload, workload.prompt(i), workload.warmup_tokens, engine)
            for engine in workload.each_engine for i in range(workload.warmup)]  # fmt: skip
    warmup_seconds = time.monotonic() - warm_started
    sent = sum(c.completion_tokens for c in [*first_probes, *controls, *warm])
    before = _settled_counters(client, start, sent, settle_s, sleep)
    fixed = _fixed(workload, fresh, stopping)
    watch = None
    if fixed is None and fresh is not None and stopping is not None:
        warmup_steps = _steps(counter_delta(start, before))  # the first bets are chosen on the warmup's steps
        test = acceptance_test(_lines(fresh, stopping))
        watch = _Watch(test.warmed(warmup_steps) if warmup_steps else test, before)
    # Without a generation counter that moved, waiting for it after every request would only cost the deadline.
    wait_s = settle_s if _settled(start, before, sent) else 0.0
    completions: list[Completion] = []
    stopped = fixed or ""
    for i in range(workload.repeats):
        completion = _request(completer, workload, workload.prompt(i), engine=workload.engine(i))
        completions.append(completion)
        if on_request is not None:
            on_request(completion)
        if watch is not None:
            tokens = sum(c.completion_tokens for c in completions)
            watch.read(_settled_counters(client, before, tokens, wait_s, sleep))
            stopped = watch.stop(i + 1, workload) or ""
            if stopped:
                break
    tokens = sum(c.completion_tokens for c in completions)
    last = watch.counters if watch is not None else before
    after = last if _settled(before, last, tokens) else _settled_counters(client, before, tokens, settle_s, sleep)
    delta = counter_delta(before, after)
    engines = [
        EngineStage(e, d.acceptance_length, d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens,
                    list(d.per_position), sum(1 for i in range(len(completions)) if str(workload.engine(i)) == e),
                    d.disagreement)
        for e, d in engine_deltas(before, after).items()
    ]  # fmt: skip
    outputs = [c.text for c in completions]
    samples = [round(c.tok_s, 3) for c in completions]
    against = drift(fresh_completions, completions) if fresh is not None else None
    result = StageResult(
        name=name,
        cycle=cycle,
        acceptance_length=delta.acceptance_length,
        num_drafts=delta.num_drafts,
        num_draft_tokens=delta.num_draft_tokens,
        num_accepted_tokens=delta.num_accepted_tokens,
        per_position=list(delta.per_position),
        tok_s=samples,
        tok_s_median=statistics.median(samples) if samples else None,
        completion_tokens=[c.completion_tokens for c in completions],
        outputs=outputs,
        outputs_match_fresh=None if fresh is None else outputs == fresh.outputs[: len(outputs)],
        outputs_close_to_fresh=None if against is None else against.close,
        counters_reset=delta.counters_reset or (watch is not None and watch.reset),
        warmup_seconds=round(warmup_seconds, 3),
        ttft=[_rounded(c.ttft) for c in completions],
        tpot=[_rounded(c.tpot, 6) for c in completions],
        first_request_ttft=_rounded(first_probes[0].ttft),
        prefix_cached=_cached(first_probes),
        prefix_cached_repeat=_cached(controls),
        first_difference=list(against.first_difference) if against and against.first_difference else None,
        max_logprob_drift=None if against is None else against.max_logprob_drift,
        own_logprob_drift=own_drift(workload, warm, completions) if fresh is None else None,
        logprobs_over_tolerance=None if against is None else against.over_tolerance,
        logprobs_compared=None if against is None else against.compared,
        near_ties=[] if against is None else [list(t) for t in against.near_ties],
        requests=len(completions),
        stopped=stopped,
        engines=engines,
        counters_disagree=delta.disagreement,
    )
    return result, completions


def _cached(probes: Sequence[Completion]) -> int | None:
    """Prompt tokens the engines served from their prefix caches, over every engine; None where none said."""
    found = [c.cached_tokens for c in probes if c.cached_tokens is not None]
    return sum(found) if found else None


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
