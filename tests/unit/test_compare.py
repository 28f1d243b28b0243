"""Tests of specwake.report.compare: crafted OLD/NEW pairs built from the sample result with dataclasses.replace.

Covers AL regressions and improvements, tok/s calls, scenario sha checks, missing keys, path lookup.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwake.errors import InputError
from specwake.report.compare import (
    OUTCOME_STAGE,
    Comparison,
    Row,
    compare,
    compare_runs,
    pair_scenarios,
    parse_pair,
    render_comparison_markdown,
    settings_differences,
)
from specwake.results import ScenarioResult, StageResult, VariantResult
from tests.helpers.builders import sample_result as base

STEADY = [40.0, 40.5, 41.0, 40.25, 40.75]  # tight tok/s samples


def set_stage(result: ScenarioResult, variant: str, stage: str, **changes: object) -> ScenarioResult:
    def fix_stage(s: StageResult) -> StageResult:
        return replace(s, **changes) if s.name == stage else s  # type: ignore[arg-type]

    def fix_variant(v: VariantResult) -> VariantResult:
        return replace(v, stages=[fix_stage(s) for s in v.stages]) if v.name == variant else v

    return replace(result, variants=[fix_variant(v) for v in result.variants])


def row(c: Comparison, variant: str, stage: str) -> Row:
    found = [r for r in c.rows if r.variant == variant and r.stage == stage]
    assert len(found) == 1, (variant, stage, c.rows)
    return found[0]


def test_identical_runs_join_every_stage_without_regressions() -> None:
    result = base()
    c = compare(result, result)
    stages = [(v.name, s.name) for v in result.variants for s in v.stages]
    assert [(r.variant, r.stage) for r in c.rows] == stages
    assert c.regressions == [] and c.only_old == [] and c.only_new == []
    assert all(r.al_delta == 0.0 and r.call == "same" for r in c.rows)


def test_al_drop_beyond_the_limit_is_a_regression() -> None:
    old = base()
    new = set_stage(old, "patched", "after L2 #1", acceptance_length=3.5)
    c = compare(old, new, max_al_drop=0.05)
    r = row(c, "patched", "after L2 #1")
    assert r.regression and c.regressions == [r]
    assert r.al_delta == pytest.approx(3.5 - 4.0)
    assert "AL 4.00 → 3.50" in r.reason
    # a drop inside the limit is not one: 4.0 × (1 − 0.05) = 3.8
    assert not compare(old, set_stage(old, "patched", "after L2 #1", acceptance_length=3.81)).regressions


def test_al_gone_while_old_had_drafts_is_a_regression() -> None:
    old = base()
    new = set_stage(old, "patched", "after L2 #2", acceptance_length=None, num_drafts=0)
    r = row(compare(old, new), "patched", "after L2 #2")
    assert r.regression and r.al_delta is None and "no drafts" in r.reason


def test_improvement_is_not_a_regression() -> None:
    old = base()
    slow = set_stage(old, "baseline", "after L2 #1", tok_s=[15.5, 15.25, 15.75, 15.1, 15.6], tok_s_median=15.5)
    fast = set_stage(old, "baseline", "after L2 #1", acceptance_length=4.0, tok_s=STEADY, tok_s_median=40.5)
    c = compare(slow, fast)
    r = row(c, "baseline", "after L2 #1")
    assert not r.regression and r.reason == ""
    assert r.al_delta == pytest.approx(3.0)
    assert r.call == "gain"
    assert r.toks_ratio.value == pytest.approx(40.5 / 15.5)


def test_clear_toks_drop_is_a_regression() -> None:
    old = set_stage(base(), "patched", "fresh", tok_s=STEADY, tok_s_median=40.5)
    new = set_stage(old, "patched", "fresh", tok_s=[30.0, 30.5, 29.75, 30.25, 30.1], tok_s_median=30.1)
    r = row(compare(old, new, max_toks_drop=0.10), "patched", "fresh")
    assert r.call == "drop" and r.regression
    assert r.toks_ratio.ci_high is not None and r.toks_ratio.ci_high < 0.9
    assert "tok/s" in r.reason


def test_noisy_toks_is_inconclusive_and_never_a_regression() -> None:
    old = set_stage(base(), "patched", "fresh", tok_s=STEADY, tok_s_median=40.5)
    noisy = [20.0, 45.0, 30.0, 41.0, 25.0]
    new = set_stage(old, "patched", "fresh", tok_s=noisy, tok_s_median=30.0)
    c = compare(old, new)
    r = row(c, "patched", "fresh")
    assert r.toks_ratio.value == pytest.approx(30.0 / 40.5)  # point value alone would look like a drop
    assert r.call == "inconclusive" and not r.regression and c.regressions == []


def test_outcome_from_matched_to_not_matched_is_a_regression() -> None:
    old = base()
    patched = old.variants[1]
    broke = replace(patched, outcome="collapse", matched=False)
    new = replace(old, verdict="fail", variants=[old.variants[0], broke])
    c = compare(old, new)
    r = row(c, "patched", OUTCOME_STAGE)
    assert r.regression and r.call == "changed"
    assert "recover (matched) → collapse (expected recover)" in r.reason
    assert compare(new, old).regressions == []  # the fix direction is not a regression


def test_different_scenario_sha_is_refused_unless_forced() -> None:
    old = base()
    new = replace(old, scenario=dict(old.scenario, sha256="f" * 64))
    with pytest.raises(InputError) as info:
        compare(old, new)
    message = str(info.value)
    assert old.scenario["sha256"] in message and "f" * 64 in message and "--force" in message
    forced = compare(old, new, force=True)
    assert len(forced.rows) == sum(len(v.stages) for v in old.variants)
    unknown = replace(old, scenario=dict(old.scenario, sha256=None))
    with pytest.raises(InputError, match="unknown"):
        compare(unknown, unknown)


def test_missing_variants_and_stages_are_listed() -> None:
    old = base()
    baseline, patched = old.variants
    shorter = replace(patched, stages=patched.stages[:2])
    extra = replace(baseline, name="patched-v2")
    new = replace(old, variants=[shorter, extra])
    c = compare(old, new)
    assert c.only_old == ["tiny-cpu / baseline", "tiny-cpu / patched / after L2 #2"]
    assert c.only_new == ["tiny-cpu / patched-v2"]
    assert {(r.variant, r.stage) for r in c.rows} == {("patched", "fresh"), ("patched", "after L2 #1")}


def test_markdown_lists_rows_regressions_and_missing_keys() -> None:
    old = base()
    new = set_stage(old, "patched", "after L2 #1", acceptance_length=3.5)
    new = replace(new, variants=new.variants[1:])
    text = render_comparison_markdown(compare(old, new))
    lines = text.splitlines()
    assert lines[0] == "**specwake compare: 1 regression**"
    table = [line for line in lines if line.startswith("| patched |")]
    assert len(table) == 3
    assert "| patched | after L2 #1 | 4.00 → 3.50 | -0.50 |" in text
    assert "- tiny-cpu / patched / after L2 #1: AL 4.00 → 3.50" in text
    assert "Only in old: tiny-cpu / baseline" in text
    clean = render_comparison_markdown(compare(old, old))
    assert clean.startswith("**specwake compare: no regressions**")


def with_settings(result: ScenarioResult, sha: str | None = None, **sections: dict) -> ScenarioResult:
    settings = dict(result.scenario.get("settings") or {})
    for key, changes in sections.items():
        settings[key] = {**settings.get(key, {}), **changes}
    return replace(
        result, scenario={**result.scenario, "settings": settings, "sha256": sha or result.scenario["sha256"]}
    )


def full() -> ScenarioResult:
    """The sample with the settings a current run records."""
    return with_settings(base(), speculative={"num_speculative_tokens": 3}, workload={"max_tokens": 128})


def test_a_refusal_names_the_settings_that_differ_key_by_key() -> None:
    old = full()
    new = with_settings(old, "f" * 64, speculative={"num_speculative_tokens": 4}, workload={"max_tokens": 64})
    with pytest.raises(InputError) as info:
        compare(old, new)
    message = str(info.value)
    assert "speculative.num_speculative_tokens 3 → 4" in message and "workload.max_tokens 128 → 64" in message
    only_text = replace(old, scenario={**old.scenario, "sha256": "e" * 64})
    with pytest.raises(InputError, match="only the file's text differs"):
        compare(old, only_text)


def test_regressions_across_a_changed_k_are_listed_not_counted_unless_forced() -> None:
    old = full()
    worse = set_stage(old, "patched", "after L2 #1", acceptance_length=3.0)
    overridden = with_settings(worse, speculative={"num_speculative_tokens": 4})  # same file, other flags
    c = compare(old, overridden)
    assert c.measurement_changed and c.regressions and c.counted_regressions == []
    text = render_comparison_markdown(c)
    assert "(not counted: measured under different settings)" in text
    assert "Settings differ — what a stage measures changed: speculative.num_speculative_tokens 3 → 4" in text
    assert compare(old, overridden, force=True).counted_regressions == c.regressions
    cycles_only = with_settings(worse, cycle={"count": 3})  # not what a stage measures: still counted
    assert compare(old, cycles_only).counted_regressions


def test_differently_named_scenarios_pair_only_when_asked() -> None:
    old = base()
    renamed = replace(old, scenario={**old.scenario, "name": "my-tiny"})
    assert pair_scenarios([old], [renamed]) == ([], ["my-tiny", "tiny-cpu"])
    with pytest.raises(InputError, match="--pair OLD:NEW"):
        compare_runs([old], [renamed])
    comparisons, unmatched = compare_runs([old], [renamed], pairs=[parse_pair("tiny-cpu:my-tiny")])
    assert unmatched == [] and comparisons[0].rows and comparisons[0].rows[0].scenario == "tiny-cpu → my-tiny"
    assert settings_differences(old, renamed) == []  # the name is a label, not a setting
    with pytest.raises(InputError, match="--pair"):
        parse_pair("tiny-cpu")
    with pytest.raises(InputError, match="old has"):
        compare_runs([old], [renamed], pairs=[("nope", "my-tiny")])
