"""Packed CPU weights read back and compared (specwake.worker.packed, through specwake.worker.tensors), on modules built
like vLLM's CPU layers after `process_weights_after_loading`: a `cpu_linear` closure over a copy of the weight in
another layout, which ignores the weight it is passed; a linear layer's parameter emptied, an LM head's kept. The
same reading on vLLM's own layers and kernels: tests/e2e/test_vllm_facts.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake.report.weights import weights_line  # noqa: E402
from specwake.results import Diagnostic  # noqa: E402
from specwake.worker import packed  # noqa: E402
from specwake.worker.discard import emulate_discard, packed_state  # noqa: E402
from specwake.worker.tensors import Reference, fingerprint  # noqa: E402


def pack(weight: torch.Tensor) -> Any:
    """A closure like vLLM's CPU GEMM: x·Wᵀ from a copy of W kept in blocks of 4 columns, accumulated in float32."""
    rows, cols = weight.shape
    blocks = weight.detach().t().contiguous().reshape(cols // 4, 4, rows).clone()

    def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = x.float() @ blocks.reshape(cols, rows).float()
        return (out if bias is None else out + bias.float()).to(x.dtype)

    return cpu_linear


class Linear(torch.nn.Module):
    """A linear layer after packing (`keep=False`: its parameter emptied) or an LM head (`keep=True`)."""

    def __init__(self, weight: torch.Tensor, *, keep: bool = False) -> None:
        super().__init__()
        self.input_size = weight.shape[1]  # what vLLM's ReplicatedLinear keeps
        held = weight.clone() if keep else torch.empty(0, dtype=weight.dtype)
        self.weight = torch.nn.Parameter(held, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.ones(weight.shape[0], dtype=weight.dtype), requires_grad=False)
        self.cpu_linear = pack(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cpu_linear(x, self.weight, self.bias)


class Model(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weights = {
            name: torch.randn(rows, 24, generator=generator).to(dtype) for name, rows in (("proj", 40), ("head", 56))
        }
        self.proj = Linear(self.weights["proj"])
        self.head = Linear(self.weights["head"], keep=True)

    def reload(self, scale: dict[str, float] | None = None) -> None:
        """What a reload does on vLLM's CPU build: each layer packed anew from the loaded values."""
        for name, layer in (("proj", self.proj), ("head", self.head)):
            loaded = self.weights[name] * (scale or {}).get(name, 1.0)
            if name == "head":
                with torch.no_grad():
                    layer.weight.copy_(loaded)
            layer.cpu_linear = pack(loaded)


def fresh(model: torch.nn.Module) -> tuple[dict[str, Any], Reference]:
    kept: Reference = {}
    return fingerprint(model, keep=kept, packed=packed_state(model)), kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_weight_a_packed_copy_holds_reads_back_exactly(dtype: torch.dtype, monkeypatch: Any) -> None:
    model = Model(dtype)
    monkeypatch.setattr(packed, "ELEMENTS", 96)  # blocks of 2 identity rows: the offsets of every block count
    (copy,) = [c for c in packed.packed_copies(model) if c.weight == "proj.weight"]
    blocks = packed.unpacked(copy)
    assert blocks is not None
    read = torch.cat(list(blocks)).reshape(24, 40)
    assert read.dtype == dtype and torch.equal(read, model.weights["proj"].t())  # bit for bit, bias left out
    again = packed.unpacked(copy)
    assert again is not None and torch.equal(torch.cat(list(again)).reshape(24, 40), read)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_emptied_parameter_is_judged_by_its_packed_copy(dtype: torch.dtype) -> None:
    model = Model(dtype)
    found, kept = fresh(model)
    assert found["empty"] == 0 and found["unpacked"] == 2 and found["packed"] == 2
    assert found["numel"] == 40 * 24 + 56 * 24 + 40 + 56  # the emptied weight counts with the values it stands for
    expected = sum(float(w.double().abs().sum()) for w in model.weights.values()) + 96
    assert found["abs_sum"] == pytest.approx(expected, rel=1e-12)  # the head's copy is compared, not counted twice
    assert fingerprint(model, reference=kept)["differ"] == 0


def test_a_layer_packed_from_slightly_wrong_values_is_named() -> None:
    model = Model()
    _, kept = fresh(model)
    model.reload({"proj": 1.01})
    after = fingerprint(model, reference=kept)
    assert (after["differ"], after["differ_names"], after["moved"]) == (1, ["proj.weight"], 0)
    model.reload()
    assert fingerprint(model, reference=kept)["differ"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layer_packed_from_moved_or_negated_values_is_named_with_how(dtype: torch.dtype) -> None:
    """The values a packed copy holds are read back in order: its digest sees a layer loaded with halves swapped or
    negated, which leave every sum of |x| as fresh."""
    model = Model(dtype)
    _, kept = fresh(model)
    proj = model.weights["proj"]
    for loaded, how in ((torch.cat([proj[20:], proj[:20]]), "rearranged"), (-proj, "signs")):
        model.proj.cpu_linear = pack(loaded)
        after = fingerprint(model, reference=kept)
        assert after["differ_how"] == {"proj.weight": how} and after["differ_by_kind"]["parameter"] == 1
    model.reload()
    assert fingerprint(model, reference=kept)["differ"] == 0


def test_an_lm_head_is_judged_by_its_own_weight_and_by_the_copy_the_forward_reads() -> None:
    model = Model()
    _, kept = fresh(model)
    model.head.cpu_linear = pack(model.weights["head"] * 1.01)  # the parameter as fresh, the packed copy not
    assert fingerprint(model, reference=kept)["differ_names"] == ["head.weight"]
    model.reload()
    with torch.no_grad():
        model.head.weight.mul_(1.01)  # the copy as fresh, the parameter not
    assert fingerprint(model, reference=kept)["differ_names"] == ["head.weight"]


@pytest.mark.parametrize("rules", ["0.33", "0.34"])
@pytest.mark.parametrize("fill", ["zero", "nan", "random"])
def test_a_discarded_packed_copy_differs_until_the_reload_packs_anew(fill: str, rules: str) -> None:
    model = Model()
    _, kept = fresh(model)
    emulate_discard({"target": model}, fill, rules)
    after = fingerprint(model, reference=kept, packed=packed_state(model))
    assert after["differ_names"] == ["proj.weight", "proj.bias", "head.weight", "head.bias"]
    assert after["packed_discarded"] == 2 and after["unpacked"] == 2
    model.reload()
    with torch.no_grad():
        model.proj.bias.fill_(1.0)
        model.head.bias.fill_(1.0)
    after = fingerprint(model, reference=kept, packed=packed_state(model))
    assert after["differ"] == 0 and after["packed_discarded"] == 0


def test_a_tied_head_and_its_embedding_are_both_read_under_the_shared_name() -> None:
    model = Model()
    model.embed = torch.nn.Embedding(56, 24)
    model.embed.weight = model.head.weight  # tied: one parameter, two modules, two packed copies
    model.embed.cpu_linear = pack(model.weights["head"])
    found, kept = fresh(model)
    assert found["unpacked"] == 3 and found["tensors"] == 4
    model.embed.cpu_linear = pack(model.weights["head"] * 1.01)
    assert fingerprint(model, reference=kept)["differ_names"] == ["head.weight"]


def test_a_closure_that_reads_the_weight_it_is_passed_holds_no_copy() -> None:
    """torch's linear (vLLM's fallback, meta weights, MLA kv_b_proj): the parameter itself is what the forward reads;
    an emptied parameter with no size to read it back by is left out and said so."""
    layer = Linear(torch.ones(8, 4), keep=True)
    layer.cpu_linear = torch.nn.functional.linear
    found = fingerprint(layer)
    assert (found["unpacked"], found["empty"], found["numel"]) == (0, 0, 40)
    sizeless = Linear(torch.ones(8, 4))
    del sizeless.input_size
    found = fingerprint(sizeless)
    assert (found["unpacked"], found["empty"]) == (0, 1)


def test_the_report_says_packed_weights_were_compared_and_empty_ones_not() -> None:
    part = {"tensors": 4, "compared": 4, "differ": 1, "unpacked": 2, "empty": 1}
    diagnostics = [
        Diagnostic.from_dict({"cycle": 1, "point": "after reload_weights", "fingerprints": [{"draft": part}]})
    ]
    assert weights_line(diagnostics, "draft") == (
        "draft: 1/4 tensors differ from fresh after reload_weights in cycle 1 (2 packed CPU weights read back and"
        " compared; 1 empty parameters not compared)"
    )
