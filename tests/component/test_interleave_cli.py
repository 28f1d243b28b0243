"""Run modes through the real CLI on the fake CPU engine: `--interleave` (both servers up, phases alternated
baseline/patched), the CPU default — "parallel" (both servers up, each at its own pace, measuring at once) where no
speed call binds, "overlapped" (the same, measurements taking turns) where one does — and `--sequential` (one server
at a time).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from specwake.run.session.runner import ASKED, MEASURING
from specwake.runfolder import load_result
from tests.helpers.fakeengine import kill_survivors, make_fake_engine, one_run_dir, run_cli, scenario_text
from tests.helpers.procs import leftover_processes

BOTH = {"baseline": "collapse", "patched": "recover"}
CYCLES = 2
# Packed runs (the CPU default) name the scenario too: "s/baseline: stage fresh".
PHASE_EVENT = re.compile(r"\] (?:\S+/)?(baseline|patched): (stage fresh|L\d cycle #\d+)$")


def phases(stderr: str) -> list[tuple[str, str]]:
    """(variant, phase) in the order specwake started them, from its progress lines."""
    found = []
    for line in stderr.splitlines():
        match = PHASE_EVENT.search(line.rstrip())
        if match:
            found.append((match.group(1), match.group(2)))
    return found


MODES = {"interleave": ["--interleave"], "parallel": [], "overlapped": [], "sequential": ["--sequential"]}
BINDING = "min_speedup_recovery = 0.5\n"  # a speed call that counts: measurements must take turns


@pytest.mark.parametrize("mode", list(MODES))
def test_run_modes_start_servers_and_order_phases_as_named(tmp_path: Path, mode: str) -> None:
    engine = make_fake_engine(tmp_path)
    slow = {"FAKE_VLLM_ARGS": "--step-delay 0.02"}
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        scenario_text(
            engine,
            variants={"baseline": slow, "patched": slow},
            expect=BOTH,
            patch=str(engine.write_fix(tmp_path)),
            cycles=CYCLES,
            extra=BINDING if mode == "overlapped" else "",
        )
    )
    out = tmp_path / "out"
    proc = run_cli(["run", str(scenario), "--output", str(out), *MODES[mode]], tmp_path / "cache")
    assert kill_survivors(engine) == [], "a server outlived specwake"
    assert proc.returncode == 0, proc.stderr

    spans = {span.key.split("/")[-1]: span for span in engine.servers()}
    assert sorted(spans) == ["baseline", "patched"]
    assert all(span.how == "SIGTERM" for span in spans.values())
    assert leftover_processes(span.pid for span in spans.values()) == []
    both_up = spans["baseline"].overlaps(spans["patched"])
    assert both_up is (mode != "sequential")
    everywhere = tuple(sorted(os.sched_getaffinity(0)))
    if mode in ("overlapped", "parallel") and len(everywhere) > 1:  # each server confined to a core of its own
        assert all(len(span.cpus) == 1 for span in spans.values()), spans
        assert spans["baseline"].cpus != spans["patched"].cpus
    else:
        assert all(span.cpus == everywhere for span in spans.values()), spans

    each = ["stage fresh"] + [f"L2 cycle #{k}" for k in range(1, CYCLES + 1)]
    started = phases(proc.stderr)
    if mode == "interleave":
        assert started == [(v, p) for p in each for v in ("baseline", "patched")]
    elif mode == "sequential":
        assert started == [(v, p) for v in ("baseline", "patched") for p in each]
    else:  # each variant keeps its own order; how the two interleave is up to their pace
        for name in ("baseline", "patched"):
            assert [p for v, p in started if v == name] == each
    if mode in ("overlapped", "parallel"):
        assert ("measuring one at a time" in proc.stderr) is (mode == "overlapped")
        assert ("measuring at once" in proc.stderr) is (mode == "parallel")
    said = {"interleave": ASKED["interleaved"], "sequential": ASKED["sequential"]}.get(mode) or MEASURING[mode]
    assert [line for line in proc.stderr.splitlines() if line.endswith("] " + said)], proc.stderr  # its mode line

    path = one_run_dir(out) / "result.json"
    load_result(path)
    result: dict[str, Any] = json.loads(path.read_text())
    assert result["scenario"]["mode"] == {"interleave": "interleaved"}.get(mode, mode)
    if mode == "sequential":  # a variant's seconds end when its server stops, not when the run ends
        base, patched = spans["baseline"], spans["patched"]
        assert patched.end is not None
        seconds = {v["name"]: v["seconds"] for v in result["variants"]}
        assert seconds["baseline"] < (patched.end - base.start) - 0.5 * (patched.end - patched.start), seconds
    assert result["verdict"] == "pass" and result["complete"] is True
    stages = {v["name"]: [s["name"] for s in v["stages"]] for v in result["variants"]}
    names = ["fresh"] + [f"after L2 #{k}" for k in range(1, CYCLES + 1)]
    assert stages == {"baseline": names, "patched": names}
    assert {v["name"]: v["outcome"] for v in result["variants"]} == BOTH


def test_interleave_keeps_measuring_the_other_variant_after_a_crash(tmp_path: Path) -> None:
    engine = make_fake_engine(tmp_path)
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        scenario_text(
            engine,
            variants={"baseline": {"FAKE_VLLM_MODE": "crash-on-reload"}, "patched": {}},
            expect={"baseline": "crash", "patched": "recover"},
            patch=str(engine.write_fix(tmp_path)),
            cycles=CYCLES,
        )
    )
    out = tmp_path / "out"
    proc = run_cli(["run", str(scenario), "--output", str(out), "--interleave"], tmp_path / "cache")
    assert kill_survivors(engine) == [], "a server outlived specwake"
    assert proc.returncode == 0, proc.stderr
    result = json.loads((one_run_dir(out) / "result.json").read_text())
    variants = {v["name"]: v for v in result["variants"]}
    assert variants["baseline"]["outcome"] == "crash"
    assert [s["name"] for s in variants["baseline"]["stages"]] == ["fresh"]
    assert variants["patched"]["outcome"] == "recover"
    assert [s["name"] for s in variants["patched"]["stages"]] == ["fresh", "after L2 #1", "after L2 #2"]
    # After the crash only the patched variant's phases follow.
    assert phases(proc.stderr)[3:] == [("patched", "L2 cycle #1"), ("patched", "L2 cycle #2")]


def test_step_summary_and_junit_are_written(tmp_path: Path) -> None:
    """In GitHub Actions (GITHUB_STEP_SUMMARY set) the report is appended there; --junit writes parseable XML."""
    import xml.etree.ElementTree as ET

    engine = make_fake_engine(tmp_path)
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine, variants={"baseline": {}, "patched": {}}, expect=BOTH,
                                      patch=str(engine.write_fix(tmp_path))))  # fmt: skip
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    junit = tmp_path / "junit" / "specwake.xml"
    out = tmp_path / "out"
    proc = run_cli(["run", str(scenario), "--output", str(out), "--junit", str(junit)], tmp_path / "cache",
                   GITHUB_STEP_SUMMARY=str(summary))  # fmt: skip
    assert kill_survivors(engine) == []
    assert proc.returncode == 0, proc.stderr
    text = summary.read_text()
    assert text.startswith("earlier step\n") and (one_run_dir(out) / "report.md").read_text() in text
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
