"""Builtin tiny model pair (``builtin:tiny-llama``): resolve, build once into a cache, reuse.

The checkpoint is generated offline by specwake.tinymodel_build in the server's interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from specwake.errors import EngineMissing, InputError

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("tiny-llama",)
BUILD_VERSION = "v1"  # bump when tinymodel_build changes its output
BUILD_TIMEOUT_S = 600.0
_STDERR_TAIL_CHARS = 2000


def cache_dir() -> Path:
    """specwake's cache root: $SPECWAKE_CACHE, else ~/.cache/specwake."""
    configured = os.environ.get("SPECWAKE_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "specwake"


def model_dir(name: str, cache: Path) -> Path:
    return cache / "models" / f"{name}-{BUILD_VERSION}"


def _package_parent() -> Path:
    return Path(__file__).resolve().parent.parent


def builder_command(python: str, out: Path) -> list[str]:
    return [python, "-m", "specwake.tinymodel_build", "--out", str(out)]


def builder_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` with specwake's parent folder first on PYTHONPATH."""
    env = dict(base)
    parts = [str(_package_parent())]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _check_name(name: str) -> None:
    if name not in BUILTIN_MODELS:
        known = ", ".join(f"{BUILTIN_PREFIX}{n}" for n in BUILTIN_MODELS)
        raise InputError(f"unknown builtin model {BUILTIN_PREFIX}{name!r}; known: {known}")


def _run_builder(python: str, out: Path) -> None:
    try:
        proc = subprocess.run(
            builder_command(python, out),
            env=builder_env(dict(os.environ)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineMissing(f"cannot build the tiny model with {python}: {exc}") from exc
    if proc.returncode != 0:
        tail = proc.stderr[-_STDERR_TAIL_CHARS:].strip()
        raise EngineMissing(f"building the tiny model with {python} failed (exit {proc.returncode}):\n{tail}")


def ensure_builtin_model(name: str, python: str, cache: Path | None = None) -> Path:
    """Return ``<cache>/models/<name>-v1/``, building it with ``python`` if it is absent.

    The build goes into a temporary folder next to the target and is renamed into place,
    so two concurrent runs never see a half-written model; the loser discards its copy.
    """
    _check_name(name)
    target = model_dir(name, cache if cache is not None else cache_dir())
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _run_builder(python, staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared by users' runs
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model_ref(ref: str, python: str) -> str:
    """Path of the built model for ``builtin:NAME``; any other reference is returned as is."""
    if not ref.startswith(BUILTIN_PREFIX):
        return ref
    name = ref[len(BUILTIN_PREFIX) :]
    _check_name(name)
    return str(ensure_builtin_model(name, python))
