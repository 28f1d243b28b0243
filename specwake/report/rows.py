"""Each measured stage of a variant with its tok/s summary and its ratio to fresh: what the Markdown table and
stages.csv both show, computed once."""

from __future__ import annotations

from dataclasses import dataclass

from specwake.judge.stats import Ratio, Summary, ratio, summarize
from specwake.results import StageResult, VariantResult


@dataclass(frozen=True)
class Row:
    """One stage with its tok/s summary and its tok/s ratio to the variant's fresh stage (None for fresh)."""

    stage: StageResult
    summary: Summary
    vs_fresh: Ratio | None


def stage_rows(variant: VariantResult) -> list[Row]:
    fresh = variant.fresh
    return [
        Row(s, summarize(s.tok_s), ratio(s.tok_s, fresh.tok_s) if fresh is not None and s.cycle > 0 else None)
        for s in variant.stages_by_cycle
    ]


def after_samples(variant: VariantResult) -> list[float]:
    """Every tok/s sample measured after a cycle."""
    return [x for s in variant.stages_by_cycle if s.cycle > 0 for x in s.tok_s]
