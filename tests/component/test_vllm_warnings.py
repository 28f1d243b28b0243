"""What vLLM itself says about a run, through the real `specwake run` CLI against the fake engine
(tests/helpers/fakeengine.py): a warning a server logs is kept in its variant's result and quoted beside that
variant's verdict; a vLLM of no tested release is named in the report's header; the first load a server logs is
kept, and a wake far above it fails the variant.
"""

from __future__ import annotations

from pathlib import Path

from specwake.judge.expectations import MIN_FIRST_LOAD_S
from specwake.prepare.releases import TESTED_RELEASES
from tests.helpers.fakeengine import FakeEngine, one_run_dir, result_of, run_text, scenario_text, variant

# vLLM 0.34's text (vllm/v1/worker/gpu_worker.py:309-317), which the fake server logs with --draft-discard-warning
QUOTE = (
    "Level 2 sleep discards draft model weights; reload_weights restores only the target. Unless the draft is updated"
    " separately, set --sleep-preserve-parameter-names 'draft.*' to keep them."
)


def test_a_logged_draft_discard_warning_is_kept_and_quoted_beside_its_variant(
    engine: FakeEngine, tmp_path: Path
) -> None:
    diff = engine.write_fix(tmp_path)
    warns = {"FAKE_VLLM_ARGS": "--draft-discard-warning"}
    text = scenario_text(
        engine, variants={"baseline": warns, "patched": {}}, expect={"baseline": "collapse", "patched": "recover"},
        patch=str(diff), cycles=2,
    )  # fmt: skip
    proc, out = run_text(engine, tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    result = result_of(out)
    log = (one_run_dir(out) / "logs" / "baseline.log").read_text()
    assert log.count(QUOTE) == 1  # logged once, at the first of two sleeps
    assert variant(result, "baseline")["vllm_warnings"] == [QUOTE]
    assert variant(result, "patched")["vllm_warnings"] == []
    report = (one_run_dir(out) / "report.md").read_text()
    verdicts = {name: next(line for line in report.splitlines() if line.startswith(f"- **{name}**: ")) for name in
                ("baseline", "patched")}  # fmt: skip
    assert f"vLLM warned: “{QUOTE}”" in verdicts["baseline"]
    assert "vLLM warned" not in verdicts["patched"]


def test_a_vllm_of_no_tested_release_is_named_in_the_reports_header(engine: FakeEngine, tmp_path: Path) -> None:
    proc, out = run_text(engine, tmp_path, scenario_text(engine, expect={"baseline": "collapse"}))
    assert proc.returncode == 0, proc.stderr
    result = result_of(out)
    version = variant(result, "baseline")["vllm_version"]  # the fake engine's, of no release at all
    assert version == "0.0.fake" and result["tested_releases"] == list(TESTED_RELEASES)
    header = (one_run_dir(out) / "report.md").read_text().split("\n### ", 1)[0]
    assert "untested vLLM release" in header and version in header and ", ".join(TESTED_RELEASES) in header


def test_a_reload_far_slower_than_the_servers_logged_first_load_fails_its_variant(
    engine: FakeEngine, tmp_path: Path
) -> None:
    diff = engine.write_fix(tmp_path)
    logged = "--load-seconds 0.4"
    # A first load under MIN_FIRST_LOAD_S counts as that much: the reload takes over twice that, and 11× the load.
    slow = {"FAKE_VLLM_ARGS": f"{logged} --reload-delay {2 * MIN_FIRST_LOAD_S + 0.5:g}"}
    text = scenario_text(
        engine, variants={"baseline": {"FAKE_VLLM_ARGS": logged}, "patched": slow},
        expect={"baseline": "collapse", "patched": "recover"}, patch=str(diff), cycles=1,
    )  # fmt: skip
    proc, out = run_text(engine, tmp_path, text)
    assert proc.returncode == 1, proc.stderr
    result = result_of(out)
    baseline, patched = variant(result, "baseline"), variant(result, "patched")
    assert baseline["first_load_seconds"] == patched["first_load_seconds"] == 0.4
    assert (baseline["matched"], baseline["findings"]) == (True, [])
    assert (patched["outcome"], patched["matched"]) == ("recover", False)
    assert patched["findings"][0].startswith("slow wake: cycle 1's wake took ")
    assert f"(0.40 s by vLLM's log, counted as {MIN_FIRST_LOAD_S:g} s) > max_wake_ratio 2" in patched["findings"][0]
    report = (one_run_dir(out) / "report.md").read_text()
    assert "× first load) | recover ✗ (expected recover) |" in report
