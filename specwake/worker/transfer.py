"""specwake's transport for vLLM's weight-transfer API (`--weight-transfer-config '{"backend": "specwake_file"}'`),
which works wherever vLLM does, CPU included.

Everything except the transport is vLLM's own code: the engine subclasses vLLM's `ipc` engine, so a session's start
(`initialize_layerwise_reload` of the session's model), its finish (`finalize_layerwise_reload`), the worker's
session bookkeeping and the drafter targeting of `start_draft_weight_update` all run untouched. Only
`receive_weights` is replaced: where the `ipc` engine rebuilds CUDA tensors from IPC handles, this one reads the named
tensors from a safetensors file of the session model's own checkpoint (memory-mapped, so every rank reads the same
pages with no rendezvous) and hands them to the model's `load_weights`, as the `ipc` engine does.

specwake stands in for the trainer: its "new weights" are the checkpoint the server loaded, so a sync that reaches
every tensor restores the model exactly, and the fingerprints can judge it. The CLI asks the workers for the
checkpoint's files and tensor names (`manifest`), then sends them in chunks through POST /update_weights. Which files
those are is vLLM's default loader's answer (for a Hub id it asks the Hub), resolved once per model and engine: the
manifest call at startup resolves them on every rank, and no /update_weights asks again. A perturbed or partial sync
(push_scale, push_skip) is the trainer's doing too: the CLI leaves names out of the chunks it sends, and a chunk's
`scale` says which of its tensors to multiply, by what, as they are read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwake.protocol import TRANSFER_BACKEND
from specwake.weight_updates import TransferChunk

CHUNK_TENSORS = 16  # tensors per /update_weights call: several calls per session, as trainers send them


@dataclass(frozen=True)
class WeightFiles:
    """One weight source of a model as vLLM's default loader reads it (`DefaultModelLoader.Source`): its safetensors
    files, the prefix the loader puts before each tensor name, and the names the model declares it does not load."""

    prefix: str
    files: tuple[str, ...]
    unused: Callable[[str], bool] | None = field(default=None, compare=False)

    def names(self, file: str) -> list[str]:
        """The tensor names of one of the files that the model loads, in the file's order."""
        from safetensors import safe_open

        with safe_open(file, framework="pt") as opened:
            names = list(opened.keys())
        return [n for n in names if self.unused is None or not self.unused(n)]


def _files(loader: Any, source: Any, unused: Callable[[str], bool] | None) -> WeightFiles:
    """What `DefaultModelLoader._get_weights_iterator` reads for one source: `_prepare_weights` with the source's
    patterns, then the shards holding only unused weights dropped."""
    _, files, use_safetensors, _ = loader._prepare_weights(
        source.model_or_path, source.subfolder, source.revision, source.fall_back_to_pt,
        source.allow_patterns_overrides,
    )  # fmt: skip
    what = source.model_or_path + (f" (weights prefixed {source.prefix!r})" if source.prefix else "")
    if not use_safetensors:
        raise ValueError(f"{what}: no safetensors files (specwake's transport reads only those)")
    if unused is not None:
        with contextlib.suppress(ImportError):  # a vLLM without the filter reads every shard
            from vllm.model_executor.model_loader.weight_utils import filter_safetensors_files_by_weight_name

            files = filter_safetensors_files_by_weight_name(files, unused)
    return WeightFiles(source.prefix, tuple(sorted(str(Path(f).resolve()) for f in files)), unused)


def weight_sources(model: Any, model_config: Any, load_config: Any) -> list[WeightFiles]:
    """Every file vLLM's default loader reads for `model` (`DefaultModelLoader.get_all_weights`): the checkpoint
    under the model's `allow_patterns_overrides` and `fall_back_to_pt_during_load`, then each of its
    `secondary_weights` sources with their own patterns and prefix; for a Hub id, the snapshot vLLM downloaded."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    loader = DefaultModelLoader(load_config)
    primary = DefaultModelLoader.Source(
        model_config.model,
        model_config.revision,
        fall_back_to_pt=getattr(model, "fall_back_to_pt_during_load", True),
        allow_patterns_overrides=getattr(model, "allow_patterns_overrides", None),
    )
    found = [_files(loader, primary, getattr(model, "is_unused_checkpoint_weight", None))]
    secondary: Iterable[Any] = getattr(model, "secondary_weights", None) or ()
    return found + [_files(loader, s, getattr(s, "is_unused_weight", None)) for s in secondary]


def session_load_config(vllm_config: Any, model_config: Any) -> Any:
    """The load config vLLM loaded a session's model with: the target's, or the drafter's (`get_draft_load_config`)."""
    spec = vllm_config.speculative_config
    if spec is not None and model_config is spec.draft_model_config:
        try:
            from vllm.model_executor.model_loader.utils import get_draft_load_config

            return get_draft_load_config(vllm_config)
        except ImportError:
            pass
    return vllm_config.load_config


Resolve = Callable[[Any, Any, Any], list[WeightFiles]]


class SessionSources:
    """The weight sources of each model a session can target, resolved on first use and kept: one engine's answer
    for the life of the server (the checkpoint does not change under a running server)."""

    def __init__(self, vllm_config: Any, resolve: Resolve = weight_sources) -> None:
        self.vllm_config = vllm_config
        self._resolve = resolve
        self._known: dict[int, tuple[Any, tuple[WeightFiles, ...]]] = {}  # id(model) → (model, its sources)

    def resolved(self) -> tuple[WeightFiles, ...]:
        """Every source resolved so far, of any model."""
        return tuple(source for _, sources in self._known.values() for source in sources)

    def of(self, model: Any, model_config: Any) -> tuple[WeightFiles, ...]:
        known = self._known.get(id(model))
        if known is None or known[0] is not model:
            load_config = session_load_config(self.vllm_config, model_config)
            known = (model, tuple(self._resolve(model, model_config, load_config)))
            self._known[id(model)] = known
        return known[1]


def manifest(sources: Iterable[WeightFiles], role: str, chunk: int = CHUNK_TENSORS) -> list[TransferChunk]:
    """The chunks of one session: every tensor the model loads from each of its sources, `chunk` names per call."""
    chunks = []
    for source in sources:
        for file in source.files:
            names = source.names(file)
            chunks += [
                TransferChunk(role, file, tuple(names[i : i + chunk]), source.prefix)
                for i in range(0, len(names), chunk)
            ]
    return chunks


def _partial_load_allowed() -> contextlib.AbstractContextManager[None]:
    """A chunk holds some of a model's tensors: vLLM's MTP loaders check that a load saw every MTP layer, unless
    told otherwise (`disable_mtp_completeness_check`, 0.32 and 0.33). 0.34 has no such switch: its DeepSeek MTP loader
    checks nothing, and Step5's, which still does, skips it while a weight update is active, as the engine's
    start_weight_update marks (`start_reload`, model_loader/reload/lifecycle.py)."""
    try:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check
    except ImportError:  # vLLM >= 0.34: no such switch; its MTP loaders skip the check during a weight update
        return contextlib.nullcontext()
    return disable_mtp_completeness_check()


def _engine_class() -> type:
    import torch
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateInfo
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine, IPCWeightTransferInitInfo

    @dataclass
    class FileInitInfo(IPCWeightTransferInitInfo):
        """Nothing to agree on: the files are the model's own checkpoint (`packed` stays False)."""

    @dataclass
    class FileUpdateInfo(WeightTransferUpdateInfo):
        file: str
        names: list[str] = field(default_factory=list)
        prefix: str = ""  # the source's prefix (`secondary_weights`), put before each name as vLLM's loader does
        scale: dict[str, float] = field(default_factory=dict)  # names (as in the file) a perturbed sync scales

    class FileWeightTransferEngine(IPCWeightTransferEngine):
        """vLLM's `ipc` engine with a file transport instead of CUDA IPC (see the module docstring)."""

        init_info_cls = FileInitInfo
        update_info_cls = FileUpdateInfo  # type: ignore[assignment]  # not CUDA IPC handles: a file and names

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.sources = SessionSources(self.vllm_config)

        def init_transfer_engine(self, init_info: Any) -> None:
            self.packed = False

        def receive_weights(self, update_info: Any) -> None:
            from safetensors import safe_open

            # Only a checkpoint of a model this server loaded (the path comes over HTTP): the session model's own, or
            # the other model's that a trainer may send it by mistake (a planted push_fault does)
            file = str(Path(update_info.file).resolve())
            sources = (*self.sources.of(self.model, self.model_config), *self.sources.resolved())
            if not any(s.prefix == update_info.prefix and file in s.files for s in sources):
                raise ValueError(
                    f"{update_info.file} (prefix {update_info.prefix!r}) is not a checkpoint file of"
                    f" {self.model_config.model}"
                )
            with safe_open(file, framework="pt", device="cpu") as opened:
                weights: list[tuple[str, torch.Tensor]] = [
                    (update_info.prefix + n, _scaled(opened.get_tensor(n), update_info.scale.get(n)))
                    for n in update_info.names
                ]
            with _partial_load_allowed():
                self.model.load_weights(weights)  # type: ignore[operator]

    return FileWeightTransferEngine


def _scaled(tensor: Any, factor: float | None) -> Any:
    """A tensor as a perturbed sync sends it: × `factor` (specwake.worker.push.times), or as read."""
    if factor is None:
        return tensor
    from specwake.worker.push import times

    return times(tensor, factor)


def register() -> bool:
    """Register the engine with vLLM's factory under TRANSFER_BACKEND (once per process); False when this vLLM has
    no weight-transfer API with engine-owned sessions (before 0.25)."""
    try:
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return False
    if not hasattr(WeightTransferEngine, "start_weight_update"):
        return False
    if TRANSFER_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(TRANSFER_BACKEND, _engine_class())
    return True
