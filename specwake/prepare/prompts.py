"""What a stage sends: the builtin prompt sets a scenario names (`prompts = "builtin:mixed"`, `"builtin:every-byte"`)
and the prefix-cache probe that specwake adds to every stage. `check` counts both against max_model_len
(prepare/validate.py); the run sends them (run/measure/measure.py).
"""

from __future__ import annotations

MIXED = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in three sentences why the sky is blue.",
    "List the first ten prime numbers and say how you checked each one.",
    "Summarise the plot of a heist story set on a night train across the Alps.",
    "Translate to French: The meeting moved to Thursday because the room was booked.",
    "Give step-by-step instructions to make a cup of green tea.",
)

# One character (a sequence for the combining marks and the variation selector) per UTF-8 lead byte 0xC2..0xF4, in
# that order, chosen so that together they also carry every continuation byte 0x80..0xBF: Latin, IPA, combining
# marks, Greek, Cyrillic, Armenian, Hebrew, Arabic, Syriac, Thaana, N'Ko, Devanagari, Georgian, a symbol, kana, CJK,
# Hangul, a fullwidth form, an emoji, an ideographic variation sequence (葛 + U+E0100), and, where a lead byte
# starts nothing else, code points that are private use (0xEE: U+E0A0, 0xF4: U+10FFFD) or unassigned (0xF1:
# U+40000, 0xF2: U+80000).
_SCRIPTS = (
    "»åğźƷǫȳɪʒˌn\u0303t\u0361sβωЦюүөԾգրיاهژ۱ܗݐނߋअდ∞う中家本用题강라어특\ue0a0：🍵"
    "\U00040000\U00080000葛\U000e0100\U0010fffd"
)
_ASCII = "".join(map(chr, range(128)))  # controls included

# Every byte value that UTF-8 text can hold, in one prompt of 374 bytes: with a byte-level tokenizer (the builtin
# models') the first request of every stage reads every token id that text can reach, in the target's embedding and
# in the drafter's, so damage in any of those rows enters the computation. 375 tokens with BOS, so it leaves 128
# tokens to generate within max_model_len 512 (vLLM would clamp max_tokens to what a longer prompt leaves).
EVERY_BYTE = (
    "Name the script of each character, or say it is private use or unassigned: "
    + _SCRIPTS
    + " Which of these are control characters? "
    + _ASCII
)

BUILTIN_PROMPTS = {
    "mixed": MIXED,
    # mixed, after a first prompt that holds every byte value (the tiny scenarios: their tokenizer is byte-level)
    "every-byte": (EVERY_BYTE, *MIXED),
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
