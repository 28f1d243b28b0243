"""Loading a speculative drafter's weights in place, next to the target it shares
modules with: one implementation for a reload from the drafter's checkpoint
(`reload_draft_weights` in `reload/inplace.py`) and for weights pushed into a
live drafter (an RL trainer's weight sync).

The rules: target modules the proposer put into the drafter are unbound while
it loads (their tensors never reach the target); a draft `lm_head` tied to a
replaced embedding is refilled from the embedding tensor; DFlash/DSpark fused
buffers are rebuilt after finalizing, and every tensor attribute the load
rebuilt is copied back into the tensor CUDA graphs captured; attention scales
are put back as they were before (finalizing resets them to 1.0).
"""

from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.nn.parameter import UninitializedParameter

from vllm.model_executor.model_loader.reload.layerwise import (
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

__all__ = ["load_draft_weights_inplace"]


def load_draft_weights_inplace(
    draft_model: nn.Module,
    target_model: nn.Module | None,
    draft_model_config: object,
    weights: Iterable[tuple[str, torch.Tensor]],
) -> str:
    """Load `weights` (the drafter checkpoint's names and tensors) into the live
    drafter with vLLM's layerwise reload, every tensor into its old storage.
    Call it *before* reloading the target. Returns what it did, in one line.

    Submodules that the proposer took from the target (embedding, lm_head, MTP
    `shared_head.head`, ...) are unbound from the drafter while it loads, so
    the draft checkpoint never reaches the target's storage (nor its layerwise
    reload state): their checkpoint tensors are dropped, and the target reload
    that follows restores them. A draft `lm_head` tied to the drafter's own
    embedding, which the proposer then replaced by the target's (Gemma4 MTP),
    is refilled from the draft checkpoint's embedding tensor instead.
    """
    target_ids = (
        set(map(id, target_model.modules())) if target_model is not None else set()
    )
    try:  # quantized copies of the target's lm_head (draft_lm_head_quantization)
        from vllm.model_executor.layers.quantization.online.lm_head import (
            restore_quantized_lm_heads,
            share_source_lm_heads,
        )
    except ImportError:  # vLLM < 0.33: no quantized lm_head copies
        restore_quantized_lm_heads = share_source_lm_heads = None

    # Tensors kept as plain attributes (fused buffers, derived copies) as
    # CUDA graphs captured them, before the load rebuilds any of them.
    captured = _plain_tensor_attributes(draft_model)
    # Attention scales as they were before: buffers come back with the wake,
    # the host copies were never discarded. Finalizing re-runs
    # process_weights_after_loading, which resets them to 1.0 (and a proposer
    # may have copied them from the target, as Gemma4's does).
    kv_scales = _kv_scales(draft_model)
    aliases: list[tuple[str, nn.Module, str, nn.Module]] = []
    tied_head = None
    try:
        if share_source_lm_heads is not None:
            # Put the target heads back in place of their derived copies, so
            # they are unbound below; the target reload re-derives the copies.
            share_source_lm_heads(draft_model)
        aliases = _find_target_aliases(draft_model, target_ids)
        tied_head = _find_orphaned_tied_lm_head(draft_model, target_ids)
        # Nothing for layerwise reload to capture in place of target modules.
        for _, parent, name, _ in aliases:
            parent._modules[name] = nn.Module()
        initialize_layerwise_reload(draft_model)
        for _, parent, name, module in aliases:
            sink = _tied_head_loader(tied_head) if _is_input_embedding(module) else None
            parent._modules[name] = _DetachedTargetModule(module, sink)
        draft_model.load_weights(weights)
        finalize_layerwise_reload(draft_model, draft_model_config)
    finally:
        for _, parent, name, module in aliases:
            parent._modules[name] = module
        if restore_quantized_lm_heads is not None:
            restore_quantized_lm_heads(draft_model, refresh=False)

    # DFlash / DSpark drafters stack per-layer weights and cache references to
    # per-layer tensors at the end of load_weights(), when some layers were
    # still on the meta device; rebuild them from the restored tensors.
    for module in draft_model.modules():
        rebuild = getattr(module, "_build_fused_kv_buffers", None)
        if callable(rebuild):
            with _packed_weights_readable(module):
                rebuild()
    # The rebuilds allocate new tensors, but CUDA graphs captured before the
    # sleep read the old addresses: copy the new values into the old tensors.
    copied = _copy_into_captured(captured)
    _restore_kv_scales(kv_scales)
    return (
        f"target modules left to the target reload: {[a[0] for a in aliases]}; "
        f"lm_head tied to a replaced embedding: {tied_head is not None}; "
        f"rebuilt tensor attributes copied back in place: {copied}"
    )


@contextmanager
def _packed_weights_readable(model: nn.Module):
    """vLLM's CPU build packs a linear layer's weight for its kernels and empties
    the parameter (dispatch_cpu_unquantized_gemm); give each such weight its
    values back from the packed copy (x @ W.T on identity rows) while a fused
    buffer is stacked from it. Nothing to do on a GPU."""
    emptied = []
    for layer in model.modules():
        weight = layer._parameters.get("weight")
        packed = vars(layer).get("cpu_linear")
        width = getattr(layer, "input_size_per_partition", None) or getattr(
            layer, "input_size", None
        )
        if weight is None or not callable(packed) or weight.numel() or not width:
            continue
        eye = torch.eye(width, dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            values = packed(eye, weight, None).t().contiguous()
        layer._parameters["weight"] = nn.Parameter(values, requires_grad=False)
        emptied.append((layer, weight))
    try:
        yield
    finally:
        for layer, weight in emptied:
            layer._parameters["weight"] = weight


_KV_SCALE_NAMES = (
    "_q_scale",
    "_k_scale",
    "_v_scale",
    "_prob_scale",
    "_q_scale_float",
    "_k_scale_float",
    "_v_scale_float",
    "_prob_scale_float",
    "_k_scale_cpu",
    "_v_scale_cpu",
)


def _kv_scales(model: nn.Module) -> list[tuple[nn.Module, str, object]]:
    """(module, name, value) of every attention scale the model holds, copied."""
    return [
        (module, name, value.detach().clone() if isinstance(value, torch.Tensor) else value)
        for module in model.modules()
        for name in _KV_SCALE_NAMES
        if (value := getattr(module, name, None)) is not None
    ]


@torch.no_grad()
def _restore_kv_scales(saved: list[tuple[nn.Module, str, object]]) -> None:
    """Put the saved scales back, tensors in place (their storage is captured)."""
    for module, name, value in saved:
        current = getattr(module, name, None)
        if (
            isinstance(value, torch.Tensor)
            and isinstance(current, torch.Tensor)
            and current.shape == value.shape
        ):
            current.copy_(value)
        elif not isinstance(value, torch.Tensor):
            setattr(module, name, value)


def _plain_tensor_attributes(
    model: nn.Module,
) -> list[tuple[nn.Module, str, torch.Tensor]]:
    """(module, name, tensor) for every tensor a module keeps as a plain
    attribute: neither a parameter nor a buffer, so layerwise reload neither
    reloads it nor keeps its storage."""
    return [
        (module, name, value)
        for module in model.modules()
        for name, value in vars(module).items()
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter)
    ]


@torch.no_grad()
def _copy_into_captured(
    captured: list[tuple[nn.Module, str, torch.Tensor]],
) -> int:
    """Put each rebuilt attribute's values into the tensor it replaced and
    rebind that one, as `_copy_and_restore_kernel_tensors` does for parameters
    and buffers. An attribute rebuilt with another shape, dtype or device
    stays new (a graph captured with the old one must be recaptured)."""
    copied = 0
    for module, name, old in captured:
        new = vars(module).get(name)
        if new is old or not isinstance(new, torch.Tensor) or old.is_meta:
            continue
        if (new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
            continue
        if new.data_ptr() != old.data_ptr():
            old.copy_(new)
        vars(module)[name] = old
        copied += 1
    return copied


class _DetachedTargetModule(nn.Module):
    """Stands in for a target module inside the drafter during a draft reload.

    Has the replaced module's parameter and persistent-buffer names, shapes,
    dtypes and devices, as storage-free views, so the drafter's `load_weights`
    resolves checkpoint names as usual; every tensor loaded into it goes to
    `sink` (`weight` only), or is dropped. Other non-callable attributes (sizes,
    non-persistent buffers such as a shared rotary embedding's cos/sin cache)
    read through to the replaced module; its methods are not reachable.
    """

    load_weights = None  # never delegate loading to the target module

    def __init__(
        self,
        module: nn.Module,
        sink: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        super().__init__()
        for name, child in module._modules.items():
            if child is not None:
                self.add_module(name, _DetachedTargetModule(child))
        for name, param in module._parameters.items():
            if param is not None and not isinstance(param, UninitializedParameter):
                stand_in = nn.Parameter(_storage_free(param), requires_grad=False)
                stand_in.weight_loader = _drop_or_sink(
                    sink if name == "weight" else None
                )
                self.register_parameter(name, stand_in)
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in module._non_persistent_buffers_set:
                stand_in = _storage_free(buffer)
                stand_in.weight_loader = _drop_or_sink(None)
                self.register_buffer(name, stand_in)
        # set last: attribute read-through would confuse the registrations above
        object.__setattr__(self, "_stands_in_for", module)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "_stands_in_for" not in self.__dict__:
                raise
            value = getattr(self.__dict__["_stands_in_for"], name)
            if callable(value):
                raise
            return value


def _storage_free(tensor: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=tensor.dtype, device=tensor.device).expand(
        tensor.shape
    )


def _drop_or_sink(sink: Callable[[torch.Tensor], None] | None) -> Callable:
    def weight_loader(
        param: torch.Tensor, loaded_weight: torch.Tensor, *args, **kwargs
    ) -> None:
        if sink is not None and not args and not kwargs:
            sink(loaded_weight)

    return weight_loader


def _find_target_aliases(
    draft_model: nn.Module, target_ids: set[int]
) -> list[tuple[str, nn.Module, str, nn.Module]]:
    """(qualified name, parent, attribute, module) for each drafter submodule that
    *is* a target module (not descending into it)."""
    aliases: list[tuple[str, nn.Module, str, nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", draft_model)]
    while stack:
        prefix, parent = stack.pop()
        if id(parent) in seen:
            continue
        seen.add(id(parent))
        for name, child in parent._modules.items():
            if child is None:
                continue
            qualname = f"{prefix}.{name}" if prefix else name
            if id(child) in target_ids:
                aliases.append((qualname, parent, name, child))
            else:
                stack.append((qualname, child))
    return sorted(aliases, key=lambda alias: alias[0])


def _is_input_embedding(module: nn.Module) -> bool:
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    module = getattr(module, "base_layer", module)  # LoRA wrapper
    return isinstance(module, VocabParallelEmbedding) and not isinstance(
        module, ParallelLMHead
    )


def _find_orphaned_tied_lm_head(
    draft_model: nn.Module, target_ids: set[int]
) -> nn.Module | None:
    """The drafter's own `lm_head` if it is tied to an embedding that is no longer
    part of the drafter: `tie_weights` made it share the drafter embedding's
    parameter (whose weight loader stays bound to that embedding), and the
    proposer then replaced that embedding by the target's (Gemma4 MTP). The
    checkpoint has no `lm_head` tensor for it, only the embedding tensor."""
    head = getattr(draft_model, "lm_head", None)
    if not isinstance(head, nn.Module) or id(head) in target_ids:
        return None
    loader = getattr(getattr(head, "weight", None), "weight_loader", None)
    owner = getattr(loader, "__self__", None)
    if not isinstance(owner, nn.Module) or owner is head or id(owner) in target_ids:
        return None
    if any(module is owner for module in draft_model.modules()):
        return None
    return head


def _tied_head_loader(
    head: nn.Module | None,
) -> Callable[[torch.Tensor], None] | None:
    if head is None:
        return None

    def load(loaded_weight: torch.Tensor) -> None:
        param = head.weight  # the layerwise-reload stand-in, resolved at load time
        if loaded_weight.shape[-1] == param.shape[-1]:
            param.weight_loader(param, loaded_weight)

    return load
