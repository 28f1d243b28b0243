"""Run folders: names never reused, results written and read back, and which run a results folder stands for."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from specwake.errors import InputError, ResultsUnwritable
from specwake.report import run_files
from specwake.runfolder import load_many, load_result, load_results, new_run_dir, runs_in, write_files
from tests.helpers.paths import DATA

SAMPLE = DATA / "result-v1-sample.json"
NOW = dt.datetime(2026, 11, 30, 8, 0, 0, tzinfo=dt.timezone.utc)


def make_run(root: Path, name: str, scenarios: tuple[str, ...] = ()) -> Path:
    run = root / name
    for folder in [run / s for s in scenarios] or [run]:
        (folder / "logs").mkdir(parents=True)
        shutil.copy(SAMPLE, folder / "result.json")
    return run


def test_new_run_dir_never_reuses_a_name(tmp_path: Path) -> None:
    first = new_run_dir(tmp_path, "tiny-cpu", NOW)
    second = new_run_dir(tmp_path, "tiny-cpu", NOW)
    assert first.name == "20261130-080000-tiny-cpu" and second.name == "20261130-080000-tiny-cpu-2"
    (tmp_path / "blocker").write_text("a file")
    with pytest.raises(ResultsUnwritable, match="blocker"):
        new_run_dir(tmp_path / "blocker" / "results", "x", NOW)


def test_write_and_load_round_trip(tmp_path: Path) -> None:
    result = load_result(SAMPLE)
    write_files(tmp_path / "run", run_files(result))
    assert {p.name for p in (tmp_path / "run").iterdir()} == {"result.json", "report.md", "stages.csv"}
    assert load_result(tmp_path / "run") == result


def test_a_file_and_a_run_folder_mean_themselves(tmp_path: Path) -> None:
    run = make_run(tmp_path, "20250601-120000-tiny-cpu")
    assert load_results(run / "result.json").picked is None
    loaded = load_results(run)
    assert loaded.picked is None and [r.name for r in loaded.results] == ["tiny-cpu"]
    multi = make_run(tmp_path, "20250601-130000-2-scenarios", ("a", "b"))
    assert len(load_results(multi).results) == 2


def test_a_results_folder_means_its_latest_run_and_says_which(tmp_path: Path) -> None:
    make_run(tmp_path, "20250601-120000-tiny-cpu")
    late = make_run(tmp_path, "20250602-080000-tiny-cpu")
    make_run(tmp_path, "20250601-235959-tiny-cpu")
    (tmp_path / "README.md").write_text("not a run")
    (tmp_path / "20990101-000000-empty").mkdir()  # no result.json: not a run
    assert load_results(tmp_path).picked == late
    notes: list[str] = []
    assert len(load_many([tmp_path], note=notes.append)) == 1
    assert notes == [f"{tmp_path} is a results folder: using its latest run, {late}"]
    assert len(load_many([tmp_path], every_run=True, note=notes.append)) == 3


def test_same_second_runs_order_by_suffix_number(tmp_path: Path) -> None:
    for name in ("20250601-120000-x-10", "20250601-120000-x", "20250601-120000-x-2"):
        make_run(tmp_path, name)
    assert [r.name for r in runs_in(tmp_path)] == ["20250601-120000-x", "20250601-120000-x-2", "20250601-120000-x-10"]
    assert load_results(tmp_path).picked == tmp_path / "20250601-120000-x-10"


def test_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(InputError, match=str(missing)):
        load_results(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no run folder"):
        load_results(empty)


def test_result_files_get_the_permissions_of_any_new_file(tmp_path: Path) -> None:
    import os

    from specwake.files import write_atomic

    previous = os.umask(0o022)
    try:
        write_atomic(tmp_path / "result.json", "{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary left
