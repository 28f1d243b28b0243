"""Tests of specwake.report: golden Markdown, stages frame / CSV, run files round trip, load errors.

The golden file is regenerated with SPECWAKE_UPDATE_GOLDEN=1 (then review its diff by eye).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from specwake.errors import InputError, ResultsUnwritable
from specwake.judge.stats import ratio
from specwake.report import (
    STAGE_COLUMNS,
    provenance_line,
    render_csv,
    render_json,
    render_markdown,
    run_files,
    stages_frame,
)
from specwake.report.summary import EMULATED_NOTE, RESET_NOTE
from specwake.results import SCHEMA, Push, ScenarioResult, StepResult, VariantResult, from_dict
from specwake.runfolder import load_result, write_files
from specwake.weight_updates import RELOAD_KIND
from tests.helpers.builders import (
    PATCH_SHA,
    SAMPLE,
    SCENARIO_SHA,
    graphed_gpu,
    measured_stage,
    reported_variant,
    scenario,
    tiny_cpu,
)
from tests.helpers.paths import DATA

GOLDEN = DATA / "golden-report.md"
# ------------------------------------------------------------ Markdown


def _normalised(text: str) -> str:
    return re.sub(r"started \S+?(?=</sub>)", "started <time>", text)


def _stage_table(text: str) -> list[str]:
    """The lines of the first stage table (the wide one, under the compact table)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| variant "))
    return list(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))


def _table_rows(text: str, variant: str) -> list[list[str]]:
    """The variant's rows of the first stage table."""
    rows = [line for line in _stage_table(text) if line.startswith(f"| {variant} ")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row.strip("|"))] for row in rows]


def test_markdown_matches_golden_file() -> None:
    text = _normalised(render_markdown([tiny_cpu(), graphed_gpu()]))
    if os.environ.get("SPECWAKE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


def test_banner_counts_variants_and_names_the_failures() -> None:
    assert render_markdown([tiny_cpu()]).splitlines()[0] == (
        "## specwake: ✅ PASS — 1 scenario, 2/2 variants as expected"
    )
    result = tiny_cpu()
    wrong = replace(result.variants[1], outcome="collapse", matched=False)
    failing = replace(result, verdict="fail", variants=[result.variants[0], wrong])
    banner = render_markdown([failing, graphed_gpu()]).splitlines()[0]
    assert banner.startswith("## specwake: ❌ FAIL — 2 scenarios, 2/4 variants as expected — ")
    assert "tiny-cpu/patched collapse, expected recover" in banner
    assert "eagle3-graphed/patched|v2 not measured (startup_failed)" in banner
    assert render_markdown([graphed_gpu()]).startswith("## specwake: ⚠️ ERROR — 1 scenario, 1/2 variants")
    assert render_markdown([]).startswith("## specwake: ⚠️ ERROR — 0 scenarios, 0/0 variants as expected")


def test_stage_table_numbers_match_an_independent_computation() -> None:
    result = tiny_cpu()
    text = render_markdown([result])
    for variant in result.variants:
        rows = _table_rows(text, variant.name)
        assert [r[1] for r in rows] == [s.name for s in variant.stages]
        fresh = variant.stages[0]
        for row, stage in zip(rows, variant.stages, strict=True):
            samples = sorted(stage.tok_s)  # n=3 < 6: the interval is the full range
            assert row[2] == f"{stage.acceptance_length:.2f}"
            assert row[3] == str(stage.num_drafts)
            assert row[4] == f"{stage.num_accepted_tokens}/{stage.num_draft_tokens}"
            assert row[5] == f"{statistics.median(samples):.1f} [{samples[0]:.1f}, {samples[-1]:.1f}]"
            assert row[7] == "–" and row[8] == "–"  # the fixture records no TPOT / TTFT (results before them)
            if stage.cycle == 0:
                assert row[6] == "–" and row[9] == "–"
            else:
                r = ratio(stage.tok_s, fresh.tok_s)
                value = statistics.median(stage.tok_s) / statistics.median(fresh.tok_s)
                assert row[6] == f"{value:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
                assert r.ci_low <= value <= r.ci_high
                assert row[9] == "yes"
            assert row[10] == str(len(stage.tok_s))  # results from before stages could stop early: the count


def test_requests_and_why_each_stage_stopped_are_shown() -> None:
    result = tiny_cpu()
    baseline = result.variants[0]
    why = [
        "fixed: the fresh stage is the reference",
        "decided after 2 requests: AL below the recover bound 3.80 and the collapse line 1.05 (α 0.01)",
        "cap: 3 requests (repeats); undecided: AL against the recover bound 3.80",
    ]
    stages = [replace(s, requests=n, stopped=w) for s, n, w in zip(baseline.stages, (3, 2, 3), why, strict=True)]
    settings = dict(result.scenario["settings"])
    settings["workload"] = {**settings["workload"], "min_repeats": None}  # unset: 2, as the scenario file allows
    stopped = replace(
        result, variants=[replace(baseline, stages=stages), *result.variants[1:]], scenario={**result.scenario,
        "settings": settings},
    )  # fmt: skip
    text = render_markdown([stopped])
    assert [row[10] for row in _table_rows(text, "baseline")] == ["3 (fixed)", "2 (decided)", "3 (cap)"]
    assert [row[10] for row in _table_rows(text, "patched")] == ["3", "3", "3"]  # recorded before: the count
    assert "3 requests (2–3 after a cycle) × 64 tokens per stage" in text
    assert "3 requests × 64 tokens per stage" in render_markdown([result])  # no min_repeats recorded: no range
    assert f"- after L2 #1: 2 — {why[1]}" in text and "baseline: per-position acceptance, requests per stage" in text
    frame = stages_frame([stopped])
    assert frame["requests"].tolist() == [3, 2, 3, 3, 3, 3]
    assert frame["stopped"].tolist()[:3] == why and frame["stopped"].isna().tolist()[3:] == [True] * 3


def test_stage_table_has_stable_widths_and_stage_order() -> None:
    result = tiny_cpu()
    baseline = result.variants[0]
    faster = [replace(s, tok_s=[x * 15 for x in s.tok_s]) for s in baseline.stages]  # 41 → 617 tok/s
    shuffled = replace(baseline, stages=list(reversed(faster)))
    other = replace(result, variants=[shuffled, result.variants[1]])
    table_a, table_b = _stage_table(render_markdown([result])), _stage_table(render_markdown([other]))
    assert len(table_a) == len(table_b) == 2 + 6
    assert [len(line) for line in table_a] == [len(line) for line in table_b]
    assert [r[1] for r in _table_rows("\n".join(table_b), "baseline")] == ["fresh", "after L2 #1", "after L2 #2"]


def _speed_variant(fresh: list[float], after: list[float]) -> VariantResult:
    stages = [measured_stage(0, 64, 192, fresh, None), measured_stage(1, 64, 192, after, True)]
    return reported_variant("v", "recover", "recover", stages)


def test_speed_line_says_the_pooled_call_and_whether_it_counts() -> None:
    fresh = [100.0, 101.0, 99.0, 100.5, 100.2]
    halved = [measured_stage(c, 64, 192, [x / 2 for x in fresh], True) for c in (1, 2)]
    lost = reported_variant("v", "degraded", "recover", [measured_stage(0, 64, 192, fresh, None), *halved])
    explicit = scenario("s", "fail", [lost])
    text = render_markdown([explicit])
    assert "tok/s after the cycles: 0.50× fresh (5 vs 10 requests): **lost** — below 0.90× fresh" in text
    assert "counts: set by the scenario (expect.min_speedup_recovery), threshold 0.90× fresh" in text
    unset = replace(explicit, scenario={**explicit.scenario, "settings": {"expect": {"tolerance": 0.05}}})
    assert "advisory: the L2 discard is emulated (CPU)" in render_markdown([unset])


def test_variant_lines_carry_outcome_explanation_and_speed_call() -> None:
    text = render_markdown([tiny_cpu()])
    assert "- **baseline**: collapse (expected collapse) ✓ — AL 4.00 → 1.00 → 1.00 (after L2 #1: " in text
    assert "× fresh (3 vs 6 requests): **inconclusive** — too few requests for a 1% test" in text
    assert "- **patched**: recover (expected recover) ✓ — AL 4.00 → 4.00 → 3.92" in text
    assert "(3 fresh need ≥ 7 post-cycle); counts: set by the scenario" in text
    assert EMULATED_NOTE.format(fill="zeros", restored=RELOAD_KIND.restored_by) in text


def test_patched_over_baseline_ratio_line() -> None:
    result = tiny_cpu()
    base, patched = result.variants
    top = [x for s in patched.stages[1:] for x in s.tok_s]
    bottom = [x for s in base.stages[1:] for x in s.tok_s]
    r = ratio(top, bottom)
    value = statistics.median(top) / statistics.median(bottom)
    line = f"- patched / baseline tok/s after the cycles: {value:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
    assert line + " (median over all post-cycle requests, n=6 vs 6)" in render_markdown([result])
    assert "patched / baseline" not in render_markdown([graphed_gpu()])  # no post-cycle stages to compare


def test_details_per_variant_with_positions_steps_diagnostics_and_command() -> None:
    result = tiny_cpu()
    text = render_markdown([result])
    assert text.count("<details>") == text.count("</details>") == 1 + len(result.variants)  # the stage table's, each's
    base = result.variants[0]
    assert "| stage | pos 1 | pos 2 | pos 3 |" in text
    per_pos = base.stages[0].num_accepted_tokens / base.stages[0].num_drafts / 3
    assert f"| fresh | {per_pos:.2f} | {per_pos:.2f} | {per_pos:.2f} |" in text
    assert "| 1 | sleep | 200 | 0.120 |" in text and "| 1 | discard | 200 | 0.050 |" in text
    assert "- draft: 7/15 parameters all-zero or on meta after reload_weights" in text
    assert "- device memory: n/a" in text
    assert "- time: startup 30.2 s · measurement 7.5 s" in text
    command = "VLLM_SERVER_DEV_MODE=1 /venv/bin/python -m vllm.entrypoints.openai.api_server"
    assert f"```sh\n{command}\n```" in text


def test_failed_step_is_marked_and_its_error_listed() -> None:
    result = tiny_cpu()
    failed = StepResult(1, "reload_weights", "POST", "/collective_rpc", 500, 1.5, False, "boom <here>", None)
    variant = replace(result.variants[0], steps=[*result.variants[0].steps, failed])
    text = render_markdown([replace(result, variants=[variant])])
    assert "| 1 | reload_weights | 500 ✗ | 1.500 |" in text
    assert "- cycle 1 reload_weights failed: boom &lt;here>" in text


def test_crash_details_show_class_crash_lines_and_fenced_log() -> None:
    text = render_markdown([graphed_gpu()])
    assert "<summary>baseline: crash (step_failed), per-position acceptance, cycle steps, server command<" in text
    assert "<summary>patched|v2: error (startup_failed), cycle steps, diagnostics, server command<" in text
    assert "**crash** — class `step_failed`" in text
    assert "Log lines that decided the class:\n\n```\nRuntimeError: CUDA error: an illegal memory access\n```" in text
    assert "Log excerpt (`results/run/logs/baseline.log`):\n\n````\nRuntimeError: CUDA error" in text
    assert "**error** — class `startup_failed`" in text and "ImportError: cannot import name 'X'" in text


def test_provenance_footer() -> None:
    result = graphed_gpu()
    footer = provenance_line(result)
    assert footer.startswith("<sub>specwake 0.1.0 · vLLM: baseline 0.32.0, patched|v2 – · ")
    for part in (
        f"patch sha256: patched|v2 {PATCH_SHA[:12]}",
        f"scenario sha256: {SCENARIO_SHA[:12]}",
        "Python 3.11.7",
        "host ci-runner",
        "GPUs: baseline 0,1; patched|v2 2,3",
        "L2 discard: native",
        "mode: sequential",
        "tok/s CI: range (n<6)",
        "started 2025-06-01T12:00:00Z",
    ):
        assert part in footer, part
    assert "GPUs" not in provenance_line(tiny_cpu())  # CPU runs have no GPUs to name
    assert "ratio CI: bootstrap percentile 95% (2000 resamples, seed 0)" in provenance_line(tiny_cpu())
    assert footer in render_markdown([result])


def test_markdown_missing_values_are_dashes_and_native_runs_have_no_note() -> None:
    result = graphed_gpu()
    text = render_markdown([result])
    assert "L2 discard emulated on CPU" not in text
    fresh = ["baseline", "fresh", "3.20", "50", "110/150", "88.0 (n=1)", "–", "–", "–", "–", "1", "V1"]
    assert _table_rows(text, "baseline")[0] == fresh
    assert _table_rows(text, "patched\\|v2")[0] == ["patched\\|v2", "no stage measured", *["–"] * 10]


def test_markdown_marks_stages_whose_counters_went_backwards() -> None:
    result = tiny_cpu()
    assert RESET_NOTE not in render_markdown([result])
    patched = result.variants[1]
    restarted = replace(patched.stages[1], counters_reset=True)
    stages = [patched.stages[0], restarted, *patched.stages[2:]]
    changed = replace(result, variants=[result.variants[0], replace(patched, stages=stages)])
    text = render_markdown([changed])
    assert RESET_NOTE in text
    assert [r[2] for r in _table_rows(text, "patched")] == ["4.00", "4.00 †", "3.92"]


def test_markdown_of_a_partial_result_marks_the_running_variant() -> None:
    result = tiny_cpu()
    running = replace(result.variants[1], outcome="incomplete", matched=False)
    partial = replace(result, variants=[result.variants[0], running], complete=False)
    text = render_markdown([partial])
    assert "### tiny-cpu — ✅ PASS (incomplete run)" in text
    assert "- **patched**: incomplete (expected recover) … — not finished; AL 4.00" in text
    assert "tiny-cpu/patched unfinished" in text.splitlines()[0]


def test_markdown_free_text_cannot_inject_html() -> None:
    text = render_markdown([graphed_gpu()])
    outside_fences = re.sub(r"(`{3,})[^\n]*\n.*?\n\1\n", "", text, flags=re.S)  # code blocks show text as is
    assert "<html>" not in outside_fences and "&lt;html> error page" in outside_fences
    assert "answered 500: <html> error page\n```" in text


def test_render_json_is_a_list_of_result_objects() -> None:
    results = [tiny_cpu(), graphed_gpu()]
    data = json.loads(render_json(results))
    assert isinstance(data, list) and [from_dict(d) for d in data] == results


# ------------------------------------------------------------ frame and files


def test_stages_frame_columns_and_rows() -> None:
    results = [tiny_cpu(), graphed_gpu()]
    frame = stages_frame(results)
    assert list(frame.columns) == list(STAGE_COLUMNS)
    assert len(frame) == sum(len(v.stages) for r in results for v in r.variants)
    first = results[0].variants[0].stages[0]
    assert frame.iloc[0]["acceptance_rate"] == pytest.approx(first.num_accepted_tokens / first.num_draft_tokens)
    assert stages_frame([]).columns.tolist() == list(STAGE_COLUMNS)


def test_render_csv_carries_intervals_and_ratio_to_fresh() -> None:
    result = tiny_cpu()
    frame = pd.read_csv(io.StringIO(render_csv([result])))
    assert list(frame.columns) == list(STAGE_COLUMNS) and len(frame) == 6
    base = result.variants[0]
    after = frame[(frame["variant"] == "baseline") & (frame["cycle"] == 1)].iloc[0]
    expected = statistics.median(base.stages[1].tok_s) / statistics.median(base.stages[0].tok_s)
    assert after["tok_s_vs_fresh"] == pytest.approx(expected)
    assert after["tok_s_ci_low"] == min(base.stages[1].tok_s) and after["tok_s_ci_high"] == max(base.stages[1].tok_s)
    assert pd.isna(frame.iloc[0]["tok_s_vs_fresh"])  # the fresh stage has no ratio to itself


def test_write_files_and_load_round_trip(tmp_path: Path) -> None:
    result = graphed_gpu()
    run_dir = tmp_path / "20250601-120000-eagle3-graphed"
    write_files(run_dir, run_files(result))
    assert sorted(p.name for p in run_dir.iterdir()) == ["report.md", "result.json", "stages.csv"]
    assert load_result(run_dir) == result
    assert load_result(run_dir / "result.json") == result
    assert (run_dir / "report.md").read_text(encoding="utf-8") == render_markdown([result])
    csv = pd.read_csv(run_dir / "stages.csv")
    assert list(csv.columns) == list(STAGE_COLUMNS)
    assert len(csv) == sum(len(v.stages) for v in result.variants)


def test_write_files_replaces_a_previous_result(tmp_path: Path) -> None:
    partial = replace(tiny_cpu(), complete=False, verdict="error")
    write_files(tmp_path, run_files(partial))
    write_files(tmp_path, run_files(tiny_cpu()))
    assert load_result(tmp_path) == tiny_cpu()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_write_files_unwritable_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ResultsUnwritable, match=str(blocker)):
        write_files(blocker / "run", run_files(tiny_cpu()))


def test_old_sample_result_still_loads() -> None:
    raw = json.loads(SAMPLE.read_text(encoding="utf-8"))
    result = load_result(SAMPLE)
    assert result.schema == raw["schema"] == SCHEMA
    assert result.verdict == raw["verdict"]
    assert [v.name for v in result.variants] == [v["name"] for v in raw["variants"]]
    stages = result.variants[0].stages
    assert [s.acceptance_length for s in stages] == [s["acceptance_length"] for s in raw["variants"][0]["stages"]]
    text = render_markdown([result])
    assert text.startswith(f"## specwake: ✅ {raw['verdict'].upper()}")
    assert "mode: –" in text and "<details>" in text  # older results lack run mode and diagnostics
    assert result.tested_releases == [] and all(v.vllm_warnings == [] for v in result.variants)  # fields added since


# ------------------------------------------------------------ load errors


def _error_for(path: Path) -> str:
    with pytest.raises(InputError) as info:
        load_result(path)
    assert str(info.value).startswith(str(path))
    return str(info.value)


def test_load_missing_file_and_folder_without_result(tmp_path: Path) -> None:
    assert "no such file" in _error_for(tmp_path / "nope.json")
    assert "no such file" in _error_for(tmp_path / "result.json")


def test_load_bad_json(tmp_path: Path) -> None:
    bad = tmp_path / "result.json"
    bad.write_text('{"schema": "specwake.result/1",', encoding="utf-8")
    assert "invalid JSON" in _error_for(bad)


def test_load_unknown_schema(tmp_path: Path) -> None:
    data = json.loads(SAMPLE.read_text(encoding="utf-8")) | {"schema": "specwake.result/99"}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert "specwake.result/99" in _error_for(path)


@pytest.mark.parametrize("content", ["[1, 2]", '{"schema": "specwake.result/1"}', "\udcff"])
def test_load_not_a_result(tmp_path: Path, content: str) -> None:
    path = tmp_path / "result.json"
    path.write_bytes(content.encode("utf-8", errors="surrogateescape"))
    _error_for(path)


def test_a_push_runs_footnote_names_the_push_not_a_reload_that_never_ran() -> None:
    result = tiny_cpu()
    settings = {
        **result.scenario["settings"],
        "cycle": {**result.scenario["settings"].get("cycle", {}), "reload": "push"},
    }
    pushed = [
        replace(v, push=Push(("target", "draft") if v.name == "patched" else ("target",))) for v in result.variants
    ]
    text = render_markdown([replace(result, scenario={**result.scenario, "settings": settings}, variants=pushed)])
    note = next(line for line in text.splitlines() if line.startswith("> L2 discard emulated"))
    assert "reload_weights" not in note
    assert "specwake's push (baseline: target; patched: target and draft)" in note
    assert "- **patched**: recover (expected recover) ✓ · pushed target and draft —" in text


def test_runs_of_one_scenario_are_told_apart_by_what_differs() -> None:
    """Three runs of tiny-cpu, two fixes and stock vLLM alone: counted as runs of one scenario, each named by what
    differs (its patch file; the variants it ran), never by when it started, in the compact table and its heading."""
    first = tiny_cpu()
    baseline, patched = first.variants
    other_fix = replace(first, variants=[baseline, replace(patched, patch="/tmp/fix-b.diff")], started_at="2026-12-02")
    stock = replace(first, variants=[baseline], started_at="2026-12-03")
    text = render_markdown([first, other_fix, stock])
    assert text.startswith("## specwake: ✅ PASS — 3 runs of tiny-cpu, 5/5 variants as expected\n")
    # The variants differ too, but the patch files alone tell the three apart
    labels = ["tiny-cpu (patch draft-reload.diff)", "tiny-cpu (patch fix-b.diff)", "tiny-cpu (no patch)"]
    for label in labels:
        assert f"### {label} — ✅ PASS" in text and f"| {label} | baseline |" in text
    assert "2026-12-02" not in text.split("<sub>")[0]  # the start time is in the footers alone
    only_fix = replace(first, variants=[patched])  # the same patch: the variants tell them apart
    assert "### tiny-cpu (variant patched) — ✅ PASS" in render_markdown([first, only_fix])
    # Runs that differ in nothing but when they ran: their run folders (as `report` loads them), or start times
    again = [
        replace(first, scenario={**first.scenario, "run": name}) for name in ("20261201-0217-a", "20261202-0217-a")
    ]
    assert "### tiny-cpu (run 20261202-0217-a) — ✅ PASS" in render_markdown(again)
    assert "### tiny-cpu (started 2026-12-02) — ✅ PASS" in render_markdown(
        [first, replace(first, started_at="2026-12-02")]
    )
    assert "### tiny-cpu — ✅ PASS" in render_markdown([first])  # one run: its name alone
    assert render_markdown([first, graphed_gpu()]).startswith("## specwake: ⚠️ ERROR — 2 scenarios,")
    assert render_markdown([first, first, graphed_gpu()]).split(",")[0].endswith("— 3 runs of 2 scenarios")
    frame = pd.read_csv(io.StringIO(render_csv([first, other_fix])))
    assert sorted(set(frame["run"])) == sorted({first.started_at, other_fix.started_at})


def test_markdown_of_a_partial_result_names_the_variants_that_never_ran() -> None:
    """A run killed outright leaves a partial result listing every planned variant; one with nothing recorded reads
    `not run` in the verdict line, the matrix, the table and its own line (not `unfinished`)."""
    result = tiny_cpu()
    never = replace(result.variants[1], outcome="incomplete", matched=False, stages=[], steps=[], diagnostics=[])
    assert never.not_run and not result.variants[0].not_run
    assert not replace(never, stages=result.variants[1].stages[:1]).not_run  # cut short: unfinished, not "not run"
    partial = replace(result, variants=[result.variants[0], never], complete=False)
    text = render_markdown([partial, replace(partial, scenario={**partial.scenario, "name": "other"})])
    assert "tiny-cpu/patched not run" in text.splitlines()[0]
    assert "| not run … (expected recover) |" in text  # the scenario × variant matrix
    assert re.search(r"^\| patched +\| not run +\|", text, re.MULTILINE)
    assert "- **patched**: incomplete (expected recover) … — not run: nothing recorded" in text


def test_the_header_names_a_vllm_of_no_tested_release() -> None:
    result = tiny_cpu()
    on = lambda *versions: replace(  # noqa: E731
        result, variants=[replace(v, vllm_version=x) for v, x in zip(result.variants, versions, strict=True)]
    )
    header = render_markdown([on("0.35.0", "0.33.1")]).split("\n### ")[0]
    assert "untested vLLM release**: 0.35.0 (tiny-cpu/baseline); specwake is tested against vLLM 0.32.0, 0.33.0," in (
        header
    )
    for tested in (("0.33.1", "0.34.1.dev3+g0123abcd"), (None, "0.32.0")):  # a release's series; or not known
        assert "untested" not in render_markdown([on(*tested)])
    # The releases the specwake that ran it was tested against, where the result records them
    older = replace(on("0.33.0", "0.32.0"), tested_releases=["0.32.0"])
    assert "untested vLLM release**: 0.33.0 (tiny-cpu/baseline); specwake is tested against vLLM 0.32.0\n" in (
        render_markdown([older])
    )


def test_a_warning_vllm_logged_is_quoted_beside_its_variants_verdict() -> None:
    result = tiny_cpu()
    warned = replace(result.variants[0], vllm_warnings=["Level 2 sleep discards draft model weights; <keep> them."])
    text = render_markdown([replace(result, variants=[warned, result.variants[1]])])
    line = next(line for line in text.splitlines() if line.startswith("- **baseline**: "))
    assert "; vLLM warned: “Level 2 sleep discards draft model weights; &lt;keep> them.”" in line
    assert "vLLM warned" not in next(line for line in text.splitlines() if line.startswith("- **patched**: "))


def test_an_interrupted_run_says_how_to_finish_it() -> None:
    """The command that runs only the unfinished variants into the same run folder (the one its logs lie in), with
    every scenario file of that run and the run's shard."""
    result = tiny_cpu()
    run = "/ci/results/20261201-021700-2-scenarios"
    logged = [replace(v, log_path=f"{run}/tiny-cpu/logs/{v.name}.log") for v in result.variants]
    cut = replace(logged[1], outcome="incomplete", matched=False)
    partial = replace(result, variants=[logged[0], cut], complete=False, scenario={**result.scenario, "shard": "2/4"})
    named = {**result.scenario, "name": "cpu-eagle3", "file": "scenarios/cpu/eagle 3.toml"}
    other = replace(
        result, scenario=named, variants=[replace(v, log_path=f"{run}/cpu-eagle3/logs/{v.name}.log") for v in logged]
    )
    text = render_markdown([partial, other])
    assert (
        "> ⏸ interrupted, unfinished: tiny-cpu/patched — `specwake run scenarios/tiny-cpu.toml"
        f" 'scenarios/cpu/eagle 3.toml' --resume {run} --shard 2/4` runs only those\n"
    ) in text
    assert "--resume" not in render_markdown([result, other])  # nothing to finish


def many_scenarios(count: int) -> list[ScenarioResult]:
    """A night of `count` scenarios like tiny-cpu (each with its evidence), one run folder each; the last fails."""
    runs = []
    for n in range(count):
        result = tiny_cpu()
        runs.append(replace(result, scenario={**result.scenario, "name": f"family-{n}", "run": f"20261201-{n:06d}-x"}))
    failing = replace(runs[-1].variants[1], outcome="collapse", matched=False)
    runs[-1] = replace(runs[-1], verdict="fail", variants=[runs[-1].variants[0], failing])
    return runs


def test_the_compact_table_comes_first_and_the_rest_is_folded() -> None:
    text = render_markdown([tiny_cpu(), graphed_gpu()])
    lines = text.splitlines()
    assert lines[2] == (
        "| scenario | variant | AL per stage | tok/s after the cycles vs fresh | wake + reload | verdict |"
    )
    assert lines[4] == (
        "| tiny-cpu | baseline | 4.00 → 1.00 → 1.00 | 0.37× (inconclusive) | 0.030 s (0.011× first load) | collapse ✓ |"
    )
    assert lines[7] == "| eagle3-graphed | patched\\|v2 | no stage measured | – | – | error ⚠ (expected recover) |"
    wide, bullet = lines.index(_stage_table(text)[0]), next(i for i, ln in enumerate(lines) if ln.startswith("- **"))
    opened = max(i for i, line in enumerate(lines[:wide]) if line == "<details>")
    assert lines[opened + 1] == "<summary>tiny-cpu: stage table, and why each variant's outcome</summary>"
    assert "</details>" not in lines[opened:bullet]  # the verdict lines are in the same fold
    # tok/s: a clear loss says whether it counts (here the L2 discard is emulated and the scenario sets no threshold)
    result = tiny_cpu()
    slowed = [measured_stage(0, 64, 192, [41.0, 40.5, 42.0, 40.0, 41.5], None),
              *(measured_stage(c, 192, 0, [15.5, 15.25, 15.75], True) for c in (1, 2))]  # fmt: skip
    expect = {**result.scenario["settings"]["expect"], "min_speedup_recovery": None}
    unset = {**result.scenario, "settings": {**result.scenario["settings"], "expect": expect}}
    lost = replace(result, variants=[replace(result.variants[0], stages=slowed)])
    assert (
        "| tiny-cpu | baseline | 4.00 → 1.00 → 1.00 | 0.38× (lost) | 0.030 s (0.011× first load) | collapse ✓ |"
        in render_markdown([lost])
    )
    advisory = render_markdown([replace(lost, scenario=unset)])
    assert (
        "| tiny-cpu | baseline | 4.00 → 1.00 → 1.00 | 0.38× (lost, advisory) | 0.030 s (0.011× first load)"
        " | collapse ✓ |" in advisory
    )


def test_a_whole_night_fits_one_github_comment_and_says_where_the_rest_is() -> None:
    from specwake.report.fit import COMMENT_LIMIT

    night = many_scenarios(14)
    full = render_markdown(night)
    assert len(full) > COMMENT_LIMIT  # the night as report.md keeps it
    text = render_markdown(night, COMMENT_LIMIT)
    assert len(text) <= COMMENT_LIMIT
    assert all(f"| family-{n} | {v} |" in text for n in range(14) for v in ("baseline", "patched"))  # every row
    note = next(line for line in text.splitlines() if line.startswith("> ✂️"))
    left = int(re.search(r"left out: (\d+) variants' evidence \(`<details>` blocks\)\. ", note).group(1))  # type: ignore[union-attr]
    assert "(65,536 characters)" in note and "report.md has everything (`20261201-000000-x`, " in note
    assert text.count("<summary>baseline: ") + text.count("<summary>patched: ") == 28 - left
    # The failing scenario loses nothing: what went wrong and its evidence are what the reader came for
    failing = text[text.index("### family-13 — ❌ FAIL") :]
    assert "- **patched**: collapse (expected recover) ✗" in failing and "<summary>patched: " in failing
    assert render_markdown(night[:2], COMMENT_LIMIT) == render_markdown(night[:2])  # fits: as it is
