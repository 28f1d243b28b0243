"""A warm launcher forked from a base that imported the libraries ahead (specwake.run.server.warm, Base) leaves a
server's process as a cold start of it would, for a patched vLLM (an overlay of the reference fix) after a stock one:
the same modules (the launcher's own aside), environment, ``sys.path``, vLLM package, torch threads and torch compiler
settings. The base imports what the first launcher's imports made, vLLM excepted, in their order and with the
environment variables they set (vLLM sets TORCHINDUCTOR_COMPILE_THREADS before torch's compiler config is imported).
A launcher that imports everything itself (the first of its base) is the one every other warm server comes from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.procs import installed_vllm, launch_env, require_module

require_module("vllm")

from specwake.prepare.overlay import build_overlay  # noqa: E402
from specwake.run.server.warm import WarmStarts  # noqa: E402
from tests.helpers.paths import REPO  # noqa: E402

PATCH = REPO / "scenarios" / "patches" / "draft-reload.diff"
ARGV = [sys.executable, "-m", "tests.helpers.import_facts"]
LAUNCHER_MODULE = "specwake.worker.warm"


def read_facts(text: str) -> dict[str, Any]:
    line = next(ln for ln in text.splitlines() if ln.startswith("import-facts "))
    return dict(json.loads(line.removeprefix("import-facts ")))


def cold(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(ARGV, env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_facts(done.stdout)


def launcher_modules(env: dict[str, str]) -> set[str]:
    """What the launcher module imports of its own, beyond a cold start's imports."""
    program = f"import sys, {LAUNCHER_MODULE}; print('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    return set(done.stdout.split())


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Stock vLLM first (its launcher imports everything and says what), then the patched one, forked from the base
    once it has imported the libraries, warm and cold."""
    folder = tmp_path_factory.mktemp("warm-base")
    package, version = installed_vllm()
    overlay = build_overlay(PATCH, package, version, folder / "cache")
    common = {k: v for k, v in launch_env().items() if k != "PYTHONPATH"} | {"PYTHONUNBUFFERED": "1"}
    envs = {
        "stock": common | {"PYTHONPATH": str(REPO)},
        "patched": common | {"PYTHONPATH": f"{overlay.root}:{REPO}"},
    }
    pool = WarmStarts()
    found: dict[str, Any] = {"overlay": str(overlay.root)}
    try:
        for name, env in envs.items():
            launcher = pool.launcher(ARGV, env, folder / "logs")
            assert launcher is not None
            log = folder / "logs" / f"{name}.log"
            server = launcher.fork([], env, log, ())
            assert server.wait(timeout=180) == 0, log.read_text()[-3000:]
            found[name] = {"warm": read_facts(log.read_text()), "launcher": launcher}
        found["cold"] = cold(envs["patched"])
        found["own"] = launcher_modules(envs["stock"])
        yield found
    finally:
        pool.close()


def test_a_patched_vllm_forked_from_a_base_leaves_what_a_cold_start_leaves(seen: dict[str, Any]) -> None:
    warm, cold_start = seen["patched"]["warm"], seen["cold"]
    assert set(cold_start["modules"]) <= set(warm["modules"])
    assert set(warm["modules"]) - set(cold_start["modules"]) <= seen["own"]  # the launcher's own
    for fact in ("env", "sys_path", "vllm", "torch_threads", "inductor", "dynamo"):
        assert warm[fact] == cold_start[fact], fact
    assert warm["vllm"].startswith(seen["overlay"] + "/")
    assert not seen["stock"]["warm"]["vllm"].startswith(seen["overlay"] + "/")


def test_the_patched_launcher_was_forked_from_a_base_that_imported_the_libraries(seen: dict[str, Any]) -> None:
    base = seen["patched"]["launcher"].base
    assert seen["stock"]["launcher"].base is base
    assert base.preloaded
    assert "libraries imported in" in base.log_path.read_text()
    assert base.modules and not any(m == "vllm" or m.startswith("vllm.") for m in base.modules)
    assert "torch" in base.modules and "transformers" in base.modules
