"""GPU memory before launch: each variant's weights per GPU, from its checkpoints' safetensors headers and the
scenario's parallel layout, held against what vLLM will claim of a GPU and what is free there. `check` prints one line
per variant; `check` and `run` refuse (exit 3), before any server starts, a layout vLLM could not load, which it would
find only at load, after minutes.

Estimated: the weights as vLLM loads them (a floating-point tensor at the model's dtype, a quantized one as stored), the
routed experts spread over the expert-parallel ranks, everything else over the tensor-parallel ones; what vLLM claims
of each GPU, gpu_memory_utilization × its total memory. What is left of that claim holds activations, CUDA graphs and
the KV cache, none of which is estimated (vLLM sizes its KV cache from what it measures after loading).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwake.errors import PlatformMismatch
from specwake.events import Event, Events
from specwake.prepare.checkpoint import own_draft_model, safetensors_files, safetensors_header
from specwake.prepare.engine import GpuMemory, gpu_memory
from specwake.prepare.plan import data_parallel, flag_values, model_flags
from specwake.prepare.releases import release_at_least
from specwake.prepare.scenario import Scenario
from specwake.prepare.variants import PreparedVariant

GIB = 1 << 30
SAFETENSORS_INDEX = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME, what vLLM's loader reads
EXPERTS = ".experts."  # a routed expert's tensor (model.layers.N.mlp.experts.E.…); shared_experts are not routed
FLOATING = {"F16", "BF16", "F32", "F64"}  # safetensors dtypes vLLM casts to the model's dtype as it loads them
# On a GPU vLLM's dtype "auto" keeps a 16-bit checkpoint's dtype and downcasts a float32 one to 16 bits
# (vllm/config/model.py _resolve_auto_dtype: 0.32:2422-2424, 0.33:2440-2442, 0.34:2484-2486): 4 bytes only if asked.
WIDE_DTYPES = {"float", "float32"}
# gpu_memory_utilization when none is given (vllm/config/cache.py: 0.32:102, 0.33:215, 0.34:186 and 495-501). From
# 0.34 vLLM reserves its KV cache with driver virtual memory (enable_extensible_kv_cache, on by default on CUDA and
# ROCm unless the KV cache is sized by hand: config/vllm.py 0.34:3180-3263); its default utilization is then 1.0, and
# it no longer refuses a GPU whose free memory is below its claim (v1/worker/utils.py 0.34:784-799).
DEFAULT_UTILIZATION = 0.92
EXTENSIBLE_KV_SINCE = "0.34"
KV_SIZED_BY = ("--kv-cache-memory-bytes", "--num-gpu-blocks-override")
# vLLM's own refusal at startup, before it loads (v1/worker/utils.py request_memory: 0.32/0.33:761-766, 0.34:784-799).
VLLM_REFUSES = "Free memory on device … is less than desired GPU memory utilization"


def gib(size: float) -> str:
    return f"{size / GIB:.2f} GiB"


@dataclass(frozen=True)
class Weights:
    """A checkpoint's bytes as vLLM loads them: its routed experts' tensors and all the others."""

    experts: int
    other: int


def tensor_bytes(entry: Mapping[str, Any], element: int) -> int:
    """One safetensors header entry's bytes on the GPU: a floating-point tensor at `element` bytes an element, any
    other (FP8, integer-packed) as stored."""
    if entry["dtype"] in FLOATING:
        return math.prod(int(n) for n in entry["shape"]) * element
    start, end = entry["data_offsets"]
    return int(end) - int(start)


def loaded_files(files: list[Path]) -> list[Path]:
    """The safetensors files vLLM's loader reads of a folder's: those its index's weight_map names where it has one
    (a repository may also ship a consolidated copy: vllm/model_executor/model_loader/weight_utils.py
    filter_duplicate_safetensors_files, 0.34:620-645), else all."""
    folder = files[0].parent
    try:
        named = {folder / name for name in json.loads((folder / SAFETENSORS_INDEX).read_text())["weight_map"].values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return files
    return [file for file in files if file in named]


def read_weights(model: str, element: int) -> Weights | str:
    """A model's weights from its safetensors headers on this machine (never a download); or why they are unknown."""
    files = safetensors_files(model)
    if isinstance(files, str):
        return f"{model}: {files}"
    experts = other = 0
    try:
        for file in loaded_files(files):
            for name, entry in safetensors_header(file).items():
                size = tensor_bytes(entry, element)
                experts, other = (experts + size, other) if EXPERTS in name else (experts, other + size)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{model}: unreadable safetensors header ({exc})"
    return Weights(experts, other)


@dataclass(frozen=True)
class Spread:
    """How a model's weights are split over a server's GPUs: everything over `tp` ranks, routed experts over
    `expert_ranks` (TP × DP with expert parallelism in one data-parallel group, else TP)."""

    tp: int
    expert_ranks: int

    def per_gpu(self, weights: Weights) -> int:
        return -(-weights.other // self.tp) + -(-weights.experts // self.expert_ranks)

    def says(self, weights: Weights) -> str:
        """`32.00 GiB over TP 2`, or with experts spread apart `684.78 GiB: experts 619.58 GiB over 8 ranks, …`."""
        total = gib(weights.experts + weights.other)
        if weights.experts and self.expert_ranks != self.tp:
            experts = f"experts {gib(weights.experts)} over {self.expert_ranks} ranks"
            return f"{total}: {experts}, the rest over TP {self.tp}"
        return f"{total} over TP {self.tp}" if self.tp > 1 else f"{total} on one GPU"


def spread(scenario: Scenario, tp: int) -> Spread:
    server = scenario.server
    ep = server.enable_expert_parallel and data_parallel(scenario)
    return Spread(tp, tp * server.data_parallel_size if ep else tp)


@dataclass(frozen=True)
class Claim:
    """What vLLM claims of each GPU: `fraction` of its total memory, for weights, activations and KV cache."""

    fraction: float
    source: str  # where the fraction comes from, for the line
    checks_free: bool  # vLLM refuses at startup a GPU whose free memory is below the claim

    def of(self, gpu: GpuMemory) -> int:
        return math.ceil(gpu.total * self.fraction)  # as vLLM's request_memory rounds it


def _last_switch(args: Sequence[str], on: str, off: str) -> bool | None:
    said = [word for word in args if word in (on, off)]
    return said[-1] == on if said else None


def vllm_claim(version: str, args: Sequence[str]) -> Claim | str:
    """The claim vLLM `version` makes with the server's `args`; or why it is not gpu_memory_utilization's."""
    sized = [flag for flag in KV_SIZED_BY if flag_values(args, flag)]
    if sized:
        return f"{sized[0]} sizes the KV cache, not gpu_memory_utilization"
    asked = flag_values(args, "--gpu-memory-utilization")
    extensible = release_at_least(version, EXTENSIBLE_KV_SINCE) and _last_switch(
        args, "--enable-extensible-kv-cache", "--no-enable-extensible-kv-cache"
    ) in (None, True)
    if asked:
        try:
            return Claim(float(asked[-1]), f"gpu_memory_utilization {float(asked[-1]):g}", not extensible)
        except ValueError:
            return f"--gpu-memory-utilization {asked[-1]!r} is no number"
    if extensible:
        return Claim(1.0, f"vLLM {version}'s default 1 (extensible KV cache)", False)
    return Claim(DEFAULT_UTILIZATION, f"vLLM {version}'s default {DEFAULT_UTILIZATION:g}", True)


@dataclass(frozen=True)
class Estimate:
    """One variant's server: its weights per GPU, how they were counted, what vLLM claims, and what spreads them."""

    weights: int  # bytes per GPU
    how: str
    claim: Claim
    spread_by: str  # the scenario keys that spread the weights over more GPUs


def estimate(scenario: Scenario, prep: PreparedVariant) -> Estimate | str:
    """A GPU variant's memory per GPU; or why it cannot be estimated here (then nothing is refused)."""
    server = scenario.server
    args = [*model_flags(scenario, True), *server.args, *prep.variant.args]
    for flags in (("--quantization", "-q"), ("--pipeline-parallel-size", "-pp")):
        if flag_values(args, *flags):
            return f"{flags[0]} in the args changes how the weights load, which is not estimated"
    claim = vllm_claim(prep.engine.vllm_version, args)
    if isinstance(claim, str):
        return claim
    element = 4 if flag_values(args, "--dtype")[-1] in WIDE_DTYPES else 2
    target = read_weights(prep.model, element)
    if isinstance(target, str):
        return f"target {target}"
    layout = spread(scenario, server.tensor_parallel_size)
    weights = layout.per_gpu(target)
    how = f"target {layout.says(target)}"
    draft = own_draft_model(scenario, prep.draft_model) if prep.variant.speculative else None
    if draft is not None:
        drafter = read_weights(draft, element)
        if isinstance(drafter, str):
            return f"drafter {drafter}"
        draft_layout = spread(scenario, int(scenario.speculative.get("draft_tensor_parallel_size") or layout.tp))
        weights += draft_layout.per_gpu(drafter)
        how += f" + drafter {draft_layout.says(drafter)}"
    keys = "server.tensor_parallel_size"
    if target.experts and layout.expert_ranks != layout.tp:
        keys += " or server.data_parallel_size (the experts)"
    return Estimate(weights, how, claim, keys)


def misfit(est: Estimate, gpu: GpuMemory) -> str | None:
    """Why a server with this estimate cannot start on `gpu`, or None where nothing here says it cannot."""
    claimed = est.claim.of(gpu)
    if est.weights >= claimed:
        raising = est.claim.fraction < 1 and est.weights < gpu.total
        raise_it = " or raise server.gpu_memory_utilization" if raising else ""
        return (
            f"its weights, {gib(est.weights)} per GPU, do not fit the {gib(claimed)} vLLM claims of GPU {gpu.index}"
            f" ({est.claim.source} × {gib(gpu.total)}), with nothing left for activations and the KV cache: spread"
            f" them with {est.spread_by}{raise_it}"
        )
    if est.weights > gpu.free:
        return (
            f"GPU {gpu.index} has {gib(gpu.free)} free of {gib(gpu.total)}, less than the weights' {gib(est.weights)}"
            " per GPU: free it, or leave it out with --gpus"
        )
    if est.claim.checks_free and gpu.free < claimed:
        lower = math.floor(gpu.free / gpu.total * 100) / 100
        return (
            f"GPU {gpu.index} has {gib(gpu.free)} free of {gib(gpu.total)}, less than the {gib(claimed)} vLLM claims"
            f" ({est.claim.source}), which vLLM refuses as it starts ('{VLLM_REFUSES}'): set"
            f" server.gpu_memory_utilization to {lower:g} or less, or free the GPU"
        )
    return None


@dataclass(frozen=True)
class MemoryCheck:
    """One variant's line for `check`, and why it cannot run on these GPUs, if so."""

    line: str
    problem: str | None = None


def judge(est: Estimate | str, gpus: Sequence[GpuMemory] | str) -> tuple[str, str | None]:
    """The line and the misfit of one variant against every one of `gpus` (the packer may place its server on any
    of them): the first GPU that cannot hold it, else the one with the least free memory."""
    if isinstance(est, str):
        return f"not estimated: {est}", None
    if isinstance(gpus, str):
        return f"weights {gib(est.weights)} per GPU ({est.how}); not held against the GPUs: {gpus}", None
    found = [(gpu, misfit(est, gpu)) for gpu in gpus]
    gpu, problem = next(((g, p) for g, p in found if p), min(found, key=lambda f: f[0].free))
    line = (
        f"weights {gib(est.weights)} per GPU ({est.how}); vLLM claims {gib(est.claim.of(gpu))} of GPU {gpu.index}"
        f" ({est.claim.source} × {gib(gpu.total)}); {gib(gpu.free)} free there"
        + (f" (the least of {len(gpus)})" if len(gpus) > 1 and not problem else "")
    )
    return line + (" — does not fit" if problem else " — fits"), problem


def check_memory(
    scenarios: Sequence[Scenario], prepared: Sequence[Sequence[PreparedVariant]], gpus: Sequence[int]
) -> dict[str, MemoryCheck]:
    """Every GPU variant's estimate held against each of `gpus`, keyed "scenario/variant". The GPUs' memory is read
    once, through the first such variant's interpreter, and only where some estimate is known."""
    estimates = {
        f"{s.name}/{p.variant.name}": (s, p, estimate(s, p))
        for s, variants in zip(scenarios, prepared, strict=True)
        for p in variants
        if p.engine.is_gpu
    }
    known = [p for _, p, est in estimates.values() if not isinstance(est, str)]
    memory: list[GpuMemory] | str = "no GPU to hold them against"
    if known and gpus:
        memory = gpu_memory(known[0].engine.python, gpus)
    checks = {}
    for key, (scenario, _, est) in estimates.items():
        line, problem = judge(est, memory)
        where = f"{scenario.file}: variant {key.split('/', 1)[1]}: does not fit the GPUs' memory: "
        checks[key] = MemoryCheck(line, where + problem if problem else None)
    return checks


def refuse_short_memory(
    scenarios: Sequence[Scenario], prepared: Sequence[Sequence[PreparedVariant]], gpus: Sequence[int], events: Events
) -> None:
    """`run`: each GPU variant's estimate said, then PlatformMismatch (exit 3) for the first that cannot fit."""
    checks = check_memory(scenarios, prepared, gpus)
    for key, check in checks.items():
        events(Event(f"memory: {check.line}", key))
    for check in checks.values():
        if check.problem:
            raise PlatformMismatch(check.problem)
