"""Every tensor a model holds, by kind, as a real Level-2 sleep sees them, and the fingerprint of each: a digest of its
bits compared with the fresh one, with how it differs (specwake.worker.digest), and the address a CUDA graph would
read it at.

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

import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from specwake.protocol import DIFFERENCES, FINGERPRINT_VERSION, GONE, KINDS, VALUES, Fingerprint
from specwake.worker.digest import Sums, difference, worst
from specwake.worker.packed import PackedCopy, packed_copies, unpacked

KV_CACHE_ATTRIBUTE = "kv_cache"
HOST_SIDE_ATTRIBUTES = frozenset({"_k_scale_cpu", "_v_scale_cpu"})
# Plain attributes only vLLM's CPU build keeps, rebuilt by every `process_weights_after_loading`: judged by their
# values, never by their address (no CUDA graph exists to hold it). `_cpu_unpacked_conv_weight`: the gated delta net's
# conv1d weight as loaded, kept beside the copy packed for the AVX-512 bf16 / AMX kernel, which its speculative-decode
# path reads (model_executor/layers/utils.py `dispatch_cpu_unquantized_gemm`, layers/mamba/ops/cpu/gdn_attention.py).
CPU_BUILD_ATTRIBUTES = frozenset({"_cpu_unpacked_conv_weight"})
NAMES_SHOWN = 5  # names of moved or uncovered tensors returned, at most
NAMES_KEPT = 20  # names of differing tensors returned, at most, each with how it differs


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


def differs(now: tuple[Sums, ...], then: tuple[Sums, ...], *, exact: bool = True) -> str | None:
    """How two readings of a tensor (its values, then those of its packed copies) differ (specwake.worker.digest's
    kinds: the most severe of its parts), None when they agree: bit for bit when `exact`, else (an inexact tensor)
    by its projection within rounding."""
    if len(now) != len(then):
        return VALUES
    return worst(difference(a, b, exact=exact) for a, b in zip(now, then, strict=True))


# What a fingerprint keeps of each tensor to compare later, by name: (the sums of its values, followed by those of the
# packed CPU copies the forward reads in its place; its address).
Reference = dict[str, tuple[tuple[Sums, ...], int]]


@dataclass(frozen=True)
class Reading:
    """One judged tensor as a fingerprint reads it: the sums compared with fresh, the values counted as the tensor's
    (its own; a packed copy's when the parameter was emptied for it) and where it lives (0 for a copy only a packed
    CPU kernel reads: no CUDA graph can hold its address)."""

    parts: tuple[Sums, ...]
    values: Sums
    address: int
    unpacked: int  # packed copies read back and compared


def read(tensor: torch.Tensor, copies: list[PackedCopy], *, project: bool = False) -> Reading | None:
    """`tensor` and the packed copies of it the forward reads (specwake.worker.packed); None when nothing there holds
    data (on meta, or emptied with no packed copy to read back). `project`: their projections too (inexact)."""
    own = None if tensor.is_meta or tensor.numel() == 0 else Sums.of([tensor], project=project)
    found = [Sums.of(blocks, project=project) for blocks in map(unpacked, copies) if blocks is not None]
    sums = ([own] if own is not None else []) + found
    if not sums:
        return None
    return Reading(tuple(sums), sums[0], tensor.data_ptr() if own is not None else 0, len(found))


# Tensors a reload cannot reproduce bit for bit, by name glob, each with why: compared by their projection within
# rounding (specwake.worker.digest), not by their digest. None is known: every tensor a reload writes or re-derives
# in vLLM 0.32-0.34 is copied, converted elementwise, or computed by the same kernel on the same inputs (MLA's W_UK_T /
# W_UV: a view of kv_b_proj, an elementwise dequantization, or the same GEMM). A scenario names more (cycle.inexact).
INEXACT: dict[str, str] = {}


def inexact(model: torch.nn.Module | None, named: dict[str, str]) -> frozenset[str]:
    """The judged tensors of `model` whose name matches a glob of INEXACT or of `named` (the scenario's)."""
    if model is None:
        return frozenset()
    globs = [*INEXACT, *named]
    return frozenset(e.name for e in inventory(model) if any(fnmatch.fnmatchcase(e.name, g) for g in globs))


def _by_kind(names: list[str], kinds: dict[str, str]) -> dict[str, int]:
    return {kind: sum(1 for n in names if kinds.get(n) == kind) for kind in KINDS}


def fingerprint(
    model: torch.nn.Module | None,
    *,
    exclude: set[int] | None = None,
    reference: Reference | None = None,
    keep: Reference | None = None,
    since: Reference | None = None,
    packed: tuple[int, int] = (0, 0),
    uncovered: frozenset[str] = frozenset(),
    coverage_error: str | None = None,
    inexact: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Per-model summary of every judged tensor (parameters, buffers, plain attributes). `exclude`: data pointers
    owned by another model (counted as shared). `reference`: what `keep` held at an earlier call, to count the
    tensors that differ (each with how: specwake.worker.digest) and those now at another address (moved); bit for bit,
    but those in `inexact`, compared by their projections within rounding (`inexact()`). `since`: another earlier
    reading (right after a cycle's reload), compared alike: the tensors `changed` since, uncovered ones included,
    with how (`changed_shared`: those of them at an address in `exclude`). `packed`:
    (modules computing from a packed CPU copy, those whose copy is still discarded). `uncovered`: parameters no load
    writes (specwake.worker.coverage): compared apart, never counted in `differ`. A parameter the CPU build packed is
    judged by what the forward reads: the packed copy, read back (specwake.worker.packed), stands in for a parameter
    it emptied and is compared beside one it left in place (an embedding's, an LM head's)."""
    if model is None:
        return Fingerprint(present=False).to_dict()
    exclude = exclude or set()
    counts = dict.fromkeys(("tensors", "numel", "all_zero", "on_meta", "empty", "shared_with_target", "nonfinite"), 0)
    kinds = dict.fromkeys(KINDS, 0)
    kind_of: dict[str, str] = {}
    total, unread, compared, unpacked_copies, projected = 0.0, 0, 0, 0, 0
    differ: dict[str, str] = {}  # name → how it differs
    moved: list[str] = []
    uncovered_differ: list[str] = []
    changed: dict[str, str] = {}  # name → how it differs from `since`
    shared_changed: list[str] = []  # those of them the model shares with the target (the target's to judge)
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
        found_copies = copies.get(entry.name, []) if entry.kind == "parameter" else []
        reading = read(tensor, found_copies, project=entry.name in inexact)
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
            keep[entry.name] = (reading.parts, reading.address)
        if reference is not None and entry.name in reference:
            then_parts, then_address = reference[entry.name]
            how = differs(reading.parts, then_parts, exact=entry.name not in inexact)
            projected += entry.name in inexact
            if entry.name in uncovered:
                uncovered_differ += [entry.name] if how else []
            else:
                compared += 1
                differ |= {entry.name: how} if how else {}
            if reading.address != then_address and entry.name.rsplit(".", 1)[-1] not in CPU_BUILD_ATTRIBUTES:
                moved.append(entry.name)
        if since is not None and entry.name in since:
            how = differs(reading.parts, since[entry.name][0], exact=entry.name not in inexact)
            changed |= {entry.name: how} if how else {}
            shared_changed += [entry.name] if how and reading.address in exclude else []
    found = Fingerprint(
        version=FINGERPRINT_VERSION,
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
        differ |= dict.fromkeys(gone, GONE)
        moved += gone
        names = list(differ)
        found = replace(
            found,
            compared=compared + len(gone),
            differ=len(differ),
            differ_names=names[:NAMES_KEPT],
            differ_by_kind=_by_kind(names, kind_of),
            differ_how={name: differ[name] for name in names[:NAMES_KEPT]},
            differ_by_how={how: n for how in DIFFERENCES if (n := sum(1 for h in differ.values() if h == how))},
            inexact=projected,
            moved=len(moved),
            moved_names=moved[:NAMES_SHOWN],
            moved_by_kind=_by_kind(moved, kind_of),
            uncovered_differ=len(uncovered_differ),
            uncovered_differ_names=uncovered_differ[:NAMES_SHOWN],
        )
    if since is not None:
        changed |= dict.fromkeys(sorted(set(since) - resident), GONE)
        names = list(changed)[:NAMES_KEPT]
        found = replace(found, changed=len(changed), changed_names=names, changed_how={n: changed[n] for n in names},
                        changed_shared=shared_changed)  # fmt: skip
    return found.to_dict()


def data_ptrs(model: torch.nn.Module | None) -> set[int]:
    """Addresses of the model's resident parameters (another model's tensors there are shared with it)."""
    return {e.tensor.data_ptr() for e in inventory(model) if e.kind == "parameter" and e.resident}
