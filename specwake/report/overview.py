"""The top of the report, what a reader of a pull request sees first: how many scenarios and runs, a vLLM of no tested
release, and one compact row per scenario × variant (AL per stage, tok/s against fresh, the slowest wake and reload,
the verdict); and the names that tell several runs of one scenario apart by what differs between them.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from specwake.judge.findings import wake_ratio
from specwake.judge.verdict import GROSS_LOSS_RATIO, NOT_TESTED, gross_loss, recorded_speed_rule, speed_after_cycles
from specwake.prepare.releases import TESTED_RELEASES, is_tested
from specwake.report.explain import NOT_RUN
from specwake.report.markdown import MISSING, cell, inline
from specwake.results import INCOMPLETE, ScenarioResult, VariantResult
from specwake.runfolder import RUN_NAME

MAX_AL_STAGES = 6  # AL of at most this many stages in a compact row; a longer soak shows its first and last


def count_phrase(results: Sequence[ScenarioResult]) -> str:
    """`2 scenarios`, `3 runs of tiny-cpu`, `4 runs of 2 scenarios`."""
    names = list(dict.fromkeys(r.name for r in results))
    if len(results) == len(names):
        return f"{len(names)} scenario{'' if len(names) == 1 else 's'}"
    of = names[0] if len(names) == 1 else f"{len(names)} scenarios"
    return f"{len(results)} runs of {of}"


# What may tell runs of one scenario apart, most telling first: each gives a result's value, and its words.
Describe = Callable[[ScenarioResult], str]


def _patches(result: ScenarioResult) -> str:
    named = {Path(v.patch).name for v in result.variants if v.patch}
    return "patch " + ", ".join(sorted(named)) if named else "no patch"


def _patch_hashes(result: ScenarioResult) -> str:
    hashes = {(v.patch_sha256 or "")[:8] for v in result.variants if v.patch_sha256}
    return "patch sha256 " + ", ".join(sorted(hashes)) if hashes else "no patch"


def _variants(result: ScenarioResult) -> str:
    names = [v.name for v in result.variants]
    return f"variant{'' if len(names) == 1 else 's'} " + ", ".join(names)


def _vllm(result: ScenarioResult) -> str:
    return "vLLM " + ", ".join(dict.fromkeys(v.vllm_version or MISSING for v in result.variants))


def _scenario_file(result: ScenarioResult) -> str:
    return f"scenario sha256 {str(result.scenario.get('sha256') or MISSING)[:8]}"


def _folder(result: ScenarioResult) -> str:
    shard, run = result.scenario.get("shard"), result.scenario.get("run")
    return f"shard {shard}" if shard else f"run {run}" if run else f"started {result.started_at}"


def _folder_path(result: ScenarioResult) -> str:
    """The whole run folder: two runs started in one second under different `--output` folders share its name."""
    return f"in {_run_folder(result)}"


DESCRIBE: tuple[Describe, ...] = (_patches, _patch_hashes, _variants, _vllm, _scenario_file, _folder, _folder_path)


def run_labels(results: Sequence[ScenarioResult]) -> list[str]:
    """A name per result: the scenario's, and for several runs of one scenario what differs between them (its patch
    files, its variants, its vLLM, ...: the first of DESCRIBE that differ, as many as it takes to tell them apart),
    its run folder or start time only where nothing else does."""
    labels = [r.name for r in results]
    for name in dict.fromkeys(labels):
        runs = [i for i, r in enumerate(results) if r.name == name]
        if len(runs) < 2:
            continue
        chosen: list[list[str]] = [[] for _ in runs]
        for describe in DESCRIBE:
            said = [describe(results[i]) for i in runs]
            if len(set(said)) > 1:
                for words, text in zip(chosen, said, strict=True):
                    words.append(text)
            if len({tuple(words) for words in chosen}) == len(runs):
                break
        if len({tuple(words) for words in chosen}) < len(runs):  # nothing tells them apart (one file given twice)
            chosen = [[*words, f"#{n}"] for n, words in enumerate(chosen, 1)]
        for i, words in zip(runs, chosen, strict=True):
            labels[i] = f"{name} ({'; '.join(words)})" if words else name
    return labels


def untested_release_line(results: Sequence[ScenarioResult]) -> list[str]:
    """`> ⚠️ untested vLLM release: 0.35.0 (tiny-cpu/baseline, …); specwake is tested against vLLM 0.32.0, …` where a
    variant's vLLM is of no release series the specwake that ran it was tested against (its result's
    `tested_releases`; this specwake's in results from before them). Nothing where every one is, or unknown."""
    untested: dict[str, list[str]] = {}
    spans: list[str] = []
    for result in results:
        releases = tuple(result.tested_releases) or TESTED_RELEASES
        for variant in result.variants:
            version = variant.vllm_version
            if version and not is_tested(version, releases):
                untested.setdefault(version, []).append(f"{result.name}/{variant.name}")
                spans.append(", ".join(releases))
    if not untested:
        return []
    which = "; ".join(f"{version} ({_some(names)})" for version, names in untested.items())
    tested = " or ".join(dict.fromkeys(spans))
    return [inline(f"> ⚠️ **untested vLLM release**: {which}; specwake is tested against vLLM {tested}")]


def _some(names: Sequence[str], shown: int = 4) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _run_folder(result: ScenarioResult) -> str:
    """The run folder the result was written in, as its server logs name it (`<run>/logs/<variant>.log`, or
    `<run>/<scenario>/logs/…` in a run of several scenarios); else the run folder's name it was loaded from."""
    for variant in result.variants:
        if variant.log_path:
            scenario_dir = Path(variant.log_path).parent.parent
            for folder in (scenario_dir, scenario_dir.parent):
                if RUN_NAME.match(folder.name):
                    return str(folder)
    return str(result.scenario.get("run") or "RUN_FOLDER")


def resume_lines(results: Sequence[ScenarioResult]) -> list[str]:
    """For each interrupted run: the command that runs only its unfinished variants, into the same run folder."""
    runs: dict[str, list[ScenarioResult]] = {}
    for result in results:
        runs.setdefault(_run_folder(result), []).append(result)
    lines = []
    for folder, of_run in runs.items():
        left = [f"{r.name}/{v.name}" for r in of_run for v in r.variants if v.outcome == INCOMPLETE]
        if all(r.complete for r in of_run) or not left:
            continue
        files = [str(r.scenario.get("file") or r.name) for r in of_run]
        shard = next((str(r.scenario["shard"]) for r in of_run if r.scenario.get("shard")), None)
        command = shlex.join(["specwake", "run", *files, "--resume", folder, *(["--shard", shard] if shard else [])])
        lines.append(inline(f"> ⏸ interrupted, unfinished: {_some(left)} — `{command}` runs only those"))
    return lines


def mark(variant: VariantResult) -> str:
    if variant.outcome in NOT_TESTED:
        return "⚠"
    if variant.outcome == INCOMPLETE:
        return "…"
    return "✓" if variant.matched else "✗"


def verdict_cell(variant: VariantResult) -> str:
    """`collapse ✓`, or with what was expected where it differs: `recover ✗ (expected collapse)`."""
    if variant.outcome in (*NOT_TESTED, INCOMPLETE) or not variant.matched:
        outcome = NOT_RUN if variant.not_run else variant.outcome
        return f"{outcome} {mark(variant)} (expected {variant.expected})"
    return f"{variant.outcome} {mark(variant)}"


def _al_cell(variant: VariantResult) -> str:
    """AL stage by stage, `4.00 → 1.00 → 1.00`; a long soak as its first stages, `…` and its last."""
    if not variant.stages:
        return NOT_RUN if variant.not_run else "no stage measured"
    values = [MISSING if s.acceptance_length is None else f"{s.acceptance_length:.2f}" for s in variant.stages_by_cycle]
    if len(values) > MAX_AL_STAGES:
        values = [*values[: MAX_AL_STAGES - 2], "…", values[-1]]
    return " → ".join(values)


def _speed_cell(result: ScenarioResult, variant: VariantResult) -> str:
    """The pooled tok/s after the cycles against fresh and its call: `0.37× (lost)`, `0.29× (lost, advisory)` where
    the call decides nothing (the L2 discard emulated, no min_speedup_recovery)."""
    rule = recorded_speed_rule(result, variant)
    call = speed_after_cycles(variant.stages, rule.min_ratio)
    if call is None or call.ratio is None:
        return MISSING
    if not rule.binding and variant.outcome == "degraded" and gross_loss(variant.stages) is not None:  # it decided
        return f"{call.ratio:.2f}× (lost: below {GROSS_LOSS_RATIO}×)"
    advisory = ", advisory" if call.word != "inconclusive" and not rule.binding else ""
    return f"{call.ratio:.2f}× ({call.word}{advisory})"


def wake_cell(variant: VariantResult) -> str:
    """The slowest cycle's wake and reload (or push), and what it is against the server's first load of its weights
    where vLLM's log gave one: `8.10 s (3× first load)`, `0.058 s (0.021× first load)`."""
    slowest = variant.slowest_wake()
    if slowest is None:
        return MISSING
    seconds = slowest[1]
    text = f"{seconds:.2f} s" if seconds >= 1 else f"{seconds:.3f} s"
    ratio = wake_ratio(variant)
    return text + (f" ({ratio:.2g}× first load)" if ratio is not None else "")


def compact_table(results: Sequence[ScenarioResult], labels: Sequence[str]) -> list[str]:
    """One row per scenario × variant: what a pull request's reader needs first."""
    lines = ["| scenario | variant | AL per stage | tok/s after the cycles vs fresh | wake + reload | verdict |"]
    lines.append("| --- | --- | --- | ---: | ---: | --- |")
    for result, label in zip(results, labels, strict=True):
        for variant in result.variants:
            cells = [label, variant.name, _al_cell(variant), _speed_cell(result, variant), wake_cell(variant),
                     verdict_cell(variant)]  # fmt: skip
            lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return lines
