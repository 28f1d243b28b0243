"""A warm launcher: one process that imports a CPU server's code once (torch, vLLM, its HTTP stack: about 7 s of each
9 s start on a 2-core machine), then forks each server of the same interpreter, ``PYTHONPATH`` and environment from
that state. The fork runs the server module as ``python -m MODULE ARGS`` would, in a session of its own, with its own
environment, cores and log; the launcher reports its pid, and its exit code once it ends.

``python -m specwake.worker.warm MODULE REPLY_FD``: requests come as JSON lines on stdin
(``{"args": [...], "env": {...}, "log": PATH, "cpus": [...]}``, where env holds what differs from the launcher's
own environment, None for a variable to unset), answers go as JSON lines to REPLY_FD:
``{"ready": true, "import_s": S}`` once the imports are made (or ``{"ready": false, "why": ...}``), then
``{"started": PID}`` per request (or ``{"failed": why}``) and ``{"exited": PID, "code": CODE}`` as each server ends
(CODE as ``subprocess.Popen.returncode``: negative for a signal). It exits at end of input; servers it started keep
running, each held by its own watchdog (specwake.run.server.lifeline).

What is imported ahead: MODULE itself, for its side effects on the process (``specwake.worker.serve`` makes Triton
usable for vLLM first thing), and every module MODULE names in ``PRELOAD``. Both are then dropped from
``sys.modules`` (their dependencies stay), so that the fork runs them afresh, as a cold start does; runpy would warn
about a module it runs that is already imported. Only what an import does is shared: no model, no thread, no engine.
A launcher whose imports started a thread refuses to fork (a fork copies only the thread that forks, and a lock
another thread held would stay held in the child): its servers then start cold.

A fork inherits the process's settings of the moment of its imports. What a cold start sets after them is set again in
the fork, first thing: the variables its environment has otherwise (vLLM reads its variables when asked; what the
interpreter's own start or the imports added stays, as in a cold start), the cores, and torch's thread count,
which torch's OpenMP runtime chose from the cores the launcher had. Everything else a module reads once at import
(Triton's interpreter switch, vLLM's logging settings, OpenMP's variables) is the same by construction: specwake gives a
launcher only the servers whose environment is the launcher's own, the binding of threads to cores aside
(specwake.run.server.warm).

This module imports nothing of specwake's: it runs with the server's interpreter and ``PYTHONPATH``.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import select
import sys
import threading
import time
from typing import Any

REAP_S = 0.05  # how often ended servers are looked for between requests


def answer(fd: int, message: dict[str, Any]) -> None:
    """One JSON line to specwake."""
    os.write(fd, (json.dumps(message) + "\n").encode())


def forget(name: str) -> None:
    """Drop a module from ``sys.modules`` and from its package, as if it had not been imported."""
    sys.modules.pop(name, None)
    package, _, attribute = name.rpartition(".")
    if package in sys.modules and hasattr(sys.modules[package], attribute):
        delattr(sys.modules[package], attribute)


def import_ahead(name: str) -> None:
    """Import `name` for what it imports, then forget it; where importing its package imports it too, a cold start
    has it imported as well, and it stays."""
    package = name.rpartition(".")[0]
    if package:
        importlib.import_module(package)
    if name in sys.modules:
        return
    importlib.import_module(name)
    forget(name)


def preload(module: str) -> None:
    """MODULE and its ``PRELOAD`` imported ahead (see the module docstring)."""
    for name in getattr(importlib.import_module(module), "PRELOAD", ()):
        import_ahead(name)
    forget(module)


def serve_requests(requests: int, replies: int) -> dict[str, Any] | None:
    """Fork a server per request and report its start and its end. Returns in a fork only, with its request; None
    at end of input."""
    pending = b""
    while True:
        readable, _, _ = select.select([requests], [], [], REAP_S)
        if readable:
            data = os.read(requests, 1 << 16)
            if not data:
                return None
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                except OSError as exc:
                    answer(replies, {"failed": f"fork: {exc}"})
                    continue
                if pid == 0:
                    return request
                answer(replies, {"started": pid})
        report_ended(replies)


def report_ended(replies: int) -> None:
    """Reap every server that has ended and report its exit code."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        answer(replies, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def become(request: dict[str, Any], requests: int, replies: int) -> None:
    """In the fork: the server's session, input, log, environment, cores and threads, and its argv."""
    os.setsid()
    os.close(replies)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, requests)
    os.close(devnull)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    for name, value in request["env"].items():  # what differs from the launcher's own (None: unset)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    torch = sys.modules.get("torch")
    if torch is not None:  # OpenMP sized its pool by the launcher's cores, as a cold start's does by its own
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    sys.argv = [sys.argv[0], *request["args"]]


def main(argv: list[str]) -> int:
    module, replies = argv[0], int(argv[1])
    requests = sys.stdin.fileno()
    started = time.monotonic()
    preload(module)
    threads = threading.active_count()
    if threads > 1:
        names = ", ".join(thread.name for thread in threading.enumerate())
        answer(replies, {"ready": False, "why": f"its imports started {threads - 1} thread(s): {names}"})
        return 1
    gc.freeze()  # what the imports made is never walked by the collector again, here or in a fork (serve.py)
    answer(replies, {"ready": True, "import_s": round(time.monotonic() - started, 3)})
    request = serve_requests(requests, replies)
    if request is None:  # nothing to tidy: the imports' objects are frozen, and their teardown would only print
        os._exit(0)
    become(request, requests, replies)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
