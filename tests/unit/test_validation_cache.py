"""Cached answers of the validation program (specwake/prepare/validate.py): one per installation, request and
program text, so a specwake whose program checks differently asks vLLM again instead of reading an answer the old
program gave."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.prepare import validate

REQUEST = {"model": "m", "speculative": {"method": "mtp", "attention_backend": "CPU_MLA"}}


def test_the_program_is_the_one_shipped_beside_it() -> None:
    assert validate.PROGRAM.is_file() and "def speculative_problems" in validate.PROGRAM.read_text()


def test_a_change_of_installation_request_or_program_is_a_new_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = validate._cache_file(tmp_path, "stamp", REQUEST)
    assert first is not None and first == validate._cache_file(tmp_path, "stamp", dict(REQUEST))
    assert validate._cache_file(tmp_path, "other stamp", REQUEST) != first
    assert validate._cache_file(tmp_path, "stamp", {**REQUEST, "model": "n"}) != first

    changed = tmp_path / "validate.py"
    changed.write_text(validate.PROGRAM.read_text() + "\n# checks one more thing\n")
    monkeypatch.setattr(validate, "PROGRAM", changed)
    validate._program_digest.cache_clear()
    try:
        assert validate._cache_file(tmp_path, "stamp", REQUEST) != first
    finally:
        validate._program_digest.cache_clear()


def test_nothing_is_cached_without_a_cache_or_a_stamp(tmp_path: Path) -> None:
    assert validate._cache_file(None, "stamp", REQUEST) is None
    assert validate._cache_file(tmp_path, None, REQUEST) is None
