"""Warnings vLLM prints that bear on a sleep/wake cycle, found in a server's log and quoted as printed: a variant's
result keeps them, and the report quotes them beside the variant's verdict.

Pure: log lines in, quotes out (specwake.run.variant_run hands each server log's lines here).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# vLLM 0.34 (vllm/v1/worker/gpu_worker.py, Worker._discardable_parameters, once per worker: logger.warning_once): a
# Level 2 sleep of a server whose drafter's parameters no --sleep-preserve-parameter-names pattern keeps. Its text:
# "Level 2 sleep discards draft model weights; reload_weights restores only the target. Unless the draft is updated
# separately, set --sleep-preserve-parameter-names 'draft.*' to keep them."
DRAFT_DISCARD = "Level 2 sleep discards draft model weights"
KNOWN: tuple[str, ...] = (DRAFT_DISCARD,)
MAX_QUOTE = 400  # characters of a quote: a warning is one sentence or two, never a whole log line of JSON
COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # vLLM colours its log prefix on a terminal (VLLM_LOGGING_COLOR)


def find_warnings(lines: Iterable[str]) -> list[str]:
    """Each known warning in `lines`, from its first words to the end of its line (vLLM's prefix of process, level,
    time and source left out), in log order; a warning every worker printed is quoted once."""
    found: list[str] = []
    for raw in lines:
        if not any(start in raw for start in KNOWN):
            continue
        line = COLOUR.sub("", raw)
        for start in KNOWN:
            at = line.find(start)
            quote = line[at:].strip()[:MAX_QUOTE] if at >= 0 else ""
            if quote and quote not in found:
                found.append(quote)
    return found
