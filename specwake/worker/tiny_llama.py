"""`builtin:tiny-llama`: a seeded random two-layer Llama, the target of the `draft_model` pair, and
`builtin:tiny-llama-draft`, its drafter: the same network with its hidden dimensions and MLP units reordered.

Greedy text is arbitrary but deterministic. The drafter computes the target's function, so every draft is
accepted and fresh AL is K + 1; yet almost every tensor differs from the target's, so a drafter reloaded from
the target's checkpoint (a wrong fix) is not the drafter that was loaded fresh.
"""

from __future__ import annotations

from typing import Any

import torch

from specwake.worker.tokenizer import MAX_POSITIONS, VOCAB_SIZE, special_ids

SEED = 20240601
DRAFT_SEED = 20240602  # draws the drafter's reordering
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


def reordered(weights: dict[str, torch.Tensor], seed: int = DRAFT_SEED) -> dict[str, torch.Tensor]:
    """The same network in other coordinates: one seeded permutation of the residual stream's dimensions for the
    whole model, and one of the MLP's hidden units per layer.

    A tensor that writes the residual stream has its rows permuted, one that reads it its columns, and the norms
    their elements (RMSNorm is unchanged by a reordering of its dimensions); gate and up have their rows permuted
    like down's columns. Attention's heads and head dimensions stay in place (rotary embeddings pair them).
    """
    gen = torch.Generator().manual_seed(seed)
    h = torch.randperm(HIDDEN, generator=gen)
    out = {
        "model.embed_tokens.weight": weights["model.embed_tokens.weight"][:, h],
        "model.norm.weight": weights["model.norm.weight"][h],
        "lm_head.weight": weights["lm_head.weight"][:, h],
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        units = torch.randperm(INTERMEDIATE, generator=gen)
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            out[f"{p}.{name}.weight"] = weights[f"{p}.{name}.weight"][:, h]
        out[f"{p}.self_attn.o_proj.weight"] = weights[f"{p}.self_attn.o_proj.weight"][h, :]
        for name in ("mlp.gate_proj", "mlp.up_proj"):
            out[f"{p}.{name}.weight"] = weights[f"{p}.{name}.weight"][units][:, h]
        out[f"{p}.mlp.down_proj.weight"] = weights[f"{p}.mlp.down_proj.weight"][h][:, units]
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[f"{p}.{name}.weight"] = weights[f"{p}.{name}.weight"][h]
    return out


def draft_checkpoint() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return llama_config(), reordered(model_weights())
