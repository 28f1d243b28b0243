"""Perturbed and partial pushes and syncs through the real CLI on the fake engine: `check` refuses a push_scale or
push_skip entry that names no tensor of its model's checkpoint (exit 2, one line naming file and key, nothing
launched) and lists every name per model with --tensors, read from the checkpoints' safetensors headers without vLLM;
a run resolves the entries against what the server sends each model, and judges and explains a drafter perturbed
alone by the drafter.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.helpers.fakeengine import FakeEngine, result_of, run_cli, run_text, scenario_text, variant

TARGET = ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]
DRAFT = ["midlayer.norm.weight", "midlayer.mlp.down_proj.weight"]


def checkpoint(folder: Path, names: list[str]) -> Path:
    """A folder holding one safetensors file of the given float32 tensors, written by hand (an 8-byte header length,
    the JSON header, the data): no torch, no safetensors package."""
    header = {name: {"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]} for i, name in enumerate(names)}
    raw = json.dumps(header).encode()
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8 * len(names)))
    return folder


def scenario(engine: FakeEngine, tmp_path: Path, variant_keys: str, reload: str = "push") -> Path:
    """A scenario whose target and drafter are local checkpoints of their own, pushing (or syncing) into both."""
    target, draft = checkpoint(tmp_path / "target", TARGET), checkpoint(tmp_path / "draft", DRAFT)
    text = scenario_text(engine, variants={"v": {}}, model=str(target))
    text = text.replace(f'method = "draft_model"\nmodel = "{target}"', f'method = "eagle3"\nmodel = "{draft}"')
    text = text.replace("[cycle]\n", f"[cycle]\nreload = {json.dumps(reload)}\npush_to = ['target', 'draft']\n")
    path = tmp_path / "s.toml"
    path.write_text(text.replace("[variants.v]\n", f"[variants.v]\n{variant_keys}"))
    return path


@pytest.mark.parametrize(
    ("keys", "key", "reason"),
    [
        (
            "push_skip = ['draft:model.norm.*']\n",
            "variants.v.push_skip",
            "'draft:model.norm.*' names no tensor of the drafter's checkpoint: nothing would be left out",
        ),
        (
            "push_scale = { 'lm_haed.weight' = 2.0 }\n",
            "variants.v.push_scale",
            "'lm_haed.weight' names no tensor of the checkpoints: nothing would be scaled",
        ),
        (
            "push_scale = { 'target:midlayer.*' = 0.0 }\n",
            "variants.v.push_scale",
            "'target:midlayer.*' names no tensor of the target's checkpoint: nothing would be scaled",
        ),
    ],
)
@pytest.mark.parametrize("reload", ["push", "weight_transfer"])
def test_check_refuses_an_entry_that_names_no_tensor_of_its_checkpoint(
    engine: FakeEngine, tmp_path: Path, keys: str, key: str, reason: str, reload: str
) -> None:
    path = scenario(engine, tmp_path, keys, reload)
    proc = run_cli(["check", str(path)], tmp_path / "cache", 120)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {path}: {key}: {reason}"], proc.stderr
    assert engine.launched() == []


def test_check_lists_every_name_per_model_that_an_entry_may_use(engine: FakeEngine, tmp_path: Path) -> None:
    path = scenario(engine, tmp_path, "push_scale = { 'draft:midlayer.norm.*' = 1.05 }\npush_skip = ['lm_head.*']\n")
    proc = run_cli(["check", str(path), "--tensors"], tmp_path / "cache", 120)
    assert proc.returncode == 0, proc.stderr
    listing = proc.stdout.split("checkpoint tensors push_scale and push_skip may name")[1].splitlines()[1:]
    assert listing[: len(TARGET) + len(DRAFT) + 2] == [
        f"    target: {tmp_path / 'target'}, 3 tensors",
        *(f"      {name}" for name in TARGET),
        f"    draft: {tmp_path / 'draft'}, 2 tensors",
        *(f"      {name}" for name in sorted(DRAFT)),
    ]
    plain = run_cli(["check", str(path)], tmp_path / "cache", 120)
    assert plain.returncode == 0 and "checkpoint tensors" not in plain.stdout  # only when asked


def test_a_drafter_perturbed_alone_is_judged_by_the_drafter_and_counted_per_model(
    engine: FakeEngine, tmp_path: Path
) -> None:
    """The fake drafter never changes its checksums: a drafter-only perturbation that left no trace is `degraded`,
    explained as such, never "the output did not change"; the result counts what was scaled in each model."""
    text = scenario_text(engine, variants={"v": {}}, expect={"v": "any"})
    text = text.replace("[cycle]\n", "[cycle]\nreload = 'push'\npush_to = ['target', 'draft']\n")
    text = text.replace("[variants.v]\n", "[variants.v]\npush_scale = { 'draft:lm_head.weight' = 1.05 }\n")
    proc, out = run_text(engine, tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    v = variant(result_of(out), "v")
    assert v["push"]["scaled"] == {"target": 0, "draft": 1} and v["outcome"] == "degraded"
    push = next(s for s in v["steps"] if s["name"] == "push")
    assert push["response"]["results"][0]["scaled"] == ["lm_head.weight"]
    report = next(out.iterdir()).joinpath("report.md").read_text()
    assert "the push scaled draft:lm_head.weight ×1.05 (1 drafter tensor)" in report
    assert "the new weights did not reach the drafter" in report


def test_an_entry_no_tensor_sent_matches_is_refused_before_the_fresh_stage(engine: FakeEngine, tmp_path: Path) -> None:
    """Where the checkpoint is not on this machine (a Hub id) `check` cannot look; the run resolves the entries
    against the server's own manifest before measuring anything."""
    text = scenario_text(engine, variants={"v": {}}, expect={"v": "any"})
    text = text.replace("[cycle]\n", "[cycle]\nreload = 'push'\n")
    text = text.replace("[variants.v]\n", "[variants.v]\npush_skip = ['lm_haed.weight']\n")
    proc, out = run_text(engine, tmp_path, text)
    assert proc.returncode == 2, proc.stderr
    v = variant(result_of(out), "v")
    assert v["outcome"] == "error" and v["crash_class"] == "input_rejected" and v["stages"] == []
    assert "push_skip 'lm_haed.weight' picks no tensor the push sends" in v["error"]
    assert "not checked: push_skip names: target: fake-model: not on this machine" in proc.stderr
