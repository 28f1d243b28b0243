"""One scenario end to end: run its prepared variants one after another (or interleaved, both servers up),
decide outcomes and the verdict, and keep the result files current after every phase.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specwake.errors import Interrupted, SpecwakeError
from specwake.events import Event, Events
from specwake.judge.verdict import speed_rule
from specwake.prepare.plan import warm_startable
from specwake.prepare.scenario import Scenario
from specwake.prepare.variants import PreparedVariant, plan_servers
from specwake.report import run_files
from specwake.results import ScenarioResult, VariantResult
from specwake.run.measure.gate import AnyTime, Gate, Quiet, Turns
from specwake.run.server.warm import LAUNCHERS, WARM_STARTS, Key, launcher_key
from specwake.run.server.warm import SWITCH as WARM_SWITCH
from specwake.run.session.assemble import VariantRecord, host_info, judge_scenario, judge_variant, now_iso
from specwake.run.session.schedule import Job, priority, run_packed, side_by_side
from specwake.run.session.variant_run import VariantRun
from specwake.runfolder import RunLayout, write_files


class Recorder:
    """Keeps one scenario's result files current; safe to call from several job threads. Every variant the run
    plans is in them from the first save on: one not started yet as `incomplete` with nothing recorded, so that the
    files of a run killed outright (no chance to save again) still name it."""

    def __init__(
        self,
        scenario: Scenario,
        run_dir: Path,
        runs: Sequence[VariantRun],
        mode: str,
        kept: Sequence[VariantResult] = (),
        started_at: str | None = None,
        shard: str | None = None,
        planned: Sequence[PreparedVariant] = (),
    ) -> None:
        self.scenario, self.run_dir, self.runs, self.mode, self.shard = scenario, run_dir, runs, mode, shard
        self.planned = list(planned)  # every variant this run is to run (kept ones aside)
        self.kept = list(kept)  # complete results carried over from an earlier, interrupted run (--resume)
        self.started_at = started_at or now_iso()
        self.host = host_info()  # read once: platform.platform() asks `uname`
        self._lock = threading.Lock()

    def result(self, complete: bool = False) -> ScenarioResult:
        fresh = {run.name: run.result() for run in self.runs if run.started_any or complete}
        merged = {v.name: v for v in self.kept} | fresh
        for prep in self.planned:
            name = prep.variant.name
            if name not in merged:
                merged[name] = judge_variant(self.scenario, prep, VariantRecord(name, ""))
        order = [v.name for v in self.scenario.variants]
        variants = sorted(merged.values(), key=lambda v: order.index(v.name) if v.name in order else len(order))
        return judge_scenario(
            self.scenario,
            variants,
            self.started_at,
            complete=complete,
            mode=self.mode,
            host=self.host,
            shard=self.shard,
        )

    def add(self, run: VariantRun) -> None:
        """A variant that starts now (packed runs start a scenario's variants from job threads)."""
        with self._lock:
            self.runs = [*self.runs, run]

    def save(self, complete: bool = False) -> ScenarioResult:
        with self._lock:
            result = self.result(complete)
            write_files(self.run_dir, run_files(result))
            return result


def run_scenario(
    scenario: Scenario,
    prepared: Sequence[PreparedVariant],
    layout: RunLayout,
    events: Events,
    *,
    interleave: bool = False,
    kept: Sequence[VariantResult] = (),
    started_at: str | None = None,
    shard: str | None = None,
    registry: Path | None = None,
    machine_alone: bool = True,
) -> ScenarioResult:
    """Run every prepared variant; result files are rewritten after every phase, so an interrupted run
    (Ctrl-C, SIGTERM) leaves a valid partial result. `registry`: where servers are recorded while they run;
    `machine_alone`: whether the run holds the machine's turn exclusively (alone_on_machine).

    interleave: start all variants' servers, then alternate their phases (fresh A, fresh B, cycle 1 A, ...) so slow
    drift of clocks or load does not bias one variant against the other.
    """
    # one server at a time, or all up with their phases taken in turn: nothing else of the run measures meanwhile
    alone = Gate(alone=alone_on_machine(True, machine_alone))
    runs = [
        VariantRun(scenario, p, layout.log_file(scenario.name, p.variant.name), events, gate=alone, registry=registry)
        for p in prepared
    ]
    mode = "interleaved" if interleave else "sequential"
    recorder = Recorder(scenario, layout.scenario_dir(scenario.name), runs, mode, kept, started_at, shard, prepared)
    recorder.save()  # every planned variant named before any server starts
    try:
        if interleave:
            _run_interleaved(runs, recorder.save)
        else:
            _run_sequential(runs, recorder.save, events)
    except BaseException:
        recorder.save()  # Ctrl-C / SIGTERM: servers are stopped by now; keep everything measured so far
        raise
    return recorder.save(complete=True)


ANY_TIME = AnyTime()


def _run_sequential(runs: Sequence[VariantRun], save: Callable[[], object], events: Events) -> None:
    for run in runs:
        _run_one(run, save, events)


def _run_one(
    run: VariantRun,
    save: Callable[[], object],
    events: Events,
    cancel: threading.Event | None = None,
    turns: Turns = ANY_TIME,
) -> None:
    """Open, run every phase in one turn, close one variant; with `cancel`, stop between phases once it is set. An
    exception of specwake's own code (not one of its errors: a bug) ends the variant as `specwake_failed`, and the
    run goes on."""

    def every_phase() -> None:
        run.open()
        save()
        if not run.finished:  # one that never became ready has nothing to measure and waits for no turn
            with turns.turn():
                for phase in range(run.phases):
                    if cancel is not None and cancel.is_set():
                        raise Interrupted(f"{run.name}: cancelled")
                    run.run_phase(phase)
                    save()

    try:
        _guarded(run, every_phase)
    finally:
        run.close()
    final = run.result()
    source = run.prep.variant.expected_from
    events(Event(f"{final.outcome} (expected {final.expected}{f', {source}' if source else ''})", run.name))


def _run_interleaved(runs: Sequence[VariantRun], save: Callable[[], object]) -> None:
    with contextlib.ExitStack() as stack:
        for run in runs:
            stack.callback(run.close)
            _guarded(run, run.open)
            save()
        for phase in range(max(run.phases for run in runs)):
            for run in runs:
                _guarded(run, functools.partial(run.run_phase, phase))
                save()


def _guarded(run: VariantRun, step: Callable[[], None]) -> None:
    """One step of a variant; an exception of specwake's own code (a bug) ends that variant as `specwake_failed`
    (its next phases do nothing), and the others go on."""
    try:
        step()
    except SpecwakeError:
        raise
    except Exception as exc:
        run.fail_inside(exc)


def _scoped(events: Events, scenario: str) -> Events:
    """Progress lines of a packed run name their scenario: `eagle3-eager/baseline: stage fresh`."""
    return lambda event: events(event.within(scenario))


def _stop_when_cancelled(cancel: threading.Event, run: VariantRun) -> None:
    """Stop a variant's server from outside its thread once the run is cancelled, so a blocked request ends."""
    cancel.wait()
    run.server.stop()


@dataclass(frozen=True)
class Work:
    """One scenario to run: its prepared variants, the run's folders, and what an interrupted run already kept."""

    scenario: Scenario
    prepared: Sequence[PreparedVariant]
    layout: RunLayout
    kept: Sequence[VariantResult] = ()
    started_at: str | None = None

    @property
    def run_dir(self) -> Path:
        return self.layout.scenario_dir(self.scenario.name)


MEASURING = {
    "overlapped": "servers side by side, measuring one at a time: a speed call binds, so tok/s must be each one's own",
    "parallel": "servers side by side, measuring at once: no speed call binds here (AL decides, tok/s is advisory)",
    "packed": "servers side by side on their own GPUs; a stage whose tok/s decides measures alone: no other server"
    " starts, cycles, measures or stops meanwhile",
    "sequential": "one server at a time: no two of the run's servers fit side by side (each needs a core, or a GPU,"
    " per rank of every engine)",
}
ONE_SERVER = "one server: nothing else of the run starts, cycles or measures beside it"
ASKED = {
    "sequential": "one server at a time (--sequential)",
    "interleaved": "a scenario's servers up at once, their stages alternated (--interleave)",
}


def mode_line(mode: str, servers: int, asked: bool = False) -> str:
    """What a run prints (and `check` shows) of how its servers are scheduled: `mode` as the result records it,
    `servers` the run's server count, `asked` where --sequential or --interleave chose the mode."""
    if servers == 1:
        return ONE_SERVER
    return ASKED[mode] if asked else MEASURING[mode]


def speed_binds(runs: Sequence[tuple[Scenario, Sequence[PreparedVariant]]]) -> bool:
    """Whether any variant of the run (scenarios and their prepared variants) has a binding speed call: then its
    tok/s must not be shared with another server's measurement, of this run (turns) or of another (machine_turn)."""
    return any(speed_rule(s.min_speedup_recovery, p.l2_discard).binding for s, prepared in runs for p in prepared)


def alone_on_machine(alone: bool, machine_alone: bool) -> bool | None:
    """What a stage records as `measured_alone`: `alone` among the run's servers, where the run held the machine's
    turn exclusively (no other specwake run had a server up meanwhile: machine_turn); where it held the turn shared,
    a stage alone in its run claims nothing (None), as other runs whose tok/s decides nothing may have measured."""
    return alone if machine_alone or not alone else None


# est_seconds of a server that waits for its warm launcher's imports, against Job's default 1.0 for one forked from a
# launcher that has made them: 7.5-9 s from launch to stopped against 3.5-4.5 s for the CPU family scenarios on this
# repository's 2-core machine (benchmarks/bench_time_to_verdict.py). It ranks such servers first; it forecasts nothing.
PAYS_IMPORTS_S = 2.0


def launcher_of(scenario: Scenario, prep: PreparedVariant) -> Key | None:
    """The warm launcher a variant's server is forked from (run/server/warm.py); None where it starts cold (a GPU
    server, or warm starts switched off)."""
    if os.environ.get(WARM_SWITCH) == "0":
        return None
    plan = plan_servers(scenario, prep)[0]
    return launcher_key(plan.argv, plan.env) if warm_startable(plan) else None


def server_jobs(work: Sequence[Work]) -> list[Job]:
    """One job per scenario × variant server, needing a device (GPU or core) per rank of every engine."""
    return [Job(f"{w.scenario.name}/{p.variant.name}", w.scenario.server.ranks) for w in work
            for p in w.prepared]  # fmt: skip


def launcher_kinds(work: Sequence[Work]) -> list[Key | None]:
    """`launcher_of` each variant of `work`, in server_jobs' order."""
    return [launcher_of(w.scenario, p) for w in work for p in w.prepared]


def launch_order(work: Sequence[Work], kinds: Sequence[Key | None] | None = None) -> list[Job]:
    """The jobs of `server_jobs`, the first server of each warm launcher ranked ahead of the rest (est_seconds; the
    scheduler starts the longest first): it waits for its launcher's imports, so servers of different launchers
    started together make their imports side by side, each on its own cores. In key order, the first two servers of
    the CPU family scenarios were two of one launcher (`baseline`, `baseline-0.34`): one core made the imports while
    the other waited for them, about 6 s of a 67 s run.

    At most LAUNCHERS kinds are ranked so, the first in the scheduler's order: the pool keeps that many launchers, so
    ranking every kind first would start more launchers than it keeps, each with servers still to come, and the first
    would be retired before the rest of their servers came, to import again."""
    jobs = server_jobs(work)
    kinds = launcher_kinds(work) if kinds is None else kinds
    first: dict[Key, Job] = {}
    for job, kind in sorted(zip(jobs, kinds, strict=True), key=lambda pair: priority(pair[0])):
        if kind is not None and len(first) < LAUNCHERS:
            first.setdefault(kind, job)
    return [replace(job, est_seconds=PAYS_IMPORTS_S) if job in first.values() else job for job in jobs]


def packing_mode(work: Sequence[Work], devices: Sequence[int], cpu: bool) -> str:
    """What a packed run of `work` on `devices` (GPUs, or CPU cores with `cpu`) does, as its result records it:
    `sequential` where no two of its servers ever fit side by side (one server, or each needing more than half the
    devices), so they run one after the other; else `packed` on GPUs, and on cores `overlapped` where a speed call
    binds (measurements take turns), `parallel` where none does."""
    if not side_by_side(server_jobs(work), devices):
        return "sequential"
    if not cpu:
        return "packed"
    return "overlapped" if speed_binds([(w.scenario, w.prepared) for w in work]) else "parallel"


def run_packed_scenarios(
    work: Sequence[Work],
    devices: Sequence[int],
    events: Events,
    shard: str | None = None,
    *,
    cpu: bool = False,
    registry: Path | None = None,
    machine_alone: bool = True,
) -> list[ScenarioResult]:
    """Every scenario × variant server on its own disjoint set of `devices`, as many at once as fit, largest TP
    first. On a GPU machine the devices are GPUs, and a stage whose tok/s decides measures while no other server is
    busy (gate.Quiet). With `cpu` they are CPU cores: servers run side by side, each confined to its own cores, and
    where a speed call binds whole variants measure one at a time (gate.Turns) so their tok/s is their own. Where no
    two servers fit side by side, they run one after the other and the result says `sequential` (packing_mode).

    One server's crash never stops the others. On Ctrl-C every running server is stopped (not just abandoned)
    and every scenario keeps what it measured. `registry`: where servers are recorded while they run;
    `machine_alone`: whether the run holds the machine's turn exclusively (alone_on_machine).
    """
    cancel = threading.Event()
    mode = packing_mode(work, devices, cpu)
    turns = Turns(cancel) if mode == "overlapped" else AnyTime()
    # On GPUs the deciding stages take turns, not whole variants; one server at a time measures alone anyway.
    gate = Quiet(cancel) if mode == "packed" else Gate(alone=alone_on_machine(mode != "parallel", machine_alone))
    kinds = launcher_kinds(work)
    jobs = launch_order(work, kinds)
    WARM_STARTS.expect(kind for kind in kinds if kind is not None)
    events(Event(mode_line(mode, len(jobs))))
    unit = "cores" if cpu else "GPUs"
    recorders: list[Recorder] = []
    by_key: dict[str, tuple[Work, PreparedVariant, int]] = {}
    for index, w in enumerate(work):
        recorders.append(Recorder(w.scenario, w.run_dir, [], mode, w.kept, w.started_at, shard, w.prepared))
        recorders[-1].save()  # every planned variant named before any server starts
        for prep in w.prepared:
            by_key[f"{w.scenario.name}/{prep.variant.name}"] = (w, prep, index)

    def run_job(job: Job, got: tuple[int, ...]) -> VariantResult:
        w, prep, index = by_key[job.key]
        scenario = w.scenario
        scoped = _scoped(events, scenario.name)
        gpus, cores = ((), got) if cpu else (got, ())
        log = w.layout.log_file(scenario.name, prep.variant.name)
        run = VariantRun(
            scenario, prep, log, scoped, gpus=gpus, cores=cores, cancel=cancel, gate=gate, registry=registry
        )
        recorder = recorders[index]
        recorder.add(run)
        watcher = threading.Thread(target=_stop_when_cancelled, args=(cancel, run), daemon=True)
        watcher.start()
        _run_one(run, recorder.save, scoped, cancel, turns)
        return run.result()

    try:
        run_packed(jobs, devices, run_job, on_event=lambda text: events(Event(text)), cancel=cancel, unit=unit)
    except BaseException:
        for recorder in recorders:
            recorder.save()
        raise
    finally:
        cancel.set()  # releases the watcher threads
    return [recorder.save(complete=True) for recorder in recorders]
