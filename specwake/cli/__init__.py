"""The `specwake` command line: parse flags, call one core function, render, return an exit code.

No logic lives here; run/session/session.py does what `run` does, errors.py maps exceptions to exit codes. The commands
live by what they touch: run.py measures vLLM (`run`, `check`, `bisect`), results.py reads earlier runs (`report`,
`compare`), cache.py what specwake keeps in its cache (`leftovers`, `models`); common.py is what they share.
"""

from __future__ import annotations

import sys

import typer

from specwake import __version__
from specwake.cli import cache, results, run
from specwake.errors import EXIT_INTERRUPTED, Interrupted

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Regression tester for vLLM speculative decoding across Level 2 sleep/wake/reload cycles.",
)
for command in (run.run, run.check, results.report, results.compare, run.bisect, cache.leftovers):
    app.command()(command)

models_app = typer.Typer(no_args_is_help=True, help="Builtin models (generated offline, cached).")
models_app.command("list")(cache.models_list)
models_app.command("build")(cache.models_build)
models_app.command("tiny", hidden=True)(cache.models_tiny)
app.add_typer(models_app, name="models")


@app.command()
def version() -> None:
    """Print specwake's version."""
    print(__version__)


def main() -> None:
    try:
        app()
    except Interrupted:
        sys.exit(EXIT_INTERRUPTED)
