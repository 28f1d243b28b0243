"""The builtin prompt sets against the builtin models' byte-level tokenizer: `builtin:every-byte` reads every token
id that text can reach, in the first request of every stage, within the tiny scenarios' max_model_len.

Token id == byte value, so the ids a request reads are the bytes of its prompt (and BOS) and the tokens generated.
Ids no request reads: 0xC0 and 0xC1 (they would start overlong encodings) and 0xF5..0xFF (they would start code
points above U+10FFFF) occur in no UTF-8 text, so no prompt carries them, and the builtin models' greedy tokens are
printable ASCII (ids 32..126; tiny-llama's LM head is zero elsewhere); EOS, UNK and PAD (257..259) are never input
(a prompt is text after BOS, ignore_eos, and no head makes them greedy), nor are the padding rows 260..319. A damaged
embedding row among those is invisible to AL; the fingerprints see it.
"""

from __future__ import annotations

import functools

import pytest

from tests.helpers.procs import require_module

require_module("tokenizers")
require_module("torch")  # specwake.worker.tokenizer writes checkpoints too

from specwake.prepare.prompts import BUILTIN_PROMPTS, EVERY_BYTE, MIXED  # noqa: E402
from specwake.prepare.scenario import load_scenario  # noqa: E402
from specwake.worker.tokenizer import BOS, NUM_BYTES, byte_tokenizer, special_id  # noqa: E402
from tests.helpers.paths import REPO  # noqa: E402

TINY_SCENARIOS = ("tiny-cpu.toml", "tiny-cpu-bf16.toml", "tiny-gpu.toml")


@functools.cache
def utf8_bytes() -> frozenset[int]:
    """Every byte value in the UTF-8 encoding of some code point (surrogates are not text)."""
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    return frozenset(text.encode())


def ids(prompt: str) -> list[int]:
    return byte_tokenizer().encode(prompt).ids


def test_utf8_text_can_hold_all_bytes_but_thirteen() -> None:
    assert set(range(NUM_BYTES)) - utf8_bytes() == {0xC0, 0xC1, *range(0xF5, 0x100)}


def test_the_first_prompt_of_every_byte_reads_every_id_text_can_reach() -> None:
    """Every stage sends the set's first prompt: its warmup and its first measured request (a stage after a cycle
    stops at min_repeats ≥ 1 at the earliest)."""
    assert BUILTIN_PROMPTS["every-byte"] == (EVERY_BYTE, *MIXED)
    read = set(ids(EVERY_BYTE))
    assert read >= utf8_bytes()
    assert len(utf8_bytes()) == 243
    assert read - utf8_bytes() == {special_id(BOS)}


def test_mixed_alone_reads_printable_ascii_only() -> None:
    """What every-byte adds: mixed reads no control byte, no byte above 0x7F, and 37 of the 95 printable ones."""
    read = {i for prompt in MIXED for i in ids(prompt)} - {special_id(BOS)}
    assert read <= set(range(32, 127))
    assert len(read) == 37


def test_the_tokenizer_keeps_every_byte_of_it() -> None:
    tokenizer = byte_tokenizer()
    encoded = tokenizer.encode(EVERY_BYTE).ids
    assert encoded == [special_id(BOS), *EVERY_BYTE.encode()]
    assert tokenizer.decode(encoded, skip_special_tokens=True) == EVERY_BYTE


@pytest.mark.parametrize("name", TINY_SCENARIOS)
def test_the_tiny_scenarios_send_it_and_generate_in_full(name: str) -> None:
    """vLLM clamps max_tokens to what max_model_len leaves after the prompt: every request still gets all of its."""
    scenario = load_scenario(REPO / "scenarios" / name)
    assert scenario.prompts[0] == EVERY_BYTE
    longest = max(len(ids(prompt)) for prompt in scenario.prompts)
    assert longest + scenario.workload.max_tokens <= scenario.server.max_model_len
