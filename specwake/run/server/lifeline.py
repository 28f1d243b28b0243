"""The lifeline from specwake to one server's process group: a watchdog process that stops the group when the
specwake process that started it dies, however it dies (SIGKILL, the OOM killer, a CI job's timeout).

specwake holds the write end of a pipe and never writes to it; the watchdog (`python -m specwake.run.server.lifeline
PGID GRACE_S SPECWAKE_PID`, the read end as its stdin) waits for end of file, which comes when specwake closes its end
after stopping the group, or when the kernel closes it because specwake died. If the group still has live processes
then, the watchdog stops them as Server.stop does (SIGTERM and SIGCONT, SIGKILL after the grace period), engine core
and workers included: they are members of the group. It exits then, or as soon as the group has no live process, so
it never outlives its server for long. It runs in a session of its own: a kill of specwake's process group (a
cancelled CI job) does not reach it, and a kill of the server's group does not either.

A parent-death signal (prctl PR_SET_PDEATHSIG) would reach only the API server, not its engine core and workers, and
fires when the thread that started the server ends (packed runs start servers from job threads). vLLM ties its own
workers to their engine core with such a pipe too (vllm/v1/executor/multiproc_executor.py:726-761, `death_pipe`).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from typing import IO

from specwake.prepare.models import builder_env
from specwake.run.server.groups import end_group, live_group_members, members_now

POLL_S = 1.0  # how often the watchdog looks whether its group has ended by itself
REAP_TIMEOUT_S = 2.0  # how long specwake waits for a watchdog to exit once the line is cut


class Lifeline:
    """specwake's end of one server's lifeline: `attach` starts the watchdog, `cut` (after the group is stopped)
    closes the pipe and reaps the watchdog. Safe to cut twice, from two threads."""

    def __init__(self, watchdog: subprocess.Popen[bytes], write_fd: int) -> None:
        self.watchdog = watchdog
        self._fd = write_fd
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.watchdog.pid

    @classmethod
    def attach(cls, pgid: int, grace_s: float, log: IO[bytes] | None) -> Lifeline:
        """Start the watchdog of group `pgid`, its output appended to `log`; OSError when it cannot start."""
        read_fd, write_fd = os.pipe()  # neither end is inherited by other children (PEP 446): the line is ours alone
        try:
            watchdog = subprocess.Popen(
                watchdog_command(pgid, grace_s),
                stdin=read_fd,
                stdout=log,
                stderr=log,
                env=builder_env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}),
                start_new_session=True,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        return cls(watchdog, write_fd)

    def cut(self) -> None:
        """Close specwake's end (the watchdog sees end of file; its group is gone by now, so it just exits) and reap
        the watchdog, killing it if it does not exit within REAP_TIMEOUT_S."""
        with self._lock:
            fd, self._fd = self._fd, -1
            if fd < 0:
                return
            os.close(fd)
            try:
                self.watchdog.wait(timeout=REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()


def watchdog_command(pgid: int, grace_s: float) -> list[str]:
    """The watchdog's argv: specwake's interpreter running this module (builder_env puts specwake on its path)."""
    return [sys.executable, "-m", "specwake.run.server.lifeline", str(pgid), f"{grace_s:g}", str(os.getpid())]


def watch(pgid: int, grace_s: float, line: int, owner: int, poll_s: float = POLL_S) -> list[int] | None:
    """Wait for end of file on `line` while group `pgid` has live processes; then stop what is left of the group.
    Returns the pids that survived the stop (normally none), or None when the group ended while the line held.
    `owner`: the pid of the specwake process holding the line, for the log."""
    members = live_group_members(pgid)
    while members:
        readable, _, _ = select.select([line], [], [], poll_s)
        if readable and not os.read(line, 512):
            left = live_group_members(pgid)
            if not left:
                return []
            say(f"specwake (pid {owner}) is gone: stopping server group {pgid} ({len(left)} processes: SIGTERM, "
                f"SIGKILL after {grace_s:g} s)")  # fmt: skip
            survivors = end_group(pgid, grace_s)
            say(f"server group {pgid} stopped" if not survivors else f"processes {survivors} survived SIGKILL")
            return survivors
        members = members_now(members, pgid)
    return None


def say(text: str) -> None:
    """One line into the server's log, after its own output."""
    print(f"# specwake watchdog: {text}", flush=True)


def main(argv: list[str]) -> int:
    pgid, grace_s, owner = int(argv[0]), float(argv[1]), int(argv[2])
    survivors = watch(pgid, grace_s, sys.stdin.fileno(), owner)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
