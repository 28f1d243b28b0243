"""A picture of finished runs (`report --plot`): per scenario, acceptance length and tok/s (median with its CI) per
stage and variant, time per output token per stage and host RSS per cycle. PNG, or SVG for a `.svg` file.

A variant's colour follows its name (specwake.report.colors), so it is the same in every panel. Results of several
runs carry their run folder and start time in their panel's title. The memory panel's x-axis is whole cycles, and
its y-axis spans at least RSS_MIN_SPAN of the RSS around its middle: a flat RSS with a few MiB of allocator noise
stays flat, while a growth of a few percent per cycle still climbs visibly.

matplotlib is optional (the `plot` extra) and imported only when a plot is asked for; drawing uses Agg, no GUI.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specwake.errors import InputError, ResultsUnwritable
from specwake.judge.stats import summarize
from specwake.report.colors import variant_colors
from specwake.report.nights import utc_label
from specwake.results import MIB, ScenarioResult, VariantResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

MISSING_MATPLOTLIB = "--plot needs matplotlib: pip install 'specwake[plot]'"
PANEL_WIDTH_IN = 12.0
PANEL_HEIGHT_IN = 7.0
DPI = 110
SPREAD = 0.08  # horizontal offset between variants' tok/s error bars, in stage units
NAN = float("nan")
# The memory panel's y-axis spans at least this fraction of the RSS around its middle (±5 %): a server group's RSS
# after a wake moves by a few MiB from cycle to cycle (allocator noise), which an axis fitted to the data would draw
# as a steep slope; a leak of the size max_rss_growth_mb is there for (hundreds of MiB) still spans much of it.
RSS_MIN_SPAN = 0.10
Colors = Mapping[str, Any]  # variant name → colour


def stage_labels(result: ScenarioResult) -> dict[int, str]:
    """Cycle number → stage name, over every variant, in cycle order (first name seen wins)."""
    labels: dict[int, str] = {}
    for variant in result.variants:
        for stage in variant.stages_by_cycle:
            labels.setdefault(stage.cycle, stage.name)
    return dict(sorted(labels.items()))


def al_series(variant: VariantResult) -> tuple[list[int], list[float]]:
    """(cycles, AL) of a variant; a stage without drafts is NaN (a gap in the line)."""
    stages = variant.stages_by_cycle
    als = [NAN if s.acceptance_length is None else s.acceptance_length for s in stages]
    return [s.cycle for s in stages], als


def toks_series(variant: VariantResult) -> tuple[list[int], list[float], list[float], list[float]]:
    """(cycles, median, distance down to CI low, distance up to CI high) of tok/s; no bar with < 2 samples."""
    cycles, medians, down, up = [], [], [], []
    for stage in variant.stages_by_cycle:
        s = summarize(stage.tok_s)
        if s.median is None:
            continue
        cycles.append(stage.cycle)
        medians.append(s.median)
        has_ci = s.n >= 2 and s.ci_low is not None and s.ci_high is not None
        down.append(s.median - s.ci_low if has_ci and s.ci_low is not None else 0.0)
        up.append(s.ci_high - s.median if has_ci and s.ci_high is not None else 0.0)
    return cycles, medians, down, up


def _label(variant: VariantResult) -> str:
    label = f"{variant.name}: {variant.outcome} (expected {variant.expected})"
    return label + ("" if variant.stages else " — no stage measured")


def run_key(result: ScenarioResult) -> str:
    """What tells runs apart: the run folder the result was loaded from, else its start time."""
    return str(result.scenario.get("run") or result.started_at)


def run_line(result: ScenarioResult) -> str:
    """`run 20261130-080053-tiny-cpu, started 2026-11-30 08:00:53 UTC` (no run folder: only the start)."""
    started = f"started {utc_label(result.started_at, seconds=True)}"
    run = result.scenario.get("run")
    return f"run {run}, {started}" if run else started


def _title(result: ScenarioResult, several_runs: bool) -> str:
    name = result.name
    emulated = any(v.l2_discard == "emulated" for v in result.variants)
    title = f"{name} — {result.verdict.upper()}" + (" (L2 discard emulated)" if emulated else "")
    return title + (f"\n{run_line(result)}" if several_runs else "")


def _set_stage_axis(ax: Axes, labels: dict[int, str]) -> None:
    ticks = list(labels)
    ax.set_xticks(ticks, [labels[t] for t in ticks])
    if ticks:
        ax.set_xlim(min(ticks) - 0.4, max(ticks) + 0.4)
    ax.grid(True, axis="y", alpha=0.3)


def _draw_al(ax: Axes, result: ScenarioResult, colors: Colors) -> None:
    top = 1.0
    for variant in result.variants:
        cycles, als = al_series(variant)  # an unmeasured variant still gets its legend entry
        ax.plot(cycles, als, marker="o", linewidth=2, markersize=7, color=colors[variant.name], label=_label(variant))
        top = max([top, *(a for a in als if not math.isnan(a))])
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.text(0.01, 1.0, " AL 1 = no draft accepted", transform=ax.get_yaxis_transform(), va="bottom", fontsize=8)
    ax.set_ylim(0.0, top * 1.15 + 0.1)
    ax.set_ylabel("acceptance length")
    ax.set_title("Acceptance length per stage", fontsize=10)


def _draw_toks(ax: Axes, result: ScenarioResult, colors: Colors) -> None:
    count = len(result.variants)
    for index, variant in enumerate(result.variants):
        cycles, medians, down, up = toks_series(variant)
        if not cycles:
            continue
        shift = (index - (count - 1) / 2) * SPREAD
        xs = [c + shift for c in cycles]
        ax.errorbar(xs, medians, yerr=[down, up], marker="s", capsize=4, linewidth=1.5, color=colors[variant.name])
    ax.set_ylim(bottom=0.0)
    ax.set_ylabel("tok/s median (bars: CI)")
    ax.set_title("Decode speed per stage", fontsize=10)


def tpot_series(variant: VariantResult) -> tuple[list[int], list[float]]:
    """(cycles, median time per output token in ms) of the stages that measured it."""
    cycles, medians = [], []
    for stage in variant.stages_by_cycle:
        known = [t for t in stage.tpot if t is not None]
        if known:
            cycles.append(stage.cycle)
            medians.append(statistics.median(known) * 1000)
    return cycles, medians


def rss_series(variant: VariantResult) -> tuple[list[int], list[float]]:
    """(cycles, host RSS of the server group after the wake, MiB)."""
    rss = variant.rss_after_wake()
    return list(rss), [v / MIB for v in rss.values()]


Series = Callable[[VariantResult], tuple[list[int], list[float]]]


def _draw_lines(ax: Axes, result: ScenarioResult, colors: Colors, series: Series, ylabel: str, title: str) -> None:
    for variant in result.variants:
        xs, ys = series(variant)
        if xs:
            ax.plot(xs, ys, marker="o", linewidth=1.5, markersize=5, color=colors[variant.name])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)


def rss_limits(values: Sequence[float]) -> tuple[float, float] | None:
    """The memory panel's y-range: the values, widened about their middle to at least RSS_MIN_SPAN of it."""
    if not values:
        return None
    low, high = min(values), max(values)
    half = max(high - low, RSS_MIN_SPAN * (low + high) / 2) / 2 * 1.1  # 10 % headroom for the markers
    middle = (low + high) / 2
    return max(middle - half, 0.0), middle + half


def _set_memory_axes(ax: Axes, result: ScenarioResult, labels: dict[int, str]) -> None:
    """Whole cycles on x (lined up with the stage panels above), and rss_limits on y, in plain MiB."""
    from matplotlib.ticker import ScalarFormatter

    measured = [rss_series(v) for v in result.variants]
    cycles = sorted({c for xs, _ in measured for c in xs})
    ax.set_xticks(cycles, [str(c) for c in cycles])
    stops = [*labels, *cycles]
    if stops:
        ax.set_xlim(min(stops) - 0.4, max(stops) + 0.4)
    limits = rss_limits([y for _, ys in measured for y in ys])
    if limits is not None:
        ax.set_ylim(*limits)
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    ax.yaxis.set_major_formatter(formatter)
    ax.set_xlabel("cycle")
    ax.grid(True, axis="y", alpha=0.3)


def _draw_scenario(fig: SubFigure, result: ScenarioResult, colors: Colors, several_runs: bool) -> None:
    """One panel: AL and tok/s per stage above, time per output token and host RSS per cycle below, one shared
    legend of the variants."""
    (al_ax, toks_ax), (tpot_ax, rss_ax) = fig.subplots(2, 2)
    labels = stage_labels(result)
    _draw_al(al_ax, result, colors)
    _draw_toks(toks_ax, result, colors)
    _draw_lines(tpot_ax, result, colors, tpot_series, "TPOT median (ms)", "Time per output token per stage")
    _draw_lines(rss_ax, result, colors, rss_series, "host RSS after wake (MiB)", "Server memory per cycle")
    for ax in (al_ax, toks_ax, tpot_ax):
        _set_stage_axis(ax, labels)
    _set_memory_axes(rss_ax, result, labels)
    if not labels:
        for ax in (al_ax, toks_ax):
            ax.text(0.5, 0.5, "no stage measured", transform=ax.transAxes, ha="center", va="center")
    fig.suptitle(_title(result, several_runs), fontsize=12, fontweight="bold")
    handles, names = al_ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(len(handles), 3), fontsize=9, frameon=False)
    top = 0.86 if several_runs else 0.9
    fig.subplots_adjust(left=0.07, right=0.98, top=top, bottom=0.14, wspace=0.22, hspace=0.45)


def build_figure(results: Sequence[ScenarioResult]) -> Figure:
    """The figure: one panel (a subfigure with four axes) per scenario, in the given order."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InputError(MISSING_MATPLOTLIB) from exc
    if not results:
        raise InputError("--plot: no scenario results to draw")
    colors = variant_colors(v.name for r in results for v in r.variants)
    several_runs = len({run_key(r) for r in results}) > 1
    fig = Figure(figsize=(PANEL_WIDTH_IN, PANEL_HEIGHT_IN * len(results)), dpi=DPI)
    panels = fig.subfigures(len(results), 1, squeeze=False, edgecolor="0.8", linewidth=1)[:, 0]
    for panel, result in zip(panels, results, strict=True):
        _draw_scenario(panel, result, colors, several_runs)
    return fig


def write_figure(fig: Figure, out: Path, missing: str) -> None:
    """Write `fig` to `out`: SVG (text as paths: self-contained) when it ends in .svg, else PNG; parents created.
    InputError(`missing`) without matplotlib, ResultsUnwritable on OSError."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise InputError(missing) from exc
    FigureCanvasAgg(fig)
    svg = out.suffix.lower() == ".svg"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="svg" if svg else "png", metadata={"Date": None} if svg else None)
    except OSError as exc:
        raise ResultsUnwritable(f"{out}: cannot write plot: {exc}") from exc


def render_plot(results: Sequence[ScenarioResult], out: Path) -> None:
    """Write the picture to `out` (write_figure); InputError without matplotlib, ResultsUnwritable on OSError."""
    write_figure(build_figure(results), out, MISSING_MATPLOTLIB)
