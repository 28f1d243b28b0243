"""What a stage sends: the builtin prompt sets a scenario names (`prompts = "builtin:mixed"`) and the prefix-cache probe
that specwake adds to every stage. `check` counts both against max_model_len (prepare/validate.py); the run sends them
(run/measure.py).
"""

from __future__ import annotations

BUILTIN_PROMPTS = {
    "mixed": (
        "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
        "Explain in three sentences why the sky is blue.",
        "List the first ten prime numbers and say how you checked each one.",
        "Summarise the plot of a heist story set on a night train across the Alps.",
        "Translate to French: The meeting moved to Thursday because the room was booked.",
        "Give step-by-step instructions to make a cup of green tea.",
    ),
}

# The prefix-cache probe: ~300 characters, several KV-cache blocks with any tokenizer, under 512 tokens with a
# byte-level one. Every stage sends it twice: the first answer must show no cached tokens right after a wake (the
# wake reset the prefix cache; a hit means stale hashes survived); the second shows the cache works at all.
PREFIX_PROBE = (
    "Specwake prefix probe. A shared preamble that every stage sends first, so that a prefix cache which kept "
    "its hashes across a sleep and wake would serve these tokens from memory that no longer holds them. The "
    "quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly. Stage"
)


def probe_prompt(cycle: int) -> str:
    """The prefix-cache probe of a stage (cycle 0: fresh)."""
    return f"{PREFIX_PROBE} {cycle}."
