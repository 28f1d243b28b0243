"""Wake with new weights the way RL trainers do (verl's update_weights_from_ipc, NeMo-RL, TRL): the checkpoint's
tensors pushed into the live models through load_weights / reload_weights(weights_iterator=...), not reloaded
from disk by path. Optionally perturbed or partial (push_scale, push_skip): the tensors each model's `Chosen` names
scaled on the way or left out, so a test can prove the drafter follows the weights it was given, or catch a push
that gets the drafter wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from specwake.protocol import Chosen
from specwake.worker.finders import find_draft, find_target


@dataclass
class Seen:
    """The names one model's push met: all of them, those it scaled and those it left out."""

    names: set[str] = field(default_factory=set)
    scaled: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def sent(weights: Iterator[tuple[str, torch.Tensor]], chosen: Chosen, seen: Seen) -> Iterator:
    """The checkpoint's (name, tensor) pairs as the push sends them: those `chosen` leaves out dropped, those it
    scales multiplied by their factor (`seen` notes every name, and both kinds)."""
    for name, tensor in weights:
        seen.names.add(name)
        if name in chosen.left_out:
            seen.skipped.append(name)
            continue
        factor = chosen.scale.get(name)
        if factor is not None:
            seen.scaled.append(name)
            tensor = times(tensor, factor)
        yield name, tensor


def times(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """`tensor` × `factor` in its own dtype. Float8 tensors have no `mul` on CPU (NotImplementedError
    "mul_cpu_reduced_float"), so those are scaled in float32 and cast back."""
    if tensor.is_floating_point() and tensor.element_size() == 1:
        return (tensor.to(torch.float32) * factor).to(tensor.dtype)
    return tensor * factor


def push_draft(runner: Any, chosen: Chosen, seen: Seen) -> str:
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
        draft, find_target(runner), spec.draft_model_config, sent(weights, chosen, seen)
    )


def _all_weights(loader: Any) -> Any:
    get_all = getattr(loader, "get_all_weights", None)
    if get_all is None:
        raise NotImplementedError(f"{type(loader).__name__} cannot iterate a checkpoint's tensors to push them")
    return get_all


def push_target(runner: Any, chosen: Chosen, seen: Seen) -> str:
    """Push the target's checkpoint tensors as an RL trainer does: reload_weights(weights_iterator=...)."""
    from vllm.model_executor.model_loader import get_model_loader

    config = runner.vllm_config
    weights = _all_weights(get_model_loader(config.load_config))(config.model_config, runner.get_model())
    runner.reload_weights(weights_iterator=sent(weights, chosen, seen))
    return "pushed"
