"""Where a vLLM worker keeps its models: the target and the drafter behind the model runner, unwrapped from CUDA-graph
and ubatch wrappers. Shared by every worker-side module (extension, push), so none of them imports another.
"""

from __future__ import annotations

from typing import Any

import torch

ROLES = ("target", "draft")


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
    """{"target": …, "draft": …}; a model the runner does not have is None."""
    return {"target": find_target(runner), "draft": find_draft(runner)}
