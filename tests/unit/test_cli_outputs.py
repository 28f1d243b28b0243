"""`specwake report` and `specwake compare` through the CLI: formats, folder resolution, exit codes."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from specwake.cli import app
from specwake.report import run_files
from specwake.results import KNOWN_SCHEMAS, ScenarioResult
from specwake.runfolder import load_result, write_files
from tests.helpers.paths import DATA

SAMPLE = DATA / "result-v1-sample.json"


def save(folder: Path, result: ScenarioResult) -> Path:
    write_files(folder, run_files(result))
    return folder


def slower(result: ScenarioResult, factor: float) -> ScenarioResult:
    """The same run with every patched tok/s sample multiplied by `factor` and AL unchanged."""
    variants = []
    for v in result.variants:
        if v.name == "patched":
            stages = [replace(s, tok_s=[x * factor for x in s.tok_s]) for s in v.stages]
            v = replace(v, stages=stages)
        variants.append(v)
    return replace(result, variants=variants)


def collapsed(result: ScenarioResult) -> ScenarioResult:
    """The patched variant no longer recovers: AL 1.00 after each cycle, outcome collapse (unexpected)."""
    variants = []
    for v in result.variants:
        if v.name == "patched":
            stages = [replace(s, acceptance_length=1.0) if s.cycle > 0 else s for s in v.stages]
            v = replace(v, stages=stages, outcome="collapse", matched=False)
        variants.append(v)
    return replace(result, variants=variants, verdict="fail")


def test_report_formats(tmp_path: Path) -> None:
    run = save(tmp_path / "20260101-000000-tiny-cpu", load_result(SAMPLE))
    runner = CliRunner()
    md = runner.invoke(app, ["report", str(run)])
    assert md.exit_code == 0 and "tiny-cpu" in md.output and "| variant" in md.output
    js = runner.invoke(app, ["report", str(run / "result.json"), "--format", "json"])
    assert js.exit_code == 0 and json.loads(js.output)[0]["scenario"]["name"] == "tiny-cpu"
    older = save(tmp_path / "20251231-000000-tiny-cpu", load_result(SAMPLE))
    csv = runner.invoke(app, ["report", str(tmp_path), "--format", "csv"])  # a results folder: its latest run
    frame = pd.read_csv(io.StringIO(csv.stdout))
    assert len(frame) == sum(len(v.stages) for v in load_result(SAMPLE).variants)
    assert f"using its latest run, {run}" in csv.stderr and str(older) not in csv.stderr
    every = runner.invoke(app, ["report", str(tmp_path), "--format", "csv", "--all"])
    assert len(pd.read_csv(io.StringIO(every.stdout))) == 2 * len(frame) and "latest" not in every.stderr
    bad = runner.invoke(app, ["report", str(run), "--format", "xml"])
    assert bad.exit_code == 2 and "--format" in bad.output


def test_report_plot(tmp_path: Path) -> None:
    run = save(tmp_path / "run", load_result(SAMPLE))
    out = tmp_path / "plot.png"
    result = CliRunner().invoke(app, ["report", str(run), "--plot", str(out)])
    assert result.exit_code == 0 and out.read_bytes().startswith(b"\x89PNG")


def test_report_bad_input(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "future.json").write_text(json.dumps({"schema": "specwake.result/99"}))
    runner = CliRunner()
    for name, phrase in (
        ("broken.json", "invalid JSON"),
        ("future.json", "unknown result schema"),
        ("none", "no such"),
    ):
        result = runner.invoke(app, ["report", str(tmp_path / name)])
        assert result.exit_code == 2, name
        assert phrase in result.output and name in result.output
    (tmp_path / "empty.json").write_text("{}")
    empty = runner.invoke(app, ["report", str(tmp_path / "empty.json")])
    assert empty.exit_code == 2 and empty.output.strip() == (
        f'error: {tmp_path / "empty.json"}: not a specwake result file: no "schema" (this specwake reads'
        f" {', '.join(KNOWN_SCHEMAS)})"
    )


def in_folder(result: ScenarioResult, folder: Path) -> ScenarioResult:
    """The result as a run in `folder` writes it: its server logs inside the folder."""
    return replace(
        result, variants=[replace(v, log_path=str(folder / "logs" / f"{v.name}.log")) for v in result.variants]
    )


def test_runs_of_one_second_under_two_output_folders_keep_distinct_labels(tmp_path: Path) -> None:
    """Shards or machines that started in one second write run folders of one name into different `--output`
    folders: the merged report names each by its whole folder, and one result given twice by its place."""
    one, two = (tmp_path / out / "20260101-000000-tiny-cpu" for out in ("night-a", "night-b"))
    for folder in (one, two):
        save(folder, in_folder(load_result(SAMPLE), folder))
    shown = CliRunner().invoke(app, ["report", str(one), str(two)])
    assert shown.exit_code == 0, shown.output
    headings = [line for line in shown.stdout.splitlines() if line.startswith("### tiny-cpu")]
    assert [h.split(" — ")[0] for h in headings] == [f"### tiny-cpu (in {one})", f"### tiny-cpu (in {two})"]
    twice = CliRunner().invoke(app, ["report", str(one), str(one)])
    headings = [line.split(" — ")[0] for line in twice.stdout.splitlines() if line.startswith("### tiny-cpu")]
    assert headings == ["### tiny-cpu (#1)", "### tiny-cpu (#2)"]


def test_compare_exit_codes(tmp_path: Path) -> None:
    base = load_result(SAMPLE)
    old = save(tmp_path / "old", base)
    runner = CliRunner()
    same = runner.invoke(app, ["compare", str(old), str(save(tmp_path / "same", base))])
    assert same.exit_code == 0, same.output
    worse_al = runner.invoke(app, ["compare", str(old), str(save(tmp_path / "al", collapsed(base)))])
    assert worse_al.exit_code == 1 and "regression" in worse_al.output.lower()
    faster = runner.invoke(app, ["compare", str(old), str(save(tmp_path / "fast", slower(base, 2.0)))])
    assert faster.exit_code == 0
    changed = replace(base, scenario={**base.scenario, "sha256": "0" * 64})
    other = runner.invoke(app, ["compare", str(old), str(save(tmp_path / "other", changed))])
    assert other.exit_code == 0 and "The scenario files differ" in other.output  # compared, and said so
    unknown = runner.invoke(app, ["compare", str(old), str(tmp_path / "other"), "--history", str(tmp_path / "nope")])
    assert unknown.exit_code == 2 and "nope" in unknown.output


def test_comparing_a_run_with_itself_is_one_line_exit_2(tmp_path: Path) -> None:
    """The run folder twice, or a results folder whose latest run it is: nothing would be compared."""
    run = save(tmp_path / "results" / "20260101-000000-tiny-cpu", load_result(SAMPLE))
    for old, new in ((run, run), (run, tmp_path / "results")):
        shown = CliRunner().invoke(app, ["compare", str(old), str(new)])
        assert shown.exit_code == 2, shown.output
        assert (
            shown.stderr.strip().splitlines()[-1]
            == f"error: OLD and NEW are the same run ({old}, {new}): compare two runs"
        )
    copy = save(tmp_path / "earlier" / "20251231-000000-tiny-cpu", load_result(SAMPLE))  # an equal run, not this one
    assert CliRunner().invoke(app, ["compare", str(copy), str(run)]).exit_code == 0


def test_compare_picks_latest_run_in_a_results_folder(tmp_path: Path) -> None:
    base = load_result(SAMPLE)
    save(tmp_path / "new" / "20260101-000000-tiny-cpu", collapsed(base))
    save(tmp_path / "new" / "20260102-000000-tiny-cpu", base)  # latest: no regression
    old = save(tmp_path / "old", base)
    result = CliRunner().invoke(app, ["compare", str(old), str(tmp_path / "new")])
    assert result.exit_code == 0, result.output


def test_compare_draws_the_trend_over_every_night(tmp_path: Path) -> None:
    base = load_result(SAMPLE)
    nights = []
    for day, result in enumerate([base, slower(base, 0.5), base, collapsed(base)], start=1):
        dated = replace(result, started_at=f"2026-11-{day:02d}T02:17:00+00:00")
        nights.append(save(tmp_path / f"202611{day:02d}" / f"202611{day:02d}-021700-tiny-cpu", dated))
    *earlier, old, new = nights
    chart = tmp_path / "out" / "trend.png"
    history = [arg for night in earlier for arg in ("--history", str(night))]
    result = CliRunner().invoke(app, ["compare", str(old), str(new), *history, "--chart", str(chart)])
    assert result.exit_code == 1, result.output  # tonight's patched collapsed: a regression
    assert "### Trend over 4 nights (2026-11-01 → 2026-11-04)" in result.stdout
    assert "| tiny-cpu | patched | `▄▄▄▄` 4.00 | `███▁` 1.00 (1.00–3.92) | `█▁██` 40.4 (20.2–40.4) |" in result.stdout
    assert chart.read_bytes().startswith(b"\x89PNG") and f"chart: {chart}" in result.stderr
    svg = CliRunner().invoke(app, ["compare", str(old), str(new), "--chart", str(tmp_path / "trend.svg")])
    assert "<svg" in (tmp_path / "trend.svg").read_text() and "### Trend over 2 nights" in svg.stdout


def test_results_know_the_run_folder_they_were_loaded_from(tmp_path: Path) -> None:
    one = save(tmp_path / "20260101-000000-tiny-cpu", load_result(SAMPLE))
    several = save(tmp_path / "20260102-000000-2-scenarios" / "tiny-cpu", load_result(SAMPLE))
    loose = save(tmp_path / "elsewhere", load_result(SAMPLE))
    shown = CliRunner().invoke(app, ["report", str(one), str(several), str(loose), "--format", "json"])
    assert [r["scenario"].get("run") for r in json.loads(shown.stdout)] == [
        "20260101-000000-tiny-cpu",
        "20260102-000000-2-scenarios",
        None,
    ]


def test_report_fits_one_github_comment_and_names_resume_for_an_interrupted_run(tmp_path: Path) -> None:
    from specwake.report.fit import COMMENT_LIMIT
    from tests.helpers.builders import tiny_cpu

    base = tiny_cpu()
    for n in range(14):  # a night of 14 scenarios, each with its evidence: report.md of each about 5,600 characters
        run = tmp_path / f"20261201-0000{n:02d}-family-{n}"
        logged = [replace(v, log_path=str(run / "logs" / f"{v.name}.log")) for v in base.variants]
        save(run, replace(base, scenario={**base.scenario, "name": f"family-{n}"}, variants=logged))
    night = CliRunner().invoke(app, ["report", str(tmp_path), "--all"])
    assert night.exit_code == 0, night.output
    assert len(night.stdout) <= COMMENT_LIMIT and "> ✂️ Shortened to fit one GitHub comment" in night.stdout
    assert "`20261201-000000-family-0`" in night.stdout  # where the rest is
    interrupted = tmp_path / "20261201-000000-family-0"
    partial = replace(load_result(interrupted), complete=False)
    cut = [partial.variants[0], replace(partial.variants[1], outcome="incomplete", matched=False)]
    save(interrupted, replace(partial, variants=cut))
    shown = CliRunner().invoke(app, ["report", str(interrupted)])
    assert f"--resume {interrupted}` runs only those" in shown.stdout
