"""The PR-comment Markdown of finished runs: the verdict line and the compact table of every scenario × variant
(report/overview.py), then per scenario its stage table and one line per variant saying why (folded), each variant's
evidence (folded) and the provenance footer; shortened to fit one GitHub comment where asked (report/fit.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specwake.judge.sequential import DEFAULT_MIN_REPEATS
from specwake.judge.stats import ratio
from specwake.judge.verdict import (
    SpeedRule,
    outcome_matches,
    recorded_speed_rule,
    recorded_tolerance,
    speed_after_cycles,
)
from specwake.judge.weights import ROLES
from specwake.prepare.runners import runner_label
from specwake.report.columns import TABLE, StageView, table_cells
from specwake.report.cycles import cost_table, drift_line, logprob_line, prefix_cache_line
from specwake.report.details import details
from specwake.report.explain import NOT_RUN, explain, stage_change, unrestored_drafter
from specwake.report.fit import Block, fit
from specwake.report.markdown import MISSING, cell, inline, ratio_cell, short_sha
from specwake.report.overview import (
    compact_table,
    count_phrase,
    mark,
    resume_lines,
    run_labels,
    untested_release_line,
)
from specwake.report.rows import after_samples, stage_rows
from specwake.report.weights import change_text, discard_rules, restore_text
from specwake.results import INCOMPLETE, ScenarioResult, VariantResult
from specwake.weight_updates import KIND_BY_VIA, RELOAD_KIND, RELOAD_KINDS

EMULATED_NOTE = (
    "L2 discard emulated on CPU: after /sleep?level=2 specwake overwrote every parameter and plain tensor attribute "
    "of target and drafter ({fill}), kept the buffers (vLLM copies them to host memory across an L2 sleep) and made "
    "the packed CPU copies of linear layers answer as discarded until a reload replaces them; {restored}"
)
NEWER_RULES_NOTE = (
    " {names} followed vLLM 0.34's L2 sleep instead: only the storages of parameters were overwritten, buffers and"
    " plain tensor attributes in memory of their own kept"
)
FILL_WORDS = {"zero": "zeros", "nan": "NaN", "random": "random values, like memory CUDA hands back uncleared"}
RESET_NOTE = "† a counter went backwards during this stage (engine restarted): its numbers count from the restart"
_VERDICT_RANK = {"pass": 0, "error": 1, "fail": 2}
_VERDICT_ICON = {"pass": "✅", "fail": "❌", "error": "⚠️"}


# ---------------------------------------------------------------- Markdown pieces


def _row(cells: Sequence[str], widths: Sequence[int], aligns: Sequence[str]) -> str:
    padded = [c.rjust(w) if a == "---:" else c.ljust(w) for c, w, a in zip(cells, widths, aligns, strict=True)]
    return "| " + " | ".join(padded) + " |"


def _table(result: ScenarioResult) -> list[str]:
    body = []
    for variant in result.variants:
        if not variant.stages:
            nothing = NOT_RUN if variant.not_run else "no stage measured"
            body.append([cell(variant.name), nothing, *[MISSING] * (len(TABLE) - 2)])
        body += [[cell(c) for c in table_cells(StageView(result, variant, r))] for r in stage_rows(variant)]
    heads = [c.header for c in TABLE]
    aligns = [c.align for c in TABLE]
    # Numbers get fixed widths; names are as wide as the longest in this table (stable for one scenario).
    widths = [max(len(c.header), c.width) for c in TABLE]
    for i in (0, 1):
        widths[i] = max([widths[i], *(len(cells[i]) for cells in body)])
    return [_row(heads, widths, aligns), _row(aligns, widths, aligns), *(_row(c, widths, aligns) for c in body)]


def _speed_text(variant: VariantResult, rule: SpeedRule) -> str:
    call = speed_after_cycles(variant.stages, rule.min_ratio)
    if call is None:
        return ""
    ratio_text = "" if call.ratio is None else f"{call.ratio:.2f}× fresh "
    return (
        f"; tok/s after the cycles: {ratio_text}({call.n_fresh} vs {call.n_post} requests): **{call.word}**"
        f" — {call.reason}; {rule.why}, threshold {rule.min_ratio:.2f}× fresh"
    )


def _variant_line(variant: VariantResult, tolerance: float, rule: SpeedRule) -> str:
    found = f"; **findings**: {'; '.join(variant.findings)}" if variant.findings else ""
    return inline(
        f"- **{variant.name}**: {variant.outcome} (expected {variant.expected}) {mark(variant)}{_pushed(variant)}"
        f" — {explain(variant, tolerance)}{_warned(variant)}{found}{_speed_text(variant, rule)}{_alone_text(variant)}"
    )


def _warned(variant: VariantResult) -> str:
    """What vLLM itself warned of in the variant's log (the draft discard of vLLM 0.34), quoted."""
    return "".join(f"; vLLM warned: “{quote}”" for quote in variant.vllm_warnings)


def _alone_text(variant: VariantResult) -> str:
    """Which stages measured their tok/s alone, while no other server of the run was busy and no other specwake run
    had one up (results that record it; a run that shared the machine's turn claims nothing)."""
    marks = [s.measured_alone for s in variant.stages]
    if not marks or None in marks:
        return ""
    if all(marks):
        return "; tok/s of every stage measured alone"
    if not any(marks):
        return "; tok/s measured beside other servers' work (no turns)"
    return "; tok/s measured alone in " + ", ".join(s.name for s in variant.stages if s.measured_alone) + " only"


def _pushed(variant: VariantResult) -> str:
    """What the variant's cycles pushed or synced instead of reloading (empty for a reload); what a perturbed or
    partial one scaled or left out is the explanation's to say (explain.sent_line)."""
    if variant.push is None:
        return ""
    to = " and ".join(variant.push.to)
    return " · " + KIND_BY_VIA[variant.push.via].did.format(to=to)


def _patched_vs_baseline(variants: Sequence[VariantResult]) -> list[str]:
    by_name = {v.name: v for v in variants}
    if "patched" not in by_name or "baseline" not in by_name:
        return []
    top, bottom = after_samples(by_name["patched"]), after_samples(by_name["baseline"])
    if not top or not bottom:
        return []
    return [
        f"- patched / baseline tok/s after the cycles: {ratio_cell(ratio(top, bottom))}"
        f" (median over all post-cycle requests, n={len(top)} vs {len(bottom)})"
    ]


def _floor_lines(variants: Sequence[VariantResult]) -> list[str]:
    """tok/s after the cycles of every speculating variant against the no-speculation floor."""
    floor = next((v for v in variants if v.outcome == "floor" and after_samples(v)), None)
    if floor is None:
        return []
    parts = [
        f"{v.name} {ratio_cell(ratio(after_samples(v), after_samples(floor)))}×"
        for v in variants
        if v is not floor and after_samples(v)
    ]
    if not parts:
        return []
    return [
        f"- tok/s after the cycles against the no-speculation floor ({floor.name}): "
        + ", ".join(parts)
        + " — a collapsed drafter sits at 1×: every drafted token is wasted work"
    ]


def _unique(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _interval_phrase(result: ScenarioResult) -> str:
    rows = [r for v in result.variants for r in stage_rows(v)]
    medians = _unique([r.summary.method for r in rows if r.summary.n])
    ratios = _unique([r.vs_fresh.method for r in rows if r.vs_fresh is not None and r.vs_fresh.value is not None])
    return f"tok/s CI: {', '.join(medians) or MISSING}; ratio CI: {', '.join(ratios) or MISSING}"


def _gpus(variant: VariantResult) -> str:
    """`baseline 0,1 (CUDA_VISIBLE_DEVICES=4,5)`: visible indices, and the device ids the server was given."""
    gpus = variant.info.get("gpus") if isinstance(variant.info, dict) else None
    if not isinstance(gpus, list) or not gpus:
        return ""
    devices = variant.info.get("devices")
    shown = ",".join(map(str, gpus))
    return f"{variant.name} {shown}" + (f" (CUDA_VISIBLE_DEVICES={devices})" if devices and devices != shown else "")


def provenance_line(result: ScenarioResult) -> str:
    """The footer: versions, hashes, host, GPUs, discard kind, run mode, interval method, start time."""
    variants = result.variants
    versions = ", ".join(f"{v.name} {v.vllm_version or MISSING}" for v in variants)
    patches = ", ".join(f"{v.name} {short_sha(v.patch_sha256)}" for v in variants if v.patch_sha256)
    gpu_text = "; ".join(_gpus(v) for v in variants if _gpus(v))
    parts = [
        f"specwake {result.specwake_version}",
        f"vLLM: {versions or MISSING}",
        f"patch sha256: {patches or MISSING}",
        f"scenario sha256: {short_sha(result.scenario.get('sha256'))}",
        f"Python {result.host.get('python') or MISSING}",
        f"host {result.host.get('hostname') or MISSING}",
        f"platform: {', '.join(_unique([v.platform for v in variants])) or MISSING}",
        *([f"GPUs: {gpu_text}"] if gpu_text else []),
        f"L2 discard: {', '.join(_unique([v.l2_discard for v in variants])) or MISSING}",
        f"mode: {result.scenario.get('mode') or MISSING}",
        _interval_phrase(result),
        f"started {result.started_at}",
    ]
    return "<sub>" + inline(" · ".join(parts)) + "</sub>"


def _section(settings: dict[str, Any], key: str) -> dict[str, Any]:
    value = settings.get(key)
    return value if isinstance(value, dict) else {}


def _setup_line(result: ScenarioResult) -> list[str]:
    s = result.scenario.get("settings")
    if not isinstance(s, dict) or not isinstance(s.get("server"), dict):
        return []
    server, spec, work, cycle = (_section(s, k) for k in ("server", "speculative", "workload", "cycle"))
    parts = [
        f"`{server.get('model', MISSING)}`",
        f"{spec.get('method', MISSING)} K={spec.get('num_speculative_tokens', MISSING)}",
        f"TP {server.get('tensor_parallel_size', MISSING)}{_dp(server)}"
        + (", eager" if server.get("enforce_eager") else ""),
        f"{cycle.get('count', MISSING)} × L{cycle.get('level', MISSING)} sleep/wake",
        f"{work.get('repeats', MISSING)} request{'' if work.get('repeats') == 1 else 's'}{_early(work, server)}"
        f" × {work.get('max_tokens', MISSING)} tokens per stage",
        *_runners(result.variants),
    ]
    return [inline(" · ".join(parts)), ""]


def _runners(variants: Sequence[VariantResult]) -> list[str]:
    """The model runner the variants ran (`Model Runner V2 (Triton kernels interpreted on CPU)`), each with the
    variants that ran it where they differ; nothing where no worker said (results from before runners were
    recorded)."""
    by_label: dict[str, list[str]] = {}
    for v in variants:
        label = runner_label(v.model_runner, v.platform)
        if label is not None:
            by_label.setdefault(label, []).append(v.name)
    if len(by_label) == 1:
        return list(by_label)
    return ["; ".join(f"{label}: {', '.join(names)}" for label, names in by_label.items())] if by_label else []


def _dp(server: dict[str, Any]) -> str:
    """`, DP 2` (`, DP 2 + EP`) for a data-parallel server; "" for one engine."""
    dp = server.get("data_parallel_size", 1)
    return f", DP {dp}" + (" + EP" if server.get("enable_expert_parallel") else "") if dp != 1 else ""


def _early(work: dict[str, Any], server: dict[str, Any]) -> str:
    """` (2–5 after a cycle)` where stages after a cycle could stop early (never with data parallelism); results from
    before record no min_repeats."""
    if server.get("data_parallel_size", 1) != 1:
        return ""
    repeats, least = work.get("repeats"), work.get("min_repeats", MISSING)
    if least is None and isinstance(repeats, int):
        least = min(DEFAULT_MIN_REPEATS, repeats)
    if not isinstance(least, int) or not isinstance(repeats, int) or least >= repeats:
        return ""
    return f" ({least}–{repeats} after a cycle)"


@dataclass(frozen=True)
class Section:
    """One scenario's part of the report: its heading and setup (always shown), its stage table with a line per
    variant and the notes below them (folded), each variant's evidence (folded), and its provenance footer."""

    head: tuple[str, ...]
    stages: tuple[str, ...]
    evidence: tuple[tuple[bool, tuple[str, ...]], ...]  # (as expected, its block) per variant that has any
    footer: str
    passed: bool


def _scenario_section(result: ScenarioResult, label: str) -> Section:
    """One scenario's section; `label` names it (with what tells it apart from other runs of the scenario)."""
    tolerance = recorded_tolerance(result)
    icon = _VERDICT_ICON.get(result.verdict, "⚠️")
    status = result.verdict.upper() + ("" if result.complete else " (incomplete run)")
    head = [f"### {inline(label)} — {icon} {status}", "", *_setup_line(result)]
    lines = [*_table(result), ""]
    lines += [_variant_line(v, tolerance, recorded_speed_rule(result, v)) for v in result.variants]
    lines += _patched_vs_baseline(result.variants)
    lines += _floor_lines(result.variants)
    lines += prefix_cache_line(result.variants)
    lines += [line for v in result.variants for line in (logprob_line(v), drift_line(v)) if line]
    lines += cost_table(result.variants)
    if any(s.counters_reset for v in result.variants for s in v.stages):
        lines += ["", RESET_NOTE]
    if any(v.l2_discard == "emulated" for v in result.variants):
        cycle = _section(result.scenario.get("settings") or {}, "cycle")
        fill = FILL_WORDS.get(str(cycle.get("discard_fill", "zero")), str(cycle.get("discard_fill")))
        restored = RELOAD_KINDS.get(str(cycle.get("reload")), RELOAD_KIND).restored_by
        pushed = "; ".join(f"{v.name}: {' and '.join(v.push.to)}" for v in result.variants if v.push is not None)
        note = EMULATED_NOTE.format(fill=fill, restored=restored.format(pushed=pushed))
        newer = [v.name for v in result.variants if discard_rules(v.steps) == "0.34"]
        note += f".{NEWER_RULES_NOTE.format(names=', '.join(newer))}" if newer else ""
        lines += ["", f"> {note}"]
    summary = f"{label}: stage table, and why each variant's outcome"
    stages = ["<details>", f"<summary>{inline(summary)}</summary>", "", *lines, "", "</details>"]
    evidence = tuple((v.matched, tuple(block)) for v in result.variants if (block := details(v)))
    passed = result.complete and all(v.matched for v in result.variants)
    return Section(tuple(head), tuple(stages), evidence, provenance_line(result), passed)


def _overall(verdicts: Sequence[str]) -> str:
    if not verdicts:
        return "error"
    return max(verdicts, key=lambda v: _VERDICT_RANK.get(v, _VERDICT_RANK["error"]))


def _offenders(results: Sequence[ScenarioResult]) -> list[str]:
    named = []
    for r in results:
        for v in r.variants:
            if v.outcome == "error":
                named.append(f"{r.name}/{v.name} not measured ({v.crash_class or 'nothing measured'})")
            elif v.outcome == "untested":
                named.append(f"{r.name}/{v.name} untested (vLLM ignores sleep on CPU)")
            elif v.outcome == INCOMPLETE:
                named.append(f"{r.name}/{v.name} {NOT_RUN if v.not_run else 'unfinished'}")
            elif not v.matched and v.findings and outcome_matches(v.outcome, v.expected):
                named.append(f"{r.name}/{v.name} {_headline(v.findings[0])}")
            elif not v.matched:
                why, changed = unrestored_drafter(v), stage_change(v)
                reason = f" ({why.role}: {restore_text(why)} after {why.what} in cycle {why.cycle})" if why else ""
                reason = reason or (f" ({change_text(changed, v.stages)})" if changed else "")
                named.append(f"{r.name}/{v.name} {v.outcome}{reason}, expected {v.expected}")
    return named


def _headline(finding: str) -> str:
    """What the verdict line names of a finding: `stale prefix cache`, `draft: 7 tensors in new storage after
    reload_weights in cycle 1` (the text before its details)."""
    if finding.startswith(tuple(f"{role}: " for role in ROLES)):
        return finding.split(" (")[0]
    return finding.split(":")[0]


def verdict_line(results: Sequence[ScenarioResult]) -> str:
    """`specwake: ✅ PASS — 2 scenarios, 4/4 variants as expected` (+ the variants that were not)."""
    overall = _overall([r.verdict for r in results])
    variants = [v for r in results for v in r.variants]
    matched = sum(1 for v in variants if v.matched)
    count = count_phrase(results)
    line = f"specwake: {_VERDICT_ICON[overall]} {overall.upper()} — {count}, {matched}/{len(variants)} variants"
    line += " as expected"
    offenders = _offenders(results)
    return inline(line + (" — " + "; ".join(offenders) if offenders else ""))


# What a shortened report leaves out first: evidence of variants as expected, then of the others, then the stage
# tables of scenarios that passed, then of the others, then whole sections of scenarios that passed.
_EVIDENCE = ("variant's evidence (`<details>` block)", "variants' evidence (`<details>` blocks)")
_STAGES = ("scenario's stage table and verdict lines", "scenarios' stage tables and verdict lines")
_SECTION = ("passing scenario's section", "passing scenarios' sections")


def _blocks(sections: Sequence[Section]) -> list[Block]:
    blocks = []
    for section in sections:
        blocks.append(Block(("", *section.head), 4 if section.passed else None, _SECTION))
        blocks.append(Block((*section.stages, ""), 2 if section.passed else 3, _STAGES))
        blocks += [Block((*lines, ""), 0 if matched else 1, _EVIDENCE) for matched, lines in section.evidence]
        blocks.append(Block((section.footer,), 4 if section.passed else None, _SECTION))
    return blocks


def _where(results: Sequence[ScenarioResult]) -> str:
    """Where a shortened report's rest is: the report.md of each run folder."""
    runs = list(dict.fromkeys(str(r.scenario["run"]) for r in results if r.scenario.get("run")))
    if not runs:
        return "The run folder's report.md has everything."
    shown = ", ".join(f"`{run}`" for run in runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
    return f"Each run folder's report.md has everything ({shown})."


def render_markdown(results: Sequence[ScenarioResult], limit: int | None = None) -> str:
    """The PR-comment Markdown of one or more scenario results; with `limit`, shortened to at most that many characters
    (report/fit.py: COMMENT_LIMIT for one GitHub comment), saying what was left out and where it is."""
    labels = run_labels(results)
    top = [f"## {verdict_line(results)}", ""]
    for note in [*untested_release_line(results), *resume_lines(results)]:
        top += [note, ""]
    top += compact_table(results, labels)
    sections = [_scenario_section(result, label) for result, label in zip(results, labels, strict=True)]
    kept, shortened = fit([Block(tuple(top)), *_blocks(sections)], limit, _where(results))
    head, *rest = kept  # the top is never left out: the note follows it
    lines = [*head.lines, *(["", *shortened] if shortened else []), *(line for block in rest for line in block.lines)]
    return "\n".join(lines).rstrip("\n") + "\n"
