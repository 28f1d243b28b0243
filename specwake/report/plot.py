"""A PNG of finished runs: per scenario, acceptance length and tok/s (median with its CI) per stage and variant.

matplotlib is optional (the `plot` extra) and imported only when a plot is asked for; drawing uses Agg, no GUI.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specwake.errors import InputError, ResultsUnwritable
from specwake.judge.stats import summarize
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


def _title(result: ScenarioResult) -> str:
    name = result.name
    emulated = any(v.l2_discard == "emulated" for v in result.variants)
    return f"{name} — {result.verdict.upper()}" + (" (L2 discard emulated)" if emulated else "")


def _set_stage_axis(ax: Axes, labels: dict[int, str]) -> None:
    ticks = list(labels)
    ax.set_xticks(ticks, [labels[t] for t in ticks])
    if ticks:
        ax.set_xlim(min(ticks) - 0.4, max(ticks) + 0.4)
    ax.grid(True, axis="y", alpha=0.3)


def _draw_al(ax: Axes, result: ScenarioResult, colors: Sequence[Any]) -> None:
    top = 1.0
    for variant, color in zip(result.variants, colors, strict=False):
        cycles, als = al_series(variant)  # an unmeasured variant still gets its legend entry
        ax.plot(cycles, als, marker="o", linewidth=2, markersize=7, color=color, label=_label(variant))
        top = max([top, *(a for a in als if not math.isnan(a))])
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.text(0.01, 1.0, " AL 1 = no draft accepted", transform=ax.get_yaxis_transform(), va="bottom", fontsize=8)
    ax.set_ylim(0.0, top * 1.15 + 0.1)
    ax.set_ylabel("acceptance length")
    ax.set_title("Acceptance length per stage", fontsize=10)


def _draw_toks(ax: Axes, result: ScenarioResult, colors: Sequence[Any]) -> None:
    count = len(result.variants)
    for index, (variant, color) in enumerate(zip(result.variants, colors, strict=False)):
        cycles, medians, down, up = toks_series(variant)
        if not cycles:
            continue
        shift = (index - (count - 1) / 2) * SPREAD
        xs = [c + shift for c in cycles]
        ax.errorbar(xs, medians, yerr=[down, up], marker="s", capsize=4, linewidth=1.5, color=color)
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


def _draw_lines(ax: Axes, result: ScenarioResult, colors: Sequence[Any], series: Any, ylabel: str, title: str) -> None:
    for variant, color in zip(result.variants, colors, strict=False):
        xs, ys = series(variant)
        if xs:
            ax.plot(xs, ys, marker="o", linewidth=1.5, markersize=5, color=color)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)


def _draw_scenario(fig: SubFigure, result: ScenarioResult) -> None:
    """One panel: AL and tok/s per stage above, time per output token and host RSS per cycle below, one shared
    legend of the variants."""
    from matplotlib import colormaps

    colors = [colormaps["tab10"](i % 10) for i in range(len(result.variants))]
    (al_ax, toks_ax), (tpot_ax, rss_ax) = fig.subplots(2, 2)
    labels = stage_labels(result)
    _draw_al(al_ax, result, colors)
    _draw_toks(toks_ax, result, colors)
    _draw_lines(tpot_ax, result, colors, tpot_series, "TPOT median (ms)", "Time per output token per stage")
    _draw_lines(rss_ax, result, colors, rss_series, "host RSS after wake (MiB)", "Server memory per cycle")
    for ax in (al_ax, toks_ax, tpot_ax):
        _set_stage_axis(ax, labels)
    rss_ax.set_xlabel("cycle")
    rss_ax.grid(True, axis="y", alpha=0.3)
    if not labels:
        for ax in (al_ax, toks_ax):
            ax.text(0.5, 0.5, "no stage measured", transform=ax.transAxes, ha="center", va="center")
    fig.suptitle(_title(result), fontsize=12, fontweight="bold")
    handles, names = al_ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(len(handles), 3), fontsize=9, frameon=False)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.9, bottom=0.14, wspace=0.22, hspace=0.45)


def build_figure(results: Sequence[ScenarioResult]) -> Figure:
    """The figure: one panel (a subfigure with two axes) per scenario, in the given order."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InputError(MISSING_MATPLOTLIB) from exc
    if not results:
        raise InputError("--plot: no scenario results to draw")
    fig = Figure(figsize=(PANEL_WIDTH_IN, PANEL_HEIGHT_IN * len(results)), dpi=DPI)
    panels = fig.subfigures(len(results), 1, squeeze=False, edgecolor="0.8", linewidth=1)[:, 0]
    for panel, result in zip(panels, results, strict=True):
        _draw_scenario(panel, result)
    return fig


def render_plot(results: Sequence[ScenarioResult], out: Path) -> None:
    """Write the PNG to `out` (parents created); InputError without matplotlib, ResultsUnwritable on OSError."""
    fig = build_figure(results)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise InputError(MISSING_MATPLOTLIB) from exc
    FigureCanvasAgg(fig)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png")
    except OSError as exc:
        raise ResultsUnwritable(f"{out}: cannot write plot: {exc}") from exc
