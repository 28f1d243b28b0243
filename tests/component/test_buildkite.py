"""The nightly Buildkite pipeline (examples/nightly-gpu.buildkite.yml) next to the GitHub workflow: valid against
Buildkite's pipeline schema (check-jsonschema's copy, offline); its shards take K/N from Buildkite's parallel job
variables through `specwake run` itself, while its canary runs every variant on each; and its merge step, run here
as the agent runs it (with stand-ins for `buildkite-agent` and the virtualenv), fails the build on a regression or a
failed shard and passes a night like the last."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from specwake.prepare.scenario import load_scenario
from specwake.report import run_files
from specwake.results import ScenarioResult
from specwake.runfolder import write_files
from tests.helpers.builders import dropped, scaled, tiny_cpu
from tests.helpers.fakeengine import FakeEngine, cli_env, one_run_dir, result_of, run_cli, scenario_text
from tests.helpers.paths import REPO
from tests.helpers.procs import check_schema
from tests.helpers.weekly import assert_one_per_family, assert_runs_the_choice, chosen_by, unescaped

PIPELINE = REPO / "examples" / "nightly-gpu.buildkite.yml"


def pipeline() -> dict[str, Any]:
    return dict(yaml.safe_load(PIPELINE.read_text()))


def step(key: str) -> dict[str, Any]:
    return next(s for s in pipeline()["steps"] if isinstance(s, dict) and s.get("key") == key)


def test_the_pipeline_is_valid_against_buildkites_schema() -> None:
    proc = check_schema(PIPELINE, "vendor.buildkite")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_shards_take_their_share_from_buildkite_and_the_merge_waits_for_every_one() -> None:
    shard = step("shard")
    assert shard["parallelism"] >= 2 and "--shard" not in shard["command"]  # specwake reads the variables
    steps = pipeline()["steps"]
    wait = steps[steps.index(shard) + 1]
    assert "wait" in wait and wait["continue_on_failure"] is True


def test_a_parallel_job_runs_its_share_without_a_shard_flag(engine: FakeEngine, tmp_path: Path) -> None:
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.toml"
        path.write_text(scenario_text(engine, name=name, expect={"baseline": "collapse"}))
        paths.append(str(path))
    out = tmp_path / "out"
    proc = run_cli(["run", *paths, "--output", str(out)], tmp_path / "cache", 120,
                   BUILDKITE_PARALLEL_JOB="1", BUILDKITE_PARALLEL_JOB_COUNT="2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "shard 2/2, from Buildkite's" in proc.stderr
    assert one_run_dir(out).name.endswith("-shard-2of2") and len(engine.launched()) == 1


@pytest.mark.parametrize("job", ["0", "1"])
def test_the_canary_runs_every_variant_on_every_parallel_job(engine: FakeEngine, tmp_path: Path, job: str) -> None:
    """The shard step's canary line, run as copy `job` of the `parallelism: 2` step runs it, on a stand-in for
    scenarios/tiny-gpu.toml with the same variants on the fake GPU engine: every variant runs, `patched` included."""
    [line] = [ln for ln in step("shard")["command"].splitlines() if "specwake run scenarios/tiny-gpu.toml" in ln]
    variants = [v.name for v in load_scenario(REPO / "scenarios" / "tiny-gpu.toml").variants]
    assert "patched" in variants
    work = tmp_path / "work"
    (work / "scenarios").mkdir(parents=True)
    fix, expect = engine.write_fix(tmp_path), {"baseline": "collapse", "patched": "recover"}
    canary = scenario_text(engine, name="tiny-gpu", variants={v: {} for v in variants}, patch=str(fix), expect=expect)
    (work / "scenarios" / "tiny-gpu.toml").write_text(canary)
    venv = work / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "specwake").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m specwake.cli "$@"\n')
    (venv / "specwake").chmod(0o755)
    env = cli_env(tmp_path / "cache", BUILDKITE_PARALLEL_JOB=job, BUILDKITE_PARALLEL_JOB_COUNT="2",
                  FAKE_VLLM_PLATFORM="cuda", FAKE_VLLM_GPUS="1", PYTHONPATH=str(REPO))  # fmt: skip
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", line.replace("$$", "$")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shard" not in one_run_dir(work / "results" / "canary").name and "from Buildkite" not in proc.stderr
    result = result_of(work / "results" / "canary")
    assert [v["name"] for v in result["variants"]] == variants and "shard" not in result["scenario"]
    assert len(engine.launched()) == len(variants)


@pytest.mark.parametrize(("job", "count", "named"), [("x", "2", "BUILDKITE_PARALLEL_JOB"), ("2", "2", "BUILDKITE")])
def test_bad_parallel_job_variables_are_bad_input(tmp_path: Path, job: str, count: str, named: str) -> None:
    proc = run_cli(["run", str(REPO / "scenarios" / "tiny-cpu.toml"), "--output", str(tmp_path / "out")],
                   tmp_path / "cache", 60, BUILDKITE_PARALLEL_JOB=job, BUILDKITE_PARALLEL_JOB_COUNT=count)  # fmt: skip
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def merge(
    tmp_path: Path, nights: list[ScenarioResult], tonight: ScenarioResult, shards: str
) -> subprocess.CompletedProcess[str]:
    """The merge step's command as the agent runs it (`$$` is Buildkite's escape for `$`), in a workspace where
    `buildkite-agent` downloads tonight's results and says the shard step's outcome, `python3 -m venv` and pip are
    this checkout's specwake, and the kept nights sit where the agent keeps them."""
    keep = tmp_path / "var"
    for day, night in enumerate(nights, start=1):
        dated = replace(night, started_at=f"2026-11-{day:02d}T02:17:00+00:00")  # the night its folder is named after
        write_files(keep / "nights" / f"202611{day:02d}" / f"202611{day:02d}-021700-{night.name}", run_files(dated))
    tonight_dir = tmp_path / "tonight" / "results" / "nightly" / f"20261201-021700-shard-1of1-{tonight.name}"
    write_files(tonight_dir, run_files(replace(tonight, started_at="2026-12-01T02:17:00+00:00")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "buildkite-agent"
    agent.write_text(
        "#!/bin/sh\n"
        f'case "$1 $2" in\n'
        f'  "artifact download") mkdir -p "$4" && cp -r {tmp_path / "tonight"}/results "$4" ;;\n'
        f'  "step get") echo {shards} ;;\n'
        "  *) cat > /dev/null ;;\n"
        "esac\n"
    )
    python3 = bin_dir / "python3"  # `python3 -m venv .venv` makes a .venv whose specwake is this checkout's
    python3.write_text(
        "#!/bin/sh\nmkdir -p .venv/bin\n"
        "printf '#!/bin/sh\\nexit 0\\n' > .venv/bin/pip\n"
        f"printf '#!/bin/sh\\nexec {sys.executable} -m specwake.cli \"$@\"\\n' > .venv/bin/specwake\n"
        "chmod +x .venv/bin/pip .venv/bin/specwake\n"
    )
    for script in (agent, python3):
        script.chmod(0o755)
    command = step("merge")["command"].replace("$$", "$").replace("/var/lib/specwake-nightly", str(keep))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=120)


def test_the_merge_fails_the_build_on_a_regression(tmp_path: Path) -> None:
    proc = merge(tmp_path, [tiny_cpu()], dropped(tiny_cpu()), "passed")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "regression" in proc.stdout
    assert (tmp_path / "var" / "nights" / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d")).is_dir()  # kept anyway


def test_the_merge_calls_tok_s_against_every_kept_night(tmp_path: Path) -> None:
    nights = [scaled(tiny_cpu(), f) for f in (1.0, 0.98, 1.02, 1.01)]
    proc = merge(tmp_path, nights, scaled(tiny_cpu(), 0.5), "passed")
    assert proc.returncode == 1 and "4 earlier runs" in proc.stdout, proc.stdout + proc.stderr


def test_the_merge_annotates_the_trend_and_uploads_its_chart(tmp_path: Path) -> None:
    proc = merge(tmp_path, [scaled(tiny_cpu(), f) for f in (1.0, 0.98, 1.02)], scaled(tiny_cpu(), 1.01), "passed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "### Trend over 4 nights" in proc.stdout
    chart = tmp_path / "work" / "results" / "trend.png"
    assert chart.read_bytes().startswith(b"\x89PNG") and "results/trend.png" in step("merge")["artifact_paths"]
    assert "\033]1338;url=artifact://results/trend.png;" in proc.stdout  # the chart inline in the log


def test_the_merge_passes_a_night_like_the_last_and_keeps_seven(tmp_path: Path) -> None:
    proc = merge(tmp_path, [tiny_cpu()] * 8, tiny_cpu(), "passed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = sorted(p.name for p in (tmp_path / "var" / "nights").iterdir())
    assert len(kept) == 7 and kept[-1] == dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d")


def test_the_first_night_has_nothing_to_compare_and_passes(tmp_path: Path) -> None:
    proc = merge(tmp_path, [], tiny_cpu(), "passed")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_merge_fails_the_build_when_a_shard_failed(tmp_path: Path) -> None:
    proc = merge(tmp_path, [tiny_cpu()], tiny_cpu(), "hard_failed")
    assert proc.returncode == 1 and "a shard failed (hard_failed)" in proc.stderr, proc.stdout + proc.stderr


def test_a_weekly_build_runs_the_release_checks_and_the_families_on_the_newest_vllm_and_nothing_else() -> None:
    steps = pipeline()["steps"]
    weekly = 'build.env("SPECWAKE_LATEST_VLLM") == "1"'
    (latest,) = [s for s in steps if s.get("if") == weekly]
    assert all(s.get("if") == weekly.replace("==", "!=") for s in steps if s is not latest)
    command = latest["command"]
    assert "pip install --upgrade vllm" in command and "[gpu]" not in command
    assert_runs_the_choice(unescaped(command), ".venv/bin/specwake run")


@pytest.mark.parametrize("gpus", ["the step's", 2, 1])
def test_the_weekly_build_runs_one_scenario_per_family_that_its_gpus_hold(gpus: int | str) -> None:
    """The step's own selection line, as the agent's shell gets it, on the agent's GPUS and on smaller machines:
    every drafter family with a GPU scenario that fits runs once; DeepSeek-V3's eight engines only where there are 8."""
    latest = step("latest-vllm")
    assert latest["env"]["GPUS"] == 8 and latest["agents"]["queue"] == "gpu-8x"
    count = latest["env"]["GPUS"] if gpus == "the step's" else int(gpus)
    chosen = chosen_by(unescaped(latest["command"]), count)
    assert_one_per_family(chosen, count)
    assert "scenarios/tiny-gpu.toml" in chosen
    assert ("scenarios/deepseek-v3-dp-ep.toml" in chosen) == (count == 8), chosen
