"""The Markdown of a comparison of two runs (`specwake compare OLD NEW`): the table of per-stage AL, tok/s and wake
changes, the regressions and why they count or not. What is a regression, and the exit code, are decided in
specwake.judge.compare; this module only renders them.
"""

from __future__ import annotations

from collections.abc import Sequence

from specwake.judge.compare import OUTCOME_STAGE, SPEED_STAGE, WAKE_STAGE, Comparison, Row
from specwake.report.markdown import MISSING, cell, num, ratio_cell

# ---------------------------------------------------------------- Markdown


def _wake_cell(row: Row) -> str:
    """`0.080 → 8.100` seconds; `–` where neither run woke."""
    if row.old_wake is None and row.new_wake is None:
        return MISSING
    return f"{num(row.old_wake, 3)} → {num(row.new_wake, 3)}"


def _table_row(row: Row) -> str:
    if row.stage == OUTCOME_STAGE:
        cells = [row.variant, row.stage, MISSING, MISSING, MISSING, MISSING, MISSING, row.call]
    elif row.stage == SPEED_STAGE:
        cells = [row.variant, "tok/s, every stage", MISSING, MISSING, "vs earlier runs", ratio_cell(row.toks_ratio),
                 MISSING, row.call]  # fmt: skip
    elif row.stage == WAKE_STAGE:
        cells = [row.variant, "wake + reload, median per cycle", MISSING, MISSING, MISSING, MISSING, _wake_cell(row),
                 row.call]  # fmt: skip
    else:
        cells = [
            row.variant,
            row.stage,
            f"{num(row.old_al, 2)} → {num(row.new_al, 2)}",
            num(row.al_delta, 2, sign=True),
            f"{num(row.old_toks, 1)} → {num(row.new_toks, 1)}",
            ratio_cell(row.toks_ratio),
            _wake_cell(row),
            row.call or MISSING,
        ]
    cells.append("**yes**" if row.regression else "no")
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def _methods(rows: Sequence[Row]) -> list[str]:
    return list(
        dict.fromkeys(r.toks_ratio.method for r in rows if r.stage not in (OUTCOME_STAGE, SPEED_STAGE, WAKE_STAGE))
    )


def render_comparison_markdown(c: Comparison) -> str:
    """A PR/nightly Markdown summary: headline, one table per scenario, regressions, unmatched keys."""
    count = len(c.regressions)
    headline = (
        f"**specwake compare: {count} regression{'s' if count != 1 else ''}**"
        if count
        else ("**specwake compare: no regressions**")
    )
    if count and not c.counted:
        headline += " (not counted: measured under different settings)"
    lines = [headline]
    if c.unfinished:
        left = ", ".join(cell(k) for k in c.unfinished)
        lines += ["", f"The new run is incomplete (interrupted): {left} unfinished. What they did not measure is not"
                  " compared and counts as no regression; `specwake run … --resume` finishes them."]  # fmt: skip
    if c.measured_differently:
        how = "; ".join(cell(note) for note in c.measured_differently)
        lines += ["", f"tok/s measured differently — {how}: alone, or beside other servers' work; the ratios compare"
                  " different conditions, and the tok/s call is advisory."]  # fmt: skip
    if c.differences:
        label = "Settings differ" + (" — what a stage measures changed" if c.measurement_changed else "")
        lines += ["", f"{label}: " + "; ".join(cell(str(d)) for d in c.differences)]
    elif c.files_differ:
        lines += ["", "The scenario files differ; their resolved settings are the same."]
    if c.measurement_changed and not c.counted:
        lines += ["", "Regressions across changed settings are listed, not counted (pass --force to count them)."]
    for scenario in dict.fromkeys(r.scenario for r in c.rows):
        rows = [r for r in c.rows if r.scenario == scenario]
        lines += ["", f"### {cell(scenario)}", ""]
        lines += [
            "| variant | stage | AL old → new | ΔAL | tok/s old → new | tok/s ratio [CI] | wake s old → new | call"
            " | regression |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | :---: | :---: |",
        ]
        lines += [_table_row(r) for r in rows]
    if c.regressions:
        lines += ["", "Regressions:"]
        lines += [f"- {cell(f'{r.scenario} / {r.variant} / {r.stage}: {r.reason}')}" for r in c.regressions]
    for title, keys in (("Only in old", c.only_old), ("Only in new", c.only_new)):
        if keys:
            lines += ["", f"{title}: " + ", ".join(cell(k) for k in keys)]
    if c.speed_notes:
        lines += ["", "tok/s between runs (every stage of a variant, against the earlier runs):"]
        lines += [f"- {cell(note)}" for note in c.speed_notes]
    if c.wake_notes:
        lines += ["", "wake + reload between runs (the median per cycle of a variant, against the earlier runs):"]
        lines += [f"- {cell(note)}" for note in c.wake_notes]
    methods = _methods(c.rows)
    if methods:
        lines += [
            "",
            "<sub>Per stage: tok/s ratio = median(new) / median(old); interval: "
            + "; ".join(cell(m) for m in methods)
            + ", shown, not called (requests of one run say nothing about the spread between runs). tok/s is"
            " called per variant against ≥ 3 earlier runs; an inconclusive or advisory call is never a"
            " regression.</sub>",
        ]
    return "\n".join(lines) + "\n"
