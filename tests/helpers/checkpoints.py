"""Planted checkpoints for the GPU memory estimate (specwake/prepare/memory.py): safetensors files written header only
(the estimate reads nothing else), and DeepSeek-V3's checkpoint laid out from its real shapes."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Bytes an element of each safetensors dtype these checkpoints use.
ELEMENT = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}


def write_header(file: Path, tensors: Mapping[str, tuple[str, Sequence[int]]]) -> Path:
    """A safetensors file of `tensors` (name → dtype, shape), its header only: the data is not written."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * ELEMENT[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(struct.pack("<Q", len(raw)) + raw)
    return file


# DeepSeek-V3's FP8 checkpoint: each linear layer's weight in float8 e4m3 with a float32 scale per 128 × 128 block
# (quantization_config of https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json); embedding, head,
# norms, the router and the MTP layer's projection in bfloat16.
FP8_BLOCK = 128


def _linear(prefix: str, out: int, into: int) -> dict[str, tuple[str, Sequence[int]]]:
    blocks = [-(-out // FP8_BLOCK), -(-into // FP8_BLOCK)]
    return {f"{prefix}.weight": ("F8_E4M3", [out, into]), f"{prefix}.weight_scale_inv": ("F32", blocks)}


def _config_defaults() -> dict[str, Any]:
    """DeepseekV3Config's class defaults, read from transformers' source (importing transformers takes seconds)."""
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None, "transformers is not installed"
    source = Path(spec.origin).parent / "models" / "deepseek_v3" / "configuration_deepseek_v3.py"
    (config,) = [n for n in ast.parse(source.read_text()).body if isinstance(n, ast.ClassDef)]
    return {
        node.target.id: ast.literal_eval(node.value)
        for node in config.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(node.value, ast.Constant)
    }


def deepseek_v3(folder: Path) -> Path:
    """DeepSeek-V3's checkpoint, header only, from its shapes as transformers' DeepseekV3Config has them by default
    (transformers 5.19 models/deepseek_v3/configuration_deepseek_v3.py:82-117: 61 layers, the first 3 dense, 256
    routed experts and 1 shared, MLA) plus its one MTP layer (model.layers.61). One file, about 11 MB of header."""
    c = SimpleNamespace(**_config_defaults())
    h, heads = c.hidden_size, c.num_attention_heads
    tensors: dict[str, tuple[str, Sequence[int]]] = {
        "model.embed_tokens.weight": ("BF16", [c.vocab_size, h]),
        "model.norm.weight": ("BF16", [h]),
        "lm_head.weight": ("BF16", [c.vocab_size, h]),
    }

    def mlp(prefix: str, inner: int) -> None:
        tensors.update(_linear(f"{prefix}.gate_proj", inner, h))
        tensors.update(_linear(f"{prefix}.up_proj", inner, h))
        tensors.update(_linear(f"{prefix}.down_proj", h, inner))

    for layer in range(c.num_hidden_layers + c.num_mtp_layers):
        p = f"model.layers.{layer}"
        tensors[f"{p}.input_layernorm.weight"] = ("BF16", [h])
        tensors[f"{p}.post_attention_layernorm.weight"] = ("BF16", [h])
        tensors.update(_linear(f"{p}.self_attn.q_a_proj", c.q_lora_rank, h))
        tensors[f"{p}.self_attn.q_a_layernorm.weight"] = ("BF16", [c.q_lora_rank])
        q_head = c.qk_nope_head_dim + c.qk_rope_head_dim
        tensors.update(_linear(f"{p}.self_attn.q_b_proj", heads * q_head, c.q_lora_rank))
        tensors.update(_linear(f"{p}.self_attn.kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, h))
        tensors[f"{p}.self_attn.kv_a_layernorm.weight"] = ("BF16", [c.kv_lora_rank])
        kv_head = c.qk_nope_head_dim + c.v_head_dim
        tensors.update(_linear(f"{p}.self_attn.kv_b_proj", heads * kv_head, c.kv_lora_rank))
        tensors.update(_linear(f"{p}.self_attn.o_proj", h, heads * c.v_head_dim))
        if layer < c.first_k_dense_replace:
            mlp(f"{p}.mlp", c.intermediate_size)
            continue
        tensors[f"{p}.mlp.gate.weight"] = ("BF16", [c.n_routed_experts, h])
        tensors[f"{p}.mlp.gate.e_score_correction_bias"] = ("F32", [c.n_routed_experts])
        mlp(f"{p}.mlp.shared_experts", c.moe_intermediate_size * c.n_shared_experts)
        for expert in range(c.n_routed_experts):
            mlp(f"{p}.mlp.experts.{expert}", c.moe_intermediate_size)
        if layer >= c.num_hidden_layers:  # the MTP layer's own: its norms and the projection of [embedding; hidden]
            tensors.update({f"{p}.enorm.weight": ("BF16", [h]), f"{p}.hnorm.weight": ("BF16", [h])})
            tensors[f"{p}.eh_proj.weight"] = ("BF16", [h, 2 * h])
    write_header(folder / "model.safetensors", tensors)
    return folder
