"""The numbers a run produces, as frozen dataclasses, and their JSON form (schema specwake.result/1).

Measurement code builds these; verdict and report code only read them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from specwake.protocol import ROLES, WAKE_STEPS, Fingerprint, Memory
from specwake.weight_updates import PUSH_VIA, SYNC_VIA, PushRequest

SCHEMA = "specwake.result/1"
INCOMPLETE = "incomplete"  # the outcome of a variant still running (or interrupted) in a partial result
MIB = 1024 * 1024
LOGPROB_TOLERANCE = 1e-3  # |Δ logprob| against fresh above this at a token position counts as drift
# Where greedy tokens part from fresh, the most each side may rank its token above the other's and still be a near-tie
# that numerics flipped (kernels of another step shape move a logprob by a fraction of that; a top-k member of a real
# divergence can sit several nats below the top).
NEAR_TIE_NATS = 1.0
KNOWN_SCHEMAS = (SCHEMA,)
# The key of a variant's info.timings for the fingerprints taken after its measured stages: seconds that count in its
# `diagnostics` too (the cost of looking at the weights after the work)
STAGE_FINGERPRINTS = "stage_fingerprints"


@dataclass(frozen=True)
class EngineStage:
    """One data-parallel engine's part of a stage: its own spec-decode counters (vLLM labels them `engine`) over the
    measured requests sent to it (X-data-parallel-rank)."""

    engine: str  # vLLM's engine index, as its metrics label it
    acceptance_length: float | None
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    per_position: list[float]
    requests: int
    counters_disagree: str | None = None  # as StageResult's, for this engine's own counters


@dataclass(frozen=True)
class StageResult:
    """One measured stage: `fresh` (cycle 0) or `after L2 #k` (cycle k)."""

    name: str
    cycle: int
    acceptance_length: float | None  # None when no drafts were made, or the counters disagree (counters_disagree)
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    per_position: list[float]  # acceptance rate at each draft position
    tok_s: list[float]  # one sample per measured request
    tok_s_median: float | None
    completion_tokens: list[int]
    outputs: list[str]
    outputs_match_fresh: bool | None  # None for the fresh stage itself
    counters_reset: bool = False  # a counter went backwards (engine restarted)
    warmup_seconds: float = 0.0  # wall time of the unmeasured warmup requests
    ttft: list[float | None] = field(default_factory=list)  # seconds to the first token, per measured request
    tpot: list[float | None] = field(default_factory=list)  # seconds per output token after the first
    first_request_ttft: float | None = None  # of the stage's first request: right after the wake
    prefix_cached: int | None = None  # prompt tokens served from the prefix cache right after the wake
    prefix_cached_repeat: int | None = None  # the same probe again: shows the prefix cache works at all
    first_difference: list[int] | None = None  # [request, token] where tokens first differ from fresh
    max_logprob_drift: float | None = None  # largest |Δ logprob| against fresh over the shared tokens
    # fresh only: the largest |Δ logprob| between its own requests of one prompt (warmup and measured), the bound a
    # post-cycle stage's drift is held to by default (specwake.run.measure.measure.own_drift); None where none was sent
    # twice
    own_logprob_drift: float | None = None
    logprobs_over_tolerance: int | None = None  # positions drifting by more than LOGPROB_TOLERANCE
    logprobs_compared: int | None = None
    # True: no other server of the run measured or cycled meanwhile (on GPUs: nor started or stopped), and no other
    # specwake run on the machine had a server up (the run held the machine's turn alone); False: others of the run
    # may have (no turns); None: not known (a run that shared the machine's turn: no speed call bound) or not recorded
    # (results of specwake before it)
    measured_alone: bool | None = None
    # Every completion equals fresh or parts from it only at a near-tie (see near_ties); None: the fresh stage, or a
    # result from before near-ties were judged (there outputs_match_fresh alone decides)
    outputs_close_to_fresh: bool | None = None
    near_ties: list[list[int]] = field(default_factory=list)  # [request, token] where tokens part at a near-tie
    # Measured requests; None in results of specwake before stages could stop early (there: len(tok_s))
    requests: int | None = None
    # Why the stage stopped measuring where it did, one line: "decided after 3 requests: AL above …", "cap: 5 requests
    # (repeats); undecided: …", "fixed: the fresh stage is the reference"; None in results from before
    stopped: str | None = None
    engines: list[EngineStage] = field(default_factory=list)  # per data-parallel engine; [] for one engine
    # The invariant of vLLM's spec-decode counting the stage's counter deltas break, with the numbers
    # (specwake.run.measure.metrics.disagreement): vLLM's metrics path is at fault, and the stage's AL is void (None).
    # None where they agree, and in results of specwake before this field
    counters_disagree: str | None = None

    @property
    def measured(self) -> int:
        """How many requests the stage measured."""
        return self.requests if self.requests is not None else len(self.tok_s)


@dataclass(frozen=True)
class StepResult:
    """One timed step of a sleep/wake cycle."""

    cycle: int
    name: str  # a protocol.STEPS name: sleep | discard | wake_weights | reload_weights | push | ...
    method: str
    path: str
    status: int | None  # HTTP status, None when no answer came
    seconds: float
    ok: bool
    error: str | None = None
    response: Any = None
    rss_bytes: int | None = None  # host RSS of the server's process group right after the step
    vllm_seconds: float | None = None  # the call's own duration by vLLM's metrics (protocol.StepKind.vllm_metric)


@dataclass(frozen=True)
class CheckerReading:
    """vLLM's own /weight_checker at one point (see specwake.run.measure.diagnose). When fresh: whether the server
    offers it (`status` when not) and how many target parameters it summed. After a sync: whether every sum is as fresh,
    how many are not and the first of their names. `error`: why asking failed."""

    offered: bool | None = None
    status: int | None = None
    parameters: int | None = None
    match: bool | None = None
    mismatches: int | None = None
    names: tuple[str, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v is not None and k != "names"}
        return data | ({"names": list(self.names)} if self.match is not None else {})

    @classmethod
    def from_dict(cls, data: Any) -> CheckerReading | None:
        if not isinstance(data, dict):
            return None
        known = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name != "names"}
        return cls(**known, names=tuple(str(n) for n in data.get("names") or ()))


@dataclass(frozen=True)
class Diagnostic:
    """What the workers answered at one point of a cycle (see specwake.run.measure.diagnose): each rank's fingerprint of
    each model, each rank's device memory, vLLM's /weight_checker beside them, or why asking failed."""

    cycle: int
    point: str  # protocol.FRESH_POINT, BEFORE_SLEEP, SYNC_POINT, STAGE_POINT or a step's ("after reload_weights")
    fingerprints: tuple[dict[str, Fingerprint], ...] = ()  # per rank: role → fingerprint
    memory: tuple[Memory, ...] = ()  # per rank
    weight_checker: CheckerReading | None = None
    error: str | None = None
    engines: tuple[int, ...] = ()  # with data parallelism: the engine of each rank's answer; () for one engine
    # after one model's push or sync session (protocol.UPDATE_POINT, or the restore point after the last): the model
    # it addresses; its fingerprints' `changed` count what the update changed of each model
    update: str | None = None

    @property
    def _answers(self) -> int:
        return max(len(self.fingerprints), len(self.memory))

    @property
    def _by_engine(self) -> bool:
        """Whether each answer says its data-parallel engine."""
        return bool(self.engines) and len(self.engines) == self._answers

    def rank_names(self) -> list[str]:
        """`rank 1`, or with data parallelism `engine 1 rank 0`, for each answer in order."""
        if not self._by_engine:
            return [f"rank {r}" for r in range(self._answers)]
        ranks: dict[int, int] = {}
        names = []
        for engine in self.engines:
            names.append(f"engine {engine} rank {ranks.get(engine, 0)}")
            ranks[engine] = ranks.get(engine, 0) + 1
        return names

    def parts(self, role: str) -> tuple[Fingerprint | None, ...]:
        """Each rank's fingerprint of `role`; None where the rank has no such model."""
        found = (rank.get(role) for rank in self.fingerprints)
        return tuple(part if part is not None and part.present else None for part in found)

    def of_engine(self, engine: int) -> Diagnostic:
        """What one data-parallel engine's ranks answered (all of it for an answer of one engine)."""
        if not self._by_engine:
            return self
        mine = [i for i, e in enumerate(self.engines) if e == engine]
        memory = tuple(self.memory[i] for i in mine if i < len(self.memory))
        fingerprints = tuple(self.fingerprints[i] for i in mine if i < len(self.fingerprints))
        return replace(self, fingerprints=fingerprints, memory=memory, engines=tuple(engine for _ in mine))

    def to_dict(self) -> dict[str, Any]:
        """As result files keep it: only what was taken."""
        data: dict[str, Any] = {"cycle": self.cycle, "point": self.point}
        data |= {"update": self.update} if self.update else {}
        if self.fingerprints:
            data["fingerprints"] = [{role: fp.to_dict() for role, fp in rank.items()} for rank in self.fingerprints]
        if self.memory:
            data["memory"] = [asdict(m) for m in self.memory]
        if self.weight_checker is not None:
            data["weight_checker"] = self.weight_checker.to_dict()
        data |= {"engines": list(self.engines)} if self.engines else {}
        return data | ({"error": self.error} if self.error is not None else {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnostic:
        """From a result file, or from the workers' answers as diagnose collects them."""
        ranks = []
        for answer in data.get("fingerprints") or []:
            rank = {role: Fingerprint.from_dict(answer.get(role)) for role in ROLES} if isinstance(answer, dict) else {}
            ranks.append({role: fp for role, fp in rank.items() if fp is not None})
        memory = tuple(Memory.from_dict(m) for m in data.get("memory") or [] if isinstance(m, dict))
        checker = CheckerReading.from_dict(data.get("weight_checker"))
        error, engines = data.get("error"), tuple(int(e) for e in data.get("engines") or ())
        point, cycle = str(data.get("point")), int(data.get("cycle") or 0)
        update = str(data["update"]) if data.get("update") else None
        return cls(cycle, point, tuple(ranks), memory, checker, None if error is None else str(error), engines, update)


@dataclass(frozen=True)
class Push:
    """A variant's weight push or sync as its result keeps it: which models got new weights, the variant's
    push_scale and push_skip entries, how they travelled (`via`), and per model how many tensors those entries
    picked (`scaled`, `skipped`), once a server resolved them (None before that, and in older results)."""

    to: tuple[str, ...] = ("target",)
    scale: dict[str, float] = field(default_factory=dict)
    via: str = PUSH_VIA
    skip: tuple[str, ...] = ()
    scaled: dict[str, int] | None = None
    skipped: dict[str, int] | None = None
    fault: str | None = None  # a misrouted update planted on purpose (the variant's push_fault)

    @property
    def syncs(self) -> bool:
        return self.via == SYNC_VIA

    @classmethod
    def of(cls, request: PushRequest) -> Push:
        counted = bool(request.chosen and request.changes)
        scaled = {role: len(c.scale) for role, c in request.chosen.items()} if counted else None
        skipped = {role: len(c.skip) for role, c in request.chosen.items()} if counted else None
        return cls(request.to, dict(request.scale), request.via, request.skip, scaled, skipped, request.fault)

    def to_dict(self) -> dict[str, Any]:
        """`via` only for a sync, `skip`, `fault` and the counts only when set: a plain push reads as it always did."""
        data: dict[str, Any] = {"to": list(self.to), "scale": dict(self.scale)}
        data |= {"via": self.via} if self.via != PUSH_VIA else {}
        data |= {"skip": list(self.skip)} if self.skip else {}
        data |= {"fault": self.fault} if self.fault else {}
        data |= {"scaled": self.scaled} if self.scaled is not None else {}
        return data | ({"skipped": self.skipped} if self.skipped is not None else {})

    @classmethod
    def from_dict(cls, data: Any) -> Push | None:
        if not isinstance(data, dict):
            return None
        counts = {key: {str(r): int(n) for r, n in data[key].items()} if isinstance(data.get(key), dict) else None
                  for key in ("scaled", "skipped")}  # fmt: skip
        to, skip = tuple(data.get("to") or ("target",)), tuple(data.get("skip") or ())
        fault = str(data["fault"]) if data.get("fault") else None
        return cls(to, dict(data.get("scale") or {}), str(data.get("via") or PUSH_VIA), skip, **counts, fault=fault)


@dataclass(frozen=True)
class VariantResult:
    """Everything measured and decided for one variant of one scenario."""

    name: str
    outcome: str  # one of verdict.OUTCOMES, or "incomplete" for a variant an interruption cut short
    expected: str
    matched: bool
    platform: str  # cpu | cuda | rocm | unknown
    l2_discard: str  # native | emulated
    vllm_version: str | None
    vllm_file: str | None
    python: str
    patch: str | None
    patch_sha256: str | None
    overlay: str | None
    command: list[str]
    env: dict[str, str]
    error: str | None = None
    crash_class: str | None = None
    first_error: str | None = None  # the first exception the server or a worker announced (crashes)
    log_path: str | None = None
    log_excerpt: str | None = None
    stages: list[StageResult] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # What the workers answered at each probe point ("after fresh", "after discard", "after reload_weights", ...)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # problems beyond the outcome (see judge/findings.py)
    push: Push | None = None  # when cycles push or sync weights instead of reloading
    # With data parallelism: engine → the outcome its own AL gives (the variant's is the worst); {} for one engine
    engine_outcomes: dict[str, str] = field(default_factory=dict)
    # Warnings of vLLM's that bear on the cycle, quoted from the server's log (specwake.judge.log_warnings); [] where
    # it printed none, and in results of specwake before this field
    vllm_warnings: list[str] = field(default_factory=list)
    # The model runner its workers ran, "v1" or "v2" (specwake.prepare.runners); None where no worker answered, and in
    # results of specwake before this field
    model_runner: str | None = None
    # Seconds the server took to load target and drafter before it first answered, by vLLM's log ("Model loading
    # took …", specwake.judge.log_warnings; the slowest server's with several): what its wake is held to. None where
    # the log says none (the CPU V1 runner of vLLM 0.32 and 0.33), and in results of specwake before this field
    first_load_seconds: float | None = None

    @property
    def not_run(self) -> bool:
        """Unfinished with nothing recorded: no stage, no cycle step, no failure. A partial result lists every
        variant its run planned, so one the run never got to (killed or interrupted first) is named, as not run."""
        return self.outcome == INCOMPLETE and not self.stages and not self.steps and self.crash_class is None

    @property
    def stages_by_cycle(self) -> list[StageResult]:
        return sorted(self.stages, key=lambda s: s.cycle)

    @property
    def fresh(self) -> StageResult | None:
        """The stage measured before any cycle."""
        return next((s for s in self.stages if s.cycle == 0), None)

    def wake_seconds(self) -> dict[int, float]:
        """Cycle → seconds of its wake: its successful wake steps and reload or push (sleep and discard excluded)."""
        per_cycle: dict[int, float] = {}
        for step in self.steps:
            if step.name in WAKE_STEPS and step.ok:
                per_cycle[step.cycle] = per_cycle.get(step.cycle, 0.0) + step.seconds
        return per_cycle

    def slowest_wake(self) -> tuple[int, float] | None:
        """The cycle whose wake took longest, and its seconds (wake_seconds); None without a wake."""
        wakes = self.wake_seconds()
        return max(wakes.items(), key=lambda item: item[1]) if wakes else None

    def rss_asleep(self) -> dict[int, int]:
        """Cycle → host RSS of the server group right after its sleep step (what a sleep holds in host memory)."""
        return {s.cycle: s.rss_bytes for s in self.steps if s.name == "sleep" and s.rss_bytes is not None}

    def rss_after_wake(self) -> dict[int, int]:
        """Cycle → host RSS of the server group after the cycle's last step that read it."""
        rss: dict[int, int] = {}
        for step in self.steps:
            if step.rss_bytes is not None:
                rss[step.cycle] = step.rss_bytes
        return rss


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario run: its settings, provenance, variants and verdict."""

    scenario: dict[str, Any]  # name, file, sha256, settings
    verdict: str  # pass | fail | error
    started_at: str
    finished_at: str | None
    host: dict[str, Any]
    variants: list[VariantResult]
    specwake_version: str
    schema: str = SCHEMA
    complete: bool = True
    # The vLLM releases the specwake that ran it was tested against (specwake.prepare.releases); [] in results of
    # specwake before this field (a report then takes its own list)
    tested_releases: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.scenario.get("name") or "unnamed")

    def expectation(self, key: str, default: float | None) -> float | None:
        """A number of the scenario's [expect] table as recorded (`tolerance`, `min_speedup_recovery`);
        `default` where the result records none (not set, or a result from before the key existed)."""
        settings = self.scenario.get("settings")
        expect = settings.get("expect") if isinstance(settings, dict) else None
        value = expect.get(key) if isinstance(expect, dict) else None
        if value is None:
            value = self.scenario.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def to_dict(result: ScenarioResult) -> dict[str, Any]:
    # Diagnostics and push write themselves (only what was taken): asdict would copy every fingerprint first.
    bare = replace(result, variants=[replace(v, diagnostics=[], push=None) for v in result.variants])
    data = asdict(bare)
    for variant, written in zip(result.variants, data["variants"], strict=True):
        written["diagnostics"] = [d.to_dict() for d in variant.diagnostics]
        written["push"] = variant.push.to_dict() if variant.push is not None else None
    return data


def to_json(result: ScenarioResult) -> str:
    return json.dumps(to_dict(result), indent=2, sort_keys=False) + "\n"


def _build(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _stage(data: dict[str, Any]) -> StageResult:
    engines = [_build(EngineStage, e) for e in data.get("engines") or [] if isinstance(e, dict)]
    return replace(_build(StageResult, data), engines=engines)


def from_dict(data: dict[str, Any]) -> ScenarioResult:
    """Rebuild a ScenarioResult; raises ValueError on an unknown schema."""
    schema = data.get("schema")
    if schema is None:
        raise ValueError(f'not a specwake result file: no "schema" (this specwake reads {", ".join(KNOWN_SCHEMAS)})')
    if schema not in KNOWN_SCHEMAS:
        raise ValueError(f"unknown result schema {schema!r} (this specwake reads {', '.join(KNOWN_SCHEMAS)})")
    variants = []
    for v in data.get("variants", []):
        stages = [_stage(s) for s in v.get("stages", [])]
        steps = [_build(StepResult, s) for s in v.get("steps", [])]
        diagnostics = [Diagnostic.from_dict(d) for d in v.get("diagnostics", []) if isinstance(d, dict)]
        typed = {"stages": stages, "steps": steps, "diagnostics": diagnostics, "push": Push.from_dict(v.get("push"))}
        variants.append(replace(_build(VariantResult, v), **typed))
    return replace(_build(ScenarioResult, data), variants=variants)
