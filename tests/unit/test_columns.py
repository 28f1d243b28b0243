"""One list of columns for every output (specwake/report/columns.py): the Markdown stage table, stages.csv and the JUnit
stage line are made from it, and a measured quantity that none of them shows must say why."""

from __future__ import annotations

import dataclasses

from specwake.report.columns import (
    COLUMNS,
    CSV_COLUMNS,
    NOT_SHOWN,
    TABLE,
    StageView,
    csv_record,
    junit_line,
    table_cells,
    unshown_fields,
)
from specwake.report.frames import stages_frame
from specwake.report.rows import stage_rows
from specwake.results import StageResult
from tests.helpers.builders import sample_result


def test_every_field_of_a_stage_is_in_a_column_or_says_why_not() -> None:
    shown = {name for c in COLUMNS for name in c.fields if name}
    fields = {f.name for f in dataclasses.fields(StageResult)}
    assert fields - shown - set(NOT_SHOWN) == set(), "a StageResult field no output shows: add a column or a reason"
    assert (shown | set(NOT_SHOWN)) - fields == set(), "a column or reason names no StageResult field"
    assert shown.isdisjoint(NOT_SHOWN)


def test_a_new_measured_quantity_without_a_column_is_caught() -> None:
    @dataclasses.dataclass(frozen=True)
    class Grown(StageResult):
        joules_per_token: float | None = None

    assert unshown_fields(StageResult) == set()
    assert unshown_fields(Grown) == {"joules_per_token"}


def test_names_are_unique_and_every_output_comes_from_the_list() -> None:
    assert len(set(CSV_COLUMNS)) == len(CSV_COLUMNS)
    assert len({c.header for c in TABLE}) == len(TABLE)
    result = sample_result()
    variant = result.variants[0]
    rows = stage_rows(variant)
    view = StageView(result, variant, rows[1])
    assert list(csv_record(view)) == list(CSV_COLUMNS)
    assert list(stages_frame([result]).columns) == list(CSV_COLUMNS)
    assert len(table_cells(view)) == len(TABLE)
    line = junit_line(rows[1].stage)
    assert line.startswith(f"{rows[1].stage.name}: AL ") and "accepted" in line and "tok/s median" in line


def test_the_timing_figures_reach_the_csv() -> None:
    result = sample_result()
    variant = result.variants[0]
    stage = dataclasses.replace(variant.stages[0], tpot=[0.01, 0.03, None], ttft=[0.2, 0.4], first_request_ttft=0.5)
    variant = dataclasses.replace(variant, stages=[stage, *variant.stages[1:]])
    record = csv_record(StageView(result, variant, stage_rows(variant)[0]))
    assert record["tpot_ms_median"] == 20.0 and record["ttft_ms_median"] == 300.0 and record["first_ttft_ms"] == 500.0
