"""The worker extension vLLM mixes into each of its workers (`--worker-extension-cls`): info, weight
fingerprints compared with the fresh ones, device memory, and the emulated Level-2 discard. specwake calls
its methods by name through POST /collective_rpc; every answer is plain JSON (no NaN, no torch types).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch

# What a real Level-2 sleep discards, read from vllm/v1/worker/gpu_worker.py (0.32, 0.33): every parameter of
# the target and of the drafter loses its memory (cumem "weights" tag, nothing offloaded), while named buffers
# are copied to CPU before sleeping and back by wake_up(tags=["weights"]). So the emulation fills parameters,
# not buffers. CUDA does not clear the memory it hands back on wake (only ROCm zeroes it), so a parameter that
# is never reloaded holds whatever was there: `fill` chooses zeros, NaN or random values.
DISCARDS_BUFFERS = False
FILLS = ("zero", "nan", "random")
FILL_SEED = 52479  # random fills are reproducible
CHUNK = 1 << 22  # elements converted to float64 at a time: a checksum never needs much extra memory
DIFFER_NAMES = 5  # names of differing tensors returned, at most
REL_TOLERANCE = 1e-9  # checksums of the same bytes, summed in the same order, agree far closer than this


def _unwrap(model: Any) -> torch.nn.Module | None:
    """The raw nn.Module behind a CUDA-graph / ubatch wrapper (or None)."""
    for _ in range(4):
        if model is None or isinstance(model, torch.nn.Module):
            break
        inner = getattr(model, "unwrap", None)
        model = inner() if callable(inner) else getattr(model, "runnable", None)
    return model if isinstance(model, torch.nn.Module) else None


def find_target(runner: Any) -> torch.nn.Module | None:
    get_model = getattr(runner, "get_model", None)
    if callable(get_model):
        try:
            return _unwrap(get_model())
        except ValueError:  # V1 runner before load_model()
            return None
    return _unwrap(getattr(runner, "model", None))


def find_draft(runner: Any) -> torch.nn.Module | None:
    """The drafter's model: get_draft_model() (0.32+), else V1 drafter.model / V2 speculator.model."""
    get_draft = getattr(runner, "get_draft_model", None)
    if callable(get_draft):
        found = _unwrap(get_draft())
        if found is not None:
            return found
    for owner in ("drafter", "speculator"):
        holder = getattr(runner, owner, None)
        found = _unwrap(getattr(holder, "model", None)) if holder is not None else None
        if found is not None:
            return found
    return None


def named_models(runner: Any) -> dict[str, torch.nn.Module | None]:
    return {"target": find_target(runner), "draft": find_draft(runner)}


def unique_parameters(models: list[torch.nn.Module | None]) -> Iterator[torch.Tensor]:
    """Every parameter of ``models`` once, shared storage (same data_ptr) included once."""
    seen: set[tuple[int, str]] = set()
    for model in models:
        if model is None:
            continue
        for param in model.parameters():
            key = (param.data_ptr(), str(param.device))
            if param.is_meta or param.numel() == 0:
                yield param
                continue
            if key in seen:
                continue
            seen.add(key)
            yield param


@torch.no_grad()
def checksum(tensor: torch.Tensor) -> tuple[float | None, int, bool]:
    """(sum of |x| over the finite elements, or None when some element is not finite; non-finite element count;
    whether every element is zero). Converts chunk by chunk, so float8 and int tensors work on any device."""
    flat = tensor.detach().reshape(-1)
    total, nonfinite, nonzero = 0.0, 0, False
    for chunk in flat.split(CHUNK):
        values = chunk.to(torch.float64)
        finite = torch.isfinite(values)
        nonfinite += int((~finite).sum().item())
        values = torch.where(finite, values, torch.zeros_like(values))
        nonzero = nonzero or bool(values.any().item()) or not bool(finite.all().item())
        total += float(values.abs().sum().item())
    return (None if nonfinite else total), nonfinite, not nonzero


def _differs(now: float | None, then: float | None) -> bool:
    if now is None or then is None:
        return now is not then
    return abs(now - then) > REL_TOLERANCE * max(1.0, abs(then))


def fingerprint(
    model: torch.nn.Module | None,
    *,
    exclude: set[int] | None = None,
    reference: dict[str, float | None] | None = None,
    keep: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    """Per-model summary of its parameters. `exclude`: data pointers owned by another model (counted as shared).
    `reference`: checksums by parameter name to compare with; `keep`: filled with this call's checksums."""
    if model is None:
        return {"present": False}
    exclude = exclude or set()
    counts = dict.fromkeys(("tensors", "numel", "all_zero", "on_meta", "empty", "shared_with_target", "nonfinite"), 0)
    total = 0.0
    compared, differ = 0, []
    for name, param in model.named_parameters():
        counts["tensors"] += 1
        if param.is_meta:
            counts["on_meta"] += 1
            continue
        if param.numel() == 0:
            counts["empty"] += 1  # e.g. CPU linear layers, whose weights live in packed oneDNN handles
            continue
        counts["shared_with_target"] += param.data_ptr() in exclude
        counts["numel"] += param.numel()
        value, nonfinite, all_zero = checksum(param)
        counts["nonfinite"] += nonfinite > 0
        counts["all_zero"] += all_zero
        total += value or 0.0
        if keep is not None:
            keep[name] = value
        if reference is not None and name in reference:
            compared += 1
            if _differs(value, reference[name]):
                differ.append(name)
    packed, packed_discarded = packed_state(model)
    summary: dict[str, Any] = {
        "present": True,
        "class": type(model).__name__,
        **counts,
        "packed": packed,
        "packed_discarded": packed_discarded,
        "abs_sum": total,
    }
    if reference is not None:
        summary.update(compared=compared, differ=len(differ), differ_names=differ[:DIFFER_NAMES])
    return summary


def _data_ptrs(model: torch.nn.Module | None) -> set[int]:
    if model is None:
        return set()
    return {p.data_ptr() for p in model.parameters() if not p.is_meta and p.numel() > 0}


@torch.no_grad()
def fill_discarded(param: torch.Tensor, fill: str, generator: torch.Generator) -> None:
    """Overwrite a parameter as a discard leaves it: zeros, NaN (floating point only; others get zeros), or
    random values (normal for floating point, uniform bytes for integers)."""
    data = param.data
    if fill == "zero" or (fill == "nan" and not data.is_floating_point()):
        data.zero_()
    elif fill == "nan":
        data.fill_(float("nan"))
    elif data.is_floating_point():
        data.copy_(torch.randn(data.shape, generator=generator, dtype=torch.float32).to(data.device, data.dtype))
    else:
        data.copy_(
            torch.randint(0, 256, data.shape, generator=generator, dtype=torch.int64).to(data.device, data.dtype)
        )


PACKED_MARK = "_specwake_discarded"


def discard_packed(module: torch.nn.Module, fill: str, generator: torch.Generator) -> bool:
    """vLLM's CPU build computes linear layers and lm_heads from a packed copy of the weight (oneDNN / sgl
    kernels) behind a `cpu_linear` closure that process_weights_after_loading installs; emptying the parameter
    does not reach that copy, a real discard would. So the closure is wrapped to answer as the discarded weight
    would (zeros, NaN or noise) until a reload installs a fresh one. False when there is nothing to wrap."""
    packed = getattr(module, "cpu_linear", None)
    if packed is None or getattr(packed, PACKED_MARK, False):
        return False

    def discarded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = packed(x, weight, bias)
        if fill == "zero":
            return out.zero_()
        if fill == "nan":
            return out.fill_(float("nan"))
        return out.copy_(torch.randn(out.shape, generator=generator, dtype=torch.float32).to(out.dtype))

    setattr(discarded, PACKED_MARK, True)
    vars(module)["cpu_linear"] = discarded  # a plain attribute, where vLLM keeps it too
    return True


def packed_state(model: torch.nn.Module | None) -> tuple[int, int]:
    """(modules computing from a packed CPU copy of their weight, those whose copy is still discarded)."""
    if model is None:
        return 0, 0
    packed = [getattr(m, "cpu_linear", None) for m in model.modules()]
    present = [fn for fn in packed if fn is not None]
    return len(present), sum(1 for fn in present if getattr(fn, PACKED_MARK, False))


class SpecwakeWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (has ``model_runner``)."""

    model_runner: Any
    rank: int

    def _specwake_runner(self) -> Any:
        return getattr(self, "model_runner", None)

    def _specwake_references(self) -> dict[str, dict[str, dict[str, float | None]]]:
        """Saved checksums: reference name → model ("target" / "draft") → parameter name → checksum."""
        refs = getattr(self, "_specwake_refs", None)
        if refs is None:
            refs = {}
            self._specwake_refs = refs
        return refs

    def specwake_info(self) -> dict[str, Any]:
        import vllm

        models = named_models(self._specwake_runner())
        target, draft = models["target"], models["draft"]
        device = next(target.parameters()).device.type if target is not None else None
        world_size: int | None = None
        tp_rank: int | None = None
        try:
            from vllm.distributed import parallel_state

            tp_group = parallel_state.get_tp_group()
            tp_rank, world_size = tp_group.rank_in_group, tp_group.world_size
        except (AssertionError, AttributeError, ImportError):
            tp_rank = getattr(self, "rank", None)
        return {
            "device": device,
            "vllm_version": str(getattr(vllm, "__version__", None)),
            "vllm_file": getattr(vllm, "__file__", None),
            "torch_version": str(torch.__version__),  # TorchVersion breaks msgspec
            "target_class": type(target).__name__ if target is not None else None,
            "draft_class": type(draft).__name__ if draft is not None else None,
            "runner_class": type(self._specwake_runner()).__name__,
            "tp_rank": tp_rank,
            "world_size": world_size,
        }

    def specwake_fingerprint(self, save_as: str | None = None, compare_to: str | None = None) -> dict[str, Any]:
        """Summaries of target and drafter weights. `save_as`: remember this call's checksums under that name;
        `compare_to`: count the tensors whose checksum differs from the ones saved under that name."""
        models = named_models(self._specwake_runner())
        refs = self._specwake_references()
        saved = refs.get(compare_to or "", {}) if compare_to else None
        answer: dict[str, Any] = {}
        kept: dict[str, dict[str, float | None]] = {}
        for role in ("target", "draft"):
            kept[role] = {}
            answer[role] = fingerprint(
                models[role],
                exclude=_data_ptrs(models["target"]) if role == "draft" else None,
                reference=None if saved is None else saved.get(role, {}),
                keep=kept[role],
            )
        if save_as:
            refs[save_as] = kept
        return answer

    def specwake_memory(self) -> dict[str, Any]:
        """Free/total accelerator memory of this rank in bytes; None on CPU (no device memory to report)."""
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        if device is None:
            return {"device": "cpu", "free_bytes": None, "total_bytes": None}
        free, total = torch.cuda.mem_get_info(device)
        return {"device": f"cuda:{device}", "free_bytes": int(free), "total_bytes": int(total)}

    def specwake_push(self, request: str = "{}") -> dict[str, Any]:
        """Wake with new weights the way RL frameworks do (verl's update_weights_from_ipc): tensors pushed into the
        live models through load_weights, not reload_weights from disk. `request` is JSON, as /collective_rpc
        passes strings: {"to": ["target"] | ["target", "draft"], "scale": {tensor name: factor}}. The drafter
        goes first, the target last, so modules they share end up with the target's tensors."""
        from specwake.worker import push  # imports this module: a top-level import would be circular

        spec = json.loads(request)
        to, scale = list(spec.get("to") or ["target"]), dict(spec.get("scale") or {})
        runner = self._specwake_runner()
        seen: list[str] = []
        done = {}
        if "draft" in to:
            done["draft"] = push.push_draft(runner, scale, seen)
        if "target" in to:
            done["target"] = push.push_target(runner, scale, seen)
        unmatched = sorted(set(scale) - set(seen))
        if unmatched:  # a typo would otherwise push unperturbed weights and judge a perturbed push on them
            raise ValueError(f"push_scale names no pushed tensor: {', '.join(unmatched)}")
        return {"pushed": done, "scaled": sorted(set(seen))}

    @torch.no_grad()
    def specwake_emulate_discard(self, fill: str = "zero") -> dict[str, Any]:
        """Overwrite every parameter of target and drafter (shared storage once) as a real L2 sleep leaves it."""
        if fill not in FILLS:
            raise ValueError(f"fill must be one of {', '.join(FILLS)}, got {fill!r}")
        models = named_models(self._specwake_runner())
        generator = torch.Generator().manual_seed(FILL_SEED)
        filled = elements = skipped = 0
        for param in unique_parameters([models["target"], models["draft"]]):
            if param.is_meta or param.numel() == 0:
                skipped += 1
                continue
            fill_discarded(param, fill, generator)
            filled += 1
            elements += param.numel()
        packed = sum(
            discard_packed(module, fill, generator)
            for model in (models["target"], models["draft"])
            if model is not None
            for module in model.modules()
        )
        return {
            "fill": fill,
            "filled_tensors": filled,
            "filled_elements": elements,
            "skipped_tensors": skipped,
            "packed_filled": packed,
            "buffers_filled": DISCARDS_BUFFERS,
            "draft_present": models["draft"] is not None,
        }
