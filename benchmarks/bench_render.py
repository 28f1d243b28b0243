"""What a run's saves cost specwake's own process: a run renders its scenario's files (result.json, report.md,
stages.csv) after every phase, each time with every stage measured so far. The stage table's tok/s ratio against the
fresh stage is a seeded bootstrap (specwake.judge.stats.ratio), the same for the same samples; it is computed once per
stage (kept) against at every call (each render's report and CSV each computing every stage's, as before).
Replays a finished run's result.json as the run saved it, phase by phase, both ways, interleaved. Prints figures;
asserts nothing.

    .venv/bin/python benchmarks/bench_render.py RESULT_JSON [--repeats 3]

RESULT_JSON: any run folder's result.json (the variants with several stages of tok/s samples show it best, e.g. a
`make push` run's cpu-push-draft-model).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specwake.judge import stats  # noqa: E402
from specwake.report import run_files  # noqa: E402
from specwake.results import ScenarioResult  # noqa: E402
from specwake.runfolder import load_result  # noqa: E402


def saves(result: ScenarioResult) -> list[ScenarioResult]:
    """The result as a run of its variants side by side saved it: each variant in turn gains its next stage, and
    each such state is saved twice (after the cycle that came before the stage, after the stage itself)."""
    most = max((len(v.stages) for v in result.variants), default=0)
    states = []
    for k in range(1, most + 1):
        for i in range(len(result.variants)):
            variants = [dataclasses.replace(v, stages=v.stages[: k if j <= i else k - 1])
                        for j, v in enumerate(result.variants)]  # fmt: skip
            states += [dataclasses.replace(result, variants=variants)] * 2
    return states


def replay(phases: list[ScenarioResult], keep: bool) -> float:
    kept = stats._ratio
    kept.cache_clear()
    if not keep:  # every call computes: the function the cache wraps
        stats._ratio = kept.__wrapped__  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        for phase in phases:
            run_files(phase)
        return time.perf_counter() - started
    finally:
        stats._ratio = kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = load_result(args.result)
    phases = saves(result)
    stages = sum(len(v.stages) for v in result.variants)
    print(f"{result.scenario['name']}: {len(result.variants)} variants, {stages} stages, {len(phases)} saves replayed")
    each: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for keep in (False, True):
            each[keep].append(replay(phases, keep))
    every, kept = statistics.median(each[False]), statistics.median(each[True])
    print(f"ratios computed at every render: {every * 1000:8.1f} ms for the run's saves")
    print(f"ratios kept (computed once)    : {kept * 1000:8.1f} ms for the run's saves")
    print(f"kept / every render            : {kept / every:8.2f}  (median of {args.repeats}, interleaved)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
