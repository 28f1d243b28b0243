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
checkpoint's files and tensor names (`manifest`), then sends them in chunks through POST /update_weights.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwake.protocol import TRANSFER_BACKEND, TransferChunk

CHUNK_TENSORS = 16  # tensors per /update_weights call: several calls per session, as trainers send them


def checkpoint_files(model_config: Any, load_config: Any) -> list[str]:
    """The safetensors files vLLM's default loader reads for `model_config` (a local folder, or the Hub snapshot
    it downloaded at startup), as absolute paths."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    loader = DefaultModelLoader(load_config)
    _, files, use_safetensors, _ = loader._prepare_weights(
        model_config.model, getattr(model_config, "subfolder", None), model_config.revision,
        fall_back_to_pt=False, allow_patterns_overrides=None,
    )  # fmt: skip
    if not use_safetensors:
        raise ValueError(f"{model_config.model}: no safetensors files (specwake's transport reads only those)")
    return sorted(str(Path(f).resolve()) for f in files)


def session_files(vllm_config: Any, model_config: Any) -> list[str]:
    """The checkpoint files of a session's model: the target's, or the drafter's (with the drafter's load config)."""
    load_config = vllm_config.load_config
    spec = vllm_config.speculative_config
    if spec is not None and model_config is spec.draft_model_config:
        try:
            from vllm.model_executor.model_loader.utils import get_draft_load_config

            load_config = get_draft_load_config(vllm_config)
        except ImportError:
            pass
    return checkpoint_files(model_config, load_config)


def manifest(vllm_config: Any, role: str, chunk: int = CHUNK_TENSORS) -> list[TransferChunk]:
    """The chunks of one session: every tensor of the session model's checkpoint, `chunk` names per call; none for
    a drafter session when the server has no drafter model."""
    from safetensors import safe_open

    model_config = vllm_config.model_config
    if role == "draft":
        spec = vllm_config.speculative_config
        if spec is None or spec.draft_model_config is None:
            return []
        model_config = spec.draft_model_config
    chunks = []
    for file in session_files(vllm_config, model_config):
        with safe_open(file, framework="pt") as opened:
            names = list(opened.keys())
        chunks += [TransferChunk(role, file, tuple(names[i : i + chunk])) for i in range(0, len(names), chunk)]
    return chunks


def _partial_load_allowed() -> contextlib.AbstractContextManager[None]:
    """A chunk holds some of a model's tensors: vLLM's MTP loaders check that a load saw every MTP layer, unless
    told otherwise (`disable_mtp_completeness_check`, in the vLLM releases that have the check)."""
    try:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check
    except ImportError:
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

    class FileWeightTransferEngine(IPCWeightTransferEngine):
        """vLLM's `ipc` engine with a file transport instead of CUDA IPC (see the module docstring)."""

        init_info_cls = FileInitInfo
        update_info_cls = FileUpdateInfo  # type: ignore[assignment]  # not CUDA IPC handles: a file and names

        def init_transfer_engine(self, init_info: Any) -> None:
            self.packed = False

        def receive_weights(self, update_info: Any) -> None:
            from safetensors import safe_open

            # Only the session model's own checkpoint: the path comes over HTTP.
            allowed = session_files(self.vllm_config, self.model_config)
            file = str(Path(update_info.file).resolve())
            if file not in allowed:
                raise ValueError(f"{update_info.file} is not a checkpoint file of {self.model_config.model}")
            with safe_open(file, framework="pt", device="cpu") as opened:
                weights: list[tuple[str, torch.Tensor]] = [(n, opened.get_tensor(n)) for n in update_info.names]
            with _partial_load_allowed():
                self.model.load_weights(weights)  # type: ignore[operator]

    return FileWeightTransferEngine


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
