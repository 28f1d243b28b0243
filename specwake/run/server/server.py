"""One vLLM server's lifetime as a context manager: start it in its own process group, tied to specwake by a
watchdog (lifeline.py) and recorded in specwake's cache (leftovers.py), wait until /health answers, stop the whole
group (SIGTERM, then SIGKILL), keep its log."""

from __future__ import annotations

import functools
import logging
import os
import shlex
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import httpx

from specwake.errors import StartupFailed
from specwake.prepare.plan import REDACTED, redact_env
from specwake.run.server.groups import end_group, group_rss_bytes, live_group_members
from specwake.run.server.leftovers import ServerRecord, forget, remember
from specwake.run.server.lifeline import Lifeline
from specwake.run.server.warm import WARM_STARTS, LauncherFailed, WarmProcess, WarmStarts

log = logging.getLogger(__name__)

_TAIL_BYTES = 256 * 1024
REAP_TIMEOUT_S = 1.0  # for the exit code of a stopped server (a warm one's comes from its launcher)

# A cold server is specwake's child; a warm one its launcher's, whose exit code the launcher reports (warm.py)
ServerProcess = subprocess.Popen[bytes] | WarmProcess


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def local_client(base_url: str = "") -> httpx.Client:
    """An HTTP client for a server of this machine: the environment's proxies ignored, and one TLS context for all
    such clients, made once. httpx makes one for every client otherwise, loading certifi's CA bundle: about 50 ms,
    twice for each server a run starts (its readiness poll, its measurement), 1.5 CPU-seconds of a run of the three
    CPU family scenarios. The servers speak plain HTTP, so the context is never used."""
    return httpx.Client(base_url=base_url, trust_env=False, verify=_tls_context())


@dataclass(frozen=True)
class ServerSpec:
    """Everything needed to launch one server; the caller builds argv and the full env."""

    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    startup_timeout_s: float
    host: str = "127.0.0.1"
    # CPU cores the whole server is confined to (empty: no limit). Set right after launch, before the server
    # starts any process or thread, so every process and thread of it inherits the limit.
    cpus: tuple[int, ...] = ()
    # Where the server's record lies while it runs, so that a later run finds it if this one dies with it and its
    # watchdog (leftovers.registry_dir of specwake's cache); None: not recorded.
    registry: Path | None = None
    # False: another node's headless engines (server.nodes), no HTTP server: ready while it runs
    http: bool = True
    # True: forked from a warm launcher that has made its imports (warm.py), where one can start: argv is
    # ``python -m MODULE ...`` of a CPU server (plan.warm_startable)
    warm: bool = False


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago on ``host`` (bind to port 0 and release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_header(spec: ServerSpec, now: datetime) -> str:
    """The lines written to the log before the server's own output."""
    env = " ".join(f"{k}={v if v == REDACTED else shlex.quote(v)}" for k, v in sorted(redact_env(spec.env).items()))
    started = now.isoformat(timespec="milliseconds")
    return f"# specwake: server start {started}\n# argv: {shlex.join(spec.argv)}\n# env: {env}\n"


def describe_exit(code: int) -> str:
    """Human wording of a Popen return code (negative = killed by a signal)."""
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def tail_lines(data: bytes, lines: int) -> str:
    """The last ``lines`` lines of ``data``, decoded leniently."""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:]) if lines > 0 else ""


class Server:
    """A server process group: start() launches it, wait_ready() waits for /health, stop() always ends it."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        poll_interval_s: float = 0.25,
        grace_s: float = 10.0,
        warm_starts: WarmStarts = WARM_STARTS,
    ) -> None:
        self.spec = spec
        self.warm_starts = warm_starts
        self.poll_interval_s = poll_interval_s
        self.grace_s = grace_s
        self.base_url = f"http://{spec.host}:{spec.port}"
        self._proc: ServerProcess | None = None
        self._log_file: IO[bytes] | None = None
        self._lifeline: Lifeline | None = None
        self._record: Path | None = None
        self._stopped = False

    @property
    def warm(self) -> bool:
        """Whether it was forked from a warm launcher (warm.py), not started cold."""
        return isinstance(self._proc, WarmProcess)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        # start_new_session makes the child a session and group leader: pgid == pid.
        return self.pid

    def start(self) -> None:
        """Launch the server in a new session, output appended to the log file, then its watchdog and record."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(spec.log_path, "ab")  # closed in stop()
        self._log_file.write(log_header(spec, datetime.now(timezone.utc)).encode())
        self._log_file.flush()
        try:
            self._proc = self._fork_warm() if spec.warm else None
            if self._proc is None:
                self._proc = self._launch_cold()
        except OSError as exc:
            self._log_file.close()
            self._log_file = None
            raise StartupFailed(f"cannot launch {spec.argv[0]!r}: {exc}") from exc
        self._tie(self._proc.pid)
        log.info("started server pid %d on %s, log %s", self._proc.pid, self.base_url, spec.log_path)

    def _launch_cold(self) -> subprocess.Popen[bytes]:
        """The server as a process of its own: its interpreter imports everything (OSError when it cannot run)."""
        spec = self.spec
        proc = subprocess.Popen(
            spec.argv,
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if spec.cpus:
            try:
                os.sched_setaffinity(proc.pid, spec.cpus)
            except OSError as exc:  # gone already: wait_ready reports how it exited
                log.warning("cannot confine server pid %d to cores %s: %s", proc.pid, spec.cpus, exc)
        return proc

    def _fork_warm(self) -> WarmProcess | None:
        """The server forked from its warm launcher, which holds it to its cores itself; None where it starts cold
        (no launcher for it, or the launcher failed: warm.py says so in specwake's log)."""
        spec = self.spec
        launcher = self.warm_starts.launcher(spec.argv, spec.env, spec.log_path.parent, spec.cpus)
        if launcher is None or self._log_file is None:
            return None
        self._log_file.write(
            f"# warm start: forked from launcher pid {launcher.pid}, whose imports took {launcher.import_s} s"
            f" (its log: {launcher.log_path.name}; its base: pid {launcher.base.pid})\n".encode()
        )
        self._log_file.flush()
        try:
            return launcher.fork(spec.argv[3:], spec.env, spec.log_path, spec.cpus)
        except LauncherFailed as exc:
            self._log_file.write(f"# warm start failed ({exc}): started cold\n".encode())
            self._log_file.flush()
            log.warning("server on %s starts cold: its warm launcher failed: %s", self.base_url, exc)
            return None

    def _tie(self, pgid: int) -> None:
        """The group's watchdog, which stops it if specwake dies, and its record for a later run, in case the
        watchdog dies too. A server that cannot have a watchdog is stopped: nothing would stop it after a crash."""
        try:
            self._lifeline = Lifeline.attach(pgid, self.grace_s, self._log_file)
        except OSError as exc:
            self.stop()
            raise StartupFailed(f"cannot start the watchdog of server pid {pgid}: {exc}") from exc
        registry = self.spec.registry
        record = ServerRecord.of(pgid, self.spec.port, self.spec.log_path, self._lifeline.pid) if registry else None
        if registry is not None and record is not None:
            self._record = remember(registry, record)

    def wait_ready(self, watch: Callable[[], None] | None = None) -> float:
        """Poll GET /health until it answers 200; return the seconds waited. `watch` is called between polls (it
        raises StartupFailed when a process the server waits for has exited).

        Raises StartupFailed as soon as the process exits, or when startup_timeout_s passes.
        """
        proc = self._require_proc()
        if not self.spec.http:
            self._check_running(proc, time.monotonic())
            return 0.0
        url = f"{self.base_url}/health"
        started = time.monotonic()
        deadline = started + self.spec.startup_timeout_s
        last = "no answer"
        with local_client() as client:
            while True:
                self._check_running(proc, started)
                if watch is not None:
                    watch()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    response = client.get(url, timeout=max(0.1, min(5.0, remaining)))
                    if response.status_code == 200:
                        return time.monotonic() - started
                    last = f"HTTP {response.status_code}"
                except httpx.TransportError as exc:
                    last = type(exc).__name__
                time.sleep(max(0.0, min(self.poll_interval_s, deadline - time.monotonic())))
        waited = time.monotonic() - started
        raise StartupFailed(
            f"server at {url} not ready after {waited:.1f} seconds (last answer: {last}); log: {self.spec.log_path}",
            self.log_tail(),
        )

    def _check_running(self, proc: ServerProcess, started: float) -> None:
        code = proc.poll()
        if code is not None:
            waited = time.monotonic() - started
            raise StartupFailed(
                f"server {describe_exit(code)} before ready ({waited:.1f} seconds after "
                f"launch, code {code}); log: {self.spec.log_path}",
                self.log_tail(),
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited_within(self, timeout_s: float) -> bool:
        """Whether the process has exited, waiting up to ``timeout_s`` for it.

        A killed server's sockets close a moment before the process can be reaped, so a broken
        connection is seen before ``alive()`` turns False; this wait closes that race.
        """
        if self._proc is None:
            return False
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def rss_bytes(self) -> int | None:
        """Host RSS of the server's process group (API server, engine core, workers)."""
        return group_rss_bytes(self.pgid) if self.pgid is not None and self.alive() else None

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log file ('' if it does not exist)."""
        try:
            with open(self.spec.log_path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - _TAIL_BYTES))
                return tail_lines(fh.read(), lines)
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, wait grace_s, SIGKILL, reap. Idempotent."""
        proc = self._proc
        if proc is None or self._stopped:
            return
        pgid = proc.pid
        try:
            self._terminate(proc, pgid)
        except BaseException:
            # Interrupted while waiting politely (e.g. a second Ctrl-C): finish the job hard.
            self._kill_group(proc, pgid)
            raise
        finally:
            self._stopped = True
            self._untie(pgid)
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def _untie(self, pgid: int) -> None:
        """Once the group is stopped: cut the lifeline (its watchdog exits), drop the record if nothing is left."""
        if self._lifeline is not None:
            self._lifeline.cut()
        if self._record is not None and not live_group_members(pgid):
            forget(self._record)

    def _require_proc(self) -> ServerProcess:
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc

    def _terminate(self, proc: ServerProcess, pgid: int) -> None:
        """SIGTERM and SIGCONT to the group, SIGKILL after grace_s (groups.end_group, as the watchdog and `leftovers
        --stop` end a group), then reap the leader."""
        self._reap(proc, end_group(pgid, self.grace_s))

    def _kill_group(self, proc: ServerProcess, pgid: int) -> None:
        """SIGKILL at once (interrupted during the polite stop), then reap the leader."""
        self._reap(proc, end_group(pgid, 0.0))

    @staticmethod
    def _reap(proc: ServerProcess, survivors: list[int]) -> None:
        """Collect the leader's exit status (a zombie by now, unless it survived SIGKILL)."""
        if survivors:
            log.warning("processes %s of group %d survived SIGKILL", survivors, proc.pid)
            proc.poll()
            return
        try:
            proc.wait(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("no exit code for server pid %d within %g s of its stop", proc.pid, REAP_TIMEOUT_S)


class ServerGroup:
    """The servers of one variant, as one: where specwake balances the load over several (server.load_balancing),
    they start, stop and fail together; with one server, that server."""

    def __init__(self, servers: list[Server]) -> None:
        if not servers:
            raise ValueError("a server group needs a server")
        self.servers = servers
        self.base_url = servers[0].base_url

    def start(self) -> None:
        """Launch every server (each starts while the others do); a launch that fails stops those already up."""
        try:
            for server in self.servers:
                server.start()
        except StartupFailed:
            self.stop()
            raise

    def wait_ready(self) -> float:
        """Wait until every server answers /health, while every other node's engines run; the first that cannot
        stops them all."""
        started = time.monotonic()
        nodes = [server for server in self.servers if not server.spec.http]

        def nodes_running() -> None:
            for node in nodes:
                node.wait_ready()

        try:
            for server in self.servers:
                server.wait_ready(nodes_running)
        except StartupFailed:
            self.stop()
            raise
        return time.monotonic() - started

    def start_kind(self) -> str:
        """How its servers started: "warm" (each forked from a warm launcher), "cold", or "N of M warm"."""
        warm = sum(server.warm for server in self.servers)
        if warm in (0, len(self.servers)):
            return "warm" if warm else "cold"
        return f"{warm} of {len(self.servers)} warm"

    @property
    def http(self) -> list[Server]:
        """The servers that answer HTTP (not another node's headless engines)."""
        return [server for server in self.servers if server.spec.http]

    def alive(self) -> bool:
        return all(server.alive() for server in self.servers)

    def exited_within(self, timeout_s: float) -> bool:
        """Whether any server has exited, waiting up to `timeout_s` for one."""
        deadline = time.monotonic() + timeout_s
        while True:
            if any(server.returncode() is not None for server in self.servers):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def rss_bytes(self) -> int | None:
        sizes = [server.rss_bytes() for server in self.servers]
        return None if any(size is None for size in sizes) else sum(size or 0 for size in sizes)

    def returncode(self) -> int | None:
        """The exit code of the first server that has exited (None while all run)."""
        return next((code for server in self.servers if (code := server.returncode()) is not None), None)

    def log_tail(self, lines: int = 40) -> str:
        """The server's log tail; of several, the one that exited, or each under a line naming its log."""
        if len(self.servers) == 1:
            return self.servers[0].log_tail(lines)
        dead = [server for server in self.servers if server.returncode() is not None]
        return "\n".join(f"# {s.spec.log_path.name}\n{s.log_tail(lines)}" for s in (dead or self.servers))

    def stop(self) -> None:
        """Stop every server (idempotent); each stops even when stopping another was interrupted, and the
        interruption is raised once all are stopped."""
        interrupted: BaseException | None = None
        for server in self.servers:
            try:
                server.stop()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, once every server is stopped
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted
