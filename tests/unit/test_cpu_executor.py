"""Which executor a CPU server gets: the worker inside the engine core process at TP=1 (vLLM's V1 multiprocessing
off), one worker process per rank otherwise; what overrides that; the core binding only where it is read;
torch.compile off for an eager CPU server; its engine processes forked from its API server; and vLLM's model
inspection in the server's own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.prepare.plan import (
    DYNAMO_DISABLE,
    INSPECT_IN_PROCESS,
    MULTIPROCESSING,
    START_METHOD,
    build_server_env,
    cpu_executor,
)
from specwake.prepare.scenario import Scenario, load_scenario
from specwake.worker import serve


def scenario_with(
    tmp_path: Path, tp: int, env: str = "", variant_env: str = "", eager: str = "true", variant_args: str = ""
) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(
        f'[server]\nmodel = "org/target"\ntensor_parallel_size = {tp}\nenforce_eager = {eager}\n'
        f"env = {{ {env} }}\n"
        '[speculative]\nmethod = "draft_model"\nmodel = "org/draft"\nnum_speculative_tokens = 3\n'
        f"[variants.baseline]\nenv = {{ {variant_env} }}\nargs = [{variant_args}]\n"
    )
    return load_scenario(path)


def cpu_env(
    scenario: Scenario, base: dict[str, str] | None = None, cores: tuple[int, ...] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    return build_server_env(
        scenario, scenario.variants[0], base_env=base or {}, pythonpath=["/src"], is_gpu=False, cpu_ids=[0, 1],
        cores=cores,
    )  # fmt: skip


@pytest.mark.parametrize("cores", [(), (1,)])  # one at a time, or side by side on core 1
def test_a_tp1_cpu_server_keeps_its_worker_in_the_engine_core(tmp_path: Path, cores: tuple[int, ...]) -> None:
    env, added = cpu_env(scenario_with(tmp_path, tp=1), cores=cores)
    assert added[MULTIPROCESSING] == env[MULTIPROCESSING] == "0"
    assert cpu_executor(1, env) == "uni"
    # only the multiprocessing executor reads the binding; the server's affinity holds it to its cores
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env


@pytest.mark.parametrize(("cores", "binding"), [((), "0|1"), ((0, 1), "0|1")])
def test_tensor_parallel_keeps_a_worker_process_per_rank_bound_to_its_cores(
    tmp_path: Path, cores: tuple[int, ...], binding: str
) -> None:
    env, added = cpu_env(scenario_with(tmp_path, tp=2), cores=cores)
    assert MULTIPROCESSING not in env
    assert cpu_executor(2, env) == "mp"
    assert added["VLLM_CPU_OMP_THREADS_BIND"] == binding


@pytest.mark.parametrize(
    ("where", "value"),
    [("scenario", "1"), ("variant", "1"), ("caller", "1"), ("scenario", "0")],
)
def test_the_scenario_variant_or_caller_decides_over_the_default(tmp_path: Path, where: str, value: str) -> None:
    setting = f'{MULTIPROCESSING} = "{value}"'
    scenario = scenario_with(
        tmp_path, tp=1, env=setting if where == "scenario" else "", variant_env=setting if where == "variant" else ""
    )
    base = {MULTIPROCESSING: value} if where == "caller" else {}
    env, added = cpu_env(scenario, base=base, cores=(1,))
    assert env[MULTIPROCESSING] == value
    assert (MULTIPROCESSING in added) == (where != "caller")  # the caller's own setting passes through, unrecorded
    if value == "1":  # the multiprocessing executor again: its worker is bound to the server's core
        assert cpu_executor(1, env) == "mp" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_a_binding_of_the_scenarios_own_is_kept_whatever_the_executor(tmp_path: Path) -> None:
    env, added = cpu_env(scenario_with(tmp_path, tp=1, env='VLLM_CPU_OMP_THREADS_BIND = "0"'), cores=(1,))
    assert added["VLLM_CPU_OMP_THREADS_BIND"] == "0" and env[MULTIPROCESSING] == "0"


def test_gpu_servers_are_left_as_vllm_starts_them(tmp_path: Path) -> None:
    scenario = scenario_with(tmp_path, tp=1)
    env, _ = build_server_env(scenario, scenario.variants[0], base_env={}, pythonpath=[], is_gpu=True, cpu_ids=[0])
    assert MULTIPROCESSING not in env and "VLLM_CPU_OMP_THREADS_BIND" not in env and DYNAMO_DISABLE not in env
    assert START_METHOD not in env and INSPECT_IN_PROCESS not in env


@pytest.mark.parametrize(
    ("eager", "variant_args", "compiles"),
    [("true", "", False), ("false", '"--enforce-eager"', False), ("false", "", True)],
)
def test_an_eager_cpu_server_compiles_nothing(tmp_path: Path, eager: str, variant_args: str, compiles: bool) -> None:
    """vLLM compiles the model itself where it is not eager: that is left as it is."""
    env, added = cpu_env(scenario_with(tmp_path, tp=2, eager=eager, variant_args=variant_args))
    assert (DYNAMO_DISABLE not in env) == compiles
    assert compiles or added[DYNAMO_DISABLE] == "1"


@pytest.mark.parametrize("where", ["scenario", "variant", "caller"])
def test_the_scenario_variant_or_caller_may_keep_torch_compile(tmp_path: Path, where: str) -> None:
    env, _ = cpu_env_set_by(tmp_path, where, DYNAMO_DISABLE, "0")
    assert env[DYNAMO_DISABLE] == "0"


def cpu_env_set_by(tmp_path: Path, where: str, name: str, value: str) -> tuple[dict[str, str], dict[str, str]]:
    """A TP=1 CPU server's environment with `name` set to `value` by the scenario, the variant or the caller."""
    setting = f'{name} = "{value}"'
    scenario = scenario_with(
        tmp_path, tp=1, env=setting if where == "scenario" else "", variant_env=setting if where == "variant" else ""
    )
    return cpu_env(scenario, base={name: value} if where == "caller" else {})


@pytest.mark.parametrize(
    ("tp", "env", "expected"),
    [
        (1, {}, "mp"),  # vLLM's default: multiprocessing on
        (1, {MULTIPROCESSING: "1"}, "mp"),
        (1, {MULTIPROCESSING: "0"}, "uni"),
        (2, {MULTIPROCESSING: "0"}, "mp"),  # ranks are processes whatever the switch says
    ],
)
def test_cpu_executor_follows_vllms_cpu_platform(tp: int, env: dict[str, str], expected: str) -> None:
    assert cpu_executor(tp, env) == expected


@pytest.mark.parametrize("tp", [1, 2])
def test_a_cpu_servers_engine_processes_are_forked(tmp_path: Path, tp: int) -> None:
    env, added = cpu_env(scenario_with(tmp_path, tp=tp))
    assert added[START_METHOD] == env[START_METHOD] == "fork"
    assert serve.START_METHOD == START_METHOD  # the variable the launcher keeps over vLLM's CPU platform


@pytest.mark.parametrize("where", ["scenario", "variant", "caller"])
def test_the_scenario_variant_or_caller_may_keep_spawn(tmp_path: Path, where: str) -> None:
    env, added = cpu_env_set_by(tmp_path, where, START_METHOD, "spawn")
    assert env[START_METHOD] == "spawn"
    assert (START_METHOD in added) == (where != "caller")


@pytest.mark.parametrize("tp", [1, 2])
def test_a_cpu_server_inspects_model_classes_in_its_own_process(tmp_path: Path, tp: int) -> None:
    env, added = cpu_env(scenario_with(tmp_path, tp=tp))
    assert added[INSPECT_IN_PROCESS] == env[INSPECT_IN_PROCESS] == "1"
    assert serve.INSPECT_IN_PROCESS == INSPECT_IN_PROCESS  # the variable the launcher reads


@pytest.mark.parametrize("where", ["scenario", "variant"])
def test_the_scenario_or_variant_may_keep_vllms_inspection_subprocess(tmp_path: Path, where: str) -> None:
    env, _ = cpu_env_set_by(tmp_path, where, INSPECT_IN_PROCESS, "0")
    assert env[INSPECT_IN_PROCESS] == "0"
