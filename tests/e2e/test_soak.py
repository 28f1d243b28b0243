"""End to end on real vLLM CPU: a 20-cycle soak at L1 and at L2 side by side (tests/data/soak-cpu.toml), one server
per level, in the session's shared run (tests/helpers/shared_runs.py). The report must carry the per-cycle wake ledger
and its drift line, the two levels as two variants of one table, and the prefix cache empty after every wake. vLLM's
CPU worker ignores sleep, so the L1 variant tests nothing: it is `untested`, never `recover`, and the scenario's
verdict is `error`. Skips only when vLLM is
missing and SPECWAKE_REQUIRE_VLLM is unset.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.procs import require_module, variant_of
from tests.helpers.shared_runs import Scenarios, SharedRun, outcome_note

SCENARIOS = Scenarios.shipped("soak", "tests/data/soak-cpu.toml", budget_s=1800)
pytestmark = pytest.mark.shared_run(SCENARIOS)

require_module("vllm")

CYCLES = 20


@pytest.fixture(scope="module")
def run(shared_run: SharedRun) -> dict[str, Any]:
    return shared_run.view(SCENARIOS)


def test_l2_recovers_over_every_cycle_and_the_ignored_l1_sleep_is_untested(run: dict[str, Any]) -> None:
    assert run["result"]["verdict"] == "error" and run["result"]["complete"] is True, outcome_note(run)
    assert run["leftovers"] == []
    for name, level, outcome in (("patched-L1", 1, "untested"), ("patched-L2", 2, "recover")):
        v = variant_of(run, name)
        assert v["outcome"] == outcome and v["findings"] == [], (name, v["outcome"], v["findings"])
        assert [s["name"] for s in v["stages"]][1:] == [f"after L{level} #{c}" for c in range(1, CYCLES + 1)]
        assert all(s["acceptance_length"] == 4.0 and s["prefix_cached"] == 0 for s in v["stages"])
        assert all((s["prefix_cached_repeat"] or 0) > 0 for s in v["stages"])  # the cache works: the probe is real
        assert all(s["tpot"] and all(t > 0 for t in s["tpot"]) for s in v["stages"])


def test_the_ledger_records_every_step_with_host_memory(run: dict[str, Any]) -> None:
    l2 = variant_of(run, "patched-L2")
    steps = l2["steps"]
    assert len({s["cycle"] for s in steps}) == CYCLES
    assert all(s["rss_bytes"] and s["rss_bytes"] > 100 * 1024 * 1024 for s in steps)  # a vLLM server is big
    l1_steps = {s["name"] for s in variant_of(run, "patched-L1")["steps"]}
    assert l1_steps == {"sleep", "wake_up", "reset_prefix_cache"}  # L1 keeps its weights: nothing to reload


def test_the_report_shows_the_ledger_the_drift_and_the_prefix_cache(run: dict[str, Any]) -> None:
    report = (run["dir"] / "report.md").read_text()
    assert f"- **patched-L2** drift per cycle over {CYCLES} cycles: host RSS " in report
    assert "| cycle | AL | TPOT ms | 1st TTFT ms | wake s | host RSS MiB | device free GiB |" in report
    assert report.count("| n/a (cpu) |") == 2 * CYCLES  # one ledger row per cycle and level, no GPU here
    assert "- prefix cache, first request after each wake: patched-L1 0 · 0" in report
    assert "— no stale hashes" in report
    assert "| patched-L1 |" in report and "| patched-L2 |" in report  # the cost table sets the levels side by side
    assert "- **patched-L1**: untested (expected recover) ⚠ — AL 4.00 → " in report
    assert "vLLM ignores sleep on CPU" in report and "patched-L1 untested (vLLM ignores sleep on CPU)" in report
