"""Process groups on this machine, read from /proc: which processes of a group still live, the memory they hold,
signalling and ending a group, and what tells a process from a later one given the same pid (its start time, the
boot and the pid namespace). Standard library only: the server watchdog (lifeline.py) runs on it alone.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
STRAGGLER_TIMEOUT_S = 5.0  # after SIGKILL, how long a group's processes get to vanish
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first, then ppid, pgrp, …); None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def live_group_members(pgid: int) -> list[int]:
    """Pids of the non-zombie processes in process group ``pgid`` (empty if the group is gone).

    Zombies are skipped: an orphan whose new parent never reaps it cannot run, hold a GPU or a
    port. Without /proc, any remaining member (as seen by ``killpg(pgid, 0)``) counts as live.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    if not PROC.is_dir():
        return [pgid]
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        if _live_in(int(entry.name), pgid):
            members.append(int(entry.name))
    return members


def members_now(known: list[int], pgid: int) -> list[int]:
    """The live members of group `pgid`, given `known`, an earlier reading: those of them still in it, read one by one
    (a few /proc reads where live_group_members reads every process's), or the whole group read again once none is,
    as a member forked since would be missed."""
    return [pid for pid in known if _live_in(pid, pgid)] or live_group_members(pgid)


def _live_in(pid: int, pgid: int) -> bool:
    """Whether process `pid` lives (is no zombie) in group `pgid`."""
    fields = _stat(pid)
    try:
        return fields is not None and fields[0] != "Z" and int(fields[2]) == pgid
    except (IndexError, ValueError):
        return False


def group_rss_bytes(pgid: int) -> int | None:
    """Resident memory of every live process in group `pgid`, summed (None without /proc or members)."""
    total, seen = 0, False
    for pid in live_group_members(pgid):
        try:
            resident = int((PROC / str(pid) / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        total, seen = total + resident * _PAGE, True
    return total if seen else None


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to every process of group `pgid`; a group that is gone already is no error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def end_group(pgid: int, grace_s: float, poll_s: float = 0.05) -> list[int]:
    """Stop a group this process is not the parent of, as Server.stop stops its own: SIGTERM and SIGCONT (a stopped
    group must run to see SIGTERM), up to `grace_s` for its processes to exit, then SIGKILL and up to
    STRAGGLER_TIMEOUT_S for them to vanish. Returns the pids still live after that (normally none)."""
    members = live_group_members(pgid)
    if not members:
        return []
    signal_group(pgid, signal.SIGTERM)
    signal_group(pgid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while members and time.monotonic() < deadline:
        time.sleep(poll_s)
        members = members_now(members, pgid)
    if grace_s > 0 and members:
        log.warning("server group %d ignored SIGTERM for %.1f s; killing", pgid, grace_s)
    deadline = time.monotonic() + STRAGGLER_TIMEOUT_S
    while True:
        survivors = live_group_members(pgid)
        if not survivors or time.monotonic() >= deadline:
            return survivors
        signal_group(pgid, signal.SIGKILL)
        time.sleep(poll_s)


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None if it is gone or a
    zombie (ended, not yet reaped). A pid the kernel gives to a later process comes with a later start."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields is not None and fields[0] != "Z" else None
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    """This boot's id: start times and pids of another boot mean nothing."""
    try:
        return (PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None


def pid_namespace() -> int | None:
    """The pid namespace this process sees (an inode number): a pid of another container names another process."""
    try:
        return (PROC / "self" / "ns" / "pid").stat().st_ino
    except OSError:
        return None
