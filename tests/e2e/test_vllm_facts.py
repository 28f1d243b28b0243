"""What specwake's emulated discard and fingerprints assume about vLLM, pinned against the installed vLLM's own
classes and sources (no server): which tensors an L2 sleep keeps, which it discards, which are not weights, and which
copies of a weight the CPU build's forward reads instead of the parameter; and that a model class inspected in the
process (a CPU server through specwake's launcher) is cached as vLLM's own subprocess caches it.
When a vLLM release changes one of these, this module fails and names the assumption.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.procs import require_module

require_module("vllm")

import torch  # noqa: E402
from vllm.model_executor.layers.attention import attention  # noqa: E402
from vllm.model_executor.model_loader.reload import layerwise  # noqa: E402
from vllm.model_executor.models import registry  # noqa: E402
from vllm.v1.worker import gpu_worker  # noqa: E402

from specwake.prepare.plan import INSPECT_IN_PROCESS  # noqa: E402
from specwake.worker import serve  # noqa: E402
from specwake.worker.packed import packed_copies, unpacked  # noqa: E402
from specwake.worker.tensors import HOST_SIDE_ATTRIBUTES, KV_CACHE_ATTRIBUTE, Reference, fingerprint, inventory  # noqa: E402


def test_the_only_plain_tensors_quant_scales_leave_are_the_host_side_copies() -> None:
    layer = torch.nn.Module()
    attention.set_default_quant_scales(layer, register_buffer=True)
    plain = {name for name, value in vars(layer).items() if isinstance(value, torch.Tensor)}
    assert plain == set(HOST_SIDE_ATTRIBUTES)
    assert {e.name for e in inventory(layer)} == {"_k_scale", "_v_scale", "_q_scale", "_prob_scale"}  # buffers
    before = {name: vars(layer)[name] for name in HOST_SIDE_ATTRIBUTES}
    attention.set_default_quant_scales(layer)  # what process_weights_after_loading runs on every reload
    assert all(vars(layer)[name] is not before[name] for name in HOST_SIDE_ATTRIBUTES)  # recreated: they move


def test_an_l2_sleep_saves_target_and_drafter_buffers_and_no_plain_attribute() -> None:
    sleep, wake = inspect.getsource(gpu_worker.Worker.sleep), inspect.getsource(gpu_worker.Worker.wake_up)
    assert "model.named_buffers()" in sleep and "draft.named_buffers()" in sleep
    assert "_sleep_saved_buffers" in wake and "_sleep_saved_draft_buffers" in wake
    preserve = inspect.getsource(gpu_worker.Worker._save_sleep_parameters)
    assert "named_parameters" in inspect.getsource(gpu_worker.Worker._get_sleep_parameters)
    assert "not param.is_cpu" in preserve  # why --sleep-preserve-parameter-names does nothing on CPU


def test_layerwise_reload_keeps_the_storage_of_parameters_and_buffers_only() -> None:
    kept = inspect.getsource(layerwise.initialize_layerwise_reload)
    assert "get_layer_params_buffers(layer)" in kept
    copy_back = inspect.getsource(layerwise._copy_and_restore_kernel_tensors)
    assert "param.data.copy_" in copy_back and "buffer.data.copy_" in copy_back


def test_attention_layers_hold_their_kv_cache_as_a_plain_attribute() -> None:
    assert f"self.{KV_CACHE_ATTRIBUTE} = torch.tensor([])" in inspect.getsource(attention.Attention.__init__)


def test_rmsnorm_without_weight_keeps_an_unread_placeholder() -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm

    with set_current_vllm_config(VllmConfig()):
        norm = RMSNorm(8, has_weight=False)
        x = torch.randn(2, 8)
        before = norm.forward_native(x)
        norm.weight.zero_()
        assert torch.equal(norm.forward_native(x), before)  # never read
    entries = {e.name: e for e in inventory(norm)}
    assert entries["weight"].kind == "attribute" and entries["weight"].unread


def test_rmsnorm_with_weight_is_a_parameter() -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm

    with set_current_vllm_config(VllmConfig()):
        norm = RMSNorm(8)
    assert [(e.name, e.kind, e.unread) for e in inventory(norm)] == [("weight", "parameter", False)]


def test_a_push_runs_with_the_workers_vllm_config_current(monkeypatch) -> None:  # noqa: ANN001
    """vLLM wraps every reload in set_current_vllm_config; /collective_rpc does not, and get_current_vllm_config()
    raises without it (quantization methods call it while processing weights)."""
    from vllm.config import VllmConfig, get_current_vllm_config

    from specwake.worker import push
    from specwake.worker.extension import SpecwakeWorkerExtension

    config = VllmConfig()
    seen: list[object] = []
    monkeypatch.setattr(push, "push_target", lambda *_: seen.append(get_current_vllm_config()))

    class Worker(SpecwakeWorkerExtension):
        model_runner = type("Runner", (), {"vllm_config": config})()

    Worker().specwake_push('{"to": ["target"]}')
    assert seen == [config]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-rank tensor-parallel group in this process, as a worker has: vLLM's linear layers read their rank there."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    init = tmp_path_factory.mktemp("one-rank") / "init"
    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(1, 0, f"file://{init}", 0, "gloo")
        parallel_state.initialize_model_parallel(1)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()


def packed_layer(kind: str, dtype: torch.dtype) -> torch.nn.Module:
    """One layer of each kind the CPU families pack, built by vLLM (linear layers are 40 × 24 but QKV's 48 × 24)."""
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    build = {
        "replicated": lambda: linear.ReplicatedLinear(24, 40, bias=True, params_dtype=dtype),
        "column": lambda: linear.ColumnParallelLinear(24, 40, bias=False, params_dtype=dtype),
        "merged column": lambda: linear.MergedColumnParallelLinear(24, [16, 24], bias=False, params_dtype=dtype),
        "qkv": lambda: linear.QKVParallelLinear(24, 8, 4, 2, bias=True, params_dtype=dtype),
        "row": lambda: linear.RowParallelLinear(24, 40, bias=False, params_dtype=dtype),
        "lm head": lambda: ParallelLMHead(40, 24, params_dtype=dtype),
        "embedding": lambda: VocabParallelEmbedding(40, 24, params_dtype=dtype),
    }
    return build[kind]()


def loaded(layer: torch.nn.Module, weight: torch.Tensor) -> None:
    """`weight` loaded into the layer and processed as a load or reload on CPU does."""
    layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    layer.quant_method.process_weights_after_loading(layer)


KINDS = ("replicated", "column", "merged column", "qkv", "row", "lm head", "embedding")


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_the_cpu_build_packs_each_layer_kind_and_the_fingerprint_reads_the_copy_back(
    kind: str, dtype: torch.dtype
) -> None:
    """dispatch_cpu_unquantized_gemm packs the weight behind `cpu_linear` and empties a linear layer's parameter; the
    forward reads the copy only. specwake reads it back bit for bit and tells a copy packed from ×1.01 values."""
    layer = packed_layer(kind, dtype)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(layer.weight.shape, generator=generator).to(dtype)
    loaded(layer, weight)
    assert (layer.weight.numel() == 0) == (kind not in ("lm head", "embedding"))
    x = torch.randn(3, 24, generator=generator).to(dtype)
    before = layer.quant_method.apply(layer, x)
    if layer.weight.numel():
        with torch.no_grad():
            layer.weight.zero_()  # an LM head keeps its parameter, yet its forward reads the packed copy only
        assert torch.equal(layer.quant_method.apply(layer, x), before)
        with torch.no_grad():
            layer.weight.copy_(weight)
    (copy,) = packed_copies(layer)
    blocks = unpacked(copy)
    assert blocks is not None and torch.equal(torch.cat(list(blocks)).reshape(weight.shape[1], -1), weight.t())
    kept: Reference = {}
    fresh = fingerprint(layer, keep=kept)
    assert fresh["unpacked"] == 1 and fresh["empty"] == 0
    assert fingerprint(layer, reference=kept)["differ"] == 0  # the same bytes at every call
    loaded(layer, weight * 1.01)
    assert fingerprint(layer, reference=kept)["differ_names"] == ["weight"]
    loaded(layer, weight)
    assert fingerprint(layer, reference=kept)["differ"] == 0


def test_a_model_class_inspected_in_process_is_cached_as_vllms_subprocess_caches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """specwake/worker/serve.py, inspect_models_in_process: the answer vLLM keeps under VLLM_CACHE_ROOT/modelinfos for
    a model class (here the target of the tiny pair), found in this process, is the one its subprocess finds."""
    model = registry._LazyRegisteredModel("vllm.model_executor.models.llama", "LlamaForCausalLM")
    monkeypatch.setattr(registry, "_run_in_subprocess", registry._run_in_subprocess)  # put back after the test
    answers = {}
    for where in ("subprocess", "process"):
        root = tmp_path / where
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(root))
        if where == "process":
            vllms = registry._run_in_subprocess
            monkeypatch.setenv(INSPECT_IN_PROCESS, "1")
            serve.inspect_models_in_process()
            assert registry._run_in_subprocess is not vllms
        model.inspect_model_cls()
        answers[where] = json.loads((root / "modelinfos" / model._get_cache_filename()).read_text())
    assert answers["process"] == answers["subprocess"]
