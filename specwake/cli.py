"""The `specwake` command line: parse flags, call one core function, render, return an exit code.

No logic lives here; session.py does what `run` does, errors.py maps exceptions to exit codes.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from specwake import __version__
from specwake.console import Ui
from specwake.errors import (
    EXIT_INFRA,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    InputError,
    Interrupted,
    ScenarioErrors,
    SpecwakeError,
)
from specwake.files import what_it_is
from specwake.judge.compare import MAX_AL_DROP, MAX_TOKS_DROP, compare_runs, parse_pair
from specwake.judge.compare import exit_code as comparison_exit_code
from specwake.prepare.models import BUILTIN_MODELS, cache_dir, ensure_builtin_model, lookup, model_dir
from specwake.report.compare import render_comparison_markdown
from specwake.report.nights import build_trend, render_trend_markdown
from specwake.run.leftovers import GRACE_S, describe, find_leftovers, registry_dir, stop_leftover
from specwake.run.schedule import parse_gpu_list
from specwake.run.shards import choose_shard, merge_shards
from specwake.runfolder import load_many

# A command imports what only it needs (the run machinery: openai, pydantic; plots: matplotlib) inside its body, so
# that `--help`, `version`, `report`, `leftovers` and the rest start in a fraction of `run`'s import time.

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Regression tester for vLLM speculative decoding across Level 2 sleep/wake/reload cycles.",
)
models_app = typer.Typer(no_args_is_help=True, help="Builtin models (generated offline, cached).")
app.add_typer(models_app, name="models")


def _fail(ui: Ui, exc: SpecwakeError) -> NoReturn:
    for each in exc.errors if isinstance(exc, ScenarioErrors) else [exc]:  # one line per scenario file
        ui.error(str(each))
    raise typer.Exit(exc.exit_code)


def _gpus(text: str | None) -> tuple[int, ...] | None:
    """--gpus as visible GPU indices (`0-7`, `0,1,4,5`); InputError (exit 2) naming the flag otherwise."""
    if text is None:
        return None
    try:
        return parse_gpu_list(text)
    except ValueError as exc:
        raise InputError(f"--gpus: {exc}") from None


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command()
def run(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario TOML files.", show_default=False)],
    cycles: Annotated[
        int | None, typer.Option(min=1, help="Sleep/wake cycles per variant (overrides cycle.count).")
    ] = None,
    tp: Annotated[
        int | None, typer.Option(min=1, help="Tensor parallel size (overrides server.tensor_parallel_size).")
    ] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", help="Run only this variant (repeatable).")] = None,
    patch: Annotated[Path | None, typer.Option(help="Diff for the `patched` variant (overrides its patch).")] = None,
    output: Annotated[Path, typer.Option(help="Results folder; each run gets a new sub-folder.")] = Path("results"),
    gpus: Annotated[
        str | None, typer.Option(help="GPUs to pack servers onto, e.g. 0-7 or 0,1,4,5 (default: all visible).")
    ] = None,
    interleave: Annotated[
        bool, typer.Option(help="CPU: both variants' servers up at once, stages alternated A/B.")
    ] = False,
    sequential: Annotated[
        bool,
        typer.Option(
            help="CPU: one server at a time (default: side by side, each on its own core, measuring one at a time)."
        ),
    ] = False,
    junit: Annotated[
        Path | None, typer.Option(help="Also write JUnit XML here (one test case per scenario × variant).")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option(help="Finish an interrupted run folder: re-run only incomplete variants.")
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="K/N: run only this machine's share of the scenario × variant jobs (a CI fleet of N runners); "
            "`specwake report` over every shard's folder merges them. Default on Buildkite: from "
            "BUILDKITE_PARALLEL_JOB / BUILDKITE_PARALLEL_JOB_COUNT (a step with `parallelism: N`)."
        ),
    ] = None,
    no_shard: Annotated[
        bool,
        typer.Option(
            "--no-shard",
            help="Run every job here, whatever BUILDKITE_PARALLEL_JOB says (a canary inside a `parallelism` step).",
        ),
    ] = False,
    stop_leftovers: Annotated[
        bool,
        typer.Option(
            "--stop-leftovers",
            help="First stop the servers that specwake runs which died left running (see `specwake leftovers`); "
            "by default they are only named.",
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
) -> None:
    """Run scenarios: baseline and patched servers, L2 cycles, AL and tok/s before and after, verdict."""
    from specwake.prepare.scenario import Overrides
    from specwake.run.session import RunInterrupted, RunRequest, execute

    ui = Ui(quiet)
    if patch is not None and what_it_is(patch) is not None:
        ui.error(f"--patch: file {what_it_is(patch)}: {patch}")
        raise typer.Exit(EXIT_INPUT)
    if interleave and sequential:
        ui.error("--interleave, --sequential: choose one run mode")
        raise typer.Exit(EXIT_INPUT)
    try:
        request = RunRequest(
            scenarios=scenarios,
            overrides=Overrides(cycles=cycles, tp=tp, variants=tuple(variant or ()), patch=patch),
            output=output,
            cache=cache_dir(),
            interleave=interleave,
            sequential=sequential,
            gpus=_gpus(gpus),
            junit=junit,
            resume=resume,
            shard=choose_shard(shard, no_shard, os.environ),
            stop_leftovers=stop_leftovers,
        )
    except SpecwakeError as exc:
        _fail(ui, exc)
    if shard is None and request.shard is not None:
        ui.note(f"shard {request.shard}, from Buildkite's BUILDKITE_PARALLEL_JOB / BUILDKITE_PARALLEL_JOB_COUNT")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with ui:
            outcome = execute(request, ui.event)
    except RunInterrupted as exc:  # the report of what was measured, then exit 130
        if exc.outcome.results:
            ui.report(exc.outcome.markdown, plain=True)
            ui.note(f"results: {exc.outcome.run_root}")
        ui.error(str(exc))
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except SpecwakeError as exc:
        _fail(ui, exc)
    except KeyboardInterrupt:
        ui.error("interrupted: servers stopped, results measured so far are saved")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if outcome.note:
        ui.note(outcome.note)
    if outcome.results:
        ui.report(outcome.markdown, plain=True)
        ui.note(f"results: {outcome.run_root}")
    raise typer.Exit(outcome.exit_code)


@app.command()
def check(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario TOML files.", show_default=False)],
    cycles: Annotated[
        int | None, typer.Option(min=1, help="Sleep/wake cycles per variant (overrides cycle.count).")
    ] = None,
    tp: Annotated[int | None, typer.Option(min=1, help="Tensor parallel size (overrides the files).")] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", help="Check only this variant.")] = None,
    patch: Annotated[Path | None, typer.Option(help="Diff for the `patched` variant.")] = None,
    gpus: Annotated[
        str | None, typer.Option(help="GPUs to plan the packing onto, e.g. 0-7 (default: all visible).")
    ] = None,
    no_gpu_check: Annotated[
        bool, typer.Option("--no-gpu-check", help="Report missing GPUs / sleep mode instead of failing (exit 0).")
    ] = False,
    online: Annotated[
        bool,
        typer.Option(
            "--online", help="Also ask the Hugging Face Hub about models not in the local cache (exit 2: one it lacks)."
        ),
    ] = False,
    interleave: Annotated[bool, typer.Option(help="Plan as `run --interleave` would run (CPU).")] = False,
    sequential: Annotated[bool, typer.Option(help="Plan as `run --sequential` would run (CPU).")] = False,
    tensors: Annotated[
        bool,
        typer.Option(
            "--tensors", help="Also list every checkpoint tensor name push_scale and push_skip may use, per model."
        ),
    ] = False,
) -> None:
    """Validate scenarios with each variant's own vLLM and show exactly what `run` would start and measure (argv,
    env, GPUs or CPU cores, the run mode, where models load from); launches no server."""
    from specwake.prepare.scenario import Overrides
    from specwake.run.check import check_all

    ui = Ui()
    if patch is not None and what_it_is(patch) is not None:
        ui.error(f"--patch: file {what_it_is(patch)}: {patch}")
        raise typer.Exit(EXIT_INPUT)
    if interleave and sequential:  # as run refuses it
        ui.error("--interleave, --sequential: choose one run mode")
        raise typer.Exit(EXIT_INPUT)
    overrides = Overrides(cycles=cycles, tp=tp, variants=tuple(variant or ()), patch=patch)
    try:
        outcome = check_all(
            scenarios, overrides, cache_dir(), ui.event, gpus=_gpus(gpus), online=online, sequential=sequential,
            interleave=interleave, tensors=tensors,
        )  # fmt: skip
    except SpecwakeError as exc:
        _fail(ui, exc)
    ui.report(outcome.text)
    problems = outcome.problems
    if problems and not no_gpu_check:
        ui.error(f"{len(problems)} variant(s) cannot run on this machine (see NOT RUNNABLE HERE above)")
        raise typer.Exit(EXIT_INFRA)
    ui.note(
        f"ok: {len(scenarios)} scenario(s) checked"
        + (f", {len(problems)} not runnable here (reported)" if problems else "")
    )


@app.command()
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

    A results folder stands for its latest run (named on stderr) unless --all is given."""
    from specwake.report import render_csv, render_json, render_markdown
    from specwake.report.plot import render_plot

    ui = Ui()
    renderers = {"md": render_markdown, "json": render_json, "csv": render_csv}
    if fmt not in renderers:
        ui.error(f"--format: must be one of md, json, csv (got {fmt!r})")
        raise typer.Exit(EXIT_INPUT)
    try:
        loaded = merge_shards(load_many(results, every_run=every_run, note=ui.note))
        if plot is not None:
            render_plot(loaded, plot)
    except SpecwakeError as exc:
        _fail(ui, exc)
    ui.report(renderers[fmt](loaded))
    if plot is not None:
        ui.note(f"plot: {plot}")


@app.command()
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
        earlier = [merge_shards(load_many([h], every_run=every_run, note=ui.note)) for h in history or ()]
        comparisons, unmatched = compare_runs(
            olds, news, history=earlier, pairs=pairs, max_al_drop=max_al_drop, max_toks_drop=max_toks_drop,
            force=force, count_emulated_speed=count_emulated_speed,
        )  # fmt: skip
        trend = build_trend([*earlier, olds, news], renames=dict(pairs))
        if chart is not None:
            render_trend_chart(trend, chart)
    except SpecwakeError as exc:
        _fail(ui, exc)
    ui.note(f"old: {old}\nnew: {new}")
    ui.report("\n".join([*(render_comparison_markdown(c) for c in comparisons), render_trend_markdown(trend)]))
    if unmatched:
        ui.note(f"only on one side: {', '.join(unmatched)}")
    if chart is not None:
        ui.note(f"chart: {chart}")
    raise typer.Exit(comparison_exit_code(comparisons))


@app.command()
def bisect(
    scenario: Annotated[Path, typer.Argument(help="Scenario TOML file.", show_default=False)],
    vllm_repo: Annotated[Path, typer.Option(help="A git checkout of vLLM.", show_default=False)],
    good: Annotated[
        str,
        typer.Option(
            help="A commit whose outcome is the good one (measured first); not an ancestor of --bad (a release tag):"
            " their merge base."
        ),
    ],
    bad: Annotated[str, typer.Option(help="A later commit whose outcome differs.")],
    base: Annotated[
        str | None,
        typer.Option(
            help="The commit the installed vLLM was built from (default: the commit a dev build's version names,"
            " +g<sha>, else the tag of its version)."
        ),
    ] = None,
    variant: Annotated[
        str | None, typer.Option(help="The variant to run (default: baseline); it must have no patch of its own.")
    ] = None,
    expect: Annotated[
        str | None, typer.Option(help="Good means this outcome (default: the --good commit's outcome).")
    ] = None,
    cycles: Annotated[int, typer.Option(min=1, help="Sleep/wake cycles per step.")] = 1,
    output: Annotated[Path, typer.Option(help="Results folder; the bisect gets a new sub-folder.")] = Path("results"),
    remeasure: Annotated[
        bool,
        typer.Option(
            "--remeasure",
            help="Run every step, also one whose outcome an earlier bisect kept in specwake's cache (same build, diff"
            " and scenario), and keep the new outcomes.",
        ),
    ] = False,
) -> None:
    """Find the vLLM commit that changed a variant's outcome (broke or fixed it): each step overlays the commit's
    diff of vllm/ from BASE onto the installed vLLM and runs the variant; no rebuild. Exit 0 found, 1 no change in
    the range, 2 bad input, 3 only skipped commits remain."""
    from specwake.run.bisect import BisectRequest, render, run_bisect

    ui = Ui()
    request = BisectRequest(scenario, vllm_repo, good, bad, output, base, variant, expect, cycles, remeasure)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with ui:
            outcome = run_bisect(request, ui.event)
    except SpecwakeError as exc:
        _fail(ui, exc)
    except KeyboardInterrupt:
        ui.error("interrupted: servers stopped; the steps run so far are in the bisect's folder")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    ui.report(render(outcome), plain=True)
    raise typer.Exit(outcome.exit_code)


@app.command()
def leftovers(
    stop: Annotated[
        bool, typer.Option("--stop", help=f"Stop them: SIGTERM to each server's group, SIGKILL after {GRACE_S:g} s.")
    ] = False,
) -> None:
    """Servers that specwake runs left running when they died outright (SIGKILL, the OOM killer) together with the
    watchdog that would have stopped them: list them, and with --stop end them. Exit 3 if one survives --stop."""
    ui = Ui()
    registry = registry_dir(cache_dir())
    found = find_leftovers(registry)
    if not found:
        ui.note(f"no leftover servers (records: {registry})")
        return
    rows = [
        (str(f.record.pgid), str(len(f.members)), str(f.record.port), f.record.started_at, f.record.log) for f in found
    ]
    ui.table(("group", "processes", "port", "started", "log"), rows)
    if not stop:
        ui.note(f"{len(found)} leftover server(s); `specwake leftovers --stop` stops them")
        return
    survived = 0
    for leftover in found:
        survivors = stop_leftover(leftover)
        survived += bool(survivors)
        ui.note(f"stopped {describe(leftover)}" if not survivors else f"{describe(leftover)}: {survivors} survived")
    if survived:
        ui.error(f"{survived} leftover server(s) survived SIGKILL")
        raise typer.Exit(EXIT_INFRA)


@models_app.command("list")
def models_list() -> None:
    """Every builtin model: name, drafter family, role, size, and whether it is built in the cache."""
    cache = cache_dir()
    rows = [
        (f"builtin:{m.name}", m.family, m.role, f"{m.parameters / 1e6:.2f} M", _cached(model_dir(m.name, cache)))
        for m in BUILTIN_MODELS
    ]
    ui = Ui()
    ui.table(("name", "family", "role", "parameters", "cached"), rows)
    ui.note(f"cache: {cache / 'models'}; build ahead of a run with `specwake models build NAME|all`")


def _cached(path: Path) -> str:
    return "yes" if path.is_dir() else "no"


@models_app.command("build")
def models_build(
    name: Annotated[str, typer.Argument(help="A builtin model name (with or without `builtin:`), or `all`.")],
    python: Annotated[str | None, typer.Option(help="Interpreter with torch (default: this one).")] = None,
) -> None:
    """Build builtin models into specwake's cache (SPECWAKE_CACHE) ahead of a run; built ones are reused."""
    ui = Ui()
    try:
        names = [m.name for m in BUILTIN_MODELS] if name == "all" else [lookup(name.removeprefix("builtin:")).name]
        for model in names:
            path = ensure_builtin_model(model, python or sys.executable)
            ui.note(f"builtin:{model} → {path}")
    except SpecwakeError as exc:
        _fail(ui, exc)


@models_app.command("tiny", hidden=True)
def models_tiny(
    python: Annotated[str | None, typer.Option(help="Interpreter with torch (default: this one).")] = None,
) -> None:
    """Same as `specwake models build tiny-llama` (kept for scripts written before `models build`)."""
    models_build("tiny-llama", python)


@app.command()
def version() -> None:
    """Print specwake's version."""
    print(__version__)


def main() -> None:
    try:
        app()
    except Interrupted:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
