"""Wake with new weights the way RL trainers do (verl's update_weights_from_ipc, NeMo-RL, TRL): the checkpoint's
tensors pushed into the live models through load_weights / reload_weights(weights_iterator=...), not reloaded
from disk by path. Optionally perturbed or partial (push_scale, push_skip): the tensors each model's `Chosen` names
scaled on the way or left out, so a test can prove the drafter follows the weights it was given, or catch a push
that gets the drafter wrong; or misrouted on purpose (push_fault), so a test can prove a push that lands on the wrong
model is caught.

Both pushes run as vLLM runs its own weight updates, under the memory regime it sets for them. From 0.34 an
extensible KV cache (on by default on CUDA) caps torch's memory after warmup (`set_torch_memory_limit`,
v1/worker/extensible_kv_cache.py:377-385, set by `measure_kv_cache_blocks` at :692), and vLLM lifts that cap, lending
the cache's memory when too little is free, only inside `kv_cache_lent_for_weight_update` (:717-755), which
`Worker.reload_weights` (v1/worker/gpu_worker.py:645-665) and the weight-update sessions (:1707-1714) enter. So the
target goes through the worker's own `reload_weights(weights_iterator=...)`, and the drafter's load runs inside the
same loan taken for the drafter; a push calling the model runner directly would run under the cap and could run out
of memory where a stock reload does not. vLLM 0.32 and 0.33 have neither cap nor loan: the same calls, nothing lent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from specwake.weight_updates import DRAFT_TO_TARGET, EMPTY_DRAFT, TARGET_ALSO_TO_DRAFT, Chosen
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


def weight_update_room(worker: Any, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
    """The room vLLM makes for a layerwise weight update of `model` (0.34: `kv_cache_lent_for_weight_update`, torch's
    cap lifted and the KV cache's memory lent when short, failing before any weight changes when not even the largest
    layer fits, as `Worker.reload_weights` takes it for checkpoint-format weights); nothing before 0.34."""
    try:
        from vllm.v1.worker.extensible_kv_cache import kv_cache_lent_for_weight_update
    except ImportError:  # vLLM < 0.34: no extensible KV cache, no cap
        return contextlib.nullcontext()
    return kv_cache_lent_for_weight_update(
        getattr(worker.model_runner, "extensible_kv_cache", None),
        model,
        reclaimable=bool(getattr(worker, "_kv_cache_reclaimable", False)),
        fail_if_short=True,
    )


def push_draft(worker: Any, chosen: Chosen, seen: Seen, fault: str | None = None) -> str:
    """Push the drafter's checkpoint tensors into the live drafter by the rules vLLM's draft reload follows
    (specwake.worker.draft_load, the very file the reference fix adds to vLLM): target modules shared into the drafter
    unbound while it loads, a tied head refilled, fused buffers rebuilt in place, attention scales kept. A plain
    load_weights fails on CPU, where weights were repacked after the first load, and crashes a Gemma4 drafter. Runs
    inside the room vLLM makes for a weight update of the drafter (weight_update_room). A planted `fault`
    (weight_updates.PUSH_FAULTS) misroutes it: the drafter's tensors pushed into the target (DRAFT_TO_TARGET), or none
    pushed at all (EMPTY_DRAFT)."""
    from vllm.model_executor.model_loader import get_model_loader

    runner = worker.model_runner
    config = runner.vllm_config
    draft, spec = find_draft(runner), config.speculative_config
    if draft is None or spec is None or spec.draft_model_config is None:
        return "no separate drafter"
    if fault == EMPTY_DRAFT:
        return "pushed nothing (planted: empty-draft)"
    try:
        from vllm.model_executor.model_loader.utils import get_draft_load_config

        load_config = get_draft_load_config(config)
    except ImportError:
        load_config = config.load_config
    weights = sent(_all_weights(get_model_loader(load_config))(spec.draft_model_config, draft), chosen, seen)
    if fault == DRAFT_TO_TARGET:
        worker.reload_weights(weights_iterator=weights)
        return "pushed into the target (planted: draft-to-target)"
    return "pushed: " + _into_draft(worker, weights)


def _into_draft(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> str:
    """Load `weights` into the live drafter in place (load_draft_weights_inplace), in vLLM's room for its update."""
    from specwake.worker.draft_load import load_draft_weights_inplace

    runner = worker.model_runner
    draft, spec = find_draft(runner), runner.vllm_config.speculative_config
    assert draft is not None and spec is not None  # the callers looked
    with weight_update_room(worker, draft):
        return load_draft_weights_inplace(draft, find_target(runner), spec.draft_model_config, weights)


def _all_weights(loader: Any) -> Any:
    get_all = getattr(loader, "get_all_weights", None)
    if get_all is None:
        raise NotImplementedError(f"{type(loader).__name__} cannot iterate a checkpoint's tensors to push them")
    return get_all


def push_target(worker: Any, chosen: Chosen, seen: Seen, fault: str | None = None) -> str:
    """Push the target's checkpoint tensors as an RL trainer does: the worker's own
    reload_weights(weights_iterator=...), which takes vLLM's room for the update itself (0.34) and runs the runner's
    layerwise reload under the worker's config. A planted TARGET_ALSO_TO_DRAFT fault pushes them into the drafter
    as well."""
    from vllm.model_executor.model_loader import get_model_loader

    runner = worker.model_runner
    config = runner.vllm_config
    weights = _all_weights(get_model_loader(config.load_config))(config.model_config, runner.get_model())
    worker.reload_weights(weights_iterator=sent(weights, chosen, seen))
    if fault == TARGET_ALSO_TO_DRAFT and find_draft(runner) is not None:
        again = _all_weights(get_model_loader(config.load_config))(config.model_config, runner.get_model())
        _into_draft(worker, sent(again, chosen, Seen()))
        return "pushed, and into the drafter too (planted: target-also-to-draft)"
    return "pushed"
