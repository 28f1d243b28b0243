"""The worker extension's pure parts on small torch modules (the real-vLLM runs exercise it inside workers)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake.worker.extension import (  # noqa: E402
    SpecwakeWorkerExtension,
    checksum,
    find_draft,
    find_target,
    fingerprint,
    unique_parameters,
)


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


def test_finds_target_and_draft() -> None:
    runner = Runner()
    assert find_target(runner) is runner.model
    assert find_draft(runner) is runner.drafter.model
    assert find_draft(object()) is None


def test_shared_parameters_counted_once() -> None:
    runner = Runner()
    params = list(unique_parameters([runner.model, runner.drafter.model]))
    own = len(list(runner.model.parameters())) + len(list(runner.drafter.model.head.parameters()))
    assert len(params) == own  # the shared embedding appears once


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
    report = worker.specwake_emulate_discard()
    assert report["filled_tensors"] == 5 and report["draft_present"] is True  # 3 target + 2 head, embed once
    after = worker.specwake_fingerprint(compare_to="fresh")
    assert after["target"]["all_zero"] == after["target"]["tensors"]
    assert after["draft"]["all_zero"] == after["draft"]["tensors"]
    assert after["target"]["differ"] == after["target"]["compared"] == 3
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
    assert worker.specwake_emulate_discard(fill=fill)["fill"] == fill
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
    worker.specwake_emulate_discard(fill="random")
    worker.model_runner.model.load_state_dict(saved)  # the target restored, the drafter's head not
    after = worker.specwake_fingerprint(compare_to="fresh")
    assert after["target"]["differ"] == 0 and after["target"]["compared"] == 3
    assert after["draft"]["differ_names"] == ["head.weight", "head.bias"]


def test_unknown_fill_is_refused() -> None:
    with pytest.raises(ValueError, match="fill"):
        Worker().specwake_emulate_discard(fill="garbage")


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
    json.dumps([info, memory, worker.specwake_fingerprint(), worker.specwake_emulate_discard()], allow_nan=False)


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
    assert worker.specwake_emulate_discard(fill=fill)["packed_filled"] == 1
    assert check(layer.cpu_linear(x, layer.weight, None))
    after = worker.specwake_fingerprint(compare_to="fresh")["target"]
    assert after["packed"] == 1 and after["packed_discarded"] == 1 and after["empty"] == 1
    layer.cpu_linear = PackedLinear().cpu_linear  # what vLLM's process_weights_after_loading does on a reload
    assert worker.specwake_fingerprint(compare_to="fresh")["target"]["packed_discarded"] == 0


def test_a_push_scale_naming_no_pushed_tensor_fails_the_push(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo in push_scale would push unperturbed weights and judge a 'perturbed' push on them."""
    from specwake.worker import push

    pushed: list[tuple[str, float]] = []

    def push_target(runner: Any, scale: dict[str, float], seen: list[str]) -> str:
        # what the real push does with the checkpoint: stream it through `scaled`
        checkpoint = iter([("model.embed.weight", torch.ones(2)), ("lm_head.weight", torch.ones(2))])
        pushed.extend((name, float(t.sum())) for name, t in push.scaled(checkpoint, scale, seen))
        return "pushed"

    monkeypatch.setattr(push, "push_target", push_target)
    worker = Worker()
    answer = worker.specwake_push('{"to": ["target"], "scale": {"lm_head.weight": 3.0}}')
    assert answer == {"pushed": {"target": "pushed"}, "scaled": ["lm_head.weight"]}
    assert pushed == [("model.embed.weight", 2.0), ("lm_head.weight", 6.0)]
    with pytest.raises(ValueError, match="push_scale names no pushed tensor: lm_haed.weight"):
        worker.specwake_push('{"to": ["target"], "scale": {"lm_haed.weight": 3.0}}')
