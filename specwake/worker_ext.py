"""Worker extension loaded INSIDE each vLLM worker (--worker-extension-cls): info, fingerprints,
emulated Level-2 discard. Methods are called by name through POST /collective_rpc.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

# What a real Level-2 sleep discards, read from vllm/v1/worker/gpu_worker.py (0.32, 0.33):
# every parameter of the target and of the drafter loses its memory (cumem "weights" tag,
# nothing offloaded), while named buffers of both are copied to CPU before sleeping and
# copied back by wake_up(tags=["weights"]). So the emulation zeroes parameters, not buffers.
DISCARDS_BUFFERS = False


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
def fingerprint(model: torch.nn.Module | None, exclude: set[int] | None = None) -> dict[str, Any]:
    """Cheap per-model summary: one ``.abs().sum()`` per parameter, computed on its device."""
    if model is None:
        return {"present": False}
    exclude = exclude or set()
    tensors = numel = all_zero = on_meta = empty = shared = 0
    checksum = 0.0
    for param in model.parameters():
        tensors += 1
        if param.is_meta:
            on_meta += 1
            continue
        if param.numel() == 0:
            empty += 1
            continue
        if param.data_ptr() in exclude:
            shared += 1
        numel += param.numel()
        if not bool(param.any()):
            all_zero += 1
        checksum += float(param.detach().abs().sum(dtype=torch.float64).item())
    return {
        "present": True,
        "class": type(model).__name__,
        "tensors": tensors,
        "numel": numel,
        "all_zero": all_zero,
        "on_meta": on_meta,
        "empty": empty,
        "shared_with_target": shared,
        "abs_sum": checksum,
    }


def _data_ptrs(model: torch.nn.Module | None) -> set[int]:
    if model is None:
        return set()
    return {p.data_ptr() for p in model.parameters() if not p.is_meta and p.numel() > 0}


class SpecwakeWorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (has ``model_runner``)."""

    model_runner: Any
    rank: int

    def _specwake_runner(self) -> Any:
        return getattr(self, "model_runner", None)

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

    def specwake_fingerprint(self) -> dict[str, Any]:
        models = named_models(self._specwake_runner())
        target_ptrs = _data_ptrs(models["target"])
        return {
            "target": fingerprint(models["target"]),
            "draft": fingerprint(models["draft"], exclude=target_ptrs),
        }

    def specwake_memory(self) -> dict[str, Any]:
        """Free/total accelerator memory of this rank in bytes; None on CPU (no device memory to report)."""
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        if device is None:
            return {"device": "cpu", "free_bytes": None, "total_bytes": None}
        free, total = torch.cuda.mem_get_info(device)
        return {"device": f"cuda:{device}", "free_bytes": int(free), "total_bytes": int(total)}

    @torch.no_grad()
    def specwake_emulate_discard(self) -> dict[str, Any]:
        """Zero every parameter of target and drafter (shared storage once), like L2 sleep."""
        models = named_models(self._specwake_runner())
        zeroed = elements = skipped = 0
        for param in unique_parameters([models["target"], models["draft"]]):
            if param.is_meta or param.numel() == 0:
                skipped += 1
                continue
            param.data.zero_()
            zeroed += 1
            elements += param.numel()
        return {
            "zeroed_tensors": zeroed,
            "zeroed_elements": elements,
            "skipped_tensors": skipped,
            "buffers_zeroed": DISCARDS_BUFFERS,
            "draft_present": models["draft"] is not None,
        }
