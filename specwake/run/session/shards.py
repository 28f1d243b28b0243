"""CI fleets: a deterministic split of scenario × variant jobs over N machines (`specwake run --shard K/N`), and the
merge of the shards' results back into one result per scenario (`specwake report` / `compare` over every shard).

Pure. Every machine computes the same split from the same scenario files, so no two shards run the same job and
none is skipped; the split balances GPUs (tensor-parallel size) across machines, largest jobs first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from specwake.errors import InputError
from specwake.judge.verdict import decide_verdict
from specwake.results import INCOMPLETE, ScenarioResult

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`K/N` with 1 ≤ K ≤ N; InputError naming the flag otherwise."""
    match = _SHARD.match(text)
    if match is None:
        raise InputError(f"--shard: expected K/N (e.g. 2/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise InputError(f"--shard: K must be between 1 and N, got {index}/{count}")
    return Shard(index, count)


# Buildkite's parallel job variables (`parallelism: N` on a step): the job's 0-based index and the job count.
BUILDKITE_JOB, BUILDKITE_COUNT = "BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT"


def shard_from_env(environ: Mapping[str, str]) -> Shard | None:
    """The shard Buildkite's parallel job variables name (job 0 of 4 is 1/4), None when they are not both set;
    InputError naming the variable when one is not a number in range."""
    job, count = environ.get(BUILDKITE_JOB, "").strip(), environ.get(BUILDKITE_COUNT, "").strip()
    if not job or not count:
        return None
    if not job.isdigit() or not count.isdigit():
        bad = BUILDKITE_JOB if not job.isdigit() else BUILDKITE_COUNT
        raise InputError(f"{bad}: expected a whole number, got {environ[bad]!r}")
    if not 0 <= int(job) < int(count):
        raise InputError(f"{BUILDKITE_JOB}: {job} is not below {BUILDKITE_COUNT} {count}")
    return Shard(int(job) + 1, int(count))


def choose_shard(flag: str | None, every_job: bool, environ: Mapping[str, str]) -> Shard | None:
    """This run's shard: `--shard K/N`; none with `--no-shard` (every job here, whatever Buildkite's variables say,
    as a canary inside a `parallelism` step needs); else the one Buildkite's parallel job variables name, if any."""
    if flag is not None and every_job:
        raise InputError("--shard, --no-shard: choose one")
    if flag is not None:
        return parse_shard(flag)
    return None if every_job else shard_from_env(environ)


def assign(jobs: Sequence[tuple[str, int]], count: int) -> list[list[str]]:
    """(job key, GPUs it needs) → the keys of each of `count` shards. Largest first, each to the least loaded
    shard (ties: the lowest). Every key lands in exactly one shard; keys must be unique."""
    keys = [key for key, _ in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError("job keys must be unique")
    shards: list[list[str]] = [[] for _ in range(count)]
    load = [0] * count
    for key, weight in sorted(jobs, key=lambda job: (-job[1], job[0])):
        target = min(range(count), key=lambda i: (load[i], i))
        shards[target].append(key)
        load[target] += weight
    return shards


def jobs_of(shard: Shard, jobs: Sequence[tuple[str, int]]) -> set[str]:
    return set(assign(jobs, shard.count)[shard.index - 1])


def merge_shards(results: Sequence[ScenarioResult]) -> list[ScenarioResult]:
    """One result per scenario: results of one scenario file (same name and sha256) whose variants do not overlap
    are merged, their verdict decided again from every variant. Anything else is kept as it is."""
    merged: list[ScenarioResult] = []
    for result in results:
        key = (result.name, result.scenario.get("sha256"))
        into = next(
            (
                i
                for i, done in enumerate(merged)
                if (done.name, done.scenario.get("sha256")) == key and not _overlap(done, result)
            ),
            None,
        )
        if into is None:
            merged.append(result)
            continue
        merged[into] = _combine(merged[into], result)
    return merged


def _overlap(a: ScenarioResult, b: ScenarioResult) -> bool:
    return bool({v.name for v in a.variants} & {v.name for v in b.variants})


def _combine(a: ScenarioResult, b: ScenarioResult) -> ScenarioResult:
    order = list((a.scenario.get("settings") or {}).get("variants") or {})
    variants = sorted([*a.variants, *b.variants], key=lambda v: order.index(v.name) if v.name in order else len(order))
    verdict = decide_verdict([(v.outcome, v.matched) for v in variants if v.outcome != INCOMPLETE])
    shards = [s for r in (a, b) for s in (r.scenario.get("shards") or [r.scenario.get("shard")]) if s]
    finished = [t for t in (a.finished_at, b.finished_at) if t]
    runs = [r for r in (a.scenario.get("run"), b.scenario.get("run")) if r]  # the run folders, where loaded from one
    return replace(
        a,
        scenario={**a.scenario, "shards": shards, **({"run": " + ".join(runs)} if runs else {})},
        variants=variants,
        verdict=verdict,
        started_at=min(a.started_at, b.started_at),
        finished_at=max(finished) if finished else None,
        complete=a.complete and b.complete,
    )
