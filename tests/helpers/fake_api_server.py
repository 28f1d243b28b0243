"""The fake engine's `vllm.entrypoints.openai.api_server` (see tests/helpers/fakeengine.py): accept vLLM's flags, record
this server's life for the tests, and serve tests/helpers/fake_server.py. Runs in the fake interpreter, whose wrapper
exports FAKE_ENGINE_ROOT (where the records go); the fake `vllm` package on its path decides the drafter's behaviour.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import fake_server  # type: ignore[import-not-found]  # a sibling file: the tests folder is on sys.path

ROOT = Path(os.environ["FAKE_ENGINE_ROOT"])


def record_launch() -> None:
    """One line per launch, with a hash of HF_TOKEN (tests check it reaches the server, never its value)."""
    token = os.environ.get("HF_TOKEN")
    token_sha = hashlib.sha256(token.encode()).hexdigest() if token is not None else "-"
    with open(ROOT / "launches.log", "a") as fh:
        fh.write(f"{os.getpid()} {time.time()} hf_token_sha256={token_sha} {shlex.join(sys.argv[1:])}\n")


def lifecycle(event: str, **fields: Any) -> None:
    """One JSON line per start / exit of this server (O_APPEND: lines of servers running at once never mix)."""
    line = json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields}) + "\n"
    fd = os.open(ROOT / "servers.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    lifecycle("exit", how="SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)  # die of the signal, exactly as without this handler


def main() -> None:
    from vllm import drafter_reload  # noqa: TID251  # the fake package's, or a patched overlay's copy

    record_launch()
    try:
        log = os.readlink("/proc/self/fd/1")  # specwake sends our output to logs/<variant>.log of the scenario
    except OSError:
        log = None
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    cpus = sorted(os.sched_getaffinity(0))
    lifecycle("start", cuda_visible_devices=devices, log=log, argv=sys.argv[1:], cpus=cpus)
    signal.signal(signal.SIGTERM, on_sigterm)  # fake_server's --ignore-sigterm replaces it, as it should
    atexit.register(lifecycle, "exit", how="exit")
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    known, _ignored = parser.parse_known_args()  # --dtype, --speculative-config, --seed, ... mean nothing here
    argv = ["--host", known.host, "--port", str(known.port), "--model", known.model]
    argv += ["--mode", os.environ.get("FAKE_VLLM_MODE", "ready")]
    argv += ["--al-after", "4.0" if drafter_reload.RELOADS_DRAFT else "1.0"]
    argv += shlex.split(os.environ.get("FAKE_VLLM_ARGS", ""))
    fake_server.main(argv)
