"""The collapsed `<details>` block under a variant's line in the PR report: failure evidence, per-position
acceptance, cycle step timings, diagnostics and the exact server command.
"""

from __future__ import annotations

import shlex
from typing import Any

from specwake.judge.weights import ROLES
from specwake.report.cycles import ledger
from specwake.report.explain import update_words
from specwake.report.markdown import MISSING, cell, fenced, inline
from specwake.report.weights import (
    changes_line,
    checker_line,
    discard_line,
    memory_line,
    misroutes_line,
    uncovered_line,
    weights_line,
)
from specwake.results import STAGE_FINGERPRINTS, VariantResult


def _position_table(variant: VariantResult) -> list[str]:
    stages = variant.stages_by_cycle
    k = max((len(s.per_position) for s in stages), default=0)
    if k == 0:
        return []
    lines = ["Acceptance rate per draft position:", ""]
    lines += ["| stage | " + " | ".join(f"pos {p + 1}" for p in range(k)) + " |", "| --- |" + " ---: |" * k]
    for s in stages:
        rates = [f"{r:.2f}" for r in s.per_position] + [MISSING] * (k - len(s.per_position))
        lines.append(f"| {cell(s.name)} | " + " | ".join(rates) + " |")
    return lines + [""]


def _stop_lines(variant: VariantResult) -> list[str]:
    """Why each stage measured the requests it did (results from before stages could stop early record none)."""
    stages = [s for s in variant.stages_by_cycle if s.stopped]
    if not stages:
        return []
    lines = ["Requests per stage:", ""]
    lines += [inline(f"- {s.name}: {s.measured} — {s.stopped}") for s in stages]
    return lines + [""]


def _step_table(variant: VariantResult) -> list[str]:
    """Every step with its HTTP status and wall seconds; beside them, where the server keeps them (vLLM 0.32 and
    later, after the first such call), vLLM's own seconds for the operation."""
    if not variant.steps:
        return []
    own = any(st.vllm_seconds is not None for st in variant.steps)
    head = "| cycle | step | HTTP | seconds |" + (" vLLM's seconds |" if own else "")
    lines = ["Cycle steps:", "", head, "| ---: | --- | ---: | ---: |" + (" ---: |" if own else "")]
    for st in variant.steps:
        status = MISSING if st.status is None else str(st.status)
        row = f"| {st.cycle} | {cell(st.name)} | {status}{'' if st.ok else ' ✗'} | {st.seconds:.3f} |"
        if own:
            row += f" {MISSING if st.vllm_seconds is None else f'{st.vllm_seconds:.3f}'} |"
        lines.append(row)
    lines += [inline(f"- cycle {st.cycle} {st.name} failed: {st.error}") for st in variant.steps if st.error]
    return lines + [""]


def time_text(timings: dict[str, Any], start: str | None = None) -> str:
    """`startup 30.2 s (warm start) · measurement 7.5 s · diagnostics 0.6 s (0.2 s of it fingerprints after stages)`:
    where a variant's time went, how its servers started (`start`: warm, cold; specwake.run.server.warm), the
    seconds of the fingerprints after its stages inside its diagnostics'."""
    after_stages = timings.get(STAGE_FINGERPRINTS)
    parts = []
    for key, seconds in timings.items():
        if key == STAGE_FINGERPRINTS or not isinstance(seconds, int | float):
            continue
        part = f"{key.replace('_', ' ')} {seconds:.1f} s"
        if key == "startup" and start is not None:
            part += f" ({start} start)"
        if key == "diagnostics" and isinstance(after_stages, int | float):
            part += f" ({after_stages:.1f} s of it fingerprints after stages)"
        parts.append(part)
    return " · ".join(parts)


def _diagnostic_lines(variant: VariantResult) -> list[str]:
    info = variant.info if isinstance(variant.info, dict) else {}
    timings, start = info.get("timings"), info.get("start")
    lines = []
    if isinstance(timings, dict) and timings:
        lines.append("- time: " + time_text(timings, start if isinstance(start, str) else None))
    discarded = discard_line(variant.steps)
    if discarded is not None:
        lines.append(f"- {discarded}")
    if variant.diagnostics:
        weights = [weights_line(variant.diagnostics, role) for role in ROLES]
        weights += [changes_line(variant.diagnostics, role, variant.stages) for role in ROLES]
        weights += [misroutes_line(variant.diagnostics, role, update_words(variant.push)) for role in ROLES]
        weights += [uncovered_line(variant.diagnostics, role) for role in ROLES]
        checker = checker_line(variant.diagnostics)
        lines += [f"- {line}" for line in (*weights, checker, memory_line(variant.diagnostics)) if line is not None]
        lines += [f"- diagnostic at {d.point} failed: {d.error}" for d in variant.diagnostics if d.error is not None]
    return [inline(line) for line in lines if line is not None]


def _failure_lines(variant: VariantResult) -> list[str]:
    if variant.outcome not in ("crash", "error"):
        return []
    default = "startup_failed" if variant.outcome == "error" else "unknown"
    lines = [f"**{variant.outcome}** — class `{variant.crash_class or default}`", ""]
    if variant.first_error:
        lines += [f"First error the server announced: `{inline(variant.first_error)}`", ""]
    if variant.error:
        lines += ["Error:", "", *fenced(variant.error), ""]
    crash_lines = variant.info.get("crash_lines") if isinstance(variant.info, dict) else None
    if crash_lines:
        lines += ["Log lines that decided the class:", "", *fenced("\n".join(map(str, crash_lines))), ""]
    where = f" (`{inline(variant.log_path)}`)" if variant.log_path else ""
    lines += [f"Log excerpt{where}:", "", *fenced(variant.log_excerpt or "(no log excerpt)"), ""]
    return lines


def _command(variant: VariantResult) -> list[str]:
    if not variant.command:
        return []
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in variant.env.items())
    return ["Server command:", "", *fenced((env + " " if env else "") + shlex.join(variant.command), "sh")]


def details(variant: VariantResult) -> list[str]:
    """A collapsed block of the evidence behind a variant's line; its summary names the sections it holds."""
    diag = _diagnostic_lines(variant)
    sections = [
        (f"{variant.outcome} ({variant.crash_class or 'unknown'})", _failure_lines(variant)),
        ("per-position acceptance", _position_table(variant)),
        ("requests per stage", _stop_lines(variant)),
        ("cycle steps", _step_table(variant)),
        ("wake ledger", ledger(variant)),
        ("diagnostics", ["Diagnostics:", "", *diag, ""] if diag else []),
        ("server command", _command(variant)),
    ]
    present = [(title, lines) for title, lines in sections if lines]
    if not present:
        return []
    summary = f"{variant.name}: " + ", ".join(title for title, _ in present)
    body = [line for _, lines in present for line in lines]
    return ["<details>", f"<summary>{inline(summary)}</summary>", "", *body, "</details>"]
