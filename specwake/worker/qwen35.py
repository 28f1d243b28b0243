"""`builtin:mtp-qwen35`: the Qwen3.5 hybrid family (`Qwen3_5ForCausalLM`, gated-delta-net linear attention with
full attention every fourth layer) with its MTP module inside the checkpoint (`mtp.*`), as a bigram machine.

vLLM runs the MTP module as `Qwen3_5MTP` (speculative method `mtp`; the checkpoint's model type `qwen3_5_text`
selects the class). Its layers and weight names are those of vLLM 0.32's qwen3_5.py / qwen3_5_mtp.py, the
configuration that of transformers' `Qwen3_5TextConfig`. On a CPU, vLLM's gated-delta-net runs only in bfloat16
("CPU GDN attention requires BF16.", model_executor/layers/mamba/ops/cpu/gdn_attention.py), and vLLM imports
torchvision for every Qwen3.5 checkpoint (specwake/worker/torchvision_ops.py says why and how it imports here).

The construction is bigram.py's. Two things are particular to the family: every RMSNorm outside the linear
attention scales by (1 + weight) (vLLM's GemmaRMSNorm), so a norm that should keep its input has weight ≈ 0 (noise);
and the gated-delta-net's own output norm (RMSNormGated) scales by its weight, gated by SiLU(z) with z ≈ 0, so the
linear-attention layers add ≈ nothing. The MTP module sees [norm(embed(y)) | norm(hidden)]; its `fc` keeps the token
half, its decoder layer passes it through, and the target's lm_head (copied into the checkpoint's `lm_head`) turns
code(y) into its successor: each draft step predicts what the target would say after the token it was given.
"""

from __future__ import annotations

from typing import Any

import torch

from specwake.worker.bigram import Weights
from specwake.worker.families import Checkpoint
from specwake.worker.tiny_llama import HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE
from specwake.worker.tokenizer import MAX_POSITIONS, VOCAB_SIZE, special_ids

LAYER_TYPES = ("linear_attention", "linear_attention", "linear_attention", "full_attention")
KV_HEADS = 1
LINEAR_K_HEADS = 1
LINEAR_V_HEADS = 2
LINEAR_HEAD_DIM = 64  # key and value heads alike
CONV_KERNEL = 4
MTP_LAYERS = 1

KEY_DIM = LINEAR_K_HEADS * LINEAR_HEAD_DIM
VALUE_DIM = LINEAR_V_HEADS * LINEAR_HEAD_DIM


def qwen35_config() -> dict[str, Any]:
    """config.json: a `qwen3_5_text` checkpoint, as transformers 5.19's Qwen3_5TextConfig writes one."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": len(LAYER_TYPES),
        "layer_types": list(LAYER_TYPES),
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "linear_conv_kernel_dim": CONV_KERNEL,
        "linear_key_head_dim": LINEAR_HEAD_DIM,
        "linear_value_head_dim": LINEAR_HEAD_DIM,
        "linear_num_key_heads": LINEAR_K_HEADS,
        "linear_num_value_heads": LINEAR_V_HEADS,
        "mtp_num_hidden_layers": MTP_LAYERS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "attention_bias": False,
        "tie_word_embeddings": False,
        **special_ids(),
        "torch_dtype": "bfloat16",
    }


def _norm(w: Weights, size: int) -> torch.Tensor:
    """A (1 + weight) RMSNorm that keeps its input: weight ≈ 0, never exactly 0."""
    return w.noise(size)


def _mlp(w: Weights, prefix: str) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.mlp.gate_proj.weight": w.noise(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": w.noise(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": w.noise(HIDDEN, INTERMEDIATE),
    }


def _full_attention(w: Weights, prefix: str) -> dict[str, torch.Tensor]:
    """Gated full attention: q_proj yields the query and its output gate, per head."""
    return {
        f"{prefix}.self_attn.q_proj.weight": w.noise(2 * HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.k_proj.weight": w.noise(KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.v_proj.weight": w.noise(KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}.self_attn.o_proj.weight": w.noise(HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}.self_attn.q_norm.weight": _norm(w, HEAD_DIM),
        f"{prefix}.self_attn.k_norm.weight": _norm(w, HEAD_DIM),
    }


def _linear_attention(w: Weights, prefix: str) -> dict[str, torch.Tensor]:
    """A gated-delta-net layer in Qwen3.5's flat layout (q, k, v and z, b, a projected apart)."""
    conv_dim = 2 * KEY_DIM + VALUE_DIM
    p = f"{prefix}.linear_attn"
    return {
        f"{p}.in_proj_qkv.weight": w.noise(conv_dim, HIDDEN),
        f"{p}.in_proj_z.weight": w.noise(VALUE_DIM, HIDDEN),
        f"{p}.in_proj_b.weight": w.noise(LINEAR_V_HEADS, HIDDEN),
        f"{p}.in_proj_a.weight": w.noise(LINEAR_V_HEADS, HIDDEN),
        f"{p}.conv1d.weight": w.noise(conv_dim, 1, CONV_KERNEL),
        f"{p}.dt_bias": w.ones(LINEAR_V_HEADS),
        f"{p}.A_log": w.noise(LINEAR_V_HEADS),
        f"{p}.norm.weight": w.ones(LINEAR_HEAD_DIM),
        f"{p}.out_proj.weight": w.noise(HIDDEN, VALUE_DIM),
    }


def _decoder_layer(w: Weights, prefix: str, layer_type: str) -> dict[str, torch.Tensor]:
    mixer = _linear_attention if layer_type == "linear_attention" else _full_attention
    return {
        **mixer(w, prefix),
        **_mlp(w, prefix),
        f"{prefix}.input_layernorm.weight": _norm(w, HIDDEN),
        f"{prefix}.post_attention_layernorm.weight": _norm(w, HIDDEN),
    }


def bigram_qwen35_mtp(name: str) -> Checkpoint:
    """The target (its layers add ≈ nothing; lm_head reads the successor) and its MTP module (`mtp.*`)."""
    w = Weights(name)
    weights = {"model.embed_tokens.weight": w.embedding(HIDDEN)}
    for i, layer_type in enumerate(LAYER_TYPES):
        weights.update(_decoder_layer(w, f"model.layers.{i}", layer_type))
    weights["model.norm.weight"] = _norm(w, HIDDEN)
    weights["lm_head.weight"] = w.head(HIDDEN)
    weights.update(
        {
            "mtp.pre_fc_norm_embedding.weight": _norm(w, HIDDEN),
            "mtp.pre_fc_norm_hidden.weight": _norm(w, HIDDEN),
            "mtp.fc.weight": w.identity_half(HIDDEN, first=True),  # input: [embed(y) | hidden]
            **_decoder_layer(w, "mtp.layers.0", "full_attention"),
            "mtp.norm.weight": _norm(w, HIDDEN),
        }
    )
    # Stored as vLLM runs it (its CPU gated-delta-net needs bfloat16); A_log stays float32, as vLLM keeps it.
    stored = {k: t if k.endswith(".A_log") else t.to(torch.bfloat16) for k, t in weights.items()}
    return qwen35_config(), stored
