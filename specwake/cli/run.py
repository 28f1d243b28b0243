"""`specwake run`, `check` and `bisect`: the commands that measure vLLM (or show what a run would start), each
parsing its flags into one typed request for the core and rendering the answer.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from specwake.cli.common import fail, parse_gpus, refuse_bad_run_flags, sigterm_as_ctrl_c
from specwake.console import Ui
from specwake.errors import EXIT_INFRA, EXIT_INPUT, EXIT_INTERRUPTED, SpecwakeError
from specwake.prepare.models import cache_dir
from specwake.run.session.shards import choose_shard

# A command imports what only it needs (the run machinery: openai, pydantic) inside its body, so that `--help` and the
# commands that only read results start in a fraction of `run`'s import time.


class ModelRunnerChoice(str, Enum):
    """`--model-runner`'s choices: vLLM's model runners (server.model_runner)."""

    v1 = "v1"
    v2 = "v2"


EXPECT_HELP = (
    "Outcome the `patched` variant must have with --patch: recover, collapse, corrupt, crash or any (default: the"
    " file's expect.patched, else recover for the variant --patch adds)."
)


def _runner(choice: ModelRunnerChoice | None) -> str | None:
    return choice.value if choice is not None else None


def run(
    scenarios: Annotated[
        list[Path] | None,
        typer.Argument(help="Scenario TOML files (with --resume: taken from the run folder).", show_default=False),
    ] = None,
    cycles: Annotated[
        int | None, typer.Option(min=1, help="Sleep/wake cycles per variant (overrides cycle.count).")
    ] = None,
    tp: Annotated[
        int | None, typer.Option(min=1, help="Tensor parallel size (overrides server.tensor_parallel_size).")
    ] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", help="Run only this variant (repeatable).")] = None,
    model_runner: Annotated[
        ModelRunnerChoice | None,
        typer.Option(help="Model runner of every variant the files leave to vLLM's choice (server.model_runner)."),
    ] = None,
    patch: Annotated[Path | None, typer.Option(help="Diff for the `patched` variant (overrides its patch).")] = None,
    expect: Annotated[str | None, typer.Option(help=EXPECT_HELP, show_default=False)] = None,
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
            help="CPU: one server at a time (default: servers side by side, each on its own cores: measuring one at a"
            " time where a speed call binds, measuring at once where none does)."
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
    from specwake.run.session.session import RunInterrupted, RunRequest, execute

    ui = Ui(quiet)
    refuse_bad_run_flags(ui, patch, interleave, sequential, expect)
    if not scenarios and resume is None:
        ui.error("SCENARIOS: name at least one scenario file (or --resume DIR to finish an interrupted run)")
        raise typer.Exit(EXIT_INPUT)
    try:
        request = RunRequest(
            scenarios=scenarios or [],
            overrides=Overrides(
                cycles=cycles,
                tp=tp,
                variants=tuple(variant or ()),
                patch=patch,
                model_runner=_runner(model_runner),
                expect=expect,
            ),
            output=output,
            cache=cache_dir(),
            interleave=interleave,
            sequential=sequential,
            gpus=parse_gpus(gpus),
            junit=junit,
            resume=resume,
            shard=choose_shard(shard, no_shard, os.environ),
            stop_leftovers=stop_leftovers,
        )
    except SpecwakeError as exc:
        fail(ui, exc)
    if shard is None and request.shard is not None:
        ui.note(f"shard {request.shard}, from Buildkite's BUILDKITE_PARALLEL_JOB / BUILDKITE_PARALLEL_JOB_COUNT")
    with sigterm_as_ctrl_c():
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
            fail(ui, exc)
        except KeyboardInterrupt:
            ui.error("interrupted: servers stopped, results measured so far are saved")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if outcome.note:
        ui.note(outcome.note)
    if outcome.results:
        ui.report(outcome.markdown, plain=True)
        ui.note(f"results: {outcome.run_root}")
    raise typer.Exit(outcome.exit_code)


def check(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario TOML files.", show_default=False)],
    cycles: Annotated[
        int | None, typer.Option(min=1, help="Sleep/wake cycles per variant (overrides cycle.count).")
    ] = None,
    tp: Annotated[int | None, typer.Option(min=1, help="Tensor parallel size (overrides the files).")] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", help="Check only this variant.")] = None,
    model_runner: Annotated[
        ModelRunnerChoice | None,
        typer.Option(help="Model runner of every variant the files leave to vLLM's choice (server.model_runner)."),
    ] = None,
    patch: Annotated[Path | None, typer.Option(help="Diff for the `patched` variant.")] = None,
    expect: Annotated[str | None, typer.Option(help=EXPECT_HELP, show_default=False)] = None,
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
    from specwake.run.session.check import check_all

    ui = Ui()
    refuse_bad_run_flags(ui, patch, interleave, sequential, expect)
    overrides = Overrides(
        cycles=cycles, tp=tp, variants=tuple(variant or ()), patch=patch, model_runner=_runner(model_runner),
        expect=expect,
    )  # fmt: skip
    try:
        outcome = check_all(
            scenarios, overrides, cache_dir(), ui.event, gpus=parse_gpus(gpus), online=online, sequential=sequential,
            interleave=interleave, tensors=tensors,
        )  # fmt: skip
    except SpecwakeError as exc:
        fail(ui, exc)
    ui.report(outcome.text)
    problems = outcome.problems
    if problems and not no_gpu_check:
        ui.error(f"{len(problems)} variant(s) cannot run on this machine (see NOT RUNNABLE HERE above)")
        raise typer.Exit(EXIT_INFRA)
    ui.note(
        f"ok: {len(scenarios)} scenario(s) checked"
        + (f", {len(problems)} not runnable here (reported)" if problems else "")
    )


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
    from specwake.report.bisect import render
    from specwake.run.bisect.bisect import BisectRequest, run_bisect

    ui = Ui()
    request = BisectRequest(scenario, vllm_repo, good, bad, output, base, variant, expect, cycles, remeasure)
    with sigterm_as_ctrl_c():
        try:
            with ui:
                outcome = run_bisect(request, ui.event)
        except SpecwakeError as exc:
            fail(ui, exc)
        except KeyboardInterrupt:
            ui.error("interrupted: servers stopped; the steps run so far are in the bisect's folder")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    ui.report(render(outcome), plain=True)
    raise typer.Exit(outcome.exit_code)
