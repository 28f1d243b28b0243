"""specwake's pytest plugin (specwake/pytest_plugin.py) in a real pytest subprocess, on the fake engine: scenario
files become one item per variant, a scenario runs once (under pytest-xdist too, whatever the distribution), each
item's time is its variant's own and its failure is headed by the item, figures land in pytest's own JUnit as
properties, markers select, `-x` stops the reports and not the scenario, a scenario the machine cannot run is skipped
with run's reason, a bad one is a collection error naming its file and key; and a project that merely installs
specwake (this suite included) collects nothing new."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from specwake.runfolder import load_result
from tests.helpers.fakeengine import FakeEngine, cli_env, scenario_text
from tests.helpers.paths import REPO


def pytest_in(folder: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pytest ARGS` run in `folder` (its own rootdir), with specwake's cache private to the test."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env=cli_env(cache),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def three_variants(engine: FakeEngine, tmp: Path) -> Path:
    """baseline (collapses, as expected), patched (the fix: recovers, as expected), wrong (no fix, expects recover)."""
    diff = engine.write_fix(tmp)
    text = scenario_text(
        engine,
        name="fake-family",
        variants={"baseline": {}, "patched": {}, "wrong": {}},
        patch=str(diff),
        expect={"baseline": "collapse", "patched": "recover", "wrong": "recover"},
    )
    path = tmp / "family.toml"
    path.write_text(text)
    return path


def properties(case: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}


def assert_each_item_has_its_variants_time(junit: Path, run: Path) -> None:
    """pytest's JUnit time of each item is its variant's own seconds (result.json), not the scenario's on one item."""
    seconds = {v.name: v.seconds for v in load_result(run).variants}
    times = {c.get("name"): float(c.get("time", "nan")) for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(times) == set(seconds)
    for name, own in seconds.items():
        assert abs(times[name] - own) < 0.01, (name, times, seconds)


def assert_the_failure_is_headed_by_its_item(stdout: str) -> None:
    assert re.search(r"^_+ wrong \(family\.toml\) _+$", stdout, re.M), stdout
    assert not re.search(r"^_+ test session _+$", stdout, re.M), stdout


def test_each_variant_is_an_item_and_the_scenario_runs_once(engine: FakeEngine, tmp_path: Path) -> None:
    scenario = three_variants(engine, tmp_path)
    junit = tmp_path / "junit.xml"
    proc = pytest_in(tmp_path, tmp_path / "cache", "-v", "family.toml", "--junitxml", str(junit),
                     "--specwake-output", "out")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "family.toml::baseline PASSED" in proc.stdout
    assert "family.toml::patched PASSED" in proc.stdout
    assert "family.toml::wrong FAILED" in proc.stdout
    # The failure text is the variant's verdict, not a traceback into specwake.
    assert "wrong: collapse (expected recover)" in proc.stdout and "Traceback" not in proc.stdout
    assert len(engine.launched()) == 3  # one server per variant: the scenario ran once for its three items
    assert len(list((tmp_path / "out").iterdir())) == 1 and scenario.is_file()
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"baseline", "patched", "wrong"}
    base, wrong = properties(cases["baseline"]), properties(cases["wrong"])
    assert base["outcome"] == "collapse" and base["expected"] == "collapse"
    assert float(base["al_fresh"]) > 1.5 and float(base["al_after_cycle_1"]) == 1.0
    assert {"tok_s_ratio", "wake_seconds", "variant_seconds"} <= set(base)
    assert float(properties(cases["patched"])["al_after_cycle_1"]) > 1.5
    assert wrong["outcome"] == "collapse" and wrong["expected"] == "recover"
    assert cases["wrong"].find("failure") is not None
    [run] = (tmp_path / "out").iterdir()
    assert_each_item_has_its_variants_time(junit, run)
    assert_the_failure_is_headed_by_its_item(proc.stdout)


def test_under_xdist_a_scenario_runs_once(engine: FakeEngine, tmp_path: Path) -> None:
    # `-n 2` alone distributes items one by one (xdist's `load`): the three items land on both workers.
    three_variants(engine, tmp_path)
    junit = tmp_path / "junit.xml"
    proc = pytest_in(tmp_path, tmp_path / "cache", "-p", "xdist", "-n", "2", "-v", "family.toml",
                     "--junitxml", str(junit), "--specwake-output", "out")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"\[gw0\] .*PASSED|\[gw0\] .*FAILED", proc.stdout) and "[gw1]" in proc.stdout, proc.stdout
    assert "1 failed, 2 passed" in proc.stdout
    assert len(engine.launched()) == 3  # one server per variant: once, not once per worker
    [run] = (tmp_path / "out").iterdir()
    assert_each_item_has_its_variants_time(junit, run)  # the worker that read the run reports the same times
    assert_the_failure_is_headed_by_its_item(proc.stdout)
    assert list((tmp_path / "cache").glob("pytest-xdist/*")) == []  # the workers' shared folder is gone


def test_under_xdist_each_a_scenario_still_runs_once(engine: FakeEngine, tmp_path: Path) -> None:
    # `--dist each` runs every item on every worker: each worker reports the three items, from the one run.
    three_variants(engine, tmp_path)
    proc = pytest_in(tmp_path, tmp_path / "cache", "-p", "xdist", "-n", "2", "--dist", "each", "family.toml",
                     "--specwake-output", "out")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 failed, 4 passed" in proc.stdout
    assert len(engine.launched()) == 3
    assert len(list((tmp_path / "out").iterdir())) == 1


def test_x_stops_the_reports_not_the_scenario(engine: FakeEngine, tmp_path: Path) -> None:
    # The first item runs the whole scenario; when it fails, -x leaves the other two items unreported.
    diff = engine.write_fix(tmp_path)
    expect = {"baseline": "collapse", "patched": "recover", "wrong": "recover"}
    variants: dict[str, dict[str, str]] = {"wrong": {}, "baseline": {}, "patched": {}}
    text = scenario_text(engine, name="fake-family", variants=variants, patch=str(diff), expect=expect)
    (tmp_path / "family.toml").write_text(text)
    proc = pytest_in(tmp_path, tmp_path / "cache", "-x", "-v", "family.toml", "--specwake-output", "out")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "stopping after 1 failures" in proc.stdout and "1 failed in" in proc.stdout
    assert "::baseline" not in proc.stdout and "::patched" not in proc.stdout
    assert len(engine.launched()) == 3
    [run] = (tmp_path / "out").iterdir()
    assert [v.outcome for v in load_result(run).variants] == ["collapse", "collapse", "recover"]


def test_a_selection_runs_only_the_selected_variants(engine: FakeEngine, tmp_path: Path) -> None:
    three_variants(engine, tmp_path)
    proc = pytest_in(tmp_path, tmp_path / "cache", "family.toml", "-k", "patched", "--specwake-output", "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 2 deselected" in proc.stdout
    assert len(engine.launched()) == 1


def test_markers_come_from_the_scenario(engine: FakeEngine, tmp_path: Path) -> None:
    three_variants(engine, tmp_path)
    cpu = pytest_in(tmp_path, tmp_path / "cache", "--co", "-q", "family.toml", "-m", "cpu and draft_model")
    assert cpu.returncode == 0 and "3 tests collected" in cpu.stdout, cpu.stdout + cpu.stderr
    gpu = pytest_in(tmp_path, tmp_path / "cache", "--co", "-q", "family.toml", "-m", "gpu")
    assert "no tests collected (3 deselected)" in gpu.stdout, gpu.stdout + gpu.stderr
    assert engine.launched() == []  # collecting starts nothing


def test_a_scenario_this_machine_cannot_run_is_skipped_with_runs_reason(engine: FakeEngine, tmp_path: Path) -> None:
    # A real L2 sleep asked of a CPU engine: `run` refuses it (exit 3) before launching anything.
    text = scenario_text(engine, name="needs-gpu").replace("[cycle]\n", '[cycle]\ndiscard = "native"\n')
    (tmp_path / "gpu.toml").write_text(text)
    proc = pytest_in(tmp_path, tmp_path / "cache", "-rs", "gpu.toml", "-m", "gpu", "--specwake-output", "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "sleep mode" in proc.stdout
    assert engine.launched() == []


def test_a_bad_scenario_is_a_collection_error_naming_file_and_key(engine: FakeEngine, tmp_path: Path) -> None:
    text = scenario_text(engine).replace("[cycle]\n", "[cycle]\ncycles = 2\n")
    (tmp_path / "bad.toml").write_text(text)
    proc = pytest_in(tmp_path, tmp_path / "cache", "bad.toml")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "bad.toml: cycle.cycles:" in proc.stdout and "Traceback" not in proc.stdout
    assert engine.launched() == []


def test_an_ini_option_names_scenario_folders(engine: FakeEngine, tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "a.toml").write_text(scenario_text(engine, name="a"))
    (tmp_path / "pytest.ini").write_text("[pytest]\nspecwake_scenarios = scenarios\n")
    proc = pytest_in(tmp_path, tmp_path / "cache", "--co", "-q")
    assert "scenarios/a.toml::baseline" in proc.stdout, proc.stdout + proc.stderr


def test_a_project_that_merely_installs_specwake_is_unaffected(engine: FakeEngine, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "tests" / "data").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "p"\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    (project / "tests" / "test_one.py").write_text("def test_one():\n    assert True\n")
    (project / "tests" / "data" / "s.toml").write_text(scenario_text(engine, name="s"))  # a scenario, not named
    proc = pytest_in(project, tmp_path / "cache", "-v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plugins:" in proc.stdout and "specwake" in proc.stdout  # loaded, and idle
    assert "1 passed" in proc.stdout and "s.toml" not in proc.stdout
    assert engine.launched() == []


def test_specwakes_own_suite_collects_no_scenario(tmp_path: Path) -> None:
    # Without pytest's python plugin only files some other plugin collects are items: a scenario would be one. (With
    # it, every test module is imported, the e2e ones with vLLM: minutes, for nothing this test looks at.)
    for args in ([], ["tests"]):  # on its testpaths, and with the folder named
        proc = pytest_in(REPO, tmp_path / "cache", "-p", "no:python", "--co", "-q", *args)
        assert proc.returncode == 5, proc.stdout[-2000:] + proc.stderr[-2000:]  # 5: no tests collected
        assert "no tests collected" in proc.stdout and ".toml::" not in proc.stdout
