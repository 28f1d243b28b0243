"""Tests of specwake.report.plot: a real PNG is written (header, size, one panel per scenario) and the drawn data.

Needs matplotlib (the `plot` extra, part of `dev`); the missing-matplotlib error is tested by hiding it.
"""

from __future__ import annotations

import math
import statistics
import struct
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib  # noqa: F401  (the dev extra installs it: a missing plotter fails, never skips)
import pytest

from specwake.errors import InputError, ResultsUnwritable
from specwake.report.plot import DPI, MISSING_MATPLOTLIB, PANEL_HEIGHT_IN, build_figure, render_plot
from tests.helpers.builders import graphed_gpu, tiny_cpu

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which always follows the 8-byte signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_png_written_with_one_panel_height_per_scenario(tmp_path: Path) -> None:
    one, two = tmp_path / "one.png", tmp_path / "sub" / "two.png"
    render_plot([tiny_cpu()], one)
    render_plot([tiny_cpu(), graphed_gpu()], two)
    w1, h1 = _png_size(one)
    w2, h2 = _png_size(two)
    assert w1 == w2 and h1 == round(PANEL_HEIGHT_IN * DPI) and h2 == 2 * h1
    assert 20_000 < one.stat().st_size < 2_000_000


def test_figure_has_a_titled_panel_per_scenario_with_four_axes() -> None:
    fig = build_figure([tiny_cpu(), graphed_gpu()])
    panels = fig.subfigs
    assert len(panels) == 2
    assert [len(p.axes) for p in panels] == [4, 4]  # AL, tok/s, TPOT, host RSS
    titles = [p._suptitle.get_text() for p in panels]
    assert titles == ["tiny-cpu — PASS (L2 discard emulated)", "eagle3-graphed — ERROR"]
    legend = [t.get_text() for t in panels[1].legends[0].get_texts()]
    assert legend == ["baseline: crash (expected crash)", "patched|v2: error (expected recover) — no stage measured"]


def test_al_lines_and_toks_bars_carry_the_stage_numbers() -> None:
    result = tiny_cpu()
    al_ax, toks_ax, _tpot_ax, _rss_ax = build_figure([result]).subfigs[0].axes
    lines = [line for line in al_ax.get_lines() if line.get_label() and not line.get_label().startswith("_")]
    for line, variant in zip(lines, result.variants, strict=True):
        assert list(line.get_xdata()) == [s.cycle for s in variant.stages]
        assert list(line.get_ydata()) == [s.acceptance_length for s in variant.stages]
    bars = toks_ax.containers
    assert len(bars) == len(result.variants)
    for container, variant in zip(bars, result.variants, strict=True):
        medians = list(container.lines[0].get_ydata())
        assert medians == [statistics.median(s.tok_s) for s in variant.stages]
    assert [t.get_text() for t in al_ax.get_xticklabels()] == ["fresh", "after L2 #1", "after L2 #2"]


def test_stage_without_drafts_is_a_gap_not_a_zero() -> None:
    result = tiny_cpu()
    base = result.variants[0]
    nodraft = replace(base.stages[1], acceptance_length=None, num_drafts=0)
    changed = replace(result, variants=[replace(base, stages=[base.stages[0], nodraft, base.stages[2]])])
    line = build_figure([changed]).subfigs[0].axes[0].get_lines()[0]
    assert math.isnan(line.get_ydata()[1])


def test_missing_matplotlib_is_an_input_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import of a None entry raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(InputError, match=r"--plot needs matplotlib: pip install 'specwake\[plot\]'") as info:
        render_plot([tiny_cpu()], tmp_path / "x.png")
    assert str(info.value) == MISSING_MATPLOTLIB
    assert not (tmp_path / "x.png").exists()


def test_no_results_and_unwritable_target(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no scenario results"):
        render_plot([], tmp_path / "x.png")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ResultsUnwritable, match=str(blocker)):
        render_plot([tiny_cpu()], blocker / "plot.png")


def test_tpot_and_rss_panels_draw_what_was_measured() -> None:
    from specwake.report.plot import rss_series, tpot_series
    from specwake.results import StepResult

    variant = tiny_cpu().variants[1]
    reload = StepResult(1, "reload_weights", "POST", "/x", 200, 0.1, True, rss_bytes=3 * 1024 * 1024)
    timed = replace(variant, stages=[replace(s, tpot=[0.002, 0.004]) for s in variant.stages], steps=[reload])
    assert tpot_series(timed) == ([0, 1, 2], [3.0, 3.0, 3.0])
    assert rss_series(timed) == ([1], [3.0])
    fig = build_figure([replace(tiny_cpu(), variants=[timed])])
    assert len(fig.subfigs[0].axes[2].get_lines()) == 1 and len(fig.subfigs[0].axes[3].get_lines()) == 1
