"""Warm starts (specwake.run.server.warm and specwake.worker.warm) with real processes and no vLLM: servers of
tests/helpers/fake_server.py forked from a launcher that imported their code ahead (tests.helpers.warm_server), each
in its own session, environment, cores and log, stopped and reaped as a cold server is; and every way a launcher
cannot serve ends in a cold start, never in a lost server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from specwake.prepare.overlay import MANIFEST
from specwake.run.server.groups import start_ticks
from specwake.run.server.server import Server, ServerSpec, free_port
from specwake.run.server.warm import LOST, SWITCH, WarmStarts, launcher_key
from tests.helpers.paths import REPO
from tests.helpers.procs import running

pytestmark = pytest.mark.usefixtures("leak_check")
PYTHONPATH = f"{REPO}:{REPO / 'tests' / 'helpers'}"  # fake_server.py imports its sibling vllm_model


@pytest.fixture
def pool() -> Iterator[WarmStarts]:
    starts = WarmStarts()
    yield starts
    starts.close()


def warm_spec(tmp_path: Path, name: str, cpus: tuple[int, ...] = (), **env: str) -> ServerSpec:
    port = free_port()
    return ServerSpec(
        argv=[sys.executable, "-m", "tests.helpers.warm_server", "--port", str(port), "--model", name],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": PYTHONPATH, "PYTHONUNBUFFERED": "1", **env},
        port=port,
        log_path=tmp_path / "logs" / f"{name}.log",
        startup_timeout_s=60.0,
        cpus=cpus,
        warm=True,
    )


def server(spec: ServerSpec, pool: WarmStarts) -> Server:
    return Server(spec, poll_interval_s=0.05, grace_s=5.0, warm_starts=pool)


def facts(spec: ServerSpec) -> dict[str, object]:
    """The `warm-app` line the server printed about its own process."""
    for line in spec.log_path.read_text().splitlines():
        if line.startswith("warm-app "):
            return dict(json.loads(line.removeprefix("warm-app ")))
    raise AssertionError(f"no warm-app line in {spec.log_path}")


def launcher_pids(pool: WarmStarts) -> set[int]:
    return {launcher.pid for launcher in pool._launchers.values() if launcher.pid is not None}


def test_servers_of_one_environment_are_forked_from_one_launcher_that_imported_their_code(
    tmp_path: Path, pool: WarmStarts
) -> None:
    # VLLM_CPU_OMP_THREADS_BIND is read when vLLM's worker starts: servers that differ only there share a launcher
    first = warm_spec(tmp_path, "first", WARM_TEST_VALUE="same", VLLM_CPU_OMP_THREADS_BIND="0")
    second = warm_spec(tmp_path, "second", WARM_TEST_VALUE="same", VLLM_CPU_OMP_THREADS_BIND="1")
    with running(server(first, pool)) as one, running(server(second, pool)) as two:
        for each in (one, two):
            assert httpx.get(f"{each.base_url}/v1/models").json()["data"][0]["id"] == each.spec.log_path.stem
        (launcher,) = launcher_pids(pool)
        seen = [facts(first), facts(second)]
        assert [fact["pid"] for fact in seen] == [one.pid, two.pid]
        assert {fact["imported_by"] for fact in seen} == {launcher}  # imported once, ahead, in the launcher
        assert [fact["sid"] for fact in seen] == [one.pid, two.pid]  # each a session (and group) of its own
        assert [fact["argv"][-1] for fact in seen] == ["first", "second"]
        assert [fact["bind"] for fact in seen] == ["0", "1"]  # each its own binding, the launcher's first one's
        assert f"forked from launcher pid {launcher}" in first.log_path.read_text()
        assert f"PPid:\t{launcher}\n" in Path(f"/proc/{one.pid}/status").read_text()
    assert (one.returncode(), two.returncode()) == (-signal.SIGTERM, -signal.SIGTERM)


def test_each_server_runs_with_its_own_environment_cores_and_torch_threads(tmp_path: Path, pool: WarmStarts) -> None:
    """The launcher imports torch on the cores of the server that needed it first (every core here); a later server
    held to one core runs torch on one thread, as a cold start's OpenMP would."""
    every = tuple(sorted(os.sched_getaffinity(0)))
    first = warm_spec(tmp_path, "every-core", cpus=every, WARM_TEST_TORCH="1", VLLM_CPU_OMP_THREADS_BIND="0")
    later = warm_spec(tmp_path, "one-core", cpus=every[-1:], WARM_TEST_TORCH="1", VLLM_CPU_OMP_THREADS_BIND="1")
    with running(server(first, pool)), running(server(later, pool)):
        (launcher,) = launcher_pids(pool)
        assert os.sched_getaffinity(launcher) == set(every)
        fact = facts(later)
    assert fact["imported_by"] == launcher != fact["pid"]
    assert (fact["cpus"], fact["torch_threads"]) == ([every[-1]], 1)


def test_a_launcher_imports_on_the_cores_of_the_server_that_needed_it(tmp_path: Path, pool: WarmStarts) -> None:
    """Its imports take that server's cores, as the server's own cold start would: a neighbour measuring on another
    core is left alone."""
    spec = warm_spec(tmp_path, "pinned", cpus=(0,))
    with running(server(spec, pool)):
        (launcher,) = launcher_pids(pool)
        assert os.sched_getaffinity(launcher) == {0}
        assert facts(spec)["cpus"] == [0]


def test_servers_of_another_environment_get_a_launcher_of_their_own(tmp_path: Path, pool: WarmStarts) -> None:
    first, second = warm_spec(tmp_path, "a", WARM_TEST_VALUE="a"), warm_spec(tmp_path, "b", WARM_TEST_VALUE="b")
    with running(server(first, pool)), running(server(second, pool)):
        assert len(launcher_pids(pool)) == 2
        assert [facts(first)["value"], facts(second)["value"]] == ["a", "b"]
        assert facts(first)["imported_by"] != facts(second)["imported_by"]


def test_launchers_that_differ_by_an_overlay_share_a_base_which_imports_their_libraries_once(
    tmp_path: Path, pool: WarmStarts
) -> None:
    """Three patched vLLMs (overlays, each first on PYTHONPATH): one base forks the three launchers. The first
    launcher imports everything and says what; the base then imports all of it but vllm, so the later servers find the
    libraries imported by the base and each its own overlay's vllm, imported by its launcher."""
    specs = []
    for name in ("a", "b", "c"):
        root = tmp_path / f"overlay-{name}"
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "__init__.py").write_text(f"WHERE = {name!r}\n")
        (root / MANIFEST).write_text("{}\n")
        specs.append(warm_spec(tmp_path, name, WARM_TEST_OVERLAY="1", PYTHONPATH=f"{root}:{PYTHONPATH}"))
    seen = []
    for spec in specs:
        with running(server(spec, pool)):
            seen.append(facts(spec))
    launchers = list(pool._launchers.values())
    (base,) = {launcher.base for launcher in launchers}
    assert [fact["overlay"] for fact in seen] == ["a", "b", "c"]
    assert [fact["imported_by"] for fact in seen] == [launchers[0].pid, base.pid, base.pid]
    assert base.preloaded and "vllm" not in base.modules and "tests.helpers.warm_imports" in base.modules


def test_a_base_whose_library_asked_for_vllm_forks_nothing_and_its_servers_start_cold(
    tmp_path: Path, pool: WarmStarts, caplog: pytest.LogCaptureFixture
) -> None:
    """A library that imports vllm where it can (``try: import vllm``) would keep "no vllm" from the base, which may not
    import it: the base forks no launcher once it has, and the later server starts cold, with its vllm."""
    specs = []
    for name in ("a", "b"):
        root = tmp_path / f"overlay-{name}"
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "__init__.py").write_text(f"WHERE = {name!r}\n")
        (root / MANIFEST).write_text("{}\n")
        env = {"WARM_TEST_OVERLAY": "1", "WARM_TEST_OPTIONAL": "1", "PYTHONPATH": f"{root}:{PYTHONPATH}"}
        specs.append(warm_spec(tmp_path, name, **env))
    with running(server(specs[0], pool)) as first:
        assert facts(specs[0])["imported_by"] != first.pid  # warm
    with running(server(specs[1], pool)) as second:
        fact = facts(specs[1])
    assert fact["imported_by"] == second.pid and (fact["overlay"], fact["optional"]) == ("b", True)  # cold, its own
    assert "a library asked for vllm while the base imported the libraries" in caplog.text  # specwake's warning


def test_a_launcher_with_servers_still_to_come_outlives_an_idle_one_used_more_recently(tmp_path: Path) -> None:
    """Two launchers at most: a, then b, then c needs one retired. `a` has a server still to come (expect) and `b`
    none, so b goes, though a is the least recently used; a's next server is forked from the launcher that made its
    imports. Without `expect`, a would go (least recently used) and import again."""
    pool = WarmStarts(limit=2)
    try:
        specs = {name: warm_spec(tmp_path, name, WARM_TEST_VALUE=name) for name in ("a", "b", "c", "a2")}
        specs["a2"] = replace(specs["a2"], env={**specs["a2"].env, "WARM_TEST_VALUE": "a"})
        keys = {name: launcher_key(spec.argv, spec.env) for name, spec in specs.items()}
        assert keys["a"] == keys["a2"] and len(set(keys.values())) == 3
        pool.expect(keys[name] for name in ("a", "b", "c", "a2"))
        imported = {}
        for name in ("a", "b", "c", "a2"):
            with running(server(specs[name], pool)):
                imported[name] = facts(specs[name])["imported_by"]
        assert imported["a2"] == imported["a"]  # the same launcher: no second import
        assert len(launcher_pids(pool)) == 2
    finally:
        pool.close()


def test_a_launcher_whose_imports_start_a_thread_forks_nothing_and_its_servers_start_cold(
    tmp_path: Path, pool: WarmStarts
) -> None:
    spec = warm_spec(tmp_path, "threaded", WARM_TEST_THREAD="1")
    with running(server(spec, pool)) as cold:
        fact = facts(spec)
        assert fact["imported_by"] == fact["pid"] == cold.pid  # its own imports: a cold start
    assert "warm start" not in spec.log_path.read_text()
    (log,) = (tmp_path / "logs").glob("warm-launcher-*.log")
    assert log.exists()


def test_warm_starts_switched_off_start_every_server_cold(
    tmp_path: Path, pool: WarmStarts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SWITCH, "0")
    spec = warm_spec(tmp_path, "cold")
    with running(server(spec, pool)) as cold:
        assert facts(spec)["imported_by"] == cold.pid
    assert not launcher_pids(pool)


def test_a_server_whose_launcher_died_still_stops_and_the_next_starts_cold(tmp_path: Path, pool: WarmStarts) -> None:
    orphan = warm_spec(tmp_path, "orphan")
    with running(server(orphan, pool)) as first:
        (launcher,) = launcher_pids(pool)
        os.kill(launcher, signal.SIGKILL)
        assert httpx.get(f"{first.base_url}/health").status_code == 200  # the server lives on, in its own session
        later = warm_spec(tmp_path, "later")
        with running(server(later, pool)) as second:
            assert facts(later)["imported_by"] == second.pid
    assert first.returncode() == LOST  # its launcher is not there to report its code
    assert start_ticks(first.pid or 0) is None


def test_a_launcher_exits_when_the_specwake_that_started_it_dies(tmp_path: Path) -> None:
    program = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from specwake.run.server.warm import WarmStarts\n"
        "argv = [sys.executable, '-m', 'tests.helpers.warm_server']\n"
        f"env = {{'PATH': os.environ['PATH'], 'PYTHONPATH': {PYTHONPATH!r}}}\n"
        f"launcher = WarmStarts().launcher(argv, env, Path({str(tmp_path)!r}))\n"
        "print(launcher.pid, flush=True)\n"
        "os._exit(0)\n"  # no atexit, no close: as a killed specwake leaves it
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=REPO)
    launcher = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while start_ticks(launcher) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert start_ticks(launcher) is None
