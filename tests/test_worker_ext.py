"""The worker extension's pure parts on small torch modules (the real-vLLM runs exercise it inside workers)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake.worker_ext import (  # noqa: E402
    SpecwakeWorkerExtension,
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
    before = worker.specwake_fingerprint()
    assert before["target"]["all_zero"] == 0 and before["draft"]["all_zero"] == 0
    assert before["draft"]["shared_with_target"] == 1
    report = worker.specwake_emulate_discard()
    assert report["zeroed_tensors"] == 5 and report["draft_present"] is True  # 3 target + 2 head, embed once
    after = worker.specwake_fingerprint()
    assert after["target"]["all_zero"] == after["target"]["tensors"]
    assert after["draft"]["all_zero"] == after["draft"]["tensors"]
    assert bool(worker.model_runner.model.rope.eq(1).all())  # buffers survive, as in a real L2 sleep


def test_info_and_memory_are_plain_json() -> None:
    import json

    worker = Worker()
    info = worker.specwake_info()
    assert info["target_class"] == "Target" and info["draft_class"] == "Draft" and info["device"] == "cpu"
    assert isinstance(info["torch_version"], str)
    memory = worker.specwake_memory()
    assert memory == {"device": "cpu", "free_bytes": None, "total_bytes": None}
    json.dumps([info, memory, worker.specwake_fingerprint(), worker.specwake_emulate_discard()])
