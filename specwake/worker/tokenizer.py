"""The byte-level tokenizer every builtin checkpoint shares, and the writer of a checkpoint folder.

Token id == byte value (0..255), four special tokens after them, vocabulary padded to 320 rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
BOS, EOS, UNK, PAD = SPECIAL_TOKENS
NUM_BYTES = 256
VOCAB_SIZE = 320  # 256 bytes + 4 specials, padded to a multiple of 64
MAX_POSITIONS = 2048


def special_id(token: str) -> int:
    return NUM_BYTES + SPECIAL_TOKENS.index(token)


def special_ids() -> dict[str, int]:
    """The config.json entries naming the special tokens."""
    return {"bos_token_id": special_id(BOS), "eos_token_id": special_id(EOS), "pad_token_id": special_id(PAD)}


def generation_config() -> dict[str, Any]:
    return {"bos_token_id": special_id(BOS), "eos_token_id": special_id(EOS)}


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


def write_checkpoint(out: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """A Hugging Face style folder vLLM loads offline: config, weights, tokenizer, generation config."""
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation_config())
    _write_json(out / "tokenizer_config.json", tokenizer_config())
    (out / "tokenizer.json").write_text(byte_tokenizer().to_str(pretty=True), encoding="utf-8")
    tensors = {name: t.contiguous() for name, t in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
