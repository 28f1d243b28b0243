"""specwake's server launcher (specwake/worker/serve.py) against the way vLLM runs it: a package laid out like vLLM,
whose `vllm.entrypoints.openai.api_server` checks its config with a CPU platform that sets spawn over the environment's
start method (as vllm/platforms/cpu.py does), then starts its engine core with the start method the environment names
then, and reports whether the heap it inherited is frozen. Run as `-m` the server module is imported again by a spawned
child; through the launcher it is not, and the module still runs as the program with its own arguments. Through the
launcher a start method the environment asks for stands; without the launcher the platform's spawn wins. Its model
registry inspects a model class in a subprocess, as vLLM's does; through the launcher with SPECWAKE_INSPECT_IN_PROCESS=1
the inspection runs in the server's process, after vLLM's plugins are loaded. A forked engine core inherits a frozen
heap through the launcher (the garbage collector never walks the imported modules again), a spawned one does not
(nothing inherited).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwake.prepare.plan import INSPECT_IN_PROCESS, START_METHOD, TRITON_INTERPRET, TRITON_ON_CPU
from tests.helpers.paths import REPO

SERVER = """
import multiprocessing
import os
import sys

from vllm.engine_core import run_engine_core
from vllm.platforms.cpu import CpuPlatform

print("server argv:", sys.argv[1:], flush=True)
if __name__ == "__main__":
    from vllm.model_executor.models import registry

    print("model inspected in:", registry.inspect_model_cls(), flush=True)
    CpuPlatform().check_and_update_config(None)
    method = os.environ["VLLM_WORKER_MULTIPROC_METHOD"]
    print("engine core started by:", method, flush=True)
    context = multiprocessing.get_context(method)
    answers = context.Queue()
    child = context.Process(target=run_engine_core, args=(answers,))
    child.start()
    print("engine core imported the server module:", answers.get(timeout=60), flush=True)
    print("engine core's inherited heap frozen:", answers.get(timeout=60), flush=True)
    child.join()
"""

ENGINE_CORE = """
import gc
import sys


def run_engine_core(answers):
    answers.put("vllm.entrypoints.openai.api_server" in sys.modules or "__mp_main__" in sys.modules
                and getattr(sys.modules["__mp_main__"], "__file__", "").endswith("api_server.py"))
    answers.put(gc.get_freeze_count() > 0)
"""

PLATFORM = """
import os


class CpuPlatform:
    @classmethod
    def check_and_update_config(cls, vllm_config):
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
"""

# vllm/model_executor/models/registry.py: the inspection function handed to `_run_in_subprocess`, which runs it in
# another interpreter (here: answers from one, without running the function)
REGISTRY = """
import os
import subprocess
import sys


def inspect_model_cls():
    from vllm import plugins

    return _run_in_subprocess(lambda: f"server process {os.getpid() == SERVER_PID}, plugins loaded {plugins.loaded}")


def _run_in_subprocess(fn):
    answer = subprocess.run([sys.executable, "-c", "print('a subprocess')"], capture_output=True, text=True)
    return answer.stdout.strip()


SERVER_PID = os.getpid()
"""

PLUGINS = """
loaded = False


def load_general_plugins():
    global loaded
    loaded = True
"""


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    server = root / "vllm" / "entrypoints" / "openai" / "api_server.py"
    server.parent.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", server.parent):
        (folder / "__init__.py").write_text("")
    server.write_text(SERVER)
    (root / "vllm" / "engine_core.py").write_text(ENGINE_CORE)
    (root / "vllm" / "platforms").mkdir()
    (root / "vllm" / "platforms" / "__init__.py").write_text("")
    (root / "vllm" / "platforms" / "cpu.py").write_text(PLATFORM)
    models = root / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    for folder in (models.parent, models):
        (folder / "__init__.py").write_text("")
    (models / "registry.py").write_text(REGISTRY)
    (root / "vllm" / "plugins").mkdir()
    (root / "vllm" / "plugins" / "__init__.py").write_text(PLUGINS)
    return root


def launch(module: str, site: Path, method: str | None = None, inspect: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (START_METHOD, INSPECT_IN_PROCESS)}
    env.update({"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}, **({START_METHOD: method} if method else {}))
    env.update({INSPECT_IN_PROCESS: inspect} if inspect else {})
    proc = subprocess.run(
        [sys.executable, "-m", module, "--port", "8000"],
        env=env, capture_output=True, text=True, timeout=120, cwd=site,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_run_as_main_the_server_module_is_imported_again_by_its_engine_core(fake_vllm: Path) -> None:
    out = launch("vllm.entrypoints.openai.api_server", fake_vllm)
    assert "engine core imported the server module: True" in out, out


def test_through_the_launcher_the_module_runs_as_the_program_and_its_engine_core_skips_it(fake_vllm: Path) -> None:
    out = launch("specwake.worker.serve", fake_vllm)
    assert "server argv: ['--port', '8000']" in out, out  # the module's own arguments, as under -m
    assert "engine core imported the server module: False" in out, out
    assert "engine core started by: spawn" in out, out  # no method asked: the platform's


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_through_the_launcher_the_start_method_asked_stands_over_the_platforms(fake_vllm: Path, method: str) -> None:
    out = launch("specwake.worker.serve", fake_vllm, method)
    assert f"engine core started by: {method}" in out, out
    assert "engine core imported the server module: False" in out, out


@pytest.mark.parametrize(("method", "frozen"), [("fork", True), ("spawn", False)])
def test_through_the_launcher_a_forked_engine_core_inherits_a_frozen_heap(
    fake_vllm: Path, method: str, frozen: bool
) -> None:
    out = launch("specwake.worker.serve", fake_vllm, method)
    assert f"engine core's inherited heap frozen: {frozen}" in out, out


def test_without_the_launcher_the_platform_sets_spawn_over_the_fork_asked(fake_vllm: Path) -> None:
    out = launch("vllm.entrypoints.openai.api_server", fake_vllm, "fork")
    assert "engine core started by: spawn" in out, out


@pytest.mark.parametrize(
    ("inspect", "where"), [("1", "server process True, plugins loaded True"), ("0", "a subprocess")]
)
def test_through_the_launcher_model_classes_are_inspected_where_the_environment_says(
    fake_vllm: Path, inspect: str, where: str
) -> None:
    out = launch("specwake.worker.serve", fake_vllm, inspect=inspect)
    assert f"model inspected in: {where}" in out, out


def test_without_the_launcher_model_classes_are_inspected_in_a_subprocess(fake_vllm: Path) -> None:
    out = launch("vllm.entrypoints.openai.api_server", fake_vllm, inspect="1")
    assert "model inspected in: a subprocess" in out, out


def test_the_launcher_gives_triton_a_cpu_entry_only_when_asked() -> None:
    """The launcher module's import runs the Triton entry (a spawned engine core imports it as its main module)."""
    program = (
        "import specwake.worker.serve, triton.backends as b, os;"
        "print('cpu' in b.backends, os.environ.get('TRITON_INTERPRET'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in (TRITON_ON_CPU, TRITON_INTERPRET)}
    off = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True)
    on = subprocess.run(
        [sys.executable, "-c", program], env=env | {TRITON_ON_CPU: "1"}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    assert off.stdout.split() == ["False", "None"]
    assert on.stdout.split() == ["True", "1"]
