"""The worker says which executor runs it: the run's result then records whether the worker shared the engine core's
process ("uni") or had its own ("mp"), as measured inside the server rather than inferred from its environment."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers.procs import require_module

require_module("torch")  # torch comes with vLLM; the CLI side never imports it

import torch  # noqa: E402

from specwake.worker.extension import SpecwakeWorkerExtension  # noqa: E402


class Runner:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(2, 2)

    def get_model(self) -> Any:
        return self.model


class CustomExecutor:
    pass


class Worker(SpecwakeWorkerExtension):
    def __init__(self, backend: object) -> None:
        self.model_runner = Runner()
        self.rank = 0
        self.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend=backend))


@pytest.mark.parametrize(("backend", "said"), [("uni", "uni"), ("mp", "mp"), (CustomExecutor, "CustomExecutor")])
def test_info_names_the_executor(backend: object, said: str) -> None:
    assert Worker(backend).specwake_info()["executor"] == said


def test_a_worker_without_a_config_says_nothing() -> None:
    worker = Worker("uni")
    del worker.vllm_config
    assert worker.specwake_info()["executor"] is None


def test_with_an_answer_folder_each_worker_leaves_its_answer_named_by_engine_and_rank(tmp_path: Any) -> None:
    worker = Worker("mp")
    worker.vllm_config.parallel_config.data_parallel_index = 1  # type: ignore[attr-defined]
    info = worker.specwake_info(answer_dir=str(tmp_path))
    assert info["engine"] == 1 and info["tp_rank"] == 0 and info["world_size"] is None  # no TP group outside vLLM
    (left,) = tmp_path.iterdir()
    assert left.name == "1-0.json" and json.loads(left.read_text()) == {"engine": 1, "rank": 0, "answer": info}
