"""Reading a process group's live members while it ends (specwake.run.server.groups): members_now reads the known
members one by one and the whole group only once none of them is left, so a member forked after the first reading
still keeps the group alive, and end_group still stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from specwake.run.server.groups import end_group, live_group_members, members_now

# A group leader that forks a second member when it gets SIGUSR1, then both sleep.
LEADER = """
import signal, subprocess, sys, time
child = []
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
signal.signal(signal.SIGUSR1, lambda *_: child.append(subprocess.Popen(SLEEPER)))
print("ready", flush=True)
while True:
    time.sleep(0.05)
    if child:
        print(child[0].pid, flush=True)
        child.clear()
"""


def _group() -> subprocess.Popen[str]:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leader.stdout is not None and leader.stdout.readline().strip() == "ready"
    return leader


def test_a_member_forked_after_the_first_reading_is_found_once_the_known_ones_are_gone() -> None:
    leader = _group()
    try:
        known = live_group_members(leader.pid)
        assert known == [leader.pid]
        assert members_now(known, leader.pid) == [leader.pid]
        os.kill(leader.pid, signal.SIGUSR1)
        assert leader.stdout is not None
        late = int(leader.stdout.readline())
        assert members_now(known, leader.pid) == [leader.pid]  # the known member alone: no full read yet
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        assert members_now(known, leader.pid) == [late]  # the leader gone: the whole group read again
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    deadline = time.monotonic() + 5
    while live_group_members(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert members_now([late], leader.pid) == []


def test_end_group_waits_for_every_member_and_stops_the_late_one_too() -> None:
    leader = _group()
    os.kill(leader.pid, signal.SIGUSR1)
    assert leader.stdout is not None
    late = int(leader.stdout.readline())
    assert sorted(live_group_members(leader.pid)) == sorted([leader.pid, late])
    assert end_group(leader.pid, grace_s=2.0) == []
    leader.wait(timeout=5)
    assert live_group_members(leader.pid) == []
