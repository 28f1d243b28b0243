"""Every tensor a model holds, by kind, as a real Level-2 sleep sees them, and the fingerprint of each: a checksum
compared with the fresh one and the address a CUDA graph would read it at.

Kinds, and what L2 sleep does with each (every one allocated in the cumem "weights" pool while the models load,
`load_model`, gpu_worker.py 0.32:587-589, 0.33:594-596, 0.34:595-597); specwake.worker.discard emulates either release:
- **parameter**: discarded; the reload must bring it back. Those `--sleep-preserve-parameter-names` names survive:
  0.32/0.33 copy them to host memory and back by name (`_save_sleep_parameters` / `_restore_sleep_parameters`,
  gpu_worker.py 0.32:269-292, 0.33:276-299); 0.34 leaves their storage out of the discardable set
  (`_discardable_parameters`, gpu_worker.py:297-318), so it is backed up with everything else.
- **buffer**: kept. 0.32/0.33 copy each named buffer of target and drafter to host memory before the sleep and back
  on `wake_up(tags=["weights"])` (`_sleep_saved_buffers`, `_sleep_saved_draft_buffers`: gpu_worker.py 0.32:302-309 and
  341-354, 0.33:309-316 and 352-365). 0.34 saves nothing by name: a buffer survives because the allocator backs up
  every allocation that is not a discardable parameter's (device_allocator/__init__.py:29-44, cumem.py:289-292), and
  is lost with one whose storage it shares.
- **attribute**: a tensor a module keeps as a plain attribute, neither parameter nor buffer (DSpark's
  `_fused_kv_weight`, anything `process_weights_after_loading` or a proposer derives). 0.32/0.33: discarded with the
  whole pool, and nothing restores it (but memory it shares with a buffer or preserved parameter written back).
  0.34: backed up like a buffer, unless it shares a discardable parameter's storage.
On vLLM's CPU build a linear layer or LM head computes from a packed copy of its weight (specwake.worker.packed):
that copy is read back and judged under its parameter's name, as the same parameter is judged on a GPU.
Not weights, left out: the KV cache each attention layer holds as `kv_cache` (bound by `bind_kv_cache`,
`v1/worker/utils.py`; its own pool, emptied by every sleep) and the host-side scale copies `_k_scale_cpu` /
`_v_scale_cpu` (`set_default_quant_scales`, `model_executor/layers/attention/attention.py`: host memory on a GPU,
outside the pool and outside any CUDA graph, recreated by every `process_weights_after_loading`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from specwake.protocol import KINDS, Fingerprint
from specwake.worker.packed import PackedCopy, packed_copies, unpacked

KV_CACHE_ATTRIBUTE = "kv_cache"
HOST_SIDE_ATTRIBUTES = frozenset({"_k_scale_cpu", "_v_scale_cpu"})
CHUNK = 1 << 22  # elements converted to float64 at a time: a checksum never needs much extra memory
NAMES_SHOWN = 5  # names of differing or moved tensors returned, at most
REL_TOLERANCE = 1e-9  # checksums of the same bytes, summed in the same order, agree far closer than this


@dataclass(frozen=True)
class Entry:
    """One tensor of a model: its qualified name, kind, and whether vLLM ever reads it."""

    name: str
    kind: str
    tensor: torch.Tensor
    # A placeholder no forward reads: RMSNorm(has_weight=False) keeps `weight = torch.ones(...)` as a plain attribute
    # and passes None instead (`pass_weight`, model_executor/layers/layernorm.py). Discarded, never judged.
    unread: bool = False

    @property
    def resident(self) -> bool:
        """Holds data at an address: not on meta, not empty (a CPU linear layer's weight lives in a packed copy)."""
        return not self.tensor.is_meta and self.tensor.numel() > 0


def _unread(module: torch.nn.Module, name: str) -> bool:
    return name == "weight" and getattr(module, "has_weight", True) is False


def _attribute_tensors(module: torch.nn.Module, host_side: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """A module's plain tensor attributes, and the tensors of its list/tuple attributes (`name[i]`). With
    `host_side`, tensors in host memory are left out too (a GPU model's host copies: outside the weights pool)."""
    for name, value in vars(module).items():
        if name in (KV_CACHE_ATTRIBUTE, *HOST_SIDE_ATTRIBUTES):
            continue
        items = [(name, value)] if isinstance(value, torch.Tensor) else []
        if isinstance(value, list | tuple):
            items = [(f"{name}[{i}]", item) for i, item in enumerate(value) if isinstance(item, torch.Tensor)]
        for label, tensor in items:
            if not isinstance(tensor, torch.nn.Parameter) and not (host_side and tensor.device.type == "cpu"):
                yield label, tensor


def _on_accelerator(model: torch.nn.Module) -> bool:
    first = next(iter(model.parameters()), None)
    return first is not None and first.device.type not in ("cpu", "meta")


def inventory(model: torch.nn.Module | None) -> list[Entry]:
    """Every parameter, buffer and plain tensor attribute of `model`, each shared object once."""
    if model is None:
        return []
    entries = [Entry(name, "parameter", param) for name, param in model.named_parameters()]
    entries += [Entry(name, "buffer", buffer) for name, buffer in model.named_buffers()]
    host_side = _on_accelerator(model)
    for prefix, module in model.named_modules():
        for name, tensor in _attribute_tensors(module, host_side):
            entries.append(Entry(f"{prefix}.{name}" if prefix else name, "attribute", tensor, _unread(module, name)))
    return entries


def host_side_count(model: torch.nn.Module | None) -> int:
    """Host-side scale copies the model holds (left out of the inventory)."""
    if model is None:
        return 0
    return sum(1 for module in model.modules() for name in HOST_SIDE_ATTRIBUTES if name in vars(module))


def storage_key(tensor: torch.Tensor) -> tuple[int, str]:
    """Which memory a tensor lives in: views of one storage share it."""
    return tensor.untyped_storage().data_ptr(), str(tensor.device)


@torch.no_grad()
def checksum(tensor: torch.Tensor) -> tuple[float | None, int, bool]:
    """(sum of |x| over the finite elements, or None when some element is not finite; non-finite element count;
    whether every element is zero). Converts chunk by chunk, so float8 and int tensors work on any device."""
    return Sums.of(tensor.detach().reshape(-1).split(CHUNK)).checksum


@dataclass(frozen=True)
class Sums:
    """What a checksum reads of some values: Σ|x| over the finite ones, how many are not finite, whether any is not
    zero, how many there are."""

    total: float = 0.0
    nonfinite: int = 0
    nonzero: bool = False
    numel: int = 0

    @classmethod
    @torch.no_grad()
    def of(cls, chunks: Iterable[torch.Tensor]) -> Sums:
        """The sums of `chunks`' values, each converted to float64 on its own."""
        total, nonfinite, nonzero, numel = 0.0, 0, False, 0
        for chunk in chunks:
            values = chunk.to(torch.float64)
            finite = torch.isfinite(values)
            nonfinite += int((~finite).sum().item())
            values = torch.where(finite, values, torch.zeros_like(values))
            nonzero = nonzero or bool(values.any().item()) or not bool(finite.all().item())
            total += float(values.abs().sum().item())
            numel += values.numel()
        return cls(total, nonfinite, nonzero, numel)

    @property
    def checksum(self) -> tuple[float | None, int, bool]:
        return (None if self.nonfinite else self.total), self.nonfinite, not self.nonzero


def differs(now: tuple[float | None, ...], then: tuple[float | None, ...]) -> bool:
    """Whether two readings of a tensor (its checksum, then those of its packed copies) disagree."""
    return len(now) != len(then) or any(_differs(a, b) for a, b in zip(now, then, strict=False))


def _differs(now: float | None, then: float | None) -> bool:
    if now is None or then is None:
        return now is not then
    return abs(now - then) > REL_TOLERANCE * max(1.0, abs(then))


# What a fingerprint keeps of each tensor to compare later, by name: (its checksum, followed by those of the packed CPU
# copies the forward reads in its place; its address).
Reference = dict[str, tuple[tuple[float | None, ...], int]]


@dataclass(frozen=True)
class Reading:
    """One judged tensor as a fingerprint reads it: the checksums compared with fresh, the values counted as the
    tensor's (its own; a packed copy's when the parameter was emptied for it) and where it lives (0 for a copy only
    a packed CPU kernel reads: no CUDA graph can hold its address)."""

    checksums: tuple[float | None, ...]
    values: Sums
    address: int
    unpacked: int  # packed copies read back and compared


def read(tensor: torch.Tensor, copies: list[PackedCopy]) -> Reading | None:
    """`tensor` and the packed copies of it the forward reads (specwake.worker.packed); None when nothing there holds
    data (on meta, or emptied with no packed copy to read back)."""
    own = None if tensor.is_meta or tensor.numel() == 0 else Sums.of(tensor.detach().reshape(-1).split(CHUNK))
    found = [Sums.of(blocks) for blocks in map(unpacked, copies) if blocks is not None]
    sums = ([own] if own is not None else []) + found
    if not sums:
        return None
    return Reading(tuple(s.checksum[0] for s in sums), sums[0], tensor.data_ptr() if own is not None else 0, len(found))


def _by_kind(names: list[str], kinds: dict[str, str]) -> dict[str, int]:
    return {kind: sum(1 for n in names if kinds.get(n) == kind) for kind in KINDS}


def fingerprint(
    model: torch.nn.Module | None,
    *,
    exclude: set[int] | None = None,
    reference: Reference | None = None,
    keep: Reference | None = None,
    packed: tuple[int, int] = (0, 0),
    uncovered: frozenset[str] = frozenset(),
    coverage_error: str | None = None,
) -> dict[str, Any]:
    """Per-model summary of every judged tensor (parameters, buffers, plain attributes). `exclude`: data pointers
    owned by another model (counted as shared). `reference`: what `keep` held at an earlier call, to count the
    tensors whose checksum differs and those now at another address (moved). `packed`: (modules computing from a
    packed CPU copy, those whose copy is still discarded). `uncovered`: parameters no load writes
    (specwake.worker.coverage): compared apart, never counted in `differ`. A parameter the CPU build packed is judged
    by what the forward reads: the packed copy, read back (specwake.worker.packed), stands in for a parameter it
    emptied and is compared beside one it left in place (an embedding's, an LM head's)."""
    if model is None:
        return Fingerprint(present=False).to_dict()
    exclude = exclude or set()
    counts = dict.fromkeys(("tensors", "numel", "all_zero", "on_meta", "empty", "shared_with_target", "nonfinite"), 0)
    kinds = dict.fromkeys(KINDS, 0)
    kind_of: dict[str, str] = {}
    total, unread = 0.0, 0
    compared, differ, moved, uncovered_differ, unpacked_copies = 0, [], [], [], 0
    resident: set[str] = set()
    copies: dict[str, list[PackedCopy]] = {}
    for copy in packed_copies(model):
        copies.setdefault(copy.weight, []).append(copy)
    for entry in inventory(model):
        if entry.unread:
            unread += 1
            continue
        kinds[entry.kind] += 1
        kind_of[entry.name] = entry.kind
        tensor = entry.tensor
        counts["tensors"] += entry.kind == "parameter"  # `tensors` and the counts below: parameters, as ever
        reading = read(tensor, copies.get(entry.name, []) if entry.kind == "parameter" else [])
        if reading is None:
            if entry.kind == "parameter":
                counts["on_meta" if tensor.is_meta else "empty"] += 1  # empty: no packed copy to read back either
            continue
        resident.add(entry.name)
        unpacked_copies += reading.unpacked
        value, nonfinite, all_zero = reading.values.checksum
        if entry.kind == "parameter":
            counts["shared_with_target"] += reading.address in exclude
            counts["numel"] += reading.values.numel
            counts["nonfinite"] += nonfinite > 0
            counts["all_zero"] += all_zero
            total += value or 0.0
        if keep is not None:
            keep[entry.name] = (reading.checksums, reading.address)
        if reference is not None and entry.name in reference:
            then_values, then_address = reference[entry.name]
            if entry.name in uncovered:
                uncovered_differ += [entry.name] if differs(reading.checksums, then_values) else []
            else:
                compared += 1
                differ += [entry.name] if differs(reading.checksums, then_values) else []
            if reading.address != then_address:
                moved.append(entry.name)
    found = Fingerprint(
        model_class=type(model).__name__,
        tensors=counts["tensors"],
        numel=counts["numel"],
        all_zero=counts["all_zero"],
        on_meta=counts["on_meta"],
        empty=counts["empty"],
        shared_with_target=counts["shared_with_target"],
        nonfinite=counts["nonfinite"],
        kinds=kinds,
        unread=unread,
        host_side=host_side_count(model),
        packed=packed[0],
        packed_discarded=packed[1],
        unpacked=unpacked_copies,
        abs_sum=total,
        uncovered=len(uncovered),
        uncovered_names=sorted(uncovered)[:NAMES_SHOWN],
        coverage_error=coverage_error,
    )
    if reference is not None:
        gone = sorted(set(reference) - resident)  # resident at fresh, now gone, on meta or emptied
        uncovered_differ += [name for name in gone if name in uncovered]
        gone = [name for name in gone if name not in uncovered]
        differ += gone
        moved += gone
        found = replace(
            found,
            compared=compared + len(gone),
            differ=len(differ),
            differ_names=differ[:NAMES_SHOWN],
            differ_by_kind=_by_kind(differ, kind_of),
            moved=len(moved),
            moved_names=moved[:NAMES_SHOWN],
            moved_by_kind=_by_kind(moved, kind_of),
            uncovered_differ=len(uncovered_differ),
            uncovered_differ_names=uncovered_differ[:NAMES_SHOWN],
        )
    return found.to_dict()


def data_ptrs(model: torch.nn.Module | None) -> set[int]:
    """Addresses of the model's resident parameters (another model's tensors there are shared with it)."""
    return {e.tensor.data_ptr() for e in inventory(model) if e.kind == "parameter" and e.resident}
