"""Machine-readable renderings: every result as one JSON list, and one row per stage as a pandas frame
(stages.csv)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specwake.report.columns import CSV_COLUMNS, StageView, csv_record
from specwake.report.rows import stage_rows
from specwake.results import ScenarioResult, to_dict

if TYPE_CHECKING:
    import pandas as pd

STAGE_COLUMNS = CSV_COLUMNS  # stages.csv, in order: the CSV columns of report/columns.py


def render_json(results: Sequence[ScenarioResult]) -> str:
    """The results as one JSON list of result.json objects."""
    return json.dumps([to_dict(r) for r in results], indent=2) + "\n"


def stages_frame(results: Sequence[ScenarioResult]) -> pd.DataFrame:
    """One row per scenario × variant × stage (stages by cycle), columns in STAGE_COLUMNS order."""
    import pandas as pd  # here, not above: pandas takes ~0.6 s to import, and most commands write no CSV

    records = [csv_record(StageView(r, v, row)) for r in results for v in r.variants for row in stage_rows(v)]
    return pd.DataFrame.from_records(records, columns=list(STAGE_COLUMNS))


def render_csv(results: Sequence[ScenarioResult]) -> str:
    """stages_frame(results) as CSV text (the content of stages.csv)."""
    return str(stages_frame(results).to_csv(index=False))
