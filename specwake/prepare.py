"""Everything about a scenario that can be resolved before any server starts: patches checked, interpreters
probed, overlays and builtin models built, platform fit judged, and each variant's exact server plan.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from specwake.engine import EngineInfo, probe_engine, resolve_python
from specwake.errors import PatchError, PlatformMismatch
from specwake.overlay import Overlay, PatchInfo, build_overlay, inspect_patch
from specwake.plan import VariantPlan, build_server_command, build_server_env, redact_env, resolve_discard
from specwake.scenario import Scenario, Variant
from specwake.tinymodel import resolve_model_ref

Events = Callable[[str], None]
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class PreparedVariant:
    """A variant with everything resolved that can be resolved without starting a server."""

    variant: Variant
    engine: EngineInfo
    overlay: Overlay | None
    patch_sha256: str | None
    model: str
    draft_model: str | None
    l2_discard: str
    platform_problem: str | None = None  # why this machine cannot run it (GPUs, sleep mode), if so


def available_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def platform_problem(scenario: Scenario, engine: EngineInfo, gpus: Sequence[int] | None) -> str | None:
    """Why this machine cannot run the scenario as written, or None. `gpus`: the --gpus set, if given."""
    tp = scenario.server.tensor_parallel_size
    try:
        resolve_discard(scenario, engine.sleep_mode, engine.platform)
    except PlatformMismatch as exc:
        return str(exc)
    if engine.is_gpu:
        have = len(gpus) if gpus is not None else engine.device_count
        if tp > have:
            return f"{scenario.name}: tensor_parallel_size {tp} needs {tp} GPUs, only {have} available"
    else:
        cores = len(available_cpus())
        if tp > cores:
            return f"{scenario.name}: tensor_parallel_size {tp} on CPU needs one core per rank, only {cores} available"
    return None


@contextlib.contextmanager
def _naming_patch(scenario: Scenario, variant: Variant) -> Iterator[None]:
    """Patch errors name the scenario file and key, like every other input error."""
    try:
        yield
    except PatchError as exc:
        raise PatchError(f"{scenario.file}: variants.{variant.name}.patch: {exc}") from None


def inspect_patches(scenario: Scenario) -> dict[str, PatchInfo]:
    """Read and validate every variant's diff (no overlay built): the cheap part of the patch checks."""
    infos = {}
    for variant in scenario.variants:
        if variant.patch is not None:
            with _naming_patch(scenario, variant):
                infos[variant.name] = inspect_patch(variant.patch)
    return infos


def prepare(
    scenario: Scenario,
    cache: Path,
    events: Events,
    *,
    gpus: Sequence[int] | None = None,
    patches: dict[str, PatchInfo] | None = None,
) -> list[PreparedVariant]:
    """Validate patches, probe interpreters, build overlays and builtin models. Launches no server.

    `patches`: what `inspect_patches(scenario)` already returned, if the caller checked them earlier.
    Input problems raise (exit 2); a platform that cannot run the scenario is recorded per variant so that
    `check` can report it and `run` can refuse it (see `require_runnable`).
    """
    if patches is None:  # cheap input checks first, so bad input never waits on a probe
        patches = inspect_patches(scenario)
    engines: dict[str, EngineInfo] = {}
    prepared = []
    for variant in scenario.variants:
        python = resolve_python(variant.python)
        if python not in engines:
            events(f"probing vLLM in {python}")
            engines[python] = probe_engine(python, cache)
        engine = engines[python]
        overlay = patch_sha = None
        if variant.patch is not None:
            with _naming_patch(scenario, variant):
                overlay = build_overlay(variant.patch, engine.package_dir, engine.vllm_version, cache)
            patch_sha = patches[variant.name].sha256
            events(f"{variant.name}: overlay {'reused' if overlay.reused else 'built'} at {overlay.root}")
            for skipped in overlay.skipped_files:
                events(f"{variant.name}: patch file outside vllm/ skipped: {skipped}")
        model = resolve_model_ref(scenario.server.model, python)
        draft_ref = scenario.speculative.get("model")
        draft = (
            resolve_model_ref(draft_ref, python)
            if isinstance(draft_ref, str) and draft_ref.startswith("builtin:")
            else None
        )
        problem = platform_problem(scenario, engine, gpus)
        discard = scenario.cycle.discard if problem else resolve_discard(scenario, engine.sleep_mode, engine.platform)
        prepared.append(PreparedVariant(variant, engine, overlay, patch_sha, model, draft, discard, problem))
    return prepared


def require_runnable(prepared: Sequence[PreparedVariant]) -> None:
    """Raise PlatformMismatch (exit 3) for the first variant this machine cannot run."""
    for prep in prepared:
        if prep.platform_problem:
            raise PlatformMismatch(prep.platform_problem)


def plan_variant(scenario: Scenario, prep: PreparedVariant, port: int, gpus: tuple[int, ...] = ()) -> VariantPlan:
    """The exact argv and environment of one variant's server."""
    engine = prep.engine
    pythonpath = ([str(prep.overlay.root)] if prep.overlay else []) + [PACKAGE_PARENT]
    argv = build_server_command(
        scenario,
        python=engine.python,
        port=port,
        model=prep.model,
        draft_model=prep.draft_model,
        sleep_mode=prep.l2_discard == "native",
        is_gpu=engine.is_gpu,
    )
    env, added = build_server_env(
        scenario,
        prep.variant,
        base_env=os.environ,
        pythonpath=pythonpath,
        is_gpu=engine.is_gpu,
        cpu_ids=available_cpus(),
        gpus=gpus,
    )
    return VariantPlan(prep.variant, engine.python, argv, env, added, port, prep.l2_discard, gpus)


def describe(scenario: Scenario, prepared: Sequence[PreparedVariant], plans: Sequence[VariantPlan]) -> str:
    """What `run` would start for one scenario, as plain text (`specwake check`)."""
    lines = [f"{scenario.name}  ({scenario.file})"]
    for prep, plan in zip(prepared, plans, strict=True):
        engine = prep.engine
        lines.append(f"  variant {prep.variant.name}  (expect {prep.variant.expected})")
        lines.append(f"    interpreter: {engine.python}  (Python {engine.python_version})")
        dists = ", ".join(engine.distributions) or engine.vllm_version
        lines.append(f"    vLLM: {dists} at {engine.package_dir}  platform {engine.platform}")
        if prep.overlay is not None:
            state = "reused" if prep.overlay.reused else "built"
            lines.append(
                f"    overlay: {prep.overlay.root} ({state}); patched: {', '.join(prep.overlay.patched_files)}"
            )
            if prep.overlay.skipped_files:
                lines.append(f"    skipped (outside vllm/): {', '.join(prep.overlay.skipped_files)}")
        lines.append(f"    L2 discard: {prep.l2_discard}")
        where = ",".join(map(str, plan.gpus)) if plan.gpus else ("all visible" if engine.is_gpu else "none (CPU)")
        lines.append(f"    gpus: {where}")
        lines.append("    argv: " + " ".join(_quote(a) for a in plan.argv))
        for key, value in sorted(redact_env(plan.env_added).items()):
            lines.append(f"    env: {key}={value}")
        if prep.platform_problem:
            lines.append(f"    NOT RUNNABLE HERE: {prep.platform_problem}")
    return "\n".join(lines)


def _quote(arg: str) -> str:
    return shlex.quote(arg)
