"""The stage's columns, one list for every output: the Markdown stage table (report/summary.py), the rows of
stages.csv (report/frames.py) and the stage line of a JUnit test case (report/junit.py) are all made from COLUMNS.

A column names the StageResult fields it shows (`fields`), its Markdown header and cell (none: not in the table), its
CSV columns and values (none: not in stages.csv), and its phrase in the JUnit line (none: not there). A new measured
quantity is a field of StageResult and one row here; tests/unit/test_columns.py fails while a field of StageResult is
in no column and not in NOT_SHOWN, which says why it is in result.json only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specwake.judge.stats import Summary, summarize
from specwake.report.markdown import MISSING, num, ratio_cell
from specwake.report.rows import Row
from specwake.results import ScenarioResult, StageResult, VariantResult

RESET_MARK = " †"
VOID = "void"


@dataclass(frozen=True)
class StageView:
    """What a column reads: one stage (with its tok/s summary and ratio to fresh) of one variant of one result."""

    result: ScenarioResult
    variant: VariantResult
    row: Row

    @property
    def stage(self) -> StageResult:
        return self.row.stage


@dataclass(frozen=True)
class Column:
    fields: tuple[str, ...]  # the StageResult fields it shows ("" for what is not the stage's: scenario, variant)
    header: str = ""  # Markdown header; "" when the stage table does not show it
    cell: Callable[[StageView], str] | None = None
    align: str = "---:"
    width: int = 0  # minimum width: fixed widths keep a re-rendered comment's diff row-local
    csv: tuple[tuple[str, Callable[[StageView], Any]], ...] = ()  # (stages.csv column, value)
    junit: Callable[[StageResult], str] | None = None  # its phrase in the JUnit stage line


def _summary_cell(s: Summary, digits: int = 1) -> str:
    if s.median is None:
        return MISSING
    if s.n < 2 or s.ci_low is None or s.ci_high is None:
        return f"{s.median:.{digits}f} (n={s.n})"
    return f"{s.median:.{digits}f} [{s.ci_low:.{digits}f}, {s.ci_high:.{digits}f}]"


def _al_cell(stage: StageResult) -> str:
    """A stage's AL, or `void` where its counters disagree with themselves (the variant's finding says how)."""
    return VOID if stage.counters_disagree is not None else num(stage.acceptance_length, 2)


def _match_cell(stage: StageResult) -> str:
    """Whether a stage's completions equal fresh: yes, only parted at near-ties (numerics), or no."""
    if stage.outputs_match_fresh is None:
        return MISSING
    if stage.outputs_match_fresh:
        return "yes"
    return "near-tie" if stage.outputs_close_to_fresh else "**no**"


def _match_phrase(stage: StageResult) -> str:
    if stage.outputs_match_fresh is False and stage.outputs_close_to_fresh:
        return "outputs part from fresh at near-ties only"
    return {None: "", True: "outputs = fresh", False: "outputs DIFFER from fresh"}[stage.outputs_match_fresh]


def _requests_cell(stage: StageResult) -> str:
    """`3 (decided)`: the requests a stage measured and, in a word, why no more (results before: the count)."""
    if not stage.stopped:
        return str(stage.measured)
    word = stage.stopped.split(":", 1)[0].split(" after ", 1)[0]  # decided, cap, fixed, no drafts
    return f"{stage.measured} ({word})"


def _ms(values: Sequence[float | None]) -> list[float]:
    return [v * 1000 for v in values if v is not None]


def _ms_cell(values: Sequence[float | None]) -> str:
    known = _ms(values)
    return _summary_cell(summarize(known), 2) if known else MISSING


def _ms_median(values: Sequence[float | None]) -> float | None:
    return summarize(_ms(values)).median if _ms(values) else None


def _acceptance_rate(s: StageResult) -> float | None:
    return s.num_accepted_tokens / s.num_draft_tokens if s.num_draft_tokens else None


def _runner_cell(variant: VariantResult) -> str:
    """`V2` or `V1`: the model runner the variant's workers ran (the setup line above the table says how)."""
    return variant.model_runner.upper() if variant.model_runner else MISSING


def _vs(view: StageView, part: str) -> float | None:
    vs = view.row.vs_fresh
    return getattr(vs, part) if vs is not None else None


COLUMNS: tuple[Column, ...] = (
    Column(("",), csv=(("scenario", lambda v: v.result.name), ("run", lambda v: v.result.started_at))),
    Column(("",), "variant", lambda v: v.variant.name, "---", csv=(("variant", lambda v: v.variant.name),)),
    Column(("",), csv=(("outcome", lambda v: v.variant.outcome), ("expected", lambda v: v.variant.expected))),
    Column(
        ("name", "cycle"), "stage", lambda v: v.stage.name, "---",
        csv=(("stage", lambda v: v.stage.name), ("cycle", lambda v: v.stage.cycle)),
        junit=lambda s: s.name,
    ),
    Column(
        ("acceptance_length", "counters_reset", "counters_disagree"), "AL",
        lambda v: _al_cell(v.stage) + (RESET_MARK if v.stage.counters_reset else ""), width=5,
        csv=(("acceptance_length", lambda v: v.stage.acceptance_length),
             ("counters_reset", lambda v: v.stage.counters_reset),
             ("counters_disagree", lambda v: v.stage.counters_disagree)),
        junit=lambda s: f"AL {_al_cell(s)}" + (" (counters reset)" if s.counters_reset else "")
        + (f" (counters disagree: {s.counters_disagree})" if s.counters_disagree else ""),
    ),
    Column(
        ("num_drafts",), "drafts", lambda v: str(v.stage.num_drafts), width=6,
        csv=(("num_drafts", lambda v: v.stage.num_drafts),),
        junit=lambda s: f"{s.num_drafts} drafts",
    ),
    Column(
        ("num_accepted_tokens", "num_draft_tokens"), "accepted/drafted",
        lambda v: f"{v.stage.num_accepted_tokens}/{v.stage.num_draft_tokens}", width=16,
        csv=(("num_draft_tokens", lambda v: v.stage.num_draft_tokens),
             ("num_accepted_tokens", lambda v: v.stage.num_accepted_tokens),
             ("acceptance_rate", lambda v: _acceptance_rate(v.stage))),
        junit=lambda s: f"{s.num_accepted_tokens}/{s.num_draft_tokens} accepted",
    ),
    Column(
        ("per_position",),
        csv=(("per_position", lambda v: ";".join(f"{p:.4f}" for p in v.stage.per_position)),),
    ),
    Column(
        ("tok_s", "tok_s_median"), "tok/s median [CI]", lambda v: _summary_cell(v.row.summary), width=21,
        csv=(("tok_s_median", lambda v: v.stage.tok_s_median),
             ("tok_s_min", lambda v: min(v.stage.tok_s) if v.stage.tok_s else None),
             ("tok_s_max", lambda v: max(v.stage.tok_s) if v.stage.tok_s else None),
             ("tok_s_ci_low", lambda v: v.row.summary.ci_low), ("tok_s_ci_high", lambda v: v.row.summary.ci_high)),
        junit=lambda s: f"tok/s median {num(s.tok_s_median, 1)} (n={len(s.tok_s)})",
    ),
    Column(
        ("",), "vs fresh [CI]", lambda v: ratio_cell(v.row.vs_fresh), width=18,
        csv=(("tok_s_vs_fresh", lambda v: _vs(v, "value")), ("tok_s_vs_fresh_low", lambda v: _vs(v, "ci_low")),
             ("tok_s_vs_fresh_high", lambda v: _vs(v, "ci_high"))),
    ),
    Column(
        ("tpot",), "TPOT ms [CI]", lambda v: _ms_cell(v.stage.tpot), width=18,
        csv=(("tpot_ms_median", lambda v: _ms_median(v.stage.tpot)),),
    ),
    Column(
        ("ttft", "first_request_ttft"), "1st TTFT ms",
        lambda v: num(None if v.stage.first_request_ttft is None else v.stage.first_request_ttft * 1000, 1),
        width=11,
        csv=(("first_ttft_ms", lambda v: None if v.stage.first_request_ttft is None
              else v.stage.first_request_ttft * 1000),
             ("ttft_ms_median", lambda v: _ms_median(v.stage.ttft))),
    ),
    Column(
        ("outputs_match_fresh", "outputs_close_to_fresh"), "outputs = fresh", lambda v: _match_cell(v.stage),
        ":---:", width=15,
        csv=(("outputs_match_fresh", lambda v: v.stage.outputs_match_fresh),
             ("outputs_close_to_fresh", lambda v: v.stage.outputs_close_to_fresh)),
        junit=_match_phrase,
    ),
    Column(
        ("requests", "stopped"), "requests", lambda v: _requests_cell(v.stage), width=13,
        csv=(("requests", lambda v: v.stage.measured), ("stopped", lambda v: v.stage.stopped)),
    ),
    Column(
        ("",), "runner", lambda v: _runner_cell(v.variant), "---", width=6,
        csv=(("model_runner", lambda v: v.variant.model_runner),),
    ),
)  # fmt: skip

# Fields of StageResult no column shows, and why: they are in result.json, and in the report's details where named.
NOT_SHOWN = {
    "completion_tokens": "per-request token counts: what tok/s is computed from",
    "engines": "each data-parallel engine's AL: the variant's explanation names the engine that decided it",
    "outputs": "the completions themselves",
    "warmup_seconds": "the unmeasured warmup's wall time: the run's timings",
    "prefix_cached": "the prefix-cache probe: a finding when stale, and the details' prefix-cache line",
    "prefix_cached_repeat": "the prefix-cache probe repeated: the details' prefix-cache line",
    "first_difference": "where tokens first part from fresh: the variant's line and details",
    "max_logprob_drift": "logprob drift against fresh: the details' drift line and the max_logprob_drift limit",
    "own_logprob_drift": "the fresh stage's own drift, a recovered variant's bound: the details' drift line",
    "logprobs_over_tolerance": "drift positions over tolerance: the details' drift line",
    "logprobs_compared": "positions compared for drift: the details' drift line",
    "measured_alone": "whether the stage took its turn alone: the variant's line",
    "near_ties": "where tokens part at a near-tie: the details' notes",
}

TABLE = tuple(c for c in COLUMNS if c.header)
CSV_COLUMNS = tuple(name for c in COLUMNS for name, _ in c.csv)


def unshown_fields(stage_type: type = StageResult) -> set[str]:
    """Fields of `stage_type` that no column shows and NOT_SHOWN does not explain: a new measured quantity that no
    output would carry."""
    shown = {name for c in COLUMNS for name in c.fields if name}
    return {f.name for f in dataclasses.fields(stage_type)} - shown - set(NOT_SHOWN)


def table_cells(view: StageView) -> list[str]:
    """One stage's cells of the Markdown stage table, in TABLE order (raw text: the caller makes it cell-safe)."""
    return [c.cell(view) if c.cell is not None else MISSING for c in TABLE]


def csv_record(view: StageView) -> dict[str, Any]:
    """One stage's row of stages.csv."""
    return {name: value(view) for c in COLUMNS for name, value in c.csv}


def junit_line(stage: StageResult) -> str:
    """`after L2 #1: AL 1.00, 192 drafts, 0/576 accepted, tok/s median 15.5 (n=3), outputs = fresh`: the phrase of
    every column that has one."""
    first, *rest = [c.junit(stage) for c in COLUMNS if c.junit is not None]
    return f"{first}: " + ", ".join(p for p in rest if p)
