"""One scenario end to end: prepare every variant (nothing launched), then per variant start a server,
measure fresh, cycle and re-measure, stop it; decide outcomes and the verdict; keep results after every stage.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specwake import __version__
from specwake.client import VllmClient
from specwake.cycle import run_cycle
from specwake.errors import (
    RequestFailed,
    ResultsUnwritable,
    ServerDied,
    ServerFault,
    StartupFailed,
)
from specwake.measure import Workload, run_stage, stage_name
from specwake.plan import redact_env
from specwake.prepare import PreparedVariant, plan_variant
from specwake.report import write_run_files
from specwake.results import ScenarioResult, StageResult, StepResult, VariantResult
from specwake.scenario import Scenario
from specwake.server import Server, ServerSpec, free_port
from specwake.verdict import INCOMPLETE, decide_outcome, decide_verdict, outcome_matches

Events = Callable[[str], None]


@dataclass
class _Progress:
    """What one variant has measured so far (mutable while it runs)."""

    stages: list[StageResult] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def make_run_dir(root: Path, scenario_name: str, now: dt.datetime) -> Path:
    """A new folder `<root>/<UTC yyyymmdd-hhmmss>-<name>[-N]`; never reuses an existing one."""
    stamp = now.astimezone(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            path = root / (f"{stamp}-{scenario_name}" + (f"-{n}" if n > 1 else ""))
            try:
                path.mkdir()
            except FileExistsError:
                continue
            (path / "logs").mkdir()
            probe = path / ".write-test"
            probe.write_text("ok")
            probe.unlink()
            return path
    except OSError as exc:
        raise ResultsUnwritable(f"results folder not writable: {exc.filename or root}: {exc.strerror}") from None
    raise ResultsUnwritable(f"{root}: could not find a free run folder name")


def _check_imports(prep: PreparedVariant, infos: list[Any]) -> str | None:
    """A patched variant must import vLLM from its overlay, a baseline must not: else an error text."""
    for rank, info in enumerate(infos):
        file = str(info.get("vllm_file", "")) if isinstance(info, dict) else ""
        in_overlay = prep.overlay is not None and file.startswith(str(prep.overlay.root) + os.sep)
        if prep.overlay is not None and not in_overlay:
            return f"patched variant's worker {rank} imported vLLM from {file or '?'}, not from the overlay {prep.overlay.root}"
        if prep.overlay is None and "/overlays/" in file:
            return f"baseline worker {rank} imported vLLM from an overlay: {file}"
    return None


def _measure_variant(
    scenario: Scenario,
    prep: PreparedVariant,
    server: Server,
    progress: _Progress,
    events: Events,
    save: Callable[[], None],
) -> None:
    """Fresh stage, then each cycle and its stage. Raises ServerFault on a server fault."""
    client = VllmClient(httpx.Client(base_url=server.base_url, trust_env=False))
    name = prep.variant.name
    infos = client.rpc_results("specwake_info", timeout=scenario.cycle.step_timeout_s)
    progress.info = {"workers": infos}
    problem = _check_imports(prep, infos)
    if problem:
        raise _ImportMismatch(problem)
    served = client.model_ids()
    if prep.model not in served:
        raise RequestFailed(f"server at {server.base_url} serves {served}, not {prep.model!r}: a foreign server?")
    w = scenario.workload
    workload = Workload(
        prep.model,
        scenario.prompts,
        w.max_tokens,
        w.repeats,
        w.warmup,
        w.temperature,
        w.ignore_eos,
        w.request_timeout_s,
    )
    level = scenario.cycle.level

    def stage(cycle: int, fresh: StageResult | None) -> StageResult:
        label = stage_name(cycle, level)
        events(f"{name}: stage {label}")
        result = run_stage(client, workload, name=label, cycle=cycle, fresh=fresh)
        progress.stages.append(result)
        al = "–" if result.acceptance_length is None else f"{result.acceptance_length:.2f}"
        events(f"{name}: {label}: AL {al}, {result.tok_s_median or 0:.1f} tok/s")
        save()
        return result

    fresh = stage(0, None)
    for k in range(1, scenario.cycle.count + 1):
        events(f"{name}: L{level} cycle #{k}")
        steps, fault = run_cycle(
            client,
            k,
            level=level,
            emulate_discard=prep.l2_discard == "emulated",
            step_timeout_s=scenario.cycle.step_timeout_s,
        )
        progress.steps.extend(steps)
        save()
        if fault is not None:
            raise fault
        stage(k, fresh)


class _ImportMismatch(Exception):
    pass


def run_variant(
    scenario: Scenario,
    prep: PreparedVariant,
    run_dir: Path,
    events: Events,
    save: Callable[[VariantResult], None],
) -> VariantResult:
    """Start, measure, stop one variant; every outcome (also crashes) becomes a VariantResult."""
    variant = prep.variant
    plan = plan_variant(scenario, prep, free_port())
    log_path = run_dir / "logs" / f"{variant.name}.log"
    spec = ServerSpec(plan.argv, plan.env, plan.port, log_path, scenario.server.startup_timeout_s)
    progress = _Progress()
    started = time.monotonic()

    def result(
        outcome: str | None,
        error: str | None = None,
        crash_class: str | None = None,
        excerpt: str | None = None,
    ) -> VariantResult:
        final = outcome or decide_outcome(
            progress.stages, crashed=False, never_ready=False, tolerance=scenario.tolerance
        )
        matched = final != INCOMPLETE and outcome_matches(final, variant.expected)
        return VariantResult(
            name=variant.name,
            outcome=final,
            expected=variant.expected,
            matched=matched,
            platform=prep.engine.platform,
            l2_discard=prep.l2_discard,
            vllm_version=prep.engine.vllm_version,
            vllm_file=_vllm_file(progress.info),
            python=prep.engine.python,
            patch=str(variant.patch) if variant.patch else None,
            patch_sha256=prep.patch_sha256,
            overlay=str(prep.overlay.root) if prep.overlay else None,
            command=plan.argv,
            env=redact_env(plan.env_added),
            error=error,
            crash_class=crash_class,
            log_path=str(log_path),
            log_excerpt=excerpt,
            stages=list(progress.stages),
            steps=list(progress.steps),
            info=progress.info,
            seconds=round(time.monotonic() - started, 2),
        )

    events(f"{variant.name}: starting server on 127.0.0.1:{plan.port} (log {log_path})")
    server = Server(spec)
    try:
        with server:
            events(f"{variant.name}: server ready")
            try:
                _measure_variant(scenario, prep, server, progress, events, lambda: save(result(INCOMPLETE)))
            except ServerFault as fault:
                died = not server.alive()
                crash = ServerDied(f"server exited with code {server.returncode()}: {fault}") if died else fault
                return result("crash", str(crash), crash.crash_class, server.log_tail(40))
            except _ImportMismatch as exc:
                return result("error", str(exc), "overlay_not_used", server.log_tail(20))
    except StartupFailed as exc:
        return result("error", str(exc), "startup_failed", exc.log_tail)
    return result(None)


def _vllm_file(info: dict[str, Any]) -> str | None:
    workers = info.get("workers") or []
    return workers[0].get("vllm_file") if workers and isinstance(workers[0], dict) else None


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
    }


def assemble(scenario: Scenario, variants: list[VariantResult], started_at: str, complete: bool) -> ScenarioResult:
    """The scenario result; a variant still running (outcome `incomplete`) takes no part in the verdict."""
    verdict = decide_verdict([(v.outcome, v.expected) for v in variants if v.outcome != INCOMPLETE])
    return ScenarioResult(
        scenario={
            "name": scenario.name,
            "file": str(scenario.file),
            "sha256": scenario.sha256,
            "settings": scenario.settings(),
        },
        verdict=verdict,
        started_at=started_at,
        finished_at=_now_iso() if complete else None,
        host=host_info(),
        variants=variants,
        specwake_version=__version__,
        complete=complete,
    )


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def run_scenario(scenario: Scenario, prepared: list[PreparedVariant], run_dir: Path, events: Events) -> ScenarioResult:
    """Run every prepared variant in turn. On Ctrl-C the partial result is saved before re-raising."""
    started_at = _now_iso()
    done: list[VariantResult] = []

    def save_partial(current: VariantResult) -> None:
        write_run_files(run_dir, assemble(scenario, [*done, current], started_at, complete=False))

    try:
        for prep in prepared:
            outcome = run_variant(scenario, prep, run_dir, events, save_partial)
            done.append(outcome)
            events(f"{prep.variant.name}: {outcome.outcome} (expected {outcome.expected})")
            write_run_files(run_dir, assemble(scenario, done, started_at, complete=False))
    except BaseException:
        if done:
            write_run_files(run_dir, assemble(scenario, done, started_at, complete=False))
        raise
    result = assemble(scenario, done, started_at, complete=True)
    write_run_files(run_dir, result)
    return result
