"""`specwake report` and `compare`: earlier runs read back, as one report or as a trend with its regressions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specwake.cli.common import fail
from specwake.console import Ui
from specwake.errors import EXIT_INPUT, InputError, SpecwakeError
from specwake.judge.compare import MAX_AL_DROP, MAX_TOKS_DROP, compare_runs, parse_pair, same_run
from specwake.judge.compare import exit_code as comparison_exit_code
from specwake.report.compare import render_comparison_markdown
from specwake.report.nights import build_trend, render_trend_markdown
from specwake.run.session.shards import merge_shards
from specwake.runfolder import load_many

# The plots import matplotlib, inside the commands that draw one.


def report(
    results: Annotated[
        list[Path], typer.Argument(help="result.json files, run folders or results folders.", show_default=False)
    ],
    fmt: Annotated[str, typer.Option("--format", help="md | json | csv")] = "md",
    every_run: Annotated[
        bool, typer.Option("--all", help="A results folder means every run in it, not only its latest run.")
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(help="Also draw AL, tok/s, TPOT per stage and RSS per cycle into this PNG (SVG: a .svg name)."),
    ] = None,
) -> None:
    """Print earlier runs as one report (Markdown for a PR comment, or JSON / CSV).

    A results folder stands for its latest run (named on stderr) unless --all is given. The Markdown fits one GitHub
    comment (65,536 characters): a longer one leaves out evidence first and says so; each run folder's report.md
    has it all."""
    from specwake.report import render_csv, render_json, render_markdown
    from specwake.report.fit import COMMENT_LIMIT
    from specwake.report.plot import render_plot

    ui = Ui()
    renderers = {"md": lambda r: render_markdown(r, COMMENT_LIMIT), "json": render_json, "csv": render_csv}
    if fmt not in renderers:
        ui.error(f"--format: must be one of md, json, csv (got {fmt!r})")
        raise typer.Exit(EXIT_INPUT)
    try:
        loaded = merge_shards(load_many(results, every_run=every_run, note=ui.note))
        if plot is not None:
            render_plot(loaded, plot)
    except SpecwakeError as exc:
        fail(ui, exc)
    ui.report(renderers[fmt](loaded))
    if plot is not None:
        ui.note(f"plot: {plot}")


def compare(
    old: Annotated[
        Path,
        typer.Argument(
            help="Earlier result (file, run folder, or results folder: its latest run).", show_default=False
        ),
    ],
    new: Annotated[
        Path,
        typer.Argument(help="Later result (file, run folder, or results folder: its latest run).", show_default=False),
    ],
    max_al_drop: Annotated[float, typer.Option(min=0, max=1, help="Flag AL drops beyond this fraction.")] = MAX_AL_DROP,
    max_toks_drop: Annotated[
        float,
        typer.Option(
            min=0, max=1, help="Flag a variant's tok/s below 1 − this beyond the spread between runs (see --history)."
        ),
    ] = MAX_TOKS_DROP,
    history: Annotated[
        list[Path] | None,
        typer.Option(
            help="A further earlier run (result, run folder, or a folder of one night's shards with --all), besides "
            "OLD; repeatable. tok/s is called against ≥ 3 earlier runs, whose spread it measures; fewer: inconclusive."
        ),
    ] = None,
    count_emulated_speed: Annotated[
        bool,
        typer.Option(
            "--count-emulated-speed",
            help="Count tok/s regressions of runs whose L2 discard was emulated (CPU); by default they are advisory.",
        ),
    ] = False,
    every_run: Annotated[
        bool, typer.Option("--all", help="A results folder means every run in it (e.g. all shards of one night).")
    ] = False,
    pair: Annotated[
        list[str] | None,
        typer.Option(help="OLD:NEW — compare scenario OLD of the old run with NEW of the new run (names differ)."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            help="Count regressions across a changed model, drafter, K, max_tokens or prompts (otherwise listed, "
            "not counted). Runs of different scenario files are always compared; what differs is listed."
        ),
    ] = False,
    chart: Annotated[
        Path | None,
        typer.Option(
            help="Also draw AL and tok/s per scenario × variant over every run compared (--history, OLD, NEW) into "
            "this PNG (SVG: a .svg name)."
        ),
    ] = None,
) -> None:
    """Nightly trend: AL and tok/s per scenario × variant × stage, OLD vs NEW; exit 1 on a regression."""
    from specwake.report.trend_plot import render_trend_chart

    ui = Ui()
    try:
        pairs = [parse_pair(p) for p in pair or ()]
        olds = merge_shards(load_many([old], every_run=every_run, note=ui.note))
        news = merge_shards(load_many([new], every_run=every_run, note=ui.note))
        if same_run(olds, news):
            raise InputError(f"OLD and NEW are the same run ({old}, {new}): compare two runs")
        earlier = [merge_shards(load_many([h], every_run=every_run, note=ui.note)) for h in history or ()]
        comparisons, unmatched = compare_runs(
            olds, news, history=earlier, pairs=pairs, max_al_drop=max_al_drop, max_toks_drop=max_toks_drop,
            force=force, count_emulated_speed=count_emulated_speed,
        )  # fmt: skip
        trend = build_trend([*earlier, olds, news], renames=dict(pairs))
        if chart is not None:
            render_trend_chart(trend, chart)
    except SpecwakeError as exc:
        fail(ui, exc)
    ui.note(f"old: {old}\nnew: {new}")
    ui.report("\n".join([*(render_comparison_markdown(c) for c in comparisons), render_trend_markdown(trend)]))
    if unmatched:
        ui.note(f"only on one side: {', '.join(unmatched)}")
    if chart is not None:
        ui.note(f"chart: {chart}")
    raise typer.Exit(comparison_exit_code(comparisons))
