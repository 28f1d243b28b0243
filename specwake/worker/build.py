"""Writes one builtin checkpoint into a folder: ``python -m specwake.worker.build NAME --out DIR``.

Runs in the vLLM server's interpreter (torch, safetensors, tokenizers); specwake.prepare.models calls it and
renames the folder into its cache. The names here and in specwake.prepare.models.BUILTIN_MODELS are the same set.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from specwake.worker import dspark, families, qwen35, tiny_llama
from specwake.worker.families import Checkpoint
from specwake.worker.tokenizer import write_checkpoint

BUILDERS: dict[str, Callable[[str], Checkpoint]] = {
    "tiny-llama": lambda name: tiny_llama.checkpoint(),
    "tiny-llama-draft": lambda name: tiny_llama.draft_checkpoint(),
    "eagle3-llama": families.bigram_llama,
    "eagle3-llama-draft": families.bigram_llama_eagle3,
    "mtp-mimo": families.bigram_mimo_mtp,
    "mtp-deepseek-v3": families.bigram_deepseek_v3_mtp,
    "mtp-gemma4": families.bigram_gemma4,
    "mtp-gemma4-assistant": families.bigram_gemma4_assistant,
    "mtp-qwen35": qwen35.bigram_qwen35_mtp,
    "dspark-qwen3": dspark.qwen3_target,
    "dspark-qwen3-draft": dspark.dspark_draft,
}


def build(name: str, out: Path) -> None:
    config, weights = BUILDERS[name](name)
    write_checkpoint(out, config, weights)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("name", choices=sorted(BUILDERS), help="builtin model to write")
    parser.add_argument("--out", required=True, type=Path, help="folder to write into")
    args = parser.parse_args(argv)
    build(args.name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
