"""Tests of specwake.run.server.leftovers on records written here: which records name a leftover, which are dropped,
which belong to someone else; read from this machine's /proc (no process is started or signalled)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from specwake.events import Event
from specwake.run.server.groups import boot_id, pid_namespace, start_ticks
from specwake.run.server.leftovers import (
    Leftover,
    ServerRecord,
    describe,
    find_leftovers,
    handle_leftovers,
    registry_dir,
    remember,
)

NO_SUCH_PID = 4_194_304 + 12_345  # above the kernel's largest pid_max: never a process


def record(**fields: Any) -> ServerRecord:
    """A record of a server whose specwake process and watchdog are gone (pids that never ran), on this boot."""
    boot, namespace = boot_id(), pid_namespace()
    assert boot is not None and namespace is not None, "these tests read Linux's /proc"
    base = ServerRecord(
        pgid=NO_SUCH_PID, start=1, port=8000, log="/r/20260101-000000-tiny/logs/baseline.log", owner=NO_SUCH_PID,
        owner_start=1, watchdog=NO_SUCH_PID, watchdog_start=1, boot=boot, pid_namespace=namespace,
        started_at="2026-01-01T00:00:00+00:00",
    )  # fmt: skip
    return dataclasses.replace(base, **fields)


def own_start() -> int:
    start = start_ticks(os.getpid())
    assert start is not None
    return start


def test_a_record_round_trips_and_names_its_run_and_variant(tmp_path: Path) -> None:
    kept = record()
    path = remember(registry_dir(tmp_path), kept)
    assert path == tmp_path / "servers" / f"{NO_SUCH_PID}-1.json"
    assert ServerRecord(**json.loads(path.read_text())) == kept
    assert kept.variant == "baseline" and kept.run_dir == Path("/r/20260101-000000-tiny")


def test_this_process_can_record_itself() -> None:
    mine = ServerRecord.of(os.getpid(), 8000, Path("/r/x/logs/patched.log"), os.getpid())
    assert mine is not None
    assert (mine.pgid, mine.owner, mine.watchdog) == (os.getpid(),) * 3
    assert mine.start == mine.owner_start == own_start()
    assert ServerRecord.of(NO_SUCH_PID, 8000, Path("/x.log"), os.getpid()) is None  # a group already gone


@pytest.mark.parametrize(
    ("case", "fields", "dropped"),
    [
        ("its group is gone", {}, True),
        ("another boot", {"boot": "another-boot"}, True),
        ("its pid names a later process", {"pgid": os.getpid(), "start": 0}, True),
        ("its run goes on", {"owner": os.getpid(), "owner_start": "own"}, False),
        ("its watchdog is stopping it", {"watchdog": os.getpid(), "watchdog_start": "own"}, False),
        ("another container's", {"pgid": os.getpid(), "start": "own", "pid_namespace": 1}, False),
    ],
)
def test_records_that_name_no_leftover(tmp_path: Path, case: str, fields: dict[str, Any], dropped: bool) -> None:
    """None is a leftover; records of servers that are gone are dropped, the others are left to their owners."""
    resolved = {k: own_start() if v == "own" else v for k, v in fields.items()}
    path = remember(registry_dir(tmp_path), record(**resolved))
    assert path is not None
    assert find_leftovers(registry_dir(tmp_path)) == [], case
    assert path.exists() is not dropped, case


def test_a_record_of_a_live_group_whose_run_is_gone_is_a_leftover(tmp_path: Path) -> None:
    """This test's own process stands for the orphaned server (found, never signalled: only `stop` signals)."""
    leader = start_ticks(os.getpgrp())  # None: the group's leader is gone, its members live on
    path = remember(registry_dir(tmp_path), record(pgid=os.getpgrp(), start=leader or 0))
    assert path is not None
    [found] = find_leftovers(registry_dir(tmp_path))
    assert found.path == path and os.getpid() in found.members


def test_describe_and_the_warning_a_run_gives(tmp_path: Path) -> None:
    leftover = Leftover(record(pgid=4321, port=40123), Path("r.json"), (4321, 4322, 4323))
    assert describe(leftover) == (
        "server group 4321 (3 processes, port 40123, since 2026-01-01T00:00:00+00:00): "
        "/r/20260101-000000-tiny/logs/baseline.log"
    )
    events: list[Event] = []
    handle_leftovers(tmp_path, stop=False, events=events.append)  # nothing recorded: nothing said
    assert events == []
