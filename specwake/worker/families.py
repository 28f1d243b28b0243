"""The builtin drafter-family checkpoints: a bigram target per architecture and a drafter of the family's own
kind, each faithful to the classes vLLM loads for it (configs and weight names as in vLLM 0.32 / 0.33).

- EAGLE3: `LlamaForCausalLM` target + `Eagle3LlamaForCausalLM` drafter (own checkpoint; vLLM shares the
  target's embedding with it).
- MiMo MTP: `MiMoForCausalLM`, its MTP layer inside the target checkpoint (`model.mtp_layers.0.*`).
- DeepSeek-V3 MTP: `DeepseekV3ForCausalLM` with MLA attention, its MTP layer as `model.layers.<L>.*`.
- Gemma4 MTP: `Gemma4ForCausalLM` target (hidden 256) + a separate `gemma4_assistant` checkpoint (hidden 128)
  whose embedding vLLM replaces by the target's, and whose lm_head is tied to its own, narrower embedding.

How each drafter reproduces the target's successor rule is said at its function; see bigram.py for the rule.
CPU limits honoured: head_dim 64, fp32, MLA latent 512 + 64.
"""

from __future__ import annotations

from typing import Any

import torch

from specwake.worker.bigram import Weights, same, successor
from specwake.worker.tiny_llama import HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE, LAYER_SHAPES, LAYERS, llama_config
from specwake.worker.tokenizer import MAX_POSITIONS, VOCAB_SIZE, special_ids

Checkpoint = tuple[dict[str, Any], dict[str, torch.Tensor]]


def _llama_layer(w: Weights, prefix: str, *, qkv_bias: bool = False) -> dict[str, torch.Tensor]:
    """A Llama/Qwen2 decoder layer whose every path is noise: it passes its residual through ≈ unchanged."""
    layer = {f"{prefix}.{name}.weight": w.noise(*shape) for name, shape in LAYER_SHAPES.items()}
    if qkv_bias:
        for p in ("q_proj", "k_proj", "v_proj"):
            layer[f"{prefix}.self_attn.{p}.bias"] = w.noise(HEADS * HEAD_DIM)
    layer[f"{prefix}.input_layernorm.weight"] = w.ones(HIDDEN)
    layer[f"{prefix}.post_attention_layernorm.weight"] = w.ones(HIDDEN)
    return layer


def _bigram_body(w: Weights, *, qkv_bias: bool = False) -> dict[str, torch.Tensor]:
    body = {"model.embed_tokens.weight": w.embedding(HIDDEN)}
    for i in range(LAYERS):
        body.update(_llama_layer(w, f"model.layers.{i}", qkv_bias=qkv_bias))
    body["model.norm.weight"] = w.ones(HIDDEN)
    body["lm_head.weight"] = w.head(HIDDEN)
    return body


# ------------------------------------------------------------------------------------------------ EAGLE3


def bigram_llama(name: str) -> Checkpoint:
    """The EAGLE3 family's target."""
    return llama_config("LlamaForCausalLM", "llama"), _bigram_body(Weights(name))


def bigram_llama_eagle3(name: str) -> Checkpoint:
    """EAGLE3 drafter. `fc` reads the first auxiliary state (the input of target layer 0, i.e. embed(x_t) with
    code c) and writes e_successor(c), the code of x_t+1; the mid layer's MLP shifts the code once more each
    draft step; the drafter's own lm_head reads the code as is, so step k proposes x_t+k+1 exactly."""
    w = Weights(name)
    inner = HEADS * HEAD_DIM
    config = llama_config(
        "LlamaForCausalLMEagle3",
        "llama",
        num_hidden_layers=1,
        draft_vocab_size=VOCAB_SIZE,
        # A 2-layer target: vLLM's default aux layers (2, L // 2, L - 3) do not exist there.
        eagle_aux_hidden_state_layer_ids=[0, 1, 2],
    )
    weights = {
        "midlayer.self_attn.q_proj.weight": w.noise(inner, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": w.noise(inner, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": w.noise(inner, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": w.noise(HIDDEN, inner),
        "midlayer.input_layernorm.weight": w.ones(HIDDEN),
        "midlayer.hidden_norm.weight": w.ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": w.ones(HIDDEN),
        **w.shift_mlp("midlayer", HIDDEN, INTERMEDIATE),
        "norm.weight": w.ones(HIDDEN),
        "fc.weight": torch.cat([w.code_map(HIDDEN, HIDDEN), w.noise(HIDDEN, HIDDEN), w.noise(HIDDEN, HIDDEN)], dim=1),
        "lm_head.weight": w.head(HIDDEN, same),
    }
    return config, weights


# ------------------------------------------------------------------------------------------------ MiMo MTP


def bigram_mimo_mtp(name: str) -> Checkpoint:
    """MiMo with one MTP layer in the same checkpoint. The MTP layer's `input_proj` keeps the token half of
    [hidden | embed(y)], its block passes it through, and the target's own lm_head turns code(y) into the
    successor: each draft step predicts what the target would say after the token it was given."""
    w = Weights(name)
    config = llama_config(
        "MiMoForCausalLM",
        "qwen2",
        num_nextn_predict_layers=1,
        use_sliding_window=False,
        sliding_window=None,
        rms_norm_eps=1e-6,
    )
    for key in ("head_dim", "attention_bias", "mlp_bias"):
        del config[key]
    weights = _bigram_body(w, qkv_bias=True)
    mtp = "model.mtp_layers.0"
    weights.update(_llama_layer(w, mtp, qkv_bias=True))
    weights[f"{mtp}.token_layernorm.weight"] = w.ones(HIDDEN)
    weights[f"{mtp}.hidden_layernorm.weight"] = w.ones(HIDDEN)
    weights[f"{mtp}.input_proj.weight"] = w.identity_half(HIDDEN, first=False)
    weights[f"{mtp}.final_layernorm.weight"] = w.ones(HIDDEN)
    return config, weights


# ------------------------------------------------------------------------------------------------ DeepSeek-V3 MTP

MLA_ROPE = 64
MLA_NOPE = 64
MLA_V = 64
MLA_KV_RANK = 512  # CPU MLA supports only a 576-wide latent: 512 + 64


def _mla_layer(w: Weights, prefix: str) -> dict[str, torch.Tensor]:
    layer = {
        f"{prefix}.self_attn.q_proj.weight": w.noise(HEADS * (MLA_NOPE + MLA_ROPE), HIDDEN),
        f"{prefix}.self_attn.kv_a_proj_with_mqa.weight": w.noise(MLA_KV_RANK + MLA_ROPE, HIDDEN),
        f"{prefix}.self_attn.kv_a_layernorm.weight": w.ones(MLA_KV_RANK),
        f"{prefix}.self_attn.kv_b_proj.weight": w.noise(HEADS * (MLA_NOPE + MLA_V), MLA_KV_RANK),
        f"{prefix}.self_attn.o_proj.weight": w.noise(HIDDEN, HEADS * MLA_V),
        f"{prefix}.mlp.gate_proj.weight": w.noise(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": w.noise(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": w.noise(HIDDEN, INTERMEDIATE),
        f"{prefix}.input_layernorm.weight": w.ones(HIDDEN),
        f"{prefix}.post_attention_layernorm.weight": w.ones(HIDDEN),
    }
    return layer


def bigram_deepseek_v3_mtp(name: str) -> Checkpoint:
    """DeepSeek-V3 (MLA, dense: `first_k_dense_replace` ≥ layers) with its MTP layer `model.layers.2`. `eh_proj`
    keeps the token half of [embed(y) | hidden]; the layer's `shared_head` is a copy of the target's head."""
    w = Weights(name)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "moe_intermediate_size": 64,
        "num_hidden_layers": LAYERS,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 100,
        "moe_layer_freq": 1,
        "kv_lora_rank": MLA_KV_RANK,
        "q_lora_rank": None,
        "qk_rope_head_dim": MLA_ROPE,
        "qk_nope_head_dim": MLA_NOPE,
        "v_head_dim": MLA_V,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": VOCAB_SIZE,
        "tie_word_embeddings": False,
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "hidden_act": "silu",
        **special_ids(),
        "torch_dtype": "float32",
    }
    embed, head = w.embedding(HIDDEN), w.head(HIDDEN)
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": w.ones(HIDDEN), "lm_head.weight": head}
    for i in range(LAYERS):
        weights.update(_mla_layer(w, f"model.layers.{i}"))
    mtp = f"model.layers.{LAYERS}"
    weights.update(_mla_layer(w, mtp))
    weights.update(
        {
            f"{mtp}.enorm.weight": w.ones(HIDDEN),
            f"{mtp}.hnorm.weight": w.ones(HIDDEN),
            f"{mtp}.eh_proj.weight": w.identity_half(HIDDEN, first=True),
            f"{mtp}.shared_head.norm.weight": w.ones(HIDDEN),
            f"{mtp}.shared_head.head.weight": head.clone(),
            f"{mtp}.embed_tokens.weight": embed.clone(),
        }
    )
    return config, weights


# ------------------------------------------------------------------------------------------------ Gemma4 MTP

GEMMA_BACKBONE = 256
GEMMA_ASSISTANT = 128
GEMMA_KV_HEADS = 1
GEMMA_QUIET = 1e-3  # weight of the post-attention / post-feedforward norms: a layer adds ≈ nothing


def _gemma4_text_config(hidden: int, layer_types: list[str], **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": "gemma4_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": hidden,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": len(layer_types),
        "num_attention_heads": HEADS,
        "num_key_value_heads": GEMMA_KV_HEADS,
        "head_dim": HEAD_DIM,
        "global_head_dim": HEAD_DIM,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "layer_types": layer_types,
        "sliding_window": 512,
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "attention_k_eq_v": False,
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "use_double_wide_mlp": False,
        **special_ids(),
        "torch_dtype": "float32",
    }
    config.update(extra)
    return config


def _gemma4_layer(w: Weights, prefix: str, hidden: int, *, query_only: bool = False) -> dict[str, torch.Tensor]:
    """A Gemma4 decoder layer that adds ≈ nothing (its output norms are ≈ 1e-3); `query_only`: a KV-shared
    layer, which has no key/value projections of its own."""
    inner = HEADS * HEAD_DIM
    layer = {
        f"{prefix}.self_attn.q_proj.weight": w.noise(inner, hidden),
        f"{prefix}.self_attn.o_proj.weight": w.noise(hidden, inner),
        f"{prefix}.self_attn.q_norm.weight": w.ones(HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": w.noise(INTERMEDIATE, hidden),
        f"{prefix}.mlp.up_proj.weight": w.noise(INTERMEDIATE, hidden),
        f"{prefix}.mlp.down_proj.weight": w.noise(hidden, INTERMEDIATE),
        f"{prefix}.input_layernorm.weight": w.ones(hidden),
        f"{prefix}.pre_feedforward_layernorm.weight": w.ones(hidden),
        f"{prefix}.post_attention_layernorm.weight": w.small(hidden, value=GEMMA_QUIET),
        f"{prefix}.post_feedforward_layernorm.weight": w.small(hidden, value=GEMMA_QUIET),
        f"{prefix}.layer_scalar": w.ones(1),
    }
    if not query_only:
        layer[f"{prefix}.self_attn.k_proj.weight"] = w.noise(GEMMA_KV_HEADS * HEAD_DIM, hidden)
        layer[f"{prefix}.self_attn.v_proj.weight"] = w.noise(GEMMA_KV_HEADS * HEAD_DIM, hidden)
        layer[f"{prefix}.self_attn.k_norm.weight"] = w.ones(HEAD_DIM)
    return layer


def bigram_gemma4(name: str) -> Checkpoint:
    """The Gemma4 MTP family's target (backbone width 256)."""
    w = Weights(name)
    config = _gemma4_text_config(GEMMA_BACKBONE, ["sliding_attention", "full_attention"], tie_word_embeddings=False)
    config["architectures"] = ["Gemma4ForCausalLM"]
    weights = {"model.embed_tokens.weight": w.embedding(GEMMA_BACKBONE)}
    for i in range(2):
        weights.update(_gemma4_layer(w, f"model.layers.{i}", GEMMA_BACKBONE))
    weights["model.norm.weight"] = w.ones(GEMMA_BACKBONE)
    weights["lm_head.weight"] = w.head(GEMMA_BACKBONE)
    return config, weights


def bigram_gemma4_assistant(name: str) -> Checkpoint:
    """The Gemma4 assistant (draft width 128). vLLM feeds it [target_embed(y) · √256 | hidden]; the first half
    of `pre_projection` maps code(y) to e_successor(code(y)) in draft space (scaled by 1/√256 to undo the
    embedding's scale), its KV-shared layer adds ≈ nothing, and its lm_head — tied to its own embedding —
    reads the code as is."""
    w = Weights(name)
    text = _gemma4_text_config(GEMMA_ASSISTANT, ["full_attention"], num_kv_shared_layers=1, tie_word_embeddings=True)
    config = {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": GEMMA_BACKBONE,
        "use_ordered_embeddings": False,
        "tie_word_embeddings": True,
        "text_config": text,
        "torch_dtype": "float32",
    }
    embed_scale = GEMMA_BACKBONE**-0.5
    weights = {
        "model.embed_tokens.weight": w.head(GEMMA_ASSISTANT, same),  # also the lm_head (tied)
        "model.norm.weight": w.ones(GEMMA_ASSISTANT),
        "pre_projection.weight": torch.cat(
            [
                w.code_map(GEMMA_ASSISTANT, GEMMA_BACKBONE, successor, scale=embed_scale),
                w.noise(GEMMA_ASSISTANT, GEMMA_BACKBONE),
            ],
            dim=1,
        ),
        "post_projection.weight": w.noise(GEMMA_BACKBONE, GEMMA_ASSISTANT),
        **_gemma4_layer(w, "model.layers.0", GEMMA_ASSISTANT, query_only=True),
    }
    return config, weights
