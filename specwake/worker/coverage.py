"""Which parameters of a model its checkpoint does not cover: those no load writes. The model's own `load_weights` runs
once more, dry, over the checkpoint's names with shape-only (meta) tensors, every parameter's weight loader replaced by
one that notes the parameter and writes nothing; the parameters never noted are the uncovered ones.

Why it matters: an L2 sleep discards every parameter, and vLLM's layerwise reload leaves a module that loaded no weights
as it was (`finalize_layerwise_processing`, model_loader/reload/layerwise.py), so after a CUDA wake such a parameter
holds whatever memory cuMem handed back (zeroed on ROCm only, device_allocator/cumem.py). DSpark's `mask_embedding`
is one (qwen3_dflash.py registers it, qwen3_dspark.py's `load_weights` skips it and its forward never reads it). No fix
can restore what no load writes, so its checksum decides nothing; whether the forward reads it shows in AL and outputs.

The dry run is exact for the paths vLLM's loaders take: `AutoWeightsLoader` and the models' own loops call
`param.weight_loader` (default_weight_loader when unset, which is replaced too). A load path that writes checkpoint data
in some other way writes a meta tensor into a real one, which raises: the coverage is then unknown, and nothing is
excluded. A parameter registered after vLLM built the model (by `process_weights_after_loading`) is derived, not
uncovered (`constructed`). A parameter whose weight loader is bound to a module the proposer swapped out of the
drafter counts as covered: the first load wrote it before the swap (`_loaded_before`). Everything the run changes on
the live model (module attributes such as DFlash's fused buffers, submodules, parameter entries) is put back as it
was; checkpoint data is never read, only safetensors headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

MISSING = object()
# safetensors' dtype names; one of an unknown name reads as bytes (the dry run never looks at values)
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


def checkpoint_names(vllm_config: Any, model_config: Any, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as `load_weights` receives them, each as a meta tensor of its shape and dtype (read
    from the safetensors headers: no data). The files and names are the ones the weight-transfer engine resolves
    (specwake.worker.transfer.weight_sources: vLLM's default loader's sources, prefixes and unused names)."""
    from safetensors import safe_open

    from specwake.worker.transfer import session_load_config, weight_sources

    for source in weight_sources(model, model_config, session_load_config(vllm_config, model_config)):
        for file in source.files:
            wanted = set(source.names(file))
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if name not in wanted:
                        continue
                    part = handle.get_slice(name)
                    dtype = DTYPES.get(part.get_dtype(), torch.uint8)
                    yield source.prefix + name, torch.empty(part.get_shape(), dtype=dtype, device="meta")


def _snapshot(model: torch.nn.Module) -> list[tuple[torch.nn.Module, dict[str, Any], list[dict[str, Any]]]]:
    """Every module's attributes and its parameter, buffer and submodule entries, to put back after the dry run."""
    return [
        (m, dict(vars(m)), [dict(m._parameters), dict(m._buffers), dict(m._modules)])  # noqa: SLF001
        for m in model.modules()
    ]


def _restore(saved: list[tuple[torch.nn.Module, dict[str, Any], list[dict[str, Any]]]]) -> None:
    for module, attributes, entries in saved:
        vars(module).clear()
        vars(module).update(attributes)
        lives: tuple[dict[str, Any], ...] = (module._parameters, module._buffers, module._modules)  # noqa: SLF001
        for live, before in zip(lives, entries, strict=True):
            live.clear()
            live.update(before)


Constructed = set[tuple[int, str]]  # (id of a module, name of a parameter it registered when it was built)


def recorded(model: torch.nn.Module) -> dict[int, frozenset[str]] | None:
    """The parameters each module had when vLLM built the model, before any load, by the module's id: `initialize_model`
    records them for the layerwise reload (`record_metadata_for_reloading`, model_loader/utils.py:102 in 0.33). None
    when this vLLM keeps no such record; a module it recorded nothing for is absent."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return None
    found = {}
    for module in model.modules():
        info = LAYERWISE_INFO.get(module)
        if info is not None:
            found[id(module)] = frozenset(info.restore_metadata[0])
    return found


def constructed(model: torch.nn.Module) -> Constructed | None:
    """The parameters each module had when vLLM built the model (`recorded`), as (module id, name) pairs. A parameter
    registered later, by `process_weights_after_loading` (MLA's `W_UK_T` / `W_UV`), is derived from loaded ones and
    re-derived by every reload: not one no load writes. None when this vLLM keeps no such record."""
    found = recorded(model)
    return None if found is None else {(module, name) for module, names in found.items() for name in names}


def uncovered(
    model: torch.nn.Module, weights: Iterator[tuple[str, torch.Tensor]], built: Constructed | None = None
) -> list[str]:
    """Names of `model`'s parameters (one per shared parameter, as `named_parameters` gives them) that no weight
    loader is asked to write while `model.load_weights(weights)` runs, of those in `built` when given (see
    `constructed`); raises what the dry run raised."""
    params = dict(model.named_parameters())
    noted: set[int] = set()

    def note(param: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
        noted.add(id(param))
        return True  # FusedMoE's loaders answer `return_success=True` callers: this expert was taken

    # buffers too: AutoWeightsLoader loads a checkpoint's buffers (Gemma4's `layer_scalar`) through the same lookup
    tensors = [*params.values(), *(b for _, b in model.named_buffers())]
    loaders = [(t, getattr(t, "weight_loader", MISSING)) for t in tensors]
    saved = _snapshot(model)
    try:
        for param, _ in loaders:
            param.weight_loader = note  # type: ignore[attr-defined]
        with torch.no_grad():
            model.load_weights(weights)  # type: ignore[operator]
    finally:
        for param, loader in loaders:
            if loader is MISSING:  # a plain attribute, or vLLM's BasevLLMParameter property: both delete
                del param.weight_loader  # type: ignore[attr-defined]
            else:
                param.weight_loader = loader  # type: ignore[attr-defined]
        _restore(saved)
    modules = {id(m) for m in model.modules()}
    before = {id(p): loader for p, loader in loaders}
    found = [n for n, p in params.items() if id(p) not in noted and not _loaded_before(before[id(p)], modules)]
    return sorted(n for n in found if built is None or _owner(model, n) in built)


def _owner(model: torch.nn.Module, name: str) -> tuple[int, str]:
    path, _, local = name.rpartition(".")
    return id(model.get_submodule(path)), local


def _loaded_before(loader: Any, modules: set[int]) -> bool:
    """Whether a parameter's weight loader belongs to a module that is no longer part of the model: a drafter's lm_head
    tied to its own embedding, which the proposer then replaced by the target's (Gemma4's assistant). The first load
    wrote it through that embedding, before the proposer rearranged the model; the dry run sees only the new shape."""
    owner = getattr(loader, "__self__", None)
    return isinstance(owner, torch.nn.Module) and id(owner) not in modules
