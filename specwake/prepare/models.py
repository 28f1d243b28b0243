"""Builtin models (``builtin:NAME``): what exists, which drafter family each stands for, and building them
once into specwake's cache, atomically, with the variant's own interpreter (specwake.worker.build).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from specwake.errors import EngineMissing, InputError

BUILTIN_PREFIX = "builtin:"
BUILD_TIMEOUT_S = 600.0
_STDERR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    family: str  # the speculative-decoding family it belongs to
    role: str  # target | drafter | target + drafter (MTP inside) | target and drafter (draft_model)
    parameters: int  # elements in the checkpoint (tests check it against a real build)
    version: str = "v1"  # bump when its generator's output changes


BUILTIN_MODELS: tuple[BuiltinModel, ...] = (
    # A seeded random 2-layer Llama, and its drafter: the same network with its dimensions reordered, so it
    # drafts what the target says from a checkpoint that differs from the target's (some scenarios draft with
    # tiny-llama itself).
    BuiltinModel("tiny-llama", "draft_model", "target (or its own drafter)", 410_240),
    BuiltinModel("tiny-llama-draft", "draft_model", "drafter (tiny-llama reordered)", 410_240),
    # Bigram machines (see specwake/worker/bigram.py) and drafters of each family built to match them.
    BuiltinModel("eagle3-llama", "EAGLE3", "target", 410_240),
    BuiltinModel("eagle3-llama-draft", "EAGLE3", "drafter", 303_616),  # vLLM shares the target's embedding
    BuiltinModel("mtp-mimo", "MiMo MTP", "target + drafter", 608_640),  # MTP layer inside the checkpoint
    BuiltinModel("mtp-deepseek-v3", "DeepSeek-V3 MTP", "target + drafter", 1_256_192),  # MLA; MTP inside
    BuiltinModel("mtp-gemma4", "Gemma4 MTP", "target", 756_226),  # hidden 256
    BuiltinModel("mtp-gemma4-assistant", "Gemma4 MTP", "drafter", 271_041),  # hidden 128, own checkpoint
    BuiltinModel("mtp-qwen35", "Qwen3.5 MTP", "target + drafter", 940_748),  # gated-delta-net hybrid; MTP inside
    BuiltinModel("dspark-qwen3", "DSpark", "target", 410_496),  # Qwen3: the bigram body + q/k norms
    BuiltinModel("dspark-qwen3-draft", "DSpark", "drafter", 299_648),  # V2 runner only; the target's embedding
)
_BY_NAME = {model.name: model for model in BUILTIN_MODELS}


def cache_dir() -> Path:
    """specwake's cache root: $SPECWAKE_CACHE, else ~/.cache/specwake."""
    configured = os.environ.get("SPECWAKE_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "specwake"


def lookup(name: str) -> BuiltinModel:
    """The builtin model called `name` (without the prefix); InputError listing the known ones otherwise."""
    model = _BY_NAME.get(name)
    if model is None:
        known = ", ".join(f"{BUILTIN_PREFIX}{n}" for n in _BY_NAME)
        raise InputError(f"unknown builtin model '{BUILTIN_PREFIX}{name}'; known: {known}")
    return model


def model_dir(name: str, cache: Path) -> Path:
    return cache / "models" / f"{name}-{lookup(name).version}"


def _package_parent() -> Path:
    return Path(__file__).resolve().parents[2]


def builder_command(python: str, name: str, out: Path) -> list[str]:
    return [python, "-m", "specwake.worker.build", name, "--out", str(out)]


def builder_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` with specwake's parent folder first on PYTHONPATH."""
    env = dict(base)
    parts = [str(_package_parent())]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _run_builder(python: str, name: str, out: Path) -> None:
    try:
        proc = subprocess.run(
            builder_command(python, name, out),
            env=builder_env(dict(os.environ)),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineMissing(f"cannot build builtin model {name} with {python}: {exc}") from exc
    if proc.returncode != 0:
        tail = proc.stderr[-_STDERR_TAIL_CHARS:].strip()
        raise EngineMissing(f"building builtin model {name} with {python} failed (exit {proc.returncode}):\n{tail}")


def ensure_builtin_model(name: str, python: str, cache: Path | None = None) -> Path:
    """Return ``<cache>/models/<name>-<version>/``, building it with ``python`` if it is absent.

    The build goes into a temporary folder next to the target and is renamed into place,
    so two concurrent runs never see a half-written model; the loser discards its copy.
    """
    target = model_dir(name, cache if cache is not None else cache_dir())
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _run_builder(python, name, staging)
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


def ensure_builtin_models(wanted: Iterable[tuple[str, str]], cache: Path) -> None:
    """Build each (name, interpreter) of `wanted` that the cache lacks, side by side: each build is a process of its
    own that imports torch, and a run of several families asks for up to 11 (the first run on a fresh machine). As
    many at a time as the machine has cores; the first failure, in `wanted`'s order, is raised once all have ended."""
    missing = {name: python for name, python in wanted if not model_dir(name, cache).is_dir()}
    if not missing:
        return
    with ThreadPoolExecutor(max_workers=min(len(missing), os.cpu_count() or 1)) as pool:
        builds = [pool.submit(ensure_builtin_model, name, python, cache) for name, python in missing.items()]
        for build in builds:
            build.result()


def is_builtin(ref: object) -> TypeGuard[str]:
    return isinstance(ref, str) and ref.startswith(BUILTIN_PREFIX)


def resolve_model_ref(ref: str, python: str, cache: Path | None = None) -> str:
    """Path of the built model for ``builtin:NAME`` (built if needed); any other reference is returned as is."""
    if not is_builtin(ref):
        return ref
    return str(ensure_builtin_model(ref.removeprefix(BUILTIN_PREFIX), python, cache))
