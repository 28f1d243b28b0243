"""specwake's server launcher (specwake/worker/serve.py) against the way vLLM runs it: a package laid out like vLLM,
whose `vllm.entrypoints.openai.api_server` starts a child with multiprocessing's spawn, as vLLM's CPU platform starts
the engine core. Run as `-m` the server module is imported again in the child; through the launcher it is not, and the
module still runs as the program with its own arguments.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

SERVER = """
import multiprocessing
import sys

from vllm.engine_core import run_engine_core

print("server argv:", sys.argv[1:], flush=True)
if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    child = context.Process(target=run_engine_core, args=(answers,))
    child.start()
    print("engine core imported the server module:", answers.get(timeout=60), flush=True)
    child.join()
"""

ENGINE_CORE = """
import sys


def run_engine_core(answers):
    answers.put("vllm.entrypoints.openai.api_server" in sys.modules or "__mp_main__" in sys.modules
                and getattr(sys.modules["__mp_main__"], "__file__", "").endswith("api_server.py"))
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
    return root


def launch(module: str, site: Path) -> str:
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
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
