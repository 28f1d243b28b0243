"""Parameters no load writes (DSpark's `mask_embedding`): found by a dry run of the model's own load_weights
(specwake.worker.coverage), compared apart from the judged tensors (specwake.worker.tensors), and reported on their
own line (specwake.judge.weights)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402, TID251 (torch is this test's subject, as in the workers)

from specwake.judge.weights import restored  # noqa: E402
from specwake.report.weights import uncovered_line, weights_line  # noqa: E402
from specwake.results import Diagnostic  # noqa: E402
from specwake.worker.coverage import uncovered  # noqa: E402
from specwake.worker.tensors import Reference, fingerprint  # noqa: E402


class Drafter(torch.nn.Module):
    """A DSpark-like drafter: `mask_embedding` registered, skipped by load_weights; a fused copy derived at its end."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(4, 4)
        self.mask_embedding = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
        self.fused = self.proj.weight.detach().clone()
        self.register_buffer("scalar", torch.ones(1))  # a buffer the checkpoint has, as Gemma4's layer_scalar

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters()) | dict(self.named_buffers())  # as AutoWeightsLoader looks them up
        for name, tensor in weights:
            if "mask_embedding" in name:  # "an unused placeholder"
                continue
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            else:
                loader(param, tensor)
        self.fused = self.proj.weight.detach().clone()  # new storage, as DSpark's _build_fused_kv_buffers()
        self.head = torch.nn.Identity()  # a submodule load_weights adds


def checkpoint(model: torch.nn.Module, device: str = "meta") -> list[tuple[str, torch.Tensor]]:
    skipped = ("mask_embedding", "derived")
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return [(n, torch.empty(p.shape, device=device)) for n, p in tensors if n not in skipped]


def test_the_dry_run_finds_what_no_load_writes_and_leaves_the_model_as_it_was() -> None:
    model = Drafter()
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    fused = model.fused
    assert uncovered(model, iter(checkpoint(model))) == ["mask_embedding"]
    assert all(torch.equal(p, values[n]) for n, p in model.named_parameters())
    assert model.fused is fused and "head" not in model._modules  # noqa: SLF001
    assert not any(hasattr(t, "weight_loader") for t in (*model.parameters(), *model.buffers()))


def test_a_parameter_derived_after_loading_is_not_one_no_load_writes() -> None:
    model = Drafter()
    built = {(id(m), n) for m in model.modules() for n in m._parameters}  # noqa: SLF001 (as vLLM records them)
    model.derived = torch.nn.Parameter(torch.ones(2), requires_grad=False)  # as MLA's W_UK_T, after loading
    assert uncovered(model, iter(checkpoint(model)), built) == ["mask_embedding"]
    assert uncovered(model, iter(checkpoint(model))) == ["derived", "mask_embedding"]


def test_a_load_path_that_writes_checkpoint_data_itself_makes_the_dry_run_fail() -> None:
    model = Drafter()
    params = dict(model.named_parameters())
    vllm_like = params["proj.weight"]
    vllm_like.weight_loader = lambda param, tensor: param.data.copy_(tensor)  # type: ignore[attr-defined]

    def copy_directly(weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            params[name].data.copy_(tensor)  # bypasses every weight_loader: a meta tensor cannot be copied out

    model.load_weights = copy_directly  # type: ignore[method-assign]
    before = vllm_like.detach().clone()
    with pytest.raises(NotImplementedError):
        uncovered(model, iter(checkpoint(model)))
    assert torch.equal(vllm_like, before) and vllm_like.weight_loader is not None  # type: ignore[attr-defined]


class Loads(torch.nn.Module):
    """A module that loads its weight itself, as vLLM's VocabParallelEmbedding does (`weight_loader` bound to it)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, 4), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: torch.Tensor, tensor: torch.Tensor) -> None:
        param.data.copy_(tensor)


def test_a_head_tied_to_an_embedding_the_proposer_replaced_counts_as_loaded() -> None:
    model = Drafter()
    own = Loads()  # the drafter's own embedding; its lm_head shares the weight (tie_weights)
    model.lm_head = torch.nn.Linear(4, 4, bias=False)
    model.lm_head.weight = own.weight
    model.embed = Loads()  # the proposer's replacement: the checkpoint's embedding tensor now lands here
    params = dict(model.named_parameters())
    weights = [(n, torch.empty(p.shape, device="meta")) for n, p in params.items() if n.startswith(("proj", "embed"))]
    assert uncovered(model, iter(weights)) == ["mask_embedding"]
    del model.embed  # nothing loads the head's weight: no module bound to it took part in the first load either
    model.lm_head.weight = torch.nn.Parameter(torch.ones(4, 4), requires_grad=False)
    assert uncovered(model, iter(weights[:2])) == ["lm_head.weight", "mask_embedding"]


def probe(cycle: int, point: str, draft: dict[str, Any]) -> Diagnostic:
    return Diagnostic.from_dict(
        {"cycle": cycle, "point": point, "fingerprints": [{"target": {"present": False}, "draft": draft}]}
    )


def test_a_parameter_no_load_writes_is_compared_apart_and_decides_nothing() -> None:
    model = Drafter()
    skipped = frozenset({"mask_embedding"})
    kept: Reference = {}
    fresh = fingerprint(model, keep=kept, uncovered=skipped)
    assert (fresh["uncovered"], fresh["uncovered_names"]) == (1, ["mask_embedding"])
    with torch.no_grad():
        model.mask_embedding.normal_()  # what cuMem handed back
    after = fingerprint(model, reference=kept, uncovered=skipped)
    assert (after["differ"], after["compared"], after["uncovered_differ"]) == (0, 4, 1)  # 2 proj, fused, scalar
    assert after["uncovered_differ_names"] == ["mask_embedding"]
    judged = fingerprint(model, reference=kept)  # today's reading: the placeholder counts as not restored
    assert (judged["differ"], judged["differ_names"]) == (1, ["mask_embedding"])

    diagnostics = [probe(0, "after fresh", fresh), probe(1, "after reload_weights", after)]
    assert restored(diagnostics, "draft") is True
    assert weights_line(diagnostics, "draft") == "draft: 0/4 tensors differ from fresh after reload_weights in cycle 1"
    assert uncovered_line(diagnostics, "draft") == (
        "draft: 1 parameter no load writes (mask_embedding), checksum not judged (a forward that reads one shows in"
        " AL and outputs): differs from fresh after reload_weights in cycle 1"
    )
    assert restored([*diagnostics[:1], probe(1, "after reload_weights", judged)], "draft") is False


def test_the_uncovered_line_when_restored_unknown_or_nothing_to_say() -> None:
    fresh = {"tensors": 3, "uncovered": 6, "uncovered_names": ["a", "b", "c", "d", "e"]}
    same = {"tensors": 3, "compared": 3, "differ": 0, "uncovered_differ": 0}
    line = uncovered_line([probe(0, "after fresh", fresh), probe(1, "after push", same)], "draft")
    assert line == (
        "draft: 6 parameters no load writes (a, b, c, d, e…), checksum not judged (a forward that reads one shows in"
        " AL and outputs): as fresh after every push"
    )
    failed = {"tensors": 3, "coverage_error": "NotImplementedError: Cannot copy out of meta tensor"}
    assert uncovered_line([probe(0, "after fresh", failed)], "draft") == (
        "draft: which parameters no load writes is unknown (NotImplementedError: Cannot copy out of meta tensor);"
        " all are judged"
    )
    assert uncovered_line([probe(0, "after fresh", {"tensors": 3})], "draft") is None
    assert uncovered_line([probe(1, "after reload_weights", same)], "draft") is None  # results of an older specwake
