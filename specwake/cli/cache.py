"""`specwake leftovers` and `specwake models`: what specwake keeps in its cache — records of the servers of runs that
died, and the builtin models.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from specwake.cli.common import fail
from specwake.console import Ui
from specwake.errors import EXIT_INFRA, SpecwakeError
from specwake.prepare.models import BUILTIN_MODELS, cache_dir, ensure_builtin_models, lookup, model_dir
from specwake.run.server.leftovers import GRACE_S, describe, find_leftovers, registry_dir, stop_leftover


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


def models_build(
    name: Annotated[str, typer.Argument(help="A builtin model name (with or without `builtin:`), or `all`.")],
    python: Annotated[str | None, typer.Option(help="Interpreter with torch (default: this one).")] = None,
) -> None:
    """Build builtin models into specwake's cache (SPECWAKE_CACHE) ahead of a run; built ones are reused."""
    ui = Ui()
    try:
        names = [m.name for m in BUILTIN_MODELS] if name == "all" else [lookup(name.removeprefix("builtin:")).name]
        ensure_builtin_models([(model, python or sys.executable) for model in names], cache_dir())  # side by side
        for model in names:
            ui.note(f"builtin:{model} → {model_dir(model, cache_dir())}")
    except SpecwakeError as exc:
        fail(ui, exc)


def models_tiny(
    python: Annotated[str | None, typer.Option(help="Interpreter with torch (default: this one).")] = None,
) -> None:
    """Same as `specwake models build tiny-llama` (kept for scripts written before `models build`)."""
    models_build("tiny-llama", python)
