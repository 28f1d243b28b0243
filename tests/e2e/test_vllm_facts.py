"""What specwake's emulated discard and fingerprints assume about vLLM, pinned against the installed vLLM's own
classes and sources (no server): which tensors an L2 sleep keeps, which it discards, and which are not weights.
When a vLLM release changes one of these, this module fails and names the assumption.
"""

from __future__ import annotations

import inspect

from tests.helpers.procs import require_module

require_module("vllm")

import torch  # noqa: E402
from vllm.model_executor.layers.attention import attention  # noqa: E402
from vllm.model_executor.model_loader.reload import layerwise  # noqa: E402
from vllm.v1.worker import gpu_worker  # noqa: E402

from specwake.worker.tensors import HOST_SIDE_ATTRIBUTES, KV_CACHE_ATTRIBUTE, inventory  # noqa: E402


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
    monkeypatch.setattr(push, "push_target", lambda runner, scale, names: seen.append(get_current_vllm_config()))

    class Worker(SpecwakeWorkerExtension):
        model_runner = type("Runner", (), {"vllm_config": config})()

    Worker().specwake_push('{"to": ["target"]}')
    assert seen == [config]
