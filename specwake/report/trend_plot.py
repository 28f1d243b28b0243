"""The trend chart of `specwake compare --chart`: per scenario a row of two panels over the nights, acceptance length
(solid: after wake, the lowest cycle; dashed: fresh) and tok/s (the geometric mean of the stage medians), one line
per variant in its own colour (specwake.report.colors). PNG, or SVG for a `.svg` file.

A row per scenario rather than every scenario in one panel: AL sits on a few shared values (K + 1 fresh, 1.00 after
a collapse), where lines of different scenarios would hide one another. Nights are evenly spaced in the order they
ran, labelled with their UTC date; variants are dodged by DODGE so that equal values stay visible side by side. A
night that has the variant but measured nothing (a crash, no drafts) is an × on the panel's floor; a night without
it is a gap. Both y-axes start at 0: the height of a point is its value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specwake.errors import InputError
from specwake.report.colors import variant_colors
from specwake.report.nights import Series, Trend
from specwake.report.plot import write_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MISSING_MATPLOTLIB = "--chart needs matplotlib: pip install 'specwake[plot]'"
WIDTH_IN = 12.0
ROW_HEIGHT_IN = 3.2
HEADER_IN = 1.3  # suptitle and legend
DPI = 110
DODGE = 0.06  # horizontal offset between the variants of a scenario, in nights
AL_TITLE = "acceptance length (solid: after wake, lowest cycle; dashed: fresh)"
TOKS_TITLE = "tok/s (geometric mean of the stage medians)"


def _xs(count: int, index: int, variants: int) -> list[float]:
    shift = (index - (variants - 1) / 2) * DODGE
    return [n + shift for n in range(count)]


def _ys(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]


def _nothing(xs: Sequence[float], values: Sequence[float | None]) -> list[float]:
    """x of the nights that have the variant and measured nothing."""
    return [x for x, v in zip(xs, values, strict=True) if v is not None and math.isnan(v)]


def _draw(ax: Axes, xs: list[float], values: Sequence[float | None], color: str, *, fresh: bool = False) -> None:
    # fresh on top (zorder 3), thin and dashed, so that a variant's fresh AL stays visible on another's solid line
    style = {
        "linestyle": "--",
        "linewidth": 1.2,
        "marker": "o",
        "markersize": 5,
        "markerfacecolor": "white",
        "zorder": 3,
    }
    if not fresh:
        style = {"linestyle": "-", "linewidth": 2.0, "marker": "o", "markersize": 6, "zorder": 2}
    ax.plot(xs, _ys(values), color=color, **style)  # type: ignore[arg-type]
    crashed = _nothing(xs, values)
    if crashed:
        ax.plot(crashed, [0.0] * len(crashed), linestyle="none", marker="x", markersize=9, mew=2, color=color,
                clip_on=False)  # fmt: skip


def _top(rows: Sequence[Series], quantities: Sequence[str]) -> float:
    seen = [v for s in rows for q in quantities for v in s.values(q) if v is not None and not math.isnan(v)]
    return max(seen, default=1.0)


def _night_axis(ax: Axes, trend: Trend) -> None:
    count = len(trend.nights)
    ax.set_xticks(range(count), [n.label for n in trend.nights], rotation=30 if count > 6 else 0, ha="right" if
                  count > 6 else "center", fontsize=8)  # fmt: skip
    ax.set_xlim(-0.5, count - 0.5)
    ax.grid(True, axis="y", alpha=0.3)


def _draw_row(al_ax: Axes, toks_ax: Axes, trend: Trend, rows: Sequence[Series], colors: dict[str, str]) -> None:
    count = len(trend.nights)
    for index, series in enumerate(rows):
        xs = _xs(count, index, len(rows))
        color = colors[series.variant]
        _draw(al_ax, xs, series.al_fresh, color, fresh=True)
        _draw(al_ax, xs, series.al_after_wake, color)
        _draw(toks_ax, xs, series.tok_s, color)
    al_ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    al_ax.set_ylim(0.0, _top(rows, ("al_fresh", "al_after_wake")) * 1.15 + 0.1)
    toks_ax.set_ylim(0.0, _top(rows, ("tok_s",)) * 1.15)
    scenario = rows[0].scenario
    al_ax.set_title(f"{scenario} — {AL_TITLE}", fontsize=9, loc="left")
    toks_ax.set_title(f"{scenario} — {TOKS_TITLE}", fontsize=9, loc="left")
    al_ax.set_ylabel("AL")
    toks_ax.set_ylabel("tok/s")
    for ax in (al_ax, toks_ax):
        _night_axis(ax, trend)


def _legend(fig: Figure, colors: dict[str, str]) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, linewidth=2, marker="o", label=name) for name, c in colors.items()]
    handles += [
        Line2D([], [], color="black", linewidth=2, label="after wake (lowest cycle)"),
        Line2D(
            [], [], color="black", linewidth=1.2, linestyle="--", marker="o", markerfacecolor="white", label="fresh"
        ),  # fmt: skip
        Line2D([], [], color="black", linestyle="none", marker="x", mew=2, label="nothing measured (crash, no drafts)"),
    ]
    top = 1 - 0.55 / fig.get_figheight()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, top), ncol=min(len(handles), 6),
               fontsize=8, frameon=False)  # fmt: skip


def build_trend_figure(trend: Trend) -> Figure:
    """The figure: a row of two panels (AL, tok/s) per scenario, in the trend's order."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InputError(MISSING_MATPLOTLIB) from exc
    scenarios = list(dict.fromkeys(s.scenario for s in trend.series))
    if not scenarios:
        raise InputError("--chart: no scenario results to draw")
    height = HEADER_IN + ROW_HEIGHT_IN * len(scenarios)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    axes = fig.subplots(len(scenarios), 2, squeeze=False)
    colors = variant_colors(s.variant for s in trend.series)
    for (al_ax, toks_ax), scenario in zip(axes, scenarios, strict=True):
        _draw_row(al_ax, toks_ax, trend, [s for s in trend.series if s.scenario == scenario], colors)
    nights = trend.nights
    span = f"{nights[0].label} → {nights[-1].label}" if len(nights) > 1 else nights[0].label
    fig.suptitle(f"specwake trend: {len(nights)} night{'s' if len(nights) != 1 else ''}, {span}", fontsize=12,
                 fontweight="bold", y=1 - 0.15 / height)  # fmt: skip
    _legend(fig, dict(sorted(colors.items())))
    fig.subplots_adjust(left=0.06, right=0.98, top=1 - HEADER_IN / height, bottom=0.9 / height, wspace=0.15,
                        hspace=0.6)  # fmt: skip
    return fig


def render_trend_chart(trend: Trend, out: Path) -> None:
    """Write the trend chart to `out` (PNG, or SVG for .svg); InputError without matplotlib, ResultsUnwritable on
    OSError."""
    write_figure(build_trend_figure(trend), out, MISSING_MATPLOTLIB)
