"""One measured stage: warmup, N greedy requests one at a time, /metrics before and after.

Returns a StageResult with AL and per-position rates from counter deltas, tok/s samples and completion texts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from specwake.client import Completion, VllmClient
from specwake.errors import RequestFailed
from specwake.metrics import SpecCounters, counter_delta, parse_spec_counters
from specwake.results import StageResult


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


def stage_name(cycle: int, level: int = 2) -> str:
    return "fresh" if cycle == 0 else f"after L{level} #{cycle}"


def _request(client: VllmClient, workload: Workload, index: int) -> Completion:
    return client.complete(
        model=workload.model,
        prompt=workload.prompts[index % len(workload.prompts)],
        max_tokens=workload.max_tokens,
        temperature=workload.temperature,
        ignore_eos=workload.ignore_eos,
        timeout=workload.request_timeout_s,
    )


def _scrape(client: VllmClient) -> SpecCounters:
    text = client.metrics_text()
    try:
        return parse_spec_counters(text)
    except ValueError as exc:
        raise RequestFailed(f"GET /metrics: not Prometheus text ({exc}): {text[:200]!r}") from None


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
        seen = after.generation_tokens - before.generation_tokens
        if seen >= tokens or time.monotonic() >= deadline:
            return after
        sleep(0.2)


def run_stage(
    client: VllmClient,
    workload: Workload,
    *,
    name: str,
    cycle: int,
    fresh: StageResult | None = None,
    on_request: Callable[[Completion], None] | None = None,
    settle_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> StageResult:
    """Measure one stage. Server faults (timeouts, HTTP errors) propagate as ServerFault."""
    start = _scrape(client)
    warm_started = time.monotonic()
    warm_tokens = sum(_request(client, workload, i).completion_tokens for i in range(workload.warmup))
    warmup_seconds = time.monotonic() - warm_started
    before = _settled_counters(client, start, warm_tokens, settle_s, sleep) if warm_tokens else start
    completions = []
    for i in range(workload.repeats):
        completion = _request(client, workload, i)
        completions.append(completion)
        if on_request is not None:
            on_request(completion)
    tokens = sum(c.completion_tokens for c in completions)
    after = _settled_counters(client, before, tokens, settle_s, sleep)
    delta = counter_delta(before, after)
    outputs = [c.text for c in completions]
    samples = [round(c.tok_s, 3) for c in completions]
    return StageResult(
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
        counters_reset=delta.counters_reset,
        warmup_seconds=round(warmup_seconds, 3),
    )
