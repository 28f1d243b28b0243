"""A whole `specwake run`: validate everything, prepare, refuse what cannot run here, run the scenarios
(one after another on CPU, packed onto disjoint GPU sets on GPU machines), then the combined outputs.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specwake.errors import EXIT_INTERRUPTED, EXIT_PASS, InputError, Interrupted
from specwake.events import Event, Events
from specwake.files import what_it_is
from specwake.judge.crashes import INPUT_REJECTED
from specwake.judge.verdict import exit_code
from specwake.prepare.memory import refuse_short_memory
from specwake.prepare.scenario import Overrides, Scenario, load_scenario
from specwake.prepare.variants import (
    PreparedVariant,
    available_cpus,
    build_models,
    inspect_patches,
    prepare,
    require_runnable,
    untested_releases,
    validate_run,
)
from specwake.report import render_markdown
from specwake.report.junit import write_junit
from specwake.results import INCOMPLETE, ScenarioResult, VariantResult
from specwake.run.server.leftovers import handle_leftovers, registry_dir
from specwake.run.session.assemble import VariantRecord, host_info, judge_scenario, judge_variant, now_iso
from specwake.run.session.machine_turn import machine_turn
from specwake.run.session.runner import Work, mode_line, run_packed_scenarios, run_scenario, server_jobs, speed_binds
from specwake.run.session.shards import Shard, jobs_of
from specwake.runfolder import RESULT_FILE, RunLayout, check_writable, load_result, scenario_results, write_files


@dataclass(frozen=True)
class RunRequest:
    scenarios: Sequence[Path]
    overrides: Overrides
    output: Path
    cache: Path
    interleave: bool = False
    sequential: bool = False  # CPU: one server at a time (the default starts them side by side)
    gpus: tuple[int, ...] | None = None  # --gpus: visible GPU indices; None: every GPU vLLM counts
    junit: Path | None = None
    resume: Path | None = None
    shard: Shard | None = None  # run only this machine's share of the scenario × variant jobs
    loaded: tuple[Scenario, ...] = ()  # scenarios already loaded (and changed, as bisect does) instead of the files
    stop_leftovers: bool = False  # stop servers that runs which died left running, instead of only naming them


@dataclass(frozen=True)
class RunOutcome:
    results: list[ScenarioResult]
    run_root: Path | None
    markdown: str
    exit_code: int
    note: str | None = None


def _recorded(resume: Path) -> dict[str, ScenarioResult]:
    """The results of the run folder --resume names, by scenario name; InputError when it holds none."""
    if not resume.is_dir():
        raise InputError(f"--resume: not a run folder: {resume}")
    found = {result.name: result for result in map(load_result, scenario_results(resume))}
    if not found:
        raise InputError(f"--resume: no {RESULT_FILE} in {resume}")
    return found


def recorded_scenarios(resume: Path) -> list[Path]:
    """The scenario files an interrupted run folder ran (each result names its file), for `run --resume DIR` without
    them; InputError naming the folder and the file when one is no longer there to read."""
    files = []
    for result in _recorded(resume).values():
        recorded = str(result.scenario.get("file") or "")
        problem = what_it_is(Path(recorded)) if recorded else "no file recorded"
        if problem is not None:
            raise InputError(
                f"--resume: {resume} ran scenario {result.name} from {recorded or '?'}: {problem}; name its file:"
                f" specwake run FILE --resume {resume}"
            )
        files.append(Path(recorded))
    return files


def _previous(resume: Path, scenarios: Sequence[Scenario]) -> dict[str, ScenarioResult]:
    """Results of an interrupted run folder, by scenario name; the scenario files must be unchanged."""
    found = _recorded(resume)
    for scenario in scenarios:
        old = found.get(scenario.name)
        if old is not None and old.scenario.get("sha256") != scenario.sha256:
            raise InputError(f"--resume: {scenario.file} changed since {resume} was run (scenario sha256 differs)")
        if old is not None and old.scenario.get("settings", {}).get("cycle") != scenario.settings()["cycle"]:
            raise InputError(f"--resume: {scenario.name}: cycle settings differ from the interrupted run (same flags?)")
    return found


def _kept(previous: ScenarioResult | None) -> list[VariantResult]:
    if previous is None:
        return []
    return [v for v in previous.variants if v.outcome != INCOMPLETE]


def _layout(request: RunRequest, scenarios: Sequence[Scenario]) -> RunLayout:
    """The run's folders, created: a new run folder, or the interrupted one --resume names."""
    names = [s.name for s in scenarios]
    if request.resume is not None:
        layout = RunLayout(request.resume, tuple(names))
    else:
        shard = request.shard
        label = f"{shard.index}of{shard.count}" if shard else None
        layout = RunLayout.new(request.output, names, dt.datetime.now(dt.timezone.utc), label)
    layout.create()
    return layout


def execute(request: RunRequest, events: Events) -> RunOutcome:
    """Everything `specwake run` does; raises SpecwakeError subclasses for input (2) and infrastructure (3)."""
    gpus, shard = request.gpus, request.shard
    files = request.scenarios
    if not files and not request.loaded and request.resume is not None:  # the run folder knows what it ran
        files = recorded_scenarios(request.resume)
    scenarios = list(request.loaded) or [load_scenario(path, request.overrides) for path in files]
    refuse_same_names(scenarios)
    jobs = [(f"{s.name}/{v.name}", s.server.ranks) for s in scenarios for v in s.variants]
    mine = jobs_of(shard, jobs) if shard is not None else None
    previous = _previous(request.resume, scenarios) if request.resume is not None else {}
    # Bad input is reported before anything is created or launched.
    patches = {scenario.name: inspect_patches(scenario) for scenario in scenarios}
    check_writable(request.resume or request.output, "--resume" if request.resume else "--output")
    build_models(scenarios, request.cache)
    prepared: list[list[PreparedVariant]] = []
    for scenario in scenarios:
        kept = {v.name for v in _kept(previous.get(scenario.name))}
        variants = [
            p
            for p in prepare(scenario, request.cache, events, gpus=gpus, patches=patches[scenario.name])
            if p.variant.name not in kept and (mine is None or f"{scenario.name}/{p.variant.name}" in mine)
        ]
        prepared.append(variants)
    validate_run(scenarios, prepared, request.cache, events)
    for variants in prepared:
        require_runnable(variants)
    for line in untested_releases(prepared):
        events(Event(line))
    if shard is not None:  # a shard runs only the scenarios it has jobs of
        active = [(s, p) for s, p in zip(scenarios, prepared, strict=True) if p]
        if not active:
            note = f"shard {shard}: no jobs here ({len(jobs)} scenario × variant jobs over {shard.count} shards)"
            return RunOutcome([], None, "", EXIT_PASS, note)
        scenarios, prepared = [s for s, _ in active], [p for _, p in active]
    on_gpu = any(p.engine.is_gpu for variants in prepared for p in variants)
    if gpus is not None and on_gpu:
        refuse_invisible_gpus(gpus, visible_gpus(prepared))
    # Runs on one machine take turns (machine_turn): from before the leftovers and free memory are looked at until the
    # last server stops; exclusively where a speed call binds, so that the stages' tok/s is their own.
    alone = speed_binds(list(zip(scenarios, prepared, strict=True)))
    with machine_turn(request.cache, alone, events):
        return _run_in_turn(request, scenarios, prepared, previous, events, alone)


def _run_in_turn(
    request: RunRequest,
    scenarios: list[Scenario],
    prepared: list[list[PreparedVariant]],
    previous: dict[str, ScenarioResult],
    events: Events,
    machine_alone: bool,
) -> RunOutcome:
    """The run once it holds the machine's turn: leftovers, free memory, the run folder, the servers, the outputs."""
    gpus, shard = request.gpus, request.shard
    on_gpu = any(p.engine.is_gpu for variants in prepared for p in variants)
    handle_leftovers(request.cache, request.stop_leftovers, events)
    if on_gpu:  # after leftovers are stopped, before anything is created: what the servers will find
        refuse_short_memory(scenarios, prepared, gpus if gpus is not None else visible_gpus(prepared), events)
    layout = _layout(request, scenarios)
    events(Event(f"results in {layout.root}"))
    work = [
        Work(s, p, layout, _kept(previous.get(s.name)), _started(previous.get(s.name)))
        for s, p in zip(scenarios, prepared, strict=True)
    ]
    try:
        results = _run(request, work, gpus, str(shard) if shard else None, events, machine_alone)
    except (KeyboardInterrupt, Interrupted):
        # A CI timeout or cancel (SIGINT, SIGTERM): servers are stopped and result files saved by now. The run's
        # outputs still get written — report, JUnit with every unfinished variant marked not run — before exit 130.
        partial = _as_far_as_it_got(work, str(shard) if shard else None)
        raise RunInterrupted(_outputs(request, layout, partial, events, EXIT_INTERRUPTED)) from None
    refused = any(v.crash_class == INPUT_REJECTED for r in results for v in r.variants)
    return _outputs(request, layout, results, events, exit_code([r.verdict for r in results], input_rejected=refused))


class RunInterrupted(Interrupted):
    """The run was interrupted; `outcome` has what it measured, its report and its exit code (130)."""

    def __init__(self, outcome: RunOutcome) -> None:
        super().__init__("interrupted: servers stopped, results measured so far are saved")
        self.outcome = outcome


def _outputs(
    request: RunRequest, layout: RunLayout, results: list[ScenarioResult], events: Events, code: int
) -> RunOutcome:
    """The run's combined outputs: the combined report, the JUnit file, the CI step summary."""
    markdown = render_markdown(results)
    if layout.combined_report is not None:
        write_files(layout.root, {layout.combined_report.name: markdown})
    if request.junit is not None:
        write_junit(request.junit, results)
    _append_step_summary(markdown, events)
    return RunOutcome(results, layout.root, markdown, code)


def _as_far_as_it_got(work: Sequence[Work], shard: str | None) -> list[ScenarioResult]:
    """Every scenario of an interrupted run: what its result file holds, and each variant that never started as
    `incomplete` (nothing measured), in the scenario's order."""
    results = []
    for w in work:
        path = w.run_dir / RESULT_FILE
        saved = load_result(path) if path.is_file() else None
        have = {v.name: v for v in (saved.variants if saved else w.kept)}
        for prep in w.prepared:
            if prep.variant.name not in have:
                have[prep.variant.name] = judge_variant(w.scenario, prep, VariantRecord(prep.variant.name, ""))
        order = [v.name for v in w.scenario.variants]
        variants = sorted(have.values(), key=lambda v: order.index(v.name) if v.name in order else len(order))
        if saved is not None:
            results.append(replace(saved, variants=variants, complete=False))
        else:
            started = w.started_at or now_iso()
            results.append(
                judge_scenario(
                    w.scenario, variants, started, complete=False, mode="not started", host=host_info(), shard=shard
                )  # fmt: skip
            )
    return results


def _run(
    request: RunRequest,
    work: list[Work],
    gpus: tuple[int, ...] | None,
    shard: str | None,
    events: Events,
    machine_alone: bool,
) -> list[ScenarioResult]:
    """Run every scenario in the mode asked for: on GPUs packed, each server on its own GPUs; on CPU side by
    side (each on its own cores, measurements alone) unless --sequential or --interleave. `machine_alone`: the run
    holds the machine's turn exclusively."""
    prepared = [w.prepared for w in work]
    registry = registry_dir(request.cache)
    if any(p.engine.is_gpu for variants in prepared for p in variants):
        inventory = gpus if gpus is not None else visible_gpus(prepared)
        return run_packed_scenarios(
            work, inventory, events, shard=shard, registry=registry, machine_alone=machine_alone
        )
    if not (request.interleave or request.sequential):
        return run_packed_scenarios(
            work, available_cpus(), events, shard=shard, cpu=True, registry=registry, machine_alone=machine_alone
        )
    mode = "interleaved" if request.interleave else "sequential"
    events(Event(mode_line(mode, len(server_jobs(work)), asked=True)))
    return [
        run_scenario(
            w.scenario,
            w.prepared,
            w.layout,
            events,
            interleave=request.interleave,
            kept=w.kept,
            started_at=w.started_at,
            shard=shard,
            registry=registry,
            machine_alone=machine_alone,
        )  # fmt: skip
        for w in work
    ]


def refuse_same_names(scenarios: Sequence[Scenario]) -> None:
    """Two scenarios of one run with one name would share a run folder and a report section."""
    seen: dict[str, Scenario] = {}
    for scenario in scenarios:
        first = seen.setdefault(scenario.name, scenario)
        if first is not scenario and first.file == scenario.file:
            raise InputError(f"{scenario.file}: given twice; name each scenario file once")
        if first is not scenario:
            raise InputError(
                f"{scenario.file}: name: {scenario.name!r} is also the name of {first.file}; two scenarios of one run"
                " need different names (their run folders and report sections would collide)"
            )


def _started(previous: ScenarioResult | None) -> str | None:
    return previous.started_at if previous is not None else None


def refuse_invisible_gpus(asked: Sequence[int], visible: Sequence[int]) -> None:
    """--gpus indices count inside CUDA_VISIBLE_DEVICES, as the engine sees them: refuse one beyond it up front
    rather than fail each server that would get it."""
    beyond = sorted(g for g in asked if g not in visible)
    if beyond:
        seen = f"indices 0-{len(visible) - 1}" if visible else "none"
        raise InputError(
            f"--gpus: GPU {beyond[0]} is not visible to vLLM here ({len(visible)} visible, {seen};"
            " indices count inside CUDA_VISIBLE_DEVICES)"
        )


def visible_gpus(prepared: Sequence[Sequence[PreparedVariant]]) -> tuple[int, ...]:
    count = max((p.engine.device_count for variants in prepared for p in variants), default=0)
    return tuple(range(count))


def _append_step_summary(markdown: str, events: Events) -> None:
    """In GitHub Actions, add the report to the job's summary page (a failure there only warns: the results
    themselves are written already)."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(markdown if markdown.endswith("\n") else markdown + "\n")
    except OSError as exc:
        events(Event(f"warning: GITHUB_STEP_SUMMARY not writable ({target}: {exc.strerror}); report.md has the report"))
