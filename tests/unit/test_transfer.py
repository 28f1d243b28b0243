"""specwake's weight-transfer engine on tiny safetensors checkpoints, driven as a vLLM worker drives it (manifest at
startup, then parse_update_info + receive_weights per /update_weights): it resolves a model's files once, and sends
exactly the tensors vLLM's own default loader reads for that model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers.procs import require_module

require_module("vllm")  # the engine subclasses vLLM's `ipc` engine; its loader is the oracle

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from vllm.config.load import LoadConfig  # noqa: E402
from vllm.model_executor.model_loader import default_loader  # noqa: E402
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader  # noqa: E402

from specwake.weight_updates import Chosen, TransferChunk  # noqa: E402
from specwake.worker import transfer  # noqa: E402
from specwake.worker.extension import SpecwakeWorkerExtension  # noqa: E402


def write(folder: Path, file: str, names: list[str]) -> None:
    """A safetensors file whose tensors differ from each other (each filled with its own index)."""
    (folder / file).parent.mkdir(parents=True, exist_ok=True)
    save_file({name: torch.full((2, 3), float(i)) for i, name in enumerate(names)}, str(folder / file))


class Recorder(torch.nn.Module):
    """A session model: records every (name, tensor) that a load hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights: Any) -> set[str]:
        got = list(weights)
        self.loaded += got
        return {name for name, _ in got}


class Worker(SpecwakeWorkerExtension):
    """What the extension sees of vLLM's worker: its runner and the weight-transfer engine vLLM created."""

    def __init__(self, model: torch.nn.Module, checkpoint: str) -> None:
        model_config = SimpleNamespace(model=checkpoint, revision=None)
        vllm_config = SimpleNamespace(
            model_config=model_config, load_config=LoadConfig(), speculative_config=None, parallel_config=None
        )
        self.model_runner = SimpleNamespace(vllm_config=vllm_config, get_model=lambda: model)
        self.rank = 0
        self.weight_transfer_engine = transfer._engine_class()(
            SimpleNamespace(backend="specwake_file"), vllm_config, torch.device("cpu"), model
        )

    def sync(self) -> None:
        """One target session's /update_weights calls, as the CLI sends them (the manifest asked at startup)."""
        for chunk in self.chunks:
            info = {k: v for k, v in chunk.items() if k != "role"}
            engine = self.weight_transfer_engine
            engine.receive_weights(engine.parse_update_info(info))

    def startup(self) -> Worker:
        self.chunks = self.specwake_transfer_manifest("target")
        return self


def vllm_reads(model: torch.nn.Module, checkpoint: str) -> dict[str, torch.Tensor]:
    """What vLLM's default loader hands `model.load_weights` at startup: the oracle for a sync."""
    config = SimpleNamespace(model=checkpoint, revision=None)
    return dict(DefaultModelLoader(LoadConfig()).get_all_weights(config, model))  # type: ignore[arg-type]


def received(model: Recorder) -> dict[str, torch.Tensor]:
    names = [name for name, _ in model.loaded]
    assert len(names) == len(set(names))  # no tensor sent twice
    return dict(model.loaded)


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[name], want[name]) for name in want)


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, answer: Any = None) -> list[Any]:
    """Count the calls of `owner.name`; answer them with `answer(*args)` where given, else call through."""
    calls: list[Any] = []
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return answer(*args, **kwargs) if answer is not None else real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_local_checkpoint_is_resolved_once_per_engine_across_chunks_and_sessions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "model.safetensors", [f"layer.{i}" for i in range(40)])  # 3 chunks of 16
    resolutions = count_calls(monkeypatch, DefaultModelLoader, "_prepare_weights")
    worker = Worker(Recorder(), str(tmp_path)).startup()
    assert len(worker.chunks) == 3
    for _ in range(2):  # two cycles' sessions
        worker.sync()
    assert len(resolutions) == 1  # the startup manifest's, on this rank; no /update_weights resolved again
    assert len(worker.weight_transfer_engine.model.loaded) == 80


def test_a_hub_id_asks_the_hub_once_per_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub is stood in for at vLLM's own boundary: its snapshot download answers with a local folder."""
    write(tmp_path, "model.safetensors", [f"layer.{i}" for i in range(20)])
    downloads = count_calls(monkeypatch, default_loader, "download_weights_from_hf", lambda *a, **k: str(tmp_path))
    listings = count_calls(monkeypatch, default_loader, "list_filtered_repo_files", lambda *a, **k: [])
    model = Recorder()
    worker = Worker(model, "org/tiny-model").startup()
    worker.sync()
    worker.sync()
    assert len(worker.chunks) == 2 and len(model.loaded) == 40
    assert len(downloads) == 1 and len(listings) == 1  # vLLM's `auto` format asks the Hub's file list too


def test_allow_patterns_overrides_choose_the_files(tmp_path: Path) -> None:
    class Diffusers(Recorder):  # as vLLM's Cosmos3 checkpoints: the weights live in sub-folders
        allow_patterns_overrides = ["transformer/*.safetensors"]

    write(tmp_path, "transformer/part-1.safetensors", ["t.a", "t.b"])
    write(tmp_path, "transformer/part-2.safetensors", ["t.c"])
    write(tmp_path, "vae/vae.safetensors", ["v.a"])
    write(tmp_path, "other.safetensors", ["o.a"])  # what the default patterns would read
    model = Diffusers()
    Worker(model, str(tmp_path)).startup().sync()
    want = vllm_reads(Diffusers(), str(tmp_path))
    assert set(want) == {"t.a", "t.b", "t.c"}  # the oracle reads the override, not the default patterns
    assert_same(received(model), want)


def test_secondary_weights_and_unused_shards_follow_vllms_loader(tmp_path: Path) -> None:
    class WithHead(Recorder):  # as vLLM's D3 / BGE-M3: a head from its own file, loaded under a prefix
        def __init__(self) -> None:
            super().__init__()
            self.secondary_weights = [
                DefaultModelLoader.Source(
                    str(tmp_path), None, prefix="score.", allow_patterns_overrides=["score.safetensors"]
                )
            ]

        def is_unused_checkpoint_weight(self, name: str) -> bool:  # as vLLM's MTP drafters
            return name.startswith("unused.")

    write(tmp_path, "model-1.safetensors", ["w.a", "w.b", "unused.mixed"])
    write(tmp_path, "model-2.safetensors", ["unused.only"])  # a shard the loader skips
    write(tmp_path, "score.safetensors", ["weight"])  # not in the index: not the primary's
    index = {"w.a": "model-1.safetensors", "w.b": "model-1.safetensors", "unused.mixed": "model-1.safetensors"}
    index["unused.only"] = "model-2.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    model = WithHead()
    worker = Worker(model, str(tmp_path)).startup()
    worker.sync()
    want = vllm_reads(WithHead(), str(tmp_path))
    assert "score.weight" in want and "unused.only" not in want  # the oracle: the head prefixed, the shard skipped
    # the unused names of a shard vLLM reads anyway are not sent: the model's load_weights would skip them
    assert_same(received(model), {name: t for name, t in want.items() if not name.startswith("unused.")})
    assert {c.get("prefix", "") for c in worker.chunks} == {"", "score."}


def test_a_file_outside_the_sources_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "ckpt", "model.safetensors", ["a"])
    write(tmp_path, "elsewhere.safetensors", ["a"])
    worker = Worker(Recorder(), str(tmp_path / "ckpt")).startup()
    engine = worker.weight_transfer_engine
    for info in (
        {"file": str(tmp_path / "elsewhere.safetensors"), "names": ["a"]},
        {"file": str(tmp_path / "ckpt" / "model.safetensors"), "names": ["a"], "prefix": "score."},
    ):
        with pytest.raises(ValueError, match="is not a checkpoint file of"):
            engine.receive_weights(engine.parse_update_info(info))


def test_a_perturbed_partial_sync_sends_fewer_tensors_and_scales_the_ones_it_is_told(tmp_path: Path) -> None:
    """push_scale and push_skip on a sync: the CLI leaves names out of its chunks and attaches a factor to others;
    the engine multiplies exactly those as it reads them."""
    write(tmp_path, "model.safetensors", ["a", "b", "c"])
    model = Recorder()
    worker = Worker(model, str(tmp_path)).startup()
    (chunk,) = [TransferChunk.from_dict(c) for c in worker.chunks]
    narrowed = chunk.narrowed(Chosen(("a",), {"c": 1.5}))
    assert narrowed is not None
    worker.chunks = [narrowed.to_dict()]
    worker.sync()
    got = received(model)
    assert sorted(got) == ["b", "c"]
    assert torch.equal(got["b"], torch.full((2, 3), 1.0)) and torch.equal(got["c"], torch.full((2, 3), 3.0))
