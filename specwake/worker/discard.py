"""The emulated Level-2 discard, for a vLLM without sleep mode (the CPU build): what a real L2 sleep of a named vLLM
release takes from target and drafter (kinds: specwake.worker.tensors), overwritten as freed memory leaves it.

The rules ("0.33" or "0.34", protocol.DISCARD_RULES) differ in what survives the sleep:

- **0.33** (vLLM 0.32 and 0.33). The whole cumem "weights" pool the models were loaded into is dropped: `sleep`
  offloads only "runtime" and "cudagraph" at level 2 (device_allocator/sleep_mode_backend.py:134-137, both releases).
  Before it, the worker copies every named buffer of target and drafter to host memory and the parameters named by
  `--sleep-preserve-parameter-names` (gpu_worker.py 0.32:294-309, 0.33:301-316; `_save_sleep_parameters` 0.32:269-285,
  0.33:276-292), and writes them back by name on `wake_up(tags=["weights"])` (0.32:339-354, 0.33:350-365). So
  parameters and plain tensor attributes are lost, buffers and preserved parameters come back, and so does any
  tensor whose memory lies inside one of them (an attribute aliasing a buffer); an attribute derived from a
  preserved parameter into memory of its own is lost.
- **0.34.** Nothing is saved by name any more (no `_sleep_saved_*`). `sleep(level=2)` passes the storage addresses of
  the parameters the weight update rewrites (`_discardable_parameters`, gpu_worker.py:297-318: the target's, and the
  drafter's not shared with it, less the preserved ones), and the allocator backs up to host every "weights",
  "runtime" and "cudagraph" allocation but one whose live blocks all start at such an address
  (sleep_mode_backend.py:126-131; `discardable_allocations`, device_allocator/__init__.py:29-44; cumem.py:289-292).
  So buffers and attributes in memory of their own survive; what shares a discardable parameter's storage (a buffer
  or attribute aliasing it) is lost with it. Here every storage stands for one allocation: on a GPU the caching
  allocator packs small tensors into shared segments, and a parameter sharing a segment with anything else survives
  by chance there, so this emulation takes the most a 0.34 sleep can take.

Both releases name the parameters as `_get_sleep_parameters` does (gpu_worker.py 0.32:257-267, 0.33:264-274,
0.34:285-295): the target's by their own names, the drafter's not shared with the target as `draft.<name>`; a
preserve pattern is matched with fnmatch, and one matching nothing (but `draft.*`) fails the sleep (0.32:279,
0.33:286, 0.34:307).

How a discarded tensor is left, per `fill`: zeros, NaN or random values. CUDA does not clear the memory it hands back
on wake (only ROCm zeroes it), so on a GPU a tensor nothing reloads holds whatever was there. CPU packed weights
(oneDNN / sgl copies behind a `cpu_linear` closure) stand in for their parameter: discarded when it is, answering as
the discarded weight would until a reload installs a fresh closure, and kept when it is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from fnmatch import filter as fnmatch_filter
from typing import Any

import torch

from specwake.protocol import DiscardAnswer, Discarded
from specwake.worker.tensors import Entry, inventory, storage_key

FILLS = ("zero", "nan", "random")
FILL_SEED = 52479  # random fills are reproducible
PACKED_MARK = "_specwake_discarded"
# How vLLM names the drafter's parameters for a sleep (`_get_sleep_parameters`), and the one preserve pattern it lets
# match nothing (a server without a drafter). Facts of each release's gpu_worker.py, held to it by `make releases`.
DRAFT_PREFIX = "draft."
ANY_DRAFT = f"{DRAFT_PREFIX}*"

Loses = Callable[[torch.Tensor], bool]  # whether the sleep takes a resident tensor's memory


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


# -- which parameters a sleep is about, and which the user keeps -------------------------------------------------------


def sleep_parameters(models: dict[str, torch.nn.Module | None]) -> dict[str, torch.nn.Parameter]:
    """The parameters as vLLM names them for a sleep (`_get_sleep_parameters`): the target's by their own names, then
    the drafter's that are not the target's (by identity) as `draft.<name>`."""
    target, draft = models.get("target"), models.get("draft")
    parameters = dict(target.named_parameters()) if target is not None else {}
    if draft is not None:
        shared = {id(p) for p in parameters.values()}
        parameters.update((f"{DRAFT_PREFIX}{n}", p) for n, p in draft.named_parameters() if id(p) not in shared)
    return parameters


def preserved_names(parameters: dict[str, torch.nn.Parameter], patterns: Sequence[str]) -> set[str]:
    """The names `--sleep-preserve-parameter-names` patterns pick, matched as vLLM matches them (fnmatch over the
    sleep names); a pattern that picks nothing fails as vLLM's sleep does, but `draft.*` (no drafter)."""
    names: set[str] = set()
    for pattern in patterns:
        matches = fnmatch_filter(parameters, pattern)
        if not matches and pattern != ANY_DRAFT:
            raise ValueError(f"No parameter matches sleep retention: {pattern}")
        names.update(matches)
    return names


# -- the two releases' rules -------------------------------------------------------------------------------------------


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a resident tensor reaches: [first, end)."""
    reach = 1 + sum((int(size) - 1) * int(stride) for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    first = int(tensor.storage_offset()) * tensor.element_size()
    return first, first + reach * tensor.element_size()


def _within(tensor: torch.Tensor, spans: dict[tuple[int, str], list[tuple[int, int]]]) -> bool:
    """Whether every byte `tensor` reaches lies in one of the spans of its storage (merged, sorted)."""
    first, end = _span(tensor)
    return any(a <= first and end <= b for a, b in spans.get(storage_key(tensor), ()))


def _merged(tensors: Iterable[torch.Tensor]) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """Per storage, the byte spans the tensors cover, overlapping or touching ones merged."""
    found: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for tensor in tensors:
        found.setdefault(storage_key(tensor), []).append(_span(tensor))
    merged: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for key, spans in found.items():
        out: list[tuple[int, int]] = []
        for first, end in sorted(spans):
            if out and first <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((first, end))
        merged[key] = out
    return merged


def rules_033(entries: list[Entry], preserved: set[int]) -> tuple[Loses, list[torch.Tensor]]:
    """0.32 / 0.33: the weights pool is dropped whole; buffers and preserved parameters are saved by name and written
    back, so a tensor survives where its bytes lie within theirs. (Which tensors it takes, those written back.)"""
    back = [e.tensor for e in entries if e.kind == "buffer" or (e.kind == "parameter" and id(e.tensor) in preserved)]
    spans = _merged(back)
    return (lambda tensor: not _within(tensor, spans)), back


def rules_034(entries: list[Entry], preserved: set[int]) -> tuple[Loses, list[torch.Tensor]]:
    """0.34: dropped are the storages of the parameters the update rewrites, less those of preserved parameters
    (`_discardable_parameters` removes them by storage too), with everything in them; the rest is backed up."""
    parameters = [e.tensor for e in entries if e.kind == "parameter"]
    kept = {storage_key(t) for t in parameters if id(t) in preserved}
    discardable = {storage_key(t) for t in parameters} - kept
    return (lambda tensor: storage_key(tensor) in discardable), []


# protocol.DISCARD_RULES, each name with its rules (a unit test holds the two to the same names)
RULES: dict[str, Callable[[list[Entry], set[int]], tuple[Loses, list[torch.Tensor]]]] = {
    "0.33": rules_033,
    "0.34": rules_034,
}


# -- the discard -------------------------------------------------------------------------------------------------------


def _packed_lost(module: torch.nn.Module, loses: Loses, preserved: set[int]) -> bool:
    """Whether a module's packed CPU copy goes with the sleep: it stands for the module's weight, lost when the weight
    is (judged by its memory where the CPU build left it some, else by whether it is preserved)."""
    weight = module._parameters.get("weight")
    if weight is None:
        return True
    if weight.is_meta or weight.numel() == 0:
        return id(weight) not in preserved
    return loses(weight)


def _count(entries: list[Entry], lost: set[int], packed: tuple[int, int]) -> Discarded:
    """What one model lost and kept, by kind."""

    def number(kind: str, gone: bool) -> int:
        return sum(1 for e in entries if e.kind == kind and (id(e) in lost) == gone)

    return Discarded(
        parameter=number("parameter", True),
        attribute=number("attribute", True),
        packed=packed[0],
        buffer=number("buffer", True),
        parameter_kept=number("parameter", False),
        attribute_kept=number("attribute", False),
        packed_kept=packed[1],
        buffer_kept=number("buffer", False),
    )


@torch.no_grad()
def emulate_discard(
    models: dict[str, torch.nn.Module | None], fill: str, rules: str, preserve: Sequence[str] = ()
) -> dict[str, Any]:
    """Discard from `models` (role → model) what a real L2 sleep of the `rules` release discards, honouring the
    `preserve` patterns as that release does. The answer names the rules and counts each kind per role, lost and
    kept, e.g. {"rules": "0.34", "draft": {"parameter": 11, "attribute": 0, "packed": 3, "buffer": 0,
    "parameter_kept": 0, ...}, ...}."""
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {', '.join(FILLS)}, got {fill!r}")
    if rules not in RULES:
        raise ValueError(f"rules must be one of {', '.join(RULES)}, got {rules!r}")
    parameters = sleep_parameters(models)
    preserved = {id(parameters[name]) for name in preserved_names(parameters, preserve)}
    generator = torch.Generator().manual_seed(FILL_SEED)
    entries = {role: [e for e in inventory(model) if e.resident] for role, model in models.items()}
    loses, written_back = RULES[rules]([e for found in entries.values() for e in found], preserved)
    saved = [(tensor, tensor.detach().clone()) for tensor in written_back]
    lost: set[int] = set()  # ids of the entries whose memory the sleep takes
    done: set[tuple[int, int, str]] = set()
    elements = 0
    for entry in (e for found in entries.values() for e in found):
        if not loses(entry.tensor):
            continue
        lost.add(id(entry))
        view = (entry.tensor.data_ptr(), entry.tensor.numel(), str(entry.tensor.device))
        if view not in done:
            done.add(view)
            fill_discarded(entry.tensor, fill, generator)
            elements += entry.tensor.numel()
    for tensor, value in saved:  # what the release writes back on wake, over memory it shares with lost tensors
        tensor.copy_(value)
    counts = {}
    seen: set[int] = set()  # a module both models hold (a shared head) is counted with the first
    for role, model in models.items():
        if model is None:
            continue
        wrapped, kept = 0, 0
        for module in model.modules():
            if getattr(module, "cpu_linear", None) is None or id(module) in seen:
                continue
            seen.add(id(module))
            if not _packed_lost(module, loses, preserved):
                kept += 1
            elif discard_packed(module, fill, generator):
                wrapped += 1
        counts[role] = _count(entries[role], lost, (wrapped, kept))
    draft = models.get("draft") is not None
    return DiscardAnswer(fill, elements, draft, counts, rules, tuple(preserve)).to_dict()
