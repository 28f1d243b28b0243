"""Labels that say what happened, through the real CLI on the fake engine: the run mode `check` names is the one `run`
would use (never a flag that was not given), servers that cannot run side by side are said and recorded to have run
one after the other, and `compare` lists as differing settings only those of variants both runs ran.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specwake.run.session.runner import MEASURING, ONE_SERVER
from tests.helpers.fakeengine import FakeEngine, one_run_dir, run_cli, run_text, scenario_text

BOTH = {"baseline": "collapse", "patched": "recover"}


def both_variants(engine: FakeEngine, tmp_path: Path) -> str:
    return scenario_text(engine, variants={"baseline": {}, "patched": {}}, expect=BOTH,
                         patch=str(engine.write_fix(tmp_path)))  # fmt: skip


def mode_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("run mode: "))


def test_check_names_the_mode_run_would_use_not_a_flag_it_was_not_given(engine: FakeEngine, tmp_path: Path) -> None:
    """A native discard cannot run on CPU: check says so (exit 3), and the run mode it prints is run's default, which
    a native discard's binding speed call makes `overlapped`, not the `--sequential` nobody asked for."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(both_variants(engine, tmp_path).replace("[cycle]\n", '[cycle]\ndiscard = "native"\n'))
    proc = run_cli(["check", str(scenario)], tmp_path / "cache")
    assert proc.returncode == 3, proc.stderr
    assert "NOT RUNNABLE HERE" in proc.stdout and "'native' needs vLLM sleep mode" in proc.stdout
    assert mode_line(proc.stdout) == f"run mode: overlapped — {MEASURING['overlapped']}"
    asked = run_cli(["check", str(scenario), "--sequential"], tmp_path / "cache")
    assert mode_line(asked.stdout) == "run mode: sequential — one server at a time (--sequential)"
    assert engine.launched() == []


def test_servers_too_big_to_fit_side_by_side_are_said_to_run_one_after_the_other(
    engine: FakeEngine, tmp_path: Path
) -> None:
    """With a rank on every core each server needs all of them: the CPU default then runs one server after the
    other, and check, the progress lines and the result's mode say so."""
    tp = str(len(os.sched_getaffinity(0)))
    text = both_variants(engine, tmp_path)
    scenario = tmp_path / "s.toml"
    scenario.write_text(text)
    check = run_cli(["check", str(scenario), "--tp", tp], tmp_path / "cache")
    assert check.returncode == 0, check.stderr
    assert mode_line(check.stdout) == f"run mode: sequential — {MEASURING['sequential']}"
    proc, out = run_text(engine, tmp_path, text, "--tp", tp)
    assert proc.returncode == 0, proc.stderr
    assert MEASURING["sequential"] in proc.stderr and "side by side" not in proc.stderr.replace(
        MEASURING["sequential"], ""
    )
    first, second = engine.servers()
    assert not first.overlaps(second)
    result = json.loads((one_run_dir(out) / "result.json").read_text())
    assert result["scenario"]["mode"] == "sequential"
    # alone in its run; no speed call binds, so it shares the machine's turn with such runs and claims nothing more
    assert all(stage["measured_alone"] is None for v in result["variants"] for stage in v["stages"])
    assert "mode: sequential" in (one_run_dir(out) / "report.md").read_text()


def test_a_run_of_one_server_is_not_explained_as_servers_that_do_not_fit(engine: FakeEngine, tmp_path: Path) -> None:
    """One server runs alone whatever fits: run and check say so, not that no two of its servers fit side by side."""
    text = scenario_text(engine, expect={"baseline": "collapse"})
    scenario = tmp_path / "s.toml"
    scenario.write_text(text)
    check = run_cli(["check", str(scenario)], tmp_path / "cache")
    assert check.returncode == 0, check.stderr
    assert mode_line(check.stdout) == f"run mode: sequential — {ONE_SERVER}"
    proc, out = run_text(engine, tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    assert ONE_SERVER in proc.stderr and "no two" not in proc.stderr
    assert json.loads((one_run_dir(out) / "result.json").read_text())["scenario"]["mode"] == "sequential"


def test_compare_ignores_the_settings_of_a_variant_one_run_did_not_select(engine: FakeEngine, tmp_path: Path) -> None:
    text = both_variants(engine, tmp_path)
    scenario = tmp_path / "s.toml"
    scenario.write_text(text)
    old, new = tmp_path / "old", tmp_path / "new"
    for out, flags in ((old, []), (new, ["--variant", "baseline"])):
        proc = run_cli(["run", str(scenario), "--output", str(out), *flags], tmp_path / "cache")
        assert proc.returncode == 0, proc.stderr
    proc = run_cli(["compare", str(one_run_dir(old)), str(one_run_dir(new))], tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Settings differ" not in proc.stdout, proc.stdout
    assert "Only in old: s / patched" in proc.stdout
