"""Comparison of two runs of one scenario (`specwake compare OLD NEW`, the nightly trend): per-stage AL and tok/s
changes, and the decision: which are regressions, whether they count, and the exit code they give.

Pure: pairs scenarios, says which resolved settings differ, joins variant × stage, flags regressions.
specwake.report.compare renders the comparison; it decides nothing.

Regressions:
- AL (exact): a stage's AL fell below old × (1 − max_al_drop), or it had drafts before and none now;
- outcome: a variant that matched its expectation before does not now (one "outcome" row per changed variant);
- tok/s, per variant (one "tok/s" row): tonight's level over every stage is below the earlier runs' by more than
  max_toks_drop beyond the spread *between runs*, measured from at least three earlier runs (OLD and `history`;
  specwake.judge.trend). With fewer, the call is inconclusive. Runs whose L2 discard was emulated (CPU) make the
  call advisory — shown, never counted — unless `count_emulated_speed`. Per-stage tok/s ratios are shown, not
  called: one run's requests say nothing about the spread between runs.

- wake, per variant (one "wake + reload" row): the median wake and reload per cycle rose beyond the spread between
  runs (at least three earlier runs), or, with fewer, above ×5 the earlier runs' (specwake.judge.trend.wake_call). It
  counts on CPU too: a wake's seconds do not hang on the shared cores the way decoding speed does. Each post-cycle
  stage row shows its cycle's wake, old → new.

Runs of different scenario files are compared; the settings that differ are listed. When what a stage measures
changed — the model, the drafter, K, max_tokens, the prompts — the regressions are listed but not counted (no
exit 1) unless `force`. A different name alone (what `--pair` pairs) is no difference.

A variant NEW never finished (an interrupted run) is named as unfinished: its missing stages, outcome and tok/s are
not compared, what it did measure is. Where one run measured a variant's tok/s alone and the other side by side with
other servers' work (StageResult.measured_alone), its stage ratios are marked and its tok/s call is advisory.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specwake.errors import EXIT_FAIL, EXIT_PASS, InputError
from specwake.judge.stats import Ratio, ratio
from specwake.judge.trend import MAX_WAKE_RISE, TrendCall, trend_call, wake_call
from specwake.results import INCOMPLETE, ScenarioResult, StageResult, VariantResult

MAX_AL_DROP = 0.05  # default: an AL drop beyond this fraction of the old AL is a regression
MAX_TOKS_DROP = 0.10  # default: tok/s below 1 − this beyond the spread between runs is a regression
OUTCOME_STAGE = "outcome"  # the stage name of a variant-level (outcome) row
SPEED_STAGE = "tok/s"  # the stage name of a variant-level speed row (every stage, against earlier runs)
WAKE_STAGE = "wake + reload"  # the stage name of a variant-level wake row (median per cycle, against earlier runs)
NOT_APPLICABLE = Ratio(None, None, None, "not applicable")


@dataclass(frozen=True)
class Row:
    """One joined stage (or a variant's outcome, speed or wake row) of OLD and NEW; a row states only what it sets."""

    scenario: str
    variant: str
    stage: str
    old_al: float | None = None
    new_al: float | None = None
    al_delta: float | None = None
    old_toks: float | None = None  # tok/s median
    new_toks: float | None = None
    toks_ratio: Ratio = NOT_APPLICABLE  # median(new tok/s) / median(old tok/s); a speed row: tonight / earlier runs
    call: str = ""  # a speed row: drop | gain | same | inconclusive (+ " (advisory)"); a wake row: rise | fall | same
    # | inconclusive; an outcome row: "changed"; else ""
    regression: bool = False
    reason: str = ""  # why it is a regression ("" otherwise)
    # seconds of the wake and reload: of the stage's cycle (a stage row), the median per cycle (a wake row)
    old_wake: float | None = None
    new_wake: float | None = None


@dataclass(frozen=True)
class Difference:
    key: str  # dotted path in the resolved settings, e.g. speculative.num_speculative_tokens
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {_show(self.old)} → {_show(self.new)}"


@dataclass(frozen=True)
class Comparison:
    rows: list[Row]
    regressions: list[Row]
    only_old: list[str]  # "scenario / variant" or "scenario / variant / stage"
    only_new: list[str]
    differences: list[Difference] = field(default_factory=list)
    measurement_changed: bool = False  # model, drafter, K, max_tokens or prompts differ
    counted: bool = True  # whether the regressions count toward the exit code
    files_differ: bool = False  # the scenario files' sha256 differ (or one is unknown)
    speed_notes: list[str] = field(default_factory=list)  # per variant: the tok/s call between runs, and why
    wake_notes: list[str] = field(default_factory=list)  # per variant: the wake call between runs, and why
    unfinished: list[str] = field(default_factory=list)  # "scenario / variant" NEW never finished (interrupted)
    # per variant whose runs measured tok/s differently: "baseline: alone in old, side by side in new"
    measured_differently: list[str] = field(default_factory=list)

    @property
    def counted_regressions(self) -> list[Row]:
        return self.regressions if self.counted else []


# Settings whose change changes what a stage measures: a "regression" across them compares different things.
MEASUREMENT_KEYS = (
    "server.model",
    "server.dtype",
    "speculative.method",
    "speculative.model",
    "speculative.num_speculative_tokens",
    "workload.max_tokens",
    "workload.prompts",
    "workload.temperature",
)
IGNORED_KEYS = ("name", "description", "cpu_scenario")  # labels, not settings


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def settings_differences(old: ScenarioResult, new: ScenarioResult) -> list[Difference]:
    """Resolved settings that differ between two runs, key by key (labels such as the name are not settings). A
    run's settings hold only the variants it ran (`--variant` selects them, Scenario.settings): the settings of a
    variant one run did not run are no difference, and the variant is listed as only in one run instead."""
    a, b = (_flatten(r.scenario.get("settings") or {}) for r in (old, new))
    one_sided = set(_variants_run(old)) ^ set(_variants_run(new))
    keys = sorted(
        k for k in a.keys() | b.keys() if k.split(".")[0] not in IGNORED_KEYS and not _of_variant(k, one_sided)
    )
    return [Difference(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]


def _variants_run(result: ScenarioResult) -> list[str]:
    variants = (result.scenario.get("settings") or {}).get("variants")
    return list(variants) if isinstance(variants, dict) else []


def _of_variant(key: str, names: set[str]) -> bool:
    """Whether a flattened settings key is one variant's own: its [variants.NAME] settings or its expectation."""
    return any(key == f"expect.{name}" or key.startswith(f"variants.{name}.") for name in names)


def _changes_measurement(difference: Difference) -> bool:
    return any(difference.key == k or difference.key.startswith(k + ".") for k in MEASUREMENT_KEYS)


def _check_limit(value: float, what: str) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{what} must be in [0, 1), got {value}")


def _al_problem(old: StageResult, new: StageResult, max_al_drop: float) -> str:
    old_al, new_al = old.acceptance_length, new.acceptance_length
    if old_al is None:
        return ""
    if new_al is None:
        return f"AL {old_al:.2f} → {'void (counters disagree)' if new.counters_disagree else 'no drafts'}"
    bound = old_al * (1.0 - max_al_drop)
    if new_al < bound:
        change = f"{new_al / old_al - 1:+.1%}"
        return f"AL {old_al:.2f} → {new_al:.2f} ({change}; below {bound:.2f} = old × {1 - max_al_drop:.2f})"
    return ""


def _stage_row(scenario: str, variant: str, old: StageResult, new: StageResult, max_al_drop: float) -> Row:
    old_al, new_al = old.acceptance_length, new.acceptance_length
    problem = _al_problem(old, new, max_al_drop)
    return Row(
        scenario=scenario,
        variant=variant,
        stage=new.name,
        old_al=old_al,
        new_al=new_al,
        al_delta=new_al - old_al if old_al is not None and new_al is not None else None,
        old_toks=old.tok_s_median,
        new_toks=new.tok_s_median,
        toks_ratio=ratio(new.tok_s, old.tok_s),
        regression=bool(problem),
        reason=problem,
    )


def median_wake(variant: VariantResult) -> float | None:
    """A run's wake and reload of a variant: the median over its cycles, in seconds; None without a wake."""
    wakes = list(variant.wake_seconds().values())
    return statistics.median(wakes) if wakes else None


def _wake_row(scenario: str, name: str, earlier: Sequence[VariantResult], new: VariantResult) -> tuple[Row, TrendCall]:
    found = wake_call([w for v in earlier if (w := median_wake(v)) is not None], median_wake(new) or 0.0,
                      MAX_WAKE_RISE)  # fmt: skip
    rise = found.word == "rise"
    row = Row(
        scenario=scenario,
        variant=name,
        stage=WAKE_STAGE,
        call=found.word,
        regression=rise,
        reason=found.reason if rise else "",
        old_wake=median_wake(earlier[0]) if earlier else None,
        new_wake=median_wake(new),
    )
    return row, found


def _stages(variant: VariantResult) -> dict[str, list[float]]:
    return {s.name: list(s.tok_s) for s in variant.stages}


def _speed_row(
    scenario: str, name: str, earlier: Sequence[VariantResult], new: VariantResult, max_toks_drop: float, binds: bool
) -> tuple[Row, TrendCall]:
    found = trend_call([_stages(v) for v in earlier], _stages(new), max_toks_drop)
    advisory = found.word == "drop" and not binds
    row = Row(
        scenario=scenario,
        variant=name,
        stage=SPEED_STAGE,
        toks_ratio=Ratio(found.ratio, found.low, found.high, "tonight / earlier runs; interval: a same-code run"),
        call=found.word + (" (advisory)" if advisory else ""),
        regression=found.word == "drop" and binds,
        reason=found.reason if found.word == "drop" and binds else "",
    )
    return row, found


def measured_how(variant: VariantResult) -> str | None:
    """How a variant's stages measured their tok/s: `alone`, `side by side` (other servers' work meanwhile), `partly
    alone`; None where its result does not record it (specwake before measured_alone) or nothing was measured."""
    marks = [s.measured_alone for s in variant.stages]
    if not marks or None in marks:
        return None
    return "alone" if all(marks) else "side by side" if not any(marks) else "partly alone"


def _describe(variant: VariantResult) -> str:
    return f"{variant.outcome} ({'matched' if variant.matched else 'expected ' + variant.expected})"


def _outcome_row(scenario: str, old: VariantResult, new: VariantResult) -> Row | None:
    if old.outcome == new.outcome and old.matched == new.matched:
        return None
    regression = old.matched and not new.matched
    change = f"outcome {_describe(old)} → {_describe(new)}"
    return Row(
        scenario=scenario,
        variant=new.name,
        stage=OUTCOME_STAGE,
        call="changed",
        regression=regression,
        reason=change if regression else "",
    )


def _only(keys_a: Sequence[str], keys_b: Sequence[str], prefix: str) -> list[str]:
    missing = set(keys_b)
    return [f"{prefix} / {key}" for key in keys_a if key not in missing]


def compare(
    old: ScenarioResult,
    new: ScenarioResult,
    *,
    history: Sequence[ScenarioResult] = (),
    max_al_drop: float = MAX_AL_DROP,
    max_toks_drop: float = MAX_TOKS_DROP,
    force: bool = False,
    count_emulated_speed: bool = False,
) -> Comparison:
    """Join OLD and NEW (one scenario, paired by the caller) on variant × stage and flag regressions (see the
    module docstring). `history`: further earlier runs of the scenario, besides OLD, for the spread between runs."""
    _check_limit(max_al_drop, "max_al_drop")
    _check_limit(max_toks_drop, "max_toks_drop")
    differences = settings_differences(old, new)
    old_sha, new_sha = old.scenario.get("sha256"), new.scenario.get("sha256")
    measurement_changed = any(_changes_measurement(d) for d in differences)
    new_name = new.name if new.name == old.name else f"{old.name} → {new.name}"
    old_vars = {v.name: v for v in old.variants}
    new_vars = {v.name: v for v in new.variants}
    rows: list[Row] = []
    notes: list[str] = []
    wake_notes: list[str] = []
    only_old = _only(list(old_vars), list(new_vars), new_name)
    only_new = _only(list(new_vars), list(old_vars), new_name)
    earlier_runs = [old, *(h for h in history if h is not old)]
    unfinished: list[str] = []
    differently: list[str] = []
    for name, new_var in new_vars.items():
        old_var = old_vars.get(name)
        if old_var is None:
            continue
        old_stages = {s.name: s for s in old_var.stages}
        new_stages = {s.name: s for s in new_var.stages}
        prefix = f"{new_name} / {name}"
        cut = new_var.outcome == INCOMPLETE  # interrupted: what it did not reach is not missing, nor its outcome
        only_old += [] if cut else _only(list(old_stages), list(new_stages), prefix)
        only_new += _only(list(new_stages), list(old_stages), prefix)
        unfinished += [prefix] if cut else []
        outcome = None if cut else _outcome_row(new_name, old_var, new_var)
        if outcome is not None:
            rows.append(outcome)
        how = (measured_how(old_var), measured_how(new_var))
        moved = None not in how and how[0] != how[1]
        differently += [f"{name}: {how[0]} in old, {how[1]} in new"] if moved else []
        old_wakes, new_wakes = old_var.wake_seconds(), new_var.wake_seconds()
        for stage_name, new_stage in new_stages.items():
            old_stage = old_stages.get(stage_name)
            if old_stage is not None:
                stage_row = _stage_row(new_name, name, old_stage, new_stage, max_al_drop)
                stage_row = replace(stage_row, old_wake=old_wakes.get(old_stage.cycle),
                                    new_wake=new_wakes.get(new_stage.cycle))  # fmt: skip
                rows.append(replace(stage_row, call=f"{how[0]} → {how[1]}") if moved else stage_row)
        if cut:
            notes.append(f"{name}: not called, the new run did not finish it")
            continue
        earlier = [v for run in earlier_runs for v in run.variants if v.name == name]
        emulated = any(v.l2_discard == "emulated" for v in (*earlier, new_var))
        binds = (count_emulated_speed or not emulated) and not moved
        speed, found = _speed_row(new_name, name, earlier, new_var, max_toks_drop, binds)
        rows.append(speed)
        advisory = (
            " — advisory: the L2 discard was emulated (CPU); --count-emulated-speed counts it"
            if (emulated and not count_emulated_speed)
            else f" — advisory: tok/s measured {how[0]} in old, {how[1]} in new"
            if moved
            else ""
        )
        notes.append(f"{name}: {found.word}, {found.reason}{advisory}")
        if any(median_wake(v) is not None for v in (*earlier, new_var)):
            wake, woke = _wake_row(new_name, name, earlier, new_var)
            rows.append(wake)
            wake_notes.append(f"{name}: {woke.word}, {woke.reason}")
    regressions = [r for r in rows if r.regression]
    counted = force or not measurement_changed
    files_differ = not old_sha or old_sha != new_sha
    return Comparison(
        rows, regressions, only_old, only_new, differences, measurement_changed, counted, files_differ, notes,
        wake_notes, unfinished, differently,
    )  # fmt: skip


def pair_scenarios(
    olds: Sequence[ScenarioResult], news: Sequence[ScenarioResult], pairs: Sequence[tuple[str, str]] = ()
) -> tuple[list[tuple[ScenarioResult, ScenarioResult]], list[str]]:
    """(old, new) results to compare — same name, or an explicit (old name, new name) pair — and the names
    found on one side only. InputError when a pair names a scenario that is not there."""
    by_old = {r.name: r for r in sorted(olds, key=lambda r: r.started_at)}  # one name twice: its latest run
    by_new = {r.name: r for r in sorted(news, key=lambda r: r.started_at)}
    explicit = dict(pairs)
    for old_name, new_name in explicit.items():
        if old_name not in by_old or new_name not in by_new:
            raise InputError(f"--pair {old_name}:{new_name}: old has {sorted(by_old)}, new has {sorted(by_new)}")
    joined = [(by_old[o], by_new[n]) for o, n in explicit.items()]
    used_old, used_new = set(explicit), set(explicit.values())
    joined += [(by_old[n], by_new[n]) for n in by_new if n in by_old and n not in used_old and n not in used_new]
    paired_old = {o.name for o, _ in joined}
    paired_new = {n.name for _, n in joined}
    unmatched = sorted({n for n in by_old if n not in paired_old} | {n for n in by_new if n not in paired_new})
    return joined, unmatched


def same_run(olds: Sequence[ScenarioResult], news: Sequence[ScenarioResult]) -> bool:
    """Whether OLD and NEW are one run given twice (its folder, a results folder whose latest it is, or a copy of
    it): the same run folder name and start for every scenario. A comparison of it with itself measures nothing."""

    def runs(results: Sequence[ScenarioResult]) -> list[tuple[Any, str, str]]:
        return [(r.scenario.get("run"), r.name, r.started_at) for r in results]

    return bool(olds) and all(run for run, _, _ in runs(olds)) and runs(olds) == runs(news)


def compare_runs(
    olds: Sequence[ScenarioResult],
    news: Sequence[ScenarioResult],
    *,
    history: Sequence[Sequence[ScenarioResult]] = (),
    pairs: Sequence[tuple[str, str]] = (),
    max_al_drop: float = MAX_AL_DROP,
    max_toks_drop: float = MAX_TOKS_DROP,
    force: bool = False,
    count_emulated_speed: bool = False,
) -> tuple[list[Comparison], list[str]]:
    """Every paired scenario compared, and the scenario names found on one side only. `history`: further earlier
    runs (each a list of scenario results, e.g. one night's merged shards); a scenario's earlier runs that measured
    something else (another model, K, …) are left out of its spread between runs."""
    joined, unmatched = pair_scenarios(olds, news, pairs)
    if not joined:
        raise InputError(
            f"the runs share no scenario (old: {sorted(r.name for r in olds)}, new: {sorted(r.name for r in news)});"
            " pair differently named scenarios with --pair OLD:NEW"
        )
    comparisons = []
    for o, n in joined:
        same = [
            r
            for run in history
            for r in run
            if r.name == o.name and not any(_changes_measurement(d) for d in settings_differences(r, n))
        ]
        comparisons.append(
            compare(
                o,
                n,
                history=same,
                max_al_drop=max_al_drop,
                max_toks_drop=max_toks_drop,
                force=force,
                count_emulated_speed=count_emulated_speed,
            )  # fmt: skip
        )
    return comparisons, unmatched


def parse_pair(text: str) -> tuple[str, str]:
    """`OLD:NEW` → (OLD, NEW); InputError otherwise."""
    old, sep, new = text.partition(":")
    if not sep or not old or not new:
        raise InputError(f"--pair: expected OLD:NEW (two scenario names), got {text!r}")
    return old, new


def exit_code(comparisons: Sequence[Comparison]) -> int:
    """`compare`'s exit code: 1 when any comparison has a regression that counts, else 0."""
    return EXIT_FAIL if any(c.counted_regressions for c in comparisons) else EXIT_PASS
