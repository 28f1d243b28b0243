"""The weights vLLM's CPU build reads from packed copies, read back so a fingerprint compares what the forward reads.

On CPU, `process_weights_after_loading` hands every unquantized linear layer, embedding and LM head to
`dispatch_cpu_unquantized_gemm` (vllm/model_executor/layers/utils.py:470, called from linear.py:216 and
vocab_parallel_embedding.py:71): it packs the weight for oneDNN, sgl or zentorch kernels, keeps the packed copy in a
`cpu_linear` closure that ignores the weight it is passed (utils.py:537, :565, :588), and empties the parameter of a
linear layer (`remove_weight=True`) while an embedding or LM head keeps its own. The forward then reads the packed copy
only (`cpu_unquantized_gemm`, utils.py:611).

The closure computes x·Wᵀ, so on rows of the identity it returns rows of Wᵀ: every output element is one weight times
1 plus zeros, exact in any float dtype (accumulated in float32 or wider), the same bytes at every call. A module whose
closure reads the weight it is passed (torch's linear: the meta-weight and MLA `kv_b_proj` cases, utils.py:476,
linear.py:211, and the fallback, utils.py:603) holds no packed copy and gives nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

ELEMENTS = 1 << 22  # identity rows per call × the wider of in and out features: bounds the memory of one block


@dataclass(frozen=True)
class PackedCopy:
    """One module's packed weight: the parameter it was packed from (as the model names it) and its closure."""

    weight: str
    module: torch.nn.Module
    closure: Callable[..., torch.Tensor]


def packed_copies(model: torch.nn.Module) -> list[PackedCopy]:
    """Every module of `model` holding a `cpu_linear` closure, each module once, with its weight's parameter name
    (a tied LM head names the embedding's parameter it shares)."""
    names = {id(param): name for name, param in model.named_parameters()}
    found = []
    for module in model.modules():
        closure = vars(module).get("cpu_linear")  # a plain attribute, where vLLM puts it
        weight = module._parameters.get("weight")
        if callable(closure) and weight is not None and id(weight) in names and not weight.is_meta:
            found.append(PackedCopy(names[id(weight)], module, closure))
    return found


def in_features(module: torch.nn.Module, weight: torch.Tensor) -> int | None:
    """Columns of the weight the closure multiplies by: the weight's own when it kept its values, else what the layer
    was built with (`input_size_per_partition` of column and row parallel layers, `input_size` of replicated ones)."""
    if weight.dim() == 2 and weight.numel():
        return int(weight.shape[1])
    size = getattr(module, "input_size_per_partition", None) or getattr(module, "input_size", None)
    return size if isinstance(size, int) and size > 0 else None


def _identity_rows(start: int, count: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    rows = torch.zeros(count, width, dtype=dtype, device=device)
    index = torch.arange(count, device=device)
    rows[index, start + index] = 1
    return rows


@torch.no_grad()
def unpacked(copy: PackedCopy) -> Iterator[torch.Tensor] | None:
    """The weight the closure computes with, transposed (in features × out features), a block of rows at a time; None
    when the closure holds no packed copy (it reads the weight it is passed) or its size is unknown."""
    weight = copy.module._parameters["weight"]
    assert weight is not None
    width = in_features(copy.module, weight)
    if width is None:
        return None
    nothing = torch.empty(0, dtype=weight.dtype, device=weight.device)  # a closure that reads it fails on it
    try:
        first = copy.closure(_identity_rows(0, 1, width, weight.dtype, weight.device), nothing, None)
    except (RuntimeError, ValueError, IndexError):
        return None
    if first.dim() != 2 or first.shape[0] != 1:
        return None
    return _blocks(copy, first, width, nothing)


@torch.no_grad()
def _blocks(copy: PackedCopy, first: torch.Tensor, width: int, nothing: torch.Tensor) -> Iterator[torch.Tensor]:
    yield first.reshape(-1)
    step = max(1, ELEMENTS // max(width, first.shape[1]))
    for start in range(1, width, step):
        rows = _identity_rows(start, min(step, width - start), width, nothing.dtype, nothing.device)
        yield copy.closure(rows, nothing, None).reshape(-1)
