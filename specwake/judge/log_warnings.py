"""What a server's log says that bears on a sleep/wake cycle: the warnings vLLM prints, quoted as printed (a variant's
result keeps them, and the report quotes them beside the variant's verdict), and how long the server's first load of
its weights took (what its wake is measured against: specwake.judge.findings).

Pure: log lines in, quotes and seconds out (specwake.run.session.variant_run hands each server log's lines here).
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
# Each worker's model runner, once its target and drafter are loaded: "Model loading took %s GiB memory and %.6f
# seconds" (vLLM 0.32 and 0.33: vllm/v1/worker/gpu_model_runner.py, the V1 runner, and vllm/v1/worker/gpu/
# model_runner.py, the V2 runner, which CPU servers run too; 0.34: gpu/model_runner.py and cpu/standalone_model_runner
# .py). The CPU V1 runner of 0.32 and 0.33 (cpu_model_runner.py) prints none.
# The memory is the process's growth while it loaded, which can be negative (vLLM 0.32 printed "took -0.21 GiB memory"
# for a server forked warm, whose inherited pages its profiler's baseline counted).
FIRST_LOAD = re.compile(r"Model loading took -?[\d.]+ \w+ memory and (\d+(?:\.\d+)?) seconds")
# uvicorn's line once the API server answers: a load logged after it is no first load (a fix that loads anew)
STARTED = "Application startup complete."


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


def first_load_seconds(lines: Iterable[str]) -> float | None:
    """How long the server took to load its models before it first answered: the slowest worker's "Model loading
    took … seconds" before uvicorn's startup line; None where the log has none (the CPU V1 runner)."""
    seconds: list[float] = []
    for line in lines:
        if STARTED in line:
            break
        found = FIRST_LOAD.search(line)
        if found:
            seconds.append(float(found.group(1)))
    return max(seconds, default=None)
