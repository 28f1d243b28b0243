"""Packed GPU servers take turns for the stages whose tok/s decides, through the real `specwake run` on a fake CUDA
engine: read from the fake servers' own logs, no such stage overlaps another server's start, cycle, measurement or
stop, and the result and report say which stages measured alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.fakeengine import (
    FakeEngine,
    ServerSpan,
    kill_survivors,
    make_fake_engine,
    one_run_dir,
    run_cli,
    scenario_text,
)

CUDA = {"FAKE_VLLM_PLATFORM": "cuda", "FAKE_VLLM_GPUS": "4"}
# Four TP-1 servers on four GPUs, all launched at once; later ones take longer to start, so the first ones are
# ready to measure while their neighbours still start (as a neighbour compiling or capturing CUDA graphs would).
STARTUP_S = {"a/baseline": 0.0, "a/patched": 1.0, "b/baseline": 2.0, "b/patched": 3.0}
EXPECT = {"baseline": "collapse", "patched": "recover"}
READY = re.compile(r"Starting vLLM API server on \S+ t=([0-9.]+)")
POST = re.compile(r"INFO: POST (\S+) from t=([0-9.]+) to t=([0-9.]+)")
COMPLETIONS = "/v1/completions"
# A fake server logs a request's end just after writing its answer, so specwake may already have read the answer and
# let the next server go: ends may be late by this much on a loaded machine (the clashes without turns last seconds).
SLACK_S = 0.05

Span = tuple[float, float]


@dataclass(frozen=True)
class Timeline:
    """One fake server's life as its log and the fake engine's lifecycle records show it (wall-clock seconds)."""

    key: str
    start: Span  # launched → listening
    stages: list[Span]  # each run of consecutive completions: one measured stage
    other: list[tuple[str, Span]]  # every other request it served: cycles, diagnostics, the start's checks
    stop: float  # SIGTERM'd


def timeline(span: ServerSpan) -> Timeline:
    assert span.log is not None and span.end is not None, span
    text = span.log.read_text()
    ready = READY.search(text)
    assert ready is not None, f"{span.key}: no ready line in its log"
    stages: list[Span] = []
    other: list[tuple[str, Span]] = []
    previous = ""
    for path, begin, end in POST.findall(text):
        window = (float(begin), float(end))
        if path != COMPLETIONS:
            other.append((path, window))
        elif previous == COMPLETIONS:
            stages[-1] = (stages[-1][0], window[1])
        else:
            stages.append(window)
        previous = path
    return Timeline(span.key, (span.start, float(ready.group(1))), stages, other, span.end)


def overlaps(x: Span, y: Span) -> bool:
    """Whether two spans share more than SLACK_S (a point span: whether it lies inside the other)."""
    return x[0] < y[1] - SLACK_S and y[0] < x[1] - SLACK_S


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Timeline], str]:
    tmp = tmp_path_factory.mktemp("gpu-turns")
    engine: FakeEngine = make_fake_engine(tmp)
    diff = engine.write_fix(tmp)
    paths = []
    for name in ("a", "b"):
        variants = {
            v: {"FAKE_VLLM_ARGS": f"--step-delay 0.02 --startup-delay {STARTUP_S[f'{name}/{v}']}"} for v in EXPECT
        }
        path = tmp / f"{name}.toml"
        path.write_text(scenario_text(engine, name=name, variants=variants, expect=EXPECT, patch=str(diff), cycles=2))
        paths.append(path)
    out = tmp / "out"
    proc = run_cli(["run", *map(str, paths), "--gpus", "0-3", "--output", str(out)], tmp / "cache", 180, **CUDA)
    assert kill_survivors(engine) == []
    assert proc.returncode == 0, proc.stderr
    return one_run_dir(out), [timeline(span) for span in engine.servers()], proc.stderr


def test_the_servers_were_packed_and_started_while_others_were_up(
    packed: tuple[Path, list[Timeline], str],
) -> None:
    """Without this the next test would hold trivially: some server started while another was up and waiting."""
    _, lives, _ = packed
    assert sorted(life.key for life in lives) == sorted(STARTUP_S)
    started_beside = [
        (x.key, y.key) for x in lives for y in lives if x is not y and overlaps(x.start, (y.start[1], y.stop))
    ]
    assert started_beside, "no server started while another was up: nothing was packed"
    assert all(len(life.stages) == 3 for life in lives), [(life.key, life.stages) for life in lives]


def test_no_deciding_stage_overlaps_a_neighbours_start_cycle_measurement_or_stop(
    packed: tuple[Path, list[Timeline], str],
) -> None:
    _, lives, _ = packed
    clashes = []
    for life in lives:
        for stage in life.stages:
            for other in lives:
                if other is life:
                    continue
                busy = [("start", other.start), ("stop", (other.stop, other.stop))]
                busy += [("stage", s) for s in other.stages] + other.other
                clashes += [(life.key, stage, other.key, what, when) for what, when in busy if overlaps(stage, when)]
    assert clashes == [], clashes


def test_result_and_report_say_every_stage_measured_alone(packed: tuple[Path, list[Timeline], str]) -> None:
    root, _, stderr = packed
    assert "a stage whose tok/s decides measures alone" in stderr  # the run says how it measures
    for scenario in ("a", "b"):
        result = json.loads((root / scenario / "result.json").read_text())
        assert result["scenario"]["mode"] == "packed"
        for variant in result["variants"]:
            assert [s["measured_alone"] for s in variant["stages"]] == [True] * 3, variant["name"]
            assert variant["outcome"] == EXPECT[variant["name"]]
        report = (root / scenario / "report.md").read_text()
        assert report.count("tok/s of every stage measured alone") == 2, report


def test_check_says_deciding_stages_will_measure_alone(engine: FakeEngine, tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text(scenario_text(engine, name="a", variants={v: {} for v in EXPECT}, expect=EXPECT))
    proc = run_cli(["check", str(path), "--gpus", "0-3"], tmp_path / "cache", 120, **CUDA)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1] == (
        "run mode: packed — servers side by side on their own GPUs; a stage whose tok/s decides measures alone:"
        " no other server starts, cycles, measures or stops meanwhile"
    )
    assert engine.launched() == []
