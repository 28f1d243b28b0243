"""Warm starts of CPU servers: specwake's end of the warm launchers (specwake.worker.warm). A launcher imports a
server's code once and forks each server from there, so a CPU server skips the imports that are most of its start.

One launcher serves the servers of one interpreter, module and environment (``PYTHONPATH`` included: a patched
variant's overlay is a launcher of its own), the binding of threads to cores aside, which vLLM's worker reads when it
starts. It is started when the first such server starts (that server waits for the imports, as a cold start does) and
kept for the next ones, up to LAUNCHERS at a time: an idle one whose servers have all come goes first (a run says which
are to come: `WarmStarts.expect`), then the least recently used idle one. A launcher that cannot
start, or refuses to fork, is noted and its servers start cold; ``SPECWAKE_WARM_START=0`` in specwake's environment
starts every server cold.

A launcher is forked from a base (class Base): one per interpreter, module and environment with the overlays left out
of ``PYTHONPATH``, started with the first of its launchers. The first launchers of a base import everything, as a cold
start would, and the first of them tells the base which modules that made; the base then imports those that no
overlay replaces (all but vLLM) before its next fork, so each later launcher imports vLLM alone: about 1 s against
7 s on a 2-core machine. The shared e2e run has 33 launchers and few bases; each of its patched variants used to pay
the whole import.

A server forked by a launcher is a child of the launcher, not of specwake: `WarmProcess` gives specwake what it asks of
a ``subprocess.Popen`` (pid, poll, wait), from the exit codes the launcher reports. The server's session, process
group, watchdog and record are a cold server's (server.py). A launcher exits at end of its input: when specwake closes
it, or dies.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from specwake.prepare.overlay import MANIFEST, PACKAGE
from specwake.run.server.groups import start_ticks

log = logging.getLogger(__name__)

LAUNCHER_MODULE = "specwake.worker.warm"
SWITCH = "SPECWAKE_WARM_START"
PER_SERVER = frozenset({"VLLM_CPU_OMP_THREADS_BIND"})  # read by vLLM's CPU worker when it starts, not at import
LAUNCHERS = 8  # live at once, at most (each holds about 0.6 GB: torch and vLLM imported, mostly shared with its base)
READY_TIMEOUT_S = 300.0  # for a launcher's imports, as long as a server's start may take
ANSWER_TIMEOUT_S = 30.0  # for a fork
CLOSE_TIMEOUT_S = 5.0
LOST = 255  # the exit code of a server whose launcher died before it: nobody is left to report the real one
Key = tuple[str, str, tuple[tuple[str, str], ...]]


class LauncherFailed(Exception):
    """A launcher that cannot start or fork: its servers start cold."""


def launcher_key(argv: list[str], env: Mapping[str, str]) -> Key:
    """What a launcher has in common with the servers it forks: interpreter, module (``python -m MODULE``) and the
    environment of its imports."""
    return argv[0], argv[2], tuple(sorted((k, v) for k, v in env.items() if k not in PER_SERVER))


def changes(own: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """What a fork must set to turn environment `own` into `wanted` (None: unset)."""
    return {name: wanted.get(name) for name in own.keys() | wanted.keys() if wanted.get(name) != own.get(name)}


def base_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a launcher's base: the launcher's, without the overlays on ``PYTHONPATH`` (specwake's
    patched vLLMs, specwake.prepare.overlay: a folder that holds its manifest)."""
    shared = dict(env)
    if "PYTHONPATH" in env:
        entries = env["PYTHONPATH"].split(os.pathsep)
        shared["PYTHONPATH"] = os.pathsep.join(e for e in entries if not (e and Path(e, MANIFEST).is_file()))
    return shared


def base_key(argv: list[str], env: Mapping[str, str]) -> Key:
    """What the launchers of one base have in common: their key, overlays aside."""
    return launcher_key(argv, base_env(env))


class WarmProcess:
    """A server forked by a launcher, as server.Server uses a Popen."""

    def __init__(self, launcher: Launcher, pid: int) -> None:
        self.launcher = launcher
        self.pid = pid

    def poll(self) -> int | None:
        return self.launcher.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once the launcher has reported it; subprocess.TimeoutExpired after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"server pid {self.pid}", timeout or 0.0)
            self.launcher.wait_for_news(0.05)
        return code


class Peer:
    """A base or a launcher: a process specwake starts once (`start`; `_start` and `_running` say how) and closes, and
    whose JSON answers a thread of its own reads until it exits: answers in order, and the exit codes of the servers a
    launcher forked."""

    def __init__(self) -> None:
        self.failure: str | None = None
        self._news = threading.Condition()
        self._answers: list[dict[str, Any]] = []
        self._codes: dict[int, int] = {}
        self._gone = False
        self._start_lock = threading.Lock()

    def _running(self) -> bool:
        raise NotImplementedError

    def _start(self, cpus: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _gone_why(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def start(self, cpus: tuple[int, ...] = ()) -> None:
        """Start it, once, held to `cpus` (the cores of the server that needs it first: its imports take that server's
        cores, as its own cold start would, and leave a neighbour's measurement alone), and wait until it is ready;
        LauncherFailed (then and at every later call) when it cannot."""
        with self._start_lock:
            if self.failure is not None:
                raise LauncherFailed(self.failure)
            if self._running():
                return
            try:
                self._start(cpus)
            except LauncherFailed as exc:
                self.failure = str(exc)
                self.close()
                raise

    def _read(self, answers: IO[bytes]) -> None:
        """The reader thread: every answer and exit code the process writes, until it exits."""
        with answers, contextlib.suppress(OSError, ValueError):
            for line in answers:
                message = json.loads(line)
                with self._news:
                    if "exited" in message:
                        self._codes[int(message["exited"])] = int(message["code"])
                    else:
                        self._answers.append(message)
                    self._news.notify_all()
        with self._news:
            self._gone = True
            self._news.notify_all()

    def _next_answer(self, timeout: float) -> dict[str, Any]:
        with self._news:
            if not self._news.wait_for(lambda: self._answers or self._gone, timeout):
                return {"why": f"no answer within {timeout:g} s"}
            if self._answers:
                return self._answers.pop(0)
        return {"why": self._gone_why()}


class Base(Peer):
    """One base process (specwake.worker.warm): the launchers of one interpreter, module and environment,
    ``PYTHONPATH``'s overlays aside, are its forks (branches). Once a branch has told which modules its imports made,
    the base imports those no overlay can replace before its next fork, so that a later branch imports vLLM alone."""

    def __init__(self, python: str, module: str, env: Mapping[str, str], log_path: Path) -> None:
        super().__init__()
        self.python, self.module = python, module
        self.env = dict(env)
        self.log_path = log_path
        self.modules: list[str] | None = None  # what a branch's imports made, once one has told
        self.added: dict[str, str] = {}  # the environment variables they set
        self.preloaded = False  # whether the base has imported them
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._branch_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _running(self) -> bool:
        return self._proc is not None

    def _start(self, cpus: tuple[int, ...]) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.log_path, "ab") as out:
                self._proc = subprocess.Popen(
                    [self.python, "-m", LAUNCHER_MODULE, self.module, str(theirs.fileno())],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,  # a Ctrl-C reaches specwake alone, which closes it
                )
            if cpus:
                os.sched_setaffinity(self._proc.pid, cpus)
        except OSError as exc:
            mine.close()
            raise LauncherFailed(f"cannot launch {self.python!r}: {exc}") from exc
        finally:
            theirs.close()
        self._sock = mine
        threading.Thread(target=self._read, args=(mine.makefile("rb"),), daemon=True).start()
        ready = self._next_answer(READY_TIMEOUT_S)
        if not ready.get("ready"):
            raise LauncherFailed(ready.get("why") or "no answer")

    def branch(
        self, env: Mapping[str, str], log_path: Path, cpus: tuple[int, ...], tell: bool
    ) -> tuple[int, IO[bytes], IO[bytes]]:
        """A launcher forked from the base, with `env` (its ``PYTHONPATH`` included), output appended to `log_path`,
        held to `cpus`, told to say what its imports made where `tell`: its pid, and the pipes to write its requests to
        and read its answers from."""
        differs = changes(self.env, env)
        differs.pop("PYTHONPATH", None)  # sent on its own: the branch places its overlays in the base's actual one
        with self._branch_lock:
            sock = self._sock
            if self.failure is not None or sock is None:
                raise LauncherFailed(self.failure or "its base is not running")
            request: dict[str, Any] = {
                "log": str(log_path),
                "env": differs,
                "pythonpath": {"base": self.env.get("PYTHONPATH", ""), "branch": env.get("PYTHONPATH", "")},
                "own": [PACKAGE],
                "tell": tell,
            }
            if not self.preloaded and self.modules is not None:
                request |= {"modules": self.modules, "added": self.added}
            requests_in, requests_out = os.pipe()
            replies_in, replies_out = os.pipe()
            try:
                pid = self.pid
                if cpus and pid is not None:  # the base imports the libraries, if it does, and the branch its vLLM,
                    os.sched_setaffinity(pid, cpus)  # on the server's cores
                data = (json.dumps({"branch": request}) + "\n").encode()
                sent = socket.send_fds(sock, [data], [requests_in, replies_out])
                sock.sendall(data[sent:])
            except OSError as exc:
                for fd in (requests_out, replies_in):
                    os.close(fd)
                self.failure = f"the base does not listen: {exc}"
                raise LauncherFailed(self.failure) from exc
            finally:
                os.close(requests_in)
                os.close(replies_out)
            answer = self._next_answer(READY_TIMEOUT_S)
            if "branched" not in answer:
                os.close(requests_out)
                os.close(replies_in)
                self.failure = answer.get("failed") or answer.get("why", "no answer")
                raise LauncherFailed(self.failure)
            if answer.get("preloaded") is not None:
                self.preloaded = True
                log.info("warm base pid %s imported the libraries in %.1f s", self.pid, answer["preloaded"])
        return int(answer["branched"]), os.fdopen(requests_out, "wb"), os.fdopen(replies_in, "rb")

    def learn(self, modules: list[str], added: dict[str, str]) -> None:
        """What a branch's imports made, for the base to import before its next fork."""
        with self._branch_lock:
            if self.modules is None:
                self.modules, self.added = modules, added

    def close(self) -> None:
        """End of input: the base exits (its branches live on, each until its own input ends)."""
        sock, proc = self._sock, self._proc
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if proc is None:
            return
        try:
            proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _gone_why(self) -> str:
        code = self._proc.poll() if self._proc is not None else None
        return f"the base exited (code {code}); its log: {self.log_path}"


class Launcher(Peer):
    """One warm launcher, a branch of its base: started by `start`, forks a server per `fork`, closed by `close`."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path, base: Base) -> None:
        super().__init__()
        self.python, self.module = argv[0], argv[2]
        self.env = dict(env)
        self.log_path = log_path
        self.base = base
        self.import_s: float | None = None
        self._pid: int | None = None
        self._requests: IO[bytes] | None = None
        self._forked: set[int] = set()
        self._fork_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._pid

    def _running(self) -> bool:
        return self._pid is not None

    def _start(self, cpus: tuple[int, ...]) -> None:
        self.base.start(cpus)
        tell = self.base.modules is None
        self._pid, self._requests, replies = self.base.branch(self.env, self.log_path, cpus, tell)
        threading.Thread(target=self._read, args=(replies,), daemon=True).start()
        ready = self._next_answer(READY_TIMEOUT_S)
        if not ready.get("ready"):
            raise LauncherFailed(ready.get("why", "no answer"))
        self.import_s = ready.get("import_s")
        if "modules" in ready:
            self.base.learn(ready["modules"], ready.get("added", {}))
        log.info("warm launcher pid %d ready after %.1f s of imports, log %s", self._pid, self.import_s, self.log_path)

    def fork(self, args: list[str], env: Mapping[str, str], log_path: Path, cpus: tuple[int, ...]) -> WarmProcess:
        """A server forked from the launcher: ``python -m MODULE *args`` with `env`, output appended to `log_path`,
        held to `cpus`."""
        differs = changes(self.env, env)
        request = {"args": args, "env": differs, "log": str(log_path), "cpus": list(cpus)}
        with self._fork_lock:
            started = self._ask(request)
        if "started" not in started:
            raise LauncherFailed(started.get("failed") or started.get("why", "no answer"))
        pid = int(started["started"])
        with self._news:
            self._forked.add(pid)
        return WarmProcess(self, pid)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request and take its answer; a launcher that no longer listens is marked failed (its next
        servers start cold)."""
        requests = self._requests
        if self.failure is not None or requests is None or requests.closed:
            return {"why": self.failure or "the launcher is not running"}
        try:
            requests.write((json.dumps(request) + "\n").encode())
            requests.flush()
        except OSError as exc:
            self.failure = f"the launcher does not listen: {exc}"
            return {"why": self.failure}
        answer = self._next_answer(ANSWER_TIMEOUT_S)
        if "started" not in answer and "failed" not in answer:
            self.failure = answer.get("why", "no answer")
        return answer

    def exit_code(self, pid: int) -> int | None:
        """A forked server's exit code; None while it runs."""
        with self._news:
            if pid in self._codes:
                return self._codes[pid]
            gone = self._gone
        if gone and start_ticks(pid) is None:
            return LOST
        return None

    def wait_for_news(self, timeout: float) -> None:
        with self._news:
            self._news.wait(timeout)

    def idle(self) -> bool:
        """Whether every server it forked has ended."""
        with self._news:
            return self._forked <= self._codes.keys()

    def close(self) -> None:
        """End of input: the launcher exits (the servers it forked are stopped by specwake, or by their watchdogs).
        Its answers end when it has: killed if they have not within CLOSE_TIMEOUT_S."""
        requests = self._requests
        if requests is None:
            return
        with contextlib.suppress(OSError):
            requests.close()
        with self._news:
            ended = self._news.wait_for(lambda: self._gone, CLOSE_TIMEOUT_S)
        if not ended and self._pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)

    def _gone_why(self) -> str:
        return f"the launcher exited; its log: {self.log_path}"


class WarmStarts:
    """The launchers of one specwake process, by key (`launcher_key`)."""

    def __init__(self, limit: int = LAUNCHERS) -> None:
        self.limit = limit
        self._launchers: OrderedDict[Key, Launcher] = OrderedDict()
        self._bases: OrderedDict[Key, Base] = OrderedDict()
        self._ahead: Counter[Key] = Counter()  # servers still to come, by launcher (expect)
        self._lock = threading.Lock()
        self._made = 0

    def expect(self, keys: Iterable[Key]) -> None:
        """The launchers of the servers a run is about to start, one key per server: a launcher none of whose servers is
        left to come is retired before one that has some (then the least recently used). In key order, the shared e2e
        run's stock V2 servers came back after eight other kinds: the least recently used rule retired their launcher
        in between, and the next one imported again."""
        with self._lock:
            self._ahead.update(keys)

    def launcher(
        self, argv: list[str], env: Mapping[str, str], log_dir: Path, cpus: tuple[int, ...] = ()
    ) -> Launcher | None:
        """The started launcher for a server of `argv` and `env` (started now, held to the server's `cpus`, if it is
        the first); None where its servers start cold."""
        if os.environ.get(SWITCH) == "0":
            return None
        key = launcher_key(argv, env)
        with self._lock:
            if self._ahead[key] > 0:
                self._ahead[key] -= 1
            launcher = self._launchers.get(key)
            if launcher is None:
                self._made += 1
                base = self._base(argv, env, log_dir)
                launcher = Launcher(argv, env, log_dir / f"warm-launcher-{os.getpid()}-{self._made}.log", base)
                self._launchers[key] = launcher
                retired: list[Launcher | Base] = [*self._retire(), *self._retire_bases()]
            else:
                retired = []
            self._launchers.move_to_end(key)
        for old in retired:
            old.close()
        if launcher.failure is not None:  # said when it failed
            return None
        try:
            launcher.start(cpus)
        except LauncherFailed as exc:
            log.warning("servers of %s start cold: their warm launcher failed: %s", argv[2], exc)
            return None
        return launcher

    def _retire(self) -> list[Launcher]:
        """Idle launchers beyond the limit, taken out of the pool (called locked): first those with no server left to
        come (expect), then the others, each the least recently used first."""
        retired: list[Launcher] = []
        older = list(self._launchers)[:-1]  # the newest is the one just asked for
        for key in sorted(older, key=lambda k: self._ahead[k] > 0):  # stable: least recently used first within each
            if len(self._launchers) <= self.limit:
                break
            if self._launchers[key].idle():
                retired.append(self._launchers.pop(key))
        return retired

    def _base(self, argv: list[str], env: Mapping[str, str], log_dir: Path) -> Base:
        """The base of a launcher of `argv` and `env`, made now if it is the first (called locked)."""
        key = base_key(argv, env)
        base = self._bases.get(key)
        if base is None:
            base = Base(argv[0], argv[2], base_env(env), log_dir / f"warm-base-{os.getpid()}-{self._made}.log")
            self._bases[key] = base
        self._bases.move_to_end(key)
        return base

    def _retire_bases(self) -> list[Base]:
        """Bases beyond the launchers' limit that no launcher of the pool branched from (called locked), the least
        recently used first: their branches live on without them."""
        used = {id(launcher.base) for launcher in self._launchers.values()}
        retired: list[Base] = []
        for key in list(self._bases):
            if len(self._bases) <= self.limit:
                break
            if id(self._bases[key]) not in used:
                retired.append(self._bases.pop(key))
        return retired

    def close(self) -> None:
        """Every launcher and base closed (at specwake's exit)."""
        with self._lock:
            launchers, self._launchers = list(self._launchers.values()), OrderedDict()
            bases, self._bases = list(self._bases.values()), OrderedDict()
        for launcher in launchers:
            launcher.close()
        for base in bases:
            base.close()


WARM_STARTS = WarmStarts()
atexit.register(WARM_STARTS.close)
