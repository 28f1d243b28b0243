"""`builtin:tiny-llama`: a seeded random two-layer Llama, used as both target and `draft_model` drafter.

Its greedy text is arbitrary but deterministic; with the drafter identical to the target, every draft is
accepted, so fresh AL is K + 1.
"""

from __future__ import annotations

from typing import Any

import torch

from specwake.worker.tokenizer import MAX_POSITIONS, VOCAB_SIZE, special_ids

SEED = 20240601
HIDDEN = 128
HEADS = 2
HEAD_DIM = 64
LAYERS = 2
INTERMEDIATE = 256
# The linear layers of one decoder layer, in the order their weights are drawn: (out, in) features.
LAYER_SHAPES = {
    "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
    "self_attn.k_proj": (HEADS * HEAD_DIM, HIDDEN),
    "self_attn.v_proj": (HEADS * HEAD_DIM, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
    "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
    "mlp.up_proj": (INTERMEDIATE, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTERMEDIATE),
}
PRINTABLE_IDS = slice(32, 127)  # token id == byte value; ASCII ' ' .. '~'


def llama_config(architecture: str = "LlamaForCausalLM", model_type: str = "llama", **extra: Any) -> dict[str, Any]:
    """The tiny Llama shape every builtin model shares (config.json); `extra` adds or overrides keys."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB_SIZE,
        **special_ids(),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        **extra,
    }


def _normal(gen: torch.Generator, shape: tuple[int, ...], std: float) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def model_weights(seed: int = SEED) -> dict[str, torch.Tensor]:
    """Seeded weights; scales keep activations O(1) so greedy logits have clear winners."""
    gen = torch.Generator().manual_seed(seed)
    weights = {"model.embed_tokens.weight": _normal(gen, (VOCAB_SIZE, HIDDEN), 1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for name, shape in LAYER_SHAPES.items():
            weights[f"{p}.{name}.weight"] = _normal(gen, shape, shape[1] ** -0.5)
        weights[f"{p}.input_layernorm.weight"] = torch.ones(HIDDEN)
        weights[f"{p}.post_attention_layernorm.weight"] = torch.ones(HIDDEN)
    weights["model.norm.weight"] = torch.ones(HIDDEN)
    # Only printable ASCII rows are non-zero: greedy text is readable and one token per char.
    lm_head = _normal(gen, (VOCAB_SIZE, HIDDEN), 4.0 * HIDDEN**-0.5)
    printable = torch.zeros(VOCAB_SIZE, 1)
    printable[PRINTABLE_IDS] = 1.0
    weights["lm_head.weight"] = lm_head * printable
    return weights


def checkpoint() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return llama_config(), model_weights()
