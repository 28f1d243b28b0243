"""Tests of specwake.judge.compare and its rendering (specwake.report.compare): crafted OLD/NEW pairs built from the
sample result with dataclasses.replace.

Covers AL regressions and improvements, tok/s calls, scenario sha checks, missing keys, path lookup.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from specwake.errors import InputError
from specwake.judge.compare import (
    OUTCOME_STAGE,
    SPEED_STAGE,
    Comparison,
    Row,
    compare,
    compare_runs,
    exit_code,
    pair_scenarios,
    parse_pair,
    settings_differences,
)
from specwake.report.compare import render_comparison_markdown
from specwake.results import ScenarioResult, StageResult, VariantResult
from tests.helpers.builders import sample_result as base
from tests.helpers.builders import scaled

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
    stages = [(v.name, name) for v in result.variants for name in [*(s.name for s in v.stages), SPEED_STAGE]]
    assert [(r.variant, r.stage) for r in c.rows] == stages
    assert c.regressions == [] and c.only_old == [] and c.only_new == []
    assert all(r.al_delta == 0.0 and r.call == "" for r in c.rows if r.stage != SPEED_STAGE)
    speed = [r for r in c.rows if r.stage == SPEED_STAGE]
    assert [r.call for r in speed] == ["inconclusive", "inconclusive"]  # one earlier run: no spread between runs


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


def test_al_void_where_the_counters_disagree_is_named_so() -> None:
    old = base()
    new = set_stage(old, "patched", "after L2 #2", acceptance_length=None, counters_disagree="position 0 …")
    r = row(compare(old, new), "patched", "after L2 #2")
    assert r.regression and r.reason == f"AL {r.old_al:.2f} → void (counters disagree)"


def test_improvement_is_not_a_regression() -> None:
    old = base()
    slow = set_stage(old, "baseline", "after L2 #1", tok_s=[15.5, 15.25, 15.75, 15.1, 15.6], tok_s_median=15.5)
    fast = set_stage(old, "baseline", "after L2 #1", acceptance_length=4.0, tok_s=STEADY, tok_s_median=40.5)
    c = compare(slow, fast)
    r = row(c, "baseline", "after L2 #1")
    assert not r.regression and r.reason == ""
    assert r.al_delta == pytest.approx(3.0)
    assert r.toks_ratio.value == pytest.approx(40.5 / 15.5)


def nights(discard: str = "native") -> list[ScenarioResult]:
    """Four earlier runs of the same code: levels within ±2 %."""
    return [scaled(base(), f, discard) for f in (1.0, 0.98, 1.02, 1.01)]


def test_a_clear_drop_beyond_the_spread_between_runs_is_a_regression() -> None:
    *history, old = nights()
    c = compare(old, scaled(base(), 0.5), history=history, max_toks_drop=0.10)
    speed = row(c, "patched", SPEED_STAGE)
    assert speed.call == "drop" and speed.regression and "earlier runs" in speed.reason
    assert speed.toks_ratio.value == pytest.approx(0.5 / statistics.fmean([1.0, 0.98, 1.02, 1.01]), rel=0.03)
    assert all(not r.regression for r in c.rows if r.stage != SPEED_STAGE)  # stages are shown, not called
    same = compare(old, scaled(base(), 0.99), history=history)
    assert row(same, "patched", SPEED_STAGE).call == "same" and not same.regressions


def test_a_drop_within_the_spread_between_runs_is_inconclusive() -> None:
    history = [scaled(base(), f) for f in (1.0, 0.6, 1.4, 0.8)]  # a shared CPU: runs of one code vary widely
    c = compare(history[-1], scaled(base(), 0.7), history=history[:-1])
    speed = row(c, "patched", SPEED_STAGE)
    assert speed.call == "inconclusive" and not c.regressions
    assert "within the spread between runs" in " ".join(c.speed_notes)


def test_fewer_than_three_earlier_runs_make_no_speed_call() -> None:
    c = compare(base(), scaled(base(), 0.3), history=[scaled(base(), 0.99)])
    speed = row(c, "patched", SPEED_STAGE)
    assert speed.call == "inconclusive" and not speed.regression
    assert "2 earlier run(s): the spread between runs needs ≥ 3" in " ".join(c.speed_notes)


def test_on_an_emulated_discard_a_drop_is_advisory_unless_counted() -> None:
    *history, old = nights("emulated")
    slow = scaled(base(), 0.5, "emulated")
    c = compare(old, slow, history=history)
    speed = row(c, "patched", SPEED_STAGE)
    assert speed.call == "drop (advisory)" and not speed.regression and not c.regressions
    assert "--count-emulated-speed" in " ".join(c.speed_notes)
    counted = compare(old, slow, history=history, count_emulated_speed=True)
    assert row(counted, "patched", SPEED_STAGE).regression


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


def test_runs_of_different_scenario_files_are_compared_and_say_so() -> None:
    old = base()
    new = replace(old, scenario=dict(old.scenario, sha256="f" * 64))
    c = compare(old, new)
    assert c.files_differ and c.counted and not c.differences
    assert len([r for r in c.rows if r.stage != SPEED_STAGE]) == sum(len(v.stages) for v in old.variants)
    assert "The scenario files differ; their resolved settings are the same." in render_comparison_markdown(c)


def test_missing_variants_and_stages_are_listed() -> None:
    old = base()
    baseline, patched = old.variants
    shorter = replace(patched, stages=patched.stages[:2])
    extra = replace(baseline, name="patched-v2")
    new = replace(old, variants=[shorter, extra])
    c = compare(old, new)
    assert c.only_old == ["tiny-cpu / baseline", "tiny-cpu / patched / after L2 #2"]
    assert c.only_new == ["tiny-cpu / patched-v2"]
    expected = {("patched", "fresh"), ("patched", "after L2 #1"), ("patched", SPEED_STAGE)}
    assert {(r.variant, r.stage) for r in c.rows} == expected


def test_markdown_lists_rows_regressions_and_missing_keys() -> None:
    old = base()
    new = set_stage(old, "patched", "after L2 #1", acceptance_length=3.5)
    new = replace(new, variants=new.variants[1:])
    text = render_comparison_markdown(compare(old, new))
    lines = text.splitlines()
    assert lines[0] == "**specwake compare: 1 regression**"
    table = [line for line in lines if line.startswith("| patched |")]
    assert len(table) == 4  # three stages and the speed row
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


def test_the_settings_that_differ_are_named_key_by_key() -> None:
    old = full()
    new = with_settings(old, "f" * 64, speculative={"num_speculative_tokens": 4}, workload={"max_tokens": 64})
    text = render_comparison_markdown(compare(old, new))
    assert "speculative.num_speculative_tokens 3 → 4" in text and "workload.max_tokens 128 → 64" in text


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
    # the exit code: 1 only for a regression that counts, in any of the comparisons
    assert exit_code([c]) == 0 and exit_code([c, compare(old, cycles_only)]) == 1 and exit_code([]) == 0


def test_differently_named_scenarios_pair_only_when_asked() -> None:
    old = base()
    renamed = replace(old, scenario={**old.scenario, "name": "my-tiny"})
    assert pair_scenarios([old], [renamed]) == ([], ["my-tiny", "tiny-cpu"])
    with pytest.raises(InputError, match="--pair OLD:NEW"):
        compare_runs([old], [renamed])
    comparisons, unmatched = compare_runs([old], [renamed], pairs=[parse_pair("tiny-cpu:my-tiny")])
    assert unmatched == [] and comparisons[0].rows and comparisons[0].rows[0].scenario == "tiny-cpu → my-tiny"
    assert settings_differences(old, renamed) == []  # the name is a label, not a setting
    edited = replace(renamed, scenario={**renamed.scenario, "sha256": "e" * 64})  # renaming edits the file
    comparisons, _ = compare_runs([old], [edited], pairs=[("tiny-cpu", "my-tiny")])  # no --force needed
    assert comparisons[0].counted and comparisons[0].files_differ and not comparisons[0].differences
    with pytest.raises(InputError, match="--pair"):
        parse_pair("tiny-cpu")
    with pytest.raises(InputError, match="old has"):
        compare_runs([old], [renamed], pairs=[("nope", "my-tiny")])


def selected(result: ScenarioResult, names: tuple[str, ...]) -> ScenarioResult:
    """The run as `--variant` selecting `names` records it: only those variants, in the results and the settings."""
    spec: dict[str, object] = {"patch": None, "python": None, "env": {}, "args": [], "speculative": True, "level": 2}
    settings = dict(result.scenario.get("settings") or {})
    settings["variants"] = {name: {**spec, "patch": "/p/fix.diff" if name == "patched" else None} for name in names}
    settings["expect"] = {**settings.get("expect", {}), **{n: {"patched": "recover"}.get(n, "collapse") for n in names}}
    return replace(
        result,
        scenario={**result.scenario, "settings": settings},
        variants=[v for v in result.variants if v.name in names],
    )


def test_a_variant_one_run_did_not_select_is_no_setting_that_differs() -> None:
    old = selected(full(), ("baseline", "patched"))
    new = selected(full(), ("baseline",))
    c = compare(old, new)
    assert c.differences == [] and c.only_old == ["tiny-cpu / patched"]
    assert "Settings differ" not in render_comparison_markdown(c)
    moved = selected(full(), ("baseline", "patched"))  # a variant both ran, with another patch: a real difference
    moved.scenario["settings"]["variants"]["patched"]["patch"] = "/p/other.diff"
    assert [str(d) for d in settings_differences(old, moved)] == [
        "variants.patched.patch '/p/fix.diff' → '/p/other.diff'"
    ]


def measured(result: ScenarioResult, alone: bool) -> ScenarioResult:
    """Every stage of every variant measured alone, or beside other servers' work."""
    variants = [replace(v, stages=[replace(s, measured_alone=alone) for s in v.stages]) for v in result.variants]
    return replace(result, variants=variants)


def test_a_run_measured_alone_against_one_measured_side_by_side_is_marked_and_its_speed_call_advisory() -> None:
    *history, old = [measured(run, alone=True) for run in nights()]
    slow = measured(scaled(base(), 0.5), alone=False)  # half the tok/s: other servers measured meanwhile
    c = compare(old, slow, history=history)
    assert c.measured_differently == ["baseline: alone in old, side by side in new",
                                      "patched: alone in old, side by side in new"]  # fmt: skip
    assert row(c, "patched", "after L2 #1").call == "alone → side by side"
    speed = row(c, "patched", SPEED_STAGE)
    assert speed.call == "drop (advisory)" and not c.regressions and exit_code([c]) == 0
    assert "tok/s measured differently — baseline: alone in old" in render_comparison_markdown(c)
    same_way = compare(old, measured(scaled(base(), 0.5), alone=True), history=history)
    assert same_way.measured_differently == [] and row(same_way, "patched", SPEED_STAGE).regression
    assert compare(base(), base()).measured_differently == []  # results that do not record it: nothing said


def test_an_interrupted_new_run_is_named_unfinished_not_counted_as_regressions() -> None:
    old = base()
    patched = old.variants[1]
    cut = replace(patched, outcome="incomplete", matched=False, stages=patched.stages[:1])
    new = replace(old, variants=[old.variants[0], cut], complete=False)
    c = compare(old, new)
    assert c.unfinished == [f"{old.name} / patched"] and c.regressions == [] and exit_code([c]) == 0
    assert c.only_old == []  # the stages it never reached are not "missing"
    assert [r.stage for r in c.rows if r.variant == "patched"] == ["fresh"]  # what it measured is compared
    text = render_comparison_markdown(c)
    assert f"The new run is incomplete (interrupted): {old.name} / patched unfinished." in text
    finished_wrong = replace(new, variants=[old.variants[0], replace(cut, outcome="collapse")], complete=True)
    assert compare(old, finished_wrong).regressions  # a finished variant that fails still counts
