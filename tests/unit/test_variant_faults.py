"""A variant's run against faults of specwake's own: its record read by other threads while it changes (a packed
run's job threads each save their scenario's files, reading every variant's record), and an exception of specwake's
code while it runs (a bug), which must end the variant as `specwake_failed` and keep its scenario from passing,
never leave it unfinished and out of the verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.events import Event
from specwake.judge.crashes import SPECWAKE_FAILED
from specwake.prepare.engine import EngineInfo
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant
from specwake.report.details import time_text
from specwake.run.session.assemble import judge_scenario, now_iso
from specwake.run.session.runner import _run_one
from specwake.run.session.variant_run import VariantRun
from tests.helpers.scenario_texts import MINIMAL

ENGINE = EngineInfo("/py", "3.11", "0.32.0", Path("/pkg/vllm"), ("vllm==0.32.0",), "cpu", False, None, 0, 2)


def scenario(tmp_path: Path) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(MINIMAL + "[variants.baseline]\n")
    return load_scenario(path)


def variant_run(tmp_path: Path, events: list[Event]) -> VariantRun:
    s = scenario(tmp_path)
    prep = PreparedVariant(s.variants[0], ENGINE, None, None, "/m/target", "/m/draft", "emulated")
    return VariantRun(s, prep, tmp_path / "baseline.log", events.append)


def test_a_result_is_a_snapshot_that_the_variants_later_phases_leave_alone(tmp_path: Path) -> None:
    """A packed run's job threads each write their scenario's files, rendering every variant's result (the report's
    time line iterates its timings) while that variant's own thread goes on: a result that shared the record's
    timings once raised "dictionary changed size during iteration" in a neighbour's thread."""
    run = variant_run(tmp_path, [])
    run._timed("startup", 0.5)
    taken = run.result()
    run._timed("measurement", 0.25)
    run._timed("startup", 0.5)
    assert taken.info["timings"] == {"startup": 0.5} and time_text(taken.info["timings"]).startswith("startup")
    assert run.result().info["timings"] == {"startup": 1.0, "measurement": 0.25}


def test_a_bug_inside_a_variant_ends_it_as_specwake_failed_and_its_scenario_does_not_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[Event] = []
    run = variant_run(tmp_path, events)

    def broken_open() -> None:
        run._timed("startup", 0.5)
        raise KeyError("a key specwake's code forgot")

    monkeypatch.setattr(run, "open", broken_open)
    _run_one(run, lambda: None, events.append)  # returns: the run goes on with its other variants
    result = run.result()
    assert result.outcome == "error" and result.crash_class == SPECWAKE_FAILED
    assert 'during startup: KeyError: "a key specwake\'s code forgot"' in (result.error or "")
    assert "Traceback (most recent call last)" in (result.log_excerpt or "") and "broken_open" in result.log_excerpt
    assert any(e.text.startswith("failed (specwake_failed) during startup") for e in events)
    verdict = judge_scenario(run.scenario, [result], now_iso(), complete=True, mode="sequential", host={})
    assert verdict.verdict == "error"  # not "pass": the variant takes part in the verdict
