"""GPU packing through the real `specwake run` / `specwake check` CLI on a fake CUDA engine
(tests/helpers/fakeengine.py): disjoint CUDA_VISIBLE_DEVICES for servers up at once, per-scenario folders, crashes,
Ctrl-C, bad --gpus and TP.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from specwake.report.markdown import for_terminal
from specwake.run.session.schedule import Job, plan_schedule
from specwake.runfolder import load_result
from tests.helpers.fakeengine import (
    REPO,
    FakeEngine,
    ServerSpan,
    cli_env,
    kill_survivors,
    make_fake_engine,
    one_run_dir,
    run_cli,
    scenario_text,
)
from tests.helpers.procs import leftover_processes

CUDA = {"FAKE_VLLM_PLATFORM": "cuda", "FAKE_VLLM_GPUS": "4"}
TP = {"a": 2, "b": 2, "c": 1}  # scenario name → tensor_parallel_size
SLOW = "--step-delay 0.02"  # 80 ms per fresh completion, 320 ms after a collapse: servers surely overlap
BOTH = {"baseline": "collapse", "patched": "recover"}
VARIANT_FILES = ("result.json", "report.md", "stages.csv", "logs/baseline.log", "logs/patched.log")


def write_scenarios(
    engine: FakeEngine,
    tmp: Path,
    *,
    env: dict[str, dict[str, str]] | None = None,
    expect: dict[str, dict[str, str]] | None = None,
) -> list[Path]:
    """Scenarios a, b, c (TP 2, 2, 1), baseline + patched each. `env`/`expect`: per "<scenario>/<variant>"."""
    diff = engine.write_fix(tmp)
    paths = []
    for name, tp in TP.items():
        variants = {v: {"FAKE_VLLM_ARGS": SLOW, **(env or {}).get(f"{name}/{v}", {})} for v in BOTH}
        text = scenario_text(
            engine,
            name=name,
            tensor_parallel_size=tp,
            variants=variants,
            expect=(expect or {}).get(name, BOTH),
            patch=str(diff),
        )
        path = tmp / f"{name}.toml"
        path.write_text(text)
        paths.append(path)
    return paths


@dataclass(frozen=True)
class Run:
    proc: subprocess.CompletedProcess[str]
    root: Path  # the run folder
    spans: list[ServerSpan]  # every fake server's life
    leftovers: list[tuple[int, str]]  # processes of the fake engine still alive after specwake exited

    def result(self, scenario: str) -> dict[str, Any]:
        path = self.root / scenario / "result.json"
        load_result(path)  # valid for specwake's own loader
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def variant(self, key: str) -> dict[str, Any]:
        scenario, name = key.split("/")
        return next(v for v in self.result(scenario)["variants"] if v["name"] == name)


def packed_run(engine: FakeEngine, tmp: Path, paths: list[Path], *flags: str) -> Run:
    out = tmp / "out"
    proc = run_cli(["run", *map(str, paths), "--output", str(out), *flags], tmp / "cache", timeout=120, **CUDA)
    leftovers = kill_survivors(engine)
    return Run(proc, one_run_dir(out), engine.servers(), leftovers)


# -- one packed run of three scenarios, inspected by several tests -------------------------------------


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("packed")
    engine = make_fake_engine(tmp)
    expect = {"c": {"baseline": "recover", "patched": "recover"}}  # c's baseline collapses: verdict fail
    paths = write_scenarios(engine, tmp, expect=expect)
    return packed_run(engine, tmp, paths, "--gpus", "0-3")


def test_packed_run_leaves_no_server_running(packed: Run) -> None:
    assert packed.leftovers == []
    assert leftover_processes(span.pid for span in packed.spans) == []  # each server led its own group


def test_every_server_gets_as_many_gpus_as_its_tp(packed: Run) -> None:
    assert sorted(span.key for span in packed.spans) == sorted(f"{s}/{v}" for s in TP for v in BOTH)
    for span in packed.spans:
        assert span.gpus is not None, f"{span.key}: no CUDA_VISIBLE_DEVICES"
        assert len(span.gpus) == TP[span.key.split("/")[0]], span
        assert set(span.gpus) <= {0, 1, 2, 3}, span
        assert tuple(packed.variant(span.key)["info"]["gpus"]) == span.gpus  # the result says where it ran


def test_servers_up_at_once_never_share_a_gpu(packed: Run) -> None:
    assert all(span.end is not None and span.how == "SIGTERM" for span in packed.spans)  # all stopped by specwake
    together = [(x, y) for x, y in combinations(packed.spans, 2) if x.overlaps(y)]
    assert together, "no two servers ever ran at the same time: nothing was packed"
    for x, y in together:
        assert not set(x.gpus or ()) & set(y.gpus or ()), f"{x.key} and {y.key} shared GPUs while both ran"


def test_run_folder_has_one_folder_per_scenario_and_a_combined_report(packed: Run) -> None:
    assert packed.proc.returncode == 1, packed.proc.stderr  # c failed its expectation; a and b passed
    assert packed.root.name.endswith("-3-scenarios")
    folders = {p.name for p in packed.root.iterdir() if p.is_dir()}
    assert folders == set(TP)  # one folder per scenario, nothing else (no stray logs/ at the top)
    for scenario in TP:
        for name in VARIANT_FILES:
            assert (packed.root / scenario / name).is_file(), f"{scenario}/{name}"
        result = packed.result(scenario)
        assert result["complete"] is True and result["scenario"]["mode"] == "packed"
        assert [s["name"] for v in result["variants"] for s in v["stages"]] == ["fresh", "after L2 #1"] * 2
    report = (packed.root / "report.md").read_text()
    assert all(re.search(rf"\b{name}\b", report) for name in TP), report
    assert for_terminal(report) in packed.proc.stdout  # printed as plain text, for a CI log


def test_exit_code_and_verdicts_follow_each_scenario(packed: Run) -> None:
    verdicts = {s: packed.result(s)["verdict"] for s in TP}
    assert verdicts == {"a": "pass", "b": "pass", "c": "fail"}
    assert packed.variant("c/baseline")["outcome"] == "collapse"
    assert packed.proc.returncode == 1


# -- faults ------------------------------------------------------------------------------------------------


def test_one_server_crashing_leaves_the_others_measured(engine: FakeEngine, tmp_path: Path) -> None:
    env = {"b/baseline": {"FAKE_VLLM_MODE": "crash-on-reload"}}
    expect = {"b": {"baseline": "crash", "patched": "recover"}}
    run = packed_run(engine, tmp_path, write_scenarios(engine, tmp_path, env=env, expect=expect), "--gpus", "0-3")
    assert run.proc.returncode == 0, run.proc.stderr  # the crash was expected, everything else passed
    assert run.leftovers == []
    crashed = run.variant("b/baseline")
    assert crashed["outcome"] == "crash" and [s["name"] for s in crashed["stages"]] == ["fresh"]
    assert "illegal memory access" in crashed["log_excerpt"]
    for key in ("a/baseline", "a/patched", "b/patched", "c/baseline", "c/patched"):
        other = run.variant(key)
        assert other["outcome"] == BOTH[key.split("/")[1]], key
        assert [s["name"] for s in other["stages"]] == ["fresh", "after L2 #1"], key
    assert len(run.spans) == 6  # every server was started, including those after the crash


@dataclass(frozen=True)
class Interrupted:
    returncode: int
    stderr: str
    first_wave: list[str]  # the servers measuring when SIGINT was sent
    spans: list[ServerSpan]
    leftovers: list[tuple[int, str]]
    root: Path


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Interrupted:
    """A packed run sent SIGINT (Ctrl-C) once its first two servers are measuring their fresh stage."""
    tmp = tmp_path_factory.mktemp("interrupted")
    engine = make_fake_engine(tmp)
    paths = write_scenarios(engine, tmp)
    out = tmp / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwake.cli", "run", *map(str, paths), "--gpus", "0-3", "--output", str(out)],
        cwd=REPO,
        env=cli_env(tmp / "cache", **CUDA),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first_wave = _wait_for_measuring(proc, count=2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    leftovers = kill_survivors(engine)
    return Interrupted(proc.returncode, err, first_wave, engine.servers(), leftovers, one_run_dir(out))


def test_ctrl_c_during_packed_run_stops_every_server_and_exits_130(interrupted: Interrupted) -> None:
    assert interrupted.returncode == 130, interrupted.stderr
    assert "interrupted" in interrupted.stderr
    assert interrupted.leftovers == []
    assert leftover_processes(span.pid for span in interrupted.spans) == []
    assert sorted(span.key for span in interrupted.spans) == sorted(interrupted.first_wave)  # no new server after
    assert all(span.how == "SIGTERM" for span in interrupted.spans)  # stopped by specwake, not abandoned


def test_ctrl_c_keeps_a_valid_partial_result_per_scenario(interrupted: Interrupted) -> None:
    started = {key.split("/")[0] for key in interrupted.first_wave}
    for scenario in TP:
        path = interrupted.root / scenario / "result.json"
        result = load_result(path)  # valid for specwake's own loader
        assert result.complete is False and json.loads(path.read_text())["complete"] is False, scenario
        names = sorted(v.name for v in result.variants)
        assert names == sorted(BOTH), (scenario, names)  # every planned variant, those never started too
        if scenario not in started:
            assert all(v.not_run for v in result.variants), scenario


def test_ctrl_c_leaves_the_interrupted_variants_incomplete(interrupted: Interrupted) -> None:
    for key in interrupted.first_wave:
        scenario, name = key.split("/")
        result = load_result(interrupted.root / scenario / "result.json")
        variant = next(v for v in result.variants if v.name == name)
        assert variant.outcome == "incomplete" and variant.crash_class is None, (key, variant.outcome, variant.error)


def _wait_for_measuring(proc: subprocess.Popen[str], count: int) -> list[str]:
    """Read specwake's progress lines until `count` servers are measuring their fresh stage; their keys."""
    assert proc.stderr is not None
    measuring: list[str] = []
    for line in proc.stderr:
        match = re.search(r"\] (\S+/\S+): stage fresh$", line.rstrip())
        if match:
            measuring.append(match.group(1))
            if len(measuring) == count:
                return measuring
    raise AssertionError(f"specwake ended (code {proc.wait()}) before {count} servers were measuring")


# -- refused before anything starts --------------------------------------------------------------------


def test_tp_larger_than_the_gpus_exits_3_naming_both_numbers(engine: FakeEngine, tmp_path: Path) -> None:
    paths = write_scenarios(engine, tmp_path)
    out = tmp_path / "out"
    args = ["run", *map(str, paths), "--tp", "8", "--gpus", "0-3", "--output", str(out)]
    proc = run_cli(args, tmp_path / "cache", 120, **CUDA)
    assert proc.returncode == 3, proc.stderr
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error:"))
    assert re.search(r"\b8\b", error) and re.search(r"\b4\b", error), error
    assert engine.launched() == [] and engine.servers() == []
    assert not out.exists() or [p for p in out.iterdir() if p.is_dir()] == []


def test_gpus_beyond_the_visible_ones_exit_2_before_any_launch(engine: FakeEngine, tmp_path: Path) -> None:
    paths = write_scenarios(engine, tmp_path)
    out = tmp_path / "out"
    proc = run_cli(["run", *map(str, paths), "--gpus", "0-5", "--output", str(out)], tmp_path / "cache", 120, **CUDA)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    error = [line for line in lines if line.startswith("error:")]
    assert len(error) == 1 and "--gpus: GPU 4 is not visible" in error[0] and "4 visible" in error[0], lines
    assert engine.launched() == [] and engine.servers() == []
    assert not out.exists() or [p for p in out.iterdir() if p.is_dir()] == []


@pytest.mark.parametrize(("gpus", "reason"), [("3-1", "reversed range"), ("a", "not a GPU id"), ("0,0", "twice")])
@pytest.mark.parametrize("command", ["run", "check"])
def test_bad_gpu_list_exits_2_with_one_line(
    engine: FakeEngine, tmp_path: Path, command: str, gpus: str, reason: str
) -> None:
    paths = write_scenarios(engine, tmp_path)
    extra = ["--output", str(tmp_path / "out")] if command == "run" else []
    proc = run_cli([command, *map(str, paths), f"--gpus={gpus}", *extra], tmp_path / "cache", 120, **CUDA)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --gpus:") and reason in lines[0], lines
    assert engine.invocations() == []  # refused before even the interpreter probe


# -- check shows the packing -------------------------------------------------------------------------------


def check_assignments(stdout: str) -> dict[str, tuple[int, ...]]:
    """`<scenario>/<variant>` → the GPUs `specwake check` printed for it."""
    found: dict[str, tuple[int, ...]] = {}
    scenario = variant = ""
    for line in stdout.splitlines():
        if line and not line[0].isspace():
            scenario = line.split()[0]
        elif line.startswith("  variant "):
            variant = line.split()[1]
        elif line.startswith("    gpus: "):
            text = line.removeprefix("    gpus: ")
            found[f"{scenario}/{variant}"] = tuple(int(g) for g in text.split(",")) if text[0].isdigit() else ()
    return found


@pytest.mark.parametrize(("flags", "gpus", "visible"), [(["--gpus", "0-3"], (0, 1, 2, 3), "4"), ([], (0, 1), "2")])
def test_check_prints_the_packing_plan(
    engine: FakeEngine, tmp_path: Path, flags: list[str], gpus: tuple[int, ...], visible: str
) -> None:
    paths = write_scenarios(engine, tmp_path)
    env = {**CUDA, "FAKE_VLLM_GPUS": visible}  # without --gpus: every GPU the engine sees
    proc = run_cli(["check", *map(str, paths), *flags], tmp_path / "cache", 120, **env)
    assert proc.returncode == 0, proc.stderr
    shown = check_assignments(proc.stdout)
    plan = plan_schedule([Job(f"{s}/{v}", tp) for s, tp in TP.items() for v in BOTH], gpus)
    assert shown == {a.job.key: a.gpus for a in plan}
    for key, got in shown.items():
        assert len(got) == TP[key.split("/")[0]] and set(got) <= set(gpus), (key, got)
    for x, y in combinations(plan, 2):
        if x.start < y.end and y.start < x.end:  # planned to run together
            assert not set(shown[x.job.key]) & set(shown[y.job.key]), (x.job.key, y.job.key)
    assert engine.launched() == []


def test_a_sliced_cuda_visible_devices_is_honoured(engine: FakeEngine, tmp_path: Path) -> None:
    """Under Slurm or a CI runner the parent sees only GPUs 4-7: visible index i must become the parent's i-th
    entry, never physical GPU i (someone else's)."""
    paths = write_scenarios(engine, tmp_path)
    out = tmp_path / "out"
    env = {**CUDA, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    proc = run_cli(["run", *map(str, paths), "--output", str(out), "--gpus", "0-3"], tmp_path / "cache", 120, **env)
    assert kill_survivors(engine) == []
    assert proc.returncode == 0, proc.stderr
    spans = engine.servers()
    assert spans and all(span.gpus and set(span.gpus) <= {4, 5, 6, 7} for span in spans), spans
    root = one_run_dir(out)
    for span in spans:
        scenario, name = span.key.split("/")
        info = next(
            v for v in json.loads((root / scenario / "result.json").read_text())["variants"] if v["name"] == name
        )["info"]
        assert [4 + g for g in info["gpus"]] == list(span.gpus)  # the result keeps the visible indices ...
        assert info["devices"] == ",".join(map(str, span.gpus))  # ... and what the server was given
    assert "CUDA_VISIBLE_DEVICES=" in (root / "report.md").read_text()
