"""The trend over nights of `specwake compare`: its numbers per night (specwake.report.nights), the sparklines of its
Markdown table, and the chart (specwake.report.trend_plot), read from matplotlib's figure objects: the lines' data,
axes, ticks, titles and colours.

Needs matplotlib (the `plot` extra, part of `dev`): a missing plotter fails, never skips.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib  # noqa: F401
import pytest
from matplotlib.colors import to_hex

from specwake.errors import InputError
from specwake.report.colors import KNOWN
from specwake.report.nights import (
    ABSENT,
    FLAT,
    MIN_SPAN,
    NOTHING,
    build_trend,
    render_trend_markdown,
    sparkline,
    trend_cell,
)
from specwake.report.trend_plot import DODGE, MISSING_MATPLOTLIB, build_trend_figure, render_trend_chart
from specwake.results import ScenarioResult, VariantResult
from tests.helpers.builders import scenario, stage, variant


def _variant(
    name: str, after: float = 4.0, toks: tuple[float, float] = (10.0, 40.0), crash: bool = False
) -> VariantResult:
    """K = 3: AL 4.00 fresh; `after` after cycle 1 and 4.00 after cycle 2; tok/s medians `toks` (fresh, cycles)."""
    fresh = stage(0, drafts=100, accepted=300, tok_s=[toks[0]] * 3)
    stages = [fresh]
    if not crash:
        stages += [
            stage(1, drafts=100, accepted=round((after - 1) * 100), tok_s=[toks[1]] * 3),
            stage(2, drafts=100, accepted=300, tok_s=[toks[1]] * 3),
        ]
    return variant(name, "crash" if crash else "recover", "recover", stages)


def _night(day: int, variants: list[VariantResult], name: str = "tiny-cpu", hour: int = 2) -> ScenarioResult:
    started = f"2026-11-{day:02d}T{hour:02d}:17:00+00:00"
    run = f"202611{day:02d}-{hour:02d}1700-{name}"
    result = scenario(name, "pass", variants, started_at=started)
    return replace(result, scenario={**result.scenario, "run": run})


def _nights() -> list[list[ScenarioResult]]:
    """Four nights, given out of order and one twice: patched drops to AL 2.5 on the last night, crashes on the
    third; cpu-eagle3 is missing on the second."""
    first = [
        _night(24, [_variant("baseline", 1.0), _variant("patched")]),
        _night(24, [_variant("patched")], "cpu-eagle3"),
    ]
    second = [_night(25, [_variant("baseline", 1.0), _variant("patched", toks=(10.0, 30.0))])]
    third = [_night(26, [_variant("baseline", 1.0), _variant("patched", crash=True)]),
             _night(26, [_variant("patched")], "cpu-eagle3")]  # fmt: skip
    fourth = [
        _night(27, [_variant("baseline", 1.0), _variant("patched", 2.5)]),
        _night(27, [_variant("patched")], "cpu-eagle3"),
    ]
    return [third, first, fourth, second, first]


def test_one_number_per_night_for_each_quantity() -> None:
    trend = build_trend(_nights())
    assert [n.label for n in trend.nights] == ["2026-11-24", "2026-11-25", "2026-11-26", "2026-11-27"]
    assert trend.nights[0].runs == ("20261124-021700-tiny-cpu", "20261124-021700-cpu-eagle3")
    assert [(s.scenario, s.variant) for s in trend.series] == [
        ("tiny-cpu", "baseline"),
        ("tiny-cpu", "patched"),
        ("cpu-eagle3", "patched"),
    ]
    base, patched, eagle = trend.series
    assert base.al_fresh == (4.0, 4.0, 4.0, 4.0) and base.al_after_wake == (1.0, 1.0, 1.0, 1.0)
    assert patched.al_after_wake[:2] == (4.0, 4.0) and patched.al_after_wake[3] == 2.5  # the lowest cycle
    assert math.isnan(patched.al_after_wake[2]) and patched.al_fresh[2] == 4.0  # crashed after its fresh stage
    # tok/s: the geometric mean of the stage medians (fresh 10, two cycles 40 → (10·40·40)^(1/3))
    assert patched.tok_s[0] == pytest.approx((10 * 40 * 40) ** (1 / 3))
    assert patched.tok_s[1] == pytest.approx((10 * 30 * 30) ** (1 / 3))
    assert patched.tok_s[2] == pytest.approx(10.0)  # only the fresh stage was measured
    assert eagle.al_fresh == (4.0, None, 4.0, 4.0)  # not in the second night's results


def test_nights_on_one_date_show_their_time_and_renamed_scenarios_join() -> None:
    a = [_night(24, [_variant("patched")], "old-name", hour=2)]
    b = [_night(24, [_variant("patched")], "new-name", hour=14)]
    trend = build_trend([b, a], renames={"old-name": "new-name"})
    assert [n.label for n in trend.nights] == ["2026-11-24 02:17", "2026-11-24 14:17"]
    assert [(s.scenario, s.al_fresh) for s in trend.series] == [("new-name", (4.0, 4.0))]


def test_runs_that_started_together_keep_their_order_and_a_repeated_run_counts_once() -> None:
    old = [_night(24, [_variant("patched")])]
    new = [_night(24, [_variant("patched", 1.0)])]  # the same start (a copy edited by hand, a test's builder)
    trend = build_trend([old, new, [*old]])
    assert len(trend.nights) == 2 and trend.series[0].al_after_wake == (4.0, 1.0)


def test_sparkline_scale_single_point_gaps_and_crashes() -> None:
    assert sparkline([1.0, 4.0]) == "▁█"
    assert sparkline([4.0, 4.0, 4.0]) == FLAT * 3 and sparkline([7.5]) == FLAT
    assert sparkline([4.0, None, 1.0, math.nan]) == f"█{ABSENT}▁{NOTHING}"
    assert sparkline([None, math.nan]) == ABSENT + NOTHING
    # a change under MIN_SPAN of the value moves a character or so, never the full height
    assert MIN_SPAN == 0.20 and sparkline([100.0, 101.0]) == "▄▅"
    assert sparkline([100.0, 80.0, 100.0]) == "█▁█"  # 20 %: the whole height
    assert trend_cell([4.0, 4.0, 1.0], 2) == "`██▁` 1.00 (1.00–4.00)"
    assert trend_cell([4.0, 4.0], 2) == f"`{FLAT * 2}` 4.00"
    assert trend_cell([4.0, None], 2) == f"`{FLAT}{ABSENT}` not run"
    assert trend_cell([4.0, math.nan], 2) == f"`{FLAT}{NOTHING}` nothing measured"


def test_markdown_table_has_a_sparkline_row_per_scenario_and_variant() -> None:
    text = render_trend_markdown(build_trend(_nights()))
    lines = text.splitlines()
    assert lines[0] == "### Trend over 4 nights (2026-11-24 → 2026-11-27)"
    assert lines[2] == "| scenario | variant | AL fresh | AL after wake | tok/s |"
    assert lines[4] == f"| tiny-cpu | baseline | `{FLAT * 4}` 4.00 | `{FLAT * 4}` 1.00 | `{FLAT * 4}` 25.2 |"
    assert lines[5].startswith(f"| tiny-cpu | patched | `{FLAT * 4}` 4.00 | `██{NOTHING}▁` 2.50 (2.50–4.00) | ")
    assert lines[6].startswith(f"| cpu-eagle3 | patched | `{FLAT}{ABSENT}{FLAT}{FLAT}` 4.00 |")
    legend = lines[-1]
    assert legend.startswith("<sub>One character per night, oldest first, tonight last")
    assert "at least 20 % of its largest value" in legend and f"{ABSENT} not in that night's results" in legend


def _series_lines(ax: Any) -> list[Any]:
    """The variants' lines of a panel: not the crash markers (no line) nor the dotted AL = 1 reference."""
    return [line for line in ax.get_lines() if line.get_linestyle() not in ("None", ":")]


def test_chart_draws_a_row_per_scenario_with_a_line_per_variant() -> None:
    trend = build_trend(_nights())
    fig = build_trend_figure(trend)
    axes = fig.axes
    assert len(axes) == 4  # (AL, tok/s) × (tiny-cpu, cpu-eagle3)
    assert fig._suptitle.get_text() == "specwake trend: 4 nights, 2026-11-24 → 2026-11-27"
    al_ax, toks_ax = axes[0], axes[1]
    assert al_ax.get_title(loc="left").startswith("tiny-cpu — acceptance length (solid: after wake")
    assert toks_ax.get_title(loc="left") == "tiny-cpu — tok/s (geometric mean of the stage medians)"
    assert axes[2].get_title(loc="left").startswith("cpu-eagle3 — acceptance length")
    for ax in axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == [n.label for n in trend.nights]
        assert list(ax.get_xticks()) == [0, 1, 2, 3] and ax.get_ylim()[0] == 0.0
    # AL: per variant a dashed fresh line and a solid after-wake line, dodged apart, in the variant's colour
    lines = _series_lines(al_ax)
    assert [(ln.get_linestyle(), to_hex(ln.get_color())) for ln in lines] == [
        ("--", KNOWN["baseline"]),
        ("-", KNOWN["baseline"]),
        ("--", KNOWN["patched"]),
        ("-", KNOWN["patched"]),
    ]
    assert list(lines[0].get_xdata()) == pytest.approx([n - DODGE / 2 for n in range(4)])
    assert list(lines[3].get_xdata()) == pytest.approx([n + DODGE / 2 for n in range(4)])
    after = list(lines[3].get_ydata())
    assert after[:2] == [4.0, 4.0] and math.isnan(after[2]) and after[3] == 2.5
    # the crash: an × on the floor at that night, in patched's colour
    crosses = [ln for ln in al_ax.get_lines() if ln.get_marker() == "x"]
    assert [(list(c.get_xdata()), list(c.get_ydata()), to_hex(c.get_color())) for c in crosses] == [
        ([pytest.approx(2 + DODGE / 2)], [0.0], KNOWN["patched"])
    ]
    toks = _series_lines(toks_ax)
    assert [to_hex(ln.get_color()) for ln in toks] == [KNOWN["baseline"], KNOWN["patched"]]
    assert list(toks[1].get_ydata()) == pytest.approx([s for s in trend.series[1].tok_s])
    # the missing night is a gap in cpu-eagle3's line
    eagle_fresh = _series_lines(axes[2])[0]
    assert math.isnan(eagle_fresh.get_ydata()[1]) and to_hex(eagle_fresh.get_color()) == KNOWN["patched"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["baseline", "patched"] and "fresh" in legend


def test_chart_files_png_and_self_contained_svg(tmp_path: Path) -> None:
    trend = build_trend(_nights())
    png, svg = tmp_path / "trend.png", tmp_path / "sub" / "trend.svg"
    render_trend_chart(trend, png)
    render_trend_chart(trend, svg)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    text = svg.read_text()
    assert text.startswith("<?xml") and "<svg" in text
    assert "<image" not in text and 'href="http' not in text and "@font-face" not in text  # text drawn as paths
    assert "<text" not in text  # every label is drawn as glyph paths defined in the file itself


def test_chart_without_matplotlib_or_results_is_an_input_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from specwake.report.nights import Trend

    with pytest.raises(InputError, match="--chart: no scenario results"):
        render_trend_chart(Trend((), ()), tmp_path / "x.png")
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(InputError) as info:
        render_trend_chart(build_trend(_nights()), tmp_path / "x.png")
    assert str(info.value) == MISSING_MATPLOTLIB and not (tmp_path / "x.png").exists()


def test_runs_minutes_apart_are_runs_not_nights() -> None:
    early = [_night(24, [_variant("patched")])]
    soon = [replace(early[0], started_at="2026-11-24T02:29:00+00:00")]  # twelve minutes later
    text = render_trend_markdown(build_trend([early, soon]))
    assert text.startswith("### Trend over 2 runs (2026-11-24 02:17 → 2026-11-24 02:29)")
    assert "One character per run, oldest first, the newest last" in text and "night" not in text
    assert render_trend_markdown(build_trend(_nights())).startswith("### Trend over 4 nights")
