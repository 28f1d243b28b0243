"""Servers that outlived the run that started them. While a server runs, its record lies in specwake's cache
(`servers/<pgid>-<start>.json`: its process group and when it started, its port and log, the specwake process that
started it and its watchdog); Server.stop removes the record once the group is gone. A record whose specwake process
and watchdog are both gone while its group still has live processes is a leftover (the watchdog stops the group
when only specwake dies: lifeline.py). `run` names leftovers before it starts a server, `specwake leftovers` lists
them, and `--stop` on either ends them. Records of groups that are gone are dropped when found.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from specwake.events import Event, Events
from specwake.files import write_atomic
from specwake.run.server.groups import boot_id, end_group, live_group_members, pid_namespace, start_ticks

SERVERS = "servers"  # the records' folder in specwake's cache
GRACE_S = 10.0  # SIGTERM to SIGKILL when stopping a leftover, as Server.stop waits
STOP_HINT = "`specwake leftovers --stop` (or `specwake run --stop-leftovers`) stops them"


def registry_dir(cache: Path) -> Path:
    """Where servers' records lie while they run."""
    return cache / SERVERS


@dataclass(frozen=True)
class ServerRecord:
    """One running server, as the specwake process that started it recorded it."""

    pgid: int  # its process group (the API server's pid)
    start: int  # when the API server started, clock ticks since boot: a later process with its pid starts later
    port: int
    log: str  # `<run folder>/logs/<variant>.log` (several scenarios: `<run folder>/<scenario>/logs/<variant>.log`)
    owner: int  # the specwake process that started it
    owner_start: int
    watchdog: int
    watchdog_start: int
    boot: str  # the boot it ran in: nothing of another boot still runs
    pid_namespace: int  # pids of another container's namespace name other processes
    started_at: str  # ISO 8601 UTC, for people

    @classmethod
    def of(cls, pgid: int, port: int, log: Path, watchdog: int) -> ServerRecord | None:
        """The record of group `pgid` this process has just started; None where /proc cannot tell processes apart."""
        start, owner_start, watchdog_start = start_ticks(pgid), start_ticks(os.getpid()), start_ticks(watchdog)
        boot, namespace = boot_id(), pid_namespace()
        if start is None or owner_start is None or watchdog_start is None or boot is None or namespace is None:
            return None
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return cls(
            pgid, start, port, str(log), os.getpid(), owner_start, watchdog, watchdog_start, boot, namespace, now
        )

    @property
    def file_name(self) -> str:
        return f"{self.pgid}-{self.start}.json"

    @property
    def variant(self) -> str:
        return Path(self.log).stem

    @property
    def run_dir(self) -> Path:
        """The run folder (a scenario's folder in a run of several) the server's log is in."""
        return Path(self.log).parent.parent


def remember(registry: Path, record: ServerRecord) -> Path | None:
    """Write `record` into `registry`; None when the cache cannot be written (the run goes on, unrecorded)."""
    path = registry / record.file_name
    try:
        write_atomic(path, json.dumps(asdict(record)) + "\n")
    except OSError:
        return None
    return path


def forget(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _read(path: Path) -> ServerRecord | None:
    try:
        data = json.loads(path.read_text())
        return ServerRecord(**{f.name: data[f.name] for f in fields(ServerRecord)})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _alive(pid: int, start: int) -> bool:
    """Whether the process that had `pid` when it started at `start` still runs (not a later one given its pid)."""
    return start_ticks(pid) == start


def members(record: ServerRecord) -> list[int]:
    """The live processes of the record's server: its group's, when the group id is still the server's (its leader
    runs with the recorded start, or is gone while members started after it remain)."""
    leader = start_ticks(record.pgid)
    if leader is not None and leader != record.start:
        return []  # the pid now names a later process: ours is gone
    return [pid for pid in live_group_members(record.pgid) if (start_ticks(pid) or 0) >= record.start]


@dataclass(frozen=True)
class Leftover:
    record: ServerRecord
    path: Path  # its record
    members: tuple[int, ...]  # live pids of its group


def find_leftovers(registry: Path) -> list[Leftover]:
    """Servers whose run and watchdog are gone while their group still has live processes, oldest first. Records of
    servers that are gone are dropped; those of running runs, and of other containers, are left alone."""
    boot, namespace = boot_id(), pid_namespace()
    if boot is None or not registry.is_dir():
        return []
    found = []
    for path in sorted(registry.glob("*.json")):
        record = _read(path)
        if record is None or record.pid_namespace != namespace:
            continue
        if record.boot != boot:
            forget(path)
            continue
        if _alive(record.owner, record.owner_start) or _alive(record.watchdog, record.watchdog_start):
            continue  # its run goes on, or its watchdog is stopping it right now
        live = members(record)
        if not live:
            forget(path)
            continue
        found.append(Leftover(record, path, tuple(live)))
    return sorted(found, key=lambda left: left.record.started_at)


def stop_leftover(leftover: Leftover, grace_s: float = GRACE_S) -> list[int]:
    """End a leftover's group (SIGTERM, SIGKILL after `grace_s`); returns the pids that survived (normally none)."""
    survivors = end_group(leftover.record.pgid, grace_s)
    if not survivors:
        forget(leftover.path)
    return survivors


def describe(leftover: Leftover) -> str:
    """`pid 1234 (3 processes, port 40123, since 2026-01-02T03:04:05+00:00): results/…/logs/baseline.log`."""
    record, count = leftover.record, len(leftover.members)
    processes = f"{count} process{'' if count == 1 else 'es'}"
    return f"server group {record.pgid} ({processes}, port {record.port}, since {record.started_at}): {record.log}"


def handle_leftovers(cache: Path, stop: bool, events: Events) -> None:
    """What `run` does before it starts a server: name the leftovers of dead runs, or with `stop` end them."""
    found = find_leftovers(registry_dir(cache))
    if not found:
        return
    if not stop:
        events(Event(f"warning: {_count(found)} left running by specwake runs that died: {_listed(found)}; they hold "
                     f"memory, cores or GPUs and ports; {STOP_HINT}"))  # fmt: skip
        return
    for leftover in found:
        survivors = stop_leftover(leftover)
        what = f"processes {survivors} survived SIGKILL" if survivors else "stopped"
        events(Event(f"leftover {describe(leftover)}: {what}"))


def _count(found: Sequence[Leftover]) -> str:
    return f"{len(found)} server{'' if len(found) == 1 else 's'}"


def _listed(found: Sequence[Leftover]) -> str:
    return "; ".join(describe(left) for left in found)
