"""One variant's server session, driven phase by phase: open (start + verify), phase 0 = fresh stage,
phase k = L2 cycle k + its stage, close. Variants can so run one after another or interleaved.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from specwake import protocol, weight_updates
from specwake.errors import InputRejected, Interrupted, ServerFault, StartupFailed
from specwake.events import Event, Events
from specwake.judge.crashes import (
    INPUT_REJECTED,
    MEANINGS,
    OVERLAY_NOT_USED,
    PORT_CONFLICT,
    SPECWAKE_FAILED,
    STARTUP_FAILED,
    classify,
)
from specwake.judge.log_warnings import find_warnings, first_load_seconds
from specwake.judge.verdict import speed_rule
from specwake.prepare.plan import GROUP_PORTS, PORT_UNSET, VariantPlan, warm_startable
from specwake.prepare.scenario import Scenario
from specwake.prepare.variants import PreparedVariant, check_imports, plan_servers, uses_ray
from specwake.results import STAGE_FINGERPRINTS, StepResult, VariantResult
from specwake.run.measure import diagnose
from specwake.run.measure.client import FannedClient, VllmClient
from specwake.run.measure.completions import Completer, Completion, FannedCompleter
from specwake.run.measure.cycle import run_cycle
from specwake.run.measure.gate import Gate
from specwake.run.measure.measure import Stopping, Workload, run_stage, stage_name
from specwake.run.measure.metrics import OperationClock
from specwake.run.server import raycluster
from specwake.run.server.server import Server, ServerGroup, ServerSpec, describe_exit, free_port, local_client
from specwake.run.session.assemble import VariantRecord, judge_variant, push_of
from specwake.weight_updates import KIND_BY_VIA, PushRequest, TransferChunk

LOG_SCAN_LINES = 400  # log lines handed to crash classification
LOG_EXCERPT_LINES = 40  # log lines kept in the result
EXIT_SETTLE_S = 1.0  # after a fault, how long a dying server gets to be seen as exited
# vLLM's (and Python's) text for EADDRINUSE: a port picked free was bound by another process before the server bound it
LOST_BIND = "Address already in use"
FOREIGN_PROBE_S = 2.0  # how long a port our failed server had gets to say which models it serves
RAY_FREE_TIMEOUT_S = 300.0  # after a Ray-executor server stops, how long its cluster gets to free every GPU
TRACEBACK_CHARS = 6000  # of a failure inside specwake (fail_inside), the end kept in the result


@dataclass
class SyncState:
    """What a weight sync keeps across a variant's cycles: each model's update_weights calls (its checkpoint's
    tensors as the sync sends them) and vLLM's /weight_checker sums of the fresh target."""

    chunks: dict[str, list[TransferChunk]] = field(default_factory=dict)
    checker_sums: dict[str, str] | None = None


class VariantRun:
    """Start, measure and stop one variant; every fault becomes part of its result, never an exception.

    KeyboardInterrupt is the exception: it propagates, and the caller's `close()` stops the server.
    """

    def __init__(
        self,
        scenario: Scenario,
        prep: PreparedVariant,
        log_path: Path,
        events: Events,
        *,
        gpus: tuple[int, ...] = (),
        cores: tuple[int, ...] = (),
        clock: Callable[[], float] = time.monotonic,
        cancel: threading.Event | None = None,
        gate: Gate | None = None,
        registry: Path | None = None,
    ) -> None:
        self.scenario, self.prep, self.events, self.clock = scenario, prep, events, clock
        self.registry = registry  # where its server is recorded while it runs (leftovers.registry_dir)
        self.cancel = cancel  # set when the whole run is being interrupted (packed runs stop servers from outside)
        self.gate = gate if gate is not None else Gate(alone=False)  # what its start, stages, cycles, stop wait for
        self.decides = speed_rule(scenario.min_speedup_recovery, prep.l2_discard).binding  # its tok/s decides
        self.name = prep.variant.name
        self.log_path = log_path
        # one plan per server (several where specwake balances the load) and per other node's engines; ports are bound
        # just before launch (open)
        self.plans = plan_servers(scenario, prep, gpus, cores)
        self.plan = self.plans[0]
        self.server = self._servers()
        self.rebound = False  # started once more after losing its port to another process (open)
        self.workload = Workload.of(scenario, prep.model)
        self.stopping = Stopping(scenario.tolerance, speed_binds=self.decides)  # when a stage after a cycle may stop
        self.push = push_of(scenario, prep)
        self.record = VariantRecord(self.name, str(log_path), self.plan.argv, self.plan.env_added, gpus, cores)
        self.client: VllmClient | None = None
        self.completer: Completer | None = None
        self.fresh_completions: list[Completion] = []  # kept to compare tokens and logprobs after each cycle
        self.ray = uses_ray(scenario, prep.variant)  # vLLM's Ray executor, on a cluster the user brings
        self.sync = SyncState() if self.push is not None and self.push.syncs else None
        # every data-parallel engine's workers behind one server answer through files beside the log (diagnose.Fanout)
        self.fanout = diagnose.Fanout(scenario.server.data_parallel_size, log_path.with_suffix(".answers"))
        self.phase = "startup"
        self.completed_phases = 0
        self.started = clock()
        self.ended: float | None = None  # when its server was stopped

    @property
    def phases(self) -> int:
        return self.scenario.cycle.count + 1

    @property
    def finished(self) -> bool:
        """Stopped early by a failure: no further phase will run."""
        return self.record.crash_class is not None

    @property
    def started_any(self) -> bool:
        return bool(self.record.timings) or self.finished

    @property
    def complete(self) -> bool:
        return self.finished or self.completed_phases >= self.phases

    def _timed(self, key: str, seconds: float) -> None:
        timings = self.record.timings
        timings[key] = round(timings.get(key, 0.0) + seconds, 3)

    @contextlib.contextmanager
    def _busy(self, stopping: bool = False) -> Iterator[None]:
        """Starting, cycling, diagnosing or stopping: once the gate lets it (time waited: `waiting_for_turns`)."""
        t0 = self.clock()
        with self.gate.busy(stopping):
            self._waited(t0)
            yield

    def _waited(self, since: float) -> None:
        if self.clock() - since >= 0.05:  # below that, no turn was waited for
            self._timed("waiting_for_turns", self.clock() - since)

    # -- lifecycle ---------------------------------------------------------------------------------

    def log_of(self, plan: VariantPlan, index: int) -> Path:
        """The log of the variant's `index`-th process group: server 0's is the variant's, beside it one per further
        server and one per other node."""
        path = self.log_path
        if plan.node:
            return path.with_name(f"{path.stem}.node{plan.node}{path.suffix}")
        return path if index == 0 else path.with_name(f"{path.stem}.server{index}{path.suffix}")

    def _servers(self) -> ServerGroup:
        timeout = self.scenario.server.startup_timeout_s
        specs = [
            ServerSpec(
                plan.launch or plan.argv,
                plan.env,
                plan.port,
                self.log_of(plan, i),
                timeout,
                cpus=plan.cores,
                registry=self.registry,
                http=not plan.launch,
                warm=warm_startable(plan),
            )
            for i, plan in enumerate(self.plans)
        ]
        return ServerGroup([Server(spec) for spec in specs])

    def open(self) -> None:
        """Start the server, wait for /health, check it is ours and imports the right vLLM."""
        with self._busy():
            self._open()

    def _open(self) -> None:
        # as late as possible: a port picked early may be taken meanwhile
        shared = {flag: free_port() for flag in GROUP_PORTS if flag in self.plan.argv}
        self.plans = [plan.with_port(PORT_UNSET if plan.launch else free_port(), shared) for plan in self.plans]
        self.plan = self.plans[0]
        self.record.argv = self.plan.argv
        if len(self.plans) > 1:
            self.record.info["servers"] = [
                {"argv": plan.argv, "log": str(self.log_of(plan, i))} | ({"launch": plan.launch} if plan.launch else {})
                for i, plan in enumerate(self.plans)
            ]
        self.server = self._servers()
        ports = ", ".join(f"127.0.0.1:{plan.port}" for plan in self.plans if not plan.launch)
        servers = len(self.server.http)
        nodes = f", the engines of {len(self.plans) - servers} other node(s)" if len(self.plans) > servers else ""
        self.say(f"starting {'server' if servers == 1 else 'servers'} on {ports}{nodes} (log {self.log_path})")
        t0 = self.started = self.clock()
        try:
            self.server.start()
            self.server.wait_ready()
        except StartupFailed as exc:
            self._timed("startup", self.clock() - t0)
            self.server.stop()
            if self.cancel is not None and self.cancel.is_set():  # stopped from outside: the run is interrupted
                raise Interrupted(f"{self.name}: interrupted while starting") from None
            foreign = self._foreign_answer()
            if foreign is not None:  # ours exited (the port was taken) before the foreign one was seen answering
                self._foreign_port(*foreign)
                return
            if LOST_BIND in exc.log_tail and not self.rebound:  # taken in the gap between our pick and its bind
                self.rebound = True
                self.say("its port was taken before the server could bind it: starting again on another")
                self._open()
                return
            evidence = classify(
                fault_class=STARTUP_FAILED,
                log_text=exc.log_tail,
                phase="startup",
                server_alive=False,
                message=str(exc),
            )
            self.record.crash_lines, self.record.first_error = evidence.lines, evidence.first_error
            self._fail(STARTUP_FAILED, str(exc), exc.log_tail)
            return
        self._timed("startup", self.clock() - t0)
        self.record.info["start"] = self.server.start_kind()
        self.say(f"server ready after {self.clock() - t0:.1f} s ({self.record.info['start']} start)")
        https = [local_client(server.base_url) for server in self.server.http]
        if len(https) == 1:
            self.client, self.completer = VllmClient(https[0]), Completer(https[0])
        else:
            self.client = FannedClient([VllmClient(http) for http in https])
            self.completer = FannedCompleter([Completer(http) for http in https])
        try:
            self._verify(self.client)
        except ServerFault as fault:
            self._crash(fault)

    def _verify(self, client: VllmClient) -> None:
        served = client.model_ids()
        if self.prep.model not in served:
            # Another process answers on our port (ours lost the race for it, or died): never measure it.
            self._foreign_port(self.server.base_url, served)
            return
        infos, _ = self.fanout.results(client, protocol.INFO, timeout=self.scenario.cycle.step_timeout_s)
        self.record.info["workers"] = infos
        mismatch = check_imports(self.prep, infos)
        if mismatch:
            self._fail(OVERLAY_NOT_USED, mismatch, self.server.log_tail(20))
        elif self.push is not None and (self.push.syncs or self.push.changes):
            self._choose(client, self.push)

    def _foreign_answer(self) -> tuple[str, list[str]] | None:
        """After our server failed to start (and was stopped): the models another process serves on one of its ports,
        if one answers there. Ours, when it lost the race for the port, may exit before its readiness poll ever
        reached the process that holds it."""
        for server in self.server.http:
            with local_client(server.base_url) as http:
                try:
                    return server.base_url, VllmClient(http).model_ids(timeout=FOREIGN_PROBE_S)
                except ServerFault:
                    continue
        return None

    def _foreign_port(self, url: str, served: list[str]) -> None:
        state = "running" if self.server.alive() else describe_exit(self.server.returncode() or 0)
        problem = (
            f"server at {url} serves {served}, not {self.prep.model!r}: "
            f"a foreign server holds the port (ours: {state}); nothing was measured"
        )
        self._fail(PORT_CONFLICT, problem, self.server.log_tail(LOG_EXCERPT_LINES))

    def _choose(self, client: VllmClient, push: PushRequest) -> None:
        """The trainer's side of a sync, or of a perturbed or partial push: what each model is sent (its manifest,
        asked of the first worker: every rank reads the same files), and what push_scale and push_skip pick of it."""
        timeout = self.scenario.cycle.step_timeout_s
        sent = {}
        for role in push.to:
            answers = client.rpc_results(protocol.TRANSFER_MANIFEST, timeout=timeout, kwargs={"role": role})
            sent[role] = [TransferChunk.from_dict(c) for c in (answers[0] if answers else [])]
        if push.changes:
            names = {role: [n for chunk in chunks for n in chunk.loaded_names] for role, chunks in sent.items()}
            chosen, unmatched = weight_updates.choose(names, push.scale, push.skip)
            if unmatched:
                how = KIND_BY_VIA[push.via].noun
                picks = "; ".join(
                    f"{'push_skip' if e in push.skip else 'push_scale'} {e!r} picks no tensor the {how} sends"
                    for e in unmatched
                )
                self._fail(INPUT_REJECTED, f"{MEANINGS[INPUT_REJECTED]} during {self.phase}: {picks}", None)
                return
            self.push = replace(push, chosen=chosen)
            self.record.chosen = chosen
            sent = {role: [c for one in chunks if (c := one.narrowed(chosen[role]))] for role, chunks in sent.items()}
        if self.sync is not None:
            self.sync.chunks = sent

    def close(self) -> None:
        """Stop the server (always safe to call, also when it never started)."""
        with self._busy(stopping=True):
            t0 = self.clock()
            self.server.stop()
            if self.ray and self.client is not None and not (self.cancel is not None and self.cancel.is_set()):
                # the cluster's GPUs free again before the devices go to the next server (run/server/raycluster.py)
                self.say(raycluster.wait_until_free(self.plan.python, self.plan.env, RAY_FREE_TIMEOUT_S))
        if self.client is not None:
            for member in self.client.members:
                member.http.close()
        if self.fanout.folder is not None:
            with contextlib.suppress(OSError):  # each answer's folder is removed once read: this one is empty
                self.fanout.folder.rmdir()
        self._read_logs()
        self.ended = self.clock()
        self._timed("teardown", self.ended - t0)

    def _read_logs(self) -> None:
        """What every log of the variant says that bears on the cycle (judge.log_warnings): vLLM's warnings, and the
        slowest server's first load of its weights."""
        found: list[str] = []
        loads: list[float] = []
        for server in self.server.servers:
            try:
                with open(server.spec.log_path, encoding="utf-8", errors="replace") as log:
                    lines = log.readlines()
            except OSError:  # never started: no log
                continue
            found += [quote for quote in find_warnings(lines) if quote not in found]
            load = first_load_seconds(lines)
            loads += [load] if load is not None else []
        self.record.vllm_warnings = found
        self.record.first_load_seconds = max(loads, default=None)

    # -- measurement -------------------------------------------------------------------------------

    def run_phase(self, index: int) -> None:
        """Phase 0: the fresh stage; phase k: cycle k then its stage. No-op once the variant has finished."""
        if self.finished or self.client is None:
            return
        try:
            if index == 0:
                self._stage(self.client, 0)
                with self._busy():
                    self._diagnose(self.client, 0, protocol.FRESH_POINT)
                    if self.sync is not None:
                        self._checker(self.client, self.sync, None)
            else:
                with self._busy():
                    self._cycle(self.client, index)
                if not self.finished:
                    self._stage(self.client, index)
                    with self._busy():
                        t0 = self.clock()
                        self._diagnose(self.client, index, protocol.STAGE_POINT)  # what the stage's forwards changed
                        self._timed(STAGE_FINGERPRINTS, self.clock() - t0)
        except ServerFault as fault:
            self._crash(fault)
        self.completed_phases = index + 1

    def _stage(self, client: VllmClient, cycle: int) -> None:
        label = stage_name(cycle, self.prep.variant.level)
        self.phase = label
        self.say(f"stage {label}")
        stages = self.record.stages
        fresh = stages[0] if cycle > 0 and stages else None
        t0 = self.clock()
        done: list[float] = []

        def on_request(completion: Completion) -> None:
            done.append(completion.tok_s)
            self.say(f"{label}: request {len(done)}/{self.workload.repeats}: {completion.tok_s:.1f} tok/s")

        assert self.completer is not None
        with self.gate.stage(self.decides) as alone:
            self._waited(t0)
            t0 = self.clock()
            result, completions = run_stage(
                client, self.completer, self.workload, name=label, cycle=cycle, fresh=fresh,
                fresh_completions=self.fresh_completions, stopping=self.stopping, on_request=on_request,
            )  # fmt: skip
        result = replace(result, measured_alone=alone)
        if cycle == 0:
            self.fresh_completions = completions
        self._timed("measurement", self.clock() - t0)
        stages.append(result)
        al = "–" if result.acceptance_length is None else f"{result.acceptance_length:.2f}"
        al = f"void (the counters disagree: {result.counters_disagree})" if result.counters_disagree else al
        self.say(f"{label}: AL {al}, {result.tok_s_median or 0:.1f} tok/s (median); {result.stopped}")

    def _diagnose(self, client: VllmClient, cycle: int, point: str, update: str | None = None) -> None:
        t0 = self.clock()
        entry = diagnose.take(
            client, cycle, point, timeout=self.scenario.cycle.step_timeout_s, fanout=self.fanout,
            inexact=self.scenario.cycle.inexact_tensors, update=update,
        )  # fmt: skip
        if entry is not None:
            self.record.diagnostics.append(entry)
        self._timed("diagnostics", self.clock() - t0)

    def _checker(self, client: VllmClient, sync: SyncState, cycle: int | None) -> None:
        """vLLM's /weight_checker beside specwake's fingerprints: its checksums when fresh (cycle None), its
        comparison with them after a sync; recorded in the diagnostics entry of that point."""
        t0, timeout = self.clock(), self.scenario.cycle.step_timeout_s
        point = protocol.FRESH_POINT if cycle is None else protocol.SYNC_POINT
        if cycle is None:
            sync.checker_sums, found = diagnose.checker_baseline(client, timeout=timeout)
        elif sync.checker_sums is not None:
            found = diagnose.checker_compare(client, sync.checker_sums, timeout=timeout)
        else:
            return
        taken = self.record.diagnostics
        last = max((i for i, d in enumerate(taken) if d.point == point and d.cycle == (cycle or 0)), default=None)
        if last is not None:
            taken[last] = replace(taken[last], weight_checker=found)
        self._timed("diagnostics", self.clock() - t0)

    def _cycle(self, client: VllmClient, k: int) -> None:
        level = self.prep.variant.level
        self.phase = f"L{level} cycle #{k}"
        self.say(f"L{level} cycle #{k}")
        self._diagnose(client, k, protocol.BEFORE_SLEEP)

        def after_step(step: StepResult, point: str, update: str | None) -> None:
            self.phase = f"L{level} cycle #{k} {step.name}"
            self._timed("cycle_steps", step.seconds)
            if step.ok:
                self._diagnose(client, k, point, update)
                if point == protocol.SYNC_POINT and self.sync is not None:
                    self._checker(client, self.sync, k)

        metrics = OperationClock(client.metrics_text, frozenset({protocol.SLEEP_METRIC, protocol.TRANSFER_METRIC}))
        metrics.start()
        steps, fault = run_cycle(
            client,
            k,
            level=level,
            emulate_discard=self.prep.l2_discard == "emulated",
            step_timeout_s=self.scenario.cycle.step_timeout_s,
            fill=self.scenario.cycle.discard_fill,
            discard_rules=self.prep.variant.discard_rules,
            push=self.push,
            chunks=self.sync.chunks if self.sync is not None else None,
            on_step=after_step,
            host_rss=self.server.rss_bytes,
            vllm_seconds=lambda kind: metrics.seconds(kind.vllm_metric),
        )
        self.record.steps.extend(steps)
        if fault is not None:
            self._crash(fault)

    # -- outcome -----------------------------------------------------------------------------------

    def _crash(self, fault: ServerFault) -> None:
        if self.cancel is not None and self.cancel.is_set():
            # Our server was stopped because the run is interrupted: not a crash, the variant stays incomplete.
            raise Interrupted(f"{self.name}: interrupted during {self.phase}")
        if isinstance(fault, InputRejected):  # the scenario's mistake, not vLLM's: no crash class to look for
            self._fail(INPUT_REJECTED, f"{MEANINGS[INPUT_REJECTED]} during {self.phase}: {fault}", None)
            return
        alive = not self.server.exited_within(EXIT_SETTLE_S)
        code = self.server.returncode()
        message = str(fault) if alive or code is None else f"{fault} (server {describe_exit(code)})"
        crash = classify(
            fault_class="server_exited" if not alive else fault.crash_class,
            log_text=self.server.log_tail(LOG_SCAN_LINES),
            phase=self.phase,
            server_alive=alive,
            message=message,
        )
        self.record.crash_lines, self.record.first_error = crash.lines, crash.first_error
        self._fail(crash.cls, f"{crash.reason}: {message}", self.server.log_tail(LOG_EXCERPT_LINES))

    def say(self, text: str) -> None:
        """One progress event about this variant's server."""
        self.events(Event(text, self.name))

    def _fail(self, crash_class: str, error: str, excerpt: str | None) -> None:
        """Record what went wrong; verdict.decide_outcome turns the class into `error` or `crash`."""
        self.record.crash_class, self.record.error, self.record.excerpt = crash_class, error, excerpt
        self.say(f"failed ({crash_class}) during {self.phase}: {error.splitlines()[0] if error else ''}")

    def fail_inside(self, exc: Exception) -> None:
        """specwake's own code raised while running the variant (a bug, never vLLM's fault): its result says so, with
        the traceback, and its scenario does not pass; the caller stops the server."""
        trace = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
        error = f"{MEANINGS[SPECWAKE_FAILED]} during {self.phase}: {type(exc).__name__}: {exc}"
        self._fail(SPECWAKE_FAILED, error, trace)

    def result(self) -> VariantResult:
        """The variant's result so far; outcome `incomplete` while phases remain (partial result files)."""
        self.record.complete = self.complete
        self.record.seconds = round((self.ended if self.ended is not None else self.clock()) - self.started, 2)
        return judge_variant(self.scenario, self.prep, self.record)
