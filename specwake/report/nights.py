"""The trend over nights that `specwake compare` shows: per scenario × variant, AL and tok/s in every run compared
(the `--history` runs, OLD and NEW, oldest first), as numbers and as a Markdown table of sparklines.

One number per night and variant for each quantity:
- AL fresh: the fresh stage's AL;
- AL after wake: the lowest AL of the stages after a cycle (what the recover and collapse rules judge);
- tok/s: the geometric mean of the stages' median tok/s, the level specwake.judge.trend calls.

None: the scenario × variant is not in that night's results; NaN: it is, and measured nothing (a crash before the
stage, or no drafts). Pure: numbers and strings; the chart is specwake.report.trend_plot's.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specwake.judge.trend import level
from specwake.report.markdown import cell
from specwake.results import ScenarioResult, VariantResult

NAN = float("nan")
BARS = "▁▂▃▄▅▆▇█"
FLAT = "▄"  # the middle of the scale: a value that did not move, or one alone
ABSENT = "·"  # not in that night's results
NOTHING = "×"  # in the results, nothing measured
MIN_SPAN = 0.20  # a sparkline's scale spans at least this fraction of its largest value: noise stays mid-height
QUANTITIES = ("al_fresh", "al_after_wake", "tok_s")
TITLES = {"al_fresh": "AL fresh", "al_after_wake": "AL after wake", "tok_s": "tok/s"}
DIGITS = {"al_fresh": 2, "al_after_wake": 2, "tok_s": 1}

Value = float | None  # None: absent that night; NaN: nothing measured


@dataclass(frozen=True)
class Night:
    """One run compared: when it started (its earliest scenario), its x label, and the run folders it came from."""

    started_at: str
    label: str
    runs: tuple[str, ...]


@dataclass(frozen=True)
class Series:
    """One scenario × variant over the nights: one value per night for each quantity."""

    scenario: str
    variant: str
    al_fresh: tuple[Value, ...]
    al_after_wake: tuple[Value, ...]
    tok_s: tuple[Value, ...]

    def values(self, quantity: str) -> tuple[Value, ...]:
        return tuple(getattr(self, quantity))


@dataclass(frozen=True)
class Trend:
    nights: tuple[Night, ...]
    series: tuple[Series, ...]


def moment(text: str | None) -> dt.datetime | None:
    """An ISO 8601 time as results write it (`…+00:00`, or `…Z` in older files) in UTC; None when absent or
    unreadable."""
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.astimezone(dt.timezone.utc) if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def utc_label(text: str, *, seconds: bool = False) -> str:
    """`2026-11-30 08:00 UTC` (with seconds when asked); the text itself when it is no time."""
    when = moment(text)
    return when.strftime("%Y-%m-%d %H:%M" + (":%S" if seconds else "") + " UTC") if when else text


def al_fresh(variant: VariantResult) -> float:
    fresh = variant.fresh
    return NAN if fresh is None or fresh.acceptance_length is None else fresh.acceptance_length


def al_after_wake(variant: VariantResult) -> float:
    known = [s.acceptance_length for s in variant.stages if s.cycle > 0 and s.acceptance_length is not None]
    return min(known) if known else NAN


def toks_level(variant: VariantResult) -> float:
    stages = {s.name: list(s.tok_s) for s in variant.stages if s.tok_s and min(s.tok_s) > 0}
    return math.exp(level(stages, sorted(stages))) if stages else NAN


EARLIEST = dt.datetime.min.replace(tzinfo=dt.timezone.utc)


def _when(result: ScenarioResult) -> dt.datetime:
    return moment(result.started_at) or EARLIEST


def _start(run: Sequence[ScenarioResult]) -> tuple[dt.datetime, str]:
    first = min(run, key=_when)
    return _when(first), first.started_at


def _nights(runs: Sequence[Sequence[ScenarioResult]]) -> list[tuple[Night, Sequence[ScenarioResult]]]:
    unique: list[Sequence[ScenarioResult]] = []
    for run in runs:
        if run and not any(list(run) == list(seen) for seen in unique):  # OLD also given as --history counts once
            unique.append(run)
    ordered = sorted(unique, key=_start)  # stable: runs that started together keep the order given
    days = [utc_label(_start(run)[1])[:10] for run in ordered]
    nights = []
    for run, day in zip(ordered, days, strict=True):
        started = _start(run)[1]
        label = utc_label(started).removesuffix(" UTC") if days.count(day) > 1 else day
        folders = tuple(dict.fromkeys(str(r.scenario["run"]) for r in run if r.scenario.get("run")))
        nights.append((Night(started, label, folders), run))
    return nights


def build_trend(runs: Sequence[Sequence[ScenarioResult]], renames: Mapping[str, str] | None = None) -> Trend:
    """The trend over `runs` (each one run's results, shards merged), ordered by start; runs that started at the
    same moment keep the order given, and a run given twice counts once. `renames`: old scenario name → the name it
    is shown under (compare's --pair). Series in the newest run's order, then the older runs'."""
    renames = renames or {}
    nights = _nights(runs)
    by_night: list[dict[tuple[str, str], VariantResult]] = []
    for _, run in nights:
        table: dict[tuple[str, str], VariantResult] = {}
        for result in sorted(run, key=_when):
            for variant in result.variants:  # one scenario twice in a run: its latest result
                table[(renames.get(result.name, result.name), variant.name)] = variant
        by_night.append(table)
    keys = list(dict.fromkeys(key for table in reversed(by_night) for key in table))
    series = []
    for scenario, name in keys:
        found = [table.get((scenario, name)) for table in by_night]
        values = {
            q: tuple(None if v is None else f(v) for v in found)
            for q, f in (("al_fresh", al_fresh), ("al_after_wake", al_after_wake), ("tok_s", toks_level))
        }
        series.append(Series(scenario, name, values["al_fresh"], values["al_after_wake"], values["tok_s"]))
    return Trend(tuple(night for night, _ in nights), tuple(series))


# ---------------------------------------------------------------- Markdown


def known(values: Sequence[Value]) -> list[float]:
    return [v for v in values if v is not None and not math.isnan(v)]


def scale(values: Sequence[Value], min_span: float = MIN_SPAN) -> tuple[float, float]:
    """(bottom, span) of a sparkline: the values' lowest to highest, widened about their middle to at least
    `min_span` of the largest magnitude, so that a change smaller than that fills only part of the height."""
    seen = known(values)
    if not seen:
        return 0.0, 0.0
    low, high = min(seen), max(seen)
    span = max(high - low, min_span * max(abs(low), abs(high)))
    return (low + high) / 2 - span / 2, span


def sparkline(values: Sequence[Value], min_span: float = MIN_SPAN) -> str:
    """One character per value: ▁ … █ on the scale of `scale` (FLAT in its middle), ABSENT for None, NOTHING for
    NaN."""
    bottom, span = scale(values, min_span)
    chars = []
    for value in values:
        if value is None:
            chars.append(ABSENT)
        elif math.isnan(value):
            chars.append(NOTHING)
        elif span == 0 or math.isclose(value, bottom + span / 2):
            chars.append(FLAT)
        else:
            chars.append(BARS[max(0, min(int((value - bottom) / span * len(BARS)), len(BARS) - 1))])
    return "".join(chars)


def _last(value: Value, digits: int) -> str:
    if value is None:
        return "not run"
    return "nothing measured" if math.isnan(value) else f"{value:.{digits}f}"


def trend_cell(values: Sequence[Value], digits: int) -> str:
    """`▅▅▅▁` 1.00 (1.00–4.00): the sparkline, tonight's value, and the nights' range where they differ."""
    seen = known(values)
    text = f"`{sparkline(values)}` {_last(values[-1] if values else None, digits)}"
    low, high = (f"{min(seen):.{digits}f}", f"{max(seen):.{digits}f}") if seen else ("", "")
    return text + (f" ({low}–{high})" if low != high else "")


LEGEND = (
    "<sub>One character per {one}, oldest first, {last} last; then {last}'s value and, where the {one}s differ,"
    " their range. Each cell has its own scale: ▁ its lowest value, █ its highest, over at least {span} % of its"
    " largest value (a smaller change moves a character or two, never the full height). {absent} not in that"
    " {one}'s results; {nothing} in them, nothing measured (a crash, or no drafts). AL after wake: the lowest AL of"
    " the stages after a cycle. tok/s: the geometric mean of the stages' median tok/s, the level the tok/s call"
    " compares.</sub>"
)
NIGHTS_APART = dt.timedelta(hours=12)  # runs closer than this are runs, not nights (a rerun, a test of the setup)


def unit(nights: Sequence[Night]) -> tuple[str, str]:
    """What the runs compared are called: ("night", "tonight") when each started at least NIGHTS_APART after the one
    before, else ("run", "the newest") — two runs minutes apart are not two nights."""
    starts = [moment(night.started_at) for night in nights]
    apart = all(a is not None and b is not None and b - a >= NIGHTS_APART for a, b in itertools.pairwise(starts))
    return ("night", "tonight") if apart else ("run", "the newest")


def render_trend_markdown(trend: Trend) -> str:
    """The trend table: one row per scenario × variant, a sparkline cell per quantity, and its legend."""
    nights = trend.nights
    if not nights:
        return ""
    span = f"{nights[0].label} → {nights[-1].label}" if len(nights) > 1 else nights[0].label
    one, last = unit(nights)
    lines = [f"### Trend over {len(nights)} {one}{'s' if len(nights) != 1 else ''} ({span})", ""]
    lines += ["| scenario | variant | " + " | ".join(TITLES[q] for q in QUANTITIES) + " |"]
    lines += ["| --- | --- | " + " | ".join("---" for _ in QUANTITIES) + " |"]
    for s in trend.series:
        cells = [cell(s.scenario), cell(s.variant)]
        cells += [trend_cell(s.values(q), DIGITS[q]) for q in QUANTITIES]
        lines.append("| " + " | ".join(cells) + " |")
    legend = LEGEND.format(one=one, last=last, span=round(MIN_SPAN * 100), absent=ABSENT, nothing=NOTHING)
    lines += ["", legend]
    return "\n".join(lines) + "\n"
