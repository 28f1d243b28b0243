"""Renderers of finished runs: PR-comment Markdown and a per-stage pandas frame (stages.csv).

Also the run folder's writer (result.json atomically, report.md, stages.csv) and result.json reader.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from specwake.errors import InputError, ResultsUnwritable
from specwake.results import ScenarioResult, StageResult, VariantResult, from_dict, to_json
from specwake.verdict import INCOMPLETE, explain

MISSING = "–"
RESULT_FILE = "result.json"
REPORT_FILE = "report.md"
STAGES_FILE = "stages.csv"
SHORT_SHA = 12
DEFAULT_TOLERANCE = 0.05  # used only when a result does not record its [expect] tolerance
EMULATED_NOTE = (
    "L2 discard emulated on CPU: after /sleep?level=2 specwake zeroed every parameter tensor vLLM exposes "
    "(CPU linear layers also keep packed oneDNN copies it cannot reach); wake and reload are unmodified vLLM"
)
RESET_MARK = " †"
RESET_NOTE = "† a counter went backwards during this stage (engine restarted): its numbers count from the restart"
TABLE_COLUMNS = (
    "variant",
    "stage",
    "AL",
    "drafts",
    "accepted/drafted tokens",
    "tok/s (median)",
    "outputs = fresh",
)
TABLE_ALIGN = ("---", "---", "---:", "---:", "---:", "---:", ":---:")
STAGE_COLUMNS = (
    "scenario",
    "variant",
    "outcome",
    "expected",
    "stage",
    "cycle",
    "acceptance_length",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "acceptance_rate",
    "per_position",
    "requests",
    "tok_s_median",
    "tok_s_min",
    "tok_s_max",
    "outputs_match_fresh",
    "counters_reset",
)
_VERDICT_RANK = {"pass": 0, "error": 1, "fail": 2}


# ---------------------------------------------------------------- Markdown


def _num(value: float | None, digits: int) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def _inline(text: str) -> str:
    """Free text made safe for one Markdown line (no raw HTML tags, no line breaks)."""
    return text.replace("<", "&lt;").replace("\n", " ")


def _cell(text: str) -> str:
    return _inline(text).replace("|", "\\|")


def _match_cell(value: bool | None) -> str:
    return MISSING if value is None else ("yes" if value else "**no**")


def _short(sha: str | None) -> str:
    return sha[:SHORT_SHA] if sha else MISSING


def _tolerance(result: ScenarioResult) -> float:
    """The scenario's [expect] tolerance: settings.expect.tolerance, else a top-level tolerance."""
    settings = result.scenario.get("settings")
    expect = settings.get("expect") if isinstance(settings, dict) else None
    value = expect.get("tolerance") if isinstance(expect, dict) else None
    if value is None:
        value = result.scenario.get("tolerance")
    return float(value) if isinstance(value, int | float) else DEFAULT_TOLERANCE


def _overall(verdicts: Sequence[str]) -> str:
    if not verdicts:
        return "error"
    return max(verdicts, key=lambda v: _VERDICT_RANK.get(v, _VERDICT_RANK["error"]))


def _name(result: ScenarioResult) -> str:
    return str(result.scenario.get("name") or "unnamed")


def _as_expected(result: ScenarioResult) -> str:
    matched = sum(1 for v in result.variants if v.matched)
    return f"{_name(result)}: {matched}/{len(result.variants)} variants as expected"


def verdict_line(results: Sequence[ScenarioResult]) -> str:
    overall = _overall([r.verdict for r in results]).upper()
    summary = "; ".join(_as_expected(r) for r in results) or "no scenario results"
    return f"**specwake: {overall}** — {summary}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _stage_row(variant: str, stage: StageResult) -> str:
    cells = [
        variant,
        stage.name,
        _num(stage.acceptance_length, 2) + (RESET_MARK if stage.counters_reset else ""),
        str(stage.num_drafts),
        f"{stage.num_accepted_tokens}/{stage.num_draft_tokens}",
        _num(stage.tok_s_median, 1),
        _match_cell(stage.outputs_match_fresh),
    ]
    return _row([_cell(c) for c in cells])


def _table(variants: Sequence[VariantResult]) -> list[str]:
    rows = [_row(TABLE_COLUMNS), _row(TABLE_ALIGN)]
    for variant in variants:
        if not variant.stages:
            empty = [variant.name, "no stage measured", *[MISSING] * 5]
            rows.append(_row([_cell(c) for c in empty]))
        rows += [_stage_row(variant.name, s) for s in variant.stages]
    return rows


def _mark(variant: VariantResult) -> str:
    if variant.outcome == "error":
        return "⚠"
    if variant.outcome == INCOMPLETE:
        return "…"
    return "✓" if variant.matched else "✗"


def _variant_line(variant: VariantResult, tolerance: float) -> str:
    return _inline(
        f"- {variant.name}: {variant.outcome} (expected {variant.expected}) {_mark(variant)}"
        f" — {explain(variant, tolerance)}"
    )


def _fence(text: str) -> str:
    ticks = 3
    while "`" * ticks in text:
        ticks += 1
    return "`" * ticks


def _details(variant: VariantResult) -> list[str]:
    """A collapsed block: the log excerpt of a crashed variant, the error of an errored one."""
    if variant.outcome == "crash":
        title = f"{variant.name}: crash ({variant.crash_class or 'unknown'}) — log excerpt"
        body = variant.log_excerpt or variant.error or "(no log excerpt)"
    elif variant.outcome == "error":
        title = f"{variant.name}: error — {variant.crash_class or 'startup_failed'}"
        body = "\n".join(t for t in (variant.error, variant.log_excerpt) if t) or "(no error text)"
    else:
        return []
    fence = _fence(body)
    where = [f"log: `{variant.log_path}`", ""] if variant.log_path else []
    return [
        "<details>",
        f"<summary>{_inline(title)}</summary>",
        "",
        *where,
        fence,
        body.rstrip("\n"),
        fence,
        "</details>",
    ]


def _unique(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def provenance_line(result: ScenarioResult) -> str:
    versions = ", ".join(f"{v.name} {v.vllm_version or MISSING}" for v in result.variants)
    patches = ", ".join(f"{v.name} {_short(v.patch_sha256)}" for v in result.variants if v.patch_sha256)
    platforms = ", ".join(_unique([v.platform for v in result.variants])) or MISSING
    parts = [
        f"vLLM: {versions or MISSING}",
        f"patch sha256: {patches or MISSING}",
        f"scenario sha256: {_short(result.scenario.get('sha256'))}",
        f"platform: {platforms}",
        f"specwake {result.specwake_version}",
        f"started {result.started_at}",
    ]
    return "<sub>" + " · ".join(parts) + "</sub>"


def _scenario_section(result: ScenarioResult) -> list[str]:
    tolerance = _tolerance(result)
    status = result.verdict.upper() + ("" if result.complete else " (incomplete run)")
    lines = [f"### {_name(result)} — {status}", "", *_table(result.variants), ""]
    lines += [_variant_line(v, tolerance) for v in result.variants]
    if any(s.counters_reset for v in result.variants for s in v.stages):
        lines += ["", RESET_NOTE]
    if any(v.l2_discard == "emulated" for v in result.variants):
        lines += ["", f"> {EMULATED_NOTE}"]
    for variant in result.variants:
        block = _details(variant)
        if block:
            lines += ["", *block]
    lines += ["", provenance_line(result)]
    return lines


def render_markdown(results: Sequence[ScenarioResult]) -> str:
    """The PR-comment Markdown of one or more scenario results."""
    lines = [verdict_line(results)]
    for result in results:
        lines += ["", *_scenario_section(result)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- CSV


def _stage_record(result: ScenarioResult, variant: VariantResult, stage: StageResult) -> dict:
    rate = stage.num_accepted_tokens / stage.num_draft_tokens if stage.num_draft_tokens else None
    return {
        "scenario": _name(result),
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
        "requests": len(stage.tok_s),
        "tok_s_median": stage.tok_s_median,
        "tok_s_min": min(stage.tok_s) if stage.tok_s else None,
        "tok_s_max": max(stage.tok_s) if stage.tok_s else None,
        "outputs_match_fresh": stage.outputs_match_fresh,
        "counters_reset": stage.counters_reset,
    }


def stages_frame(results: Sequence[ScenarioResult]) -> pd.DataFrame:
    """One row per scenario × variant × stage, columns in STAGE_COLUMNS order."""
    records = [
        _stage_record(result, variant, stage)
        for result in results
        for variant in result.variants
        for stage in variant.stages
    ]
    return pd.DataFrame.from_records(records, columns=list(STAGE_COLUMNS))


# ---------------------------------------------------------------- files


def _write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_run_files(run_dir: Path, result: ScenarioResult) -> None:
    """Write result.json, report.md and stages.csv into `run_dir` (created if needed).

    Raises ResultsUnwritable naming the folder when anything cannot be written.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(run_dir / RESULT_FILE, to_json(result))
        _write_atomic(run_dir / REPORT_FILE, render_markdown([result]))
        _write_atomic(run_dir / STAGES_FILE, stages_frame([result]).to_csv(index=False))
    except OSError as exc:
        raise ResultsUnwritable(f"{run_dir}: cannot write run files: {exc}") from exc


def load_result(path: Path) -> ScenarioResult:
    """Read a result.json or a run folder's; raises InputError("<path>: <reason>") otherwise."""
    file = path / RESULT_FILE if path.is_dir() else path
    if not file.exists():
        raise InputError(f"{file}: no such file")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{file}: cannot read: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{file}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{file}: not a specwake result (top level is not an object)")
    try:
        return from_dict(data)
    except ValueError as exc:
        raise InputError(f"{file}: {exc}") from exc
    except (TypeError, AttributeError) as exc:
        raise InputError(f"{file}: not a specwake result: {exc}") from exc
