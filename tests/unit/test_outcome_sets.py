"""A set of outcomes as an expectation (`baseline = ["collapse", "degraded"]`), for what vLLM's code leaves to the
allocator's layout: read from a scenario (plain or per release), judged by membership, recorded in result.json and
printed by `check`, the Markdown report and JUnit as `collapse|degraded`. Bad lists are specwake.prepare's one-line
errors (tests/helpers/scenario_texts.py's BAD table holds them, run through the CLI by test_hostile_input.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specwake.errors import ScenarioError
from specwake.judge.expectations import EXPECTATIONS, SET_OUTCOMES, accepted, expectation_text
from specwake.judge.verdict import OUTCOMES, outcome_matches
from specwake.prepare.engine import EngineInfo
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant
from specwake.report.junit import render_junit
from specwake.report.summary import render_markdown
from specwake.results import Diagnostic, from_dict, to_dict
from specwake.run.session.assemble import VariantRecord, judge_scenario, judge_variant
from specwake.run.session.check import describe
from tests.helpers.builders import stage
from tests.helpers.scenario_texts import MINIMAL

ENGINE = EngineInfo("/usr/bin/python3", "3.11.7", "0.34.0", Path("/site/vllm"), ("vllm",), "cuda", True, None, 1, 16)
LAYOUT = '{ "<0.34" = "collapse", ">=0.34" = ["degraded", "collapse"] }'


def scenario(tmp_path: Path, expect: str) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(MINIMAL + f"[expect]\nbaseline = {expect}\n")
    return load_scenario(path)


def test_a_list_is_read_as_its_members_in_outcome_order_plain_or_per_release(tmp_path: Path) -> None:
    (plain,) = scenario(tmp_path, '["degraded", "recover", "collapse"]').variants
    assert plain.expected == "recover|collapse|degraded"
    per_release = scenario(tmp_path, LAYOUT)
    (baseline,) = per_release.variants
    assert baseline.expected == "collapse on <0.34, collapse|degraded on >=0.34"
    assert baseline.for_release("0.33.0").expected == "collapse"
    assert baseline.for_release("0.34.0").expected == "collapse|degraded"
    assert per_release.settings()["expect"]["baseline"] == {"<0.34": "collapse", ">=0.34": "collapse|degraded"}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("[]", "an empty list: a list names two or more outcomes"),
        (
            '["collapse"]',
            "a list of one ('collapse'): a list names two or more outcomes of recover, collapse, corrupt,"
            " crash, degraded; write it as a string",
        ),
        ('["degraded"]', "a list of one ('degraded'): a list names two or more outcomes"),
        ('["colapse", "degraded"]', "'colapse' is not an outcome a list may name (did you mean 'collapse'?"),
        ('["any", "crash"]', "'any' is not an outcome a list may name"),
        ('["error", "crash"]', "'error' is not an outcome a list may name"),
        ('["crash", "crash"]', "'crash' is named twice"),
        ('{ "<0.34" = "collapse", ">=0.34" = [] }', "an empty list"),
        ('{ "<0.34" = ["floor", "recover"], ">=0.34" = "recover" }', "'floor' is not an outcome a list may name"),
    ],
)
def test_a_bad_list_is_one_line_naming_file_and_key(tmp_path: Path, value: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario(tmp_path, value)
    assert str(info.value).startswith(f"{tmp_path / 's.toml'}: expect.baseline: {reason}")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("out", OUTCOMES)
def test_a_set_matches_its_members_and_nothing_else(out: str) -> None:
    assert outcome_matches(out, "collapse|degraded") is (out in ("collapse", "degraded"))
    assert outcome_matches(out, "|".join(SET_OUTCOMES)) is (out in SET_OUTCOMES)  # every judged outcome: not error


def test_only_the_recorded_form_of_a_set_is_an_expectation() -> None:
    assert accepted("collapse|degraded") == ("collapse", "degraded")
    assert accepted("any") is None and accepted("crash") == ("crash",)
    for bad in ("degraded", "collapse|", "any|crash", "collapse|error", "collapse,degraded"):
        with pytest.raises(ValueError, match="unknown expectation"):
            outcome_matches("collapse", bad)
    assert all(expectation_text(e) == e for e in EXPECTATIONS)


def prepared(s: Scenario) -> PreparedVariant:
    variant = s.variants[0].for_release(ENGINE.vllm_version)
    return PreparedVariant(variant, ENGINE, None, None, "/models/t", "/models/d", "native")


def record(draft_differ: int) -> VariantRecord:
    """A finished run whose AL held at 4.00 over two cycles, its drafter `draft_differ` tensors off fresh."""
    draft = {"tensors": 7, "compared": 7, "differ": draft_differ, "moved": 0}
    target = {"tensors": 9, "compared": 9, "differ": 0, "moved": 0}
    point = {"cycle": 1, "point": "after reload_weights", "fingerprints": [{"target": target, "draft": draft}]}
    stages = [stage(c, accepted=300) for c in range(3)]
    return VariantRecord("baseline", "/logs/baseline.log", ["vllm"], {}, stages=stages, complete=True,
                         diagnostics=[Diagnostic.from_dict(point)])  # fmt: skip


def test_a_run_passes_on_a_member_of_the_set_and_fails_outside_it_and_says_so_where_it_is_read(tmp_path: Path) -> None:
    s = scenario(tmp_path, LAYOUT)
    degraded = judge_variant(s, prepared(s), record(draft_differ=2))
    recovered = judge_variant(s, prepared(s), record(draft_differ=0))
    assert (degraded.outcome, degraded.expected, degraded.matched) == ("degraded", "collapse|degraded", True)
    assert (recovered.outcome, recovered.expected, recovered.matched) == ("recover", "collapse|degraded", False)
    started = "2026-12-01T00:00:00+00:00"
    passed = judge_scenario(s, [degraded], started, complete=True, mode="sequential", host={})
    failed = judge_scenario(s, [recovered], started, complete=True, mode="sequential", host={})
    assert (passed.verdict, failed.verdict) == ("pass", "fail")
    assert from_dict(to_dict(failed)).variants[0].expected == "collapse|degraded"  # result.json keeps it
    # JUnit: the failure says what was expected; the Markdown table escapes the bar, its line item does not need to
    failure = ET.fromstring(render_junit([failed]).encode()).find("testsuite/testcase/failure")
    assert failure is not None and failure.get("message") == "expected collapse|degraded, got recover"
    markdown = render_markdown([failed])
    assert "| recover ✗ (expected collapse\\|degraded) |" in markdown
    assert "- **baseline**: recover (expected collapse|degraded) ✗" in markdown
    # `specwake check`: the set for the installed release, and per tested release
    text = describe(s, [prepared(s)], [[]])
    assert "    baseline: expect collapse|degraded; speed" in text
    assert "  variant baseline  (expect collapse|degraded)" in text
    assert "    expectation per tested release: 0.32.0 collapse, 0.33.0 collapse, 0.34.0 collapse|degraded" in text
