"""The session summary's account of the shared run's time (tests/helpers/shared_runs.py, `breakdown`), read from a run's
event lines and its variants' timings."""

from __future__ import annotations

import subprocess

from tests.helpers.shared_runs import breakdown


def test_the_breakdown_reads_the_events_and_adds_up_every_servers_phases() -> None:
    stderr = "[    0.0s] probing vLLM\n[   42.5s] results in /tmp/x\n[  300.4s] a: stage fresh\n"
    timings = {"startup": 20.0, "measurement": 100.0, "cycle_steps": 1.0, "diagnostics": 2.0, "teardown": 1.0}
    variant = {"info": {"timings": timings}}
    results = {"a": {"variants": [variant, variant]}, "b": {"variants": [variant]}}
    proc = subprocess.CompletedProcess(["specwake"], 0, stdout="## report\n", stderr=stderr)
    wall, phases = breakdown({"proc": proc, "results": results, "result": {}})
    assert wall == ("shared run: 300 s wall, 3 servers; preparation (probe, overlays, builtin models, validation) 42 s")
    assert phases.endswith("startup 60 s, measurement 300 s, cycle_steps 3 s, diagnostics 6 s, teardown 3 s")


def test_a_run_that_printed_nothing_says_so() -> None:
    proc = subprocess.CompletedProcess(["specwake"], 1, stdout="", stderr="")
    assert breakdown({"proc": proc, "results": {}, "result": {}}) == [
        "shared run: no events (it printed nothing the summary can read)"
    ]
