"""`specwake check`: everything `run` resolves before it launches, for every scenario, as text, and why a variant
cannot run on this machine; no server starts. The scenarios are loaded, prepared and validated as `run` does them
(run/session/session.py), the servers planned as its packer would place them (run/session/runner.py,
run/session/schedule.py), and the cycle each variant would go through listed from the cycle's own step builder
(run/measure/cycle.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from specwake.events import Event, Events
from specwake.judge.expectations import COLLAPSE_AL, MIN_FIRST_LOAD_S
from specwake.judge.verdict import RULES, speed_rule
from specwake.prepare.checkpoint import checkpoints, tensor_lines
from specwake.prepare.hub import Availability, availability, confirm_on_hub
from specwake.prepare.memory import MemoryCheck, check_memory
from specwake.prepare.models import is_builtin
from specwake.prepare.plan import VariantPlan, redact_env
from specwake.prepare.releases import is_tested, tested_span
from specwake.prepare.runners import runner_choice
from specwake.prepare.scenario import Overrides, Scenario, Variant, load_scenario
from specwake.prepare.scenario_file import WorkloadSection
from specwake.prepare.validate import Checked
from specwake.prepare.variants import (
    PreparedVariant,
    available_cpus,
    build_models,
    chunked_draft_sync,
    cpu_no_ops,
    emulated_rules,
    inspect_patches,
    overlay_under_ray,
    plan_servers,
    prepare,
    untested_releases,
    validate_run,
)
from specwake.protocol import ROLES, rules_name
from specwake.run.measure.cycle import cycle_steps
from specwake.run.session.runner import Work, launch_order, mode_line, packing_mode, server_jobs
from specwake.run.session.schedule import plan_schedule
from specwake.run.session.session import refuse_invisible_gpus, refuse_same_names, visible_gpus
from specwake.runfolder import RunLayout
from specwake.weight_updates import PushRequest


@dataclass(frozen=True)
class CheckOutcome:
    text: str  # what `run` would start, scenario by scenario
    problems: list[str]  # why some variants cannot run on this machine


def check_all(
    paths: Sequence[Path],
    overrides: Overrides,
    cache: Path,
    events: Events,
    *,
    gpus: tuple[int, ...] | None = None,
    online: bool = False,
    sequential: bool = False,
    interleave: bool = False,
    hub: httpx.Client | None = None,
    tensors: bool = False,
) -> CheckOutcome:
    """Everything `run` resolves before launching, for every scenario, plus the GPU assignment packing would
    choose and where each model would be loaded from (`online`: the Hub asked too, through `hub`; `tensors`: every
    checkpoint tensor name push_scale and push_skip may use, per model); launches no server. Input problems raise
    (exit 2), among them a model id the Hub does not have; a missing engine, or a Hub that does not answer when
    asked, raises (exit 3)."""
    inventory = gpus
    scenarios = [load_scenario(path, overrides) for path in paths]
    refuse_same_names(scenarios)  # as run does
    found = {
        s.name: (
            confirm_on_hub(str(s.file), _hub_models(s), client=hub)
            if online
            else [availability(m) for _, m in _hub_models(s)]
        )
        for s in scenarios
    }
    patches = [inspect_patches(s) for s in scenarios]
    build_models(scenarios, cache)
    prepared = [prepare(s, cache, events, gpus=inventory, patches=p) for s, p in zip(scenarios, patches, strict=True)]
    checked = validate_run(scenarios, prepared, cache, events)
    for line in untested_releases(prepared):
        events(Event(line))
    problems = [p.platform_problem for variants in prepared for p in variants if p.platform_problem]
    on_gpu = any(p.engine.is_gpu for variants in prepared for p in variants)
    if gpus is not None and on_gpu:
        refuse_invisible_gpus(gpus, visible_gpus(prepared))  # as run does
    assigned: dict[str, tuple[int, ...]] = {}
    cores: dict[str, tuple[int, ...]] = {}
    work = [Work(s, ps, RunLayout(Path("."), ())) for s, ps in zip(scenarios, prepared, strict=True)]
    asked = not on_gpu and (sequential or interleave)
    if asked:
        mode = "interleaved" if interleave else "sequential"
    else:  # run's default: packed onto the GPUs, or side by side on cores of their own, as the packer places them
        devices = (inventory if inventory is not None else visible_gpus(prepared)) if on_gpu else available_cpus()
        mode = packing_mode(work, devices, cpu=not on_gpu)
        if not problems:
            try:
                plan = {a.job.key: a.gpus for a in plan_schedule(launch_order(work), devices)}
            except ValueError as exc:
                problems.append(str(exc))
            else:
                assigned, cores = (plan, {}) if on_gpu else ({}, plan)
    memory = check_memory(scenarios, prepared, devices) if on_gpu and not asked else {}
    problems += [check.problem for check in memory.values() if check.problem]
    texts = []
    for scenario, variants in zip(scenarios, prepared, strict=True):
        plans = [
            plan_servers(scenario, p, assigned.get(key(scenario, p), ()), cores.get(key(scenario, p), ()))
            for p in variants
        ]
        texts.append(describe(scenario, variants, plans, found[scenario.name], checked, memory))
        if tensors and variants:
            texts += tensor_lines(checkpoints(scenario, variants[0].model, variants[0].draft_model))
    texts.append(f"run mode: {mode} — {mode_line(mode, len(server_jobs(work)), asked)}")
    return CheckOutcome("\n".join(texts), problems)


def key(scenario: Scenario, prep: PreparedVariant) -> str:
    return f"{scenario.name}/{prep.variant.name}"


def _hub_models(scenario: Scenario) -> list[tuple[str, str]]:
    """(key, model) for the scenario's model references that are not builtin: target, and drafter when it has its
    own (a drafter naming the target's model is listed once, under the target's key)."""
    refs = {"server.model": scenario.server.model, "speculative.model": scenario.speculative.get("model")}
    listed: dict[str, str] = {}
    for key, ref in refs.items():
        if isinstance(ref, str) and not is_builtin(ref):
            listed.setdefault(ref, key)
    return [(key, ref) for ref, key in listed.items()]


def _early_stop(w: WorkloadSection, engines: int = 1) -> str:
    """How many requests a stage after a cycle takes, where it may stop early (specwake.run.measure.measure)."""
    if engines > 1:
        return f", in turn to the {engines} engines (every one, no early stop)"
    if w.least_repeats >= w.repeats:
        return ""
    return f" (after a cycle {w.least_repeats}–{w.repeats}: until AL is decided, all where the speed rule binds)"


def measurement_plan(scenario: Scenario, prepared: Sequence[PreparedVariant]) -> list[str]:
    """What a run will measure and how it will decide, every default resolved (`specwake check`)."""
    w, c = scenario.workload, scenario.cycle
    source = w.prompts if isinstance(w.prompts, str) else "the scenario file"
    emulated = any(p.l2_discard == "emulated" for p in prepared)
    push, kind = None, c.reload_kind
    if kind.via is not None:  # every model some variant pushes into or syncs
        to = tuple(r for r in ROLES if any(r in p.variant.push_to for p in prepared))
        push = PushRequest(to or ("target",), via=kind.via)
    steps = "; ".join(
        f"L{level}: " + " → ".join(step.name for step in cycle_steps(level, emulated, c.discard_fill, push))
        for level in c.levels
    )
    fill = f", emulated discard fills {c.discard_fill}" if emulated and 2 in c.levels else ""
    bound = 1.0 - scenario.tolerance
    graphs = "a finding" if scenario.limits.graph_safe else "not checked (expect.graph_safe = false)"
    early = _early_stop(w, scenario.server.data_parallel_size)
    lines = [
        "  measures:",
        f"    prompts: {len(scenario.prompts)} from {source}, first {_short(scenario.prompts[0])}",
        f"    each stage: {w.warmup} warmup ({w.warmup_max_tokens} tokens) + {w.repeats} measured requests{early},"
        f" one at a time; max_tokens {w.max_tokens},"
        f" temperature {w.temperature:g}, ignore_eos {str(w.ignore_eos).lower()},"
        f" request timeout {w.request_timeout_s:g} s",
        f"    stages: fresh, then after each of {c.count} cycle(s): {steps}{fill}; step timeout {c.step_timeout_s:g} s",
        "  decides (first rule that applies):",
        *(f"    {rule.outcome:<9} {rule.text}" for rule in RULES),
        f"    here: recover needs every post-cycle AL ≥ {bound:.0%} of fresh (tolerance {scenario.tolerance:g}),"
        f" collapse is AL ≤ {COLLAPSE_AL:.2f}",
        f"  findings: tensors in new storage after a reload, push or sync: {graphs}; a stale prefix cache;"
        f" a wake over {scenario.limits.max_wake_ratio:g}× the server's first load of its weights, by vLLM's log,"
        f" a load under {MIN_FIRST_LOAD_S:g} s counting as {MIN_FIRST_LOAD_S:g} s (expect.max_wake_ratio);"
        " [expect] limits",
    ]
    for prep in prepared:
        rule = speed_rule(scenario.min_speedup_recovery, prep.l2_discard)
        pushed = f"; {kind.check_verb} {' and '.join(prep.variant.push_to)}" if kind.check_verb else ""
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


def _by_release(variant: Variant) -> list[str]:
    """The patch this variant applies and the expectation it is judged by, for the release its vLLM is, and for every
    tested release where the scenario gives one per release."""
    release = variant.release or "?"
    lines = []
    if variant.patches is not None:
        spec = variant.patches.spec_for(release) if variant.patches.varies else ""
        why = f", chosen by {spec!r}" if spec else ""
        lines.append(f"    patch: {variant.patch} (for vLLM {release}{why})")
        if variant.patches.varies:
            lines.append(
                "    patch per tested release: "
                + ", ".join(f"{r} {p.name if p else 'none'}" for r, p in variant.patches.per_tested_release())
            )
    if variant.expects.varies:
        spec = variant.expects.spec_for(release)
        lines.append(f"    expectation: {variant.expected} for vLLM {release} (chosen by {spec!r})")
        lines.append(
            "    expectation per tested release: "
            + ", ".join(f"{r} {e or 'none'}" for r, e in variant.expects.per_tested_release())
        )
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
    plans: Sequence[Sequence[VariantPlan]],
    models: Sequence[Availability] = (),
    checked: Mapping[tuple[str, str], Checked] | None = None,
    memory: Mapping[str, MemoryCheck] | None = None,
) -> str:
    """What `run` would start for one scenario, and what it will measure, as plain text (`specwake check`).
    `checked`: what vLLM said per (scenario file, variant name), where it could check: the model runner it chose,
    the K in force; `memory`: each GPU variant's memory estimate, by "scenario/variant"."""
    lines = [f"{scenario.name}  ({scenario.file})", *measurement_plan(scenario, prepared)]
    lines += [f"  model {m.model}: {m.where}" for m in models]
    for prep, servers in zip(prepared, plans, strict=True):
        engine = prep.engine
        lines.append(f"  variant {prep.variant.name}  (expect {prep.variant.expected_said})")
        lines += _by_release(prep.variant)
        lines.append(f"    interpreter: {engine.python}  (Python {engine.python_version})")
        dists = ", ".join(engine.distributions) or engine.vllm_version
        untested = "" if is_tested(engine.vllm_version) else f"  (untested release; tested: {tested_span()})"
        lines.append(f"    vLLM: {dists} at {engine.package_dir}  platform {engine.platform}{untested}")
        lines.append(f"    entry point: {_ENTRYPOINTS.get(engine.entrypoint, engine.entrypoint)}")
        said = (checked or {}).get((str(scenario.file), prep.variant.name), Checked())
        lines.append(f"    model runner: {runner_choice(prep.variant.model_runner, said.runner, engine.platform)}")
        if said.speculation and prep.variant.speculative:
            lines.append(f"    speculation: {said.speculation}")
        if prep.overlay is not None:
            state = "reused" if prep.overlay.reused else "built"
            lines.append(
                f"    overlay: {prep.overlay.root} ({state}); patched: {', '.join(prep.overlay.patched_files)}"
            )
            if prep.overlay.skipped_files:
                lines.append(f"    skipped (outside vllm/): {', '.join(prep.overlay.skipped_files)}")
        rules = emulated_rules(prep)
        lines.append(f"    L2 discard: {prep.l2_discard}" + (f", {rules_name(rules)}" if rules else ""))
        for r, plan in enumerate(servers):
            if plan.node:
                nodes = scenario.server.nodes
                lines.append(f"    node {plan.node} of {nodes}: its share of the engines, headless, started by:")
                lines.append("    launch: " + shlex.join(plan.launch))
            elif scenario.server.nodes > 1:
                lines.append(f"    node 0 of {scenario.server.nodes} (here): the API server, its share of the engines")
            elif len(servers) > 1:
                balancing = scenario.server.load_balancing
                lines.append(f"    server {r} of {len(servers)} (engine {r}, {balancing} load balancing):")
            where = ",".join(map(str, plan.gpus)) if plan.gpus else ("all visible" if engine.is_gpu else "none (CPU)")
            lines.append(f"    gpus: {where}")
            if plan.cores:
                lines.append(f"    cores: {','.join(map(str, plan.cores))} (the server is confined to them)")
            lines.append("    argv: " + shlex.join(plan.argv))
            for name, value in sorted(redact_env(plan.env_added).items()):
                lines.append(f"    env: {name}={value}")
        ray = overlay_under_ray(scenario, prep)
        for note in [*cpu_no_ops(prep, scenario.cycle.reload_kind.pushes), *([ray] if ray else [])]:
            lines.append(f"    note: {note}")
        fit = (memory or {}).get(key(scenario, prep))
        if fit is not None:
            lines.append(f"    memory: {fit.line}")
        for problem in (prep.platform_problem, fit.problem if fit else None):
            if problem:
                lines.append(f"    NOT RUNNABLE HERE: {problem}")
    return "\n".join(lines)
