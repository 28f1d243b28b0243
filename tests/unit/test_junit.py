"""Tests of specwake.report.junit: the XML parses back with the standard structure, counts and messages.

Results are the sample result.json plus variants changed here with dataclasses.replace.
"""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from specwake.errors import ResultsUnwritable
from specwake.report.junit import render_junit, write_junit
from specwake.results import ScenarioResult, VariantResult
from tests.helpers.builders import sample_result as sample


def with_variants(result: ScenarioResult, *variants: VariantResult, name: str | None = None) -> ScenarioResult:
    scenario = dict(result.scenario, name=name) if name else result.scenario
    return replace(result, scenario=scenario, variants=list(variants))


def parse(results: list[ScenarioResult]) -> ET.Element:
    return ET.fromstring(render_junit(results).encode("utf-8"))


def counts(element: ET.Element) -> tuple[int, int, int]:
    return int(element.get("tests", "-1")), int(element.get("failures", "-1")), int(element.get("errors", "-1"))


def test_passing_run_has_one_suite_and_passing_cases() -> None:
    result = sample()
    root = parse([result])
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["tiny-cpu"]
    assert counts(root) == counts(suites[0]) == (2, 0, 0)
    cases = suites[0].findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("specwake.tiny-cpu", "baseline"),
        ("specwake.tiny-cpu", "patched"),
    ]
    assert [float(c.get("time", "nan")) for c in cases] == [v.seconds for v in result.variants]
    # The suite's time is the run's wall time (its variants ran side by side), not the sum of theirs.
    wall = dt.datetime.fromisoformat(result.finished_at or "") - dt.datetime.fromisoformat(result.started_at)
    assert float(suites[0].get("time", "nan")) == pytest.approx(wall.total_seconds())
    assert wall.total_seconds() != pytest.approx(sum(v.seconds for v in result.variants))
    assert suites[0].get("timestamp") == result.started_at
    assert all(c.find("failure") is None and c.find("error") is None for c in cases)
    out = cases[0].findtext("system-out") or ""
    assert out.startswith("baseline: collapse (expected collapse)\nAL 4.00 → 1.00 → 1.00")
    props = {p.get("name"): p.get("value") for p in suites[0].iterfind("properties/property")}
    assert props["scenario_sha256"] == result.scenario["sha256"] and props["verdict"] == "pass"


def test_mismatch_is_a_failure_with_al_chain_and_toks_medians() -> None:
    result = sample()
    baseline, patched = result.variants
    broken = replace(patched, outcome="collapse", matched=False, stages=baseline.stages)
    root = parse([with_variants(result, baseline, broken)])
    assert counts(root) == (2, 1, 0)
    failure = root.find("testsuite/testcase[@name='patched']/failure")
    assert failure is not None
    assert failure.get("message") == "expected recover, got collapse"
    text = failure.text or ""
    assert "AL 4.00 → 1.00 → 1.00" in text
    for stage in baseline.stages:
        assert f"{stage.name}: AL {stage.acceptance_length:.2f}" in text
        assert f"tok/s median {stage.tok_s_median:.1f} (n={len(stage.tok_s)})" in text


def test_error_and_unexpected_crash_are_errors_with_their_class() -> None:
    result = sample()
    baseline, patched = result.variants
    unready = replace(
        baseline,
        outcome="error",
        matched=False,
        stages=[],
        crash_class="startup_failed",
        error="server exited with code 1 before /health answered",
    )
    crashed = replace(
        patched,
        outcome="crash",
        matched=False,
        stages=patched.stages[:1],
        crash_class="step_failed",
        error="POST /wake_up?tags=kv_cache answered 500",
        log_excerpt="RuntimeError: CUDA error: an illegal memory access",
    )
    root = parse([with_variants(result, unready, crashed)])
    assert counts(root) == (2, 0, 2)
    first = root.find("testsuite/testcase[@name='baseline']/error")
    second = root.find("testsuite/testcase[@name='patched']/error")
    assert first is not None and second is not None
    assert first.get("type") == "startup_failed"
    assert "server exited with code 1" in (first.get("message") or "")
    assert second.get("type") == "step_failed"
    assert "crash (step_failed)" in (second.get("message") or "")
    assert "illegal memory access" in (second.text or "")


def test_an_untested_variant_is_an_error_and_a_finding_a_failure_that_names_it() -> None:
    result = sample()
    baseline, patched = result.variants
    untested = replace(baseline, outcome="untested", expected="any", matched=False)
    moved = "draft: 7 tensors in new storage after reload_weights in cycle 1 (…): a CUDA graph captured before"
    found = replace(patched, matched=False, findings=[moved])
    root = parse([with_variants(result, untested, found)])
    assert counts(root) == (2, 1, 1)
    error = root.find("testsuite/testcase[@name='baseline']/error")
    assert error is not None and error.get("type") == "sleep_ignored"
    assert "vLLM ignores sleep on CPU" in (error.get("message") or "")
    failure = root.find("testsuite/testcase[@name='patched']/failure")
    assert failure is not None and failure.get("type") == "finding"
    assert (failure.get("message") or "").startswith("draft: 7 tensors in new storage")


def test_expected_crash_passes() -> None:
    result = sample()
    crashed = replace(result.variants[0], outcome="crash", expected="crash", matched=True, crash_class="step_failed")
    root = parse([with_variants(result, crashed)])
    assert counts(root) == (1, 0, 0)


def test_totals_add_up_over_several_scenarios() -> None:
    result = sample()
    baseline, patched = result.variants
    failing = with_variants(result, replace(baseline, outcome="recover", matched=False), patched, name="second")
    erroring = with_variants(result, replace(patched, outcome="error", matched=False, stages=[]), name="third")
    root = parse([result, failing, erroring])
    suites = root.findall("testsuite")
    assert [counts(s) for s in suites] == [(2, 0, 0), (2, 1, 0), (1, 0, 1)]
    assert counts(root) == (5, 1, 1)
    assert [c.get("classname") for c in suites[2].findall("testcase")] == ["specwake.third"]


def test_special_characters_in_logs_survive() -> None:
    result = sample()
    nasty = "a < b && c > \"d\" 'e' ]]> \x1b[31mred\x1b[0m \x00 ünïcødé → ✗\nsecond line"
    crashed = replace(
        result.variants[0],
        name='base<"line">',
        outcome="crash",
        matched=False,
        crash_class="server_exited",
        error="engine died",
        log_excerpt=nasty,
    )
    text = render_junit([with_variants(result, crashed)])
    root = ET.fromstring(text.encode("utf-8"))  # ANSI escapes and NUL would make the XML unparsable
    case = root.find("testsuite/testcase")
    assert case is not None and case.get("name") == 'base<"line">'
    error = case.find("error")
    assert error is not None
    body = error.text or ""
    assert "a < b && c > \"d\" 'e' ]]>" in body
    assert "\\x1b[31mred\\x1b[0m \\x00 ünïcødé → ✗\nsecond line" in body


def test_write_junit_writes_atomically_and_reports_unwritable(tmp_path: Path) -> None:
    target = tmp_path / "out" / "junit.xml"
    write_junit(target, [sample()])
    assert target.read_text(encoding="utf-8") == render_junit([sample()])
    assert sorted(p.name for p in target.parent.iterdir()) == ["junit.xml"]  # no temp file left
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ResultsUnwritable, match="cannot write JUnit XML"):
        write_junit(blocker / "junit.xml", [sample()])


def test_an_interrupted_run_marks_its_unfinished_variants_not_run() -> None:
    result = sample()
    baseline, patched = result.variants
    cut = replace(patched, outcome="incomplete", matched=False, stages=patched.stages[:1])
    unstarted = replace(patched, name="floor", outcome="incomplete", matched=False, stages=[])
    root = parse([replace(with_variants(result, baseline, cut, unstarted), finished_at=None, complete=False)])
    assert counts(root) == (3, 0, 0) and root.get("skipped") is None
    suite = root.find("testsuite")
    assert suite is not None and suite.get("skipped") == "2"
    skipped = {c.get("name"): c.find("skipped") for c in suite.iter("testcase")}
    assert skipped["baseline"] is None
    assert "interrupted; 1 stage(s) measured" in (skipped["patched"].get("message") or "")  # type: ignore[union-attr]
    assert (skipped["floor"].get("message") or "").endswith("the run was interrupted")  # type: ignore[union-attr]


def test_a_variant_that_recorded_nothing_is_skipped_as_not_run() -> None:
    result = sample()
    baseline, patched = result.variants
    never = replace(patched, outcome="incomplete", matched=False, stages=[], steps=[])
    root = parse([replace(with_variants(result, baseline, never), finished_at=None, complete=False)])
    skipped = next(c for c in root.iter("testcase") if c.get("name") == "patched").find("skipped")
    assert skipped is not None and skipped.get("type") == "not_run"
    assert skipped.get("message") == "not run: nothing recorded before the run was interrupted"
