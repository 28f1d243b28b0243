"""Writes the builtin tiny Llama checkpoint (config, seeded weights, byte tokenizer) to a folder.

Runs in the vLLM server's interpreter: ``python -m specwake.tinymodel_build --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

SEED = 20240601
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
BOS, EOS, UNK, PAD = SPECIAL_TOKENS
NUM_BYTES = 256
VOCAB_SIZE = 320  # 256 bytes + 4 specials, padded to a multiple of 64
HIDDEN = 128
HEADS = 2
HEAD_DIM = 64
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 2048
PRINTABLE_IDS = slice(32, 127)  # token id == byte value; ASCII ' ' .. '~'


def special_id(token: str) -> int:
    return NUM_BYTES + SPECIAL_TOKENS.index(token)


def model_config() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
        "bos_token_id": special_id(BOS),
        "eos_token_id": special_id(EOS),
        "pad_token_id": special_id(PAD),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def generation_config() -> dict[str, Any]:
    return {"bos_token_id": special_id(BOS), "eos_token_id": special_id(EOS)}


def _normal(gen: torch.Generator, shape: tuple[int, ...], std: float) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def model_weights(seed: int = SEED) -> dict[str, torch.Tensor]:
    """Seeded weights; scales keep activations O(1) so greedy logits have clear winners."""
    gen = torch.Generator().manual_seed(seed)
    inner = HEADS * HEAD_DIM
    weights = {"model.embed_tokens.weight": _normal(gen, (VOCAB_SIZE, HIDDEN), 1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes = {
            "self_attn.q_proj": (inner, HIDDEN),
            "self_attn.k_proj": (inner, HIDDEN),
            "self_attn.v_proj": (inner, HIDDEN),
            "self_attn.o_proj": (HIDDEN, inner),
            "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
            "mlp.up_proj": (INTERMEDIATE, HIDDEN),
            "mlp.down_proj": (HIDDEN, INTERMEDIATE),
        }
        for name, shape in shapes.items():
            weights[f"{p}.{name}.weight"] = _normal(gen, shape, shape[1] ** -0.5)
        weights[f"{p}.input_layernorm.weight"] = torch.ones(HIDDEN)
        weights[f"{p}.post_attention_layernorm.weight"] = torch.ones(HIDDEN)
    weights["model.norm.weight"] = torch.ones(HIDDEN)
    # Only printable ASCII rows are non-zero: greedy text is readable and one token per char.
    lm_head = _normal(gen, (VOCAB_SIZE, HIDDEN), 4.0 * HIDDEN**-0.5)
    printable = torch.zeros(VOCAB_SIZE, 1)
    printable[PRINTABLE_IDS] = 1.0
    weights["lm_head.weight"] = lm_head * printable
    return {name: t.contiguous() for name, t in weights.items()}


def byte_symbols() -> list[str]:
    """The byte-level pre-tokenizer's printable stand-in for each byte value 0..255."""
    direct = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols: dict[int, str] = {b: chr(b) for b in direct}
    shifted = (b for b in range(NUM_BYTES) if b not in symbols)
    for offset, b in enumerate(shifted):
        symbols[b] = chr(NUM_BYTES + offset)
    return [symbols[b] for b in range(NUM_BYTES)]


def byte_tokenizer() -> Tokenizer:
    """Byte-level BPE without merges: token id == byte value, specials after the 256 bytes."""
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols())}
    vocab.update({token: special_id(token) for token in SPECIAL_TOKENS})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, special_id(BOS))]
    )
    return tok


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", model_config())
    _write_json(out / "generation_config.json", generation_config())
    _write_json(out / "tokenizer_config.json", tokenizer_config())
    (out / "tokenizer.json").write_text(byte_tokenizer().to_str(pretty=True), encoding="utf-8")
    save_file(model_weights(), str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write into")
    args = parser.parse_args(argv)
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
