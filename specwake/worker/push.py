"""Wake with new weights the way RL trainers do (verl's update_weights_from_ipc, NeMo-RL, TRL): the checkpoint's
tensors pushed into the live models through load_weights / reload_weights(weights_iterator=...), not reloaded
from disk by path. Optionally scaled, so a test can prove the drafter follows the weights it was given.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from specwake.worker.finders import find_draft, find_target


def scaled(weights: Iterator[tuple[str, torch.Tensor]], scale: dict[str, float], seen: list[str]) -> Iterator:
    """The checkpoint's (name, tensor) pairs, those named in `scale` multiplied by their factor (`seen` lists them)."""
    for name, tensor in weights:
        factor = scale.get(name)
        if factor is not None:
            seen.append(name)
            tensor = times(tensor, factor)
        yield name, tensor


def times(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """`tensor` × `factor` in its own dtype. Float8 tensors have no `mul` on CPU (NotImplementedError
    "mul_cpu_reduced_float"), so those are scaled in float32 and cast back."""
    if tensor.is_floating_point() and tensor.element_size() == 1:
        return (tensor.to(torch.float32) * factor).to(tensor.dtype)
    return tensor * factor


def push_draft(runner: Any, scale: dict[str, float], seen: list[str]) -> str:
    """Push the drafter's checkpoint tensors into the live drafter by the rules vLLM's draft reload follows
    (specwake.worker.draft_load, the very file the reference fix adds to vLLM): target modules shared into the drafter
    unbound while it loads, a tied head refilled, fused buffers rebuilt in place, attention scales kept. A plain
    load_weights fails on CPU, where weights were repacked after the first load, and crashes a Gemma4 drafter."""
    from vllm.model_executor.model_loader import get_model_loader

    from specwake.worker.draft_load import load_draft_weights_inplace

    config = runner.vllm_config
    draft, spec = find_draft(runner), config.speculative_config
    if draft is None or spec is None or spec.draft_model_config is None:
        return "no separate drafter"
    try:
        from vllm.model_executor.model_loader.utils import get_draft_load_config

        load_config = get_draft_load_config(config)
    except ImportError:
        load_config = config.load_config
    weights = _all_weights(get_model_loader(load_config))(spec.draft_model_config, draft)
    return "pushed: " + load_draft_weights_inplace(
        draft, find_target(runner), spec.draft_model_config, scaled(weights, scale, seen)
    )


def _all_weights(loader: Any) -> Any:
    get_all = getattr(loader, "get_all_weights", None)
    if get_all is None:
        raise NotImplementedError(f"{type(loader).__name__} cannot iterate a checkpoint's tensors to push them")
    return get_all


def push_target(runner: Any, scale: dict[str, float], seen: list[str]) -> str:
    """Push the target's checkpoint tensors as an RL trainer does: reload_weights(weights_iterator=...)."""
    from vllm.model_executor.model_loader import get_model_loader

    config = runner.vllm_config
    weights = _all_weights(get_model_loader(config.load_config))(config.model_config, runner.get_model())
    runner.reload_weights(weights_iterator=scaled(weights, scale, seen))
    return "pushed"
