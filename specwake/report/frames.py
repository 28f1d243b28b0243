"""Machine-readable renderings: every result as one JSON list, and one row per stage as a pandas frame
(stages.csv)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from specwake.report.rows import Row, stage_rows
from specwake.results import ScenarioResult, VariantResult, to_dict

STAGE_COLUMNS = tuple(
    """
    scenario run variant outcome expected stage cycle acceptance_length num_drafts num_draft_tokens
    num_accepted_tokens acceptance_rate per_position requests stopped tok_s_median tok_s_min tok_s_max
    outputs_match_fresh counters_reset tok_s_ci_low tok_s_ci_high tok_s_vs_fresh tok_s_vs_fresh_low
    tok_s_vs_fresh_high
    """.split()
)


def render_json(results: Sequence[ScenarioResult]) -> str:
    """The results as one JSON list of result.json objects."""
    return json.dumps([to_dict(r) for r in results], indent=2) + "\n"


def _stage_record(result: ScenarioResult, variant: VariantResult, row: Row) -> dict[str, Any]:
    stage, vs = row.stage, row.vs_fresh
    rate = stage.num_accepted_tokens / stage.num_draft_tokens if stage.num_draft_tokens else None
    return {
        "scenario": result.name,
        "run": result.started_at,  # tells runs of one scenario apart (report --all)
        "variant": variant.name,
        "outcome": variant.outcome,
        "expected": variant.expected,
        "stage": stage.name,
        "cycle": stage.cycle,
        "acceptance_length": stage.acceptance_length,
        "num_drafts": stage.num_drafts,
        "num_draft_tokens": stage.num_draft_tokens,
        "num_accepted_tokens": stage.num_accepted_tokens,
        "acceptance_rate": rate,
        "per_position": ";".join(f"{p:.4f}" for p in stage.per_position),
        "requests": stage.measured,
        "stopped": stage.stopped,
        "tok_s_median": stage.tok_s_median,
        "tok_s_min": min(stage.tok_s) if stage.tok_s else None,
        "tok_s_max": max(stage.tok_s) if stage.tok_s else None,
        "outputs_match_fresh": stage.outputs_match_fresh,
        "counters_reset": stage.counters_reset,
        "tok_s_ci_low": row.summary.ci_low,
        "tok_s_ci_high": row.summary.ci_high,
        "tok_s_vs_fresh": vs.value if vs else None,
        "tok_s_vs_fresh_low": vs.ci_low if vs else None,
        "tok_s_vs_fresh_high": vs.ci_high if vs else None,
    }


def stages_frame(results: Sequence[ScenarioResult]) -> pd.DataFrame:
    """One row per scenario × variant × stage (stages by cycle), columns in STAGE_COLUMNS order."""
    records = [_stage_record(r, v, row) for r in results for v in r.variants for row in stage_rows(v)]
    return pd.DataFrame.from_records(records, columns=list(STAGE_COLUMNS))


def render_csv(results: Sequence[ScenarioResult]) -> str:
    """stages_frame(results) as CSV text (the content of stages.csv)."""
    return str(stages_frame(results).to_csv(index=False))
