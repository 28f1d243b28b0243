"""Tests of the builtin models' cache: deterministic offline build, cache reuse, race, errors, the registry.

Builds run specwake.worker.build in this interpreter (the venv has torch, safetensors, tokenizers).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import threading
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from specwake.errors import EngineMissing, InputError
from specwake.prepare.models import (
    BUILTIN_MODELS,
    builder_env,
    ensure_builtin_model,
    is_builtin,
    lookup,
    model_dir,
    resolve_model_ref,
)

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def safetensors_header(path: Path) -> dict[str, dict]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header: dict[str, dict] = json.loads(raw[8 : 8 + length])
    header.pop("__metadata__", None)
    return header


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_builtin_model("tiny-llama", sys.executable, tmp_path_factory.mktemp("cache"))


def test_build_layout_is_versioned_and_complete(built: Path) -> None:
    assert built == model_dir("tiny-llama", built.parent.parent)
    assert built.name == "tiny-llama-v1"
    assert {p.name for p in built.iterdir()} == EXPECTED_FILES
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no staging leftovers


def test_config_fits_vllm_cpu(built: Path) -> None:
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["head_dim"] == 64
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["tie_word_embeddings"] is False
    assert config["torch_dtype"] == "float32"


def test_weights_match_config(built: Path) -> None:
    config = json.loads((built / "config.json").read_text())
    header = safetensors_header(built / "model.safetensors")
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    assert header["model.embed_tokens.weight"]["shape"] == [vocab, hidden]
    assert header["lm_head.weight"]["shape"] == [vocab, hidden]
    layers = {name.split(".")[2] for name in header if name.startswith("model.layers.")}
    assert len(layers) == config["num_hidden_layers"]
    assert {entry["dtype"] for entry in header.values()} == {"F32"}


def test_tokenizer_is_byte_level_with_specials(built: Path) -> None:
    tok = Tokenizer.from_file(str(built / "tokenizer.json"))
    config = json.loads((built / "config.json").read_text())
    text = "Grüße, café! ~"
    ids = tok.encode(text).ids
    assert ids[0] == config["bos_token_id"]
    assert ids[1:] == list(text.encode("utf-8"))
    assert tok.decode(ids, skip_special_tokens=True) == text
    tok_config = json.loads((built / "tokenizer_config.json").read_text())
    assert tok.token_to_id(tok_config["eos_token"]) == config["eos_token_id"]
    assert tok.get_vocab_size() <= config["vocab_size"]


def test_build_is_deterministic(built: Path, tmp_path: Path) -> None:
    again = ensure_builtin_model("tiny-llama", sys.executable, tmp_path)
    assert again != built
    assert file_hashes(again) == file_hashes(built)


def test_second_call_reuses_without_building(built: Path) -> None:
    before = file_hashes(built)
    # An interpreter that cannot run proves no build is attempted.
    again = ensure_builtin_model("tiny-llama", "/nonexistent/python", built.parent.parent)
    assert again == built
    assert file_hashes(again) == before


def test_concurrent_builds_agree_on_one_folder(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(ensure_builtin_model("tiny-llama", sys.executable, tmp_path))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(results)) == 1
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-llama-v1"]
    assert {p.name for p in results[0].iterdir()} == EXPECTED_FILES


def test_failed_build_raises_engine_missing_and_cleans_up(tmp_path: Path) -> None:
    with pytest.raises(EngineMissing, match="builtin model tiny-llama"):
        ensure_builtin_model("tiny-llama", "/nonexistent/python", tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


def test_builder_error_carries_stderr_tail(tmp_path: Path) -> None:
    # A real interpreter without the needed --out argument: argparse writes to stderr.
    bad_python = tmp_path / "python"
    bad_python.write_text(f"#!/bin/sh\nexec {sys.executable} -m specwake.worker.build\n")
    bad_python.chmod(0o755)
    with pytest.raises(EngineMissing, match="required"):
        ensure_builtin_model("tiny-llama", str(bad_python), tmp_path / "cache")


def test_unknown_builtin_name_lists_known(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="builtin:tiny-llama") as info:
        resolve_model_ref("builtin:huge-llama", sys.executable)
    assert "huge-llama" in str(info.value)
    with pytest.raises(InputError):
        ensure_builtin_model("nope", sys.executable, tmp_path)
    assert lookup("tiny-llama").family == "draft_model"
    assert len({m.name for m in BUILTIN_MODELS}) == len(BUILTIN_MODELS)


def test_resolve_builtin_uses_cache_env(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWAKE_CACHE", str(built.parent.parent))
    assert resolve_model_ref("builtin:tiny-llama", sys.executable) == str(built)


@pytest.mark.parametrize("ref", ["meta-llama/Llama-3.1-8B-Instruct", "/models/x", "builtin"])
def test_non_builtin_refs_pass_through(ref: str) -> None:
    assert resolve_model_ref(ref, "/nonexistent/python") == ref


def test_builder_env_puts_package_parent_first() -> None:
    env = builder_env({"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    first, rest = env["PYTHONPATH"].split(":", 1)
    assert (Path(first) / "specwake" / "worker" / "build.py").is_file()
    assert rest == "/elsewhere"
    assert env["HOME"] == "/h"


def test_a_drafter_and_its_builtin_target_both_resolve(tmp_path: Path) -> None:
    target = resolve_model_ref("builtin:mtp-gemma4", sys.executable, tmp_path)
    draft = resolve_model_ref("builtin:mtp-gemma4-assistant", sys.executable, tmp_path)
    assert Path(target) == model_dir("mtp-gemma4", tmp_path) and Path(draft).is_dir()
    assert (
        json.loads((Path(draft) / "config.json").read_text())["backbone_hidden_size"]
        == json.loads((Path(target) / "config.json").read_text())["hidden_size"]
    )
    assert is_builtin("builtin:x") and not is_builtin("meta-llama/x") and not is_builtin(None)
