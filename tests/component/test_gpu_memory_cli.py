"""GPU memory before launch through the real `specwake check` and `run` on the fake CUDA engine, whose torch answers
each GPU's free and total memory (FAKE_VLLM_GPU_MEMORY, tests/helpers/fakeengine.py): a layout whose weights cannot fit
is exit 3 with the numbers and the key to change, and nothing is launched or created; one that fits is said so; a
checkpoint not on this machine is not estimated and not refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.errors import EXIT_INFRA
from tests.helpers.checkpoints import write_header
from tests.helpers.fakeengine import FakeEngine, run_cli, scenario_text

CUDA = {"FAKE_VLLM_PLATFORM": "cuda", "FAKE_VLLM_GPUS": "2"}
# 32 GiB of bfloat16 weights (a 2^34-element tensor).
BIG = {"model.layers.0.mlp.down_proj.weight": ("BF16", [1 << 17, 1 << 17])}


def write(engine: FakeEngine, tmp_path: Path, model: str, draft: str = "") -> Path:
    """The scenario on `model`, TP 2, gpu_memory_utilization 0.9; drafted by `draft` (default: the model itself)."""
    text = scenario_text(engine, model=model, tensor_parallel_size=2)
    if draft:
        text = text.replace(f'method = "draft_model"\nmodel = "{model}"', f'method = "draft_model"\nmodel = "{draft}"')
    path = tmp_path / "s.toml"
    path.write_text(text.replace("[server]\n", "[server]\ngpu_memory_utilization = 0.9\n"))
    return path


def planted(tmp_path: Path) -> tuple[str, str]:
    """A 32 GiB target and a drafter of 2 GiB (a 2^30-element bfloat16 tensor): 17 GiB a GPU over TP 2."""
    write_header(tmp_path / "model" / "model.safetensors", BIG)
    write_header(tmp_path / "draft" / "model.safetensors", {"lm_head.weight": ("BF16", [1 << 15, 1 << 15])})
    return str(tmp_path / "model"), str(tmp_path / "draft")


def test_weights_larger_than_vllms_claim_are_refused_exit_3_nothing_launched(
    engine: FakeEngine, tmp_path: Path
) -> None:
    path = write(engine, tmp_path, *planted(tmp_path))
    small = {**CUDA, "FAKE_VLLM_GPU_MEMORY": "20/20"}  # 0.9 × 20 GiB = 18 GiB claimed: 17 GiB of weights fit
    fits = run_cli(["check", str(path)], tmp_path / "cache", **small)
    assert fits.returncode == 0, fits.stderr
    estimate = "memory: weights 17.00 GiB per GPU (target 32.00 GiB over TP 2 + drafter 2.00 GiB over TP 2)"
    assert estimate + "; vLLM claims 18.00 GiB of GPU 0 (gpu_memory_utilization 0.9 × 20.00 GiB)" in fits.stdout
    assert "20.00 GiB free there (the least of 2) — fits" in fits.stdout
    tiny = {**CUDA, "FAKE_VLLM_GPU_MEMORY": "18/18"}  # 0.9 × 18 GiB = 16.2 GiB: not even the weights
    for command in (["check", str(path)], ["run", str(path), "--output", str(tmp_path / "out")]):
        proc = run_cli(command, tmp_path / "cache", **tiny)
        assert proc.returncode == EXIT_INFRA, proc.stdout + proc.stderr
        said = (
            f"{path}: variant baseline: does not fit the GPUs' memory: its weights, 17.00 GiB per GPU, do not fit"
            " the 16.20 GiB vLLM claims of GPU 0 (gpu_memory_utilization 0.9 × 18.00 GiB)"
        )
        assert said in proc.stdout + proc.stderr
        assert (
            "spread them with server.tensor_parallel_size or raise server.gpu_memory_utilization"
            in proc.stdout + proc.stderr
        )
    assert engine.launched() == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_gpu_without_vllms_claim_free_is_refused_as_vllm_would_at_startup(
    engine: FakeEngine, tmp_path: Path, command: str
) -> None:
    """The fake vLLM is 0.0.fake, before 0.34: it checks the claim is free when it starts (v1/worker/utils.py)."""
    path = write(engine, tmp_path, *planted(tmp_path))
    busy = {**CUDA, "FAKE_VLLM_GPU_MEMORY": "20/20,17.5/20"}  # GPU 1: 17.5 GiB free, 18 GiB claimed
    args = [command, str(path)] + (["--output", str(tmp_path / "out")] if command == "run" else [])
    proc = run_cli(args, tmp_path / "cache", **busy)
    assert proc.returncode == EXIT_INFRA, proc.stdout + proc.stderr
    assert "GPU 1 has 17.50 GiB free of 20.00 GiB, less than the 18.00 GiB vLLM claims" in proc.stdout + proc.stderr
    assert "set server.gpu_memory_utilization to 0.87 or less, or free the GPU" in proc.stdout + proc.stderr
    assert engine.launched() == []


def test_a_checkpoint_not_on_this_machine_is_not_estimated_and_not_refused(engine: FakeEngine, tmp_path: Path) -> None:
    path = write(engine, tmp_path, "fake-org/fake-model", planted(tmp_path)[1])
    proc = run_cli(["check", str(path)], tmp_path / "cache", **CUDA, FAKE_VLLM_GPU_MEMORY="1/1")
    assert proc.returncode == 0, proc.stderr
    assert "memory: not estimated: target fake-org/fake-model: not on this machine" in proc.stdout
