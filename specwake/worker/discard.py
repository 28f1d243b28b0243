"""The emulated Level-2 discard, for a vLLM without sleep mode (the CPU build): everything a real L2 sleep discards,
by kind (see specwake.worker.tensors), overwritten as freed memory leaves it.

- Parameters and plain tensor attributes of target and drafter are filled: zeros, NaN or random values. CUDA does not
  clear the memory it hands back on wake (only ROCm zeroes it), so on a GPU a tensor nothing reloads holds whatever
  was there. Memory shared by several tensors (an embedding the drafter shares with the target, an attribute that
  aliases a parameter) is filled once.
- Buffers are kept: vLLM copies them to host memory before an L2 sleep and back on wake, for target and drafter.
  Memory a buffer shares with another tensor is kept with it.
- CPU packed weights (oneDNN / sgl copies behind a `cpu_linear` closure) answer as the discarded weight would, until
  a reload installs a fresh closure.
"""

from __future__ import annotations

from typing import Any

import torch

from specwake.protocol import DiscardAnswer, Discarded
from specwake.worker.tensors import Entry, inventory, storage_key

FILLS = ("zero", "nan", "random")
FILL_SEED = 52479  # random fills are reproducible
PACKED_MARK = "_specwake_discarded"


@torch.no_grad()
def fill_discarded(tensor: torch.Tensor, fill: str, generator: torch.Generator) -> None:
    """Overwrite a tensor in place as a discard leaves it: zeros, NaN (floating point only; others get zeros), or
    random values (normal for floating point, uniform bytes for integers)."""
    data = tensor.data
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


def discard_packed(module: torch.nn.Module, fill: str, generator: torch.Generator) -> bool:
    """vLLM's CPU build computes linear layers and lm_heads from a packed copy of the weight (oneDNN / sgl kernels)
    behind a `cpu_linear` closure that process_weights_after_loading installs; emptying the parameter does not reach
    that copy, a real discard would. So the closure is wrapped to answer as the discarded weight would (zeros, NaN or
    noise) until a reload installs a fresh one. False when there is nothing to wrap."""
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


def _counts(entries: list[Entry], filled: set[int], packed: int) -> Discarded:
    """What one model lost and kept."""
    gone = [e for e in entries if id(e) in filled]
    return Discarded(
        parameter=sum(1 for e in gone if e.kind == "parameter"),
        attribute=sum(1 for e in gone if e.kind == "attribute"),
        packed=packed,
        buffer_kept=sum(1 for e in entries if e.kind == "buffer"),
    )


@torch.no_grad()
def emulate_discard(models: dict[str, torch.nn.Module | None], fill: str) -> dict[str, Any]:
    """Discard everything a real L2 sleep discards from `models` (role → model); the answer counts each kind per
    role, e.g. {"draft": {"parameter": 11, "attribute": 2, "packed": 3, "buffer_kept": 3}, ...}."""
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {', '.join(FILLS)}, got {fill!r}")
    generator = torch.Generator().manual_seed(FILL_SEED)
    entries = {role: inventory(model) for role, model in models.items()}
    everything = [e for found in entries.values() for e in found if e.resident]
    kept = {storage_key(e.tensor) for e in everything if e.kind == "buffer"}
    filled: set[int] = set()  # ids of the entries whose memory was overwritten
    done: set[tuple[int, int, str]] = set()
    elements = 0
    for entry in everything:
        if entry.kind == "buffer" or storage_key(entry.tensor) in kept:
            continue
        filled.add(id(entry))
        view = (entry.tensor.data_ptr(), entry.tensor.numel(), str(entry.tensor.device))
        if view in done:
            continue
        done.add(view)
        fill_discarded(entry.tensor, fill, generator)
        elements += entry.tensor.numel()
    lost = {}
    for role, model in models.items():
        if model is None:
            continue
        packed = sum(discard_packed(module, fill, generator) for module in model.modules())
        lost[role] = _counts(entries[role], filled, packed)
    return DiscardAnswer(fill, elements, models.get("draft") is not None, lost).to_dict()
