"""CI fleets: the shard split never runs a job twice nor skips one, over many scenario sets; shards merge back into
one result per scenario; and `specwake run --shard` / `specwake report` do it through the CLI (fake engine)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from specwake.errors import InputError
from specwake.run.session.shards import Shard, assign, choose_shard, jobs_of, merge_shards, parse_shard
from specwake.runfolder import load_result
from tests.helpers.paths import DATA

SAMPLE = DATA / "result-v1-sample.json"
TRIALS = 2000


def random_jobs(rng: random.Random) -> list[tuple[str, int]]:
    scenarios = rng.randint(1, 12)
    return [(f"s{i}/v{j}", rng.choice([1, 1, 2, 2, 4, 8])) for i in range(scenarios) for j in range(rng.randint(1, 5))]


def test_shards_partition_every_job_set_exactly_once() -> None:
    rng = random.Random(7)
    spread: list[float] = []
    for _ in range(TRIALS):
        jobs = random_jobs(rng)
        count = rng.randint(1, 10)
        shards = assign(jobs, count)
        seen = Counter(key for shard in shards for key in shard)
        assert set(seen) == {key for key, _ in jobs} and max(seen.values()) == 1  # none skipped, none twice
        assert assign(list(reversed(jobs)), count) == shards  # the order jobs are listed in does not matter
        assert [jobs_of(Shard(k + 1, count), jobs) for k in range(count)] == [set(s) for s in shards]
        weight = dict(jobs)
        loads = [sum(weight[k] for k in shard) for shard in shards]
        spread.append(max(loads) - min(loads))
        assert max(loads) - min(loads) <= max(weight.values())  # greedy: no shard more than one job heavier
    median = sorted(spread)[len(spread) // 2]
    print(f"\n{TRIALS} random job sets: shard GPU-load spread median {median}, max {max(spread)}")


@pytest.mark.parametrize(
    ("text", "phrase"), [("2", "K/N"), ("0/3", "between 1 and N"), ("4/3", "between"), ("a/b", "K/N")]
)
def test_bad_shards_are_input_errors(text: str, phrase: str) -> None:
    with pytest.raises(InputError, match=phrase):
        parse_shard(text)
    assert parse_shard(" 2 / 4 ") == Shard(2, 4)


def test_the_flags_choose_the_shard_before_buildkites_variables() -> None:
    parallel = {"BUILDKITE_PARALLEL_JOB": "1", "BUILDKITE_PARALLEL_JOB_COUNT": "2"}
    assert choose_shard(None, False, parallel) == Shard(2, 2)
    assert choose_shard("3/4", False, parallel) == Shard(3, 4)
    assert choose_shard(None, True, parallel) is None  # --no-shard: every job here
    assert choose_shard(None, True, {"BUILDKITE_PARALLEL_JOB": "x", "BUILDKITE_PARALLEL_JOB_COUNT": "2"}) is None
    with pytest.raises(InputError, match="--shard, --no-shard: choose one"):
        choose_shard("1/2", True, {})


def test_shards_of_one_scenario_merge_into_one_result() -> None:
    whole = load_result(SAMPLE)
    first = replace(whole, variants=whole.variants[:1], scenario={**whole.scenario, "shard": "1/2"})
    second = replace(whole, variants=whole.variants[1:], scenario={**whole.scenario, "shard": "2/2"})
    [merged] = merge_shards([second, first])
    assert sorted(v.name for v in merged.variants) == sorted(v.name for v in whole.variants)
    assert merged.verdict == whole.verdict and merged.scenario["shards"] == ["2/2", "1/2"]
    assert len(merge_shards([whole, whole])) == 2  # the same run twice is not a split: kept apart
    other = replace(first, scenario={**first.scenario, "sha256": "0" * 64})
    assert len(merge_shards([other, second])) == 2  # another scenario file: kept apart


def test_merged_shards_name_every_run_folder_they_came_from() -> None:
    whole = load_result(SAMPLE)
    first = replace(
        whole, variants=whole.variants[:1], scenario={**whole.scenario, "run": "20261130-021700-x-shard-1of2"}
    )
    second = replace(
        whole, variants=whole.variants[1:], scenario={**whole.scenario, "run": "20261130-021702-x-shard-2of2"}
    )
    [merged] = merge_shards([first, second])
    assert merged.scenario["run"] == "20261130-021700-x-shard-1of2 + 20261130-021702-x-shard-2of2"
    [unfiled] = merge_shards([whole])
    assert "run" not in unfiled.scenario


def test_buildkites_parallel_job_variables_name_the_shard() -> None:
    from specwake.run.session.shards import shard_from_env

    assert shard_from_env({"BUILDKITE_PARALLEL_JOB": "0", "BUILDKITE_PARALLEL_JOB_COUNT": "4"}) == Shard(1, 4)
    assert shard_from_env({"BUILDKITE_PARALLEL_JOB": "3", "BUILDKITE_PARALLEL_JOB_COUNT": "4"}) == Shard(4, 4)
    assert shard_from_env({"BUILDKITE_PARALLEL_JOB": "0"}) is None  # not a parallel step
    assert shard_from_env({}) is None
    for job, count in (("4", "4"), ("-1", "4"), ("1", "x")):
        with pytest.raises(InputError, match="BUILDKITE_PARALLEL_JOB"):
            shard_from_env({"BUILDKITE_PARALLEL_JOB": job, "BUILDKITE_PARALLEL_JOB_COUNT": count})
