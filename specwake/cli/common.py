"""What every `specwake` command shares: one error line per problem and its exit code, `--gpus`, the run-mode and
`--expect` checks `run` and `check` make alike, and SIGTERM read as Ctrl-C.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer

from specwake.console import Ui
from specwake.errors import EXIT_INPUT, InputError, ScenarioErrors, SpecwakeError
from specwake.judge.expectations import unknown_outcome
from specwake.run.session.schedule import parse_gpu_list


def fail(ui: Ui, exc: SpecwakeError) -> NoReturn:
    """Print the error (a line per scenario file) and exit with its code."""
    for each in exc.errors if isinstance(exc, ScenarioErrors) else [exc]:
        ui.error(str(each))
    raise typer.Exit(exc.exit_code)


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """--gpus as visible GPU indices (`0-7`, `0,1,4,5`); InputError (exit 2) naming the flag otherwise."""
    if text is None:
        return None
    try:
        return parse_gpu_list(text)
    except ValueError as exc:
        raise InputError(f"--gpus: {exc}") from None


def refuse_bad_run_flags(
    ui: Ui, patch: Path | None, interleave: bool, sequential: bool, expect: str | None = None
) -> None:
    """Exit 2 on an --expect that is no outcome or comes without --patch, or two run modes at once: `run` refuses
    them, and `check` as `run`. (A --patch that is no file is the scenarios' problem, named with each:
    specwake.prepare.scenario.)"""
    problem = unknown_outcome("--expect", expect)
    if problem is None and expect is not None and patch is None:
        problem = f"--expect {expect}: only with --patch (it is what the `patched` variant must do)"
    if problem:
        ui.error(problem)
        raise typer.Exit(EXIT_INPUT)
    if interleave and sequential:
        ui.error("--interleave, --sequential: choose one run mode")
        raise typer.Exit(EXIT_INPUT)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within: SIGTERM stops the command as Ctrl-C does (servers stopped, what was measured kept); the previous
    handler is back after."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
