"""Time to verdict: the same scenarios run in two modes, alternating A/B/A/B in one invocation, with wall-time
ratios and their spread, the CPU work each mode did (machine-wide busy core-seconds) and what that allows,
verdict agreement, tok/s interval widths, and where each server's startup
went (read from the timestamps of its log). After every run, its floor: the same servers (the argv, environment
and cores its result.json recorded), started as the run started them (side by side, or one at a time under
--sequential), waited on until ready and stopped, with no cycle and no measurement; the report prints each mode's
wall time over this startup floor beside B/A. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_time_to_verdict.py [--pairs 2] SCENARIO...
    # A = --sequential (one server at a time), B = the CPU default (side by side, measurements alone)
    .venv/bin/python benchmarks/bench_time_to_verdict.py --a-flags "" --b-flags "" \\
        --b-server-args "--num-gpu-blocks-override 256" scenarios/tiny-cpu.toml   # one startup setting against none

--b-server-args runs mode B on copies of the scenario files (next to them, as .bench-NAME.toml, removed at the
end) whose `server.args` list gets the extra arguments.

Runs go to results/bench-time-to-verdict/ (git-ignored). The servers log with millisecond timestamps for the
breakdown (a logging config passed through VLLM_LOGGING_CONFIG_PATH); nothing else about them changes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwake.errors import StartupFailed
from specwake.judge.stats import summarize
from specwake.prepare.plan import ENV_ALLOW, ENV_ALLOW_PREFIXES
from specwake.run.server.server import Server, ServerSpec, free_port
from specwake.run.server.warm import WarmStarts, launcher_key
from specwake.run.session.variant_run import LOST_BIND

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "bench-time-to-verdict"

# vLLM's own log format (vllm/logger.py) with milliseconds added to the time.
LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "vllm": {
            "()": "vllm.logging_utils.NewLineFormatter",
            "datefmt": "%m-%d %H:%M:%S",
            "format": "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s.%(msecs)03d "
            "[%(fileinfo)s:%(lineno)d] %(message)s",
        }
    },
    "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "stream": "ext://sys.stdout"}},
    "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}},
}

LINE = re.compile(r"^\((?P<proc>[A-Za-z_]+)[-\w]* pid=\d+\) \w+ (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d(?:\.\d+)?) ")
HEADER = re.compile(r"^# specwake: server start (\S+)")

# Startup milestones, in the order vLLM reaches them: (segment ending there, how to find it in the log).
MILESTONES = (
    ("api server import", lambda proc, msg: proc == "APIServer"),
    ("engine core spawn", lambda proc, msg: proc.startswith("EngineCore")),
    ("worker spawn", lambda proc, msg: proc in ("Worker", "VllmWorker")),
    ("worker setup", lambda proc, msg: "Starting to load model" in msg),
    ("model load", lambda proc, msg: "Loading weights took" in msg),  # the last one: target, then drafter
    ("kv cache + warmup", lambda proc, msg: "init engine (profile, create kv cache, warmup model)" in msg),
    ("api routes", lambda proc, msg: "Starting vLLM server on" in msg),
)
LAST_MATCH = {"model load"}
SEGMENTS = [name for name, _ in MILESTONES] + ["readiness polling"]


@dataclass
class Run:
    pair: int
    mode: str
    wall: float
    cpu: float  # busy core-seconds of the whole machine during the run
    exit_code: int
    outcomes: dict[str, str] = field(default_factory=dict)  # scenario/variant → outcome
    widths: list[float] = field(default_factory=list)  # relative tok/s interval width per measured stage
    startup: list[dict[str, float]] = field(default_factory=list)  # per server: segment → seconds
    servers: list[ServerSpec] = field(default_factory=list)  # the run's servers, as its results recorded them
    floor: float | None = None  # wall time of the same servers started, made ready and stopped, nothing else
    floor_cpu: float | None = None  # busy core-seconds of the whole machine during the floor


def startup_breakdown(log: Path, startup_s: float) -> dict[str, float] | None:
    """Segment → seconds for one server log: launch → each milestone → ready (launch + startup_s)."""
    lines = log.read_text(errors="replace").splitlines()
    header = next((HEADER.match(line) for line in lines if HEADER.match(line)), None)
    if header is None:
        return None
    launch = dt.datetime.fromisoformat(header.group(1)).astimezone().replace(tzinfo=None)  # vLLM logs local time
    found: dict[str, dt.datetime] = {}
    for line in lines:
        match = LINE.match(line)
        if match is None:
            continue
        when = dt.datetime.strptime(f"{launch.year}-{match['md']} {match['hms']}", "%Y-%m-%d %H:%M:%S.%f"
                                    if "." in match["hms"] else "%Y-%m-%d %H:%M:%S")  # fmt: skip
        message = line[match.end() :]
        for name, test in MILESTONES:
            if test(match["proc"], message) and (name not in found or name in LAST_MATCH):
                found[name] = when
        if "Starting vLLM server on" in message:
            break
    segments: dict[str, float] = {}
    previous = launch
    for name, _ in MILESTONES:
        if name in found:
            segments[name] = max(0.0, (found[name] - previous).total_seconds())
            previous = found[name]
    segments["readiness polling"] = max(0.0, (launch + dt.timedelta(seconds=startup_s) - previous).total_seconds())
    return segments


def read_run(out: Path, run: Run, base_env: dict[str, str]) -> None:
    for path in sorted(out.glob("**/result.json")):
        result = json.loads(path.read_text())
        for variant in result["variants"]:
            run.outcomes[f"{result['scenario']['name']}/{variant['name']}"] = variant["outcome"]
            for stage in variant["stages"]:
                s = summarize(stage["tok_s"])
                if s.median and s.ci_low is not None and s.ci_high is not None:
                    run.widths.append((s.ci_high - s.ci_low) / s.median)
            logs = out / "floor" / result["scenario"]["name"]
            run.servers += [spec] if (spec := recorded_server(variant, base_env, logs)) else []
            log = variant.get("log_path")
            startup = variant.get("info", {}).get("timings", {}).get("startup")
            if log and startup and Path(log).is_file():
                breakdown = startup_breakdown(Path(log), startup)
                if breakdown:
                    run.startup.append(breakdown)


def recorded_server(variant: dict[str, Any], base_env: dict[str, str], logs: Path) -> ServerSpec | None:
    """The server a variant ran (argv, specwake's additions to the allow-listed part of `base_env`, the environment
    specwake ran in, cores), on a new port; None when the result recorded no command (it never started one)."""
    argv = list(variant.get("command") or [])
    if "--port" not in argv:
        return None
    argv[argv.index("--port") + 1] = "0"  # a free port is picked when the floor starts it
    env = {k: v for k, v in base_env.items() if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}
    env.update(variant.get("env") or {})
    cores = tuple(variant.get("info", {}).get("cores") or ())
    warm = variant.get("info", {}).get("start") == "warm"  # forked from a warm launcher, as the run did
    return ServerSpec(argv, env, 0, logs / f"{variant['name']}.log", startup_timeout_s=900.0, cpus=cores, warm=warm)


def on_free_port(spec: ServerSpec, warm_starts: WarmStarts) -> Server:
    port = free_port()
    argv = list(spec.argv)
    argv[argv.index("--port") + 1] = str(port)
    again = ServerSpec(argv, spec.env, port, spec.log_path, spec.startup_timeout_s, cpus=spec.cpus, warm=spec.warm)
    return Server(again, warm_starts=warm_starts)


def floor_seconds(specs: Sequence[ServerSpec], side_by_side: bool) -> float:
    """Wall time to start `specs` (all at once, or one after another), wait until each is ready, and stop them. Those
    the run forked warm are forked from launchers of the floor's own, which import as the run's did."""
    started = time.monotonic()
    batches = [list(specs)] if side_by_side else [[spec] for spec in specs]
    warm_starts = WarmStarts()
    try:
        for batch in batches:
            # Each launcher on the cores of the first server of its kind in the results' order, as in the run (the
            # server that needed it first). Started by whichever server's thread came first, they landed as the race
            # went: three launchers importing on one core (18-21 s each) and one on the other (6 s) in one floor of
            # 60 s, two on each (12-14 s) in another of 50 s, for the same scenarios.
            firsts: dict[Any, ServerSpec] = {}
            for spec in batch:
                if spec.warm:
                    firsts.setdefault(launcher_key(spec.argv, spec.env), spec)

            def launch(first: ServerSpec) -> None:
                warm_starts.launcher(first.argv, first.env, first.log_path.parent, first.cpus)

            with ThreadPoolExecutor(max_workers=max(1, len(firsts))) as pool:
                list(pool.map(launch, firsts.values()))
            servers = [on_free_port(spec, warm_starts) for spec in batch]
            try:
                # at once, as the run's jobs start them: a warm start waits for its launcher's imports in start()
                with ThreadPoolExecutor(max_workers=len(servers)) as pool:
                    list(pool.map(Server.start, servers))
                for index, server in enumerate(servers):
                    try:
                        server.wait_ready()
                    except StartupFailed as exc:
                        if LOST_BIND not in exc.log_tail:
                            raise
                        # another server's engine bound the port first: once more on another port, as a run does
                        server.stop()
                        servers[index] = server = on_free_port(batch[index], warm_starts)
                        server.start()
                        server.wait_ready()
            finally:
                for server in servers:
                    server.stop()
    finally:
        warm_starts.close()
    return time.monotonic() - started


def busy_seconds() -> float:
    """Core-seconds this machine has spent busy since boot (every state of /proc/stat's `cpu` line but idle, iowait,
    and guest time, which user time already counts). Machine-wide on purpose: a server's engine core and worker are
    grandchildren that a stopped server leaves unreaped, so RUSAGE_CHILDREN misses most of their CPU. Without
    /proc/stat (not Linux): this process's waited-for children."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def one_run(pair: int, mode: str, scenarios: Sequence[str], flags: list[str], env: dict[str, str]) -> Run:
    out = OUT / f"{time.strftime('%Y%m%d-%H%M%S')}-{pair}{mode}"
    before = busy_seconds()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "specwake.cli", "run", *scenarios, "--output", str(out), "--quiet", *flags],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    run = Run(pair, mode, wall, busy_seconds() - before, proc.returncode)
    read_run(out, run, {**os.environ, **env})
    if not run.outcomes:
        print(f"  {mode}{pair}: no result (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    elif run.servers:
        before = busy_seconds()
        run.floor = floor_seconds(run.servers, side_by_side="--sequential" not in flags)
        run.floor_cpu = busy_seconds() - before
    return run


def spread(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def report(runs: list[Run], labels: dict[str, str]) -> None:
    print("\n| pair | mode | wall s | startup floor s | wall / floor | busy core-s | exit | outcomes |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in runs:
        outcomes = ", ".join(f"{k}={v}" for k, v in sorted(r.outcomes.items()))
        floor = f"{r.floor:.1f} | {r.wall / r.floor:.2f}" if r.floor else "n/a | n/a"
        print(f"| {r.pair} | {r.mode} | {r.wall:.1f} | {floor} | {r.cpu:.1f} | {r.exit_code} | {outcomes} |")
    by = {mode: [r for r in runs if r.mode == mode] for mode in ("A", "B")}
    ratios = [b.wall / a.wall for a, b in zip(by["A"], by["B"], strict=False)]
    print(f"\nA = {labels['A']}\nB = {labels['B']}")
    for mode in ("A", "B"):
        walls = [r.wall for r in by[mode]]
        cpus = [r.cpu for r in by[mode]]
        print(f"{mode}: wall s {spread(walls)}; busy core-s {spread(cpus)}")
    print(f"wall B/A per pair: {spread(ratios)}")
    cores = os.cpu_count() or 1
    for mode in ("A", "B"):  # how close each mode comes to the cost of starting its servers and nothing else
        print(f"{mode}: wall / startup floor per run: {spread([r.wall / r.floor for r in by[mode] if r.floor])}")
    # The run's CPU work over the floor's: where the floor keeps every core busy, no schedule of the run's work brings
    # wall / floor below this; what is left above it is work (measurement), not waiting.
    for mode in ("A", "B"):
        works = [r.cpu / r.floor_cpu for r in by[mode] if r.floor_cpu]
        busy = [r.floor_cpu / cores / r.floor for r in by[mode] if r.floor_cpu and r.floor]
        print(f"{mode}: busy core-s / the floor's per run: {spread(works)}; the floor's {cores} cores were busy"
              f" {spread(busy)} of its time")  # fmt: skip
    # However B schedules its servers, it cannot finish before its CPU work is done on every core at once (a CPU-work
    # floor, not the startup floor above).
    floors = [b.cpu / cores / a.wall for a, b in zip(by["A"], by["B"], strict=False)]
    print(f"B/A floor per pair (B's busy core-s / {cores} cores / A's wall): {spread(floors)}")
    verdicts = {json.dumps(r.outcomes, sort_keys=True) for r in runs}
    print(f"outcomes identical in every run: {'yes' if len(verdicts) == 1 else 'NO'}")
    widths = {mode: [w for r in by[mode] for w in r.widths] for mode in ("A", "B")}
    if widths["A"] and widths["B"]:
        a, b = statistics.median(widths["A"]), statistics.median(widths["B"])
        print(f"tok/s interval width (relative to the median, per stage; median over stages): A {a:.3f}, B {b:.3f},"
              f" B/A {b / a:.2f} ({len(widths['A'])} and {len(widths['B'])} stages)")  # fmt: skip
    print("\nStartup, median seconds per server (from the server logs):\n")
    print("| segment | A | B |")
    print("| --- | ---: | ---: |")
    for segment in [*SEGMENTS, "total"]:
        cells = []
        for mode in ("A", "B"):
            values = [
                sum(s.values()) if segment == "total" else s[segment]
                for r in by[mode]
                for s in r.startup
                if segment == "total" or segment in s
            ]
            cells.append(f"{statistics.median(values):.1f}" if values else "n/a")
        print(f"| {segment} | {cells[0]} | {cells[1]} |")


SERVER_ARGS = re.compile(r"(?ms)^(\[server\]\n(?:(?!^\[).)*?^args = \[)(.*?)\]")


def with_server_args(scenarios: Sequence[str], extra: list[str]) -> list[Path]:
    """Copies of the scenario files, next to them (relative paths keep working), with `extra` in server.args."""
    copies = []
    added = ", ".join(json.dumps(a) for a in extra)
    for name in scenarios:
        path = Path(name)
        text = path.read_text()
        if not SERVER_ARGS.search(text):
            raise SystemExit(f"{path}: no `args = [...]` line in [server] to extend")
        copy = path.with_name(f".bench-{path.name}")
        copy.write_text(SERVER_ARGS.sub(lambda m: f"{m[1]}{m[2]}, {added}]", text, count=1))
        copies.append(copy)
    return copies


def parse_env(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(text))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--a-flags", default="--sequential", help="`specwake run` flags of mode A")
    parser.add_argument("--b-flags", default="", help="`specwake run` flags of mode B")
    parser.add_argument("--a-env", default="", help="KEY=VALUE ... for mode A's servers")
    parser.add_argument("--b-env", default="", help="KEY=VALUE ... for mode B's servers")
    parser.add_argument("--b-server-args", default="", help="extra server.args for mode B's scenarios")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    logging_config = OUT / "vllm-logging.json"
    logging_config.write_text(json.dumps(LOGGING_CONFIG))
    common = {"VLLM_LOGGING_CONFIG_PATH": str(logging_config)}
    modes = {
        "A": (shlex.split(args.a_flags), {**common, **parse_env(args.a_env)}),
        "B": (shlex.split(args.b_flags), {**common, **parse_env(args.b_env)}),
    }
    labels = {m: f"flags [{' '.join(f) or 'none'}], env [{args.a_env if m == 'A' else args.b_env}]"
              for m, (f, _) in modes.items()}  # fmt: skip
    extra = shlex.split(args.b_server_args)
    copies = with_server_args(args.scenarios, extra) if extra else []
    labels["B"] += f", server args [{args.b_server_args}]" if extra else ""
    scenarios = {"A": list(args.scenarios), "B": [str(c) for c in copies] or list(args.scenarios)}
    print(f"scenarios: {' '.join(args.scenarios)}; {args.pairs} A/B pairs, alternating; results under {OUT}")
    runs = []
    try:
        for pair in range(1, args.pairs + 1):
            for mode in ("A", "B"):
                flags, env = modes[mode]
                run = one_run(pair, mode, scenarios[mode], flags, env)
                print(f"  pair {pair} {mode}: wall {run.wall:.1f} s, busy {run.cpu:.1f} core-s, exit {run.exit_code}",
                      flush=True)  # fmt: skip
                runs.append(run)
    finally:
        for copy in copies:
            copy.unlink(missing_ok=True)
    report(runs, labels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
