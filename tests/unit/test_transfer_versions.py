"""A weight sync on a vLLM too old for it is refused before launch, naming the version that added what is missing.
Older vLLMs are stood in for by hiding modules and methods in sys.modules, so the check runs here without one."""

from __future__ import annotations

import sys
import types

import pytest

from specwake.worker.validate import TRANSFER_SINCE, transfer_problem

FACTORY = "vllm.distributed.weight_transfer.factory"
WORKER = "vllm.v1.worker.gpu_worker"


def stand_in(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: object) -> None:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_a_vllm_without_the_weight_transfer_api_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, FACTORY, None)  # `import` raises ImportError, as before vLLM 0.25
    problem = transfer_problem("m", [], syncs=True, draft_session=False)
    assert problem is not None and "no weight-transfer API" in problem and TRANSFER_SINCE in problem
    assert TRANSFER_SINCE == "vLLM 0.26"


def test_a_vllm_without_draft_sessions_is_refused_only_for_a_draft_session(monkeypatch: pytest.MonkeyPatch) -> None:
    class Worker:  # vLLM 0.25's Worker: target sessions, no start_draft_weight_update
        def start_weight_update(self) -> None: ...

    stand_in(monkeypatch, FACTORY, WeightTransferEngineFactory=object)
    stand_in(monkeypatch, WORKER, Worker=Worker)
    problem = transfer_problem("m", [], syncs=True, draft_session=True)
    assert problem is not None and "Worker.start_draft_weight_update" in problem and TRANSFER_SINCE in problem


def test_no_sync_asks_nothing_of_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, FACTORY, None)
    monkeypatch.setattr("specwake.worker.validate._parser", lambda: types.SimpleNamespace(parse_args=lambda a: None))
    assert transfer_problem("m", [], syncs=False, draft_session=False) is None
