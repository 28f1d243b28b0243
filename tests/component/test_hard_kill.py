"""specwake itself killed outright (SIGKILL, as the OOM killer and CI job timeouts do), through the real CLI on the fake
engine (tests/helpers/fakeengine.py), each server with a child in its group like vLLM's engine core: every server
group dies with the run (its watchdog, specwake/run/server/lifeline.py), a later run names the servers of a run whose
watchdogs died too and can stop them (specwake/run/server/leftovers.py), and `report` on the partial folder names the
variants that never ran.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specwake.cli import app
from specwake.run.server import leftovers
from specwake.run.server.groups import boot_id, live_group_members, pid_namespace, start_ticks
from specwake.run.server.leftovers import ServerRecord, registry_dir, remember
from specwake.run.server.lifeline import Lifeline
from specwake.run.server.server import Server, ServerSpec, free_port
from specwake.run.server.warm import SWITCH as WARM_SWITCH
from tests.helpers.fakeengine import REPO, FakeEngine, cli_env, one_run_dir, run_cli, scenario_text
from tests.helpers.paths import FAKE_SERVER
from tests.helpers.procs import leftover_processes

ENGINE_CORE = "--spawn-child --step-delay 0.05"  # a child in each server's group; a fresh stage of about 2 s
GPUS = {"FAKE_VLLM_PLATFORM": "cuda", "FAKE_VLLM_GPUS": "2"}  # two servers at once, a third waits for a GPU
GONE_WITHIN_S = 5.0


def start_run(engine: FakeEngine, tmp: Path, variants: list[str], **env: str) -> subprocess.Popen[str]:
    """`specwake run` on a fake-engine scenario of `variants`, in the background and a process group of its own (as a
    CI job runs it), its progress lines on a pipe."""
    scenario = tmp / "s.toml"
    scenario.write_text(scenario_text(engine, variants={v: {"FAKE_VLLM_ARGS": ENGINE_CORE} for v in variants}))
    return subprocess.Popen(
        [sys.executable, "-m", "specwake.cli", "run", str(scenario), "--output", str(tmp / "out")],
        cwd=REPO,
        env=cli_env(tmp / "cache", **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_until_measuring(proc: subprocess.Popen[str], servers: int) -> None:
    """Read progress lines until `servers` servers are ready and one of them measures its fresh stage."""
    assert proc.stderr is not None
    ready, fresh = 0, False
    for line in proc.stderr:
        ready += "server ready after" in line
        fresh = fresh or bool(re.search(r": stage fresh$", line.rstrip()))
        if ready >= servers and fresh:
            return
    raise AssertionError(f"specwake ended (code {proc.wait()}) before {servers} servers were up and measuring")


def hard_kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to specwake's whole process group, as a CI job's timeout sends it: it gets no chance to stop anything."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.stderr is not None
    proc.stderr.close()


def running(engine: FakeEngine) -> list[object]:
    """The fake engine's processes (found by their environment) and any live member of its servers' groups (a
    process that is exiting may no longer show its environment)."""
    return [*engine.survivors(), *leftover_processes(span.pid for span in engine.servers())]


def wait_gone(engine: FakeEngine, timeout_s: float) -> float:
    """Seconds until no process of the fake engine (servers, their children) runs; fails after `timeout_s`."""
    started = time.monotonic()
    while running(engine):
        assert time.monotonic() - started < timeout_s, f"still running after {timeout_s} s: {running(engine)}"
        time.sleep(0.05)
    return time.monotonic() - started


def wait_for_line(log: Path, text: str, timeout_s: float = 5.0) -> str:
    """The log once it holds `text` (the watchdog writes its last line just after the group is gone)."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{log} never said {text!r}"
        time.sleep(0.05)
    return log.read_text()


def quick_run(engine: FakeEngine, folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """A later `specwake run` that launches one server, which exits at once (exit 3): what it says before is all
    that is looked at."""
    folder.mkdir()
    (folder / "s.toml").write_text(scenario_text(engine, variants={"baseline": {"FAKE_VLLM_MODE": "exit-early"}}))
    return run_cli(["run", str(folder / "s.toml"), "--output", str(folder / "out"), *flags], folder.parent / "cache")


def cli(*args: str) -> tuple[int, str, str]:
    """A quick command in-process (the engine fixture points SPECWAKE_CACHE at the test's cache): exit code,
    stdout, stderr."""
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def records(cache: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(registry_dir(cache).glob("*.json"))]


def wait_watchdogs_gone(found: list[dict], within_s: float) -> None:
    """Wait until the watchdog of every record has exited (it logs that its group stopped, then returns)."""
    deadline = time.monotonic() + within_s
    while any(start_ticks(r["watchdog"]) == r["watchdog_start"] for r in found):
        assert time.monotonic() < deadline, f"a watchdog still runs {within_s} s after its group stopped"
        time.sleep(0.05)


# -- the run dies, its servers die with it -------------------------------------------------------------


@pytest.mark.parametrize("platform", ["cpu", "gpu", "cpu-warm"])
def test_sigkill_of_specwake_mid_stage_stops_every_server_group(
    engine: FakeEngine, tmp_path: Path, platform: str
) -> None:
    """CPU: both variants' servers side by side (the default); GPU (fake CUDA, 2 GPUs, packed): two servers up, the
    third variant waiting for a GPU; warm CPU: the two servers forked from one warm launcher (the variants differ in
    name only), which must exit too, and so must the base it was forked from. specwake is SIGKILLed while a server
    measures its fresh stage."""
    gpu, warm = platform == "gpu", platform == "cpu-warm"
    variants = ["baseline", "patched", "third"] if gpu else ["baseline", "patched"]
    proc = start_run(engine, tmp_path, variants, **(GPUS if gpu else {WARM_SWITCH: "1"} if warm else {}))
    try:
        wait_until_measuring(proc, servers=2)
        # two API servers, each with its "engine core", and where they were forked warm their launcher and its base
        assert len(engine.survivors()) == 4 + 2 * warm
        hard_kill(proc)
        seconds = wait_gone(engine, GONE_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    spans = engine.servers()
    assert len(spans) == 2 and all(span.how == "SIGTERM" for span in spans)  # stopped as Server.stop would
    assert leftover_processes(span.pid for span in spans) == []  # whole groups, children included
    run_dir = one_run_dir(tmp_path / "out")
    for span in spans:
        assert span.log is not None
        log = wait_for_line(span.log, f"server group {span.pid} stopped")
        assert ("# warm start: forked from launcher pid" in log) is warm
        assert f"specwake (pid {proc.pid}) is gone: stopping server group {span.pid} (2 processes" in log
    print(f"{platform}: every server process gone {seconds:.2f} s after the SIGKILL")

    # The records of the dead run's servers are dropped by the next look once their watchdogs have exited (a record
    # is kept while its watchdog runs: it may be stopping the group right now): nothing is left over.
    assert len(records(tmp_path / "cache")) == 2
    wait_watchdogs_gone(records(tmp_path / "cache"), GONE_WITHIN_S)
    code, _, err = cli("leftovers")
    assert code == 0 and "no leftover servers" in err, err
    assert records(tmp_path / "cache") == []

    # `report` on the partial folder names every planned variant; the third never started.
    result = json.loads((run_dir / "result.json").read_text())
    assert result["complete"] is False and [v["name"] for v in result["variants"]] == variants
    code, report, err = cli("report", str(run_dir))
    assert code == 0, err
    if gpu:
        assert "s/third not run" in report.splitlines()[0]  # the verdict line
        assert re.search(r"^\| third +\| not run ", report, re.MULTILINE), report
        assert re.search(r"^- \*\*third\*\*: incomplete .* — not run: nothing recorded", report, re.MULTILINE)


# -- the run and its watchdogs die: a later run names the leftovers, and they can be stopped ----------------------


def test_a_later_run_names_what_a_dead_run_left_and_can_stop_it(engine: FakeEngine, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = start_run(engine, tmp_path, ["baseline", "patched"])
    try:
        wait_until_measuring(proc, servers=2)
        dead = records(cache)
        assert len(dead) == 2
        for record in dead:  # everything specwake started but the servers dies: no watchdog stops them now
            os.kill(record["watchdog"], signal.SIGKILL)
        hard_kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(1.5)
    left = engine.survivors()
    assert len(left) == 4, left  # two servers and their children, orphaned and still serving

    code, listed, err = cli("leftovers")
    assert code == 0, err
    for record in dead:
        assert re.search(rf"^{record['pgid']} +2 +{record['port']} .*{re.escape(record['log'])}$", listed, re.M)
    assert "2 leftover server(s); `specwake leftovers --stop` stops them" in err

    run = quick_run(engine, tmp_path / "later")
    assert run.returncode == 3, run.stderr
    assert "warning: 2 servers left running by specwake runs that died: server group" in run.stderr
    for record in dead:
        assert f"server group {record['pgid']} (2 processes, port {record['port']}" in run.stderr
        assert record["log"] in run.stderr
    assert "`specwake leftovers --stop` (or `specwake run --stop-leftovers`) stops them" in run.stderr
    assert sorted(engine.survivors()) == sorted(left)  # named, not touched

    run = quick_run(engine, tmp_path / "stopping", "--stop-leftovers")
    assert run.returncode == 3, run.stderr
    for record in dead:
        assert f"leftover server group {record['pgid']} (2 processes, port {record['port']}" in run.stderr
    assert run.stderr.count(": stopped") == 2
    assert engine.survivors() == [] and records(cache) == []


@pytest.mark.parametrize("survives", [False, True])
def test_leftovers_stop_ends_a_recorded_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, survives: bool) -> None:
    """A group recorded by a run that is gone (a record written by hand: its specwake and watchdog never existed).
    One that outlives --stop (a process no signal ends, stood in for by a stop that sends none) is exit 3, its record
    kept (docs/reliability.md)."""
    monkeypatch.setenv("SPECWAKE_CACHE", str(tmp_path / "cache"))
    if survives:
        monkeypatch.setattr(leftovers, "end_group", lambda pgid, grace_s: live_group_members(pgid))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        start = start_ticks(sleeper.pid)
        boot, namespace = boot_id(), pid_namespace()
        assert start is not None and boot is not None and namespace is not None
        log = tmp_path / "old" / "logs" / "baseline.log"
        record = ServerRecord(sleeper.pid, start, 8000, str(log), 1, -1, 1, -1, boot, namespace, "2026-01-01T00:00:00")
        remember(registry_dir(tmp_path / "cache"), record)
        code, _, err = cli("leftovers", "--stop")
        if survives:
            assert code == 3, err
            assert err.strip().splitlines()[-1] == "error: 1 leftover server(s) survived SIGKILL"
            assert sleeper.poll() is None and len(records(tmp_path / "cache")) == 1
            return
        assert code == 0, err
        assert f"stopped server group {sleeper.pid} (1 process, port 8000, since 2026-01-01T00:00:00): {log}" in err
        assert sleeper.wait(timeout=5) == -signal.SIGTERM
        assert records(tmp_path / "cache") == []
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


# -- the watchdog on its own -----------------------------------------------------------------------------------


def watchdogs_of(pgid: int) -> list[int]:
    """Pids of the watchdog processes (python -m specwake.run.server.lifeline PGID ...) watching group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"specwake.run.server.lifeline" in argv and str(pgid).encode() in argv:
            found.append(int(entry.name))
    return found


def group(*flags: str) -> subprocess.Popen[bytes]:
    """A fake server with a child, in a session of its own, as Server starts one."""
    port = str(free_port())
    argv = [sys.executable, str(FAKE_SERVER), "--port", port, "--spawn-child", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # its child is up once the server says so
        if b"spawned engine core" in line:
            return proc
    raise AssertionError("the fake server never spawned its child")


def test_the_watchdog_kills_a_group_that_ignores_sigterm_after_the_grace_period(tmp_path: Path) -> None:
    """A stand-in for specwake attaches the lifeline and is SIGKILLed; server and child ignore SIGTERM."""
    server = group("--ignore-sigterm")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(server.pid)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        watchdog = int(owner.stdout.readline())
        assert len(leftover_processes([server.pid])) == 2
        owner.kill()
        owner.wait()
        killed = time.monotonic()
        assert server.wait(timeout=10) == -signal.SIGKILL  # SIGTERM ignored: killed after the 1 s grace
        while leftover_processes([server.pid]) or start_ticks(watchdog) is not None:
            assert time.monotonic() - killed < 1 + 5, "group or watchdog still there"
            time.sleep(0.05)
        assert time.monotonic() - killed >= 1.0  # the grace period was given
    finally:
        for proc in (owner, server):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


OWNER = """\
import sys, time
from specwake.run.server.lifeline import Lifeline
line = Lifeline.attach(int(sys.argv[1]), 1.0, None)
print(line.pid, flush=True)
time.sleep(600)
"""


def test_a_watchdog_exits_by_itself_once_its_group_is_gone() -> None:
    server = group()
    line = Lifeline.attach(server.pid, 10.0, None)
    try:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        assert line.watchdog.wait(timeout=5) == 0  # while specwake still holds the line
    finally:
        line.cut()
        if server.poll() is None:
            server.kill()
            server.wait()


def test_server_stop_reaps_its_watchdog_and_drops_its_record(tmp_path: Path) -> None:
    port = free_port()
    registry = tmp_path / "cache" / "servers"
    spec = ServerSpec(
        argv=[sys.executable, str(FAKE_SERVER), "--port", str(port), "--spawn-child"],
        env={"PATH": os.environ.get("PATH", "")},
        port=port,
        log_path=tmp_path / "logs" / "server.log",
        startup_timeout_s=20,
        registry=registry,
    )
    server = Server(spec, poll_interval_s=0.05)
    try:
        server.start()
        server.wait_ready()
        pgid = server.pgid
        assert pgid is not None
        [record] = [json.loads(p.read_text()) for p in registry.glob("*.json")]
        assert (record["pgid"], record["port"], record["owner"]) == (pgid, port, os.getpid())
        assert record["log"] == str(spec.log_path) and watchdogs_of(pgid) == [record["watchdog"]]
    finally:
        server.stop()
    assert leftover_processes([pgid]) == [] and watchdogs_of(pgid) == []
    assert list(registry.glob("*.json")) == []
