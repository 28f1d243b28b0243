"""Fault injection through the real `specwake run` CLI against fake vLLM servers (tests/helpers/fakeengine.py):
killed, hung and slow servers, a foreign server on our port, Ctrl-C/SIGTERM at each phase, two runs at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from specwake.cli import app
from specwake.run.session import variant_run
from tests.helpers.fakeengine import (
    FakeEngine,
    one_run_dir,
    result_of,
    run_cli,
    run_text,
    scenario_text,
    variant,
)
from tests.helpers.paths import FAKE_SERVER, REPO

run = run_text

BOTH = {"baseline": "collapse", "patched": "recover"}


def fault(when: str, action: str) -> dict[str, str]:
    return {"FAKE_VLLM_ARGS": f"--fault {when}:{action}"}


# -- 1. SIGKILL of the server's process group ------------------------------------------------------

# Completion requests of a stage: 2 prefix-cache probes, 1 warmup, then the measured ones (scenario_text: 2).
FIRST_MEASURED_FRESH = "completion:4"
FIRST_MEASURED_AFTER_CYCLE_1 = "completion:9"

KILL_POINTS = {
    # killed before its fresh stage was measured: nothing about sleep or wake was tested, so `error` (verdict error,
    # exit 3), never a crash that `any` would accept
    "fresh": (FIRST_MEASURED_FRESH, [], None, "error"),
    "cycle step": ("rpc:reload_weights", ["fresh"], "reload_weights", "crash"),
    "later stage": (FIRST_MEASURED_AFTER_CYCLE_1, ["fresh"], None, "crash"),
}
VERDICT_OF = {"error": ("error", 3), "crash": ("fail", 1)}  # baseline expected collapse


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_of_server_group_is_a_crash_and_other_variant_still_measured(
    engine: FakeEngine, tmp_path: Path, point: str
) -> None:
    when, stages, failed_step, outcome = KILL_POINTS[point]
    diff = engine.write_fix(tmp_path)
    text = scenario_text(
        engine, variants={"baseline": fault(when, "kill-group"), "patched": {}}, expect=BOTH, patch=str(diff)
    )
    proc, out = run(engine, tmp_path, text)
    verdict, code = VERDICT_OF[outcome]
    assert proc.returncode == code, proc.stderr
    result = result_of(out)
    assert result["verdict"] == verdict and result["complete"] is True
    base = variant(result, "baseline")
    assert base["outcome"] == outcome and base["crash_class"] == "server_exited"
    assert "killed by signal SIGKILL" in base["error"]
    assert f"fault injected at {when}: kill-group" in base["log_excerpt"]
    assert [s["name"] for s in base["stages"]] == stages
    assert [s["name"] for s in base["steps"] if not s["ok"]] == ([failed_step] if failed_step else [])
    patched = variant(result, "patched")
    assert patched["outcome"] == "recover" and [s["name"] for s in patched["stages"]] == ["fresh", "after L2 #1"]
    assert len(engine.launched()) == 2


# -- 2. SIGSTOP of the server's group mid-request ---------------------------------------------------


@pytest.mark.parametrize(
    ("when", "timeouts", "deadline"),
    [
        (FIRST_MEASURED_AFTER_CYCLE_1, {"request_timeout_s": 2}, 2),
        ("rpc:reload_weights", {"step_timeout_s": 2}, 2 + 5),  # an RPC's HTTP deadline is its timeout + 5 s
    ],
)
def test_sigstop_mid_request_fires_the_deadline_and_kills_the_group(
    engine: FakeEngine, tmp_path: Path, when: str, timeouts: dict[str, float], deadline: float
) -> None:
    text = scenario_text(
        engine, variants={"baseline": fault(when, "stop-group")}, expect={"baseline": "crash"}, **timeouts
    )
    proc, out = run(engine, tmp_path, text)
    assert proc.returncode == 0, proc.stderr  # crash was expected
    result = result_of(out)
    base = variant(result, "baseline")
    assert base["outcome"] == "crash" and base["crash_class"] == "request_timeout"
    assert f"no answer within {deadline:g} s" in base["error"]
    log = Path(base["log_path"]).read_text()
    injected = float(re.search(r"fault injected at .*stop-group t=([0-9.]+)", log).group(1))  # type: ignore[union-attr]
    # The deadline fired, the stopped group was killed and the result written within deadline + 5 s.
    finished = (one_run_dir(out) / "result.json").stat().st_mtime
    assert finished - injected <= deadline + 5


# -- 3. Slow start and early exit --------------------------------------------------------------------


def test_slow_start_exits_3_with_log_tail_after_startup_timeout(engine: FakeEngine, tmp_path: Path) -> None:
    env = {"FAKE_VLLM_MODE": "slow-start", "FAKE_VLLM_ARGS": "--startup-delay 120"}
    proc, out = run(engine, tmp_path, scenario_text(engine, variants={"baseline": env}, startup_timeout_s=2))
    assert proc.returncode == 3, proc.stderr
    base = variant(result_of(out), "baseline")
    assert base["outcome"] == "error" and base["crash_class"] == "startup_failed"
    assert "not ready after" in base["error"]
    assert "fake vLLM API server, mode slow-start" in base["log_excerpt"]  # the log tail is kept
    assert "startup_failed" in proc.stdout  # and reported


def test_server_exiting_before_ready_is_seen_without_waiting_the_deadline(engine: FakeEngine, tmp_path: Path) -> None:
    env = {"FAKE_VLLM_MODE": "exit-early"}
    proc, out = run(engine, tmp_path, scenario_text(engine, variants={"baseline": env}, startup_timeout_s=600))
    assert proc.returncode == 3, proc.stderr
    base = variant(result_of(out), "baseline")
    assert base["outcome"] == "error" and "exited with code 1 before ready" in base["error"]
    assert "Engine core initialization failed" in base["log_excerpt"]
    assert base["info"]["timings"]["startup"] < 600


# -- 4. A foreign server on the port specwake picked ------------------------------------------------


# Ours either loses the bind and exits, or is still starting, when the readiness poll reaches the port; "exit-early"
# makes it exit first every time, as it does when the foreign server answers later than ours fails.
@pytest.mark.parametrize("ours", [{}, {"FAKE_VLLM_MODE": "exit-early"}], ids=["racing", "exits-first"])
def test_foreign_server_on_our_port_is_never_measured(
    engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ours: dict[str, str]
) -> None:
    from specwake.run.server.server import free_port

    port = free_port()
    log = tmp_path / "foreign.log"
    with open(log, "wb") as fh:
        foreign = subprocess.Popen(
            [sys.executable, str(FAKE_SERVER), "--port", str(port), "--model", "someone-elses-model"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_health(port)
        monkeypatch.setattr(variant_run, "free_port", lambda: port)  # specwake's pick collides
        monkeypatch.setenv("SPECWAKE_CACHE", str(tmp_path / "cache"))
        scenario = tmp_path / "s.toml"
        scenario.write_text(scenario_text(engine, variants={"baseline": ours}))
        out = tmp_path / "out"
        result = CliRunner().invoke(app, ["run", str(scenario), "--output", str(out), "--quiet"])
    finally:
        foreign.kill()
        foreign.wait()
    assert result.exit_code == 3, result.output
    base = variant(result_of(out), "baseline")
    assert base["outcome"] == "error" and base["stages"] == [] and base["steps"] == []
    assert "someone-elses-model" in base["error"] and "fake-model" in base["error"]
    requests = [line for line in log.read_text().splitlines() if '"POST ' in line]
    assert requests == []  # no completion, sleep or RPC ever reached the foreign server


def test_a_port_taken_before_the_server_binds_it_is_left_for_another(
    engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process binds the port specwake picked (and answers nothing) before our server does: ours exits with
    "Address already in use"; specwake starts it once more on a port picked again, and measures it."""
    import socket

    from specwake.run.server.server import free_port

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    picks = iter([taken])
    monkeypatch.setattr(variant_run, "free_port", lambda: next(picks, None) or free_port())
    monkeypatch.setenv("SPECWAKE_CACHE", str(tmp_path / "cache"))
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine))
    out = tmp_path / "out"
    try:
        result = CliRunner().invoke(app, ["run", str(scenario), "--output", str(out), "--quiet"])
    finally:
        holder.close()
    base = variant(result_of(out), "baseline")
    assert base["outcome"] not in ("error", "crash") and base["stages"], (result.output, base.get("error"))
    log = next(out.glob("*/logs/baseline.log")).read_text()
    assert log.count("# specwake: server start") == 2 and "Address already in use" in log
    assert f"--port {taken} " not in " ".join(base["command"]) + " "  # measured on the port picked again


def _wait_health(port: int) -> None:
    for _ in range(100):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("foreign fake server never became ready")


# -- 5. SIGINT / SIGTERM to specwake at each phase -----------------------------------------------------

PHASES = {
    "startup": ("startup", [], None),
    "fresh": (FIRST_MEASURED_FRESH, [], None),
    "cycle": ("path:/sleep", ["fresh"], None),
    "later stage": (FIRST_MEASURED_AFTER_CYCLE_1, ["fresh"], None),
}


@pytest.mark.parametrize("sig", ["int", "term"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_signal_to_specwake_stops_servers_keeps_results_exits_130(
    engine: FakeEngine, tmp_path: Path, phase: str, sig: str
) -> None:
    when, stages, _ = PHASES[phase]
    text = scenario_text(engine, variants={"baseline": {}, "second": fault(when, f"{sig}-parent")})
    proc, out = run(engine, tmp_path, text, "--sequential")  # asserts no server survives specwake's exit
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr
    result = result_of(out)
    assert result["complete"] is False
    base = variant(result, "baseline")  # measured completely before the signal: kept
    assert base["outcome"] == "collapse" and len(base["stages"]) == 2
    second = variant(result, "second")  # interrupted: what it measured so far, marked incomplete
    assert second["outcome"] == "incomplete" and [s["name"] for s in second["stages"]] == stages
    assert len(engine.launched()) == 2


@pytest.mark.parametrize("when", ["startup", FIRST_MEASURED_FRESH, "path:/sleep"])
def test_signal_while_variants_overlap_stops_both_servers_and_keeps_measured_stages(
    engine: FakeEngine, tmp_path: Path, when: str
) -> None:
    """The CPU default runs a scenario's variants side by side: one Ctrl-C must stop both servers."""
    text = scenario_text(engine, variants={"baseline": {}, "second": fault(when, "int-parent")})
    proc, out = run(engine, tmp_path, text)  # asserts no server survives specwake's exit
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in proc.stderr
    result = result_of(out)
    assert result["complete"] is False
    second = variant(result, "second")
    assert second["outcome"] == "incomplete"
    for v in result["variants"]:  # whatever either side measured before the signal is kept, complete
        for stage in v["stages"]:
            assert stage["tok_s"] and stage["acceptance_length"] is not None, (v["name"], stage["name"])
    # Both servers were launched side by side. Counted from specwake's start record at the head of each log: the
    # signal can reach a server still importing, before it records its own launch (seen at completion:4, 0.16 s
    # after both started). A fault at startup may come before specwake has launched the other one.
    launched = launched_servers(out)
    assert launched == ["baseline", "second"] or (when == "startup" and launched == ["second"]), launched


def launched_servers(out: Path) -> list[str]:
    """The variants whose server specwake launched: their log begins with specwake's start record."""
    return sorted(log.stem for log in out.rglob("logs/*.log") if log.read_text().startswith("# specwake: server start"))


@pytest.mark.parametrize("sig", ["int", "term"])
def test_a_cancelled_run_still_writes_its_junit_and_prints_its_report(
    engine: FakeEngine, tmp_path: Path, sig: str
) -> None:
    """A CI timeout or cancel: the JUnit file and the report come out before exit 130, every unfinished variant
    marked not run, and the suite's time is the run's wall time."""
    variants = {"baseline": {}, "second": fault(FIRST_MEASURED_FRESH, f"{sig}-parent"), "third": {}}
    junit = tmp_path / "junit.xml"
    started = time.monotonic()
    proc, out = run(engine, tmp_path, scenario_text(engine, variants=variants), "--sequential", "--junit", str(junit))
    wall = time.monotonic() - started
    assert proc.returncode == 130, proc.stderr
    assert "baseline" in proc.stdout and "collapse" in proc.stdout  # the report of what was measured
    assert "interrupted" in proc.stderr and f"results: {one_run_dir(out)}" in proc.stderr
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("skipped")) == ("3", "2")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["baseline"].find("skipped") is None and cases["baseline"].find("failure") is None
    for name in ("second", "third"):
        skipped = cases[name].find("skipped")
        assert skipped is not None and "interrupted" in (skipped.get("message") or ""), name
    assert 0 < float(suite.get("time", "0")) <= wall + 1  # started_at has whole seconds
    assert len(engine.launched()) == 2  # the third never started
    # How to finish it: in the report printed, and in `report` on its folder
    finish = f"s/second, s/third — `specwake run {tmp_path / 's.toml'} --resume {one_run_dir(out)}` runs only those"
    assert finish in proc.stdout
    shown = run_cli(["report", str(one_run_dir(out))], tmp_path / "cache")
    assert shown.returncode == 0 and finish in shown.stdout, shown.stdout


def test_resume_without_naming_the_scenario_takes_it_from_the_run_folder(engine: FakeEngine, tmp_path: Path) -> None:
    """`run --resume DIR` alone finishes the run: the folder's result names the scenario file it ran. Only the
    variant left incomplete starts again; a scenario file that is gone is one line naming it, exit 2."""
    proc, out = run(engine, tmp_path, scenario_text(engine, variants={"baseline": {}, "second": {}}), "--sequential")
    assert proc.returncode == 0, proc.stderr
    folder = one_run_dir(out)
    data = json.loads((folder / "result.json").read_text())
    cut = variant(data, "second")
    cut.update(outcome="incomplete", stages=[], steps=[], diagnostics=[], findings=[])
    data["complete"], data["finished_at"] = False, None
    (folder / "result.json").write_text(json.dumps(data))
    started = len(engine.launched())
    resumed = run_cli(["run", "--resume", str(folder), "--sequential", "--quiet"], tmp_path / "cache")
    assert resumed.returncode == 0, resumed.stderr
    assert len(engine.launched()) == started + 1  # the second variant alone
    done = result_of(out)
    assert done["complete"] is True and variant(done, "second")["outcome"] != "incomplete"
    assert variant(done, "baseline") == variant(data, "baseline")  # kept as it was
    (tmp_path / "s.toml").rename(tmp_path / "moved.toml")
    gone = run_cli(["run", "--resume", str(folder), "--quiet"], tmp_path / "cache")
    assert gone.returncode == 2, gone.stderr
    assert gone.stderr.strip().splitlines() == [
        f"error: --resume: {folder} ran scenario s from {tmp_path / 's.toml'}: not found; name its file:"
        f" specwake run FILE --resume {folder}"
    ]
    assert len(engine.launched()) == started + 1


def test_run_without_a_scenario_or_resume_is_one_line() -> None:
    result = CliRunner().invoke(app, ["run", "--quiet"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: SCENARIOS: name at least one scenario file (or --resume DIR to finish an interrupted run)"
    ]


# -- 6. Two runs at once --------------------------------------------------------------------------------


def test_two_runs_at_once_share_nothing_and_build_caches_safely(engine: FakeEngine, tmp_path: Path) -> None:
    diff = engine.write_fix(tmp_path)
    scenario = tmp_path / "two.toml"
    scenario.write_text(
        scenario_text(
            engine, variants={"baseline": {}, "patched": {}}, expect=BOTH, patch=str(diff), model="builtin:tiny-llama"
        )
    )
    out, cache = tmp_path / "out", tmp_path / "cache"  # both fresh: model and overlay built by both at once
    from tests.helpers.fakeengine import cli_env

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "specwake.cli", "run", str(scenario), "--output", str(out)],
            cwd=REPO,
            env=cli_env(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    runs = sorted(out.iterdir())
    assert len(runs) == 2  # separate result folders
    results = [json.loads((r / "result.json").read_text()) for r in runs]
    ports = [int(v["command"][v["command"].index("--port") + 1]) for r in results for v in r["variants"]]
    assert len(set(ports)) == 4
    overlays = {variant(r, "patched")["overlay"] for r in results}
    assert len(overlays) == 1  # one overlay, built once or reused, never half-written
    overlay = Path(overlays.pop())
    patched_file = overlay / "vllm" / "drafter_reload.py"
    assert not patched_file.is_symlink() and "RELOADS_DRAFT = True" in patched_file.read_text()
    assert "RELOADS_DRAFT = False" in (engine.package / "drafter_reload.py").read_text()
    models = list((cache / "models").iterdir())
    assert [m.name for m in models] == ["tiny-llama-v1"]  # no staging folder left behind
    assert json.loads((models[0] / "config.json").read_text())["model_type"] == "llama"
    assert [p.name for p in (cache / "overlays").iterdir() if p.name.startswith(".tmp")] == []
    for r in results:
        assert {v["name"]: v["outcome"] for v in r["variants"]} == BOTH


# -- 7. Results folder unwritable ---------------------------------------------------------------------------


def test_unwritable_results_folder_exits_3_before_launching(engine: FakeEngine, tmp_path: Path) -> None:
    # Tests run as root, so a chmod-ed folder would still be writable: use a path in /proc (no new files there, even
    # for root). A path under a regular file is the user's mistake, exit 2 (test_hostile_input.py).
    target = Path("/proc/specwake-results-test")
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine))
    proc = run_cli(["run", str(scenario), "--output", str(target)], tmp_path / "cache")
    assert proc.returncode == 3, proc.stderr
    assert "not writable" in proc.stderr and str(target) in proc.stderr
    assert engine.invocations() == []  # not even the interpreter probe ran


def test_a_refused_run_leaves_no_results_folder(engine: FakeEngine, tmp_path: Path) -> None:
    """A run refused after its results folder was found writable (here: a real L2 sleep asked of a CPU engine)."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(scenario_text(engine).replace("[cycle]\n", '[cycle]\ndiscard = "native"\n'))
    target = tmp_path / "not-yet" / "results"
    proc = run_cli(["run", str(scenario), "--output", str(target)], tmp_path / "cache")
    assert proc.returncode == 3, proc.stderr
    assert not (tmp_path / "not-yet").exists()


def test_check_refuses_two_scenarios_of_one_name_as_run_does(engine: FakeEngine, tmp_path: Path) -> None:
    paths = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "s.toml").write_text(scenario_text(engine, name="same"))
        paths.append(str(tmp_path / folder / "s.toml"))
    for command in (["check", *paths], ["run", *paths, "--output", str(tmp_path / "out")]):
        proc = run_cli(command, tmp_path / "cache")
        assert proc.returncode == 2 and "is also the name of" in proc.stderr, (command[0], proc.stderr)


def test_runs_report_in_a_ci_log_is_plain_text_and_its_files_keep_markdown(engine: FakeEngine, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    proc, out = run(engine, tmp_path, scenario_text(engine), GITHUB_STEP_SUMMARY=str(summary))
    assert proc.returncode == 0, proc.stderr
    assert "(n<6)" in proc.stdout and "&lt;" not in proc.stdout and "<sub>" not in proc.stdout  # a pipe: a CI log
    report = (one_run_dir(out) / "report.md").read_text()
    assert "<details>" in report and "<details>" in summary.read_text()  # Markdown files keep their HTML
    assert "(n<6)" in report and "(n<6)" in summary.read_text()  # a `<` that opens no tag needs no escape
