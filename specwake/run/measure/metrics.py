"""Metric arithmetic: vLLM's Prometheus text → spec-decode counters → per-stage deltas; vLLM's own seconds per
cycle step.

Acceptance length, per-position and acceptance rates follow vLLM's own definitions (vllm/v1/spec_decode/metrics.py;
see docs/how-it-works.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specwake.errors import ServerFault

# Exact sample names of vLLM's text exposition (counters carry `_total`; `_created` is ignored).
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
POSITION_LABEL = "position"
ENGINE_LABEL = "engine"  # vLLM's engine index: one per data-parallel engine behind the API server

_SPEC_TOTALS = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
_COUNTERS = frozenset((*_SPEC_TOTALS, ACCEPTED_PER_POS, GENERATION_TOKENS))

# vLLM's metrics as Ray exports them (vllm/v1/metrics/ray_wrappers.py, RayPrometheusStatLogger): ':' made '_', and
# Ray's own "ray_" before the name. vLLM's server never uses that logger itself (0.32, 0.33: only Ray's own LLM
# serving does), so a server's /metrics keeps the `vllm:` names also under the Ray executor; both are read alike.
RAY_PREFIX = "ray_vllm_"
# The families the counters are read from, under either spelling (family names: the samples' without `_total`).
_SPEC_FAMILIES = tuple(
    prefix + name.removeprefix("vllm:").removesuffix("_total") for name in _COUNTERS for prefix in ("vllm:", RAY_PREFIX)
)
_METADATA = ("# HELP ", "# TYPE ")


def family_lines(text: str, families: tuple[str, ...]) -> str:
    """The lines of a /metrics body that belong to the named metric families (and to any whose name begins with one
    of them): their HELP and TYPE lines and their samples; "" where no line does. The parser then reads a few dozen
    lines instead of all: vLLM's CPU server exposes about 660 (65 kB), which took 9 ms a scrape to parse, 3 of the
    CPU-seconds of a run of the three CPU family scenarios (about 360 scrapes)."""
    kept = [
        line for line in text.splitlines() if (line[7:] if line.startswith(_METADATA) else line).startswith(families)
    ]
    return "".join(line + "\n" for line in kept)


def vllm_name(sample: str) -> str:
    """A sample's name as vLLM's own exposition spells it (`ray_vllm_spec_decode_num_drafts` →
    `vllm:spec_decode_num_drafts_total`); any other name unchanged."""
    if not sample.startswith(RAY_PREFIX):
        return sample
    name = "vllm:" + sample.removeprefix(RAY_PREFIX)
    return name + "_total" if name + "_total" in _COUNTERS else name


@dataclass(frozen=True)
class SpecCounters:
    """Spec-decode counter values of one /metrics scrape, summed over every label set; `engines`: the same per
    engine label, where more than one engine reports (data parallelism)."""

    present: bool  # False when the spec-decode families are absent (speculation off)
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]  # index = draft position
    generation_tokens: float  # vllm:generation_tokens_total, 0 if absent
    engines: Mapping[str, SpecCounters] = field(default_factory=dict)


@dataclass(frozen=True)
class SpecDelta:
    """What happened between two scrapes: counts and the rates vLLM derives from them."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_length: float | None  # 1 + accepted/drafts; None when num_drafts == 0 or the counters disagree
    per_position: tuple[float, ...]  # accepted_at_pos / drafts; () when num_drafts == 0
    acceptance_rate: float | None  # accepted / draft_tokens; None when num_draft_tokens == 0
    counters_reset: bool  # some counter went backwards: deltas count from the 'after' values
    num_generation_tokens: int = 0
    disagreement: str | None = None  # the invariant the counts break, with its numbers (see disagreement)


EMPTY = SpecCounters(
    present=False,
    drafts=0.0,
    draft_tokens=0.0,
    accepted=0.0,
    accepted_per_pos=(),
    generation_tokens=0.0,
)


def _position(labels: dict[str, str]) -> int:
    raw = labels.get(POSITION_LABEL)
    try:
        position = int(raw) if raw is not None else -1
    except ValueError:
        position = -1
    if position < 0:
        raise ValueError(f"{ACCEPTED_PER_POS} sample with bad {POSITION_LABEL} label {raw!r}")
    return position


def _positions_tuple(by_position: dict[int, float]) -> tuple[float, ...]:
    if not by_position:
        return ()
    size = max(by_position) + 1
    return tuple(by_position.get(i, 0.0) for i in range(size))


class _Sums:
    """Counter samples summed as they are read."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys((*_SPEC_TOTALS, GENERATION_TOKENS), 0.0)
        self.seen: set[str] = set()
        self.by_position: dict[int, float] = {}

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        if name == ACCEPTED_PER_POS:
            position = _position(labels)
            self.by_position[position] = self.by_position.get(position, 0.0) + value
            self.seen.add(name)
        elif name in self.totals:
            self.totals[name] += value
            self.seen.add(name)

    def counters(self, engines: Mapping[str, SpecCounters] | None = None) -> SpecCounters:
        return SpecCounters(
            present=any(name in self.seen for name in (*_SPEC_TOTALS, ACCEPTED_PER_POS)),
            drafts=self.totals[DRAFTS],
            draft_tokens=self.totals[DRAFT_TOKENS],
            accepted=self.totals[ACCEPTED],
            accepted_per_pos=_positions_tuple(self.by_position),
            generation_tokens=self.totals[GENERATION_TOKENS],
            engines=engines or {},
        )


def parse_spec_counters(text: str) -> SpecCounters:
    """Read the spec-decode counters out of a /metrics body, under vLLM's names or Ray's (vllm_name): over every
    engine, and per engine where several report (each sample's `engine` label). Only their families are parsed
    (family_lines); a text with none of them is parsed whole.

    Raises ValueError when what is parsed is not Prometheus exposition format.
    """
    total = _Sums()
    per_engine: dict[str, _Sums] = {}
    try:
        for family in text_string_to_metric_families(family_lines(text, _SPEC_FAMILIES) or text):
            for sample in family.samples:
                name = vllm_name(sample.name)
                total.add(name, sample.labels, sample.value)
                engine = sample.labels.get(ENGINE_LABEL)
                if engine is not None:
                    per_engine.setdefault(engine, _Sums()).add(name, sample.labels, sample.value)
    except ValueError as exc:
        detail = str(exc) or "unparsable line"
        raise ValueError(f"not Prometheus text exposition: {detail}") from exc
    engines = {e: sums.counters() for e, sums in sorted(per_engine.items())} if len(per_engine) > 1 else {}
    return total.counters(engines)


def summed(servers: Sequence[SpecCounters]) -> SpecCounters:
    """The counters of several servers of one engine each, as one server's: totals summed, engine i server i's."""
    positions = max((len(c.accepted_per_pos) for c in servers), default=0)
    return SpecCounters(
        present=any(c.present for c in servers),
        drafts=sum(c.drafts for c in servers),
        draft_tokens=sum(c.draft_tokens for c in servers),
        accepted=sum(c.accepted for c in servers),
        accepted_per_pos=tuple(map(sum, zip(*(_padded(c.accepted_per_pos, positions) for c in servers), strict=True))),
        generation_tokens=sum(c.generation_tokens for c in servers),
        engines={str(i): c for i, c in enumerate(servers)},
    )


def engine_deltas(before: SpecCounters, after: SpecCounters) -> dict[str, SpecDelta]:
    """Per engine, what happened between two scrapes ({} for a server of one engine)."""
    return {e: counter_delta(before.engines.get(e, EMPTY), now) for e, now in after.engines.items()}


def _padded(values: tuple[float, ...], size: int) -> tuple[float, ...]:
    return values + (0.0,) * (size - len(values))


def _went_backwards(before: SpecCounters, after: SpecCounters) -> bool:
    size = max(len(before.accepted_per_pos), len(after.accepted_per_pos))
    pairs = [
        (before.drafts, after.drafts),
        (before.draft_tokens, after.draft_tokens),
        (before.accepted, after.accepted),
        (before.generation_tokens, after.generation_tokens),
        *zip(
            _padded(before.accepted_per_pos, size),
            _padded(after.accepted_per_pos, size),
            strict=True,
        ),
    ]
    return any(new < old for old, new in pairs)


def _count(value: float) -> int:
    return max(0, round(value))


def disagreement(drafts: int, accepted: int, accepted_per_pos: Sequence[int]) -> str | None:
    """Which invariant of vLLM's own counting a counter delta breaks, with its numbers; None when it keeps them all.

    vLLM counts a draft step that accepts j tokens as one draft, j accepted tokens and one at each position below j
    (SpecDecodingStats.observe_draft, vllm/v1/spec_decode/metrics.py), so the accepted tokens per position sum to the
    accepted total, and none is above the drafts or above the position before it (the checks of vllm-ascend's MTP
    test). Without per-position counters (vLLM keeps none for diffusion models) only "no accepted tokens without
    drafts" is checked."""
    if not accepted_per_pos:
        return f"{accepted} accepted tokens in 0 drafts" if accepted and not drafts else None
    total = sum(accepted_per_pos)
    if total != accepted:
        return f"the accepted tokens per position sum to {total}, not to the accepted total {accepted}"
    over = next((i for i, n in enumerate(accepted_per_pos) if n > drafts), None)
    if over is not None:
        return f"position {over} accepted {accepted_per_pos[over]} tokens in {drafts} drafts"
    rise = next((i for i in range(1, len(accepted_per_pos)) if accepted_per_pos[i] > accepted_per_pos[i - 1]), None)
    if rise is not None:
        return (
            f"position {rise} accepted {accepted_per_pos[rise]} tokens, more than position {rise - 1}"
            f" ({accepted_per_pos[rise - 1]}), where a draft step accepts a prefix of its tokens"
        )
    return None


def counter_delta(before: SpecCounters, after: SpecCounters) -> SpecDelta:
    """Deltas and rates between two scrapes of the same server.

    When any counter went backwards the engine restarted in between: every delta is then
    counted from zero (the 'after' value alone) and the result is flagged, never negative.
    When the deltas break an invariant of vLLM's counting (disagreement), the result names it and has no AL: the
    counters say nothing about the drafter then.
    """
    reset = _went_backwards(before, after)
    base = EMPTY if reset else before
    size = max(len(base.accepted_per_pos), len(after.accepted_per_pos))
    per_pos_delta = [
        new - old
        for old, new in zip(
            _padded(base.accepted_per_pos, size),
            _padded(after.accepted_per_pos, size),
            strict=True,
        )
    ]
    drafts = _count(after.drafts - base.drafts)
    draft_tokens = _count(after.draft_tokens - base.draft_tokens)
    accepted = _count(after.accepted - base.accepted)
    disagrees = disagreement(drafts, accepted, [_count(d) for d in per_pos_delta])
    return SpecDelta(
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        acceptance_length=1.0 + accepted / drafts if drafts > 0 and disagrees is None else None,
        per_position=tuple(d / drafts for d in per_pos_delta) if drafts > 0 else (),
        acceptance_rate=accepted / draft_tokens if draft_tokens > 0 else None,
        counters_reset=reset,
        num_generation_tokens=_count(after.generation_tokens - base.generation_tokens),
        disagreement=disagrees,
    )


OPERATION_LABEL = "operation"


def operation_seconds(text: str, histograms: frozenset[str]) -> dict[tuple[str, str], float]:
    """(histogram, operation) → seconds summed so far, for vLLM's per-operation histograms among `histograms`
    (e.g. vllm:sleep_mode_operation_duration_seconds). vLLM creates them on first use: absent before."""
    found: dict[tuple[str, str], float] = {}
    try:
        for family in text_string_to_metric_families(family_lines(text, tuple(histograms))):
            if family.name not in histograms:
                continue
            for sample in family.samples:
                operation = sample.labels.get(OPERATION_LABEL)
                if sample.name == family.name + "_sum" and operation is not None:
                    key = (family.name, operation)
                    found[key] = found.get(key, 0.0) + sample.value
    except ValueError:
        return {}
    return found


class OperationClock:
    """vLLM's own seconds for each cycle step it times: /metrics read before the cycle and after each timed step,
    the step's seconds the growth of its operation's sum. None where the server keeps no such histogram."""

    def __init__(self, scrape: Callable[[], str], histograms: frozenset[str]) -> None:
        self.scrape, self.histograms = scrape, histograms
        self.sums: dict[tuple[str, str], float] = {}

    def start(self) -> None:
        self.sums = self._read()

    def _read(self) -> dict[tuple[str, str], float]:
        try:
            return operation_seconds(self.scrape(), self.histograms)
        except ServerFault:
            return {}

    def seconds(self, metric: tuple[str, str] | None) -> float | None:
        if metric is None:
            return None
        now = self._read()
        before, self.sums = self.sums.get(metric, 0.0), now
        return round(now[metric] - before, 4) if metric in now else None
