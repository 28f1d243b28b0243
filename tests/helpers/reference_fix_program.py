"""Run by tests/e2e/test_reference_fix.py in a subprocess whose PYTHONPATH starts with an overlay of the installed vLLM
patched by a draft-reload diff: `python tests/helpers/reference_fix_program.py [CHECK...]` (default: all). Exercises the
patch's reload_draft_weights on small torch modules built to look like vLLM drafters; prints one line per check,
"ok CHECK" or "FAIL CHECK: error" (importing vLLM takes seconds, so one process runs every check).

The module loader is replaced by an in-memory checkpoint; everything else (layerwise reload, its metadata, the
patched unbinding) is vLLM's own code from the overlay.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn as nn
import vllm.model_executor.model_loader.utils as loader_utils
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.model_loader.reload import inplace
from vllm.model_executor.model_loader.reload.layerwise import record_metadata_for_reloading


class Embedding(VocabParallelEmbedding):
    """An embedding vLLM recognises as such, without vLLM's distributed setup."""

    def __init__(self, vocab: int, hidden: int) -> None:
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.randn(vocab, hidden), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)


class Linear(nn.Module):
    def __init__(self, out: int, inp: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out, inp), requires_grad=False)


class Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_size = 4
        self.register_buffer("cos_sin_cache", torch.arange(8.0), persistent=False)


def load_into(model: nn.Module, weights, fail_on: str | None = None) -> None:  # noqa: ANN001
    params = dict(model.named_parameters())
    for name, tensor in weights:
        if name == fail_on:
            raise RuntimeError("load failed on purpose")
        param = params[name]
        getattr(param, "weight_loader", lambda p, w: p.data.copy_(w))(param, tensor)


def reload(draft: nn.Module, target: nn.Module, checkpoint: dict[str, torch.Tensor]) -> None:
    config = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(draft_model_config=types.SimpleNamespace(dtype=torch.float32))
    )
    inplace.get_model_loader = lambda _: types.SimpleNamespace(get_all_weights=lambda *_: iter(checkpoint.items()))
    loader_utils.get_draft_load_config = lambda _: types.SimpleNamespace(load_format="memory")
    inplace.reload_draft_weights(config, draft, target)


class Gemma4LikeTarget(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = Embedding(10, 8)  # backbone width 8
        self.lm_head = Linear(10, 8)


class Gemma4LikeAssistant(nn.Module):
    """Draft width 4, lm_head tied to its own embedding, which the proposer then swaps for the target's."""

    def __init__(self, fail_on: str | None = None) -> None:
        super().__init__()
        self.fail_on = fail_on
        self.model = nn.Module()
        self.model.embed_tokens = Embedding(10, 4)
        self.model.fc = Linear(4, 16)
        self.lm_head = Linear(10, 4)
        self.lm_head.weight = self.model.embed_tokens.weight  # tie_weights

    def load_weights(self, weights) -> None:  # noqa: ANN001
        load_into(self, weights, self.fail_on)


def gemma4_pair(fail_on: str | None = None) -> tuple[nn.Module, nn.Module, dict[str, torch.Tensor]]:
    target, draft = Gemma4LikeTarget(), Gemma4LikeAssistant(fail_on)
    record_metadata_for_reloading(target)
    record_metadata_for_reloading(draft)
    draft.model.embed_tokens = target.model.embed_tokens  # what vLLM's Gemma4 proposer does
    with torch.no_grad():
        for param in [*target.parameters(), *draft.parameters()]:
            param.zero_()  # an L2 discard
    checkpoint = {"model.embed_tokens.weight": torch.randn(10, 4), "model.fc.weight": torch.randn(4, 16)}
    return target, draft, checkpoint


def check_shared_embedding_is_never_written() -> None:
    target, draft, checkpoint = gemma4_pair()
    shared, storage = target.model.embed_tokens, target.model.embed_tokens.weight
    reload(draft, target, checkpoint)
    assert draft.model.embed_tokens is shared, "the shared module was not rebound"
    assert shared.weight is storage and not storage.is_meta and not storage.any(), "the draft checkpoint reached it"
    assert torch.equal(draft.model.fc.weight, checkpoint["model.fc.weight"])


def check_tied_draft_head_is_refilled_from_the_embedding_tensor() -> None:
    target, draft, checkpoint = gemma4_pair()
    reload(draft, target, checkpoint)
    assert torch.equal(draft.lm_head.weight, checkpoint["model.embed_tokens.weight"])


def check_modules_are_rebound_when_loading_fails() -> None:
    target, draft, checkpoint = gemma4_pair(fail_on="model.fc.weight")
    shared = target.model.embed_tokens
    try:
        reload(draft, target, checkpoint)
    except RuntimeError as exc:
        assert "on purpose" in str(exc)
    else:
        raise AssertionError("the load error was swallowed")
    assert draft.model.embed_tokens is shared and not shared.weight.is_meta


class DSparkLikeInner(nn.Module):
    def __init__(self, shared_rotary: nn.Module) -> None:
        super().__init__()
        self.k, self.v = Linear(4, 4), Linear(4, 4)
        self.own_rotary, self.rotary = Rotary(), shared_rotary
        self.builds = 0

    def _build_fused_kv_buffers(self) -> None:
        """Like DFlash/DSpark: stack per-layer weights and cache references to tensors."""
        self.builds += 1
        self.fused = torch.cat([self.k.weight, self.v.weight])
        self.cos = self.own_rotary.cos_sin_cache


class DSparkLikeDraft(nn.Module):
    def __init__(self, shared_rotary: nn.Module) -> None:
        super().__init__()
        self.model = DSparkLikeInner(shared_rotary)

    def load_weights(self, weights) -> None:  # noqa: ANN001
        load_into(self, weights)
        self.model._build_fused_kv_buffers()  # at the end of load_weights, as vLLM's drafters do


def dspark_pair() -> tuple[nn.Module, DSparkLikeDraft, dict[str, torch.Tensor]]:
    """A DSpark-like drafter as loaded (fused buffers built once), then discarded by an L2 sleep."""
    target = nn.Module()
    target.rotary, target.body = Rotary(), Linear(4, 4)
    draft = DSparkLikeDraft(target.rotary)
    draft.model._build_fused_kv_buffers()  # the first load_weights() ends with it
    draft.model.builds = 0
    record_metadata_for_reloading(target)
    record_metadata_for_reloading(draft)
    with torch.no_grad():
        for tensor in [*draft.parameters(), draft.model.fused]:
            tensor.zero_()  # an L2 discard: the fused copy lived in the weights pool too
    checkpoint = {"model.k.weight": torch.randn(4, 4), "model.v.weight": torch.randn(4, 4)}
    return target, draft, checkpoint


def check_fused_buffers_are_rebuilt_after_finalization() -> None:
    target, draft, checkpoint = dspark_pair()
    reload(draft, target, checkpoint)
    inner = draft.model
    assert inner.builds == 2, f"built {inner.builds} times; expected once in load_weights and once after finalize"
    assert not inner.cos.is_meta and inner.cos is inner.own_rotary.cos_sin_cache, "a meta reference survived"
    assert torch.equal(inner.fused, torch.cat([checkpoint["model.k.weight"], checkpoint["model.v.weight"]]))
    assert draft.model.rotary is target.rotary


def check_fused_buffers_keep_their_addresses() -> None:
    """A CUDA graph captured before the sleep reads the fused buffer at its old address: the rebuilt values must be
    there, not in a new tensor."""
    target, draft, checkpoint = dspark_pair()
    inner = draft.model
    fused, cos = inner.fused, inner.cos
    address = fused.data_ptr()
    reload(draft, target, checkpoint)
    assert inner.fused is fused and inner.fused.data_ptr() == address, "the fused buffer moved to new storage"
    assert torch.equal(fused, torch.cat([checkpoint["model.k.weight"], checkpoint["model.v.weight"]]))
    assert inner.cos is cos and inner.cos.data_ptr() == cos.data_ptr()


def attention_layer() -> tuple[nn.Module, object]:
    """vLLM's own Attention layer (CPU backend), built under a config of a one-layer Llama (a config.json is all
    ModelConfig reads with skip_tokenizer_init); returns it and the config to finalize under."""
    import json
    import tempfile

    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention

    folder = tempfile.mkdtemp()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 256,
              "vocab_size": 260, "max_position_embeddings": 512, "torch_dtype": "float32"}  # fmt: skip
    with open(f"{folder}/config.json", "w") as handle:
        json.dump(config, handle)
    vllm_config = VllmConfig(model_config=ModelConfig(model=folder, dtype="float32", skip_tokenizer_init=True))
    with set_current_vllm_config(vllm_config):
        layer = Attention(num_heads=2, head_size=64, scale=0.125, prefix="draft.layers.0.attn")
    return layer, vllm_config


class DraftWithAttention(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.fc = Linear(4, 4)
        self.model.attn = attn

    def load_weights(self, weights) -> None:  # noqa: ANN001
        load_into(self, weights)


def check_draft_attention_scales_survive_the_reload() -> None:
    """Gemma4's speculator copies the target's KV scales into the drafter's attention layers; finalizing a reload
    re-runs Attention.process_weights_after_loading, which resets them to 1.0. With an FP8 KV cache that is wrong."""
    from vllm.config import set_current_vllm_config

    attn, vllm_config = attention_layer()
    target = nn.Module()
    target.body = Linear(4, 4)
    draft = DraftWithAttention(attn)
    record_metadata_for_reloading(target)
    record_metadata_for_reloading(draft)
    with torch.no_grad():  # what the proposer copied from the target
        attn._k_scale.fill_(0.25)
        attn._v_scale.fill_(0.5)
    attn._k_scale_float, attn._v_scale_float = 0.25, 0.5
    attn._k_scale_cpu, attn._v_scale_cpu = torch.tensor(0.25), torch.tensor(0.5)
    with torch.no_grad():
        draft.model.fc.weight.zero_()  # an L2 discard
    with set_current_vllm_config(vllm_config):
        reload(draft, target, {"model.fc.weight": torch.randn(4, 4)})
    scales = (float(attn._k_scale), float(attn._v_scale), attn._k_scale_float, attn._v_scale_float)
    assert scales == (0.25, 0.5, 0.25, 0.5), f"scales after the reload: {scales}"
    assert (float(attn._k_scale_cpu), float(attn._v_scale_cpu)) == (0.25, 0.5)


CHECKS = {name.removeprefix("check_"): fn for name, fn in dict(globals()).items() if name.startswith("check_")}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(CHECKS):
        try:
            CHECKS[name]()
        except Exception as exc:  # noqa: BLE001 - reported per check, the caller asserts
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        else:
            print(f"ok {name}", flush=True)
