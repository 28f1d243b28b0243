"""Component tests on the fake vLLM server: what a scenario asks for that tests nothing is never a pass.

A scenario the server refuses is the scenario's problem, never a crash of vLLM: a prompt longer than max_model_len
(HTTP 400, vLLM's own message) and a push_scale name that matches no pushed tensor end the variant as outcome `error`
(`input_rejected`) with the reason, exit 2, whether or not the fresh stage was measured. (`specwake check` refuses
both before any server starts where the model is local: tests/e2e/test_validate.py, and for push_scale and push_skip
tests/component/test_perturbed_cli.py.) And an L1 variant on CPU, where
vLLM ignores sleep, is announced by `check` as one whose cycles test nothing.
"""

from __future__ import annotations

from pathlib import Path

from specwake.judge.verdict import RULES
from tests.helpers.fakeengine import FakeEngine, result_of, run_cli, run_text, scenario_text, variant

run = run_text


def test_a_prompt_the_server_refuses_is_an_input_problem_not_a_crash(engine: FakeEngine, tmp_path: Path) -> None:
    text = scenario_text(engine, variants={"baseline": {"FAKE_VLLM_ARGS": "--max-model-len 40"}}, expect={})
    proc, out = run(engine, tmp_path, text)
    assert proc.returncode == 2, proc.stderr
    base = variant(result_of(out), "baseline")
    assert base["outcome"] == "error" and base["crash_class"] == "input_rejected" and base["stages"] == []
    assert "HTTP 400: This model's maximum context length is 40 tokens" in base["error"]
    report = next(out.iterdir()).joinpath("report.md").read_text()
    assert "not measured (input_rejected): the scenario's own input was refused" in report


def test_a_push_scale_name_no_tensor_matched_is_an_input_problem(engine: FakeEngine, tmp_path: Path) -> None:
    text = scenario_text(engine, variants={"baseline": {}}, expect={"baseline": "any"})
    text = text.replace("[cycle]\n", '[cycle]\nreload = "push"\n')
    text = text.replace("[variants.baseline]\n", '[variants.baseline]\npush_scale = { "lm_haed.weight" = 2.0 }\n')
    proc, out = run(engine, tmp_path, text)
    assert proc.returncode == 2, proc.stderr
    base = variant(result_of(out), "baseline")
    assert base["outcome"] == "error" and base["crash_class"] == "input_rejected"
    assert base["stages"] == [] and base["steps"] == []  # resolved against what the server sends, before measuring
    assert "push_scale 'lm_haed.weight' picks no tensor the push sends" in base["error"]


def test_check_says_an_l1_variant_on_cpu_tests_nothing(engine: FakeEngine, tmp_path: Path) -> None:
    text = scenario_text(engine, variants={"patched": {}}).replace("[cycle]\n", "[cycle]\nlevel = [1, 2]\n")
    scenario = tmp_path / "s.toml"
    scenario.write_text(text)
    proc = run_cli(["check", str(scenario)], tmp_path / "cache", 120)
    assert proc.returncode == 0, proc.stderr
    l1, l2 = proc.stdout.split("  variant patched-L1")[1].split("  variant patched-L2")
    assert "note: vLLM ignores sleep on CPU" in l1 and "outcome will be `untested`" in l1
    assert "untested" not in l2.replace("(untested release; tested: ", "")  # the fake vLLM is no tested release
    assert "    untested  an L1 sleep the engine ignores (CPU)" in proc.stdout  # the rule, in check's rule list
    rules = proc.stdout.split("decides (first rule that applies):")[1].splitlines()[1 : len(RULES) + 1]
    listed = [line.split()[0] for line in rules]
    assert listed == [rule.outcome for rule in RULES]  # check prints the code's table, in its order


def test_a_gpu_scenario_on_a_cpu_names_its_cpu_scenario_and_no_setting(engine: FakeEngine, tmp_path: Path) -> None:
    """Exit 3 with one line: how many GPUs it needs and the CPU scenario of its family, never a `cycle.discard`
    value that would start its (GPU-sized) servers here."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "twin.toml").write_text(scenario_text(engine))
    text = 'cpu_scenario = "cpu/twin.toml"\n' + scenario_text(engine, tensor_parallel_size=2)
    proc, out = run(engine, tmp_path, text.replace("[cycle]\n", '[cycle]\ndiscard = "native"\n'))
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {tmp_path / 's.toml'}: cycle.discard: GPU scenario (needs 2 GPUs): 'native' needs vLLM sleep mode,"
        f" which vLLM on cpu lacks; on CPU run {tmp_path / 'cpu' / 'twin.toml'}"
    ]
    assert engine.launched() == [] and not out.exists()
