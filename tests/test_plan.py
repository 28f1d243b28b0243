"""Pure planning: exact argv, environment allow-list, discard resolution, CPU thread binding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwake.errors import PlatformMismatch
from specwake.plan import (
    build_server_command,
    build_server_env,
    cpu_thread_binding,
    redact_env,
    resolve_discard,
)
from specwake.scenario import Scenario, load_scenario

SCENARIO = """
[server]
model = "org/target"
tensor_parallel_size = 2
enforce_eager = true
dtype = "float32"
max_model_len = 512
gpu_memory_utilization = 0.8
args = ["--seed", "0"]
env = { FROM_SCENARIO = "s", SHARED = "scenario" }
[speculative]
method = "eagle3"
model = "builtin:tiny-llama"
num_speculative_tokens = 3
[variants.baseline]
[variants.patched]
env = { SHARED = "variant" }
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return load_scenario(path)


def test_cpu_command_is_exact(scenario: Scenario) -> None:
    argv = build_server_command(
        scenario,
        python="/py",
        port=8123,
        model="/m/target",
        draft_model="/m/draft",
        sleep_mode=False,
        is_gpu=False,
    )
    spec = json.dumps(
        {"method": "eagle3", "model": "/m/draft", "num_speculative_tokens": 3},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert argv == [
        "/py",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--model",
        "/m/target",
        "--tensor-parallel-size",
        "2",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--speculative-config",
        spec,
        "--worker-extension-cls",
        "specwake.worker_ext.SpecwakeWorkerExtension",
        "--seed",
        "0",
    ]


def test_gpu_command_adds_sleep_mode_and_memory(scenario: Scenario) -> None:
    argv = build_server_command(
        scenario, python="/py", port=1, model="m", draft_model=None, sleep_mode=True, is_gpu=True
    )
    assert argv[-3:] == ["--enable-sleep-mode", "--seed", "0"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.8"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == "builtin:tiny-llama"  # non-resolved refs pass through verbatim


def test_env_allow_list_and_precedence(scenario: Scenario) -> None:
    base = {
        "PATH": "/bin",
        "HOME": "/root",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "HF_TOKEN": "hf_secret",
        "AWS_SECRET_ACCESS_KEY": "nope",
        "PYTHONPATH": "/elsewhere",
        "RANDOM_VAR": "x",
    }
    patched = scenario.variants[1]
    env, added = build_server_env(
        scenario, patched, base_env=base, pythonpath=["/ovl", "/src"], is_gpu=False, cpu_ids=[0, 1]
    )
    assert env["PATH"] == "/bin" and env["VLLM_LOGGING_LEVEL"] == "DEBUG" and env["HF_TOKEN"] == "hf_secret"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "RANDOM_VAR" not in env
    assert env["PYTHONPATH"] == "/ovl:/src"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"  # TP=2 on two cores
    assert env["FROM_SCENARIO"] == "s" and env["SHARED"] == "variant"
    assert "HF_TOKEN" not in added
    assert redact_env(env)["HF_TOKEN"] == "***"


def test_gpu_env_sets_visible_devices(scenario: Scenario) -> None:
    env, added = build_server_env(
        scenario,
        scenario.variants[0],
        base_env={},
        pythonpath=["/src"],
        is_gpu=True,
        cpu_ids=[0],
        gpus=(4, 5),
    )
    assert added["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


@pytest.mark.parametrize(
    ("tp", "cpus", "expected"),
    [
        (1, [0, 1], None),
        (2, [0, 1], "0|1"),
        (2, [0, 1, 2, 3], "0-1|2-3"),
        (3, [0, 1], None),
        (2, [4, 5, 6, 7, 8], "4-5|6-7"),
    ],
)
def test_cpu_thread_binding(tp: int, cpus: list[int], expected: str | None) -> None:
    assert cpu_thread_binding(tp, cpus) == expected


def test_discard_resolution(scenario: Scenario) -> None:
    assert resolve_discard(scenario, sleep_mode=False, platform="cpu") == "emulated"
    assert resolve_discard(scenario, sleep_mode=True, platform="cuda") == "native"


@pytest.mark.parametrize(
    ("discard", "sleep_mode", "phrase"),
    [
        ("native", False, "needs vLLM sleep mode"),
        ("emulated", True, "for platforms without sleep mode"),
    ],
)
def test_discard_mismatch_is_input_error(tmp_path: Path, discard: str, sleep_mode: bool, phrase: str) -> None:
    path = tmp_path / "d.toml"
    path.write_text(SCENARIO + f'[cycle]\ndiscard = "{discard}"\n')
    with pytest.raises(PlatformMismatch, match=f"cycle.discard: .*{phrase}") as info:
        resolve_discard(load_scenario(path), sleep_mode=sleep_mode, platform="x")
    assert info.value.exit_code == 3
