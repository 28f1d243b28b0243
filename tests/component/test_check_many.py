"""`specwake check` and `run` of several scenario files on the fake engine: every file with a problem found before
launch gets its own `error: FILE: KEY: reason` line (its first problem), in the order given, exit 2, nothing launched;
the variant's vLLM is asked about all the other files in one process. tests/e2e/test_validate.py does the same with
the real vLLM's refusals."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tests.helpers.fakeengine import FakeEngine, run_cli, scenario_text

TENSORS = ["lm_head.weight", "model.norm.weight"]


def checkpoint(folder: Path) -> Path:
    """One safetensors file of TENSORS, written by hand (header length, JSON header, data)."""
    header = {
        name: {"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]} for i, name in enumerate(TENSORS)
    }
    raw = json.dumps(header).encode()
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8 * len(TENSORS)))
    return folder


def scenario(engine: FakeEngine, path: Path, model: Path, keys: str = "") -> Path:
    text = scenario_text(engine, variants={"v": {}}, model=str(model), name=path.stem)
    text = text.replace("[cycle]\n", "[cycle]\nreload = 'push'\n")
    path.write_text(text.replace("[variants.v]\n", f"[variants.v]\n{keys}"))
    return path


def validations(engine: FakeEngine) -> int:
    return sum(1 for line in engine.invocations() if line.startswith("-m specwake.worker.validate"))


def test_every_bad_file_gets_its_line_and_the_rest_are_asked_in_one_process(engine: FakeEngine, tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model")
    files = [
        scenario(engine, tmp_path / "first-bad.toml", model, "push_scale = { 'lm_haed.weight' = 2.0 }\n"),
        scenario(engine, tmp_path / "good.toml", model),
        scenario(engine, tmp_path / "second-bad.toml", model, "push_skip = ['model.nrom.*']\n"),
        scenario(engine, tmp_path / "also-good.toml", model),
    ]
    for command in (["check"], ["run", "--output", str(tmp_path / "out")]):
        before = validations(engine)
        proc = run_cli([*command, *map(str, files)], tmp_path / "cache", 120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert errors == [
            f"error: {files[0]}: variants.v.push_scale: 'lm_haed.weight' names no tensor of the checkpoint: nothing"
            " would be scaled",
            f"error: {files[2]}: variants.v.push_skip: 'model.nrom.*' names no tensor of the checkpoint: nothing"
            " would be left out",
        ], proc.stderr
        assert validations(engine) - before == 1  # the good files, both in one process (the fake vLLM cannot answer)
    assert engine.launched() == [] and not (tmp_path / "out").exists()
