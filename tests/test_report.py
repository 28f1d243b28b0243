"""Tests of specwake.report: golden Markdown, stages frame / CSV, run files round trip, load errors.

The golden file is regenerated with SPECWAKE_UPDATE_GOLDEN=1 (then review its diff by eye).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from specwake.errors import InputError, ResultsUnwritable
from specwake.report import (
    EMULATED_NOTE,
    RESET_NOTE,
    STAGE_COLUMNS,
    load_result,
    render_markdown,
    stages_frame,
    write_run_files,
)
from specwake.results import SCHEMA, ScenarioResult, StageResult, StepResult, VariantResult

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden-report.md"
SAMPLE_V1 = DATA / "result-v1-sample.json"
PATCH_SHA = "3f2a9c1b0d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
SCENARIO_SHA = "9a8b7c6d5e4f30211203a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5"


def _stage(cycle: int, drafts: int, accepted: int, tok_s: list[float], match: bool | None):
    k = 3
    return StageResult(
        name="fresh" if cycle == 0 else f"after L2 #{cycle}",
        cycle=cycle,
        acceptance_length=1 + accepted / drafts if drafts else None,
        num_drafts=drafts,
        num_draft_tokens=drafts * k,
        num_accepted_tokens=accepted,
        per_position=[accepted / drafts / k] * k if drafts else [],
        tok_s=tok_s,
        tok_s_median=sorted(tok_s)[len(tok_s) // 2] if tok_s else None,
        completion_tokens=[64] * len(tok_s),
        outputs=["The quick brown fox"] * len(tok_s),
        outputs_match_fresh=match,
    )


def _variant(name: str, outcome: str, expected: str, stages: list[StageResult], **kw):
    base = VariantResult(
        name=name,
        outcome=outcome,
        expected=expected,
        matched=outcome != "error" and expected in ("any", outcome),
        platform="cpu",
        l2_discard="emulated",
        vllm_version="0.32.0",
        vllm_file="/venv/lib/python3.11/site-packages/vllm/__init__.py",
        python="/venv/bin/python",
        patch=None,
        patch_sha256=None,
        overlay=None,
        command=["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
        env={"VLLM_SERVER_DEV_MODE": "1"},
        stages=stages,
        steps=[
            StepResult(1, "sleep", "POST", "/sleep?level=2", 200, 0.12, True, None, None),
            StepResult(1, "discard", "POST", "/collective_rpc", 200, 0.05, True, None, {"n": 2}),
        ],
        info={"device": "cpu"},
        seconds=61.5,
    )
    return replace(base, **kw)


def _scenario(name: str, verdict: str, variants: list[VariantResult]) -> ScenarioResult:
    return ScenarioResult(
        scenario={
            "name": name,
            "file": f"scenarios/{name}.toml",
            "sha256": SCENARIO_SHA,
            "settings": {"expect": {"tolerance": 0.05}},
        },
        verdict=verdict,
        started_at="2025-06-01T12:00:00Z",
        finished_at="2025-06-01T12:04:10Z",
        host={"hostname": "ci-runner", "platform": "Linux-x86_64"},
        variants=variants,
        specwake_version="0.1.0",
    )


def tiny_cpu() -> ScenarioResult:
    """A passing run: baseline collapses, patched recovers (both with the emulated discard)."""
    baseline = _variant(
        "baseline",
        "collapse",
        "collapse",
        [
            _stage(0, 64, 192, [41.25, 40.5, 42.0], None),
            _stage(1, 192, 0, [15.5, 15.25, 15.75], True),
            _stage(2, 192, 0, [15.0, 15.5, 15.25], True),
        ],
    )
    patched = _variant(
        "patched",
        "recover",
        "recover",
        [
            _stage(0, 64, 192, [41.0, 40.75, 42.5], None),
            _stage(1, 64, 192, [40.25, 41.5, 40.0], True),
            _stage(2, 65, 190, [39.5, 40.0, 41.0], True),
        ],
        patch="patches/draft-reload.diff",
        patch_sha256=PATCH_SHA,
        overlay="/cache/specwake/overlays/3f2a9c1b",
    )
    return _scenario("tiny-cpu", "pass", [baseline, patched])


def graphed_gpu() -> ScenarioResult:
    """A run with a crash after partial measurement, an unready server and awkward text."""
    crashed = _variant(
        "baseline",
        "crash",
        "crash",
        [_stage(0, 50, 110, [88.0], None)],
        platform="cuda",
        l2_discard="native",
        crash_class="step_failed",
        error="POST /wake_up?tags=kv_cache answered 500: <html> error page",
        log_path="results/run/logs/baseline.log",
        log_excerpt="RuntimeError: CUDA error: an illegal memory access\n```inner fence```",
    )
    unready = _variant(
        "patched|v2",
        "error",
        "recover",
        [],
        platform="cuda",
        l2_discard="native",
        vllm_version=None,
        crash_class="startup_failed",
        error="server exited with code 1 before /health answered",
        log_excerpt="ImportError: cannot import name 'X'",
        patch_sha256=PATCH_SHA,
    )
    return _scenario("eagle3-graphed", "error", [crashed, unready])


# ------------------------------------------------------------ Markdown


def test_markdown_matches_golden_file() -> None:
    text = render_markdown([tiny_cpu(), graphed_gpu()])
    if os.environ.get("SPECWAKE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


def test_markdown_verdict_line_and_variant_lines() -> None:
    lines = render_markdown([tiny_cpu()]).splitlines()
    assert lines[0] == "**specwake: PASS** — tiny-cpu: 2/2 variants as expected"
    assert any(line.startswith("- baseline: collapse (expected collapse) ✓ — AL ") for line in lines)
    assert EMULATED_NOTE in "\n".join(lines)


def test_markdown_overall_verdict_is_the_worst() -> None:
    failing = replace(tiny_cpu(), verdict="fail")
    text = render_markdown([tiny_cpu(), graphed_gpu(), failing])
    assert text.startswith("**specwake: FAIL**")
    assert render_markdown([]).startswith("**specwake: ERROR** — no scenario results")


def test_markdown_one_table_row_per_stage_in_order() -> None:
    result = tiny_cpu()
    rows = [line for line in render_markdown([result]).splitlines() if line.startswith("| ")]
    stages = [(v.name, s) for v in result.variants for s in v.stages]
    assert rows[1].startswith("| --- |")  # header, alignment row, then one row per stage
    assert len(rows) == 2 + len(stages)
    for row, (name, st) in zip(rows[2:], stages, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:2] == [name, st.name]
        assert cells[2] == f"{st.acceptance_length:.2f}"
        assert cells[4] == f"{st.num_accepted_tokens}/{st.num_draft_tokens}"
        assert cells[5] == f"{st.tok_s_median:.1f}"


def test_markdown_missing_values_are_dashes_and_native_runs_have_no_note() -> None:
    result = graphed_gpu()
    text = render_markdown([result])
    assert EMULATED_NOTE not in text
    assert "| baseline | fresh | 3.20 | 50 | 110/150 | 88.0 | – |" in text
    assert "| patched\\|v2 | no stage measured | – | – | – | – | – |" in text
    assert "vLLM: baseline 0.32.0, patched|v2 –" in text


def test_markdown_marks_stages_whose_counters_went_backwards() -> None:
    result = tiny_cpu()
    assert RESET_NOTE not in render_markdown([result])
    patched = result.variants[1]
    restarted = replace(patched.stages[1], counters_reset=True)
    stages = [patched.stages[0], restarted, *patched.stages[2:]]
    changed = replace(result, variants=[result.variants[0], replace(patched, stages=stages)])
    text = render_markdown([changed])
    assert RESET_NOTE in text
    assert f"| patched | {restarted.name} | {restarted.acceptance_length:.2f} † |" in text
    assert text.count(" † |") == 1


def test_markdown_of_a_partial_result_marks_the_running_variant() -> None:
    result = tiny_cpu()
    running = replace(result.variants[1], outcome="incomplete", matched=False)
    partial = replace(result, variants=[result.variants[0], running], complete=False)
    text = render_markdown([partial])
    assert "### tiny-cpu — PASS (incomplete run)" in text
    assert "- patched: incomplete (expected recover) … — not finished; AL 4.00" in text


def test_markdown_log_fence_outgrows_backticks_in_the_excerpt() -> None:
    text = render_markdown([graphed_gpu()])
    assert "````\nRuntimeError: CUDA error" in text


def test_markdown_free_text_cannot_inject_html() -> None:
    text = render_markdown([graphed_gpu()])
    assert "<html>" not in text and "&lt;html> error page" in text


# ------------------------------------------------------------ frame and files


def test_stages_frame_columns_and_rows() -> None:
    results = [tiny_cpu(), graphed_gpu()]
    frame = stages_frame(results)
    assert list(frame.columns) == list(STAGE_COLUMNS)
    assert len(frame) == sum(len(v.stages) for r in results for v in r.variants)
    first = results[0].variants[0].stages[0]
    assert frame.iloc[0]["acceptance_rate"] == pytest.approx(first.num_accepted_tokens / first.num_draft_tokens)
    assert stages_frame([]).columns.tolist() == list(STAGE_COLUMNS)


def test_write_run_files_and_load_round_trip(tmp_path: Path) -> None:
    result = graphed_gpu()
    run_dir = tmp_path / "20250601-120000-eagle3-graphed"
    write_run_files(run_dir, result)
    assert sorted(p.name for p in run_dir.iterdir()) == ["report.md", "result.json", "stages.csv"]
    assert load_result(run_dir) == result
    assert load_result(run_dir / "result.json") == result
    assert (run_dir / "report.md").read_text(encoding="utf-8") == render_markdown([result])
    csv = pd.read_csv(run_dir / "stages.csv")
    assert list(csv.columns) == list(STAGE_COLUMNS)
    assert len(csv) == sum(len(v.stages) for v in result.variants)


def test_write_run_files_replaces_a_previous_result(tmp_path: Path) -> None:
    partial = replace(tiny_cpu(), complete=False, verdict="error")
    write_run_files(tmp_path, partial)
    write_run_files(tmp_path, tiny_cpu())
    assert load_result(tmp_path) == tiny_cpu()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_write_run_files_unwritable_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ResultsUnwritable, match=str(blocker)):
        write_run_files(blocker / "run", tiny_cpu())


def test_old_sample_result_still_loads() -> None:
    raw = json.loads(SAMPLE_V1.read_text(encoding="utf-8"))
    result = load_result(SAMPLE_V1)
    assert result.schema == raw["schema"] == SCHEMA
    assert result.verdict == raw["verdict"]
    assert [v.name for v in result.variants] == [v["name"] for v in raw["variants"]]
    stages = result.variants[0].stages
    assert [s.acceptance_length for s in stages] == [s["acceptance_length"] for s in raw["variants"][0]["stages"]]
    assert render_markdown([result]).startswith(f"**specwake: {raw['verdict'].upper()}**")


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
    data = json.loads(SAMPLE_V1.read_text(encoding="utf-8")) | {"schema": "specwake.result/99"}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert "specwake.result/99" in _error_for(path)


@pytest.mark.parametrize("content", ["[1, 2]", '{"schema": "specwake.result/1"}', "\udcff"])
def test_load_not_a_result(tmp_path: Path, content: str) -> None:
    path = tmp_path / "result.json"
    path.write_bytes(content.encode("utf-8", errors="surrogateescape"))
    _error_for(path)
