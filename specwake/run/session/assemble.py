"""From what a run recorded to what it means, in one pure place: a variant's record (specwake.run.session.variant_run)
becomes a VariantResult with its outcome, match and findings; a scenario's variants become a ScenarioResult with its
verdict and provenance. No server, no file: tests drive it from builders.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specwake import __version__
from specwake.judge.findings import findings
from specwake.judge.verdict import (
    decide_outcome,
    decide_verdict,
    engine_stages,
    judges_drafter,
    outcome_matches,
    perturbed_models,
    sleep_ignored,
    speed_rule,
    worst,
)
from specwake.judge.weights import held, landed, restored
from specwake.prepare.plan import redact_env
from specwake.prepare.releases import TESTED_RELEASES
from specwake.prepare.scenario import Scenario
from specwake.prepare.variants import PreparedVariant
from specwake.results import INCOMPLETE, Diagnostic, Push, ScenarioResult, StageResult, StepResult, VariantResult
from specwake.weight_updates import Chosen, PushRequest


@dataclass
class VariantRecord:
    """Everything one variant's run measured and saw, nothing decided: what VariantRun accumulates."""

    name: str
    log_path: str
    argv: list[str] = field(default_factory=list)
    env_added: dict[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    cores: tuple[int, ...] = ()
    stages: list[StageResult] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # {"workers": [specwake_info answers]}
    crash_class: str | None = None  # set when the variant failed (see specwake.judge.crashes)
    error: str | None = None
    first_error: str | None = None
    crash_lines: tuple[str, ...] = ()
    excerpt: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    complete: bool = False  # every phase ran, or a failure ended it early
    chosen: dict[str, Chosen] = field(default_factory=dict)  # what push_scale / push_skip picked, per model
    vllm_warnings: list[str] = field(default_factory=list)  # quoted from its server logs (judge.log_warnings)
    first_load_seconds: float | None = None  # the slowest server's first load, by its log (judge.log_warnings)


def push_of(scenario: Scenario, prep: PreparedVariant) -> PushRequest | None:
    """The variant's weight push or sync, when its cycles push or sync instead of reloading."""
    via = scenario.cycle.reload_kind.via
    if via is None:
        return None
    variant = prep.variant
    return PushRequest(variant.push_to, dict(variant.push_scale), via, variant.push_skip, fault=variant.push_fault)


def judge_variant(scenario: Scenario, prep: PreparedVariant, record: VariantRecord) -> VariantResult:
    """The variant's result: outcome `incomplete` while phases remain (partial result files), else decided."""
    variant, engine = prep.variant, prep.engine
    push = push_of(scenario, prep)
    if push is not None and record.chosen:
        push = replace(push, chosen=record.chosen)
    pushed = Push.of(push) if push is not None else None
    outcome, by_engine = INCOMPLETE, {}
    if record.complete:

        def judge(stages: Sequence[StageResult], diagnostics: Sequence[Diagnostic]) -> str:
            return decide_outcome(
                stages,
                tolerance=scenario.tolerance,
                failure=record.crash_class,
                target_restored=restored(diagnostics, "target"),
                draft_restored=restored(diagnostics, "draft") if judges_drafter(pushed) else None,
                speed=speed_rule(scenario.min_speedup_recovery, prep.l2_discard),
                speculative=variant.speculative,
                perturbed=perturbed_models(pushed),
                sleep_ignored=sleep_ignored(variant.level, prep.l2_discard, push is not None),
                target_held=held(diagnostics, "target"),
                draft_held=held(diagnostics, "draft"),
                target_landed=landed(diagnostics, "target"),
                draft_landed=landed(diagnostics, "draft"),
            )

        # With data parallelism each engine is judged on its own counters and its own ranks' fingerprints, and the
        # variant is as good as its worst engine (docs/how-it-works.md#data-parallelism); one engine: none listed.
        engines = sorted({e.engine for stage in record.stages for e in stage.engines}, key=int)
        by_engine = {
            e: judge(engine_stages(record.stages, e), [d.of_engine(int(e)) for d in record.diagnostics])
            for e in engines
        }
        outcome = worst([judge(record.stages, record.diagnostics), *by_engine.values()])
    workers = record.info.get("workers") or []
    result = VariantResult(
        name=record.name,
        outcome=outcome,
        expected=variant.expected,
        matched=outcome != INCOMPLETE and outcome_matches(outcome, variant.expected),
        platform=engine.platform,
        l2_discard=prep.l2_discard,
        vllm_version=engine.vllm_version,
        vllm_file=workers[0].get("vllm_file") if workers and isinstance(workers[0], dict) else None,
        python=engine.python,
        patch=str(variant.patch) if variant.patch else None,
        patch_sha256=prep.patch_sha256,
        overlay=str(prep.overlay.root) if prep.overlay else None,
        command=list(record.argv),
        env=redact_env(record.env_added),
        error=record.error,
        crash_class=record.crash_class,
        first_error=record.first_error,
        log_path=record.log_path,
        log_excerpt=record.excerpt,
        stages=list(record.stages),
        steps=list(record.steps),
        info={
            **record.info,
            "entrypoint": engine.entrypoint,
            "gpus": list(record.gpus),  # visible indices, as --gpus takes them
            "cores": list(record.cores),  # CPU cores its worker was bound to, when servers ran side by side
            "devices": record.env_added.get("CUDA_VISIBLE_DEVICES"),  # what the server was given
            "crash_lines": list(record.crash_lines),
            # a copy, as of every list above: another job thread of a packed run may write this scenario's files,
            # iterating the result, while the variant's own thread adds a phase ("dictionary changed size during
            # iteration" ended a variant once, and left it out of its scenario's verdict)
            "timings": dict(record.timings),
        },
        seconds=record.seconds,
        diagnostics=list(record.diagnostics),
        push=pushed,
        engine_outcomes=by_engine,
        vllm_warnings=list(record.vllm_warnings),
        first_load_seconds=record.first_load_seconds,
        model_runner=workers[0].get("model_runner") if workers and isinstance(workers[0], dict) else None,
    )
    if outcome == INCOMPLETE:
        return result
    found = findings(result, scenario.limits)
    return replace(result, findings=found, matched=result.matched and not found)


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
    }


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def judge_scenario(
    scenario: Scenario,
    variants: Sequence[VariantResult],
    started_at: str,
    *,
    complete: bool,
    mode: str,
    host: dict[str, Any],
    shard: str | None = None,
) -> ScenarioResult:
    """The scenario result; a variant still running (outcome `incomplete`) takes no part in the verdict. `host`: the
    machine's host_info(); `shard`: "K/N" when this machine ran only its share of the jobs
    (specwake.run.session.shards)."""
    verdict = decide_verdict([(v.outcome, v.matched) for v in variants if v.outcome != INCOMPLETE])
    return ScenarioResult(
        scenario={
            "name": scenario.name,
            "file": str(scenario.file),
            "sha256": scenario.sha256,
            "settings": _redacted_settings(scenario.settings()),
            "mode": mode,
            **({"shard": shard} if shard else {}),
        },
        verdict=verdict,
        started_at=started_at,
        finished_at=now_iso() if complete else None,
        host=host,
        variants=list(variants),
        specwake_version=__version__,
        complete=complete,
        tested_releases=list(TESTED_RELEASES),
    )


def _redacted_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Scenario settings safe to write: secret-looking env values (tokens, keys) hidden."""
    server = dict(settings.get("server") or {})
    if isinstance(server.get("env"), dict):
        server["env"] = redact_env(server["env"])
    variants = {
        name: {**spec, "env": redact_env(spec["env"])} if isinstance(spec.get("env"), dict) else spec
        for name, spec in (settings.get("variants") or {}).items()
    }
    return {**settings, "server": server, "variants": variants}
