"""Pure planning: exact argv, environment allow-list, discard resolution, CPU thread binding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwake.errors import PlatformMismatch
from specwake.prepare.engine import EngineInfo
from specwake.prepare.plan import (
    VariantPlan,
    build_server_command,
    build_server_env,
    cpu_thread_binding,
    redact_env,
    resolve_discard,
    warm_startable,
)
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.prepare.variants import PreparedVariant
from specwake.run.session.check import measurement_plan

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
        scenario.variants[0],
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
        "specwake.worker.serve",  # vLLM's api_server module, its engine core spared the import (worker/serve.py)
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
        "specwake.worker.extension.SpecwakeWorkerExtension",
        "--enable-prompt-tokens-details",
        "--seed",
        "0",
    ]


def test_a_vllm_that_can_run_vllm_serve_is_launched_through_it(scenario: Scenario) -> None:
    kwargs = dict(python="/py", port=8123, model="/m/target", draft_model=None, sleep_mode=True, is_gpu=True)
    cli = build_server_command(scenario, scenario.variants[0], entrypoint="cli", **kwargs)  # type: ignore[arg-type]
    old = build_server_command(scenario, scenario.variants[0], entrypoint="api_server", **kwargs)  # type: ignore[arg-type]
    assert cli[:8] == ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/m/target", "--host", "127.0.0.1", "--port"]
    assert "--model" not in cli  # `vllm serve` takes the model positionally (and warns about --model)
    assert old[:3] == ["/py", "-m", "specwake.worker.serve"] and old[old.index("--model") + 1] == "/m/target"
    assert cli[8:] == [a for a in old[3:] if a not in ("--model", "/m/target")][3:]  # the rest is identical


def test_gpu_command_adds_sleep_mode_and_memory(scenario: Scenario) -> None:
    argv = build_server_command(
        scenario, scenario.variants[0], python="/py", port=1, model="m", draft_model=None, sleep_mode=True, is_gpu=True
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
    assert added["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


@pytest.mark.parametrize(
    ("parent", "visible", "expected"),
    [
        ("4,5,6,7", (0, 1), "4,5"),  # a Slurm slice: visible 0-1 are physical 4-5, never 0-1
        ("4,5,6,7", (2, 3), "6,7"),
        ("GPU-aaaa-1111,GPU-bbbb-2222", (1,), "GPU-bbbb-2222"),
        ("MIG-1c2d-0/1/0, MIG-1c2d-0/2/0", (1,), "MIG-1c2d-0/2/0"),
        (None, (2, 3), "2,3"),
    ],
)
def test_gpu_indices_are_translated_through_the_parents_visible_devices(
    scenario: Scenario, parent: str | None, visible: tuple[int, ...], expected: str
) -> None:
    base = {"CUDA_VISIBLE_DEVICES": parent} if parent is not None else {}
    env, added = build_server_env(
        scenario, scenario.variants[0], base_env=base, pythonpath=["/src"], is_gpu=True, cpu_ids=[0], gpus=visible
    )
    assert env["CUDA_VISIBLE_DEVICES"] == added["CUDA_VISIBLE_DEVICES"] == expected


def test_a_gpu_index_outside_the_parents_list_is_refused(scenario: Scenario) -> None:
    with pytest.raises(PlatformMismatch, match="GPU index 2 is not visible"):
        build_server_env(
            scenario, scenario.variants[0], base_env={"CUDA_VISIBLE_DEVICES": "4,5"}, pythonpath=[], is_gpu=True,
            cpu_ids=[0], gpus=(2,),
        )  # fmt: skip


def test_gpu_users_variables_reach_the_server(scenario: Scenario) -> None:
    base = {name: "1" for name in ("TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "PYTORCH_CUDA_ALLOC_CONF",
                                   "NCCL_DEBUG", "CUDA_LAUNCH_BLOCKING", "AWS_SECRET_ACCESS_KEY")}  # fmt: skip
    env, _ = build_server_env(scenario, scenario.variants[0], base_env=base, pythonpath=[], is_gpu=True, cpu_ids=[0])
    assert set(env) >= set(base) - {"AWS_SECRET_ACCESS_KEY"} and "AWS_SECRET_ACCESS_KEY" not in env


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


def prepared_variant(scenario: Scenario, name: str, l2_discard: str) -> PreparedVariant:
    variant = next(v for v in scenario.variants if v.name == name)
    engine = EngineInfo("/py", "3.11", "0.32.0", Path("/pkg/vllm"), ("vllm==0.32.0",), "cpu", False, None, 0, 2)
    return PreparedVariant(variant, engine, None, None, "/m/target", None, l2_discard)


def test_check_shows_what_will_be_measured_and_decided_with_every_default(scenario: Scenario) -> None:
    prepared = [prepared_variant(scenario, "baseline", "emulated"), prepared_variant(scenario, "patched", "emulated")]
    text = "\n".join(measurement_plan(scenario, prepared))
    assert f"prompts: {len(scenario.prompts)} from builtin:mixed" in text
    assert f"each stage: 1 warmup (16 tokens) + {scenario.workload.repeats} measured requests" in text  # defaults
    assert "max_tokens 256, temperature 0, ignore_eos true, request timeout 300 s" in text
    assert "after each of 2 cycle(s): L2: sleep → discard → wake_weights → reload_weights" in text
    assert "emulated discard fills zero" in text and "step timeout 300 s" in text
    assert "every post-cycle AL ≥ 95% of fresh (tolerance 0.05)" in text and "AL ≤ 1.05" in text
    assert "baseline: expect any; speed 0.90× fresh — advisory: the L2 discard is emulated" in text
    native = "\n".join(measurement_plan(scenario, [prepared_variant(scenario, "patched", "native")]))
    assert "patched: expect any; speed 0.90× fresh — counts: the default for a real L2 discard" in native
    assert "discard" not in native.split("stages:")[1].split("\n")[0]  # no emulated discard step on GPU


VARIANTS = """
[variants.baseline]
[variants.preserve]
args = ["--sleep-preserve-parameter-names", "draft.*"]
[variants.floor]
speculative = false
"""


def test_variant_args_follow_the_server_args_and_a_floor_has_no_speculation(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text(SCENARIO.split("[variants.baseline]")[0] + VARIANTS)
    scenario = load_scenario(path)
    kwargs = dict(python="/py", port=1, model="m", draft_model=None, sleep_mode=True, is_gpu=True)
    baseline, preserve, floor = (build_server_command(scenario, v, **kwargs) for v in scenario.variants)  # type: ignore[arg-type]
    assert preserve == [*baseline, "--sleep-preserve-parameter-names", "draft.*"]
    assert "--speculative-config" in baseline and "--speculative-config" not in floor
    assert [a for a in baseline if a not in floor] == [
        "--speculative-config",
        baseline[baseline.index("--speculative-config") + 1],
    ]
    assert scenario.settings()["variants"]["floor"]["speculative"] is False


@pytest.mark.parametrize(("method", "crashes"), [("dflash", "DFlash"), ("dspark", "DSpark"), ("eagle3", None)])
def test_check_says_a_chunked_draft_sync_of_a_dflash_or_dspark_drafter_crashes(
    tmp_path: Path, method: str, crashes: str | None
) -> None:
    path = tmp_path / "sync.toml"
    text = SCENARIO.replace('method = "eagle3"', f'method = "{method}"').split("[variants.baseline]")[0]
    text += '[cycle]\nreload = "weight_transfer"\n[variants.target]\npush_to = ["target"]\n'
    path.write_text(text + '[variants.both]\npush_to = ["target", "draft"]\n')
    scenario = load_scenario(path)
    prepared = [prepared_variant(scenario, name, "emulated") for name in ("target", "both")]
    text = "\n".join(measurement_plan(scenario, prepared))
    notes = [line for line in text.splitlines() if "chunked draft session crashes" in line]
    if crashes is None:
        assert notes == []
        return
    assert len(notes) == 1 and f"this {crashes} drafter inside vLLM's load_weights" in notes[0]
    assert text.index("both: expect") < text.index(notes[0])  # said under the variant that syncs the drafter


@pytest.mark.parametrize("is_gpu", [False, True])
def test_only_a_cpu_api_server_whose_processes_fork_starts_warm(scenario: Scenario, is_gpu: bool) -> None:
    variant = scenario.variants[0]
    command = dict(python="/py", port=1, model="m", draft_model=None, sleep_mode=is_gpu, is_gpu=is_gpu)
    argv = build_server_command(scenario, variant, **command)  # type: ignore[arg-type]
    env, added = build_server_env(scenario, variant, base_env={}, pythonpath=["/p"], is_gpu=is_gpu, cpu_ids=[0, 1])
    plan = VariantPlan(variant, "/py", argv, env, added, 1, "emulated")
    assert warm_startable(plan) is not is_gpu
    if not is_gpu:
        spawned = {**env, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}  # a user's choice: nothing to fork from
        assert not warm_startable(VariantPlan(variant, "/py", argv, spawned, added, 1, "emulated"))
        headless = [*argv, "--headless"]  # another node's engines: run by specwake's node command
        assert not warm_startable(VariantPlan(variant, "/py", headless, env, added, 1, "emulated"))
